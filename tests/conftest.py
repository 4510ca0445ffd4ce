"""Shared fixtures: small real HDF5 data sets made by the project's own generator, and the test Slurm cluster."""
import importlib.util
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import torch

from utils.generate_data import generate_box, write_h5

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLURM_CLUSTER = os.path.join(ROOT, "tests", "slurm", "cluster.sh")


# A test's limit on a subprocess, a batch job or a worker catches a hang, never a slow machine: on the
# project's 2-core machine, loaded by other work, the demo (about 55 s idle) once took over 5 minutes and
# was killed by its 300-s limit. Each call names a limit its work keeps on an idle machine; the test waits
# TIMEOUT_FACTOR times that, so a loaded machine makes the suite slower, not red. TEST_TIMEOUT_FACTOR sets
# the factor (a larger one for a machine busier still). A train.py run may also take TIMEOUT_FACTOR times
# the training time it estimates for itself (run_with_estimate). Limits that a test checks (a run must end
# before its 30-s step, a tool's own timeout) are not hang limits and stay as they are.
TIMEOUT_FACTOR = float(os.environ.get("TEST_TIMEOUT_FACTOR", "4"))


def timeout_for(idle_seconds):
    """How long to wait for work that ends within ``idle_seconds`` on an idle machine: TIMEOUT_FACTOR times it."""
    return idle_seconds * TIMEOUT_FACTOR


# A train.py run on a CPU times its own training step before it trains and logs how long it will take
# (utils/estimate.py): on a loaded machine the estimate grows with the load.
# PyTorch's and oneDNN's CPU kernels capped at AVX2 (each reads its cap when it first runs, so these go to a new
# process): any x86-64 CPU then computes 16-bit arithmetic as one without native support for it does, in PyTorch's
# generic reference code (utils/conv3d.py's emulated_on_cpu).
AS_AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
x86_only = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="AVX2 is an x86-64 instruction set")



def pytest_report_header(config):
    """The CPU the suite runs on, in its header: the suite's time and its 16-bit tests' depend on its kind."""
    from utils.conv3d import cpu_capability, emulated_on_cpu
    from utils.estimate import cpu_model
    sixteen = "emulated (no native bf16)" if emulated_on_cpu("bf16") else "native"
    return f"CPU: {cpu_model()}, {cpu_capability()}; bf16 convolutions {sixteen}"


CPU_ESTIMATE = re.compile(r"would train for about ([\d.]+) (s|min|hours|days) on this CPU")
SECONDS_PER = {"s": 1, "min": 60, "hours": 3600, "days": 86400}


def estimated_seconds(log):
    """The training time a train.py run estimated for itself on this CPU, from its log; None if it has not said."""
    match = CPU_ESTIMATE.search(log)
    return float(match.group(1)) * SECONDS_PER[match.group(2)] if match else None


def dali_installed():
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except ModuleNotFoundError:  # no nvidia namespace at all
        return False


# CI installs DALI (test_data_loader_dali.py fails there without it); elsewhere its tests skip.
needs_dali = pytest.mark.skipif(not dali_installed(), reason="needs nvidia-dali (requirements-dali.txt)")


def needs_cuda(reason="needs a CUDA device"):
    """Mark a GPU-only test: skipped without CUDA, and selected by ``-m gpu`` (benchmarks/suite/gpu_suite.sh)."""
    def mark(test):
        return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason=reason)(test))
    return mark


def shared_folder(*parts):
    """``shared/<parts>`` beside the repository's clone (CI's layout) or beside the folder holding it, whichever
    exists (the first if neither does)."""
    candidates = [os.path.join(ROOT, *[".."] * up, "shared", *parts) for up in (1, 2)]
    return os.path.normpath(next((path for path in candidates if os.path.exists(path)), candidates[0]))


def free_port():
    """A TCP port free on this machine now (the system's pick), for a process group's or a daemon's port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unavailable(reason):
    """Skip, or fail under CI (where a skipped Slurm test would hide a broken batch script)."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is an error, not a skip)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A running two-node Slurm cluster (tests/slurm/cluster.sh); yields the environment for its client
    commands. For tests/test_slurm.py and the container jobs of tests/test_docker.py."""
    if os.geteuid() != 0:
        unavailable("the test cluster needs root (slurmctld and slurmd run as root)")
    if not all(shutil.which(tool) for tool in ("slurmctld", "munged", "ip", "nsenter", "unshare")):
        result = subprocess.run([SLURM_CLUSTER, "install"], capture_output=True, text=True, timeout=timeout_for(900))
        if result.returncode != 0:
            unavailable(f"could not install slurm-wlm, munge and iproute2:\n{result.stdout[-2000:]}"
                        f"{result.stderr[-2000:]}")
    state = tmp_path_factory.mktemp("slurm")
    # Names and a subnet of this session's own, so that a cluster someone else runs here is left alone.
    # (Set after the caller's SLURM_ variables are dropped, so that the name survives; 10.213.0 is the default's.)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    env.update(SLURMCTLD_PORT=str(free_port()), SLURMD_PORT=str(free_port()),
               SLURM_CLUSTER_NAME=f"t{os.getpid() % 10**5}", SUBNET=f"10.213.{1 + os.getpid() % 250}")
    started = subprocess.run([SLURM_CLUSTER, "start", str(state), "2"], env=env, capture_output=True, text=True,
                             timeout=timeout_for(180))
    try:
        assert started.returncode == 0, f"the test cluster did not start:\n{started.stdout}{started.stderr}"
        yield {**env, "SLURM_CONF": str(state / "slurm.conf")}
    finally:
        subprocess.run([SLURM_CLUSTER, "stop", str(state)], env=env, timeout=timeout_for(180))


@pytest.fixture(scope="session")
def data_files(tmp_path_factory):
    """Train (side 48) and validation (side 32) files in the real layout; different box sides on purpose."""
    directory = tmp_path_factory.mktemp("data")
    paths = {}
    for name, side, seed in (("train", 48, 1), ("valid", 32, 2)):
        nbody, hydro = generate_box(side, seed)
        paths[name] = str(directory / f"{name}.h5")
        write_h5(paths[name], nbody, hydro, {"seed": seed})
    return paths


@pytest.fixture
def synthetic_data_dir(tmp_path, data_files):
    """A folder holding data_files under the synthetic data set's names, as the benchmark tools expect."""
    directory = tmp_path / "data"
    directory.mkdir()
    for name in ("train", "valid"):
        (directory / f"synthetic_{name}.h5").symlink_to(data_files[name])
    return directory


def run_with_estimate(command, timeout, **options):
    """``subprocess.run(command, capture_output=True, text=True, timeout=...)`` for a train.py run: it may take
    ``timeout``, or TIMEOUT_FACTOR times the training time it estimates for itself on this CPU, if longer."""
    # Appending files: the run writes at their end while this process reads them from the start.
    with tempfile.TemporaryFile("a+") as stdout, tempfile.TemporaryFile("a+") as stderr:
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, text=True, **options)
        started, limit, estimate = time.monotonic(), timeout, None
        while process.poll() is None:
            if estimate is None:
                stdout.seek(0)
                estimate = estimated_seconds(stdout.read())
                limit = max(timeout, TIMEOUT_FACTOR * (estimate or 0))
            if time.monotonic() - started > limit:
                process.kill()
                process.wait()
                stdout.seek(0), stderr.seek(0)
                raise subprocess.TimeoutExpired(command, limit, stdout.read(), stderr.read())
            time.sleep(0.2)
        stdout.seek(0), stderr.seek(0)
        return subprocess.CompletedProcess(command, process.returncode, stdout.read(), stderr.read())


def run_train(args, cwd=ROOT, timeout=timeout_for(300), env=None, check=True):
    """Run ``python train.py ARGS`` in a subprocess (as :func:`run_with_estimate`); return the CompletedProcess."""
    result = run_with_estimate([sys.executable, os.path.join(ROOT, "train.py"), *args], timeout, cwd=cwd, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"train.py {' '.join(args)} failed ({result.returncode}):\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def snapshot(directory):
    """Every file under ``directory`` with its content and mtime, to prove that nothing changed."""
    files = {}
    for parent, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(parent, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, directory)] = (f.read(), os.stat(path).st_mtime_ns)
    return files


# Runs train.main with the function TARGET ("module:name", default "train:train_step", the training step;
# e.g. "utils.checkpoint:full_state_dicts" or "utils.data_loader:RandomCropDataset.__getitem__") wrapped: a
# deterministic stand-in for what may happen anywhere. At its call number
# - SIGNAL_AT, it sends its own process the signal SIGNAL (default SIGUSR1, the batch system's time-limit
#   warning), prints "signal sent" and then, with STEP_SECONDS set, takes that long;
# - FAIL_AT, it writes the size and sha256 of every file under RUN_DIR (none if there is no such folder yet) to
#   the JSON file BEFORE, then raises the exception that the Python expression ERROR makes (with torch imported;
#   an expression that raises, e.g. a petabyte asked of the GPU, raises its own error).
DURING_CALL = """
import hashlib, importlib, json, os, signal, sys, time
import torch
import train

def file_digests(run_dir):
    files = {}
    for parent, _, names in os.walk(run_dir):
        for name in names:
            content = open(os.path.join(parent, name), "rb").read()
            files[os.path.relpath(os.path.join(parent, name), run_dir)] = [len(content), hashlib.sha256(content).hexdigest()]
    return files

module, _, name = os.environ.get("TARGET", "train:train_step").partition(":")
owner = importlib.import_module(module)
*path, attribute = name.split(".")
for part in path:
    owner = getattr(owner, part)
original, calls = getattr(owner, attribute), [0]

def during_call(*args, **kwargs):
    calls[0] += 1
    if calls[0] == int(os.environ.get("SIGNAL_AT", 0)):
        os.kill(os.getpid(), getattr(signal, os.environ.get("SIGNAL", "SIGUSR1")))
        print("signal sent", flush=True)
        time.sleep(float(os.environ.get("STEP_SECONDS", 0)))
    if calls[0] == int(os.environ.get("FAIL_AT", 0)):
        json.dump(file_digests(os.environ["RUN_DIR"]), open(os.environ["BEFORE"], "w"))
        raise eval(os.environ["ERROR"])
    return original(*args, **kwargs)

setattr(owner, attribute, during_call)
train.main(sys.argv[1:])
"""
SIGNAL_DURING_STEP = DURING_CALL  # with SIGNAL_AT: a signal during that training step
