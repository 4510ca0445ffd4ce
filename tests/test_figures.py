"""`make figures`: the tutorial's images are remade from the committed example logs."""
import pytest

from conftest import ROOT
from utils import figures

pytestmark = pytest.mark.slow


def test_figures_are_made_from_the_example_logs(tmp_path):
    figures.main(["--out_dir", str(tmp_path), "--no_browser"])
    for name in ("demo_loss_curves.png", "demo_preview.png", "demo_power_spectrum.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert (tmp_path / "demo_preview.png").stat().st_size > 10_000  # a real picture, not an empty canvas


def test_example_logs_are_a_complete_demo_run():
    events = figures.load_events(f"{ROOT}/example_logs/demo/logs")
    assert {"Loss/train", "Loss/valid", "Learning Rate", "Avg iters per sec"} <= set(events.Tags()["scalars"])
    valid = events.Scalars("Loss/valid")
    assert valid[0].step == 0 and valid[-1].value <= 0.5 * valid[0].value
