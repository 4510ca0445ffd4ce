"""Train the 3D U-Net that maps N-body fields (dark matter) to hydrodynamic fields (gas).

    python train.py --config=demo                       # the CPU demo on the synthetic data set
    python train.py --config=short --num_epochs 4       # one GPU, as in the tutorial
    python train.py --config=short --run_num=01 --resume            # continue an interrupted run
    torchrun --nproc_per_node=4 train.py --config=bs256_opt --local_batch_size=64   # four GPUs
    sbatch -N 2 --ntasks-per-node=4 ./submit_pm.sh --config=bs256_opt                # two nodes

Every key of config/UNet.yaml can be overridden as --key=value. The run writes to
<expdir>/<config>/<N>GPU|<N>CPU/<run_num>/: out.log, config.yaml, checkpoint.pt, preview.png,
loss_curves.png and logs/ (TensorBoard); --resume continues it with its own options (config.yaml).
The same code runs on CPU and on CUDA: the device is chosen once, in main.
"""
import dataclasses
import functools
import logging
import os
import shutil
import sys
import time

import utils.env_check  # noqa: F401  before torch: a Python without the project's packages gets a one-line hint
import torch

from networks.UNet import UNet
from utils import get_data_loader_distributed, lr_schedule
from utils.YParams import data_parallel_size, write_yaml
from utils.accumulation import GradAccumulation
from utils.benchy import check_benchy_options, wrap_for_benchy
from utils.checkpoint import CHECKPOINT_NAME, Checkpointer, load_checkpoint
from utils.compiler import check_compiler
from utils.conv3d import check_conv3d
from utils.distributed import (DomainMesh, agree_to_stop, all_reduce_mean, check_domain_crop,
                               check_parallel_options, describe_memory, exit_on_lost_rank, init_process_group, memory_report, parallelize,
                               read_world, shutdown, World)
from utils.halo import split_domain
from utils.errors import UserError, exit_on_user_error
from utils.estimate import check_run_time
from utils.exact_forms import use_exact_forms
from utils.logging_utils import TensorBoard, config_logger, log_to_file
from utils.losses import build_loss
from utils.metrics import ValidationMetrics, format_metrics, power_spectrum_figure
from utils.optim import Precision, build_optimizer, configure_tf32, set_learning_rate
from utils.out_of_memory import explained_out_of_memory, guard_out_of_memory
from utils.prefetch import device_prefetcher
from utils.preview import logged_losses, render_loss_curves, render_preview, save_png
from utils.profiling import DEFAULT_WINDOWS, Profiling, annotate, check_profiling_options
from utils.progress import Progress
from utils.runs import (CONFIG_NAME, changed_options, default_run_num, load_run_params, record_config,
                        refuse_resume_without_checkpoint, run_num_given, schedule_change)
from utils.signals import StopSignals
from utils.step_spread import step_spread


@dataclasses.dataclass(frozen=True)
class Position:
    """Where training stands; saved in every checkpoint."""
    epoch: int = 0           # epochs completed
    step: int = 0            # optimiser steps taken
    batch_in_epoch: int = 0  # steps taken in the epoch under way (non-zero only after an interruption)

    def advanced(self, steps):
        return dataclasses.replace(self, step=self.step + steps, batch_in_epoch=self.batch_in_epoch + steps)

    def next_epoch(self):
        return Position(epoch=self.epoch + 1, step=self.step)


# ----------------------------------------------------------------------------- set-up

def pick_device(params, world):
    """The training device, chosen once: this rank's GPU when there is one, else the CPU. Logs which
    backend its 3-D convolutions use, with a warning where a PyTorch/cuDNN release makes them slow, and
    refuses --jit_mode=compile on a machine where torch.compile cannot build (no C compiler or Python.h)."""
    if device_kind(params) == "CPU":
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        raise UserError("--device=cuda but PyTorch sees no CUDA device. Use --device=auto (or cpu), or "
                        "install a CUDA build of PyTorch on a machine with a GPU.")
    else:
        device = torch.device("cuda", world.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        # cuDNN times its algorithms for each convolution's shape and layout at its first call and keeps the
        # fastest (benchmarks/cudnn_autotune.py measures that first step); training shapes never change (the
        # last partial batch is dropped). --deterministic: deterministic algorithms instead, to compare runs.
        torch.backends.cudnn.benchmark = not params.deterministic
        torch.backends.cudnn.deterministic = params.deterministic
        configure_tf32(params.tf32)
    check_compiler(params)
    if world.is_main:
        check_conv3d(device, params.amp_mode, params.tf32, params.channels_last)
    return device


def device_kind(params):
    """'CPU' or 'GPU': the kind of device :func:`pick_device` chooses (it names the run directory's
    <N>CPU|GPU folder, where --resume looks for the run's options)."""
    on_cpu = params.device == "cpu" or (params.device == "auto" and not torch.cuda.is_available())
    return "CPU" if on_cpu else "GPU"


def check_crop_size(params):
    """A crop the U-Net can halve at every level, before any data is read (under a domain mesh, each
    rank's block: see utils.distributed.check_domain_options)."""
    multiple = UNet.size_multiple(params.full_scale)
    if params.crop_size % multiple:
        raise UserError(f"crop_size={params.crop_size} does not fit the U-Net: with full_scale="
                        f"{params.full_scale} every level halves the crop, so its side must be a multiple "
                        f"of {multiple}. Use e.g. --crop_size={max(multiple, params.crop_size // multiple * multiple)}"
                        + ("" if not params.full_scale else " or --full_scale=false") + ".")
    check_domain_crop(params.domain_mesh, params.crop_size, multiple)


def claim_run_dir(params, world, device, argv):
    """The run directory's path; refuses one that holds a run unless --resume. Creates nothing.

    Without --run_num a new run takes the first free number (00, 01, ...) and --resume the last one.
    """
    kind = "GPU" if device.type == "cuda" else "CPU"
    runs_dir = os.path.join(params.expdir, params.config, f"{world.size}{kind}")
    if not run_num_given(argv):
        params["run_num"] = default_run_num(runs_dir, params.resume)
    run_dir = os.path.join(runs_dir, params.run_num)
    taken = os.path.isdir(run_dir) and bool(os.listdir(run_dir)) and not params.resume
    # Every rank looks before rank 0 creates anything, and all ranks agree on the answer.
    if agree_to_stop(taken, world, device):
        raise UserError(f"The run directory {run_dir} already holds a run. Pass --resume to continue it, "
                        f"or a new --run_num (e.g. --run_num={params.run_num}b) to start another.")
    logging.info("Device: %s; %d rank(s); local batch %d; run directory %s", device, world.size,
                 params.global_batch_size // data_parallel_size(params.domain_mesh, world.size), run_dir)
    return run_dir


def build_loaders(params, world, mesh, device, move):
    """This rank's training and validation loaders (under a domain mesh: of its block of each crop).
    On a GPU a host loader's batches are copied one batch ahead, on a side stream, while the step
    computes (--device_prefetch, utils/prefetch.py); ``move`` is the copy, in the model's layout."""
    logging.info("rank %d, begin data loader init", world.rank)
    loaders = get_data_loader_distributed(params, mesh.data_rank, device, mesh.data_size, mesh.block)
    logging.info("rank %d, data loader initialized with config %s", world.rank, params.data_loader_config)
    return tuple(device_prefetcher(loader, params, device, move) for loader in loaders)


def run_options(params, world):
    return {**params.to_dict(), "world_size": world.size}


def create_run_dir(run_dir, params, world, position):
    """Rank 0 makes the run directory, starts out.log (with the lines logged so far; a resumed run
    appends) and config.yaml, or appends this resume and its changed options to it."""
    if world.is_main:
        os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
        log_to_file(os.path.join(run_dir, "out.log"))
        record_config(run_dir, run_options(params, world), position.step)


def build_model(params, device, mesh=None, world=World()):
    """The U-Net on ``device``, its slow layers in the exact forms --exact_forms picks (utils/exact_forms.py);
    under a domain ``mesh`` its convolutions exchange halos (utils/halo.py). Running out of GPU memory
    here (--exact_forms=auto times each layer at the run's micro-batch) ends in one paragraph, as in training."""
    with explained_out_of_memory("building the model", params, world, device):
        model = UNet(params.N_in_channels, params.N_out_channels, params.base_channels, params.full_scale)
        logging.info("U-Net with %.1f M parameters", sum(p.numel() for p in model.parameters()) / 1e6)
        model = use_exact_forms(model.to(device, memory_format=memory_format(params)), params, device, mesh)
    return model if mesh is None else split_domain(model, mesh)


def memory_format(params):
    """channels_last_3d stores each voxel's channels together, the layout fast 3-D convolutions want."""
    return torch.channels_last_3d if params.channels_last else torch.contiguous_format


def compile_model(model, params):
    """torch.compile the (wrapped) model with ``jit_mode=compile``: validation's model (training
    compiles model and loss as one function, :func:`training_loss`).

    Compiling after the DDP wrapper lets the compiler split its graphs at DDP's gradient buckets,
    so communication still overlaps with the backward pass.
    """
    if params.jit_mode != "compile":
        return model
    return torch.compile(model, mode=params.compile_mode)


def training_loss(model, loss_fn, params):
    """``forward_loss(inputs, targets)``: the model and the loss as ONE function, compiled as one
    with ``jit_mode=compile``. Compiled apart, under CUDA graphs (--compile_mode=reduce-overhead or
    max-autotune) the model's output buffer is overwritten by its next replay while the loss's own
    graph still reads it (pytorch/pytorch#160281); one function has one graph, and fuses the loss
    into the model's last kernels as well."""
    def forward_loss(inputs, targets):
        return loss_fn(model(inputs), targets)

    if params.jit_mode != "compile":
        return forward_loss
    return torch.compile(forward_loss, mode=params.compile_mode)


def resume(run_dir, model, optimizer, scaler, params, world, steps_per_epoch):
    """With --resume, the saved position, with states restored, and what changed options mean for
    the schedule (said by rank 0: every rank sees the same); without, the start. The options
    themselves are the run's own already (utils/runs.py's load_run_params).

    A run directory with no run is refused (a mistyped --run_num or a forgotten --config); one that
    holds a run but no checkpoint yet (stopped before its first one) starts again from step 0; a run
    that has trained all its epochs is said to be complete, and the process ends.
    """
    path = os.path.join(run_dir, CHECKPOINT_NAME)
    if not params.resume:
        return Position()
    if not os.path.exists(path):
        if not os.path.exists(os.path.join(run_dir, "out.log")):
            refuse_resume_without_checkpoint(run_dir, params, CHECKPOINT_NAME)
        if world.is_main:
            logging.warning("%s holds a run but no checkpoint (it stopped before its first one, or ran with "
                            "--checkpoint=false): starting it again from step 0.", run_dir)
        return Position()
    try:
        position = Position(**load_checkpoint(path, model, optimizer, scaler))
    except (RuntimeError, KeyError, TypeError, ValueError) as error:
        raise UserError(f"The checkpoint {path} does not fit this run ({str(error).splitlines()[0]}). Resume "
                        "with the config it was made with (see config.yaml beside it), or start a new "
                        "--run_num.") from None
    logging.info("Resumed from %s at epoch %d, step %d.", path, position.epoch + 1, position.step)
    exit_if_complete(position, params, run_dir, world)
    if world.is_main:
        report_changed_options(run_dir, run_options(params, world), position.step, steps_per_epoch)
    return position


def report_changed_options(run_dir, options, step, steps_per_epoch):
    """Log the options that differ from those the run was started (or last resumed) with, and what
    they do to the learning-rate schedule; config.yaml records them when training goes on."""
    config_path = os.path.join(run_dir, CONFIG_NAME)
    if not os.path.exists(config_path):
        return
    changed = changed_options(config_path, options)
    if changed:
        logging.warning("Options changed since the run started or was last resumed: %s",
                        ", ".join(f"{key} {old} -> {new}" for key, (old, new) in changed.items()))
        message = schedule_change(changed, {key: old for key, (old, _) in changed.items()}, options, step,
                                  steps_per_epoch, lr_schedule)
        if message:
            logging.warning(message)


def exit_if_complete(position, params, run_dir, world):
    """A resumed run that has trained all its epochs: say so and end, writing nothing."""
    if position.epoch < params.num_epochs:
        return
    logging.info("The run in %s is already complete: it trained %d epochs (%d steps), and --num_epochs is %d. "
                 "Nothing to train. To train it longer, resume with a larger --num_epochs and "
                 "--allow_changes=num_epochs (the learning-rate schedule is then recomputed for the new "
                 "length), or start a new --run_num.",
                 run_dir, position.epoch, position.step, params.num_epochs)
    shutdown(world)
    sys.exit(0)


# ----------------------------------------------------------------------------- one step, one epoch

def train_step(forward_loss, optimizer, precision, accumulation, inputs, targets):
    """Forward, loss and backward for each micro-batch, then one optimiser update; returns the
    batch's mean loss (on the device).

    With ``--grad_accum_steps=K`` the batch is split into K micro-batches whose scaled gradients add
    up to the batch's, with one gradient all-reduce, in the last backward (utils/accumulation.py);
    with K = 1 (the default) the batch is one micro-batch. The ``annotate`` ranges cost nothing
    unless profiling is on (--enable_manual_profiling, --profiler=torch); then they name the phases
    in the Nsight or torch profiler timeline. The loss is summed into a new tensor at once: under
    torch.compile's CUDA graphs (--compile_mode=reduce-overhead or max-autotune) the next call
    overwrites the graph's outputs, and the epoch keeps the loss.
    """
    optimizer.zero_grad()
    loss = 0.0
    for micro_inputs, micro_targets, sync in accumulation.micro_batches(inputs, targets):
        with sync:  # DDP's no_sync() on all but the last micro-batch
            with annotate("forward"), precision.autocast():
                micro_loss = accumulation.scale(forward_loss(micro_inputs, micro_targets))
            with annotate("backward"):
                precision.scaler.scale(micro_loss).backward()
        loss = loss + micro_loss.detach()
    with annotate("optimizer"):
        precision.scaler.step(optimizer)
        precision.scaler.update()
    return loss


def default_step(model, optimizer, loss_fn, precision, params):
    """The step of train.py; train_graph.py supplies one that replays a captured CUDA graph."""
    return functools.partial(train_step, training_loss(model, loss_fn, params), optimizer, precision,
                             GradAccumulation(model, params.grad_accum_steps))


def to_device(tensor, device, memory_format):
    # non_blocking: from pinned memory the host queues the copy and goes on without waiting for it; the
    # copy itself runs on the compute stream, after the previous step's kernels and before this step's
    # forward, so it does not overlap compute: utils/prefetch.py's prefetcher copies ahead on a side
    # stream instead. A no-op for tensors already on the device: those of the device loaders, and of
    # the host loaders under the prefetcher.
    return tensor.to(device, non_blocking=True, memory_format=memory_format)


def train_one_epoch(step_fn, loader, optimizer, schedule, first_step, move, stop, profiling):
    """Train on the epoch's remaining batches from global step ``first_step``; return their losses.

    Nothing here waits for the device: the losses stay a device tensor that the caller reads once,
    at the end of the epoch. A stop signal ends the epoch early, before the next step (all ranks at
    the same step; see utils.signals.StopSignals for how often several ranks ask each other).
    """
    losses = []
    for step, (inputs, targets) in enumerate(loader, start=first_step):
        if stop.requested():
            break
        profiling.step(step)  # opens and closes the profiling window; one comparison when off
        with annotate("step", step):
            with annotate("data copy in", step):
                inputs, targets = move(inputs), move(targets)
            set_learning_rate(optimizer, schedule(step))
            losses.append(step_fn(inputs, targets))
    return torch.stack(losses) if losses else torch.zeros(0, device=first_device(optimizer))


def check_finite(losses, last_step, run_dir, world):
    """Stop with a clear message at the first non-finite training loss on any rank (one host sync per
    call): every rank stops alike, so rank 0 can report it for all."""
    non_finite = all_reduce_mean((~torch.isfinite(losses)).float(), world)
    if bool(non_finite.any()):  # waits for the device: the epoch's work is done
        first_bad = last_step - len(losses) + int(non_finite.nonzero()[0])
        raise UserError(f"The training loss became non-finite at step {first_bad}. Training stopped; the "
                        f"last good checkpoint in {run_dir} (if any) is kept. Lower --start_lr, or use "
                        "--amp_mode=bf16 or none instead of fp16.")


def new_cudagraph_step():
    """Tell torch.compile's CUDA graphs that a new step begins, so that they may reuse the buffers of
    the last one. Only where they are in use: where their module was never imported no graph was
    recorded, and importing it would cost seconds."""
    if "torch._inductor.cudagraph_trees" in sys.modules:
        torch.compiler.cudagraph_mark_step_begin()


def first_device(optimizer):
    return optimizer.param_groups[0]["params"][0].device


@torch.no_grad()
def validate(model, loader, loss_fn, precision, move, world, mesh=DomainMesh(), stop=None, progress=None,
             metrics=None):
    """Mean validation loss over all ranks, and the first sample with its prediction (for the preview);
    None when a ``stop`` signal cut it short (asked before every batch, as in training). ``progress``
    shows the batches go by (train.py's bar or log lines); the benchmarks pass neither.

    ``metrics``, when given, accumulates the physics metrics batch by batch, on the device. Under a
    domain ``mesh`` the loss is each block's mean (the blocks are equal, so their mean is the sample's),
    while metrics and preview see the whole fields (``mesh.whole``; unless they do not fit: None).
    Each batch is a new step for torch.compile's CUDA graphs: the last training step's outputs, or
    the last batch's, are not read again.
    """
    model.eval()
    totals, count, sample = [], 0, None
    for inputs, targets in progress(loader, "validation") if progress else loader:
        if stop is not None and stop.requested():
            model.train()
            return None
        inputs, targets = move(inputs), move(targets)
        new_cudagraph_step()
        with precision.autocast():
            predictions = model(inputs)
            totals.append(loss_fn(predictions, targets).float() * len(inputs))
        if metrics is not None:
            metrics.update(mesh.whole(predictions), mesh.whole(targets))
        count += len(inputs)
        if sample is None and mesh.whole_fields:  # copies: the next batch may reuse these buffers (CUDA graphs)
            sample = {name: mesh.whole(tensor[:1])[0].clone()
                      for name, tensor in (("input", inputs), ("target", targets), ("prediction", predictions))}
    model.train()
    mean = all_reduce_mean(torch.stack(totals).sum() / count, world).item()  # waits for the device
    return mean, sample and {name: tensor.float().cpu().numpy() for name, tensor in sample.items()}


# ----------------------------------------------------------------------------- once per epoch

def log_epoch(tensorboard, epoch, losses, elapsed, optimizer, model, params, world, step):
    """The original's epoch lines and scalars at global ``step`` (the steps taken so far); the
    first epoch of a run also reports the loss at step 0 and the memory per rank. Nothing when the
    epoch has no steps left (resumed after its training, to repeat a validation cut short)."""
    steps = len(losses)
    if not steps:
        return
    train_loss = all_reduce_mean(losses.mean(), world).item()
    logging.info("Time taken for epoch %d is %s sec, avg %s samples/sec", epoch + 1, elapsed,
                 steps * params.global_batch_size / elapsed)
    logging.info("  Avg train loss=%f", train_loss)
    if step == steps:  # the run's first epoch
        # The first batch's loss, before any update, is the train loss at step 0; and after a step every
        # state exists: what parameters, gradients and optimiser state cost each rank.
        tensorboard.scalar("Loss/train", all_reduce_mean(losses[0].clone(), world).item(), 0)
        memory = memory_report(model, optimizer)
        logging.info("Memory per rank: %s", describe_memory(memory))
        for key, value in memory.items():
            tensorboard.scalar(f"Memory/{key}_MiB", value / 2**20, step)
    tensorboard.scalar("Loss/train", train_loss, step)
    tensorboard.scalar("Learning Rate", optimizer.param_groups[0]["lr"], step)
    tensorboard.scalar("Avg iters per sec", steps / elapsed, step)


def validate_and_log(validation, tensorboard, run_dir, params, world, step):
    """Validate (``validation`` is :func:`validate` bound to the model and loader), log the loss
    and, when on, the metrics and the preview; return the metrics' log lines, or None when a stop
    signal cut the validation short (nothing is logged: a resumed run validates this step again)."""
    if step == 0:
        logging.info("Validation before training (step 0)")
    start = time.time()
    metrics = ValidationMetrics() if params.val_metrics else None
    validated = validation(metrics=metrics)
    if validated is None:
        logging.info("  Validation at step %d stopped by the signal; --resume runs it again.", step)
        return None
    val_loss, sample = validated
    # As in the original, the validation time is the loss pass's: the metrics' share is reported apart.
    metrics_seconds = metrics.clock.seconds() if metrics is not None else 0.0
    logging.info("  Avg val loss=%f", val_loss)
    logging.info("  Total validation time: %s sec", time.time() - start - metrics_seconds)
    tensorboard.scalar("Loss/valid", val_loss, step)
    lines = []
    if metrics is not None:  # L1 per field, correlations, power-spectrum ratios: one sync, on all ranks
        start = time.time()
        values = metrics.compute(reduce_fn=lambda tensor: all_reduce_mean(tensor, world))
        for name, value in values.items():
            tensorboard.scalar(f"Metrics/{name}", value, step)
        if world.is_main:
            tensorboard.image("Power spectrum", power_spectrum_figure(
                metrics.spectra, f"gas overdensity, step {step}"), step)
        logging.info("  Validation metrics time: %s sec (not in the validation time)",
                     metrics_seconds + time.time() - start)
        lines = format_metrics(values)
    if params.preview_image and world.is_main:
        image = render_preview(sample, f"{params.config}, step {step}, val loss {val_loss:.4f}")
        save_png(os.path.join(run_dir, "preview.png"), image)
        tensorboard.image("Preview", image, step)
    return lines


def exit_on_signal(stop, position, run_dir, world, tensorboard):
    """End the process after SIGTERM/SIGUSR1/SIGINT, with the conventional status 128 + signal number."""
    tensorboard.close()
    logging.info("Stopped at step %d (epoch %d) with a checkpoint in %s; continue with --resume --run_num=%s.",
                 position.step, position.epoch + (position.batch_in_epoch > 0), run_dir, os.path.basename(run_dir))
    shutdown(world, 128 + stop.received)
    sys.exit(128 + stop.received)


def tensorboard_command():
    """``tensorboard`` as this environment runs it: .venv/bin/tensorboard unless the venv is activated."""
    beside = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    on_path = shutil.which("tensorboard")
    if on_path and os.path.realpath(on_path) == os.path.realpath(beside):
        return "tensorboard"
    return os.path.relpath(beside) if os.path.exists(beside) else "tensorboard"


# The demo's final validation loss as the README quotes it (2 CPU threads), and the options a demo run
# may change and still compare with it: where data and results are, and what is measured or written.
DEMO_VAL_LOSS = 0.0174
DEMO_COMPARABLE = {"train_path", "val_path", "expdir", "device", "num_data_workers", "val_metrics",
                   "preview_image", "checkpoint", "checkpoint_interval_s"}


def report_losses(run_dir, params):
    """Rank 0, at the end: the run's loss curves in loss_curves.png (with --preview_image), from every
    loss it logged (all sessions of a resumed run); for the demo, its final validation loss beside the
    README's."""
    losses = {} if params.enable_benchy else logged_losses(os.path.join(run_dir, "logs"))
    if not losses.get("Loss/valid"):
        return  # benchy's trials validate nothing
    if params.preview_image:
        path = os.path.join(run_dir, "loss_curves.png")
        save_png(path, render_loss_curves(losses, f"{params.config}, run {os.path.basename(run_dir)}"))
        logging.info("Loss curves: %s", path)
    if params.config == "demo" and set(params.overridden) <= DEMO_COMPARABLE:
        threads = (f"{torch.get_num_threads()} CPU threads; other thread counts change the last digits"
                   if device_kind(params) == "CPU" else "on a GPU, whose kernels sum in another order")
        logging.info("The demo's expected final validation loss is %.4f (README, 2 CPU threads): yours is %f (%s).",
                     DEMO_VAL_LOSS, losses["Loss/valid"][-1][1], threads)


def finish(tensorboard, metric_lines, run_dir, params, world):
    tensorboard.close()
    if metric_lines:
        logging.info("Validation metrics after the last epoch:")
        for line in metric_lines:
            logging.info("  %s", line)
    logging.info("Done. TensorBoard logs: %s (view with: %s --logdir %s)",
                 os.path.join(run_dir, "logs"), tensorboard_command(), params.expdir)
    if params.preview_image and not params.enable_benchy:
        logging.info("Preview image: %s", os.path.join(run_dir, "preview.png"))
    if world.is_main:
        report_losses(run_dir, params)
    logging.info("DONE ---- rank %d", world.rank)
    shutdown(world)


# ----------------------------------------------------------------------------- the run

@exit_on_user_error
@exit_on_lost_rank
def main(argv=None, make_step=None, graph_capture=False):
    """Set everything up, then train ``num_epochs`` of (train, log, validate, checkpoint). ``make_step``
    makes the one-batch step: train_graph.py's replays a CUDA graph (``graph_capture``: capturable parts)."""
    # The ranks, the options (with --resume, the run's own from its config.yaml) and the device: decided once.
    world, argv = read_world(), sys.argv[1:] if argv is None else argv
    params = load_run_params(argv, world.size, DEFAULT_WINDOWS["train_graph.py" if graph_capture else "train.py"], device_kind)
    config_logger(world.is_main)
    params.log()
    check_crop_size(params)
    device = pick_device(params, world)
    check_parallel_options(params, world, device, graph_capture)
    check_run_time(params, world, device)  # a GPU-sized config on a CPU is refused here
    mesh = init_process_group(world, device, params)  # and, under --domain_mesh, the domain groups
    torch.manual_seed(params.seed)

    # Data first. Nothing is written before everything is built: a run refused during set-up (a
    # missing file, an option this machine cannot do) leaves no half-made run directory behind.
    move = functools.partial(to_device, device=device, memory_format=memory_format(params))
    train_loader, val_loader = build_loaders(params, world, mesh, device, move)
    steps_per_epoch = len(train_loader)
    check_profiling_options(params, steps_per_epoch)
    check_benchy_options(params, device)
    run_dir = claim_run_dir(params, world, device, argv)

    # Model, optimiser, precision and loss, resolved once so that the loop has no branches for them.
    # Order: the parallel wrapper first (FSDP replaces the parameters the optimiser must hold), then
    # the optimiser, and compilation last, around everything (it is lazy: nothing is traced yet):
    # the step compiles model and loss as one function, validation the model alone.
    model = parallelize(build_model(params, device, mesh, world), params, world, device, graph_capture)
    optimizer = build_optimizer(params, model, capturable=graph_capture)
    precision = Precision(params.amp_mode, device, cache=not graph_capture)
    loss_fn = build_loss(params)
    step_fn = (make_step or default_step)(model, optimizer, loss_fn, precision, params)
    spread = step_spread(model, device, world)  # each rank's own step and data wait, gathered once an epoch
    step_fn = guard_out_of_memory(spread.timed(step_fn), "a training step", params, world, device, run_dir)
    model = compile_model(model, params)
    stop = StopSignals(world, device)  # from here on, Ctrl-C and SIGTERM stop at the next step
    progress = Progress(enabled=world.is_main)  # a bar on a terminal, else a log line every minute
    validation = functools.partial(guard_out_of_memory(validate, "validation", params, world, device, run_dir), model,
                                   val_loader, loss_fn, precision, move, world, mesh, stop, progress)

    # The checkpoint's states (one that does not fit is refused first), then the run directory.
    position = resume(run_dir, model, optimizer, precision.scaler, params, world, steps_per_epoch)
    create_run_dir(run_dir, params, world, position)
    tensorboard = TensorBoard(os.path.join(run_dir, "logs"), enabled=world.is_main)
    schedule = functools.partial(lr_schedule, total_steps=params.num_epochs * steps_per_epoch, params=params)
    checkpoints = Checkpointer(run_dir, params, world, device)
    profiling = Profiling(params, world, device, run_dir, steps_per_epoch, position.step)
    # --enable_benchy: the epochs become benchy's trials, and, as in the original, nothing is validated.
    train_loader = wrap_for_benchy(train_loader, params, world, device, run_dir)  # the loader itself when off
    validating = not params.enable_benchy

    logging.info("Starting Training Loop...")
    metric_lines = (validate_and_log(validation, tensorboard, run_dir, params, world, step=0)
                    if position.step == 0 and validating else [])
    with profiling, explained_out_of_memory("loading or copying a batch", params, world, device, run_dir):
        for epoch in range(position.epoch, params.num_epochs):
            train_loader.sampler.set_epoch(epoch, start=position.batch_in_epoch * train_loader.batch_size)
            remaining = len(train_loader)  # fewer batches after a resume; a trial's under benchy
            start = time.time()
            losses = train_one_epoch(step_fn, progress(spread.waited(train_loader), f"epoch {epoch + 1}"), optimizer,
                                     schedule, position.step, spread.timed_copy(move), stop, profiling)
            position = position.advanced(len(losses))
            check_finite(losses, position.step, run_dir, world)  # waits for the device
            elapsed = time.time() - start
            if len(losses) == remaining:  # a whole epoch, not one cut short by a stop signal
                log_epoch(tensorboard, epoch, losses, elapsed, optimizer, model, params, world, position.step)
                spread.log(tensorboard, position.step)  # which rank is the straggler: one all-gather
                lines = (validate_and_log(validation, tensorboard, run_dir, params, world, position.step)
                         if validating else [])
                if lines is not None:  # None: a stop signal cut the validation short; --resume repeats it
                    metric_lines, position = lines, position.next_epoch()
            finished = epoch + 1 == params.num_epochs or getattr(train_loader, "stop_training", False)
            checkpoints.save(model, optimizer, precision.scaler, position, due=stop.agreed() or finished)
            tensorboard.flush()
            if stop.received:  # on every rank once one has it: agreed() asked them all
                exit_on_signal(stop, position, run_dir, world, tensorboard)
            if finished:  # the last epoch, or benchy's trials are all done
                break
    finish(tensorboard, metric_lines, run_dir, params, world)


if __name__ == "__main__":
    main()
