"""Precision and optimiser choices: what each option really gives, and refusals of what cannot work."""
import contextlib
import logging
import os
import sys

import pytest
import torch

from conftest import ROOT, run_train
from networks.UNet import UNet
from utils.YParams import load_params
from utils.errors import UserError
from utils.optim import Precision, build_optimizer, check_autocast, configure_tf32, set_learning_rate

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


# ----------------------------------------------------------------------------- NVIDIA apex (a stand-in)

STANDINS = os.path.join(ROOT, "tests", "standins")


@pytest.fixture
def apex_standin(monkeypatch):
    """tests/standins/apex importable for one test (the real NVIDIA apex needs CUDA), forgotten afterwards."""
    monkeypatch.syspath_prepend(STANDINS)
    yield
    for name in [name for name in sys.modules if name == "apex" or name.startswith("apex.")]:
        del sys.modules[name]


def test_enable_apex_builds_apex_fused_adam_as_the_original(apex_standin, caplog):
    from apex.optimizers import FusedAdam
    with caplog.at_level(logging.INFO):
        optimizer = build_optimizer(params_with("--enable_apex"), UNet(base_channels=4, full_scale=False))
    assert type(optimizer) is FusedAdam and optimizer.adam_w_mode == 0 and not optimizer.capturable
    assert "not importable" not in caplog.text


def test_the_graph_variant_says_it_does_not_use_apex(apex_standin, caplog):
    with caplog.at_level(logging.INFO):
        optimizer = build_optimizer(params_with("--enable_apex"), UNet(base_channels=4, full_scale=False),
                                    capturable=True)
    assert type(optimizer) is torch.optim.Adam and optimizer.defaults["capturable"]
    assert "apex's FusedAdam is not used by train.py's CUDA-graph variant" in caplog.text


@pytest.mark.parametrize("overrides, syncs", [
    ([], True),                                  # plain Adam: GradScaler reads the inf check with .item()
    (["--enable_fused"], False),                 # torch's fused Adam takes it as a tensor
    (["--enable_apex"], False),                  # apex's FusedAdam, made capturable for fp16
])
def test_fp16_steps_wait_for_the_device_only_with_plain_adam(apex_standin, monkeypatch, caplog, overrides, syncs):
    """The rule of build_optimizer: with fp16, GradScaler.step takes the host-synchronising path
    (_maybe_opt_step, which calls .item() on the inf check) only for an optimiser that cannot take
    the check as a tensor, and train.py says so in its log. A step with an inf gradient is skipped."""
    calls = []
    original = torch.amp.GradScaler._maybe_opt_step
    monkeypatch.setattr(torch.amp.GradScaler, "_maybe_opt_step",
                        lambda self, *args, **kwargs: calls.append(1) or original(self, *args, **kwargs))
    model = UNet(base_channels=4, full_scale=False)
    with caplog.at_level(logging.INFO):
        optimizer = build_optimizer(params_with("--amp_mode=fp16", *overrides), model)
    assert ("one host sync per step" in caplog.text) is syncs
    scaler = torch.amp.GradScaler("cpu")
    inputs = torch.randn(1, 4, 32, 32, 32)
    for factor in (1.0, float("inf")):
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.zero_grad()
        scaler.scale(model(inputs).mean() * factor).backward()
        scaler.step(optimizer)
        scaler.update()
        changed = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
        assert changed is (factor == 1.0)  # the inf step is skipped, on whichever path
    assert bool(calls) is syncs


@pytest.mark.slow
@pytest.mark.cpu16
def test_a_demo_epoch_with_apex_runs_and_resumes(tmp_path, data_files):
    """train.py --enable_apex where NVIDIA apex is importable (the stand-in on PYTHONPATH): it calls
    apex's argument-less zero_grad, trains an epoch in fp32 and resumes from the checkpoint, and
    trains in fp16 with the capturable FusedAdam."""
    env = {**os.environ, "PYTHONPATH": STANDINS}
    common = ["--config=test", f"--train_path={data_files['train']}", f"--val_path={data_files['valid']}",
              f"--expdir={tmp_path}", "--enable_apex", "--val_metrics=false", "--Nsamples=8", "--Nsamples_val=4"]
    runs = {"none": [["--num_epochs=1"], ["--num_epochs=2", "--resume", "--allow_changes=num_epochs"]], "fp16": [["--num_epochs=1"]]}
    for amp_mode, commands in runs.items():
        for options in commands:
            run_train([*common, f"--run_num={amp_mode}", f"--amp_mode={amp_mode}", *options], env=env)
        log = (tmp_path / "test" / "1CPU" / amp_mode / "out.log").read_text()
        assert "apex is not importable" not in log and "DONE ---- rank 0" in log
        assert log.count("Time taken for epoch") == len(commands)
        assert ("Resumed from" in log) is (len(commands) == 2)
        assert ("FusedAdam(capturable=True)" in log) is (amp_mode == "fp16")


@pytest.mark.parametrize("capability, refused", [((7, 0), True), ((7, 5), True), ((8, 0), False), ((9, 0), False)])
def test_bf16_needs_compute_capability_8(monkeypatch, capability, refused):
    """V100 (7.0) and T4 (7.5) emulate bf16, and torch.cuda.is_bf16_supported() says True there by default."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU")
    probes = []
    monkeypatch.setattr(torch, "autocast", lambda *args, **kwargs: probes.append(1) or contextlib.nullcontext())
    cuda = torch.device("cuda", 0)
    if refused:
        with pytest.raises(UserError, match=r"compute capability 8\.0.*a GPU has 7\.\d"):
            check_autocast(cuda, torch.bfloat16, "bf16")
        assert not probes
    else:  # past the check, to the autocast probe (which needs a real GPU to go further)
        with pytest.raises((UserError, AssertionError, RuntimeError)):
            check_autocast(cuda, torch.bfloat16, "bf16")
        assert probes
