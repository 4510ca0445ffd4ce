"""Nsight Systems for real: Debian's 2022.4 CLI profiles a train.py run, a raw capture becomes a report with its
importer, and the committed reports read back as the folders' READMEs say (benchmarks/nsight.py).

The machine's nsys, or Debian's unpacked by tests/nsight_cli.py. No GPU: on a CPU nsys records the run's
calls into the OS (its NVTX ranges need a CUDA build of PyTorch, its kernels a GPU).
"""
import glob
import json
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from conftest import ROOT, timeout_for, unavailable
from benchmarks import nsight
from nsight_cli import ensure_nsys

REPORTS = sorted(glob.glob(os.path.join(ROOT, "sample_nsys_profiles", "**", "*.nsys-rep"), recursive=True))


@pytest.fixture(scope="module")
def nsys():
    return ensure_nsys()


def sqlite_of(nsys, report, folder):
    return sqlite3.connect(nsight.export_sqlite(nsys, report, os.path.join(folder, "report.sqlite")))


def test_a_profiled_run_keeps_what_it_needs_of_the_environment():
    """A report stores its processes' environments: the run's keeps its paths and CUDA's, NCCL's and the
    threads' settings, and none of the rest."""
    environment = nsight.profile_environment({
        "PATH": f"/home/someone/.cargo/bin:/usr/local/cuda/bin:{os.path.dirname(sys.executable)}:/usr/bin:/bin",
        "HOME": "/home/someone", "CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "2",
        "SLURM_PROCID": "0", "API_TOKEN": "secret", "SSH_AUTH_SOCK": "/tmp/agent"})
    assert environment == {
        "PATH": f"/usr/local/cuda/bin:{os.path.dirname(sys.executable)}:/usr/bin:/bin", "HOME": "/home/someone",
        "CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "2", "SLURM_PROCID": "0"}


@pytest.mark.slow
def test_the_profiles_tool_makes_a_report_of_a_cpu_run_and_reads_it_back(nsys, tmp_path, monkeypatch,
                                                                        synthetic_data_dir):
    """`python -m benchmarks.profiles --preset cpu --nsys`: beside the torch trace, a .nsys-rep of the same
    rung, which lists the run's own processes in the environment it needs (a variable planted here is not
    in it), and whose OS-call table (nsys stats) profiles.json and the README give."""
    monkeypatch.setenv("PLANTED_FOR_THE_TEST", "must-not-be-in-the-report")
    out = tmp_path / "profiles"
    command = [sys.executable, "-m", "benchmarks.profiles", "--preset", "cpu", "--nsys", "--only", "baseline",
               "--steps", "2", "--out_dir", str(out), "--work_dir", str(tmp_path / "work"),
               "--data_dir", str(synthetic_data_dir)]
    outsider = tmp_path / "outsider-proc"  # a process of the machine, not of the run, alive all along
    shutil.copy(shutil.which("sleep"), outsider)
    with subprocess.Popen([str(outsider), "600"]) as beside:
        try:
            result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(180))
        finally:
            beside.kill()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [entry] = json.loads((out / "profiles.json").read_text())["profiles"]
    report = entry["nsys"]
    assert report["file"] == "baseline.nsys-rep" and (out / report["file"]).is_file()
    assert report["command"].startswith("nsys profile --trace=osrt --sample=none --cpuctxsw=none -f true -o baseline "
                                        "python train.py --config=demo")
    calls = {row["name"]: row for row in report["tables"]["osrt"]}
    assert calls and report["tables"]["kernels"] == [] and report["tables"]["nvtx"] == []
    assert abs(sum(row["share"] for row in report["tables"]["osrt"]) - 1) < 0.1  # the 8 largest of the calls' time
    readme = (out / "README.md").read_text()
    assert nsight.summary_text(report["tables"]) in readme

    database = sqlite_of(nsys, str(out / report["file"]), str(tmp_path))
    processes = [name for _, _, name in database.execute("SELECT * FROM PROCESSES")]
    strings = [value for (value,) in database.execute("SELECT value FROM StringIds")]
    assert not any("must-not-be-in-the-report" in value for value in strings)
    assert any(name.endswith("python") for name in processes)
    if report["processes"] == "its own processes":
        # numbered in a namespace of their own, from nsys as its first process; the process that ran beside
        # the whole profile is not among them. (The run's children may be: a library may call `uname`.)
        assert (1, "nsys") in [(pid, name) for _, pid, name in database.execute("SELECT * FROM PROCESSES")]
        assert "outsider-proc" not in [os.path.basename(name) for name in processes], processes
    else:  # no PID namespace on this machine: said so, and the report lists the others too
        assert report["processes"].startswith("every process of the machine")


def test_a_run_after_a_killed_session_still_makes_its_report(nsys, tmp_path):
    """nsys keeps its sessions' state by process id in /dev/shm and /tmp/nvidia, and every PID namespace
    numbers its processes from 1: a session killed in a namespace of its own (a time limit, Ctrl-C) leaves
    state at the ids the next namespaced run gets, which then ends "Agent launcher failed". Each run's
    state is its own (nsight.PRIVATE_STATE), so the next run makes its report."""
    import signal
    import time

    from benchmarks import profiles

    scope = nsight.own_processes()
    if not scope:
        unavailable("no PID namespace of its own here (unshare --pid fails): the runs see the machine's process ids")
    state = ["/dev/shm", "/tmp/nvidia/nsight_systems"]
    before = {folder: set(os.listdir(folder)) if os.path.isdir(folder) else set() for folder in state}
    killed = subprocess.Popen(  # the machine's /dev/shm and /tmp/nvidia, as a plain namespaced nsys has them
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", nsys, "profile", "--trace=osrt",
         "--sample=none", "--cpuctxsw=none", "-o", str(tmp_path / "killed"), sys.executable, "-c",
         "import time; time.sleep(60)"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(5)  # its session has started
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
        result = profiles.try_nsys(nsys, ["-c", "pass"], str(tmp_path / "next"), str(tmp_path / "next.log"),
                                   timeout_for(60), cuda=False)
        assert result == {"file": "next.nsys-rep", "processes": "its own processes"}, \
            (tmp_path / "next.log").read_text()[-2000:]
    finally:  # the killed session's leftovers, which would stop the next plain namespaced nsys on this machine
        for folder in state:
            for name in set(os.listdir(folder) if os.path.isdir(folder) else ()) - before[folder]:
                path = os.path.join(folder, name)
                if os.path.isdir(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)


def test_a_raw_capture_becomes_a_report_with_the_importer(nsys, tmp_path):
    """An nsys whose host half is missing (a target-only copy, as on the GPU machine) writes a .qdstrm and no
    report; `python -m benchmarks.nsight import` turns it into one, which nsys stats reads."""
    target = os.path.dirname(os.path.realpath(nsys))
    if not nsight.importers(nsys):
        unavailable(f"{nsys} has no QdstrmImporter beside it: the unpacked Nsight Systems lacks its host half")
    alone = tmp_path / "target-linux-x64"
    copied = subprocess.run(["cp", "-al", target, str(alone)], capture_output=True)  # hard links: no 180 MB copy
    if copied.returncode != 0:
        shutil.copytree(target, alone, symlinks=True)
    capture = tmp_path / "sleep"
    subprocess.run([str(alone / "nsys"), "profile", "--trace=osrt", "--sample=none", "--cpuctxsw=none", "-o",
                    str(capture), sys.executable, "-c", "import time; time.sleep(0.3)"],
                   capture_output=True, timeout=timeout_for(120), env=nsight.profile_environment())
    assert (tmp_path / "sleep.qdstrm").is_file() and not (tmp_path / "sleep.nsys-rep").exists()

    result = subprocess.run([sys.executable, "-m", "benchmarks.nsight", "import", str(tmp_path / "sleep.qdstrm"),
                             "--nsys", nsys], cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(120))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "sleep.nsys-rep")
    calls = {row["name"]: row for row in nsight.summary(nsys, str(tmp_path / "sleep.nsys-rep"))["osrt"]}
    assert "clock_nanosleep" in calls and 290 <= calls["clock_nanosleep"]["ms"] < 1000


def test_an_import_without_an_importer_says_what_to_run(tmp_path):
    """A target-only nsys has no QdstrmImporter: the import ends in one paragraph that says how to get one."""
    nsys = tmp_path / "target-linux-x64" / "nsys"
    nsys.parent.mkdir()
    nsys.write_text("#!/bin/sh\n")
    nsys.chmod(0o755)
    capture = tmp_path / "run.qdstrm"
    capture.write_bytes(b"\0")
    result = subprocess.run([sys.executable, "-m", "benchmarks.nsight", "import", str(capture), "--nsys", str(nsys)],
                            cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(60))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "No QdstrmImporter beside" in result.stderr and "python -m benchmarks.nsight install" in result.stderr


def committed_entry(report):
    """The profiles.json entry of a committed report: the run that made it."""
    with open(os.path.join(os.path.dirname(report), "profiles.json")) as f:
        entries = json.load(f)["profiles"]
    [entry] = [entry for entry in entries if entry.get("nsys", {}).get("file") == os.path.basename(report)]
    return entry


def test_sample_nsys_profiles_holds_nsight_reports():
    assert REPORTS, "no .nsys-rep under sample_nsys_profiles/"


@pytest.mark.parametrize("report", REPORTS, ids=[os.path.relpath(path, ROOT) for path in REPORTS])
def test_a_committed_report_reads_back_as_its_readme_says(nsys, report):
    """nsys stats, run on the committed report now, gives the tables its folder's profiles.json and README
    quote: the kernels and their shares, the NVTX ranges, the OS calls."""
    entry = committed_entry(report)
    quoted = entry["nsys"]["tables"]
    read = nsight.summary(nsys, report)
    for key in ("kernels", "nvtx", "osrt"):
        assert [row["name"] for row in read[key]] == [row["name"] for row in quoted[key]], key
        for now, then in zip(read[key], quoted[key]):
            assert now["count"] == then["count"] and now["share"] == pytest.approx(then["share"], abs=0.002)
            assert now["ms"] == pytest.approx(then["ms"], rel=1e-3)
    with open(os.path.join(os.path.dirname(report), "README.md")) as f:
        assert nsight.summary_text(quoted) in f.read()


def test_the_committed_reports_timelines_are_drawn_from_their_sqlite(nsys, tmp_path):
    """make figures draws each committed report's timeline from its SQLite export: a CPU report's rows are
    its busiest OS calls; the images the docs show are these."""
    import sqlite3

    from figures import tutorial_images as figures

    folders = sorted({os.path.dirname(report) for report in REPORTS})
    written = [name for folder in folders for name in figures.nsys_figures(folder, str(tmp_path))]
    assert written and all((tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in written)
    for name in written:
        assert (tmp_path / name).stat().st_size > 10_000  # a drawn timeline, not an empty canvas
    cpu = os.path.join(ROOT, "sample_nsys_profiles", "cpu", "baseline.nsys-rep")
    rows = figures.nsys_rows(sqlite3.connect(nsight.export_sqlite(nsys, cpu, str(tmp_path / "cpu.sqlite"))))
    quoted = committed_entry(cpu)["nsys"]["tables"]["osrt"]
    assert list(rows) == [f"OS: {row['name']}" for row in quoted[:6]]  # the same calls, in the same order
    assert [len(rows[f"OS: {row['name']}"]) for row in quoted[:6]] == [row["count"] for row in quoted[:6]]


def test_the_going_further_chapter_quotes_the_committed_cpu_reports():
    """docs/09's figures for the two CPU reports are those their profiles.json records, and so is their date."""
    import quotes

    text = quotes.section("docs/09-going-further.md", "Nsight Systems on a CPU")
    folder = os.path.join(ROOT, "sample_nsys_profiles", "cpu")
    calls = {os.path.basename(report): {row["name"]: row for row in committed_entry(report)["nsys"]["tables"]["osrt"]}
             for report in (os.path.join(folder, "baseline.nsys-rep"), os.path.join(folder, "gpu_inmem.nsys-rep"))}
    baseline, inmem = calls["baseline.nsys-rep"], calls["gpu_inmem.nsys-rep"]
    quotes.assert_quoted(text, baseline["poll"]["count"], f"{baseline['poll']['ms']:.1f}",
                         baseline["fork"]["count"], f"{baseline['sem_wait']['ms']:.1f}",
                         inmem["pread64"]["count"], f"{inmem['pread64']['ms']:.1f}")
    dates = {entry["date"][:10] for entry in json.load(open(os.path.join(folder, "profiles.json")))["profiles"]}
    assert len(dates) == 1 and dates.pop() in text
