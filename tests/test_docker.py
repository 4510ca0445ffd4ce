"""docker/Dockerfile: lint-clean, built, and run, by hand and through submit_pm.sh's container path.

The image is built without a Docker engine, as CI can: as root, tests/container/image.sh installs Debian's
buildah and debootstrap if they are missing, makes a minimal Debian bookworm with python3 and pip (its
root file system is kept in /var/cache/unet3d-dl-tutorial for the next run) and builds docker/Dockerfile on
it with `buildah bud --isolation chroot --storage-driver vfs`, benchy and apex off. The build's time and
the image's size appear in the test output. In the image: `python train.py --help`, the demo for one epoch
on the synthetic data set made there, and a CPU test subset; and submit_pm.sh with CONTAINER=podman-hpc and
CONTAINER=shifter trains a job under the test Slurm (conftest's cluster), through stand-ins for those
runtimes (tests/container/runtime-standin.sh) that record their command line and run it with buildah run.
Without root these tests are skipped, except under CI (CI set), where that is an error.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from conftest import ROOT, timeout_for, unavailable
from test_slurm import NEUTRAL, Job, assert_completed, ranks_on

DOCKERFILE = os.path.join(ROOT, "docker", "Dockerfile")
IMAGE_SH = os.path.join(ROOT, "tests", "container", "image.sh")
STANDINS = os.path.join(ROOT, "tests", "container", "bin")
TAG = "localhost/unet3d-dl-tutorial:test"
# In the image, with CI set: DALI must be there, and its CPU pipelines must give what the tests expect.
CPU_SUBSET = ["tests/test_data_loader_dali.py", "tests/test_losses.py", "tests/test_yparams.py"]


def hadolint():
    beside_python = os.path.join(os.path.dirname(sys.executable), "hadolint")
    return beside_python if os.path.exists(beside_python) else shutil.which("hadolint")


@pytest.mark.skipif(hadolint() is None and not os.environ.get("CI"), reason="hadolint is not installed")
def test_dockerfile_passes_hadolint():
    result = subprocess.run([hadolint(), DOCKERFILE], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_installs_the_requirements_and_the_real_apex_and_benchy():
    text = open(DOCKERFILE).read()
    assert text.startswith("#") and "FROM ${BASE}" in text and "nvcr.io/nvidia/pytorch:" in text
    assert "requirements.txt" in text and "requirements-dali.txt" in text
    assert "github.com/romerojosh/benchy" in text and "github.com/NVIDIA/apex" in text
    assert "ARG BENCHY=1" in text and "ARG APEX=1" in text  # on unless switched off
    for line in text.splitlines():  # never the unrelated PyPI projects of those names
        assert not line.strip().startswith("RUN pip install apex") and "pip install benchy" not in line


class Image:
    """The built image, a working container made from it, and the environment that finds both."""

    def __init__(self, env, container):
        self.env, self.container = env, container

    def run(self, *command, options=(), timeout=timeout_for(900)):
        """``buildah run`` COMMAND in the working container (in the image's working directory)."""
        return subprocess.run([IMAGE_SH, "run", *options, self.container, "--", *command], env=self.env,
                              capture_output=True, text=True, timeout=timeout)


def say(request, line):
    """A line in pytest's own output, whatever its capture setting."""
    plugins = request.config.pluginmanager
    with plugins.get_plugin("capturemanager").global_and_fixture_disabled():
        reporter = plugins.get_plugin("terminalreporter")
        reporter.write_line(line) if reporter else print(line)


@pytest.fixture(scope="module")
def image(request, tmp_path_factory):
    if os.geteuid() != 0:
        unavailable("building the image needs root (debootstrap and buildah's chroot isolation)")
    installed = subprocess.run([IMAGE_SH, "install"], capture_output=True, text=True, timeout=timeout_for(900))
    if installed.returncode != 0:
        unavailable(f"could not install buildah and debootstrap:\n{installed.stdout[-2000:]}{installed.stderr[-2000:]}")
    storage = tmp_path_factory.mktemp("containers")
    env = {**os.environ, "STORAGE": str(storage), "PYTHON": sys.executable,
           "CONTAINERS_STORAGE_CONF": str(storage / "storage.conf"), "BUILDAH_ISOLATION": "chroot"}
    container = f"unet3d-dl-tutorial-test-{os.getpid()}"
    try:
        started = time.monotonic()
        built = subprocess.run([IMAGE_SH, "build", TAG], env=env, capture_output=True, text=True, timeout=timeout_for(1800))
        assert built.returncode == 0, f"the image did not build:\n{built.stdout[-6000:]}\n{built.stderr[-3000:]}"
        [summary] = [line for line in built.stdout.splitlines() if line.startswith("image.sh: built")]
        say(request, f"\n{summary} ({time.monotonic() - started:.0f} s with the base image and the torch wheel)")
        made = subprocess.run(["buildah", "from", "--name", container, "--pull-never", TAG], env=env,
                              capture_output=True, text=True, timeout=timeout_for(600))
        assert made.returncode == 0, made.stderr
        yield Image(env, container)
    finally:  # the storage holds gigabytes: leave nothing behind
        subprocess.run(["buildah", "rm", "--all"], env=env, capture_output=True, timeout=timeout_for(600))
        subprocess.run(["buildah", "rmi", "--all", "--force"], env=env, capture_output=True, timeout=timeout_for(600))
        shutil.rmtree(storage, ignore_errors=True)


@pytest.mark.slow
def test_the_image_has_the_tested_torch_and_runs_train_py_help(image):
    version = re.search(r"^ARG TORCH=torch==(\S+)$", open(DOCKERFILE).read(), re.M).group(1)
    torch = image.run("python", "-c", "import torch; print(torch.__version__)")
    assert torch.returncode == 0 and torch.stdout.strip() == f"{version}+cpu", torch.stdout + torch.stderr
    result = image.run("python", "train.py", "--help")
    assert result.returncode == 0 and result.stdout.startswith("usage: python train.py"), result.stderr


@pytest.mark.slow
def test_the_demo_trains_one_epoch_in_the_image_on_data_made_there(image):
    made = image.run("python", "-m", "utils.generate_data", "--out_dir", "data")
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    demo = image.run("python", "train.py", "--config=demo", "--num_epochs=1", "--enable_apex", "--run_num=image",
                     timeout=timeout_for(1800))
    output = demo.stdout + demo.stderr
    assert demo.returncode == 0, output[-6000:]
    # Built with APEX=0: one line says that --enable_apex falls back.
    assert output.count("NVIDIA apex is not importable: --enable_apex uses torch.optim.Adam(fused=True).") == 1
    assert re.search(r"Time taken for epoch 1 is [\d.]+ sec", output) and "DONE ---- rank 0" in output
    assert "Traceback" not in output
    listing = image.run("ls", "data", "runs/demo/1CPU/image")
    assert {"synthetic_train.h5", "synthetic_valid.h5", "out.log", "checkpoint.pt"} <= set(listing.stdout.split())


@pytest.mark.slow
def test_a_cpu_test_subset_passes_in_the_image(image):
    pytest_installed = image.run("python", "-m", "pip", "install", "--no-cache-dir", "--quiet", "pytest")
    assert pytest_installed.returncode == 0, pytest_installed.stderr[-3000:]
    result = image.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *CPU_SUBSET,
                       options=["--env", "CI=1"])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert re.search(r"\d+ passed", result.stdout) and " failed" not in result.stdout


@pytest.mark.slow
def test_benchy_and_apex_without_github_fail_the_build_with_one_message(image):
    """The default build (benchy and apex on) where github.com does not answer: the message, no traceback."""
    result = subprocess.run([IMAGE_SH, "build", "localhost/unet3d-dl-tutorial:no-github", "--build-arg", "BENCHY=1",
                             "--build-arg", "APEX=1", "--add-host", "github.com:127.0.0.1"],
                            env=image.env, capture_output=True, text=True, timeout=timeout_for(900))
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "\nerror: this build installs benchy and NVIDIA apex from GitHub (BENCHY=1, APEX=1), but github.com " \
           "cannot be reached from it. Build where GitHub is reachable, or without them: --build-arg BENCHY=0 " \
           "--build-arg APEX=0 " in output, output[-3000:]
    assert "Traceback" not in output and "STEP 10/" not in output  # stopped before the installs


# What each runtime is given by submit_pm.sh (container paths: /data and /logs), before the task's command.
def expected_runtime_arguments(runtime, data_dir, log_dir):
    if runtime == "shifter":
        return ["shifter", f"--image={TAG}", "--module=gpu,nccl-plugin", "-V", f"{data_dir}:/data",
                "-V", f"{log_dir}:/logs"]
    return ["podman-hpc", "run", "--rm", "--net", "host", "--ipc", "host", "--gpu", "-v", f"{data_dir}:/data",
            "-v", f"{log_dir}:/logs", "-v", f"{ROOT}:{ROOT}", "-w", ROOT]


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["podman-hpc", "shifter"])
def test_submit_pm_trains_in_the_image(runtime, image, slurm, data_files, tmp_path):
    """Two ranks on one node, each through the runtime into the image; the run lands in LOG_DIR."""
    record = tmp_path / "runtime-calls.txt"
    data_dir = os.path.dirname(data_files["train"])
    args = ["--config=test", "--device=cpu", "--num_epochs=1"]
    job = Job(slurm, tmp_path, ["-N", "1", "-n", "2", *NEUTRAL], args, CONTAINER=runtime, IMAGE=TAG,
              DATA_DIR=data_dir, TRAIN_FILE="train.h5", VAL_FILE="valid.h5",
              PATH=f"{STANDINS}:{os.environ['PATH']}", STANDIN_LOG=str(record), STANDIN_CONTAINER=image.container,
              CONTAINERS_STORAGE_CONF=image.env["CONTAINERS_STORAGE_CONF"], BUILDAH_ISOLATION="chroot")
    info = job.wait(timeout=timeout_for(900))
    output = job.output()
    assert_completed(job, info)
    assert f"container {runtime}, data {data_dir}, logs {job.log_dir}" in output
    assert output.count(f"{runtime} (stand-in): buildah run in {image.container}, made from {TAG}") == 2, output
    node = re.search(r"MASTER_ADDR=(node\d):", output).group(1)
    assert ranks_on(output) == [("0", "0", node), ("1", "1", node)]

    calls = [shlex.split(line) for line in record.read_text().splitlines()]
    assert len(calls) == 2 and calls[0] == calls[1], calls  # one per rank, the same
    prefix = expected_runtime_arguments(runtime, data_dir, job.log_dir)
    call = calls[0]
    assert call[:len(prefix)] == prefix, call
    if runtime == "podman-hpc":  # podman passes no environment unless named
        names = call[len(prefix):call.index(TAG)]
        assert names[::2] == ["-e"] * (len(names) // 2)
        assert {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT"} <= set(names[1::2])
        prefix = call[:call.index(TAG) + 1]
    task = call[len(prefix):]
    assert task[:2] == ["bash", "-c"] and task[3:] == [
        "submit_pm-task", "python", "train.py", "--expdir=/logs", "--train_path=/data/train.h5",
        "--val_path=/data/valid.h5", f"--run_num={job.id}", *args]

    run_dir = job.run_dir()  # <LOG_DIR>/<config>/<N>CPU/<job id>, as the README says
    assert f"run directory /logs/test/2CPU/{job.id}" in output, output[-6000:]
    log = (run_dir / "out.log").read_text()
    assert "Time taken for epoch 1" in log and "world_size: 2" in (run_dir / "config.yaml").read_text()
    assert list((run_dir / "logs").glob("events.out.tfevents.*")), "no TensorBoard event file"
    assert "Traceback" not in output
