"""`make figures`: the tutorial's images are remade from the committed example logs and results."""
import os
import re
import shutil
import subprocess

import pytest

from conftest import ROOT, timeout_for
from readme_commands import tutorial_text
from benchmarks import nsight
from figures import tutorial_images as figures

pytestmark = pytest.mark.slow


def assert_drawn(path):
    """A PNG of a chart with something plotted: at least 400 x 250 pixels, dark pixels (axes, labels) and
    coloured ones (the data: every chart here draws its curves, bars and images in colour) over at least
    0.5% of it each. The charts made from the committed logs have 1.2% to 58% coloured pixels (2026-11-27);
    an empty axes has none."""
    import matplotlib.image
    import numpy as np

    pixels = matplotlib.image.imread(str(path))[..., :3]
    height, width = pixels.shape[:2]
    colour = (pixels.max(axis=2) - pixels.min(axis=2) > 60 / 255).mean()
    dark = (pixels.max(axis=2) < 100 / 255).mean()
    assert width >= 400 and height >= 250, (path.name, width, height)
    assert colour >= 0.005 and dark >= 0.005, (path.name, float(colour), float(dark))
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50, path.name  # not a flat canvas


def test_figures_are_made_from_the_example_logs(tmp_path):
    figures.main(["--out_dir", str(tmp_path), "--no_browser"])
    for name in ("demo_loss_curves.png", "demo_preview.png", "demo_power_spectrum.png"):
        assert_drawn(tmp_path / name)
    results = sorted(os.listdir(os.path.join(ROOT, "benchmarks", "results")))
    charts = [f"ladder_{name[:-5]}.png" for name in results if name.endswith(".json")]
    assert charts, "benchmarks/results holds at least the CPU ladder"
    for name in charts:  # one bar chart per committed benchmark result
        assert_drawn(tmp_path / name)
    # Every image the README shows comes out of make figures (the screenshot needs the browser, skipped here).
    shown = {os.path.basename(path)  # README.md and its chapters in docs/ (which link ../tutorial_images/)
             for path in re.findall(r"!\[[^\]]*\]\((?:\.\./)?(tutorial_images/[^)]+)\)", tutorial_text(ROOT))}
    assert {"large_batch_loss.png", "scaling_cpu-vm-2-cores-2026-11-25.png"} <= shown
    # The Nsight Systems timelines need an nsys to export the reports (tests/test_nsight.py draws them with one).
    needs = {name for name in shown if name.startswith("nsys_")} if nsight.find_nsys() is None else set()
    # The Nsight Systems GUI's pictures come from figures/nsight_gui.py (tests/test_nsight_gui.py remakes them).
    gui = {name for name in shown if name.startswith("nsys_gui_")}
    assert shown - {"tensorboard_scalars.png"} - needs - gui <= set(os.listdir(tmp_path)), shown - set(os.listdir(tmp_path))
    for name in shown & set(os.listdir(tmp_path)):
        assert_drawn(tmp_path / name)


def test_example_logs_are_a_complete_demo_run():
    events = figures.load_events(f"{ROOT}/example_logs/demo/logs")
    assert {"Loss/train", "Loss/valid", "Learning Rate", "Avg iters per sec"} <= set(events.Tags()["scalars"])
    valid = events.Scalars("Loss/valid")
    assert valid[0].step == 0 and valid[-1].value <= 0.5 * valid[0].value


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_figures_installs_playwright_not_the_test_set(tmp_path):
    """make's own plan (make -n) for a fresh .venv: Playwright alone, not requirements-test.txt (DALI, ~1 GB)."""
    plan = subprocess.run(["make", "-n", "figures", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout_for(60), env={k: v for k, v in os.environ.items() if not k.startswith("MAKE")})
    assert plan.returncode == 0, plan.stderr
    assert "pip install --quiet playwright" in plan.stdout and "requirements-test.txt" not in plan.stdout, plan.stdout
    assert plan.stdout.strip().splitlines()[-1].endswith("-m figures.tutorial_images")


def test_a_gpu_timeline_shows_the_kernels_the_steps_launched_however_late_they_ran():
    # The H100's CUDA-graph trace: two steps launch in about 2 ms, their kernels run for about 90 ms.
    import gzip
    import json

    with gzip.open(os.path.join(ROOT, "sample_nsys_profiles", "gpu_inmem_bf16_graph.pt.trace.json.gz")) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("step ")),
                   key=lambda e: e["ts"])[:2]
    start, end = steps[0]["ts"], steps[1]["ts"] + steps[1]["dur"]
    kernels = figures.launched_kernels(events, start, end)
    late = max(e["ts"] + e["dur"] for e in kernels)
    assert late - start > 20 * (end - start)  # the device runs far behind the graph launches
    assert all(e["ts"] >= start for e in kernels)
    # Those started within the host's window alone would miss nearly all of the graphs' kernels.
    assert len(kernels) > 10 * len([e for e in events if e.get("cat") == "kernel" and start <= e["ts"] < end])


def test_profile_images_are_named_by_their_folder_in_the_repository():
    assert figures.profile_tag(os.path.join(ROOT, "sample_nsys_profiles")) == "sample_nsys_profiles"
    assert figures.profile_tag(os.path.join(ROOT, "sample_nsys_profiles", "dali")) == "sample_nsys_profiles_dali"
    assert figures.profile_tag(os.path.join(ROOT, "example_logs", "cpu_profiles")) == "cpu_profiles"
    assert figures.profile_tag(os.path.join(os.path.dirname(ROOT), "elsewhere", "traces")) == "traces"
