"""benchmarks/suite/preflight.py, the GPU suite's first command: on this CPU machine it runs its CPU half for
real and names what it skipped; its compiler check finds a missing compiler or Python.h."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from benchmarks import ladder
from benchmarks.suite import preflight
from conftest import ROOT, timeout_for


def test_the_cpu_half_runs_and_names_what_it_skipped(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the GPU half runs instead")
    out = tmp_path / "preflight.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.suite.preflight", "--out_dir", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=timeout_for(120))
    assert result.returncode == 0, result.stdout + result.stderr
    printed = [line for line in result.stdout.splitlines() if line.startswith("preflight: ")]
    # the CUDA its build was made for (None for a CPU build; PyPI's torch 2.4.1 for Linux is a CUDA build), no cuDNN
    assert printed[0].startswith(f"preflight: torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN none")
    assert any(line.startswith("preflight: /dev/shm: ") for line in printed)
    assert any(line.startswith("preflight: torch.compile: ") for line in printed)
    assert any(line.startswith("preflight: DALI: ") for line in printed)
    assert any(line.startswith("preflight: nsys: ") for line in printed)
    skipped = [line for line in printed if line.startswith("preflight: skipped: ")]
    assert len(skipped) >= 3 and all("no CUDA GPU" in line for line in skipped)  # + nsys's report, where found
    facts = json.loads(out.read_text())
    assert facts["passed"] and facts["gpu"] is None and facts["profiler"]["cpu_ops"] > 0
    assert facts["profiler"]["kernels"] == 0 and facts["shm_free_gb"] > 0
    assert set(facts["skipped"]) >= {"GPU name and free memory", "a bf16 Conv3d forward and backward on the GPU",
                                     "CUDA kernel events in the profiler trace"}


def test_a_missing_compiler_or_failing_build_is_named(monkeypatch, tmp_path):
    assert preflight.compile_problem() is None  # this machine has gcc and the headers
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    assert "needs a C compiler" in preflight.compile_problem()
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'fatal error: Python.h: No such file or directory' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    assert "Python.h: No such file or directory" in preflight.compile_problem()
    # The ladder skips its compile rung with that line, and keeps the others.
    compile_rung = next(rung for rung in ladder.GPU_RUNGS if "--jit_mode=compile" in rung.options)
    assert "Python.h" in ladder.skip_reason(compile_rung)
    assert ladder.skip_reason(ladder.GPU_RUNGS[0]) is None


def test_a_run_past_its_limit_ends_with_all_its_children(tmp_path):
    """The nsys probe (and every run of the benchmark tools) is ended at its limit with the processes it
    started: a profiler's daemon or a launcher's ranks must not outlive it and hold the GPU."""
    from benchmarks.common import run

    pid_file = tmp_path / "child.pid"
    started = time.monotonic()
    outcome = run(["bash", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], str(tmp_path / "log"), timeout=2)
    assert outcome == "timed out after 2 s" and time.monotonic() - started < 10
    child = int(pid_file.read_text())
    assert not alive(child)


def alive(pid):
    """Whether ``pid`` still runs: a zombie (ended, waiting for an init that may never reap it) does not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_runtime_requirement_that_does_not_import_is_named(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# comment\ntorch>=2.4\npyyaml\nnumpy  # the arrays\nno_such_package_here>=1.0\n"
                            "ruamel.no_such_module\n")
    assert preflight.missing_requirements(str(requirements)) == ["no_such_package_here", "ruamel.no_such_module"]
    assert preflight.missing_requirements() == []  # this machine has requirements.txt's packages


def test_each_check_is_written_as_it_finishes(tmp_path):
    """A preflight stopped at its step's limit keeps what it found: preflight.json holds each check by the time
    its line is printed, long before the end (nsys's probe, the slowest check, comes last)."""
    out = tmp_path / "preflight.json"
    process = subprocess.Popen([sys.executable, "-m", "benchmarks.suite.preflight", "--out_dir", str(tmp_path)], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True)
    seen = {}
    for text in process.stdout:
        for prefix, key in (("preflight: /dev/shm", "shm_free_gb"), ("preflight: torch.compile", "compile_problem"),
                            ("preflight: torch profiler", "profiler")):
            if text.startswith(prefix):
                seen[key] = json.loads(out.read_text())  # read at once, while the preflight goes on
    assert process.wait(timeout=timeout_for(120)) == 0
    assert "shm_free_gb" in seen["shm_free_gb"] and "profiler" not in seen["shm_free_gb"]
    assert "compile_problem" in seen["compile_problem"] and "passed" not in seen["compile_problem"]
    assert "profiler" in seen["profiler"] and "dali" not in seen["profiler"]
    assert json.loads(out.read_text())["passed"]


def test_the_16_bit_convolutions_findings_and_the_precision_that_runs(monkeypatch):
    """MFU is measured against the peak of the precision the 3-D convolutions run in: fp32 where this PyTorch
    and cuDNN turn TF32 off for them (utils/conv3d.py's table), TF32 elsewhere."""
    from utils.conv3d import running_precision

    cuda = torch.device("cuda")
    monkeypatch.setattr(torch, "__version__", "2.9.1+cu130")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91100)  # cuDNN 9.11: TF32 off for 3-D convolutions
    assert running_precision("none", True, cuda) == "fp32"
    assert running_precision("bf16", True, cuda) == "bf16" and running_precision("none", False, cuda) == "fp32"
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91600)  # fixed
    assert running_precision("none", True, cuda) == "tf32"
    assert running_precision("none", True, torch.device("cpu")) == "fp32"  # no TF32 on a CPU
    facts = {"compile_problem": None, "nsys": {"path": None}, "dali": None, "profiler": {"ok": True},
             "conv3d": {"bf16": {"on_cudnn": False}, "fp16": {"on_cudnn": True}, "tf32_runs_as": "fp32"}}
    [said] = preflight.decisions(facts)
    assert "the bf16 rungs get one short trial each, marked slow" in said and "FP32 peak" in said


def test_a_file_for_the_output_folder_is_refused_in_one_paragraph(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("a file of the user's\n")
    result = subprocess.run([sys.executable, "-m", "benchmarks.suite.preflight", "--out_dir", str(taken)], cwd=ROOT,
                            capture_output=True, text=True, timeout=timeout_for(120))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    message = " ".join(result.stderr.split())  # wrapped to the terminal's width
    assert "is a file, not a folder" in message and "Pass --out_dir=<a folder>" in message
    assert taken.read_text() == "a file of the user's\n" and result.stdout == ""  # nothing ran, nothing overwritten


def fake_nsys(folder):
    """An nsys laid out as Nsight Compute's target-only copy is (host/target-linux-x64/nsys), which leaves a mark
    if it is ever run."""
    target = folder / "host" / "target-linux-x64"
    target.mkdir(parents=True)
    nsys = target / "nsys"
    nsys.write_text(f"#!/bin/sh\ntouch {folder}/ran\nexit 1\n")
    nsys.chmod(0o755)
    return nsys


def test_a_target_only_nsys_is_not_probed(monkeypatch, tmp_path):
    """An nsys with no QdstrmImporter beside it writes raw captures, never a report: the preflight says so at
    once, without the probe's seconds, and the profiles stage then runs without Nsight Systems. With an importer
    in a sibling host folder, it is a full installation, probed where a GPU is (here: none)."""
    nsys = fake_nsys(tmp_path)
    monkeypatch.setenv("PATH", f"{nsys.parent}:{os.environ['PATH']}")
    facts = preflight.run_checks(nsys_timeout=5)
    assert facts["nsys"] == {"path": str(nsys), "report": False, "why": preflight.NO_IMPORTER, "seconds": 0.0}
    assert not (tmp_path / "ran").exists()
    assert preflight.line(facts, "nsys").endswith(f"no report: {preflight.NO_IMPORTER} (0.0 s)")
    assert "profiles without Nsight Systems" in preflight.decisions(facts)[0]
    importer = tmp_path / "host" / "host-linux-x64" / "QdstrmImporter"
    importer.parent.mkdir()
    importer.write_text("")
    facts = preflight.run_checks(nsys_timeout=5)
    assert facts["nsys"] == {"path": str(nsys)} and facts["skipped"]["nsys report"] == "no CUDA GPU to profile"
