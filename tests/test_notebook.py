"""start_tensorboard.ipynb, run headless as a user would run it, and TensorBoard checked in a real browser.

A tiny training run of train.py provides the log directory. The notebook's TensorBoard must answer
on localhost and list that run; then Debian's Chromium, driven by Playwright through the code of
figures/tensorboard_screenshot.py, must find the run's ``Loss/valid`` chart drawn on the scalars page.
"""
import contextlib
import gc
import json
import os
import re
import subprocess
import sys

import pytest

if not os.environ.get("CI"):  # elsewhere, e.g. on a GPU node with only the runtime requirements, skip
    for package in ("nbformat", "nbclient", "jupyter_client"):
        pytest.importorskip(package, reason="needs the notebook packages of requirements-test.txt")

import nbformat  # noqa: E402 (after the check above)
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.utils import run_sync
from nbclient import NotebookClient

from browser import ensure_chromium
from conftest import ROOT, run_train, timeout_for
from utils.errors import UserError
from utils.tensorboard_launch import (LOGDIR_VARIABLE, default_logdir, is_running, jupyterhub_proxy_url,
                                      open_local, start_tensorboard, stop_tensorboard)
from figures.tensorboard_screenshot import group_filter, scalars_url, screenshot_scalars

pytestmark = pytest.mark.slow
NOTEBOOK = os.path.join(ROOT, "start_tensorboard.ipynb")
KERNEL_NAME = "tutorial-test-python"
RUN = "test/1CPU/nb/logs"  # the run's name in TensorBoard: its path below the log directory
HUB_PREFIX = "/user/tester/"


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A stand-in for Perlmutter's $SCRATCH."""
    return tmp_path_factory.mktemp("scratch")


@pytest.fixture(scope="module")
def logdir(data_files, scratch):
    """A log directory holding one real (tiny) training run, with its preview images: where
    submit_pm.sh writes on Perlmutter, $SCRATCH/sc22-dl-tutorial/logs."""
    expdir = scratch / "sc22-dl-tutorial" / "logs"
    run_train(["--config=test", "--preview_image", f"--train_path={data_files['train']}",
               f"--val_path={data_files['valid']}", f"--expdir={expdir}", "--run_num=nb"])
    assert (expdir / RUN).is_dir()
    return str(expdir)


@pytest.fixture(scope="module")
def kernel_specs(tmp_path_factory):
    """A kernelspec for this very Python (the project's venv), in a private directory.

    Whatever kernels the machine has registered (or not), the notebook then runs on the
    interpreter that has the project's packages.
    """
    from ipykernel.kernelspec import install

    prefix = tmp_path_factory.mktemp("jupyter")
    install(kernel_name=KERNEL_NAME, prefix=str(prefix))
    return KernelSpecManager(kernel_dirs=[str(prefix / "share" / "jupyter" / "kernels")])


@contextlib.contextmanager
def running_notebook(kernel_specs, environment, timeout=timeout_for(180)):
    """Execute the notebook from the repository root; yield everything it printed and its code cells
    with their outputs, kernel still alive.

    The kernel is shut down on leaving, after the caller has looked at what the notebook started.
    """
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    manager = AsyncKernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=kernel_specs)
    client = NotebookClient(notebook, km=manager, timeout=timeout, resources={"metadata": {"path": ROOT}})
    try:
        client.execute(env={**os.environ, **environment})
        cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
        yield "\n".join(output.get("text", "") or str(output.get("data", {}).get("text/html", ""))
                        or str(output.get("data", {}).get("text/plain", ""))
                        for cell in cells for output in cell.outputs), cells
    finally:
        if run_sync(manager.is_alive)():  # a kernel manager passed in is the caller's to shut down
            run_sync(manager.shutdown_kernel)(now=True)
        # Collect the kernel client now: left to the interpreter's exit, its destructor logs into
        # closed streams and prints a traceback after pytest's summary.
        del client, manager
        gc.collect()


def tensorboards_serving(logdir):
    """pids of the live TensorBoards serving ``logdir``, from their info files (as %tensorboard finds them)."""
    from tensorboard import manager

    return [info.pid for info in manager.get_all()
            if os.path.abspath(info.logdir) == os.path.abspath(logdir) and is_running(info.pid)]


@pytest.fixture(scope="module")
def notebook_tensorboard(logdir, scratch, kernel_specs):
    """The TensorBoard that the notebook started, as (pid, url, everything printed); stopped at teardown.

    Nothing names the log directory: with $SCRATCH set, the notebook finds the runs where submit_pm.sh
    writes them, as the original's notebook does on Perlmutter."""
    environment = {"SCRATCH": str(scratch), "JUPYTERHUB_SERVICE_PREFIX": HUB_PREFIX}
    assert LOGDIR_VARIABLE not in os.environ
    try:
        with running_notebook(kernel_specs, environment) as (printed, _):
            match = re.search(r"TensorBoard \(pid (\d+)\) serves (.+) at (http://\S+)", printed)
            assert match, printed
            assert match.group(2) == logdir
            yield int(match.group(1)), match.group(3), printed
    finally:
        for pid in tensorboards_serving(logdir):  # by pid, even if the output could not be read
            stop_tensorboard(pid)
    assert not tensorboards_serving(logdir)


def get(url):
    with open_local(url, timeout=timeout_for(30)) as response:
        return response.status, response.read()


# ----------------------------------------------------------------------------- the notebook

def test_the_notebook_starts_a_tensorboard_that_serves_the_run(notebook_tensorboard):
    pid, url, printed = notebook_tensorboard
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url)
    status, page = get(url)
    assert status == 200 and b"<html" in page.lower()
    status, runs = get(url + "data/runs")
    assert status == 200 and RUN in json.loads(runs)
    status, tags = get(url + "data/plugin/scalars/tags")
    assert "Loss/valid" in json.loads(tags)[RUN]
    port = url.rstrip("/").rsplit(":", 1)[1]
    assert f"Through JupyterHub, open: {HUB_PREFIX}proxy/{port}/" in printed
    assert f"kill {pid}" in printed


def test_a_browser_finds_the_validation_loss_chart(notebook_tensorboard, tmp_path):
    ensure_chromium()
    _, url, _ = notebook_tensorboard
    shot = tmp_path / "scalars.png"
    shown = screenshot_scalars(url, str(shot), tag="Loss/valid", run_filter="nb")  # raises unless drawn
    assert "#scalars&tagFilter=" in shown
    check_screenshot(shot)


def check_screenshot(path):
    import matplotlib.image

    image = matplotlib.image.imread(str(path))
    assert image.ndim == 3 and image.shape[1] == 1200 and image.shape[0] >= 300, image.shape
    colours = {tuple(pixel) for pixel in (image[..., :3] * 255).astype(int).reshape(-1, 3)[::7]}
    assert len(colours) > 50  # text, axes and lines, not an empty page
    orange = (image[..., 0] > 0.9) & (0.35 < image[..., 1]) & (image[..., 1] < 0.6) & (image[..., 2] < 0.15)
    assert orange.mean() > 0.02  # TensorBoard's header bar: its page, not an error page


def test_the_nersc_branch_uses_the_magic_and_the_helper(logdir, kernel_specs, tmp_path):
    # A stand-in for NERSC's helper module: it reports the port of the newest TensorBoard, which
    # only exists if the notebook's %tensorboard magic really started one.
    (tmp_path / "nersc_tensorboard_helper.py").write_text(
        "from tensorboard import manager\n\n\n"
        "def tb_address():\n"
        "    newest = max(manager.get_all(), key=lambda info: info.start_time)\n"
        "    return f'https://jupyter.example/user/tester/proxy/{newest.port}/'\n")
    nersc_logdir = os.path.join(logdir, "test")  # its own TensorBoard, not the module's
    environment = {LOGDIR_VARIABLE: nersc_logdir,
                   "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
                   # The magic runs `tensorboard` from PATH; make it this environment's.
                   "TENSORBOARD_BINARY": os.path.join(os.path.dirname(sys.executable), "tensorboard")}
    with running_notebook(kernel_specs, environment) as (printed, cells):
        try:
            pids = tensorboards_serving(nersc_logdir)
            assert len(pids) == 1, printed
            frame = re.search(r'<iframe[^>]*src="https://jupyter\.example/user/tester/proxy/(\d+)/"', printed)
            assert frame, printed
            status, runs = get(f"http://localhost:{frame.group(1)}/data/runs")
            assert status == 200 and "1CPU/nb/logs" in json.loads(runs)
            assert "TensorBoard (pid" not in printed  # the local launcher stayed out of it
            # The launching cell's one output is the frame: the magic's own messages are hidden.
            launch = [cell for cell in cells if "run_line_magic" in cell.source]
            assert len(launch) == 1 and len(launch[0].outputs) == 1, launch[0].outputs
            assert "Launching TensorBoard" not in printed and "Reusing TensorBoard" not in printed
        finally:  # before the kernel goes: the magic's TensorBoard is in the kernel's process group
            for pid in tensorboards_serving(nersc_logdir):
                stop_tensorboard(pid)


# ----------------------------------------------------------------------------- the screenshot tool

def test_the_screenshot_tool_makes_the_tutorial_image(logdir, tmp_path):
    ensure_chromium()
    out = tmp_path / "images" / "tensorboard_scalars.png"
    own_logdir = os.path.join(logdir, "test", "1CPU")  # so its TensorBoard is told apart from others
    result = subprocess.run([sys.executable, "-m", "figures.tensorboard_screenshot", "--logdir", own_logdir,
                             "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(300))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Wrote {out}" in result.stdout
    check_screenshot(out)
    assert not tensorboards_serving(own_logdir)  # stopped again

    result = subprocess.run([sys.executable, "-m", "figures.tensorboard_screenshot", "--logdir", own_logdir,
                             "--out", str(tmp_path / "none.png"), "--tag", "Loss/none", "--timeout", "10"],
                            cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(300))
    assert result.returncode == 2 and "Loss/valid" in result.stderr  # names the tags there are
    assert not (tmp_path / "none.png").exists() and not tensorboards_serving(own_logdir)


# ----------------------------------------------------------------------------- the launcher's small parts

def test_the_log_directory_comes_from_the_environment(tmp_path):
    scratch_logs = tmp_path / "sc22-dl-tutorial" / "logs"
    assert default_logdir({}) == os.path.join(ROOT, "runs")
    assert default_logdir({"SCRATCH": str(tmp_path)}) == os.path.join(ROOT, "runs")  # no runs there yet
    scratch_logs.mkdir(parents=True)
    assert default_logdir({"SCRATCH": str(tmp_path)}) == str(scratch_logs)
    assert default_logdir({"SCRATCH": str(tmp_path), LOGDIR_VARIABLE: "elsewhere"}) == os.path.abspath("elsewhere")


def test_the_jupyterhub_proxy_address():
    assert jupyterhub_proxy_url(6006, {}) is None
    assert jupyterhub_proxy_url(6006, {"JUPYTERHUB_SERVICE_PREFIX": "/user/a/"}) == "/user/a/proxy/6006/"
    assert jupyterhub_proxy_url(6006, {"JUPYTERHUB_SERVICE_PREFIX": "/user/a"}) == "/user/a/proxy/6006/"


def test_launcher_mistakes_are_explained(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        start_tensorboard(tmp_path / "missing")
    with pytest.raises(UserError, match=r"exited with status \d+ before serving(.|\n)*no_such_flag"):
        start_tensorboard(tmp_path, extra_args=["--no_such_flag"])
    with pytest.raises(UserError, match="not a TensorBoard"):
        stop_tensorboard(os.getpid())


def test_the_scalars_address_carries_the_filters():
    url = scalars_url("http://127.0.0.1:6006/", tag_filter=group_filter("Loss/valid"), run_filter="demo")
    assert url == "http://127.0.0.1:6006/#scalars&tagFilter=%5ELoss%2F&regexInput=demo&_smoothingWeight=0.0"
    assert group_filter("Learning Rate") == "^Learning\\ Rate$"
