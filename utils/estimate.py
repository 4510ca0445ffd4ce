"""How long a run will take, estimated before it starts from the model's FLOPs and the device.

The configs of the original tutorial (``base``, ``short``, ``short_opt``, ``bs*``) are sized for
GPUs: on a CPU their 117 M-parameter U-Net trains for hours to days, and a user who forgot
``--config=demo`` should learn that before training, not after ten silent minutes. The estimate is
the run's FLOPs (training: forward and backward of every sample of every epoch; validation:
forward only, before training and after every epoch) over a rate: on a CPU, the rate this CPU
reaches in a short measurement of 3-D convolutions (about half a second); on a GPU, its datasheet
peak, which makes the estimate a lower bound. Every run logs its estimate before it trains (the
measurement costs a fraction of a second); the refusal quotes the demo's estimate by the same model.
What it leaves out: start-up, data loading, the validation metrics and, for small models, the
per-step overheads that make them reach a smaller share of the measured rate.
"""
import logging
import time

import torch

from utils.errors import UserError
from utils.flops import precision_of, resolve_peak_flops, unet_flops_per_sample

# Below this many FLOPs a run trains in seconds (under 10 s at the 10 GFLOP/s even a laptop's CPU
# reaches): said without measuring the CPU.
TINY_RUN_FLOPS = 1e11
WARN_SECONDS = 10 * 60   # longer than this on a CPU: said in a warning
REFUSE_SECONDS = 60 * 60  # longer than this on a CPU: refused unless --device=cpu asks for the CPU


def run_flops(params, flops_per_sample):
    """FLOPs of the whole run: training (forward + backward) and validation (forward, about a third)."""
    training = params.num_epochs * params.Nsamples * flops_per_sample
    validation = (params.num_epochs + 1) * params.Nsamples_val * flops_per_sample / 3
    return training + validation


def measure_cpu_flops(repeats=2):
    """FLOP/s this CPU reaches on a 3-D convolution's forward and backward (the U-Net's bulk), best of ``repeats``."""
    inputs = torch.randn(2, 16, 32, 32, 32)
    conv = torch.nn.Conv3d(16, 16, 3, padding=1)
    flops = 3 * 2 * 16 * 16 * 27 * 32**3 * 2  # forward, input and weight gradients; 2 FLOPs a multiply-add
    conv(inputs).sum().backward()  # the first call also picks the kernels
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        conv(inputs).sum().backward()
        best = min(best, time.perf_counter() - start)
    return flops / best


def format_duration(seconds):
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 86400:.1f} days"


def describe_cpu(params):
    """The CPU facts a user needs to compare runs: the thread count (it changes the order of the
    floating-point sums, hence the losses' last digits) and that fp16 autocast is slow on CPUs."""
    logging.info("CPU threads: %d (torch.get_num_threads(); OMP_NUM_THREADS sets it). Losses differ in their "
                 "last digits between thread counts.", torch.get_num_threads())
    if params.amp_mode == "fp16":
        logging.warning("--amp_mode=fp16 on a CPU is slow: PyTorch's CPU float16 convolutions run several times "
                        "slower than fp32 ones. On a CPU use --amp_mode=bf16 or none; fp16 is for GPUs.")


def check_run_time(params, world, device):
    """Log the run's estimated time, first thing, for every run; refuse one that would take hours on a
    CPU, unless --device=cpu.

    Called on every rank with the same options; the ranks measure their CPUs at the same moment, so
    each measures its share of the machine.
    """
    if device.type == "cpu":
        describe_cpu(params)
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
    rate = measure_cpu_flops()
    seconds = total / (rate * world.size)
    summary = (f"--config={params.config} would train for about {format_duration(seconds)} on this CPU: "
               f"{params.num_epochs} epoch{'s' * (params.num_epochs != 1)} of {params.Nsamples} samples at {flops_per_sample / 1e9:.3g} GFLOP "
               f"each, {total / 1e15:.3g} PFLOP in all, at the {rate / 1e9:.0f} GFLOP/s per rank this CPU "
               f"reached just now on a 3-D convolution ({world.size} rank(s)).")
    if seconds > REFUSE_SECONDS and params.device != "cpu":
        raise UserError(f"{summary} The tutorial's configs other than demo are sized for GPUs. On a CPU, use "
                        f"--config=demo ({demo_estimate(params, rate)}), or shrink this one (e.g. "
                        "--num_epochs, --Nsamples, --crop_size, --base_channels). To train it on the CPU "
                        "anyway, pass --device=cpu.")
    if seconds > WARN_SECONDS:
        logging.warning("%s Progress is logged at least every minute.", summary)
    else:
        logging.info("Estimated time: %s", summary)


def demo_estimate(params, rate):
    """What the same estimate gives the demo config on this CPU, in words."""
    from utils.YParams import YParams

    try:
        demo = YParams(params.yaml_filename, "demo")
    except UserError:  # a config file of the user's own, without a demo
        return "sized for a laptop"
    seconds = run_flops(demo, unet_flops_per_sample(demo)) / rate
    return f"about {format_duration(seconds)} of training on this CPU by the same estimate"
