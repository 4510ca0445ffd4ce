"""Checkpoints: complete or absent, never half written; restored with weights_only; models unwrapped."""
import logging
import os
import re

import pytest
import torch

from networks.UNet import UNet
from train import Position
from utils.YParams import YParams
from utils.checkpoint import Checkpointer, load_checkpoint, save_checkpoint
from utils.optim import build_optimizer
from utils.distributed import bare_model


def make_states(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    return model, optimizer, torch.amp.GradScaler("cpu", enabled=False)


def test_round_trip_restores_weights_optimizer_position_and_rng(tmp_path):
    params = YParams("config/UNet.yaml", "test")
    model, optimizer, scaler = make_states(0)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, model, optimizer, scaler, {"epoch": 2, "step": 8, "batch_in_epoch": 0}, params)
    expected_draw = torch.rand(3)

    other_model, other_optimizer, other_scaler = make_states(1)
    position = load_checkpoint(path, other_model, other_optimizer, other_scaler)
    assert position == {"epoch": 2, "step": 8, "batch_in_epoch": 0}
    torch.testing.assert_close(other_model.state_dict(), model.state_dict())
    torch.testing.assert_close(other_optimizer.state_dict()["state"], optimizer.state_dict()["state"])
    assert torch.equal(torch.rand(3), expected_draw)  # the RNG continues where the saved run was


def test_a_learning_rate_tensor_stays_the_same_tensor(tmp_path):
    """train_graph.py's optimiser keeps its LR in a device tensor that the captured graph reads; a
    resume must set that tensor's value, not swap in the checkpoint's (CPU) copy."""
    params = YParams("config/UNet.yaml", "test")
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=torch.tensor(2e-3), foreach=False)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, model, optimizer, torch.amp.GradScaler("cpu", enabled=False),
                    {"epoch": 1, "step": 4, "batch_in_epoch": 0}, params)
    lr = optimizer.param_groups[0]["lr"]
    lr.fill_(5e-4)
    load_checkpoint(path, model, optimizer, torch.amp.GradScaler("cpu", enabled=False))
    assert optimizer.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(2e-3)


def test_a_failed_save_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    params = YParams("config/UNet.yaml", "test")
    model, optimizer, scaler = make_states(0)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, model, optimizer, scaler, {"epoch": 1, "step": 4, "batch_in_epoch": 0}, params)
    before = path.read_bytes()

    def interrupted_save(obj, f):
        with open(f, "wb") as half:
            half.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, model, optimizer, scaler, {"epoch": 2, "step": 8, "batch_in_epoch": 0}, params)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["checkpoint.pt"]  # no temporary file left behind


def test_unwrap_removes_ddp_and_compile_wrappers():
    inner = torch.nn.Linear(2, 2)

    class Wrapper(torch.nn.Module):
        def __init__(self, name, module):
            super().__init__()
            setattr(self, name, module)

    assert bare_model(Wrapper("module", Wrapper("_orig_mod", inner))) is inner
    assert bare_model(inner) is inner


def test_the_resuming_run_keeps_its_own_optimiser_implementation(tmp_path):
    """A train.py checkpoint (plain Adam) resumed by train_graph.py (capturable fused Adam): the
    saved param groups must not switch the flags the CUDA graph capture needs back off."""
    params = YParams("config/UNet.yaml", "test")
    model, optimizer, scaler = make_states(0)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, model, optimizer, scaler, {"epoch": 1, "step": 4, "batch_in_epoch": 0}, params)

    resumed = build_optimizer(params, model, capturable=True)
    load_checkpoint(path, model, resumed, scaler)
    group = resumed.param_groups[0]
    assert group["capturable"] is True and group["fused"] is True
    assert float(group["lr"]) == pytest.approx(optimizer.param_groups[0]["lr"])
    state, saved = resumed.state_dict()["state"][0], optimizer.state_dict()["state"][0]
    torch.testing.assert_close(state["exp_avg"], saved["exp_avg"])


def test_checkpointer_writes_when_due_and_says_how_long_it_took(tmp_path, caplog):
    params = YParams("config/UNet.yaml", "test")
    model = UNet(base_channels=4, full_scale=False)
    optimizer = torch.optim.Adam(model.parameters())
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    path = tmp_path / "checkpoint.pt"
    params.update({"checkpoint_interval_s": 3600})
    checkpoints = Checkpointer(str(tmp_path), params)
    with caplog.at_level(logging.INFO):
        checkpoints.save(model, optimizer, scaler, Position(1, 4, 0))
        assert not path.exists()  # an hour has not passed
        checkpoints.save(model, optimizer, scaler, Position(1, 6, 2), due=True)
        assert torch.load(path, weights_only=True)["position"]["step"] == 6  # a stop signal: due
    assert re.search(r"Checkpoint written in [\d.]+ sec \(0\.\d\d GiB\): " + re.escape(str(path)), caplog.text)
    params.update({"checkpoint_interval_s": 0})
    Checkpointer(str(tmp_path), params).save(model, optimizer, scaler, Position(2, 8, 0))
    assert torch.load(path, weights_only=True)["position"]["step"] == 8  # every epoch
    params.update({"checkpoint": False})
    Checkpointer(str(tmp_path), params).save(model, optimizer, scaler, Position(3, 9, 0), due=True)
    assert torch.load(path, weights_only=True)["position"]["step"] == 8  # off


def test_round_trip_restores_the_gradient_scalers_scale(tmp_path):
    """--amp_mode=fp16's loss scale, lowered after steps with inf gradients, goes on from where it was."""
    params = YParams("config/UNet.yaml", "test")
    model, optimizer, _ = make_states(0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    scaler.scale(torch.ones(()))  # the scale exists from the first scaled loss
    scaler.update(new_scale=2.0**9)
    save_checkpoint(tmp_path / "checkpoint.pt", model, optimizer, scaler, {"epoch": 1, "step": 4, "batch_in_epoch": 0},
                    params)
    fresh = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    load_checkpoint(tmp_path / "checkpoint.pt", model, optimizer, fresh)
    assert fresh.get_scale() == 2.0**9
