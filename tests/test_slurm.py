"""submit_pm.sh under a real Slurm: a two-node cluster on this machine, no mocks.

The session fixture installs Debian's slurm-wlm, munge and iproute2 if needed (as root), starts munged
(unless it runs already), slurmctld, and two slurmd, each node in a network namespace of its own with
its own hostname and address (tests/slurm/cluster.sh), and stops what it started at the end. Every job
submits the unchanged ./submit_pm.sh with sbatch; only sbatch flags (which override the script's
Perlmutter #SBATCH lines) and environment variables differ from Perlmutter:

    sbatch -n 2 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 --constraint= ./submit_pm.sh ...
    sbatch -N 2 --ntasks-per-node=1 --cpus-per-task=1 --gpus-per-node=0 --constraint= ./submit_pm.sh ...
    with CONTAINER=none DATA_DIR=... TRAIN_FILE=... VAL_FILE=... LOG_DIR=... MASTER_PORT=<free port>

Without root and without Slurm the module is skipped, except under CI (the CI variable set), where
that is an error: CI must never skip these tests silently.
"""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import ROOT, free_port, timeout_for
from readme_commands import tutorial_text

pytestmark = pytest.mark.slow

SUBMIT = os.path.join(ROOT, "submit_pm.sh")
# What makes the Perlmutter directives fit a node without GPUs and with 2 CPUs.
NEUTRAL = ["--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=0", "--constraint="]
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                "DEADLINE", "PREEMPTED"}


@pytest.fixture
def data_dir(data_files):
    """The directory of conftest's small train/valid files (train.h5 and valid.h5)."""
    directory = os.path.dirname(data_files["train"])
    return {"DATA_DIR": directory, "TRAIN_FILE": os.path.basename(data_files["train"]),
            "VAL_FILE": os.path.basename(data_files["valid"])}


class Job:
    """One submission of submit_pm.sh: its id, output file and run directories."""

    def __init__(self, slurm, tmp_path, flags, args, **env):
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.log_dir = tmp_path / "logs"
        self.env = {**slurm, "CONTAINER": "none", "LOG_DIR": str(self.log_dir), "MASTER_PORT": str(free_port()),
                    **env}
        result = subprocess.run(["sbatch", "--parsable", "-o", str(tmp_path / "%x-%j.out"), *flags, SUBMIT, *args],
                                cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout_for(60))
        assert result.returncode == 0, f"sbatch failed: {result.stderr}"
        self.id = result.stdout.strip().split(";")[0]
        self.out = tmp_path / f"unet-{self.id}.out"

    def scontrol(self, *args):
        return subprocess.run(["scontrol", *args], env=self.env, capture_output=True, text=True, timeout=timeout_for(30))

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
                subprocess.run(["scancel", self.id], env=self.env, timeout=timeout_for(30))
                pytest.fail(f"job {self.id} not done after {timeout} s ({info.get('JobState')}, "
                            f"{info.get('Reason')}); its output:\n{self.output()[-6000:]}")
            time.sleep(0.5)

    def run_dir(self, run_num=None, config="test", ranks=2):
        return self.log_dir / config / f"{ranks}CPU" / (run_num or self.id)


def ranks_on(output):
    """(rank, local rank, hostname) of each rank, from submit_pm.sh's line per task."""
    return sorted(re.findall(r"submit_pm\.sh: rank (\d+) \(local rank (\d+)\) of \d+ on (\S+)", output))


def scalars(run_dir, tag):
    events = EventAccumulator(str(run_dir / "logs"), size_guidance={"scalars": 0})
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def assert_completed(job, info):
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), job.output()[-6000:]


def test_two_gloo_ranks_train_under_sbatch(slurm, data_dir, tmp_path):
    job = Job(slurm, tmp_path, ["-n", "2", *NEUTRAL], ["--config=test", "--device=cpu"], **data_dir)
    info = job.wait(timeout=timeout_for(240))
    assert_completed(job, info)
    output = job.output()
    run_dir = job.run_dir()  # no --run_num: the run is named after the job id
    node = re.search(r"MASTER_ADDR=(node\d):", output).group(1)  # one node: both ranks there
    assert ranks_on(output) == [("0", "0", node), ("1", "1", node)]
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
        assert_completed(job, job.wait(timeout=timeout_for(240)))
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

    job.wait(timeout=timeout_for(180), until=lambda info: (run_dir / "checkpoint.pt").exists()
             or info.get("JobState") in FINAL_STATES)
    assert job.info()["JobState"] == "RUNNING", job.output()[-6000:]
    assert job.scontrol("update", f"JobId={job.id}", f"TimeLimit={math.ceil(lead / 60)}").returncode == 0

    info = job.wait(timeout=timeout_for(180), until=lambda info: info.get("Restarts") == "1"
                    or info.get("JobState") in FINAL_STATES)
    assert info["Restarts"] == "1", (f"not requeued ({info['JobState']}); if training ended before the warning, "
                                     f"this CPU is fast: raise --Nsamples here.\n{job.output()[-6000:]}")
    assert job.scontrol("update", f"JobId={job.id}", "TimeLimit=10").returncode == 0

    info = job.wait(timeout=timeout_for(240))
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
                            text=True, timeout=timeout_for(30))
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
    info = job.wait(timeout=timeout_for(120))
    output = job.output()
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "2:0"), output
    assert "submit_pm.sh: error: " in output and message in output, output
    assert "running: srun" not in output and "Configuration" not in output  # no rank started


# ----------------------------------------------------------------------------- two nodes

TWO_NODES = ["-N", "2", "--ntasks-per-node=1", "--cpus-per-task=1", "--gpus-per-node=0", "--constraint="]
ONE_NODE = ["-N", "1", "-n", "2", *NEUTRAL]
# Long enough (about 4 s an epoch here) for a signal or a kill to land in the middle of training.
LONG_RUN = ["--config=test", "--device=cpu", "--Nsamples=256", "--num_epochs=6", "--base_channels=8",
            "--global_batch_size=8", "--val_metrics=false"]


def when_checkpointed(job, run_dir, timeout=timeout_for(180)):
    """Wait until the run's first checkpoint exists (training is under way); fail if the job ended first."""
    job.wait(timeout=timeout, until=lambda info: (run_dir / "checkpoint.pt").exists()
             or info.get("JobState") in FINAL_STATES)
    assert job.info()["JobState"] == "RUNNING", job.output()[-6000:]


def test_two_nodes_train_as_one_node_does(slurm, data_dir, tmp_path):
    """Rank 0 on node1, rank 1 on node2, the rendezvous on node1: the same losses as two ranks on one node."""
    readme = tutorial_text(ROOT)  # README.md and its chapters in docs/
    assert f"sbatch {' '.join(TWO_NODES)} ./submit_pm.sh --config=test --device=cpu" in readme  # what it says is tested
    args = ["--config=test", "--device=cpu", "--Nsamples=32", "--num_epochs=2"]
    two = Job(slurm, tmp_path / "two", TWO_NODES, args, **data_dir)
    one = Job(slurm, tmp_path / "one", ONE_NODE, args, **data_dir)
    for job in (two, one):
        assert_completed(job, job.wait(timeout=timeout_for(240)))
    output = two.output()
    assert "2 rank(s) on node[1-2], MASTER_ADDR=node1:" in output
    assert ranks_on(output) == [("0", "0", "node1"), ("1", "0", "node2")]  # LOCAL_RANK 0 on each node
    assert len(set(host for *_, host in ranks_on(one.output()))) == 1
    for tag in ("Loss/train", "Loss/valid"):
        (steps, losses), (same_steps, same_losses) = (zip(*scalars(job.run_dir(), tag)) for job in (two, one))
        assert steps == same_steps == (0, 8, 16) and losses == pytest.approx(same_losses, rel=1e-6), tag
    assert "Traceback" not in output


# Domain parallelism on the smallest crop that the test config's U-Net (five halvings) accepts split in two
# along depth: 64^3, a 32 x 64 x 64 block per rank. Synthetic crops: the same numbers however they are split.
DOMAIN_RUN = ["--config=test", "--device=cpu", "--data_loader_config=synthetic", "--crop_size=64"]
ONE_RANK = ["-N", "1", "-n", "1", *TWO_NODES[3:]]


def test_two_nodes_share_each_sample_as_one_process_trains_it(slurm, data_dir, tmp_path):
    """--domain_mesh=[2,1,1] with rank 0 on node1 and rank 1 on node2: each sample's crop is split along
    depth between the nodes, which exchange halos over their network at every convolution. Every scalar
    and the weights are those of one undivided process (a one-rank job) with the same global batch of 4."""
    readme = tutorial_text(ROOT)
    assert f"sbatch {' '.join(TWO_NODES)} ./submit_pm.sh {' '.join(DOMAIN_RUN)} \"--domain_mesh=[2,1,1]\"" in readme
    two = Job(slurm, tmp_path / "two", TWO_NODES, [*DOMAIN_RUN, "--domain_mesh=[2,1,1]"], **data_dir)
    one = Job(slurm, tmp_path / "one", ONE_RANK, DOMAIN_RUN, **data_dir)
    for job in (two, one):
        assert_completed(job, job.wait(timeout=timeout_for(240)))
    output = two.output()
    assert ranks_on(output) == [("0", "0", "node1"), ("1", "0", "node2")]
    assert "Domain parallel: mesh [2, 1, 1], 1 data-parallel group(s) of 2 ranks; rank 0 holds block [0, 0, 0]" \
        in output, output[-6000:]
    assert "Device: cpu; 2 rank(s); local batch 4;" in output  # the domain group draws the one process's samples
    assert "Device: cpu; 1 rank(s); local batch 4;" in one.output() and "Domain parallel" not in one.output()
    runs = (two.run_dir(), one.run_dir(ranks=1))
    events = EventAccumulator(str(runs[1] / "logs"))
    events.Reload()
    tags = [tag for tag in events.Tags()["scalars"] if not tag.startswith(("Memory/", "Step spread/")) and tag != "Avg iters per sec"]
    assert {"Loss/train", "Loss/valid", "Learning Rate", "Metrics/corr_gas_density"} <= set(tags), tags
    for tag in tags:
        (steps, values), (same_steps, same_values) = (zip(*scalars(run_dir, tag)) for run_dir in runs)
        assert steps == same_steps, tag
        # Measured: the losses agree to 1.5e-7 (relative), the metrics to 1.8e-5 (absolute; correlations of
        # random fields are near 0, where float32 rounding shows as absolute differences).
        tolerance = {"abs": 1e-4} if tag.startswith("Metrics/") else {"rel": 1e-6}
        assert values == pytest.approx(same_values, **tolerance), tag
    assert scalars(runs[0], "Loss/valid")[-1][0] == 8  # two epochs of 16 samples in batches of 4
    a, b = (torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True) for run_dir in runs)
    assert a["position"] == b["position"]
    # The split sums each convolution's gradient in another order: after one step every layer's gradient
    # agrees to 6e-6 of its largest element (measured). Adam moves a weight by about the learning rate
    # (2e-3 at most here) whatever its gradient's size, and the gradients of random data are near 0, so that
    # rounding flips some of its steps: after the 8 steps, 1.7% of the weights differ by more than 1e-5,
    # the largest by 2.1e-4 (measured; the two-node run is bit for bit torchrun's [2,1,1] run on one
    # machine). The losses of random data hardly move, so they alone would miss a wrong gradient: with the
    # halos' gradients dropped (measured) they still agree to 3e-7, but 27% of the weights differ by more
    # than 1e-5, the largest by 7.6e-3.
    differences = torch.cat([(a["model"][name] - weight).abs().flatten() for name, weight in b["model"].items()])
    assert differences.max() < 1e-3 and (differences > 1e-5).float().mean() < 0.05, float(differences.max())
    assert "Traceback" not in output


def test_two_nodes_stop_requeue_and_resume_to_the_same_result(slurm, data_dir, tmp_path):
    """The time-limit warning (what --signal=B:USR1@180 sends: SIGUSR1 to the batch shell), sent while
    both nodes train: checkpoint, requeue, and a resumed run on two nodes that ends as an uninterrupted one."""
    whole = Job(slurm, tmp_path / "whole", TWO_NODES, LONG_RUN, **data_dir)
    cut = Job(slurm, tmp_path / "cut", TWO_NODES, LONG_RUN, **data_dir)
    when_checkpointed(cut, cut.run_dir())
    warning = subprocess.run(["scancel", "--signal=USR1", "--batch", cut.id], env=cut.env, capture_output=True,
                             text=True, timeout=timeout_for(30))
    assert warning.returncode == 0, warning.stderr
    info = cut.wait(timeout=timeout_for(240))
    assert_completed(cut, info)
    assert info["Restarts"] == "1", cut.output()[-6000:]
    output = cut.output()  # both attempts
    for expected in ("submit_pm.sh: received SIGUSR1", "requeueing job", f"restart 1 of job {cut.id}", "--resume"):
        assert expected in output, (expected, output[-6000:])
    assert ranks_on(output) == [("0", "0", "node1"), ("0", "0", "node1"), ("1", "0", "node2"), ("1", "0", "node2")]
    log = (cut.run_dir() / "out.log").read_text()
    assert re.search(r"Stopped at step \d+ \(epoch \d+\) with a checkpoint", log), log[-3000:]
    assert re.search(r"Resumed from .*checkpoint\.pt at epoch \d+, step \d+\.", log), log[-3000:]
    assert_completed(whole, whole.wait(timeout=timeout_for(240)))
    (step, final), (same_step, same_final) = (scalars(job.run_dir(), "Loss/valid")[-1] for job in (cut, whole))
    assert step == same_step == 6 * 32 and final == pytest.approx(same_final, rel=1e-5, abs=1e-7)


def test_two_nodes_a_killed_rank_ends_the_job_instead_of_hanging_it(slurm, data_dir, tmp_path):
    """SIGKILL to rank 1 on node2 (a crashed node): rank 0 on node1 stops within the process-group
    timeout with one paragraph, the job FAILS, and the last checkpoint is whole."""
    job = Job(slurm, tmp_path, TWO_NODES, [*LONG_RUN, "--dist_timeout_s=60"], **data_dir)
    when_checkpointed(job, job.run_dir())
    [pid] = [pid for pid, rank in rank_processes(job.id) if rank == "1"]
    os.kill(int(pid), signal.SIGKILL)
    killed = time.time()
    info = job.wait(timeout=timeout_for(120))
    assert time.time() - killed < 60 + 30  # the timeout, and Slurm's time to notice the job's end
    output = job.output()
    assert info["JobState"] == "FAILED", output[-6000:]
    assert "error: Rank 0 of 2 stopped because a collective operation with the other ranks failed" in output, \
        output[-6000:]
    position = torch.load(job.run_dir() / "checkpoint.pt", weights_only=True)["position"]
    assert position["epoch"] >= 1 and position["step"] > 0


def rank_processes(job_id):
    """(pid, RANK) of the python processes training for Slurm job ``job_id`` (all nodes share this machine)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = open(f"/proc/{entry}/environ", "rb").read().decode(errors="replace")
            environ = dict(item.split("=", 1) for item in text.split("\0") if "=" in item)
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if environ.get("SLURM_JOB_ID") == job_id and b"train.py" in cmdline and "RANK" in environ:
            found.append((entry, environ["RANK"]))
    return found


def test_the_allreduce_sweep_between_two_nodes(slurm, tmp_path):
    """tests/slurm/allreduce.sh with a task on each node: gloo over the nodes' network, the profile written."""
    out = tmp_path / "two-nodes.json"
    env = {**slurm, "MASTER_PORT": str(free_port()), "PYTHON": sys.executable}
    result = subprocess.run(["sbatch", "--parsable", "--wait", "-o", str(tmp_path / "%x-%j.out"), *TWO_NODES,
                             os.path.join(ROOT, "tests", "slurm", "allreduce.sh"), "--min_bytes", "64K",
                             "--max_bytes", "1M", "--iters", "3", "--warmup", "1", "--out", str(out)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_for(300))
    job_id = result.stdout.strip().split(";")[0]
    output = (tmp_path / f"unet-allreduce-{job_id}.out").read_text()
    assert result.returncode == 0, output[-6000:] + result.stderr
    from benchmarks import allreduce

    profile = allreduce.check_profile(json.loads(out.read_text()))
    assert (profile["backend"], profile["world_size"], profile["nodes"]) == ("gloo", 2, 2)
    assert [r["bytes"] for r in profile["rows"]] == [65536, 131072, 262144, 524288, 1048576]
    assert "gloo: 2 ranks on 2 node(s)" in output and "Traceback" not in output
