"""The benchmark tools (ladder, profiles, scaling) never write over earlier results unasked: a folder
or files that hold them are refused with one paragraph and exit status 2 before anything is made or
measured; --overwrite replaces them, removing the earlier run's files first."""
import datetime
import json
import os
import re
import shutil

import pytest

from benchmarks import common, domain, ladder, precision, profiles, scaling
from benchmarks.suite import preflight
from conftest import ROOT, snapshot

TOOLS = {"ladder": ladder, "profiles": profiles, "scaling": scaling}


class Measured(Exception):
    """Raised in place of making the data set: the first step of a run past its output check."""


@pytest.fixture
def no_measuring(monkeypatch):
    """A tool that gets past its output check stops at the data set instead of measuring anything."""
    def make_data(data_dir, box):
        raise Measured(data_dir)
    for module in TOOLS.values():
        monkeypatch.setattr(module, "make_data", make_data)


def ladder_base():
    """The name the CPU preset's ladder results get today, here."""
    stamp = datetime.datetime.now(datetime.timezone.utc)
    return f"{common.device_slug(common.device_name(False))}-{stamp:%Y-%m-%d}"




def refused(tool, argv, capsys):
    """Run the tool's main in this process; returns its stderr, having checked that it was refused."""
    with pytest.raises(SystemExit) as exit_info:
        TOOLS[tool].main(argv)
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    assert message.startswith("error: ") and "Traceback" not in message
    return " ".join(message.split())


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_a_folder_holding_results_is_refused_before_anything_is_made(tool, tmp_path, capsys, no_measuring):
    out = tmp_path / "out"
    out.mkdir()
    held = f"{ladder_base()}.json" if tool == "ladder" else "README.md"
    (out / held).write_text("an earlier run's results\n")
    before = snapshot(tmp_path)
    argv = ["--preset", "cpu", "--out_dir", str(out), "--data_dir", str(tmp_path / "data")]
    argv += [] if tool == "ladder" else ["--work_dir", str(tmp_path / "work")]

    message = refused(tool, argv, capsys)
    earlier = "an earlier run on this device today" if tool == "ladder" else "an earlier run"
    holds = f"already holds {held}" if tool == "ladder" else f"already holds files ({held})"
    assert message == (f"error: The output folder {out} {holds}: the results of {earlier}. Nothing was run or "
                       "written. Pass --out_dir=<another folder> to keep them, or --overwrite to replace them.")
    assert snapshot(tmp_path) == before and os.listdir(tmp_path) == ["out"], "a refused run writes nothing"


def test_the_documented_profiles_command_writes_outside_the_tracked_folders(capsys, tmp_path, synthetic_data_dir,
                                                                            monkeypatch):
    """The user's case: `python -m benchmarks.profiles --preset cpu` writes under runs/benchmarks/ (here a
    scratch folder in its place), a second run today beside the first; only --committed writes beside
    the committed traces the README quotes, and leaves them alone."""
    folder = os.path.join(ROOT, "example_logs", "cpu_profiles")
    assert os.path.isdir(folder) and os.listdir(folder), f"{folder}, committed, is missing or empty"
    monkeypatch.setattr(common, "USER_RESULTS", str(tmp_path / "runs" / "benchmarks"))
    before = snapshot(folder)
    stamp = datetime.datetime.now(datetime.timezone.utc)
    dated = f"cpu_profiles-{common.device_slug(common.device_name(False))}-{stamp:%Y-%m-%d}"
    user, beside = str(tmp_path / "runs" / "benchmarks" / dated), os.path.join(ROOT, "example_logs", dated)
    made = []
    try:
        for extra, expected in (([], user), ([], user + "-2"), (["--committed"], beside)):
            assert profiles.main(["--preset", "cpu", "--only", "no such rung", "--data_dir", str(synthetic_data_dir),
                                  "--work_dir", str(tmp_path / "work"), *extra]) == []
            made.append(capsys.readouterr().out.strip().splitlines()[-1])
            with open(os.path.join(expected, "profiles.json"), "w") as f:  # as a rung would have made it
                f.write("{}")
        assert made == [f"Profiles, profiles.json and README.md in {user}",
                        f"Profiles, profiles.json and README.md in {user}-2",
                        f"Profiles, profiles.json and README.md in {beside}"]
        assert snapshot(folder) == before
    finally:
        if os.path.isdir(beside) and set(os.listdir(beside)) <= {"profiles.json"}:
            shutil.rmtree(beside)


@pytest.mark.parametrize("tool", ["domain", "precision", "scaling", "ladder"])
def test_every_tool_writes_a_second_run_of_the_day_beside_the_first(tool, tmp_path, synthetic_data_dir, monkeypatch,
                                                                     capsys):
    """One behaviour for all tools: without --out_dir, today's results of an earlier run are kept and the
    run writes <name>-2 under runs/benchmarks/<tool>/; nothing goes into benchmarks/results/. (domain
    and precision once refused with exit status 2.) Each tool stops here where it would measure."""
    monkeypatch.setattr(common, "USER_RESULTS", str(tmp_path / "runs" / "benchmarks"))
    stamp = datetime.datetime.now(datetime.timezone.utc)
    today = f"{common.device_slug(common.device_name(False))}-{stamp:%Y-%m-%d}"
    folder = tmp_path / "runs" / "benchmarks" / tool
    earlier = {"domain": folder / today / "domain.json", "precision": folder / f"{today}.json",
               "scaling": folder / today / "README.md", "ladder": folder / f"{today}.json"}[tool]
    earlier.parent.mkdir(parents=True)
    earlier.write_text("an earlier run's results\n")
    committed = snapshot(os.path.join(ROOT, "benchmarks", "results"))
    made = []

    def stop(*args, **kwargs):
        made.extend(str(path.relative_to(folder)) for path in folder.rglob("*"))
        raise Measured()
    argv = {"domain": ["--crops", "128", "--ranks", "1", "--base_channels", "4"],
            "precision": ["--preset", "cpu", "--data_dir", str(synthetic_data_dir)],
            "scaling": ["--preset", "cpu", "--ranks", "1", "--data_dir", str(synthetic_data_dir),
                        "--work_dir", str(tmp_path / "work")],
            "ladder": ["--preset", "cpu", "--data_dir", str(synthetic_data_dir)]}[tool]
    module = {"domain": domain, "precision": precision, "scaling": scaling, "ladder": ladder}[tool]
    monkeypatch.setattr(module, "measure" if tool == "domain" else "make_data", stop)
    if tool == "precision":  # writes nothing before it measures: the files it claims are those it would write
        def claim_files(paths, *args, **kwargs):
            common.claim_files(paths, *args, **kwargs)
            made.extend(os.path.relpath(path, folder) for path in paths)
        monkeypatch.setattr(module, "claim_files", claim_files)
    with pytest.raises(Measured):
        module.main(argv)
    made = sorted(set(made))
    again = {"domain": [f"{today}-2"], "precision": [f"{today}-2.json", f"{today}-2.md"],
             "scaling": [f"{today}-2/benchy.yaml"], "ladder": [f"{today}-2.log"]}[tool]
    assert set(again) <= set(made), made
    assert earlier.read_text() == "an earlier run's results\n"
    assert snapshot(os.path.join(ROOT, "benchmarks", "results")) == committed


def test_the_preflight_writes_its_facts_outside_the_tracked_folders(tmp_path, monkeypatch, capsys):
    """`python -m benchmarks.suite.preflight` (this machine's facts, rewritten by every preflight) writes
    runs/benchmarks/preflight/preflight.json (here a scratch folder in runs/benchmarks' place), says so,
    and reads it back from there; nothing goes into benchmarks/results/. --out_dir names another folder."""
    monkeypatch.setattr(common, "USER_RESULTS", str(tmp_path / "runs" / "benchmarks"))
    committed = snapshot(os.path.join(ROOT, "benchmarks", "results"))
    assert preflight.main([]) == 0
    written = tmp_path / "runs" / "benchmarks" / "preflight" / "preflight.json"
    facts = json.loads(written.read_text())
    assert facts["passed"] and preflight.read() == facts
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"; results: {written}")
    assert snapshot(os.path.join(ROOT, "benchmarks", "results")) == committed
    assert preflight.main(["--out_dir", str(tmp_path / "elsewhere")]) == 0
    assert preflight.read(str(tmp_path / "elsewhere" / "preflight.json"))["passed"]


def test_the_default_folders_take_the_next_free_name():
    taken = {"base", "base-2"}
    assert common.next_free("base", taken.__contains__) == "base-3"
    assert common.next_free("other", taken.__contains__) == "other"


def test_ladder_refuses_any_of_its_three_files_but_not_the_shared_folder(tmp_path, capsys, no_measuring):
    """benchmarks/results holds every device's and day's results: only this run's names count."""
    (tmp_path / "other-device-2020-01-01.json").write_text("{}")
    argv = ["--preset", "cpu", "--out_dir", str(tmp_path), "--data_dir", str(tmp_path / "data")]
    with pytest.raises(Measured):
        ladder.main(argv)
    (tmp_path / f"{ladder_base()}.log").write_text("an earlier log\n")
    assert f"already holds {ladder_base()}.log:" in refused("ladder", argv, capsys)


def test_a_file_for_an_output_folder_is_refused(tmp_path, capsys, no_measuring):
    (tmp_path / "out").write_text("not a folder")
    message = refused("scaling", ["--preset", "cpu", "--ranks", "1", "--out_dir", str(tmp_path / "out"),
                                  "--work_dir", str(tmp_path / "work")], capsys)
    assert f"--out_dir={tmp_path / 'out'} is a file, not a folder" in message
    assert os.listdir(tmp_path) == ["out"]


def test_overwrite_removes_the_earlier_runs_files_and_keeps_the_others(tmp_path, no_measuring):
    """--overwrite goes past the check; scaling then writes its trial settings and makes the data."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("ddp_1.json", "noddp_16.log", "scaling.json", "README.md", "notes.txt"):
        (out / name).write_text("earlier\n")
    with pytest.raises(Measured):
        scaling.main(["--preset", "cpu", "--ranks", "1", "--out_dir", str(out), "--work_dir", str(tmp_path / "work"),
                      "--overwrite"])
    assert sorted(os.listdir(out)) == ["benchy.yaml", "notes.txt"]


def test_which_files_each_tool_counts_as_its_own():
    assert all(profiles.written_here(name) for name in (
        "profiles.json", "README.md", "baseline.log", "gpu_inmem.pt.trace.json.gz", "gpu_inmem_bf16_graph.nsys-rep",
        "baseline_nsys.log", "baseline.qdstrm"))
    assert not any(profiles.written_here(name) for name in ("notes.log", "baseline.txt", "trace.json"))
    assert all(scaling.written_here(name) for name in ("ddp_1.json", "noddp_8.log", "scaling.json", "benchy.yaml"))
    assert not any(scaling.written_here(name) for name in ("ddp_x.json", "ddp_1.png", "scaling.png"))


def test_an_empty_folder_is_used_and_overwrite_replaces_the_results(tmp_path, synthetic_data_dir, caplog):
    """Without rungs to run (--only matches none here; for the ladder, a rung of the GPU preset's, as gpu_suite.sh's
    CPU check passes it) the tools still check, clean and write their index."""
    empty = tmp_path / "empty"
    empty.mkdir()
    assert profiles.main(["--preset", "cpu", "--only", "no such rung", "--out_dir", str(empty), "--data_dir",
                          str(synthetic_data_dir), "--work_dir", str(tmp_path / "work")]) == []

    out = tmp_path / "ladder"
    out.mkdir()
    base = out / ladder_base()
    for suffix in (".json", ".md", ".log"):
        base.with_suffix(suffix).write_text("earlier\n")
    ladder.main(["--preset", "cpu", "--only", "compile's CUDA graphs", "--out_dir", str(out), "--data_dir",
                 str(synthetic_data_dir), "--overwrite"])
    report = json.loads(base.with_suffix(".json").read_text())
    assert report["runs"] == [] and report["command"].endswith("--overwrite")
    assert "| rung |" in base.with_suffix(".md").read_text()
    log = base.with_suffix(".log")
    assert not log.exists() or "earlier" not in log.read_text()  # a new log, not the old one continued
    assert "--only \"compile's CUDA graphs\": no rung of --preset cpu --group all; names a rung of another" in \
        caplog.text


def test_the_gpu_suite_reruns_its_stages_over_their_own_results():
    """gpu_suite.sh's stages write their results where it says (RESULTS) and redo that day's
    measurement over an earlier one of the same day: every results-writing tool gets --out_dir and
    --overwrite."""
    with open(os.path.join(ROOT, "benchmarks", "suite", "gpu_suite.sh")) as f:
        script = f.read().replace("\\\n", " ")
    commands = re.findall(r"^ +(?:STEP_CAP=\d+ )?step \S+ \d+ .* -m benchmarks\.([\w.]+)(.*)$", script,
                          flags=re.M)  # the stages' tools
    # The preflight's facts (preflight.json) are this machine's now: rewritten by every preflight; the
    # cuDNN autotuning measurement prints its table into the stage's log and writes no file.
    commands = [(tool, options) for tool, options in commands if tool not in ("suite.preflight", "cudnn_autotune")]
    assert sorted(tool for tool, _ in commands) == ["graph_lesson", "ladder", "ladder", "ladder", "ladder", "layers",
                                                    "layers", "ncu_layers", "original", "original", "profiles",
                                                    "profiles", "scaling"]
    for _, options in commands:
        assert {"--out_dir", "--overwrite"} <= set(options.split()), options


def test_results_name_the_software_they_were_measured_with(monkeypatch):
    gpu = {"torch": "2.11.0+cu130", "cuda": "13.0", "cudnn": 91900, "driver": "580.159.04"}
    assert common.software_text(gpu) == "torch 2.11.0+cu130, CUDA 13.0, cuDNN 9.19.0, driver 580.159.04"
    assert common.software_text({"torch": "2.13.0+cpu", "cuda": None}) == "torch 2.13.0+cpu, CUDA none"  # older files
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: no driver, and no error
    assert common.nvidia_driver() is None and set(common.software()) == {"torch", "cuda", "cudnn", "driver"}
    header = ladder.markdown_table({**gpu, "device": "NVIDIA H200", "command": "python -m benchmarks.ladder",
                                    "date": "2026-11-26", "runs": []}).splitlines()[0]
    assert "on NVIDIA H200 (torch 2.11.0+cu130, CUDA 13.0, cuDNN 9.19.0, driver 580.159.04), 2026-11-26" in header
