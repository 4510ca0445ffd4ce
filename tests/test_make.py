"""The Makefile's plans (make -n) for a fresh .venv: what each target installs and runs."""
import os
import shutil
import subprocess

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
