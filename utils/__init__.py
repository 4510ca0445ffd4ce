"""Helpers of the training scripts: the data-loader dispatcher and the learning-rate schedule.

The loader modules are imported only when asked for, so that optional dependencies of one
loader kind are never needed by another.

utils/ is one folder of small modules, one concern each, where the original tutorial's names
(data_loader, data_loader_dali, YParams, logging_utils, and this package's two functions) keep
their place. The map below finds a concern's modules; docs/02-single-device.md's code overview
points to this map, and tests/test_layout.py checks that it names every module exactly once and
which modules may import which.

Data
    data_loader          the crop specification every loader follows; synthetic, inmem, lowmem
    data_loader_gpu      the gpu-inmem loader: both volumes on the device, crops cut there
    data_loader_dali     the dali-lowmem loader: DALI reads .npy crops and augments on the GPU
    symmetry             the cube's 48 symmetries, applied to scalar and vector fields
    prefetch             the device prefetcher: the next batch copied on a side stream
Training step
    optim                precision and optimiser choices, resolved once before the loop
    losses               the training loss: L1, plus an optional L1 on the gas density
    accumulation         gradient accumulation: one optimiser step over K micro-batches
    compiler             whether torch.compile can build here, asked before a run relies on it
    exact_forms          exact faster forms of the first and the transposed convolutions, same parameters
    out_of_memory        a CUDA out-of-memory where a run allocates, told in one paragraph with the fixes
Parallelism
    distributed          process group, DDP and FSDP, a lost rank; the domain mesh
    halo                 domain parallelism's halo exchange around each convolution
Performance measurement
    benchy               benchy's IO, SYNTHETIC and FULL trials, and the MFU
    flops                FLOPs per sample, the GPU's peak FLOP/s, model FLOP utilisation
    conv3d               the 3-D convolutions' health check; whether this CPU emulates 16-bit
    profiling            NVTX ranges, the profiling window, CUDA memory snapshots
    step_spread          each rank's step time and data wait, gathered once an epoch: the straggler
    noise                when repeated timing trials can rank what they measured
Run management
    checkpoint           atomic checkpoints and resume
    signals              stop signals and Ctrl-C: every rank stops at the same step
    files                the atomic file write
    runs                 run directories; config.yaml as the record of what ran
    estimate             the run's time estimated before it trains; the CPU refusal
    progress             progress through an epoch or a validation, on rank 0
    logging_utils        log lines (screen and out.log) and TensorBoard, on rank 0
    preview              the preview image after each validation
Configuration and errors
    YParams              a named config from config/UNet.yaml, --key=value overrides
    errors               UserError: one clear paragraph instead of a traceback
    env_check            a one-line hint where Python lacks the project's packages (the venv not activated)
Validation and physics
    metrics              validation metrics: L1 per field, correlations, power spectra
Tools
    generate_data        python -m utils.generate_data: the synthetic data set
    convert_h5_to_npy    python -m utils.convert_h5_to_npy: the channel-last .npy copy for DALI
    tensorboard_launch   the notebook's TensorBoard launcher
"""
import math

NATIVE_LOADERS = ("synthetic", "inmem", "lowmem")


def get_data_loader_distributed(params, world_rank, device=None, world_size=1, block=None):
    """``(train_loader, val_loader)`` for ``params.data_loader_config``: rank ``world_rank``'s share.

    ``device`` is the training device (a ``torch.device``; None is the CPU). On a GPU the native
    loaders pin their batches, so that the copy to the device leaves the host free (the copy still
    runs on the compute stream, between steps: see train.py's ``to_device``), ``gpu-inmem`` keeps the
    volumes on it and cuts the crops there, and ``dali-lowmem`` augments there. ``world_size`` ranks
    share each epoch's samples. ``block`` (domain parallelism):
    ``(start, stop)`` per axis, the part of every turned crop this rank reads and trains on.
    """
    kind = params.data_loader_config
    if kind in NATIVE_LOADERS:
        from utils.data_loader import get_data_loaders

        on_gpu = device is not None and device.type == "cuda"
        return get_data_loaders(params, world_rank, world_size, pin_memory=on_gpu, block=block)
    if kind == "gpu-inmem":
        from utils.data_loader_gpu import get_data_loaders

        return get_data_loaders(params, world_rank, world_size, device, block=block)
    if kind == "dali-lowmem":
        from utils.data_loader_dali import get_data_loaders  # DALI itself is imported only in there

        return get_data_loaders(params, world_rank, world_size, device, block=block)
    raise ValueError(f"unknown data_loader_config {kind!r}")  # YParams.validate refuses it earlier


def lr_schedule(step, total_steps, params):
    """The learning rate for optimiser step ``step`` (0-based): the original tutorial's schedule.

    When the global batch is larger than ``base_batch_size`` and ``lr_scaling`` is ``sqrt`` or
    ``linear``, the initial rate is ``start_lr`` times the square root (or the ratio) of
    global/base, reached linearly over ``warmup_steps``; a cosine then decays it towards ``end_lr``.
    As in the original, the cosine's phase starts where the warm-up ends and runs over
    ``total_steps``, so after a warm-up the last step's rate stays a little above ``end_lr``.
    The original counts steps from 1 (its loop increments the counter before setting the rate):
    step ``s`` here is its step ``s + 1``.
    """
    i = step + 1
    ratio = params.global_batch_size / params.base_batch_size
    initial = params.start_lr * {"none": 1.0, "sqrt": math.sqrt(ratio), "linear": ratio}[params.lr_scaling]
    warmup = params.warmup_steps if ratio > 1 and params.lr_scaling != "none" else 0
    if i < warmup:
        return initial * i / warmup
    phase = (i - warmup) / max(total_steps, 1)
    return params.end_lr + 0.5 * (initial - params.end_lr) * (1.0 + math.cos(math.pi * phase))
