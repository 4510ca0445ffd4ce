"""The end of a run: loss_curves.png from the losses it logged, and the demo's closing comparison with
the README's final validation loss (train.py's report_losses)."""
import logging

from torch.utils.tensorboard import SummaryWriter

import train
from utils.YParams import load_params


def logged_run(run_dir, valid=(0.12, 0.03, 0.0175)):
    writer = SummaryWriter(str(run_dir / "logs"))
    for step, value in zip((0, 64, 128), valid):
        writer.add_scalar("Loss/valid", value, step)
        writer.add_scalar("Loss/train", 1.1 * value, step)
    writer.close()


def test_the_demo_says_its_final_loss_beside_the_readmes_and_draws_its_curves(tmp_path, caplog):
    logged_run(tmp_path)
    params = load_params(["--config=demo", "--device=cpu", "--train_path=elsewhere.h5"])
    with caplog.at_level(logging.INFO):
        train.report_losses(str(tmp_path), params)
    assert "The demo's expected final validation loss is 0.0174 (README, 2 CPU threads): yours is 0.017500 (" \
        in caplog.text
    assert (tmp_path / "loss_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_comparison_for_other_options_or_configs_and_no_curves_without_images(tmp_path, caplog):
    logged_run(tmp_path)
    for argv in (["--config=demo", "--num_epochs=8", "--preview_image=false"], ["--config=test"]):
        with caplog.at_level(logging.INFO):
            train.report_losses(str(tmp_path), load_params(argv))
    assert "expected final validation loss" not in caplog.text
    assert not (tmp_path / "loss_curves.png").exists()  # test and the demo above: no preview images
