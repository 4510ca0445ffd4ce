"""utils/flops.py: the U-Net's FLOPs per sample, the GPUs' peaks and the model FLOP utilisation."""
import pytest

from utils.errors import UserError
from utils.flops import lookup_peak_flops, mfu, precision_of, resolve_peak_flops, unet_flops_per_sample
from utils.YParams import YParams


def test_full_scale_unet_at_64_cubed_costs_80_5_gflop_per_training_sample():
    params = YParams("config/UNet.yaml", "base")  # full_scale, base_channels 64, crop 64
    assert unet_flops_per_sample(params) == pytest.approx(80.5e9, rel=0.01)


def test_peak_table_matches_device_names():
    assert lookup_peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert lookup_peak_flops("NVIDIA H100 80GB HBM3", "tf32") == 494e12
    assert lookup_peak_flops("NVIDIA H200", "fp16") == 989e12
    assert lookup_peak_flops("NVIDIA A100-SXM4-40GB", "bf16") == 312e12
    assert lookup_peak_flops("NVIDIA A100-SXM4-80GB", "tf32") == 156e12
    assert lookup_peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12
    assert lookup_peak_flops("Tesla V100-SXM2-16GB", "fp16") is None


def test_peak_is_unknown_on_cpu_unless_given(monkeypatch):
    monkeypatch.delenv("PEAK_TFLOPS", raising=False)
    assert resolve_peak_flops("cpu", "fp32")[0] is None
    assert resolve_peak_flops("cpu", "fp32", config_tflops=2)[0] == 2e12
    monkeypatch.setenv("PEAK_TFLOPS", "312")
    assert resolve_peak_flops("cpu", "fp32", config_tflops=2) == (312e12, "PEAK_TFLOPS")
    monkeypatch.setenv("PEAK_TFLOPS", "fast")
    with pytest.raises(UserError, match="PEAK_TFLOPS='fast' is not a positive number"):
        resolve_peak_flops("cpu", "fp32")


def test_mfu_is_flops_times_throughput_over_the_peak_of_all_gpus():
    assert mfu(80.5e9, 1000.0, 989e12) == pytest.approx(80.5e9 * 1000 / 989e12)
    assert mfu(80.5e9, 4000.0, 989e12, world_size=4) == pytest.approx(80.5e9 * 1000 / 989e12)
    assert mfu(None, 1000.0, 989e12) is None and mfu(80.5e9, 1000.0, None) is None


def test_precision_follows_amp_mode_and_tf32(monkeypatch):
    monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    precisions = [precision_of(mode, True) for mode in ("bf16", "fp16", "none")]
    assert precisions == ["bf16", "fp16", "tf32"]
    assert precision_of("none", False) == "fp32"
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    assert precision_of("none", True) == "fp32"
