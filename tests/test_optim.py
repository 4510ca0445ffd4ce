"""Precision and optimiser choices: what each option really gives, and refusals of what cannot work."""
import logging

import pytest
import torch

from networks.UNet import UNet
from utils.YParams import load_params
from utils.errors import UserError
from utils.optim import Precision, build_optimizer, configure_tf32, set_learning_rate

CPU = torch.device("cpu")


def params_with(*overrides):
    return load_params(["--config=test", *overrides])


def test_plain_adam_by_default():
    optimizer = build_optimizer(params_with(), UNet(base_channels=4, full_scale=False))
    assert isinstance(optimizer, torch.optim.Adam) and not optimizer.defaults["fused"]


def test_enable_apex_falls_back_to_fused_torch_adam_and_says_so(caplog):
    with caplog.at_level(logging.INFO):
        optimizer = build_optimizer(params_with("--enable_apex"), UNet(base_channels=4, full_scale=False))
    assert optimizer.defaults["fused"] is True
    assert "apex is not importable" in caplog.text


def test_enable_fused_and_capturable():
    model = UNet(base_channels=4, full_scale=False)
    assert build_optimizer(params_with("--enable_fused"), model).defaults["fused"] is True
    captured = build_optimizer(params_with(), model, capturable=True)
    lr = captured.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and captured.defaults["capturable"]
    set_learning_rate(captured, 1e-3)
    assert captured.param_groups[0]["lr"] is lr and lr.item() == pytest.approx(1e-3)  # updated in place


@pytest.mark.parametrize("amp_mode, dtype, scaler", [("none", None, False), ("bf16", torch.bfloat16, False),
                                                      ("fp16", torch.float16, True)])
def test_precision_resolves_to_one_context_and_scaler(amp_mode, dtype, scaler):
    precision = Precision(amp_mode, CPU)
    assert precision.scaler.is_enabled() is scaler
    with precision.autocast():
        out = torch.nn.functional.linear(torch.ones(2, 2), torch.ones(2, 2))
    assert out.dtype == (dtype or torch.float32)


def test_unsupported_autocast_is_refused(monkeypatch):
    def no_fp16(device_type, dtype=None, **kwargs):
        raise RuntimeError(f"{device_type} autocast does not support {dtype}")

    monkeypatch.setattr(torch, "autocast", no_fp16)
    with pytest.raises(UserError, match="cannot autocast"):
        Precision("fp16", CPU)


def test_tf32_switch():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        configure_tf32(True)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        configure_tf32(False)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_unknown_jit_mode_is_refused():
    with pytest.raises(UserError, match="jit_mode=trace is not a valid choice"):
        params_with("--jit_mode=trace")
