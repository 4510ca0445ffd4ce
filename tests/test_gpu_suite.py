"""benchmarks/suite/gpu_suite.sh runs its stages on the GPU it is on and says what each measures, where it writes
and how long it took on an H100 (the committed logs); for a remote GPU machine with a time limit, its plan (no
GPU needed) prints sessions that each fit the machine's time, the preflight first, and ready-to-paste commands,
each inside the budget the script enforces; the script runs what the plan prices; a stage packs what it
finished after every step, at its deadline and on SIGTERM (run here for real with the preflight, the stage a CPU
can run)."""
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time

import pytest

from benchmarks import ladder
from benchmarks.suite import plan as suite_plan
from conftest import ROOT, timeout_for

SUITE = os.path.join(ROOT, "benchmarks", "suite", "gpu_suite.sh")
STAGES = ["headline", "preflight", "ladder", "profiles", "tests-gpu", "tests-compile", "tests-distributed", "scaling",
          "dali", "graph-lesson", "multi-gpu", "nsys-probe"]


def script():
    return open(SUITE).read().replace("\\\n", " ")


def script_commands():
    """The stage functions' commands, as the shell runs them (continuation lines joined)."""
    return {name: re.sub(r"\s+", " ", body) for name, body in re.findall(r"^stage_([\w-]+)\(\) \{\n(.*?)^\}", script(),
                                                                          flags=re.M | re.S)}


def plan_output(*args):
    result = subprocess.run([SUITE, "--plan", *args], cwd=ROOT, env={**os.environ, "PYTHON": sys.executable},
                            capture_output=True, text=True, timeout=timeout_for(120))
    return result.returncode, result.stdout + result.stderr


@pytest.fixture(scope="module")
def plan():
    """``gpu_suite.sh --plan``'s status and output, run once for the module."""
    return plan_output()


def heads(output):
    return re.findall(r"^ *(\d+)\. (.+?): budget (\d+) s, about (\d+) s; carry (.+?); timeout_s (\d+) \((fits|DOES NOT "
                      r"FIT)\)$\n    \$ (.+)$", output, flags=re.M)


def test_the_plan_fits_its_sessions_most_valuable_first_each_command_installing_what_it_carries(plan):
    status, output = plan
    assert status == 0, output
    commands = heads(output)
    assert [int(number) for number, *_ in commands] == list(range(1, len(commands) + 1))
    assert all(fits == "fits" and int(estimate) <= int(budget) <= 530 and int(timeout) <= 600
               and len(command) <= 2000 for _, _, budget, estimate, _, timeout, fits, command in commands)
    stages = [re.search(r"gpu_suite\.sh (.+)$", command).group(1) for *_, command in commands if "gpu_suite.sh" in command]
    assert stages == ["headline", "preflight", "tests-gpu tests-compile", "tests-distributed", "dali", "graph-lesson",
                      "batch-sweep", "nsys-probe", "ladder-alone", "ladder", "scaling", "profiles", "original"]  # by value
    # Sessions, each on a bare machine, by value: the headline alone; the GPU-only tests; the distributed code on
    # CUDA tensors and the out-of-memory tests; DALI; the CUDA-graph lesson and the batch sweep; Debian's Nsight
    # Systems; last what the committed runs measured already.
    sessions = suite_plan.plan()
    assert [[stage for command in session for stage in command["stages"]] for session in sessions] == [
        ["headline"], ["preflight", "tests-gpu", "tests-compile"], ["tests-distributed"], ["dali"],
        ["graph-lesson", "batch-sweep"], ["nsys-probe", "ladder-alone"], ["ladder"], ["scaling", "profiles"],
        ["original"]]
    printed = re.split(r"^Session \d+ of 9: .*$", output, flags=re.M)
    assert len(printed) == 10 and [len(heads(text)) for text in printed[1:]] == [len(session) for session in sessions]
    # Every command that runs a stage installs the small wheels it carries first, into a folder under HOME.
    for _, what, _, _, carry, _, _, command in commands:
        if "gpu_suite.sh" in command:
            assert command.startswith(suite_plan.INSTALL + " && ") and ".carry/wheels" in carry.split(", "), what
    # DALI: its session is one command per carried part; the last joins them, checks the sha256, extracts the tar
    # and runs the dali stage.
    dali = [(what, carry, command) for _, what, _, _, carry, _, _, command in commands if what.startswith("DALI")]
    assert [carry.split(", ")[-1] for _, carry, _ in dali] == [f".carry/{k}" for k in range(1, suite_plan.DALI_PARTS + 1)]
    assert [command["what"] for command in sessions[3]] == [what for what, _, _ in dali]
    assert "sha256sum -c --quiet site.sha256 && " in dali[-1][2] and "tar xJf site.tar.xz" in dali[-1][2]
    assert dali[-1][2].endswith("benchmarks/suite/gpu_suite.sh dali")
    # Each session: its start, its commands' budgets and transfers, and the idle after the last, within the
    # device time of a session, with a margin.
    totals = re.findall(r"^session (\d+): about [\d.]+ min of commands and transfers \((\d+) s of transfers, "
                        r"estimated\); with the machine's start \(120 s\) and the idle 30 s after its last command: "
                        r"about [\d.]+ min, at most ([\d.]+) min if every command used its whole budget, of the 15 min "
                        r"of device time a session has \(fits, with (\d+) s to spare\)\.$", output, flags=re.M)
    assert [int(number) for number, *_ in totals] == list(range(1, 10))
    for session, (_, transfers, most, spare) in zip(sessions, totals):
        estimated, budgeted = suite_plan.session_seconds(session)
        assert budgeted == suite_plan.START_S + suite_plan.IDLE_S + sum(c["budget"] + c["transfer"] for c in session)
        assert estimated < budgeted and float(most) == round(budgeted / 60, 1) and int(transfers) == sum(
            c["transfer"] for c in session)
        assert int(spare) == suite_plan.SESSION_S - budgeted >= suite_plan.MARGIN_S
    assert "all sessions: 9, " in output and "(each fits its 15 min)" in output
    assert "for a remote GPU machine with a time limit" in output and "lease" not in output
    assert "One GPU runs DDP, FSDP and accumulation with two ranks over gloo" in output and "--plan --gpus 4" in output
    # Room kept for what the ladder and the tests will have: the prefetch rung, the prefetch tests, cuDNN's autotuning.
    assert "device prefetch" in output and "tests/test_gpu_prefetch.py" in output and "cudnn_autotune" in output


def test_a_session_that_cannot_fit_is_reported(monkeypatch, capsys):
    monkeypatch.setattr(suite_plan, "SESSION_S", 720)  # session 1 needs 685 s if every command used its budget
    assert suite_plan.main([]) == 1
    output = capsys.readouterr().out
    assert re.search(r"^session 1: .*\(DOES NOT FIT\)\.$", output, flags=re.M)
    assert re.search(r"^session 3: .*\(fits, with \d+ s to spare\)\.$", output, flags=re.M)  # 625 s
    assert "all sessions: 9, " in output and output.rstrip().endswith("(DOES NOT FIT).")


def test_the_multi_gpu_plan_is_ready_to_paste():
    status, output = plan_output("--gpus", "4")
    assert status == 0, output
    commands = heads(output)
    assert [command.rsplit("gpu_suite.sh ", 1)[1] for *_, command in commands] == ["preflight", "multi-gpu", "scaling"]
    for run in ("ddp", "fsdp", "domain", "graph-ddp"):
        assert f"step {run}:" in output
    assert "on 4 GPU(s)" in output and "1 session(s)" in output
    assert "DALI, part" not in output and "pack_dali" not in output
    assert re.search(r"^session 1: .*\(fits, with \d+ s to spare\)\.$", output, flags=re.M)


def test_the_script_enforces_the_plans_budgets_and_runs_what_it_prices():
    shell_budgets = dict(re.findall(r"\[([\w-]+)\]=(\d+)", re.search(r"declare -A BUDGET=\((.*?)\)", script(),
                                                                     flags=re.S).group(1)))
    assert {stage: int(seconds) for stage, seconds in shell_budgets.items()} == suite_plan.stage_budgets()
    # Each step of a stage asks for the time the plan prices it at.
    commands = script_commands()
    for stage, stage_steps in suite_plan.steps().items():
        asked = [(name, int(seconds)) for name, seconds in re.findall(
            r"(?:step|multi_gpu_run|headline_rung) \"?([\w-]+)\"? (\d+) ", commands[stage])]
        assert asked == [(name, suite_plan.step_seconds(rows)) for name, rows in stage_steps], stage
    ladder_flags = " ".join(f"--{key} {value}" for key, value in suite_plan.LADDER.items())
    assert f"LADDER_SIZES=({ladder_flags})" in script()
    assert "-m benchmarks.ladder" in commands["ladder"] and "--group ladder" in commands["ladder"]
    assert '--batch_sweep "${LADDER_SIZES[@]}"' in commands["ladder"]  # none: the batch-sweep stage's
    assert f'--only "{suite_plan.SWEEP_RUNG}"' in commands["batch-sweep"] and any(
        suite_plan.SWEEP_RUNG in rung.name for rung in ladder.LADDER_RUNGS[-1:])
    # The sweep leaves out the top rung's own batch: measured once, by the rung itself.
    sweep = " ".join(map(str, suite_plan.SWEEP_BATCHES))
    assert f"--batch_sweep {sweep} " in commands["batch-sweep"] and 64 not in suite_plan.SWEEP_BATCHES
    assert "-m benchmarks.original --original=" in commands["original"] and "help=(--help)" in commands["original"]
    assert '--out_dir "$RESULTS/original"' in commands["original"]
    assert "--group alone" in commands["ladder-alone"] and '--out_dir "$RESULTS/ladder-alone"' in commands["ladder-alone"]
    assert "--group loaders" in commands["dali"] and '-m gpu -k dali' in commands["dali"]
    assert "-m benchmarks.profiles" in commands["profiles"] and "-m benchmarks.layers" in commands["profiles"]
    assert '-m gpu -k "$GPU_TESTS"' in commands["tests-gpu"] and '-k "$DISTRIBUTED_TESTS"' in commands["tests-distributed"]
    assert 'GPU_TESTS="not compile and not dali and not cuda_distributed and not out_of_memory"' in script()
    assert 'DISTRIBUTED_TESTS="cuda_distributed or out_of_memory"' in script()  # the out-of-memory tests moved
    assert "-m gpu -k compile" in commands["tests-compile"]
    assert "--no_production --extra=--exact_forms=off" in commands["graph-lesson"]


def test_the_plan_prices_auto_s_decision_once_a_ladder_stage_as_the_ladder_makes_it():
    """benchmarks/ladder.py's first rung with --exact_forms=auto decides; the rungs after it and the batch sweep take
    its layers (ladder_options): the plan prices the decision (shape probe and timing) on that rung alone, and the
    forms' own autotuning on the others."""
    decision, forms = suite_plan.SETUP_S["auto"], suite_plan.SETUP_S["forms"]
    assert decision > forms > 0
    rows = suite_plan.ladder_rows("ladder")
    assert [what for what, _ in rows if "auto decides" in what] == [
        "+ compile's CUDA graphs (reduce-overhead) (a process of its own; --exact_forms=auto decides for the rungs "
        "after it)"]
    seconds = {what.split(" (a process of its own")[0]: price for what, price in rows}
    # The compiled rungs differ in what they pay for the forms alone (the same trials, the same compilation).
    assert seconds["+ compile's CUDA graphs (reduce-overhead)"] - seconds["+ torch.compile"] == pytest.approx(decision)
    assert seconds["+ exact forms"] - seconds["+ torch.compile"] == pytest.approx(forms)
    # The batch-sweep stage: its top rung decides, its sweep takes the layers.
    top = ladder.LADDER_RUNGS[-1]
    sweep = suite_plan.ladder_rows("ladder", only=suite_plan.SWEEP_RUNG, sweep=(128,))
    assert [what for what, _ in sweep[1:2]] == [what for what, _ in rows if "auto decides" in what]
    deciding = suite_plan.rung_setup(top.options, top.script, 128) + suite_plan.trial_seconds(
        top.options, suite_plan.LADDER["nbatches"], suite_plan.LADDER["ntrials"], suite_plan.LADDER["nwarmup"], 128)
    assert sweep[-1][1] == pytest.approx(deciding - decision + forms)


def shell_array(name):
    """A bash array of gpu_suite.sh as its GPU branch sets it (the first assignment), its words."""
    return shlex.split(re.search(rf"\b{name}=\((.*?)\)", script().split("\nelse\n", 1)[1]).group(1))


def test_the_headline_measures_the_rungs_the_plan_prices_each_naming_the_exact_forms():
    """The headline's rungs are the ladder's (the best rung, compiled or not) with --exact_forms named, at the trial
    sizes the plan prices; its layers and ncu steps name the switch too; the steps come in the order of value."""
    commands = script_commands()["headline"]
    assert shell_array("HEADLINE_SIZES") == [word for key, value in suite_plan.HEADLINE.items()
                                             for word in (f"--{key}", str(value))]
    best = [word.replace('"${PRECISION[@]}"', "--amp_mode=bf16") for word in
            re.search(r"^BEST=\((.*?)\)$", script(), flags=re.M).group(1).split()]
    assert best == ladder.CHANNELS_LAST
    rungs = re.findall(r'headline_rung ([\w-]+) \d+ \d+ "\$\{BEST\[@\]\}" (.+?) \|\|', commands)
    assert {name: [*best, *options.split()] for name, options in rungs} == suite_plan.HEADLINE_RUNGS
    assert suite_plan.HEADLINE_RUNGS["compile-auto"][:-1] == ladder.COMPILED  # the ladder's + torch.compile
    # Compiled, Inductor's layout optimisation held on with the forms and without (as the ladder's compiled rungs).
    helper = re.search(r"^headline_rung\(\) \{\n(.*?)^\}", script(), flags=re.M | re.S).group(1)
    assert '*" --jit_mode=compile "*' in helper
    assert "environment=(env " + " ".join(f"{k}={v}" for k, v in ladder.COMPILED_ENVIRONMENT.items()) + ")" in helper
    for tool in ("-m benchmarks.layers", "-m benchmarks.ncu_layers"):
        [line] = [line for line in commands.split(" || ") if tool in line]
        assert re.search(r"--exact_forms=(auto|off)\b", line), tool
    order = re.findall(r"(?:step|headline_rung) ([\w-]+) \d+ ", commands)
    assert order == ["layers", "compile-auto", "compile-off", "original", "ncu", "anchor"]
    assert "--epochs 2 --rungs none" in commands and "make_data('$DATA_DIR', $BOX)" in commands


def test_the_nsys_probe_tries_debians_cli_with_the_issues_options(plan):
    """Debian's carried CLI (the machine's own nsys writes captures no importer here can read), given NSYS_LIMIT
    (the plan's price) on train.py's cudaProfilerApi window with sampling and CPU context switches off; the plan
    carries the .deb and says how to fetch it."""
    commands = script_commands()["nsys-probe"]
    assert re.findall(r"step (nsys-\w+) \d+ bash -c 'nsys_route \"\$@\"' _ (\w+) ", commands) == [
        ("nsys-debian", "debian")]
    assert f"NSYS_LIMIT={suite_plan.NSYS_LIMIT_S} " in script() and suite_plan.NSYS_LIMIT_S >= 120
    route = re.search(r"^nsys_route\(\) \{\n(.*?)^\}", script(), flags=re.M | re.S).group(1)
    for option in ("--sample=none", "--cpuctxsw=none", "-c cudaProfilerApi", "--enable_manual_profiling",
                   'timeout -s INT -k 10 "$NSYS_LIMIT"'):
        assert option in route, option
    [command] = [c for session in suite_plan.plan() for c in session if c["stages"] == ["nsys-probe"]]
    assert suite_plan.NSYS_CARRY in command["carry"] and "nsight-systems-target_*.deb" in commands
    status, output = plan
    assert f"python -m benchmarks.nsight fetch --dir {suite_plan.NSYS_CARRY} nsight-systems-target" in output
    assert "python -m benchmarks.nsight import <capture>.qdstrm" in output


def test_the_plan_copies_the_preflights_answer_from_where_the_suite_writes_it(plan):
    """By default the suite writes under runs/benchmarks/ as every benchmark tool does, and its archives hold
    that path: the plan's copy of the preflight's answer reads it there (tests/test_gpu_plan.py runs it)."""
    assert f"RESULTS=${{RESULTS:-{suite_plan.SUITE_RESULTS}}}" in script()
    assert "PREFLIGHT=$RESULTS/preflight.json" in script() and "--out_dir \"$RESULTS\"" in script_commands()["preflight"]
    status, output = plan
    assert f"gpu_suite_preflight.tgz -O {suite_plan.SUITE_RESULTS}/preflight.json > .carry/preflight/" in output


def test_the_overview_gives_each_stages_time_from_the_committed_logs():
    """Every stage's time on an H100 is the one its committed log ends with, or "not measured"."""
    output = subprocess.run([sys.executable, "-m", "benchmarks.suite.plan", "--overview", *STAGES], cwd=ROOT,
                            capture_output=True, text=True, timeout=timeout_for(60)).stdout
    assert re.findall(r"^  ([\w-]+): ", output, flags=re.M) == STAGES
    for stage in STAGES:
        logs = [path for path in sorted(os.listdir(suite_plan.COMMITTED_LOGS))
                if path.startswith(f"gpu_suite-{stage}-") and path.endswith(".log")
                and "H100" in open(os.path.join(suite_plan.COMMITTED_LOGS, path)).read().splitlines()[1]]
        block = re.split(r"\n  (?=[\w-]+: )", output.split(f"  {stage}: ")[1])[0]
        if not logs:
            assert "time on an H100: not measured" in block, stage
            continue
        text = open(os.path.join(suite_plan.COMMITTED_LOGS, logs[-1])).read()
        seconds = re.search(rf"stage {stage} ended with status \d+ after (\d+) s", text).group(1)
        assert f"time on an H100: {seconds} s" in block and logs[-1] in block, stage
    assert "time on an H100: 320 s" in output  # the ladder, 2026-11-25 (benchmarks/results/gpu_suite)


@pytest.mark.slow
def test_a_stage_on_this_machine_says_what_it_measured_and_where_it_went(tmp_path):
    """Without OUT (no remote machine): the overview first, then the stage under the guard limit alone, and a
    summary of each stage's status, time, log and results."""
    env = {**os.environ, "PYTHON": sys.executable, "RESULTS": str(tmp_path / "results")}
    env.pop("OUT", None)
    result = subprocess.run([SUITE, "preflight"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_for(180))
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^  preflight: what the later stages rely on.*\n      results: .*/results/preflight\.json\n"
                     r"      time on an H100: \d+ s, benchmarks/results/gpu_suite/gpu_suite-preflight-", result.stdout,
                     flags=re.M)
    assert "budget 1800 s" in result.stdout and "gpu_suite_preflight.tgz" not in result.stdout
    assert re.search(rf"^  preflight: passed in \d+ s; log {tmp_path}/results/gpu_suite-preflight-[\d-]+\.log; "
                     rf"results: {tmp_path}/results/preflight\.json$", result.stdout, flags=re.M)


def test_a_stage_that_cannot_fit_is_reported():
    assert suite_plan.main(["--limit", "60"]) == 1


def test_help_prints_the_usage():
    result = subprocess.run([SUITE, "--help"], capture_output=True, text=True, timeout=timeout_for(30))
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("The tutorial's GPU measurements and checks, in stages, on the GPU this runs on")
    for stage in STAGES:
        assert re.search(rf"^  {stage} +\S", result.stdout, flags=re.M), stage
    assert "sbatch " in result.stdout and '--wrap "PYTHON=.venv/bin/python benchmarks/suite/gpu_suite.sh"' in result.stdout
    assert "On a remote GPU machine with a time limit" in result.stdout and "lease" not in result.stdout
    assert "set -uo" not in result.stdout
    # No stage named: all of them, on this machine's GPU; without one, refused before anything runs.
    bare = subprocess.run([SUITE], capture_output=True, text=True, timeout=timeout_for(30),
                          env={**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""})
    assert bare.returncode == 2 and "sees no CUDA GPU, and stage headline measures one" in bare.stderr
    assert bare.stdout == ""


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


@pytest.mark.slow
def test_the_preflight_stage_packs_what_it_wrote(tmp_path):
    process = suite(tmp_path, "preflight")
    output, _ = process.communicate(timeout=timeout_for(180))
    assert process.returncode == 0, output
    files = packed(tmp_path, "preflight")
    [log] = [name for name in files if name.startswith("gpu_suite-preflight-")]
    assert set(files) == {"preflight.json", log}
    assert "preflight: passed" in files[log] and "ended with status 0" in files[log]


def test_a_step_that_cannot_finish_inside_the_budget_is_not_started_and_the_stage_still_packs(tmp_path):
    process = suite(tmp_path, "preflight", STAGE_LIMIT="30")  # 15 s left after packing's reserve: < 20 s
    output, _ = process.communicate(timeout=timeout_for(60))
    assert process.returncode == 1
    # 15 s left, less the seconds the stage's start took (more on a loaded machine)
    [left] = re.findall(r"step preflight not run: (\d+) s left of the stage's budget, and it needs about 20 s", output)
    assert 5 <= int(left) <= 15, output
    [(name, log)] = packed(tmp_path, "preflight").items()
    assert "not run" in log and "failed stages: preflight" in output


@pytest.mark.slow
def test_the_archive_fits_what_the_machine_returns_leaving_out_the_largest_files(tmp_path):
    """8 files, 64 MiB together come back: with 7 files and all but 900 bytes of 60 MiB already in $OUT,
    the stage's archive leaves out its largest files, names them, and fits."""
    out = tmp_path / "out"
    out.mkdir()
    total = 60 * 1024 * 1024 - 900
    for k in range(7):
        with open(out / f"earlier{k}", "wb") as f:  # sparse: sizes without the disk space
            f.truncate(total // 7 + (total % 7 if k == 0 else 0))
    room = 60 * 1024 * 1024 - sum(path.stat().st_size for path in out.iterdir())
    assert room == 900
    process = suite(tmp_path, "preflight")
    output, _ = process.communicate(timeout=timeout_for(180))
    assert process.returncode == 0, output
    archive = out / "gpu_suite_preflight.tgz"
    assert archive.stat().st_size <= room and len(list(out.iterdir())) == 8
    files = packed(tmp_path, "preflight")
    assert "left out of the archive, too large" in output and "gpu_suite-left-out.txt" in files
    left_out = files["gpu_suite-left-out.txt"]
    assert "preflight.json" in left_out or "gpu_suite-preflight-" in left_out


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
    output, _ = process.communicate(timeout=timeout_for(60))
    assert process.returncode == 143, "".join(lines) + output
    assert "SIGTERM received" in output and "packing what is done" in output
    [log] = [text for name, text in packed(tmp_path, "preflight").items() if name.startswith("gpu_suite-")]
    assert "stage preflight started" in log and "SIGTERM received" in log


def test_the_ladder_measures_its_best_rung_first_and_each_rung_adds_one_thing():
    rungs = ladder.rungs_for("gpu", dali=True)
    climbing = ladder.LADDER_RUNGS
    assert rungs[:len(climbing)] == climbing[::-1]  # from the top down: the best rung first
    for below, above in zip(climbing[:-3], climbing[1:-2]):  # each adds one option to the one before it
        assert above.options[:len(below.options)] == below.options and len(above.options) == len(below.options) + 1
    assert [rung.options[-1] for rung in climbing[1:6]] == ["--amp_mode=bf16", "--enable_fused", "--channels_last",
                                                           "--jit_mode=compile", "--exact_forms=auto"]
    graph, compiled_graph = climbing[-2:]  # the step's launches in one graph, either way, on everything else
    assert graph.script == "train_graph.py" and graph.options == climbing[-3].options
    assert compiled_graph.options == [*climbing[-3].options, "--compile_mode=reduce-overhead"]
    host = [rung for rung in rungs if "--data_loader_config=lowmem" in rung.options]
    assert rungs[-len(host):] == host and all(rung.nbatches == ladder.HOST_LOADER_BATCHES for rung in host)
    fp16 = [rung for rung in rungs if "--amp_mode=fp16" in rung.options]
    assert fp16 and all("--enable_fused" in rung.options for rung in fp16)  # the scaler checks on the device
    assert sorted(rung.step for rung in rungs) == list(range(1, len(rungs) + 1))  # one place each on the ladder


def test_the_table_lists_the_rungs_in_the_ladders_order():
    report = {"command": "x", "device": "d", "torch": "t", "cuda": "c", "date": "now", "runs": [
        {"name": rung.name, "step": rung.step, "table": rung.table, "error": "not run"}
        for rung in ladder.rungs_for("gpu", dali=True)]}
    names = re.findall(r"^\| (.+?) \| failed", ladder.markdown_table(report), flags=re.M)
    assert names[0] == "baseline: lowmem, 2 workers" and names[-1] == "DALI"
    assert names.index("+ compile's CUDA graphs (reduce-overhead)") < names.index("fp16 instead of bf16")


def test_the_multi_gpu_runs_use_options_train_py_has():
    """The two-rank runs a single-GPU machine cannot check: their options are config keys and configs that
    exist (a typo would cost a multi-GPU machine's command)."""
    import yaml

    with open(os.path.join(ROOT, "config", "UNet.yaml")) as f:
        configs = yaml.safe_load(f)
    runs = re.findall(r"multi_gpu_run ([\w-]+) \d+ (\S+) (.+?)(?: \|\||$)", script_commands()["multi-gpu"])
    assert [name for name, _, _ in runs] == [name for name, _ in suite_plan.MULTI_GPU_RUNS]
    for name, script_name, options in runs:
        assert os.path.isfile(os.path.join(ROOT, script_name))
        for option in options.split():
            key, _, value = option[2:].partition("=")
            assert key == "config" and value in configs or key in configs["base"], (name, option)
    assert dict((name, options) for name, _, options in runs)["domain"] == "--config=domain_demo"
    assert configs["domain_demo"]["domain_mesh"] == [2, 1, 1]


def headline(tmp_path, **env):
    """The headline stage's CPU check (the tools at tiny sizes on the CPU presets), its data set under tmp_path."""
    return suite(tmp_path, "headline", CPU_CHECK="1", DATA_DIR=str(tmp_path / "data"), **env)


@pytest.mark.slow
def test_the_headline_starts_a_step_only_where_its_price_still_fits(tmp_path):
    """A budget of 140 s: 125 s are left at the start, less the set-up's seconds, and the layers step asks for
    110. A stand-in `timeout` holds that step 20 s before it starts, so after it the compiled rung with the forms
    auto (110 s) no longer fits and is not started, whatever this machine's speed. Every step's decision follows
    the seconds it printed, and summary.txt records each outcome."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "timeout").write_text('#!/bin/sh\ncase " $* " in *" benchmarks.layers "*) sleep 20;; esac\n'
                                     f'exec {shutil.which("timeout")} "$@"\n')
    (bin_dir / "timeout").chmod(0o755)
    process = headline(tmp_path, STAGE_LIMIT="140", PATH=f"{bin_dir}:{os.environ['PATH']}")
    output, _ = process.communicate(timeout=timeout_for(400))
    assert process.returncode == 1, output  # a step not run is a stage that did not pass
    steps = suite_plan.headline_steps()
    needs = {name: suite_plan.step_seconds(rows) for name, rows in steps}
    started = dict(re.findall(r"^gpu_suite\.sh: step ([\w-]+): about \d+ s, at most (\d+) s$", output, flags=re.M))
    skipped = {name: (int(left), int(need)) for name, left, need in re.findall(
        r"^gpu_suite\.sh: step ([\w-]+) not run: (-?\d+) s left of the stage's budget, and it needs about (\d+) s$",
        output, flags=re.M)}
    assert "layers" in started and "compile-auto" in skipped
    assert sorted([*started, *skipped]) == sorted(needs)  # each step decided once
    assert all(left < need == needs[name] for name, (left, need) in skipped.items())
    assert all(int(limit) >= needs[name] for name, limit in started.items())
    summary = packed(tmp_path, "headline")["summary.txt"]
    assert summary.startswith("# benchmarks/suite/gpu_suite.sh headline, ")
    assert all(f"\n{key}: " in summary for key in ("device", "python", "torch", "cudnn"))  # what the numbers ran on
    assert "step layers: status 0 in " in summary
    for name, (left, need) in skipped.items():
        assert f"step {name}: not run ({left} s left of the budget, it needs about {need} s)" in summary


@pytest.mark.slow
def test_a_headline_killed_mid_way_returns_the_steps_it_finished(tmp_path):
    """SIGKILL to the whole stage (no chance to pack: a machine's limit) while the compiled rung runs, after the
    layers step: $OUT's archive, packed as that step ended, holds the layers' results, summary.txt with their
    outcome, and the stage's log."""
    process = headline(tmp_path)
    lines = []
    deadline = time.monotonic() + timeout_for(300)
    while time.monotonic() < deadline:
        lines.append(process.stdout.readline())
        if "step compile-auto: about" in lines[-1] or not lines[-1]:
            break
    for pid in [process.pid, *descendants(process.pid)]:  # the step's own process group too (timeout's)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    output, _ = process.communicate(timeout=timeout_for(60))
    assert process.returncode == -signal.SIGKILL, "".join(lines) + output
    files = packed(tmp_path, "headline")
    layers = [name for name in files if name.startswith("cpu-") and name.endswith(".json")]
    assert len(layers) == 1 and '"layers": [' in files[layers[0]]
    assert "step layers: status 0 in " in files["summary.txt"] and "compile-auto" not in files["summary.txt"]
    [log] = [text for name, text in files.items() if name.startswith("gpu_suite-headline-")]
    assert "stage headline started" in log and "step layers: about" in log


def descendants(pid):
    """The process ids below ``pid``, read from /proc."""
    children = {}
    for stat in os.listdir("/proc"):
        if stat.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{stat}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(stat))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def pytest_counts(log):
    """{outcome: count} of the last pytest summary line in a committed log ("1 failed, 14 passed, 1 skipped, ...")."""
    text = open(os.path.join(suite_plan.COMMITTED_LOGS, log)).read()
    summary = re.findall(r"^(\d+ (?:passed|failed).*) in [\d.]+s", text, flags=re.M)[-1]
    return {outcome: count for count, outcome in re.findall(r"(\d+) (passed|failed|skipped)", summary)}


def test_the_tests_chapter_quotes_the_committed_gpu_test_logs():
    """docs/08-tests.md's table of the GPU tests gives each stage's counts as its committed log ends them."""
    import quotes

    section = quotes.section("docs/08-tests.md", "The GPU tests")
    rows = {row.split("|")[1].strip(): row for row in section.splitlines() if row.startswith("| `")}
    for stage, log in (("`tests-gpu`", "gpu_suite-tests-gpu-2026-11-25.log"),
                       ("`tests-compile`", "gpu_suite-tests-compile-2026-11-25.log"),
                       ("`dali` (DALI's GPU tests)", "gpu_suite-dali-2026-11-26.log")):
        counts = pytest_counts(log)
        assert counts, log
        quotes.assert_quoted(rows[stage], *counts.values())
    # tests/test_metrics.py whole on the H100 after the fix
    quotes.assert_quoted(rows["`tests-gpu`"], pytest_counts("tests-metrics-rerun-2026-11-25.log")["passed"])


def summarized(tmp_path, calls, env=None):
    """The lines that gpu_suite.sh's functions add to summary.txt in ``calls`` (``[(function, *arguments)]``), each
    function run alone, with the script's ``summarize``."""
    text = open(SUITE).read()
    names = ["summarize", *dict.fromkeys(name for name, *_ in calls)]
    functions = [re.search(rf"^{name}\(\) \{{\n.*?^\}}\n", text, flags=re.M | re.S).group(0) for name in names]
    summary = tmp_path / "summary.txt"
    command = "\n".join([*functions, *(shlex.join([name, *map(str, arguments)]) for name, *arguments in calls)])
    subprocess.run(["bash", "-c", command], cwd=ROOT, env={**os.environ, "PYTHON": sys.executable,
                                                          "SUMMARY": str(summary), **(env or {})},
                   check=True, timeout=timeout_for(60))
    return summary.read_text().splitlines() if summary.exists() else []


def test_the_headlines_summary_gives_each_rungs_numbers(tmp_path):
    """summary.txt holds each rung's FULL, SYNTHETIC and IO samples/s, MFU, peak memory and exact forms, read from
    the rung's result as benchmarks/ladder.py's --measure_rung writes it."""
    result = tmp_path / "compile-auto.json"
    result.write_text(json.dumps({"io": 9012.25, "synthetic": 1702.04, "full": 1650.96, "mfu": {"full": 0.2843},
                                  "peak_mem_gb": 41.27, "exact_forms": ["down.0.0", "last"]}))
    assert summarized(tmp_path, [("rung_numbers", "compile-auto", result)]) == [
        "step compile-auto: FULL 1651.0, SYNTHETIC 1702.0, IO 9012.2 samples/s, MFU 28.4%, peak 41.3 GB, "
        "exact forms ['down.0.0', 'last']"]


def test_the_headlines_summary_gives_the_originals_samples_per_second_or_why_none(tmp_path):
    """summary.txt holds each of the original's runs: its steady samples/s from its epoch lines (the epochs after the
    first), or its error, as benchmarks/original.py's report gives them."""
    from benchmarks import original

    text = ("2026-11-28 10:00:20,001 - root - INFO - Time taken for epoch 1 is 20.5 sec, avg 62.43 samples/sec\n"
            "2026-11-28 10:00:35,002 - root - INFO - Time taken for epoch 2 is 14.2 sec, avg 90.14 samples/sec\n")
    epochs = original.epoch_rates(text)
    runs = [{"name": original.ORIGINAL_RUNS[0]["name"], "epochs": epochs, "samples_per_s": original.steady_rate(epochs)},
            {"name": original.ORIGINAL_RUNS[1]["name"], "epochs": [], "samples_per_s": None,
             "error": "timed out after 600 s, 0 epoch lines; see the log"}]
    (tmp_path / "original").mkdir()
    (tmp_path / "original" / "nvidia-h100-80gb-hbm3-2026-11-28.json").write_text(json.dumps({"original_runs": runs}))
    # No report (a CPU check): nothing said.
    assert summarized(tmp_path, [("original_numbers", tmp_path / "original"), ("original_numbers", tmp_path / "none")]) == [
        f"step original, {runs[0]['name']}: 90.1 samples/s",
        f"step original, {runs[1]['name']}: not measured (timed out after 600 s, 0 epoch lines; see the log)"]


def test_the_headlines_summary_says_where_a_passed_step_measured_nothing(tmp_path, monkeypatch):
    """Two steps pass with nothing measured on some machines: the step layer by layer where the profiler traced no
    GPU kernel (benchmarks/in_step.py's warning in the layers' JSON), and ncu where it cannot run (an H200: the
    reason in its log, as benchmarks/ncu_layers.py writes it). summary.txt says so beside their status."""
    import torch

    from benchmarks import in_step, ncu_layers

    (tmp_path / "layers").mkdir()
    (tmp_path / "layers" / "nvidia-h200-2026-11-28-bf16.json").write_text(json.dumps({"in_step": {
        "off": {"warning": in_step.NO_KERNELS}, "auto": {"warning": in_step.NO_KERNELS}, "on": {}}}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(ncu_layers, "find_ncu", lambda: "/opt/nvidia/nsight-compute/2025.3.1/ncu")
    assert ncu_layers.main(["--out_dir", str(tmp_path / "ncu")]) == 0
    calls = [("layers_warnings", tmp_path / "layers"), ("ncu_reason", tmp_path / "ncu")]
    none = [(name, tmp_path / "none") for name, *_ in calls]  # a CPU check's: nothing said
    assert summarized(tmp_path, calls + none) == [
        f"step layers: {in_step.NO_KERNELS}",
        f"step ncu: no report: NVIDIA H200: {ncu_layers.NO_PROFILER['H200']}"]


def test_the_headlines_summary_gives_the_committed_rung_the_anchor_repeats_on_the_gpu_it_runs_on(tmp_path):
    """After the anchor, summary.txt gives the committed FULL of the rung the anchor repeats on this device
    (benchmarks/results/<device>-<date>.json), here for an H200 that PyTorch is made to report."""
    (tmp_path / "sitecustomize.py").write_text(
        "import torch\ntorch.cuda.is_available = lambda: True\n"
        "torch.cuda.get_device_name = lambda device=None: 'NVIDIA H200'\n")
    committed = suite_plan.measured_full(suite_plan.EAGER_CHANNELS_LAST, gpu="nvidia-h200")
    assert summarized(tmp_path, [("committed_anchor",)], {"PYTHONPATH": str(tmp_path)}) == [
        f"step anchor: the committed {suite_plan.EAGER_CHANNELS_LAST} on this device: FULL {committed:.1f}"]


def test_the_committed_full_rate_comes_from_the_newest_results_of_the_gpu(tmp_path, monkeypatch):
    """A device's ladder is committed again after a change: the anchor is the newest file's, whatever the
    rest of its name; a rung the newest did not run comes from the one before."""
    def committed(name, date, runs):
        (tmp_path / f"{name}-{date}.json").write_text(json.dumps({"runs": runs}))

    committed("nvidia-h100-80gb-hbm3", "2026-11-25", [{"name": "eager", "full": 1.0}, {"name": "old", "full": 3.0}])
    committed("nvidia-h100-sxm", "2026-12-02", [{"name": "eager", "full": 2.0}, {"name": "old", "full": None}])
    committed("nvidia-h200", "2026-12-09", [{"name": "eager", "full": 9.0}])
    monkeypatch.setattr(suite_plan, "RESULTS", str(tmp_path))
    assert suite_plan.measured_full("eager") == 2.0 and suite_plan.measured_full("old") == 3.0
    with pytest.raises(LookupError, match="no committed nvidia-h100 run of 'new'"):
        suite_plan.measured_full("new")
