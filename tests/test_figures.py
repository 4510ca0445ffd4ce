"""`make figures`: the tutorial's images are remade from the committed example logs and results."""
import os
import re
import shutil
import subprocess

import pytest

from conftest import ROOT
from readme_commands import tutorial_text
from figures import tutorial_images as figures

pytestmark = pytest.mark.slow


def test_figures_are_made_from_the_example_logs(tmp_path):
    figures.main(["--out_dir", str(tmp_path), "--no_browser"])
    for name in ("demo_loss_curves.png", "demo_preview.png", "demo_power_spectrum.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert (tmp_path / "demo_preview.png").stat().st_size > 10_000  # a real picture, not an empty canvas
    results = sorted(os.listdir(os.path.join(ROOT, "benchmarks", "results")))
    charts = [f"ladder_{name[:-5]}.png" for name in results if name.endswith(".json")]
    assert charts, "benchmarks/results holds at least the CPU ladder"
    for name in charts:  # one bar chart per committed benchmark result
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    # Every image the README shows comes out of make figures (the screenshot needs the browser, skipped here).
    shown = {os.path.basename(path)  # README.md and its chapters in docs/ (which link ../tutorial_images/)
             for path in re.findall(r"!\[[^\]]*\]\((?:\.\./)?(tutorial_images/[^)]+)\)", tutorial_text(ROOT))}
    assert {"large_batch_loss.png", "scaling_cpu-vm-2-cores-2026-11-25.png"} <= shown
    assert shown - {"tensorboard_scalars.png"} <= set(os.listdir(tmp_path)), shown - set(os.listdir(tmp_path))


def test_example_logs_are_a_complete_demo_run():
    events = figures.load_events(f"{ROOT}/example_logs/demo/logs")
    assert {"Loss/train", "Loss/valid", "Learning Rate", "Avg iters per sec"} <= set(events.Tags()["scalars"])
    valid = events.Scalars("Loss/valid")
    assert valid[0].step == 0 and valid[-1].value <= 0.5 * valid[0].value


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_figures_installs_playwright_not_the_test_set(tmp_path):
    """make's own plan (make -n) for a fresh .venv: Playwright alone, not requirements-test.txt (DALI, ~1 GB)."""
    plan = subprocess.run(["make", "-n", "figures", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={k: v for k, v in os.environ.items() if not k.startswith("MAKE")})
    assert plan.returncode == 0, plan.stderr
    assert "pip install --quiet playwright" in plan.stdout and "requirements-test.txt" not in plan.stdout, plan.stdout
    assert plan.stdout.strip().splitlines()[-1].endswith("-m figures.tutorial_images")
