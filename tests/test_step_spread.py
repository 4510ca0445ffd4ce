"""utils/step_spread.py: the spread of step times across ranks, once an epoch.

Three real gloo ranks run train.py under torchrun, one of them made a straggler (it sleeps in each of
its steps, tests/straggler_worker.py): the epoch's line and TensorBoard must name it, with the spread
it makes, from one all-gather per epoch.
"""
import logging
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, timeout_for
from utils.distributed import World
from utils.logging_utils import TensorBoard
from utils.step_spread import StepSpread

SLEEP_S = 0.3
STRAGGLER = 1


def test_one_rank_times_each_step_to_its_last_gradient():
    """One rank: the mean of the steps' own work (a sleep before the backward counts, one after it not)."""
    import time

    model = torch.nn.Linear(4, 1)
    spread = StepSpread(model, torch.device("cpu"), World())

    def step(inputs, targets):
        time.sleep(0.05)
        ((model(inputs) - targets) ** 2).mean().backward()
        time.sleep(0.2)  # after the last gradient: not the step's own work (the wait for the others)

    step = spread.timed(step)
    for _ in range(3):
        step(torch.randn(2, 4), torch.randn(2, 1))
    mean = spread.mean_seconds()
    assert 0.05 <= mean < 0.15, mean
    assert spread.gather() == [[pytest.approx(mean), 3.0]] and spread.steps == []  # gathered: starts afresh


def test_a_step_without_a_gradient_is_not_measured(caplog, tmp_path):
    """A step whose gradients no hook sees (a replayed CUDA graph) makes the mean NaN: 'not measured'."""
    model = torch.nn.Linear(4, 1)
    spread = StepSpread(model, torch.device("cpu"), World())
    spread.timed(lambda inputs, targets: model(inputs).sum().backward())(torch.randn(2, 4), None)
    spread.timed(lambda inputs, targets: None)(None, None)
    assert spread.mean_seconds() != spread.mean_seconds()
    tensorboard = TensorBoard(str(tmp_path), enabled=True)
    with caplog.at_level(logging.INFO):
        assert spread.log(tensorboard, 2) is None
    assert "Step time across ranks: not measured" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):  # an epoch without steps (resumed after its training): nothing
        assert spread.log(tensorboard, 2) is None
    assert caplog.text == ""


def test_train_py_names_the_straggler_from_one_gather_an_epoch(data_files, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    counts = tmp_path / "counts"
    counts.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=3",
               os.path.join(ROOT, "tests", "straggler_worker.py"), "--config=test",
               f"--train_path={data_files['train']}", f"--val_path={data_files['valid']}", f"--expdir={tmp_path}",
               "--run_num=straggler", "--global_batch_size=3", "--num_epochs=2", "--val_metrics=false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TEST_STRAGGLER_RANK": str(STRAGGLER),
           "TEST_STRAGGLER_SLEEP_S": str(SLEEP_S), "TEST_GATHER_COUNTS": str(counts)}
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(600), env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = tmp_path / "test" / "3CPU" / "straggler"
    log = (run_dir / "out.log").read_text()
    lines = re.findall(r"Step time across ranks \(forward and backward, before the gradients' all-reduce\): "
                       r"min ([\d.]+) s, median ([\d.]+) s, max ([\d.]+) s \(rank (\d+), the slowest\)", log)
    assert len(lines) == 2, log[-3000:]  # one per epoch
    for low, median, high, slowest in lines:
        low, median, high = float(low), float(median), float(high)
        # The straggler's own steps are a sleep longer; the others' are not: the all-reduce's wait is
        # not in them (timed to the end of the step, every rank would show the straggler's pace).
        assert int(slowest) == STRAGGLER and high - median > 0.8 * SLEEP_S and low <= median, lines
    events = EventAccumulator(str(run_dir / "logs"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.value for e in events.Scalars("Step spread/slowest_rank")] == [STRAGGLER, STRAGGLER]
    assert [round(e.value, 4) for e in events.Scalars("Step spread/max_s")] == [float(line[2]) for line in lines]
    # One all-gather an epoch on every rank, not one a step (an epoch here is 5 steps: 16 samples, 3 a step).
    assert sorted(os.listdir(counts)) == ["rank0", "rank1", "rank2"]
    assert [int((counts / name).read_text()) for name in sorted(os.listdir(counts))] == [2, 2, 2]
