"""How long a run will take, estimated before it starts from the model's FLOPs and the device.

The configs of the original tutorial (``base``, ``short``, ``short_opt``, ``bs*``) are sized for
GPUs: on a CPU their 117 M-parameter U-Net trains for hours to days, and a user who forgot
``--config=demo`` should learn that before training, not after ten silent minutes. The estimate is
the run's FLOPs (training: forward and backward of every sample of every epoch; validation:
forward only, before training and after every epoch) over a rate. On a CPU the rate is measured
just before, on the run's own training step: its U-Net, forward, loss and backward, at its local
batch and crop, the batch cut down until one step costs at most PROBE_FLOPS (about a second); a
model too large for that even at batch 1 (the original's full-width U-Net) is timed on one 3-D
convolution instead, which runs faster than the whole U-Net and so makes that estimate a lower
bound. On a GPU the rate is the datasheet's peak: a lower bound too. Every run logs its estimate
before it trains; the refusal quotes the demo's estimate by the same model. What it leaves out:
start-up, data loading, the validation metrics and the optimiser's step.

A CPU without native bf16 (or fp16) arithmetic computes 16-bit convolutions in PyTorch's generic reference
code, tens of times slower than fp32 (utils/conv3d.py's :func:`~utils.conv3d.emulated_on_cpu`). A run that
asks for it there is told so in one paragraph, with the slow-down just measured on its own step at batch 1
in both precisions (about a second), and its estimate is made at that measured 16-bit rate.
"""
import contextlib
import dataclasses
import logging
import platform
import sys
import time

import torch

from networks.UNet import UNet
from utils.conv3d import ONEDNN_NEEDS, cpu_capability, emulated_on_cpu
from utils.errors import UserError
from utils.flops import precision_of, resolve_peak_flops, unet_flops_per_sample
from utils.optim import Precision
from utils.YParams import YParams, data_parallel_size

# Below this many FLOPs a run trains in seconds (under 10 s at the 10 GFLOP/s even a laptop's CPU
# reaches): said without measuring the CPU.
TINY_RUN_FLOPS = 1e11
WARN_SECONDS = 10 * 60   # longer than this on a CPU: said in a warning
REFUSE_SECONDS = 60 * 60  # longer than this on a CPU: refused unless --device=cpu asks for the CPU
PROBE_FLOPS = 2e10        # the CPU's rate is timed on a step of at most this many FLOPs: about a second
EMULATED_PROBE_FLOPS = 2e9  # the same where the CPU emulates 16-bit arithmetic: about a second at its rate


def run_flops(params, flops_per_sample):
    """FLOPs of the whole run: training (forward + backward) and validation (forward, about a third)."""
    training = params.num_epochs * params.Nsamples * flops_per_sample
    validation = (params.num_epochs + 1) * params.Nsamples_val * flops_per_sample / 3
    return training + validation


def measure_cpu_flops(params, local_batch, repeats=2, limit=None, amp_mode=None):
    """FLOP/s this CPU reaches on the run's training step, and what was timed, in words.

    The step is the run's own (its U-Net at its crop and local batch, forward, loss and backward,
    in its precision, or ``amp_mode``'s), with the batch cut down to keep the step under ``limit``
    (PROBE_FLOPS). Best of ``repeats`` steps after one that also picks the kernels.
    """
    limit = PROBE_FLOPS if limit is None else limit
    autocast = Precision(params.amp_mode if amp_mode is None else amp_mode, torch.device("cpu")).autocast
    per_sample = unet_flops_per_sample(params)
    if not per_sample or per_sample > limit:
        return measure_conv_flops(repeats, autocast, limit), "a 3-D convolution"
    batch = local_batch if local_batch * per_sample <= limit else max(1, int(limit // per_sample))
    side = params.crop_size
    model = UNet(params.N_in_channels, params.N_out_channels, params.base_channels, params.full_scale)
    model = model.to(memory_format=torch.channels_last_3d if params.channels_last else torch.contiguous_format)
    inputs = torch.randn(batch, params.N_in_channels, side, side, side)
    targets = torch.randn(batch, params.N_out_channels, side, side, side)

    def step():
        with autocast():
            loss = torch.nn.functional.l1_loss(model(inputs).float(), targets)
        loss.backward()

    return batch * per_sample / best_time(step, repeats), f"this run's training step at batch {batch}"


def measure_conv_flops(repeats=2, autocast=contextlib.nullcontext, limit=PROBE_FLOPS):
    """FLOP/s this CPU reaches on a 3-D convolution's forward and backward (the U-Net's bulk), under
    ``autocast()`` (the run's precision), on 2 x 16 x 32^3, or on 2 x 16 x 16^3 where that is over ``limit``."""
    side = 32 if 3 * 2 * 16 * 16 * 27 * 32**3 * 2 <= limit else 16
    inputs = torch.randn(2, 16, side, side, side)
    conv = torch.nn.Conv3d(16, 16, 3, padding=1)
    flops = 3 * 2 * 16 * 16 * 27 * side**3 * 2  # forward, input and weight gradients; 2 FLOPs a multiply-add
    def step():
        with autocast():
            output = conv(inputs)
        output.float().sum().backward()

    return flops / best_time(step, repeats)


def best_time(step, repeats):
    """The shortest of ``repeats`` timed calls of ``step``, after one that also picks the kernels."""
    step()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return best


def format_duration(seconds):
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 86400:.1f} days"


def describe_cpu():
    """The CPU facts a user needs to compare runs: its model and thread count (the thread count changes
    the order of the floating-point sums, hence the losses' last digits)."""
    logging.info("CPU threads: %d (torch.get_num_threads(); OMP_NUM_THREADS sets it; CPU: %s, %s). Losses differ "
                 "in their last digits between thread counts.", torch.get_num_threads(), cpu_model(),
                 cpu_capability())


@dataclasses.dataclass(frozen=True)
class Emulated:
    """A run's 16-bit arithmetic as this CPU emulates it, measured: its rate and fp32's, on what."""
    mode: str         # "bf16" or "fp16"
    rate: float       # FLOP/s of the 16-bit step, timed at batch 1
    probe: str        # what that was, in words
    fp32_rate: float  # FLOP/s of the fp32 step, timed as every run's is
    fp32_probe: str

    @property
    def slowdown(self):
        """How many times its fp32 time the run takes."""
        return self.fp32_rate / self.rate

    def paragraph(self):
        """Why the run is slow, by how much, and what to run instead, for a learner."""
        mode = self.mode
        bf16 = "" if emulated_on_cpu("bf16") else ", or --amp_mode=bf16, native here"
        return (f"--amp_mode={mode} is slow on this CPU: it has no native {mode} arithmetic. oneDNN, the library "
                f"behind PyTorch's fast CPU convolutions, takes {mode} only on CPUs with {ONEDNN_NEEDS[mode]} "
                f"(PyTorch's own kernels use {cpu_capability()} here), so every {mode} 3-D convolution runs in "
                f"PyTorch's generic reference code instead. At the rates measured just now ({self.probe} in {mode}, "
                f"{self.fp32_probe} in fp32), this run takes {self.slowdown:.0f} times as long in {mode} as in fp32; "
                f"the time estimate counts with that. On this CPU, train in fp32 (leave out --amp_mode{bf16}): the "
                "tutorial's 16-bit numbers come from GPUs (docs/03-profiling-and-optimisation.md#mixed-precision-and-tf32).")


def emulated_16bit(params, local_batch):
    """:class:`Emulated` where this CPU emulates the run's 16-bit arithmetic, else None. The 16-bit step is timed at
    batch 1 (one untimed and one timed step: about a second), the fp32 one as every run's is."""
    if not emulated_on_cpu(params.amp_mode):
        return None
    rate, probe = measure_cpu_flops(params, 1, repeats=1, limit=EMULATED_PROBE_FLOPS)
    return Emulated(params.amp_mode, rate, probe, *measure_cpu_flops(params, local_batch, amp_mode="none"))


def cpu_model():
    """The CPU's model name (Linux's /proc/cpuinfo; elsewhere what the platform module knows)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def check_run_time(params, world, device):
    """Log the run's estimated time, first thing, for every run; refuse one that would take hours on a
    CPU, unless --device=cpu.

    Called on every rank with the same options; the ranks measure their CPUs at the same moment, so
    each measures its share of the machine.
    """
    local_batch = params.global_batch_size // data_parallel_size(params.domain_mesh, world.size)
    emulated = None
    if device.type == "cpu":
        describe_cpu()
        emulated = emulated_16bit(params, local_batch)
        if emulated:
            logging.warning(emulated.paragraph())
    flops_per_sample = unet_flops_per_sample(params)
    if not flops_per_sample:
        return
    total = run_flops(params, flops_per_sample)
    if total < TINY_RUN_FLOPS:
        logging.info("Estimated time: seconds (--config=%s: %.3g GFLOP of training and validation).",
                     params.config, total / 1e9)
        return
    if device.type == "cuda":
        peak, _ = resolve_peak_flops(device, precision_of(params.amp_mode, params.tf32))
        if peak:
            logging.info("Estimated time: at least %s (%.3g PFLOP at %d GPU(s)' peak).",
                         format_duration(total / (peak * world.size)), total / 1e15, world.size)
        return
    rate, probe = (emulated.rate, emulated.probe) if emulated else measure_cpu_flops(params, local_batch)
    seconds = total / (rate * world.size)
    summary = (f"--config={params.config} would train for about {format_duration(seconds)} on this CPU: "
               f"{params.num_epochs} epoch{'s' * (params.num_epochs != 1)} of {params.Nsamples} samples at "
               f"{flops_per_sample / 1e9:.3g} GFLOP each, {total / 1e15:.3g} PFLOP in all, at the "
               f"{rate / 1e9:.0f} GFLOP/s per rank this CPU reached just now on {probe} ({world.size} rank(s)).")
    if seconds > REFUSE_SECONDS and params.device != "cpu":
        raise UserError(f"{summary} The tutorial's configs other than demo are sized for GPUs. On a CPU, use "
                        f"--config=demo ({demo_estimate(params)}), or shrink this one (e.g. "
                        "--num_epochs, --Nsamples, --crop_size, --base_channels). To train it on the CPU "
                        "anyway, pass --device=cpu.")
    if seconds > WARN_SECONDS:
        logging.warning("%s Progress is logged at least every minute.", summary)
    else:
        logging.info("Estimated time: %s", summary)


def demo_estimate(params):
    """What the same estimate gives the demo config on this CPU, in words."""
    try:
        demo = YParams(params.yaml_filename, "demo")
    except UserError:  # a config file of the user's own, without a demo
        return "sized for a laptop"
    rate, _ = measure_cpu_flops(demo, demo.global_batch_size)
    seconds = run_flops(demo, unet_flops_per_sample(demo)) / rate
    return f"about {format_duration(seconds)} of training on this CPU by the same estimate"


def compare_probes(argv):
    """``python -m utils.estimate [--key=value ...]``: the rate of the configured U-Net's own training
    step at batch 1 beside the one-convolution probe's, on this CPU, and the estimate they give.

    The run's step is timed whatever its size (the 117 M-parameter U-Net at 64^3 takes seconds),
    which shows how far the convolution alone, used for models over PROBE_FLOPS, is from the whole
    step on this machine.
    """
    from utils.YParams import load_params

    params = load_params(argv)
    total = run_flops(params, unet_flops_per_sample(params))
    own, _ = measure_cpu_flops(params, 1, limit=float("inf"))
    conv = measure_conv_flops()
    print(f"{cpu_model()}, {torch.get_num_threads()} threads; --config={params.config}: "
          f"{total / 1e12:.3g} TFLOP of training and validation")
    for name, rate in (("its own step at batch 1", own), ("one 3-D convolution", conv)):
        print(f"  {name}: {rate / 1e9:.0f} GFLOP/s, an estimate of {format_duration(total / rate)}")


if __name__ == "__main__":
    compare_probes(sys.argv[1:])
