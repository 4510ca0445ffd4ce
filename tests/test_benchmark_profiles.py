"""benchmarks/profiles.py: real short runs of train.py leave traces, a summary and an honest README."""
import gzip
import json
import os

import pytest

from benchmarks import profiles
from figures import tutorial_images as figures

pytestmark = pytest.mark.slow


def test_cpu_preset_keeps_a_trace_per_rung_and_lists_its_command(tmp_path, synthetic_data_dir):
    data_dir = synthetic_data_dir
    out_dir = tmp_path / "profiles"
    [entry] = profiles.main(["--preset", "cpu", "--only", "gpu_inmem", "--steps", "2", "--data_dir", str(data_dir),
                             "--out_dir", str(out_dir), "--work_dir", str(tmp_path / "work")])
    assert "error" not in entry, entry
    assert entry["command"].startswith("python train.py --config=demo --device=cpu")
    assert "--profiler=torch" in entry["command"] and "--data_loader_config=gpu-inmem" in entry["command"]

    with gzip.open(out_dir / entry["file"]) as f:
        trace = json.load(f)
    steps = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation" and e["name"].startswith("step ")]
    assert steps == ["step 6", "step 7"]  # 6 steps an epoch (2 + 4): the window opens with the second
    assert {"forward", "backward", "optimizer"} <= set(entry["phase_ms_per_step"])
    assert all(value > 0 for value in entry["phase_ms_per_step"].values())
    assert profiles.summarise_trace(trace, 2, cuda=True)["error"] == profiles.NO_KERNELS  # as if from a GPU

    index = json.loads((out_dir / "profiles.json").read_text())
    assert index["command"].startswith("python -m benchmarks.profiles --preset cpu") and index["profiles"] == [entry]
    readme = (out_dir / "README.md").read_text()
    assert f"`{entry['file']}`" in readme and entry["command"] in readme and entry["device"] in readme
    assert (out_dir / "gpu_inmem.log").exists()

    [image] = figures.profile_figures(str(out_dir), str(tmp_path))
    assert (tmp_path / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gpu_trace_summary_from_known_kernels():
    # Two steps of 10 ms; kernels of 6 ms and 2 ms in each: 80 % busy, 8 ms of kernels per step.
    events = []
    for step, start in ((0, 0), (1, 10_000)):
        events += [{"ph": "X", "cat": "user_annotation", "name": f"step {step}", "ts": start, "dur": 10_000},
                   {"ph": "X", "cat": "user_annotation", "name": "forward", "ts": start, "dur": 4_000},
                   {"ph": "X", "cat": "kernel", "name": "conv", "ts": start + 100, "dur": 6_000},
                   {"ph": "X", "cat": "kernel", "name": "adam", "ts": start + 7_000, "dur": 2_000}]
    summary = profiles.summarise_trace({"traceEvents": events}, steps=2)
    assert summary["phase_ms_per_step"] == {"step": 10.0, "forward": 4.0}
    # Busy on the GPU's timeline: 16 ms of kernels from the first one's start (0.1 ms) to the last one's
    # end (19 ms), whatever the host's ranges say.
    assert summary["kernel_ms_per_step"] == 8.0 and summary["device_busy"] == round(16_000 / 18_900, 3)
    assert [(k["name"], k["share"], k["calls"]) for k in summary["top_kernels"]] == [("conv", 0.75, 2), ("adam", 0.25, 2)]


def test_device_busy_is_the_union_of_kernel_intervals_on_the_gpu_timeline():
    # Two streams overlap (0-4 and 2-6 ms: 6 ms busy, not 8), then a gap of 2 ms, then 2 ms: 8 of 10 ms.
    kernels = [{"ts": 0, "dur": 4_000}, {"ts": 2_000, "dur": 4_000}, {"ts": 8_000, "dur": 2_000},
               {"ts": 8_500, "dur": 500}]  # inside the one before it: adds nothing
    assert profiles.device_busy(kernels) == 0.8
    # A CUDA graph replayed from a host range of 0.1 ms while its kernels run for 10 ms back to back:
    # the host span would make this 10000 %, the GPU timeline says 100 %.
    replay = [{"ph": "X", "cat": "user_annotation", "name": "step 0", "ts": 0, "dur": 100}] + [
        {"ph": "X", "cat": "kernel", "name": f"k{i}", "ts": 50 + 1_000 * i, "dur": 1_000} for i in range(10)]
    assert profiles.summarise_trace({"traceEvents": replay}, steps=1)["device_busy"] == 1.0


def test_a_gpu_trace_without_kernels_is_reported_not_passed(tmp_path):
    """A GPU run whose trace holds no kernel (CUPTI traced nothing) is an error entry that keeps its trace."""
    trace = {"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "step 8", "ts": 0, "dur": 10}]}
    assert "error" not in profiles.summarise_trace(trace, steps=1)  # a CPU run: no kernels expected
    entry = {"rung": "baseline", "what": "w", "device": "NVIDIA H100", "date": "d", "command": "c",
             "file": "baseline.pt.trace.json.gz", **profiles.summarise_trace(trace, steps=1, cuda=True)}
    assert entry["error"] == profiles.NO_KERNELS
    profiles.write_readme(str(tmp_path), [entry], "t", "c", "d")
    readme = (tmp_path / "README.md").read_text()
    assert "| `baseline.pt.trace.json.gz` | baseline: w |" in readme and "saw no CUDA kernels" in readme


FAKE_NSYS = """#!/bin/sh
# A stand-in for nsys: writes into the -o path the kind of file named beside it (a profiled run's
# environment is not the caller's: nsight.profile_environment).
kind=$(cat "$(dirname "$0")/kind")
while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
touch "$out.$kind"
"""


@pytest.mark.parametrize("kind, works", [("nsys-rep", True), ("qdstrm", False)])
def test_nsys_is_probed_once_before_the_rungs(tmp_path, monkeypatch, kind, works):
    """An nsys that writes a capture but no report (seen on a GPU machine) is not used on any rung."""
    from benchmarks.profiles import probe_nsys

    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir()
    fake.write_text(FAKE_NSYS)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    (fake.parent / "kind").write_text(kind)
    nsys, why = probe_nsys(str(tmp_path / "work"), timeout=30)
    if works:
        assert nsys == str(fake) and why is None
    else:
        assert nsys is None and "made no report" in why and ".qdstrm capture but no .nsys-rep" in why


def test_nsys_and_its_importer_together_end_within_the_limit(tmp_path):
    """An nsys that writes only a .qdstrm capture and an importer that hangs (as seen on a remote GPU machine):
    the try ends at its limit, the importer's time included, and says it made no report. Both are stand-ins
    (this machine has no nsys), scripts that behave as the ones seen did."""
    import time

    nsys = tmp_path / "nsys"
    nsys.write_text('#!/bin/sh\nwhile [ "$1" != "-o" ]; do shift; done\ntouch "$2.qdstrm"; sleep 5\n')
    importer = tmp_path / "QdstrmImporter"
    importer.write_text("#!/bin/sh\nsleep 60\n")
    for script in (nsys, importer):
        script.chmod(0o755)
    started = time.monotonic()
    result = profiles.try_nsys(str(nsys), ["-c", "pass"], str(tmp_path / "probe"), str(tmp_path / "log"), timeout=7)
    assert time.monotonic() - started < 10  # 7 s and the ends of the processes: not 5 s of nsys + 7 of the importer
    assert "wrote a .qdstrm capture but no .nsys-rep report (QdstrmImporter failed)" in result["error"]
    # The capture stays, for the importer of its version elsewhere (python -m benchmarks.nsight import).
    assert result["capture"] == "probe.qdstrm" and (tmp_path / "probe.qdstrm").is_file()
    assert "python -m benchmarks.nsight import probe.qdstrm" in result["error"]
    assert "timed out" in result["error"]


def test_the_dali_rung_is_profiled_where_dali_imports_and_said_not_to_be_elsewhere(capsys):
    assert profiles.gpu_rungs(True) == profiles.GPU_RUNGS + [profiles.DALI_RUNG]
    assert "dali-lowmem" in " ".join(profiles.DALI_RUNG[3]) and profiles.written_here("dali_bf16_fused.log")
    capsys.readouterr()
    assert profiles.gpu_rungs(False) == profiles.GPU_RUNGS
    assert capsys.readouterr().out.startswith("dali_bf16_fused: not profiled, DALI does not import here")
