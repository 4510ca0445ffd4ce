"""Stop signals sent to every process of a job (Slurm, `timeout`, `kill -- -PGID`), loader workers included."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT, SIGNAL_DURING_STEP, run_train, timeout_for
from utils import get_data_loader_distributed
from utils.YParams import YParams


def send_from_another_process(signum, pids):
    # As Slurm, `timeout` or `kill` do; the main process's own SIGTERM ends a worker (see below).
    subprocess.run([sys.executable, "-c", f"import os\nfor pid in {pids}: os.kill(pid, {int(signum)})"], check=True)


@pytest.mark.slow
@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_loader_workers_leave_stop_signals_to_the_main_process(data_files, start_method):
    params = YParams("config/UNet.yaml", "test")
    params.update({"train_path": data_files["train"], "val_path": data_files["valid"],
                   "num_data_workers": 2, "Nsamples": 48})
    loader, _ = get_data_loader_distributed(params, 0, None)
    loader.multiprocessing_context = start_method
    for epoch in range(2):  # persistent workers: the same processes serve the second epoch
        loader.sampler.set_epoch(epoch)
        batches = iter(loader)
        next(batches)
        workers = batches._workers
        for signum in (signal.SIGTERM, signal.SIGUSR1):  # by default, SIGUSR1 ends a process too
            send_from_another_process(signum, [worker.pid for worker in workers])
        assert sum(1 for _ in batches) == len(loader) - 1  # a dead worker raises a RuntimeError here
        assert all(worker.is_alive() for worker in workers)
    # The main process's own SIGTERM still ends a worker, quietly: it ends them so at exit.
    for worker in workers:
        worker.terminate()
        worker.join(timeout=timeout_for(30))
        assert worker.exitcode == 0


def children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return f.read().split()


def signal_the_whole_job(args, signum):
    """Start train.py as a job step (its own process group), send ``signum`` to all of it once training runs."""
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while len(children(process.pid)) < 4:  # 2 validation and 2 training workers: training has begun
            assert process.poll() is None and time.time() < deadline, process.communicate()
            time.sleep(0.02)
        os.killpg(process.pid, signum)  # the main process and every loader worker
        stdout, stderr = process.communicate(timeout=timeout_for(120))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, stdout, stderr


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=lambda signum: signum.name)
def test_a_stop_signal_to_the_whole_job_stops_it_with_a_checkpoint(data_files, tmp_path, signum):
    args = ["--config=test", f"--train_path={data_files['train']}", f"--val_path={data_files['valid']}",
            f"--expdir={tmp_path}", "--num_data_workers=2", "--Nsamples=160", "--Nsamples_val=8"]  # 40 steps an epoch
    code, stdout, stderr = signal_the_whole_job(args, signum)
    assert code == 128 + signum, stdout[-3000:] + stderr[-3000:]
    assert "killed by signal" not in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert stdout.count(f"Received {signum.name}") == 1, stdout[-3000:]  # the main process's, not the workers'
    assert "Stopped at step" in stdout
    run_dir = tmp_path / "test" / "1CPU" / "00"
    step = torch.load(run_dir / "checkpoint.pt", weights_only=True)["position"]["step"]
    assert step < 2 * 40  # it really stopped before the end

    if signum == signal.SIGTERM:  # and it goes on from there (test_train.py checks resumed runs in detail)
        resumed = run_train([*args, "--resume"])
        assert f"Resumed from {run_dir / 'checkpoint.pt'} at epoch" in resumed.stdout
        assert f"step {step}." in resumed.stdout
        assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["position"]["step"] == 2 * 40


# ----------------------------------------------------------------------------- Ctrl-C

@pytest.mark.slow
def test_ctrl_c_stops_at_the_next_step_with_a_checkpoint_and_one_line(data_files, tmp_path):
    """A terminal's Ctrl-C: SIGINT to the whole foreground group, the loader workers included."""
    args = ["--config=test", f"--train_path={data_files['train']}", f"--val_path={data_files['valid']}",
            f"--expdir={tmp_path}", "--num_data_workers=2", "--Nsamples=160", "--Nsamples_val=8"]  # 40 steps an epoch
    code, stdout, stderr = signal_the_whole_job(args, signal.SIGINT)
    assert code == 128 + signal.SIGINT, stdout[-3000:] + stderr[-3000:]
    for text in ("Traceback", "KeyboardInterrupt", "killed by signal", "exited unexpectedly"):
        assert text not in stdout + stderr, (text, stderr[-3000:])
    assert stdout.count("Received SIGINT") == 1, stdout[-3000:]
    stopped = re.findall(r"Stopped at step (\d+) \(epoch \d+\) with a checkpoint in .*; continue with --resume --run_num=00\.",
                         stdout)
    step = torch.load(tmp_path / "test" / "1CPU" / "00" / "checkpoint.pt", weights_only=True)["position"]["step"]
    assert stopped == [str(step)] and step < 2 * 40


@pytest.mark.slow
def test_a_second_ctrl_c_exits_at_once_and_keeps_the_last_checkpoint(data_files, tmp_path):
    args = ["--config=test", f"--train_path={data_files['train']}", f"--val_path={data_files['valid']}",
            f"--expdir={tmp_path}", "--Nsamples=16", "--Nsamples_val=4", "--num_epochs=3"]  # 4 steps an epoch
    # SIGINT during step 6, which then takes 60 s: time for a second Ctrl-C before the step ends.
    process = subprocess.Popen([sys.executable, "-c", SIGNAL_DURING_STEP, *args], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "SIGNAL": "SIGINT", "SIGNAL_AT": "6", "STEP_SECONDS": "60"})
    try:
        before = ""
        while "signal sent" not in before:  # step 6: epoch 1 and its checkpoint are done
            line = process.stdout.readline()
            assert line, before + process.stderr.read()
            before += line
        time.sleep(1.5)  # a person's second Ctrl-C, not the same one passed on by torchrun
        process.send_signal(signal.SIGINT)
        start = time.time()
        stdout, stderr = process.communicate(timeout=timeout_for(30))
        stdout = before + stdout
    finally:
        if process.poll() is None:
            process.kill()
    assert time.time() - start < 10  # not after the 60 s step
    assert process.returncode == 128 + signal.SIGINT, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    assert "Received SIGINT again: exiting now; the last checkpoint (if any) is kept." in stdout, stdout[-3000:]
    assert "Stopped at step" not in stdout
    position = torch.load(tmp_path / "test" / "1CPU" / "00" / "checkpoint.pt", weights_only=True)["position"]
    assert position == {"epoch": 1, "step": 4, "batch_in_epoch": 0}


# Ctrl-C while the data loaders are made (a slow file system, a large in-memory copy): SIGINT arrives
# during a set-up phase that takes SETUP_SECONDS.
CTRL_C_DURING_SET_UP = """
import os, signal, sys, time
import train

def slow_loaders(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)

train.get_data_loader_distributed = slow_loaders
train.main(sys.argv[1:])
"""


@pytest.mark.slow
def test_ctrl_c_during_set_up_prints_one_line_and_writes_nothing(data_files, tmp_path):
    result = subprocess.run([sys.executable, "-c", CTRL_C_DURING_SET_UP, "--config=test", f"--expdir={tmp_path}",
                             f"--train_path={data_files['train']}", f"--val_path={data_files['valid']}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=25)  # not after the 30 s
    assert result.returncode == 128 + signal.SIGINT, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == "Interrupted (Ctrl-C).", result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert not os.listdir(tmp_path)
