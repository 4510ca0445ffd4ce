"""benchmarks/ladder.py runs its rungs with train.py's own builders and writes the result files;
benchmarks/suite/gpu_suite.sh, which runs it on a GPU, refuses a machine without one."""
import argparse
import json
import os
import subprocess
import sys

import pytest
import torch

import train
from benchmarks import ladder
from conftest import ROOT, timeout_for

pytestmark = pytest.mark.slow


def test_cpu_preset_writes_json_markdown_and_log(tmp_path, synthetic_data_dir):
    ladder.main(["--preset", "cpu", "--only", "gpu-inmem", "--nbatches", "2", "--ntrials", "1", "--nwarmup", "1",
                 "--data_dir", str(synthetic_data_dir), "--out_dir", str(tmp_path / "out")])
    [json_path] = (tmp_path / "out").glob("*.json")
    report = json.loads(json_path.read_text())
    assert {"device", "torch", "cuda", "date", "command", "runs"} <= set(report)
    [run] = report["runs"]
    assert run["name"] == "gpu-inmem on CPU tensors" and "error" not in run
    assert all(run[key] > 0 for key in ("full", "synthetic", "io"))
    assert "| gpu-inmem on CPU tensors |" in json_path.with_suffix(".md").read_text()
    assert json_path.with_suffix(".log").exists()


def test_gpu_suite_refuses_to_run_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = subprocess.run([os.path.join(ROOT, "benchmarks", "suite", "gpu_suite.sh"), "ladder"], cwd=ROOT,
                            env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=timeout_for(60))
    assert result.returncode == 2 and "sees no CUDA GPU" in result.stderr and "--preset cpu" in result.stderr
    bad = subprocess.run([os.path.join(ROOT, "benchmarks", "suite", "gpu_suite.sh"), "ladders"], cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout_for(60))
    assert bad.returncode == 2 and "unknown stage 'ladders'" in bad.stderr


def test_the_suite_collects_where_only_the_runtime_requirements_are(tmp_path):
    """gpu_suite.sh's tests stage runs on a GPU node with torch but without requirements-test.txt's
    extras: there the tests that need them must skip, not stop pytest at collection."""
    missing = tmp_path / "missing"
    for package in ("nbformat", "nbclient", "jupyter_client", "playwright", "nvidia"):
        (missing / package).mkdir(parents=True)
        (missing / package / "__init__.py").write_text(f"raise ModuleNotFoundError('no {package} here')\n")
    env = {key: value for key, value in os.environ.items() if key != "CI"}  # CI must have them all
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(missing), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_for(120))
    assert result.returncode == 0, result.stdout[-3000:]
    assert "tests/test_notebook.py" in result.stdout and "skipped" in result.stdout.lower()


def test_a_graph_rung_captures_before_the_first_timed_trial(tmp_path, synthetic_data_dir, monkeypatch):
    """train_graph.py's rung warms up graph_warmup_steps steps and captures before any trial starts
    (the ladder's trials are shorter than the warm-up). The CUDA graph itself needs a GPU: here a
    recording stand-in of its step, built by the same call, counts the calls made before timing."""
    import train_graph
    events = []

    def recording_graph_step(model, optimizer, loss_fn, precision, params):
        calls = 0
        eager_step = train.default_step(model, optimizer, loss_fn, precision, params)

        def step(inputs, targets):
            nonlocal calls
            calls += 1
            events.append("eager" if calls <= params.graph_warmup_steps else
                          "capture" if calls == params.graph_warmup_steps + 1 else "replay")
            return eager_step(inputs, targets)
        return step

    def recording_trials(step_fn, *args, **kwargs):
        events.append("trials start")
        return {}

    monkeypatch.setattr(train_graph, "make_graph_step", recording_graph_step)
    monkeypatch.setattr(ladder, "run_trials", recording_trials)
    train_path, val_path = (synthetic_data_dir / f"synthetic_{name}.h5" for name in ("train", "valid"))
    options = ["--config=test", f"--train_path={train_path}", f"--val_path={val_path}", "--device=cpu",
               "--data_loader_config=gpu-inmem", "--graph_warmup_steps=5", "--checkpoint=false"]
    ladder.measure_rung(options, "train_graph.py", argparse.Namespace(ntrials=3, nwarmup=1), nbatches=3)
    assert events == ["eager"] * 5 + ["capture", "replay", "trials start"]


class Counted(torch.utils.data.Dataset):
    """Samples counted as the workers make them (a shared counter), whether or not anyone reads them."""

    def __init__(self, counter, size=4096):
        self.counter, self.size = counter, size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        with self.counter.get_lock():
            self.counter.value += 1
        return torch.zeros(2), torch.zeros(1)


class CountedLoader(torch.utils.data.DataLoader):
    iters = 0

    def __iter__(self):
        CountedLoader.iters += 1
        return super().__iter__()


def test_the_trials_read_one_stream_of_a_persistent_loader_and_warm_up_past_its_batches_in_flight():
    """A DataLoader with persistent workers is never reset between trials (a reset drains every batch in
    flight, made and thrown away), and each kind's warm-up covers twice the batches in flight."""
    import multiprocessing

    from benchmarks.trials import BatchStream, run_trials

    counter = multiprocessing.get_context("fork").Value("i", 0)
    loader = CountedLoader(Counted(counter), batch_size=4, num_workers=2, prefetch_factor=2, persistent_workers=True,
                           multiprocessing_context="fork")
    stream = BatchStream(loader)
    steps = []
    summary = run_trials(lambda x, y: steps.append(1), stream, "cpu", nbatches=2, ntrials=3, nwarmup=1)
    assert summary["nwarmup"] == 4  # 2 workers x 2 batches in flight, twice over, in trials of 2 batches
    trials = summary["nwarmup"] + 3
    # IO and FULL read 2 batches a trial, SYNTHETIC one (and steps 1 + 2 times on it)
    read = trials * (2 + 1 + 2)
    assert CountedLoader.iters == 1 and len(steps) == trials * (3 + 2)
    assert read * 4 <= counter.value <= (read + 2 * 2) * 4  # made: what was read, and at most the batches in flight


def test_a_rung_whose_process_fails_does_not_take_the_next(tmp_path, synthetic_data_dir, monkeypatch):
    """One process per rung: a rung that ends its process (here an option train.py refuses; on a GPU a sticky
    CUDA error) is reported, and the next rung is measured."""
    monkeypatch.setattr(ladder, "CPU_RUNGS", [ladder.Rung("broken", ["--data_loader_config=gpu-inmem",
                                                                     "--num_epochs=many"], step=1),
                                              ladder.Rung("whole", ["--data_loader_config=gpu-inmem"], step=2)])
    ladder.main(["--preset", "cpu", "--nbatches", "2", "--ntrials", "1", "--nwarmup", "0",
                 "--data_dir", str(synthetic_data_dir), "--out_dir", str(tmp_path)])
    [report] = [json.loads(path.read_text()) for path in tmp_path.glob("*.json")]
    broken, whole = report["runs"]
    assert broken["error"].startswith("its process failed (exit status") and "full" not in broken
    assert "error" not in whole and whole["full"] > 0 and whole["precision"] == "fp32"
    assert "num_epochs" in (tmp_path / next(tmp_path.glob("*.log")).name).read_text()  # its process's output


def test_a_rung_whose_convolutions_leave_cudnn_gets_one_short_trial_and_is_marked():
    args = argparse.Namespace(ntrials=3, nwarmup=1)
    assert ladder.trial_sizes(args, 15, None) == (15, 3, 1)
    assert ladder.trial_sizes(args, 15, "bf16 3-D convolutions leave cuDNN here") == (5, 1, 1)
    assert ladder.slow_convolutions(["--amp_mode=bf16"], torch.device("cpu")) is None  # a CPU has no cuDNN
    report = {"command": "x", "device": "d", "torch": "t", "cuda": "c", "date": "now", "runs": [
        {"name": "gpu-inmem + AMP bf16", "step": 4, "slow": "bf16 3-D convolutions leave cuDNN here: one trial",
         "full": 1.0, "synthetic": 1.0, "io": 1.0, "mfu": None, "peak_mem_gb": None}]}
    assert "| gpu-inmem + AMP bf16 (slow here: bf16 3-D convolutions leave cuDNN here" in ladder.markdown_table(report)
