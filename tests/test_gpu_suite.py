"""benchmarks/gpu_suite.sh fits a lent GPU's time and loses nothing: its plan (no GPU needed) prints the
preflight first and one ready-to-paste command per stage, each inside the budget the script enforces;
the script runs what the plan prices; a stage packs what it finished after every step, at its
deadline and on SIGTERM (run here for real with the preflight, the stage a CPU can run)."""
import os
import re
import signal
import subprocess
import sys
import tarfile
import time

from benchmarks import ladder, suite_plan
from conftest import ROOT

SUITE = os.path.join(ROOT, "benchmarks", "gpu_suite.sh")
STAGES = ["preflight", "tests-gpu", "tests-compile", "tests-cpu", "ladder", "profiles", "scaling"]


def script():
    return open(SUITE).read().replace("\\\n", " ")


def script_commands():
    """The stage functions' commands, as the shell runs them (continuation lines joined)."""
    return {name: re.sub(r"\s+", " ", body) for name, body in re.findall(r"^stage_([\w-]+)\(\) \{\n(.*?)^\}", script(),
                                                                          flags=re.M | re.S)}


def test_the_plan_prints_the_preflight_first_and_one_command_per_stage_inside_its_budget():
    result = subprocess.run([SUITE, "--plan"], cwd=ROOT, env={**os.environ, "PYTHON": sys.executable},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    heads = re.findall(r"^ *(\d+)\. (.+?): budget (\d+) s, about (\d+) s(?:; carry (\S+))? \(fits\)$\n    \$ (.+)$",
                       result.stdout, flags=re.M)
    assert [int(number) for number, *_ in heads] == list(range(1, len(heads) + 1))
    commands = [command for *_, command in heads]
    # First the preflight, which also installs the small wheels the machine lacks (ruamel.yaml), carried along.
    assert commands[0].endswith("; PYTHONPATH=/root/site benchmarks/gpu_suite.sh preflight") and heads[0][4] == \
        ".carry/wheels" and "pip install -q --no-index --no-deps --no-compile --target /root/site" in commands[0]
    stages = [re.search(r"gpu_suite\.sh (\S+)$", command).group(1) for command in commands if "gpu_suite.sh" in command]
    assert stages == STAGES  # one command per stage, in order
    assert all(int(budget) <= 540 and int(estimate) <= int(budget) for _, _, budget, estimate, _, _ in heads)
    # DALI: one command per carried part, the install in the last, before the stages that import it.
    dali = [(what, carry, command) for _, what, _, _, carry, command in heads if what.startswith("DALI")]
    assert [carry for _, carry, _ in dali] == [f".carry/{k}" for k in range(1, suite_plan.DALI_PARTS + 1)]
    assert "pip install" in dali[-1][2] and "--target /root/site" in dali[-1][2]
    install = commands.index(dali[-1][2])
    for stage in ("tests-gpu", "ladder"):
        [index] = [i for i, command in enumerate(commands) if command.endswith(f"gpu_suite.sh {stage}")]
        assert index > install
    assert all(command.startswith("PYTHONPATH=/root/site benchmarks/gpu_suite.sh ") for command in commands[install + 1:])
    total = re.search(r"all commands: about ([\d.]+) min of GPU time", result.stdout)
    assert float(total.group(1)) < 25  # a session's 30 minutes of GPU time, with the machine's start


def test_the_script_enforces_the_plans_budgets_and_runs_what_it_prices():
    shell_budgets = dict(re.findall(r"\[([\w-]+)\]=(\d+)", re.search(r"declare -A BUDGET=\((.*?)\)", script(),
                                                                     flags=re.S).group(1)))
    planned = {command["stage"]: command for command in suite_plan.plan() if "stage" in command}
    assert {stage: int(seconds) for stage, seconds in shell_budgets.items()} == \
        {stage: command["budget"] for stage, command in planned.items()}
    # Each step of a stage asks for the time the plan prices it at.
    commands = script_commands()
    for stage, command in planned.items():
        asked = [(name, int(seconds)) for name, seconds in re.findall(r"step ([\w-]+) (\d+) ", commands[stage])]
        assert asked == [(name, suite_plan.step_seconds(rows)) for name, rows in command["steps"]], stage
    ladder_flags = " ".join(f"--{key} {value}" for key, value in suite_plan.LADDER.items())
    assert ladder_flags in commands["ladder"] and "-m benchmarks.ladder" in commands["ladder"]
    assert "-m benchmarks.profiles" in commands["profiles"] and "-m benchmarks.layers" in commands["profiles"]
    assert '-m gpu -k "not compile"' in commands["tests-gpu"] and "-m gpu -k compile" in commands["tests-compile"]
    assert '-m "not slow and not gpu" --ignore=tests/test_slurm.py --ignore=tests/test_notebook.py' \
        in commands["tests-cpu"]


def test_a_stage_that_cannot_fit_is_reported():
    assert suite_plan.main(["--limit", "60", "ladder"]) == 1


def test_help_prints_the_usage():
    result = subprocess.run([SUITE, "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("The tutorial's GPU measurements")
    for stage in STAGES:
        assert f"benchmarks/gpu_suite.sh {stage} " in result.stdout
    assert "#" not in result.stdout and "set -uo" not in result.stdout
    bare = subprocess.run([SUITE], capture_output=True, text=True, timeout=30)
    assert bare.returncode == 2 and "--help" in bare.stderr


def suite(tmp_path, *stages, **env):
    """gpu_suite.sh with its results and $OUT under tmp_path, started (not waited for)."""
    env = {**os.environ, "PYTHON": sys.executable, "RESULTS": str(tmp_path / "results"), "OUT": str(tmp_path / "out"),
           **env}
    return subprocess.Popen([SUITE, *stages], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def packed(tmp_path, stage):
    with tarfile.open(tmp_path / "out" / f"gpu_suite_{stage}.tgz") as archive:
        return {os.path.basename(name): archive.extractfile(name).read().decode()
                for name in archive.getnames()}


def test_the_preflight_stage_packs_what_it_wrote(tmp_path):
    process = suite(tmp_path, "preflight")
    output, _ = process.communicate(timeout=180)
    assert process.returncode == 0, output
    files = packed(tmp_path, "preflight")
    [log] = [name for name in files if name.startswith("gpu_suite-preflight-")]
    assert set(files) == {"preflight.json", log}
    assert "preflight: passed" in files[log] and "ended with status 0" in files[log]


def test_a_step_that_cannot_finish_inside_the_budget_is_not_started_and_the_stage_still_packs(tmp_path):
    process = suite(tmp_path, "preflight", STAGE_LIMIT="40")  # 25 s left after packing's reserve: < 50 s
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1
    # 25 s left, or 24 if the stage's start took over a second (a loaded machine)
    assert re.search(r"step preflight not run: 2[45] s left of the stage's budget, and it needs about 50 s", output)
    [(name, log)] = packed(tmp_path, "preflight").items()
    assert "not run" in log and "failed stages: preflight" in output


def test_sigterm_in_the_middle_of_a_step_packs_what_is_done(tmp_path):
    process = suite(tmp_path, "preflight")
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the step has started: its child is running
        lines.append(process.stdout.readline())
        if "step preflight: about" in lines[-1]:
            break
    time.sleep(0.5)
    os.kill(process.pid, signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 143, "".join(lines) + output
    assert "SIGTERM received" in output and "packing what is done" in output
    [log] = [text for name, text in packed(tmp_path, "preflight").items() if name.startswith("gpu_suite-")]
    assert "stage preflight started" in log and "SIGTERM received" in log


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
