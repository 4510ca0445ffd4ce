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


@needs_cuda("CUDA graphs need a GPU")
@pytest.mark.parametrize("amp_mode", ["none", "bf16", "fp16"])
def test_graph_trajectory_matches_eager_on_a_gpu(data_files, tmp_path, amp_mode):
    """The same steps, captured or not. Deterministic cuDNN algorithms and no TF32, so that the two runs
    differ only by the graph; under AMP, whose rounding grows along a trajectory, the first epoch."""
    common = ["--config=test", f"--train_path={data_files['train']}", f"--val_path={data_files['valid']}",
              f"--expdir={tmp_path}", "--Nsamples=64", "--num_epochs=3", "--graph_warmup_steps=3",
              "--enable_fused", f"--amp_mode={amp_mode}", "--device=cuda", "--tf32=false", "--deterministic"]
    run_train([*common, "--run_num=eager"])
    graph = subprocess.run([sys.executable, os.path.join(ROOT, "train_graph.py"), *common, "--run_num=graph"],
                           cwd=ROOT, capture_output=True, text=True)
    assert graph.returncode == 0, graph.stderr[-3000:]
    base = tmp_path / "test" / "1GPU"
    compared = slice(None) if amp_mode == "none" else slice(0, 2)  # step 0 and the first epoch under AMP
    for tag in ("Loss/train", "Loss/valid"):
        eager, captured = losses(base / "eager", tag), losses(base / "graph", tag)
        assert len(eager) == len(captured) == 4
        assert captured[compared] == pytest.approx(eager[compared], rel=2e-3 if amp_mode == "none" else 1e-2)
