"""benchmarks/gpu_suite.sh fits a lent GPU's time: its plan (no GPU needed) puts every stage inside its
limit, the script runs what the plan prices, the ladder measures first what no GPU run has measured, and
the tests stage picks the GPU-only and fast tests."""
import os
import re
import subprocess
import sys

from benchmarks import ladder, suite_plan
from conftest import ROOT

SUITE = os.path.join(ROOT, "benchmarks", "gpu_suite.sh")


def script_commands():
    """The stage functions' commands, as the shell runs them (continuation lines joined)."""
    text = open(SUITE).read().replace("\\\n", " ")
    return {name: re.sub(r"\s+", " ", body) for name, body in re.findall(r"^stage_(\w+)\(\) \{\n(.*?)^\}", text,
                                                                          flags=re.M | re.S)}


def test_the_plan_puts_every_stage_inside_its_limit():
    result = subprocess.run([SUITE, "--plan"], cwd=ROOT, env={**os.environ, "PYTHON": sys.executable},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    stages = re.findall(r"^stage (\w+): about (\d+) s of 540 s \(fits\)$", result.stdout, flags=re.M)
    assert [name for name, _ in stages] == ["tests", "ladder", "profiles", "scaling"]
    assert all(int(seconds) <= 0.9 * 540 for _, seconds in stages)  # well inside, not just inside
    total = re.search(r"all stages: about ([\d.]+) min", result.stdout)
    assert float(total.group(1)) < 25  # a session's 30 minutes of GPU time, the machine's start included


def test_a_stage_that_cannot_fit_is_reported():
    assert suite_plan.main(["--limit", "60", "ladder"]) == 1


def test_the_script_runs_what_the_plan_prices():
    commands = script_commands()
    ladder_flags = " ".join(f"--{key} {value}" for key, value in suite_plan.LADDER.items())
    assert ladder_flags in commands["ladder"] and "-m benchmarks.ladder" in commands["ladder"]
    assert "-m benchmarks.profiles" in commands["profiles"] and "--nsys" in commands["profiles"]
    assert "-m benchmarks.layers" in commands["profiles"]
    tests = commands["tests"]
    assert "-m gpu" in tests and '-m "not slow and not gpu"' in tests
    assert "--ignore=tests/test_slurm.py --ignore=tests/test_notebook.py" in tests
    assert tests.count("timeout -s INT") == 2  # pytest prints its summary when stopped at a limit


def test_the_ladder_measures_first_what_no_gpu_run_has_measured():
    rungs = ladder.rungs_for("gpu", dali=True)
    assert [rung.script for rung in rungs[:2]] == ["train_graph.py", "train.py"]
    assert "--jit_mode=compile" in rungs[1].options
    assert all("--enable_fused" in rung.options for rung in rungs[1:4])  # bf16 and fp16 with fused Adam
    host = [rung for rung in rungs if "--data_loader_config=lowmem" in rung.options]
    assert rungs[-len(host):] == host and all(rung.nbatches == 5 for rung in host)
    fp16 = [rung for rung in rungs if "--amp_mode=fp16" in rung.options]
    assert fp16 and all("--enable_fused" in rung.options for rung in fp16)  # the scaler checks on the device
    assert sorted(rung.step for rung in rungs) == list(range(1, len(rungs) + 1))  # one place each on the ladder


def test_the_table_lists_the_rungs_in_the_ladders_order():
    report = {"command": "x", "device": "d", "torch": "t", "cuda": "c", "date": "now", "runs": [
        {"name": rung.name, "step": rung.step, "error": "not run"} for rung in ladder.rungs_for("gpu", dali=True)]}
    names = re.findall(r"^\| (.+?) \| failed", ladder.markdown_table(report), flags=re.M)
    assert names[0] == "baseline: lowmem, 2 workers" and names[-1] == "batch 8: + CUDA graph"
