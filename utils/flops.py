"""The model's cost and the GPU's peak: FLOPs per sample, peak FLOP/s, model FLOP utilisation (MFU).

Training FLOPs per sample are counted once with ``torch.utils.flop_counter.FlopCounterMode`` on the
meta device; the peaks are NVIDIA's datasheet figures (dense), which ``PEAK_TFLOPS`` overrides.
MFU is achieved FLOP/s over the peak of all the GPUs: the fraction of the hardware the model uses.
"""
import logging
import os

import torch

from utils.errors import UserError

# Dense peak TFLOP/s per GPU from NVIDIA's datasheets (the sparsity figures are twice these).
# Matched against torch.cuda.get_device_name(), most specific name first.
_H100_SXM = {"bf16": 989, "fp16": 989, "tf32": 494, "fp32": 67}
_H100_NVL = {"bf16": 835, "fp16": 835, "tf32": 418, "fp32": 60}
PEAK_TFLOPS_TABLE = (
    ("H100 NVL", _H100_NVL),
    ("H100 PCIe", {"bf16": 756, "fp16": 756, "tf32": 378, "fp32": 51}),
    ("H200 NVL", _H100_NVL),
    ("GH200", _H100_SXM),
    ("H200", _H100_SXM),      # H200 SXM: the H100 SXM's compute with more, faster memory
    ("H100", _H100_SXM),      # "NVIDIA H100 80GB HBM3" is the SXM part
    ("A100", {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5}),  # SXM and PCIe alike
)


def training_flops_per_sample(build_model, sample_shape):
    """Forward + backward FLOPs of one sample, or None if they cannot be counted.

    The model is built on the meta device (shapes only, no memory, no arithmetic), so counting the
    117 M-parameter U-Net at 64^3 takes about a second on any machine. The input needs no
    gradient, as in training, so the first layer computes no input gradient. FlopCounterMode
    counts convolutions and matrix products; the loss's elementwise work is negligible and not
    counted, so any scalar stands in for it.
    """
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with torch.device("meta"):
            model = build_model()
            inputs = torch.empty(1, *sample_shape)
        counter = FlopCounterMode(display=False)
        with counter:
            model(inputs).float().sum().backward()
        return float(counter.get_total_flops())
    except (RuntimeError, NotImplementedError, TypeError) as error:
        logging.info("Could not count the model's FLOPs on the meta device (%s): MFU is n/a.", error)
        return None


def unet_flops_per_sample(params):
    """Training FLOPs per sample of the configured U-Net at the configured crop."""
    from networks.UNet import UNet

    def build():
        return UNet(params.N_in_channels, params.N_out_channels, params.base_channels, params.full_scale)

    side = params.crop_size
    return training_flops_per_sample(build, (params.N_in_channels, side, side, side))


def precision_of(amp_mode, tf32=True):
    """The arithmetic the convolutions run in: ``bf16``, ``fp16``, ``tf32`` or ``fp32``."""
    if amp_mode in ("bf16", "fp16"):
        return amp_mode
    tf32 = tf32 and os.environ.get("NVIDIA_TF32_OVERRIDE") != "0"  # the override wins below PyTorch
    return "tf32" if tf32 else "fp32"


def lookup_peak_flops(device_name, precision):
    """Peak FLOP/s of one GPU named ``device_name`` in ``precision``, or None if not in the table."""
    name = device_name.lower()
    for key, peaks in PEAK_TFLOPS_TABLE:
        if key.lower() in name:
            return peaks[precision] * 1e12
    return None


def env_peak_tflops():
    """``PEAK_TFLOPS`` from the environment as a number, None when unset."""
    text = os.environ.get("PEAK_TFLOPS")
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UserError(f"PEAK_TFLOPS={text!r} is not a positive number. Set it to the peak TFLOP/s of "
                        "one GPU in the precision you train in (e.g. PEAK_TFLOPS=989 for an H100 SXM in "
                        "bf16), or unset it to use the built-in table.")
    return value


def resolve_peak_flops(device, precision, config_tflops=None):
    """``(peak FLOP/s or None, where it came from)``: env PEAK_TFLOPS, the config, or the table."""
    from_env = env_peak_tflops()
    if from_env:
        return from_env * 1e12, "PEAK_TFLOPS"
    if config_tflops:
        return float(config_tflops) * 1e12, "peak_tflops in the benchy config"
    device = torch.device(device)
    if device.type != "cuda":
        return None, f"no peak FLOP/s known for {device.type}; set PEAK_TFLOPS"
    name = torch.cuda.get_device_name(device)
    peak = lookup_peak_flops(name, precision)
    return peak, (name if peak else f"{name} is not in the table; set PEAK_TFLOPS")


def mfu(flops_per_sample, samples_per_sec, peak_flops, world_size=1):
    """Model FLOP utilisation: achieved FLOP/s over the peak of all ``world_size`` GPUs."""
    if not flops_per_sample or not peak_flops or samples_per_sec is None:
        return None
    return flops_per_sample * samples_per_sec / (peak_flops * world_size)
