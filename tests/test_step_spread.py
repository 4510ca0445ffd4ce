"""utils/step_spread.py: the spread of step times and data waits across ranks, once an epoch.

Three real gloo ranks run train.py under torchrun, one of them made a straggler (it sleeps in each of
its steps) and another starved of data (it sleeps in its training loader, tests/straggler_worker.py):
the epoch's lines and TensorBoard must name the first as the slowest step and the second as the
longest data wait, with the spreads they make, from one all-gather per epoch.
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
STRAGGLER = 1  # sleeps in its forward
STARVED = 2    # sleeps in its training loader


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
    # The upper bound: the step's own 0.05 s and its overhead, which a loaded machine stretches (timeout_for);
    # the 0.2 s after the last gradient counted in would make it 0.25 s.
    assert 0.05 <= mean < 0.05 + timeout_for(0.025), mean
    assert spread.gather() == [[pytest.approx(mean), 3.0, pytest.approx(0.0, abs=0.01)]] and spread.steps == []


def test_one_rank_counts_the_loaders_next_and_the_copy_as_data_wait_not_the_step():
    """A sleep in the loader's next() and one in the copy are the data wait, and not in the step; a sleep in
    the step is in the step, and not in the data wait."""
    import time

    model = torch.nn.Linear(4, 1)
    spread = StepSpread(model, torch.device("cpu"), World())

    def batches():
        for _ in range(3):
            time.sleep(0.2)  # a starved loader
            yield torch.randn(2, 4), torch.randn(2, 1)

    class Loader:
        def __len__(self):
            return 3

        def __iter__(self):
            return batches()

    def move(tensor):
        time.sleep(0.1)  # the copy: twice a step (inputs and targets)
        return tensor

    def step(inputs, targets):
        time.sleep(0.15)
        ((model(inputs) - targets) ** 2).mean().backward()

    step, move, loader = spread.timed(step), spread.timed_copy(move), spread.waited(Loader())
    assert len(loader) == 3
    for inputs, targets in loader:
        step(move(inputs), move(targets))
    wait, own = spread.mean_wait_seconds(), spread.mean_seconds()
    # Upper bounds: the sleeps and their overhead, which a loaded machine stretches (timeout_for). The step's
    # 0.15 s counted as data wait would make the wait 0.55 s; the copies' 0.2 s counted in the step, 0.35 s.
    slack = timeout_for(0.02)
    assert 0.4 <= wait < 0.4 + slack and 0.15 <= own < 0.15 + slack, (wait, own)
    assert spread.gather() == [[pytest.approx(own), 3.0, pytest.approx(wait)]] and spread.waiting == 0.0


def test_a_step_without_a_gradient_is_not_measured(caplog, tmp_path):
    """A step whose gradients no hook sees (a replayed CUDA graph) makes the mean NaN: 'not measured'; the
    data wait, on the host's clock, is still logged."""
    model = torch.nn.Linear(4, 1)
    spread = StepSpread(model, torch.device("cpu"), World())
    spread.timed(lambda inputs, targets: model(inputs).sum().backward())(torch.randn(2, 4), None)
    spread.timed(lambda inputs, targets: None)(None, None)
    assert spread.mean_seconds() != spread.mean_seconds()
    tensorboard = TensorBoard(str(tmp_path), enabled=True)
    with caplog.at_level(logging.INFO):
        logged = spread.log(tensorboard, 2)
    assert "Step time across ranks: not measured" in caplog.text
    assert "Data wait across ranks (next batch and its copy to the device, host time): min 0.0000 s" in caplog.text
    assert sorted(logged) == ["data_wait_longest_rank", "data_wait_max_s", "data_wait_median_s", "data_wait_min_s"]
    caplog.clear()
    with caplog.at_level(logging.INFO):  # an epoch without steps (resumed after its training): nothing
        assert spread.log(tensorboard, 2) is None
    assert caplog.text == ""


def test_train_py_names_the_straggler_and_the_starved_rank_from_one_gather_an_epoch(data_files, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    counts = tmp_path / "counts"
    counts.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=3",
               os.path.join(ROOT, "tests", "straggler_worker.py"), "--config=test",
               f"--train_path={data_files['train']}", f"--val_path={data_files['valid']}", f"--expdir={tmp_path}",
               "--run_num=straggler", "--global_batch_size=3", "--num_epochs=2", "--val_metrics=false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TEST_STRAGGLER_RANK": str(STRAGGLER),
           "TEST_STARVED_RANK": str(STARVED), "TEST_STRAGGLER_SLEEP_S": str(SLEEP_S), "TEST_GATHER_COUNTS": str(counts)}
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
    # The starved rank waits a sleep longer for each batch, outside its step; the others do not (the
    # all-reduce's wait for it is in their steps, after their own work, so in neither number).
    waits = re.findall(r"Data wait across ranks \(next batch and its copy to the device, host time\): "
                       r"min ([\d.]+) s, median ([\d.]+) s, max ([\d.]+) s \(rank (\d+), the longest\)", log)
    assert len(waits) == 2, log[-3000:]
    for low, median, high, longest in waits:
        low, median, high = float(low), float(median), float(high)
        assert int(longest) == STARVED and high - median > 0.8 * SLEEP_S and median < 0.5 * SLEEP_S, waits
    events = EventAccumulator(str(run_dir / "logs"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.value for e in events.Scalars("Step spread/slowest_rank")] == [STRAGGLER, STRAGGLER]
    assert [round(e.value, 4) for e in events.Scalars("Step spread/max_s")] == [float(line[2]) for line in lines]
    assert [e.value for e in events.Scalars("Step spread/data_wait_longest_rank")] == [STARVED, STARVED]
    assert [round(e.value, 4) for e in events.Scalars("Step spread/data_wait_max_s")] == [float(w[2]) for w in waits]
    # One all-gather an epoch on every rank, not one a step (an epoch here is 5 steps: 16 samples, 3 a step).
    assert sorted(os.listdir(counts)) == ["rank0", "rank1", "rank2"]
    assert [int((counts / name).read_text()) for name in sorted(os.listdir(counts))] == [2, 2, 2]


DDP_TIMERS_SCRIPT = """
import json, logging, sys, tempfile
import torch, torch.distributed as dist
from utils.distributed import World
from utils.logging_utils import TensorBoard
from utils.step_spread import StepSpread, ddp_timers
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
assert ddp_timers(model) is None  # not DDP
ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
assert ddp_timers(ddp) is None  # no step timed yet
spread = StepSpread(ddp, torch.device("cpu"), World())
step = spread.timed(lambda inputs: ddp(inputs).square().mean().backward())
for _ in range(12):
    step(torch.randn(64, 256))
folder = tempfile.mkdtemp()
tensorboard = TensorBoard(folder, enabled=True)
logged = spread.log(tensorboard, 12)
tensorboard.close()
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
events = EventAccumulator(folder)
events.Reload()
print("TAGS " + json.dumps(sorted(events.Tags()["scalars"])))
print("LOGGED " + json.dumps(logged))
print("RAW " + json.dumps({k: v for k, v in ddp._get_ddp_logging_data().items() if k.startswith("avg_")}))
"""


def test_ddp_timers_are_logged_beside_the_spread_on_a_real_gloo_group():
    """DDP's own timers (its logger's averages, wall clock on a CPU) logged once an epoch with the spread:
    forward, backward, gradient communication, the part of it during the backward pass and the rest; nothing
    for a model that is not DDP."""
    import json
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = subprocess.run([sys.executable, "-c", DDP_TIMERS_SCRIPT, str(port)], cwd=ROOT, capture_output=True,
                            text=True, timeout=timeout_for(300),
                            env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    logged = json.loads(next(line for line in lines if line.startswith("LOGGED "))[7:])
    raw = json.loads(next(line for line in lines if line.startswith("RAW "))[4:])
    assert logged["ddp_backward_s"] == raw["avg_backward_compute_time"] / 1e9 > 0
    assert logged["ddp_communication_s"] == raw["avg_backward_comm_time"] / 1e9 > 0
    assert logged["ddp_overlap_s"] == raw["avg_backward_compute_comm_overlap_time"] / 1e9
    assert logged["ddp_exposed_s"] == pytest.approx(max(0.0, logged["ddp_communication_s"] - logged["ddp_overlap_s"]))
    tags = json.loads(next(line for line in lines if line.startswith("TAGS "))[5:])
    assert {f"Step spread/ddp_{name}" for name in ("forward_s", "backward_s", "communication_s", "overlap_s",
                                                    "exposed_s")} <= set(tags)
    line = next(line for line in lines if line.startswith("DDP's timers on rank 0"))
    assert f"gradient communication {logged['ddp_communication_s']:.4f} s" in line
