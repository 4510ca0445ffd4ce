"""The Makefile's plans (make -n) for a fresh .venv: what each target installs and runs; and, by real make
runs against stand-ins, where the venv's torch comes from."""
import http.server
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, timeout_for

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def plan(target, tmp_path, *variables):
    result = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}", *variables], cwd=ROOT,
                            capture_output=True, text=True, timeout=timeout_for(60),
                            env={k: v for k, v in os.environ.items() if not k.startswith("MAKE")})
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_make_test_fast_installs_pytest_alone_and_no_system_package(tmp_path):
    steps = plan("test-fast", tmp_path)
    assert "pip install --quiet pytest" in steps and "requirements-test.txt" not in steps, steps
    assert "apt-get install -y" not in steps and "sudo" not in steps, steps
    last = steps.strip().splitlines()[-1]
    assert "-m pytest -m \"not slow and not gpu\"" in last and "--ignore=tests/test_slurm.py" in last, last


def test_test_fast_leaves_out_every_test_that_installs_system_packages():
    """As root, the Slurm tests install slurm-wlm and munge, the container tests buildah and debootstrap,
    the Nsight Systems tests Debian's Nsight Systems (about 170 MB), and the browser tests (the notebook's
    and make figures', marked slow) Chromium: none is in make test-fast's selection, nor the DALI tests."""
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    selection = makefile.split("FAST_TESTS :=", 1)[1].split("\n\n", 1)[0]
    for module in ("test_slurm", "test_docker", "test_notebook", "test_data_loader_dali", "test_nsight"):
        assert f"--ignore=tests/{module}.py" in selection, module
    for module in ("test_figures", "test_notebook"):  # the browser's users
        assert "pytestmark = pytest.mark.slow" in open(os.path.join(ROOT, "tests", f"{module}.py")).read(), module


def test_make_demo_trains_with_the_demo_threads(tmp_path):
    """The demo's losses depend on the thread count (README): make demo fixes it, DEMO_THREADS overrides it."""
    assert plan("demo", tmp_path).strip().splitlines()[-1].startswith("OMP_NUM_THREADS=2 ")
    assert plan("demo", tmp_path, "DEMO_THREADS=8").strip().splitlines()[-1].startswith("OMP_NUM_THREADS=8 ")


# ----------------------------------------------------------------------------- where make demo gets torch
# Real make runs of the venv's rule, against stand-ins: a venv whose python records its calls (pip's
# included) and says whether torch imports, a local HTTP server as PyTorch's CPU index, and stand-ins for
# nvidia-smi and uname on PATH.
STANDIN_PYTHON = """#!/bin/sh
# The venv's python (a stand-in): records its arguments; torch imports only where TORCH_IMPORTABLE=1.
echo "$*" >> "$(dirname "$0")/../calls"
if [ "$1" = -c ] && [ "$2" = "import torch" ]; then [ "${TORCH_IMPORTABLE:-0}" = 1 ]; exit; fi
exit 0
"""
WITHOUT_DRIVER = (platform.system() == "Linux" and not os.path.exists("/proc/driver/nvidia")
                  and shutil.which("nvidia-smi") is None)
linux_without_driver = pytest.mark.skipif(not WITHOUT_DRIVER, reason="needs Linux without an NVIDIA driver")
UNREACHABLE = "http://127.0.0.1:9/whl/cpu"  # the discard port: nothing listens there
NOTE = "did not answer within 5 s, so torch comes from pip's default index"


class Index(http.server.ThreadingHTTPServer):
    """A stand-in for PyTorch's CPU index: answers every HEAD request with 200, and lists their paths."""
    def __init__(self):
        paths = self.paths = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self):
                paths.append(self.path)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}/whl/cpu/"


@pytest.fixture
def index():
    server = Index()
    yield server
    server.shutdown()
    server.server_close()


def make_venv(tmp_path, *variables, torch_importable=False, standins=None):
    """``make <venv>/.installed``, the venv a stand-in: (make's output, the pip commands the venv ran, seconds)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(STANDIN_PYTHON)
    (venv / "bin" / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    env["TORCH_IMPORTABLE"] = "1" if torch_importable else "0"
    if standins:  # {program: its output}, first on PATH
        bin_dir = tmp_path / "standins"
        bin_dir.mkdir()
        for program, output in standins.items():
            (bin_dir / program).write_text(f"#!/bin/sh\necho {output}\n")
            (bin_dir / program).chmod(0o755)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    started = time.monotonic()
    result = subprocess.run(["make", str(venv / ".installed"), f"VENV={venv}", f"PYTHON={sys.executable}",
                             *variables], cwd=ROOT, capture_output=True, text=True, env=env,
                            timeout=timeout_for(15))
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    assert (venv / ".installed").exists()
    pips = [line for line in (venv / "calls").read_text().splitlines() if line.startswith("-m pip install")]
    assert pips[-1] == "-m pip install --quiet -r requirements.txt", pips  # then requirements.txt, always
    return result.stdout + result.stderr, pips[:-1], seconds


@linux_without_driver
def test_linux_without_a_driver_gets_torch_from_the_cpu_index(tmp_path, index):
    output, pips, _ = make_venv(tmp_path, f"TORCH_INDEX_URL={index.url()}")
    assert pips == [f"-m pip install --quiet --index-url {index.url()} torch==2.13.0"], pips
    assert index.paths == ["/whl/cpu/torch/"]  # the project page pip reads, asked once
    assert f"venv/bin/python -m pip install --quiet --index-url {index.url()} torch==2.13.0" in output, output
    assert NOTE not in output


@linux_without_driver
def test_an_unreachable_cpu_index_leaves_the_default_index_with_a_one_line_note(tmp_path):
    output, pips, _ = make_venv(tmp_path, f"TORCH_INDEX_URL={UNREACHABLE}")
    assert pips == ["-m pip install --quiet torch==2.13.0"], pips
    assert "venv/bin/python -m pip install --quiet torch==2.13.0\n" in output, output  # the command as it runs
    notes = [line for line in output.splitlines() if NOTE in line]
    assert notes == [f"note: {UNREACHABLE} {NOTE} (PyPI's torch for Linux is the CUDA build: 2.7 GB on x86-64)."], output


@linux_without_driver
def test_an_index_that_never_answers_is_left_after_5_s(tmp_path):
    """A server that takes the connection and never answers (a stalled network): make goes on after the
    probe's 5 s, with the note, instead of hanging."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)  # connections complete in the kernel's backlog; none is ever accepted or answered
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/whl/cpu"
        output, pips, seconds = make_venv(tmp_path, f"TORCH_INDEX_URL={url}")
    assert pips == ["-m pip install --quiet torch==2.13.0"] and NOTE in output, output
    assert seconds < 5 + timeout_for(2), seconds


@pytest.mark.parametrize("case, variables, standins", [
    ("an NVIDIA driver (nvidia-smi on PATH)", (), {"nvidia-smi": "NVIDIA-SMI"}),
    ("macOS", (), {"uname": "Darwin"}),
    ("TORCH_INDEX_URL= (empty)", ("TORCH_INDEX_URL=",), None),
])
@pytest.mark.skipif(platform.system() != "Linux", reason="the stand-ins are for a Linux machine")
def test_the_default_index_without_asking_the_cpu_index(tmp_path, index, case, variables, standins):
    url = () if variables else (f"TORCH_INDEX_URL={index.url()}",)
    output, pips, _ = make_venv(tmp_path, *url, *variables, standins=standins)
    assert pips == ["-m pip install --quiet torch==2.13.0"], (case, pips)
    assert index.paths == [] and NOTE not in output, (case, output)


@linux_without_driver
def test_an_importable_torch_is_kept_and_no_index_asked(tmp_path, index):
    """A venv made with VENV_FLAGS=--system-site-packages in a container sees its torch: nothing installs
    torch, and the index is not asked (nor a note printed where the network is closed)."""
    output, pips, _ = make_venv(tmp_path, f"TORCH_INDEX_URL={index.url()}", torch_importable=True)
    assert pips == [] and index.paths == [] and NOTE not in output, output
    output, pips, _ = make_venv(tmp_path / "closed", f"TORCH_INDEX_URL={UNREACHABLE}", torch_importable=True)
    assert pips == [] and NOTE not in output, output
