"""train_graph.py: the same run as train.py with the step replayed from a CUDA graph."""
import os
import subprocess
import sys

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import ROOT, needs_cuda, run_train

pytestmark = pytest.mark.slow


def test_without_cuda_it_stops_with_a_message_and_writes_nothing(data_files, tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, os.path.join(ROOT, "train_graph.py"), "--config=test",
                             f"--train_path={data_files['train']}", f"--val_path={data_files['valid']}",
                             f"--expdir={tmp_path / 'runs'}"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "needs a CUDA GPU" in result.stderr and "Use train.py" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_train_graph_is_train_py_with_another_step():
    source = open(os.path.join(ROOT, "train_graph.py")).read()
    assert "from train import main, train_step, training_loss" in source
    assert "def train_one_epoch" not in source and "def validate" not in source  # shared, not copied


def losses(run_dir, tag):
    events = EventAccumulator(str(run_dir / "logs"), size_guidance={"scalars": 0})
    events.Reload()
    return [event.value for event in events.Scalars(tag)]


# How cuDNN says that no engine of the kind asked for (here: deterministic) can run a convolution.
NO_ENGINE = ("unable to find an engine", "Unable to find a valid cuDNN algorithm", "CUDNN_STATUS_NOT_SUPPORTED")


def no_deterministic_engine(amp_mode, *outputs):
    """Why a 16-bit run failed, when it was for want of a deterministic cuDNN engine (some cuDNN releases
    have none for 16-bit 3-D transposed convolutions), else None. Either way the test fails: on such a GPU
    the captured graph's 16-bit trajectory is not checked, and the failure says so instead of a skip."""
    if amp_mode in ("bf16", "fp16") and any(text in output for output in outputs for text in NO_ENGINE):
        return (f"no deterministic cuDNN engine for {amp_mode} 3-D (transposed) convolutions with this PyTorch "
                "and cuDNN: the comparison needs --deterministic, so it cannot run here")
    return None


def test_a_missing_deterministic_engine_is_named_and_nothing_else_is_excused():
    stderr = "RuntimeError: GET was unable to find an engine to execute this computation"
    assert "no deterministic cuDNN engine for bf16" in no_deterministic_engine("bf16", "", stderr)
    assert no_deterministic_engine("none", stderr) is None  # fp32 has deterministic engines: a real failure
    assert no_deterministic_engine("fp16", "RuntimeError: CUDA error: an illegal memory access") is None


@needs_cuda("CUDA graphs need a GPU")
@pytest.mark.parametrize("amp_mode", ["none", "bf16", "fp16"])
def test_graph_trajectory_matches_eager_on_a_gpu(data_files, tmp_path, amp_mode):
    """The same steps, captured or not. Deterministic cuDNN algorithms and no TF32, so that the two runs
    differ only by the graph; under AMP, whose rounding grows along a trajectory, the first epoch."""
    common = ["--config=test", f"--train_path={data_files['train']}", f"--val_path={data_files['valid']}",
              f"--expdir={tmp_path}", "--Nsamples=64", "--num_epochs=3", "--graph_warmup_steps=3",
              "--enable_fused", f"--amp_mode={amp_mode}", "--device=cuda", "--tf32=false", "--deterministic"]
    for run in (lambda: run_train([*common, "--run_num=eager"], check=False),
                lambda: subprocess.run([sys.executable, os.path.join(ROOT, "train_graph.py"), *common,
                                        "--run_num=graph"], cwd=ROOT, capture_output=True, text=True)):
        result = run()
        reason = no_deterministic_engine(amp_mode, result.stdout, result.stderr) if result.returncode else None
        assert reason is None, f"{reason}; run this test with a cuDNN release that has one"
        assert result.returncode == 0, result.stderr[-3000:]
    base = tmp_path / "test" / "1GPU"
    compared = slice(None) if amp_mode == "none" else slice(0, 2)  # step 0 and the first epoch under AMP
    for tag in ("Loss/train", "Loss/valid"):
        eager, captured = losses(base / "eager", tag), losses(base / "graph", tag)
        assert len(eager) == len(captured) == 4
        assert captured[compared] == pytest.approx(eager[compared], rel=2e-3 if amp_mode == "none" else 1e-2)
