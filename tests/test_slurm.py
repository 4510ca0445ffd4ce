"""submit_pm.sh under a real Slurm: a one-node cluster on this machine, no mocks.

The session fixture installs Debian's slurm-wlm and munge if needed (as root), starts munged (unless
it runs already), slurmctld and slurmd with a fresh state directory (tests/slurm/cluster.sh), and
stops what it started at the end. Every job submits the unchanged ./submit_pm.sh with sbatch; only
sbatch flags (which override the script's Perlmutter #SBATCH lines) and environment variables
differ from Perlmutter:

    sbatch -n 2 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 --constraint= ./submit_pm.sh ...
    with CONTAINER=none DATA_DIR=... TRAIN_FILE=... VAL_FILE=... LOG_DIR=... MASTER_PORT=<free port>

Without root and without Slurm the module is skipped, except under CI (the CI variable set), where
that is an error: CI must never skip these tests silently.
"""
import math
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow

CLUSTER = os.path.join(ROOT, "tests", "slurm", "cluster.sh")
SUBMIT = os.path.join(ROOT, "submit_pm.sh")
# What makes the Perlmutter directives fit a node without GPUs and with 2 CPUs.
NEUTRAL = ["--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=0", "--constraint="]
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                "DEADLINE", "PREEMPTED"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unavailable(reason):
    """Skip, or fail under CI (where a skipped Slurm test would hide a broken batch script)."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is an error, not a skip)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A running one-node cluster; yields the environment for its client commands."""
    if os.geteuid() != 0:
        unavailable("the test cluster needs root (slurmctld and slurmd run as root)")
    if not shutil.which("slurmctld"):
        result = subprocess.run([CLUSTER, "install"], capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            unavailable(f"could not install slurm-wlm and munge:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    state = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "SLURMCTLD_PORT": str(free_port()), "SLURMD_PORT": str(free_port())}
    env = {k: v for k, v in env.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    started = subprocess.run([CLUSTER, "start", str(state)], env=env, capture_output=True, text=True,
                             timeout=180)
    try:
        assert started.returncode == 0, f"the test cluster did not start:\n{started.stdout}{started.stderr}"
        yield {**env, "SLURM_CONF": str(state / "slurm.conf")}
    finally:
        subprocess.run([CLUSTER, "stop", str(state)], env=env, timeout=180)


@pytest.fixture
def data_dir(data_files):
    """The directory of conftest's small train/valid files (train.h5 and valid.h5)."""
    directory = os.path.dirname(data_files["train"])
    return {"DATA_DIR": directory, "TRAIN_FILE": os.path.basename(data_files["train"]),
            "VAL_FILE": os.path.basename(data_files["valid"])}


class Job:
    """One submission of submit_pm.sh: its id, output file and run directories."""

    def __init__(self, slurm, tmp_path, flags, args, **env):
        self.log_dir = tmp_path / "logs"
        self.env = {**slurm, "CONTAINER": "none", "LOG_DIR": str(self.log_dir), "MASTER_PORT": str(free_port()),
                    **env}
        result = subprocess.run(["sbatch", "--parsable", "-o", str(tmp_path / "%x-%j.out"), *flags, SUBMIT, *args],
                                cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"sbatch failed: {result.stderr}"
        self.id = result.stdout.strip().split(";")[0]
        self.out = tmp_path / f"unet-{self.id}.out"

    def scontrol(self, *args):
        return subprocess.run(["scontrol", *args], env=self.env, capture_output=True, text=True, timeout=30)

    def info(self):
        """Fields of `scontrol show job` (JobState, Restarts, ExitCode, ...)."""
        text = self.scontrol("show", "job", "-o", self.id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def output(self):
        return self.out.read_text() if self.out.exists() else "(no output file yet)"

    def wait(self, timeout, until=None):
        """Poll until the job has ended (or ``until(info)`` holds); return the last info."""
        deadline = time.time() + timeout
        while True:
            info = self.info()
            if until(info) if until else info.get("JobState") in FINAL_STATES:
                return info
            if time.time() > deadline:
                subprocess.run(["scancel", self.id], env=self.env, timeout=30)
                pytest.fail(f"job {self.id} not done after {timeout} s ({info.get('JobState')}, "
                            f"{info.get('Reason')}); its output:\n{self.output()[-6000:]}")
            time.sleep(0.5)

    def run_dir(self, run_num=None, config="test", ranks=2):
        return self.log_dir / config / f"{ranks}CPU" / (run_num or self.id)


def assert_completed(job, info):
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), job.output()[-6000:]


def test_two_gloo_ranks_train_under_sbatch(slurm, data_dir, tmp_path):
    job = Job(slurm, tmp_path, ["-n", "2", *NEUTRAL], ["--config=test", "--device=cpu"], **data_dir)
    info = job.wait(timeout=240)
    assert_completed(job, info)
    output = job.output()
    run_dir = job.run_dir()  # no --run_num: the run is named after the job id
    assert f"MASTER_ADDR={socket.gethostname().split('.')[0]}:" in output
    assert re.search(rf"Device: cpu; 2 rank\(s\);.* run directory {re.escape(str(run_dir))}", output), output[-6000:]
    for epoch in (1, 2):
        assert re.search(rf"Time taken for epoch {epoch} is [\d.]+ sec", output), output[-3000:]
    assert "Done. TensorBoard logs:" in output
    log = (run_dir / "out.log").read_text()
    assert "Time taken for epoch 2" in log and "Avg val loss=" in log
    assert "world_size: 2" in (run_dir / "config.yaml").read_text()
    assert list((run_dir / "logs").glob("events.out.tfevents.*")), "no TensorBoard event file"
    assert "Traceback" not in output


def test_arguments_reach_train_py_intact(slurm, data_dir, tmp_path):
    marker = os.path.join(ROOT, "pwned")  # where `touch pwned` would land: the job runs in the repository
    # Spaces, ;, $(...), backticks, quotes, a glob: a shell that re-parsed the arguments would split,
    # run or expand them. train.py must get this name as typed and make it the run directory.
    name = "a b;$(touch pwned)`touch pwned`'\"*?"
    args = ["--config=test", "--device=cpu", f"--run_num={name}", "--num_epochs", "1"]
    job = Job(slurm, tmp_path, ["-n", "2", *NEUTRAL], args, **data_dir)
    try:
        assert_completed(job, job.wait(timeout=240))
        assert not os.path.exists(marker), "an argument was executed by a shell"
    finally:
        if os.path.exists(marker):
            os.remove(marker)
    run_dir = job.run_dir(run_num=name)
    assert run_dir.is_dir(), f"no run directory named {name!r}: {list((tmp_path / 'logs' / 'test' / '2CPU').iterdir())}"
    log = (run_dir / "out.log").read_text()
    assert "Time taken for epoch 1" in log and "Time taken for epoch 2" not in log  # "--num_epochs", "1"
    assert not job.run_dir().exists(), "--run_num given: the job id must not name the run"


def test_time_limit_checkpoints_requeues_and_resumes(slurm, data_dir, tmp_path):
    """The time-limit warning (the script's own #SBATCH --signal=B:USR1@N) stops, requeues, resumes.

    Slurm checks time limits every 30 s and sends the warning at the first check after
    (end - N - 30 s). So the job starts with a long limit; once the first epoch's checkpoint exists
    (training is under way) the test shortens the limit to N rounded up to whole minutes, which
    makes the next check send the warning. After the requeue it restores the long limit, so the
    resumed run is not warned again.
    """
    lead = int(re.search(r"^#SBATCH --signal=B:USR1@(\d+)$", Path(SUBMIT).read_text(), re.M).group(1))
    assert lead >= 60, "the warning must leave time to checkpoint and requeue"
    # 20 epochs of ~4 s on this project's 2-core machine (one thread per rank): the warning, at most
    # ~30 s after the first epoch, comes mid-run even on a CPU twice as fast.
    args = ["--config=test", "--device=cpu", "--Nsamples=256", "--num_epochs=20", "--base_channels=8",
            "--global_batch_size=8", "--val_metrics=false"]
    job = Job(slurm, tmp_path, ["-n", "2", *NEUTRAL, "--time=10"], args, **data_dir)
    run_dir = job.run_dir()

    job.wait(timeout=180, until=lambda info: (run_dir / "checkpoint.pt").exists()
             or info.get("JobState") in FINAL_STATES)
    assert job.info()["JobState"] == "RUNNING", job.output()[-6000:]
    assert job.scontrol("update", f"JobId={job.id}", f"TimeLimit={math.ceil(lead / 60)}").returncode == 0

    info = job.wait(timeout=180, until=lambda info: info.get("Restarts") == "1"
                    or info.get("JobState") in FINAL_STATES)
    assert info["Restarts"] == "1", (f"not requeued ({info['JobState']}); if training ended before the warning, "
                                     f"this CPU is fast: raise --Nsamples here.\n{job.output()[-6000:]}")
    assert job.scontrol("update", f"JobId={job.id}", "TimeLimit=10").returncode == 0

    info = job.wait(timeout=240)
    assert_completed(job, info)
    assert info["Restarts"] == "1"
    output = job.output()  # both attempts: the script appends (--open-mode=append)
    for expected in ("submit_pm.sh: received SIGUSR1", "Received SIGUSR1",
                     "requeueing job", f"restart 1 of job {job.id}", "--resume", "Done. TensorBoard logs:"):
        assert expected in output, (expected, output[-6000:])
    log = (run_dir / "out.log").read_text()
    assert re.search(r"Stopped at step \d+ \(epoch \d+\) with a checkpoint", log), log[-3000:]
    assert re.search(r"Resumed from .*checkpoint\.pt at epoch \d+, step \d+\.", log), log[-3000:]
    assert "Time taken for epoch 20 is" in log
    assert "Traceback" not in output


def test_run_outside_slurm_prints_usage(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = subprocess.run(["bash", SUBMIT, "--config=test"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode != 0
    assert "not running under Slurm" in result.stderr and "sbatch -n 4 ./submit_pm.sh" in result.stderr
    assert "CONTAINER" in result.stderr and "DATA_DIR" in result.stderr  # the usage text


@pytest.mark.parametrize("env, message", [
    ({"CONTAINER": "docker"}, "unknown container runtime CONTAINER='docker'"),
    ({"DATA_DIR": "/nonexistent/data"}, "the data directory DATA_DIR=/nonexistent/data does not exist"),
    ({"TRAIN_FILE": "missing.h5"}, "holds no missing.h5"),
    ({"ENABLE_PROFILING": "1", "PATH": "/usr/bin:/bin"}, "nsys (NVIDIA Nsight Systems) is not on PATH"),
], ids=["container", "data_dir", "train_file", "nsys"])
def test_bad_input_stops_before_any_rank(slurm, data_dir, tmp_path, env, message):
    if "PATH" in env and shutil.which("nsys", path=env["PATH"]):
        pytest.skip("nsys is installed here")
    job = Job(slurm, tmp_path, ["-n", "1", *NEUTRAL], ["--config=test", "--device=cpu"], **{**data_dir, **env})
    info = job.wait(timeout=120)
    output = job.output()
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "2:0"), output
    assert "submit_pm.sh: error: " in output and message in output, output
    assert "running: srun" not in output and "Configuration" not in output  # no rank started
