"""benchmarks/profiles.py: real short runs of train.py leave traces, a summary and an honest README."""
import gzip
import json

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
    assert summary["kernel_ms_per_step"] == 8.0 and summary["device_busy"] == 0.8
    assert [(k["name"], k["share"], k["calls"]) for k in summary["top_kernels"]] == [("conv", 0.75, 2), ("adam", 0.25, 2)]
