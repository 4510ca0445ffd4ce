"""benchmarks/ladder.py runs its rungs with train.py's own builders and writes the result files;
benchmarks/gpu_suite.sh, which runs it on a GPU, refuses a machine without one."""
import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks import ladder
from conftest import ROOT

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
    result = subprocess.run([os.path.join(ROOT, "benchmarks", "gpu_suite.sh"), "ladder"], cwd=ROOT,
                            env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "sees no CUDA GPU" in result.stderr and "--preset cpu" in result.stderr
    bad = subprocess.run([os.path.join(ROOT, "benchmarks", "gpu_suite.sh"), "ladders"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
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
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "tests/test_notebook.py" in result.stdout and "skipped" in result.stdout.lower()
