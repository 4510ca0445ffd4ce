"""A Python without the project's packages (the virtual environment not activated) gets a one-line hint
from train.py, before torch is imported (utils/env_check.py)."""
import os
import subprocess
import sys

from conftest import ROOT, timeout_for

def test_train_py_in_a_python_without_the_packages_prints_one_line(tmp_path):
    """`python train.py` outside the virtual environment (here: this Python without its site-packages,
    -S): one line that names what is missing and says to activate .venv, not a ModuleNotFoundError."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-S", os.path.join(ROOT, "train.py"), "--config=demo"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=timeout_for(60))
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: torch, ") and "is not installed" not in result.stderr
    assert "not installed in this Python" in result.stderr and "source .venv/bin/activate" in result.stderr


def test_a_benchmark_in_a_python_without_the_packages_prints_one_line():
    """`python -m benchmarks.ladder --preset cpu`, the CPU track's next command, likewise: the benchmarks
    package checks before any of its tools imports torch."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-S", "-m", "benchmarks.ladder", "--preset", "cpu"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=timeout_for(60))
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "not installed in this Python" in result.stderr and "source .venv/bin/activate" in result.stderr


def test_the_hint_says_make_demo_where_there_is_no_environment_yet(tmp_path):
    from utils.env_check import hint

    assert "run `make demo` first" in hint(["torch"], "/usr/bin/python3", venv=str(tmp_path / ".venv"))
    (tmp_path / ".venv").mkdir()
    line = hint(["torch"], "/usr/bin/python3", venv=str(tmp_path / ".venv"))
    assert line.startswith("error: torch is not installed in this Python (/usr/bin/python3): run `source ")
    assert ".venv/bin/activate` first" in line
