"""Progress of long phases: a tqdm bar on a terminal, a log line at least every interval otherwise."""
import fcntl
import logging
import os
import pty
import struct
import subprocess
import sys
import termios
import time

import pytest

from conftest import ROOT, timeout_for
from utils.progress import Progress


class SlowBatches:
    """Five batches that take ``seconds`` each, with a length, as a DataLoader has."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __len__(self):
        return 5

    def __iter__(self):
        for batch in range(5):
            time.sleep(self.seconds)
            yield batch


def test_without_a_terminal_a_line_is_logged_every_interval_even_within_one_slow_batch(caplog):
    caplog.set_level(logging.INFO)
    progress = Progress(terminal=False, every_seconds=0.2)
    assert list(progress(SlowBatches(0.3), "epoch 1")) == [0, 1, 2, 3, 4]
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) >= 5, lines  # 1.5 s in all: about 7 lines
    assert lines[0] == "  epoch 1: 0 of 5 batches done after 0.0 min"  # inside the first batch
    assert any(" of 5 batches done after " in line and "min left" in line for line in lines[1:]), lines
    time.sleep(0.5)
    assert len(caplog.records) == len(lines)  # the timer ended with the phase


def test_the_first_line_comes_after_the_first_seconds_not_the_first_interval(caplog):
    caplog.set_level(logging.INFO)
    progress = Progress(terminal=False, every_seconds=60, first_seconds=0.2)
    start = time.monotonic()
    assert list(progress(SlowBatches(0.15), "epoch 1")) == [0, 1, 2, 3, 4]
    assert time.monotonic() - start < 5  # the phase took 0.75 s, well inside the first minute ...
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("  epoch 1: 1 of 5 batches done after 0.0 min, about"), lines


def test_a_rank_other_than_0_shows_nothing(caplog):
    caplog.set_level(logging.INFO)
    batches = SlowBatches(0)
    assert Progress(enabled=False, every_seconds=0.01)(batches, "epoch 1") is batches
    assert not caplog.records


@pytest.mark.slow
def test_a_run_on_a_terminal_draws_bars_for_training_and_validation(data_files, tmp_path):
    """train.py with its stderr on a pseudo-terminal, as in an interactive shell."""
    main_end, terminal_end = pty.openpty()
    fcntl.ioctl(terminal_end, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24 rows, 100 columns
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), "--config=test",
                                f"--train_path={data_files['train']}", f"--val_path={data_files['valid']}",
                                f"--expdir={tmp_path}", "--num_epochs=1"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=terminal_end, text=True)
    os.close(terminal_end)
    drawn = b""
    while True:
        try:
            chunk = os.read(main_end, 4096)
        except OSError:  # the process closed the terminal
            break
        if not chunk:
            break
        drawn += chunk
    stdout = process.communicate(timeout=timeout_for(300))[0]
    os.close(main_end)
    assert process.returncode == 0, stdout[-3000:] + drawn.decode(errors="replace")[-3000:]
    drawn = drawn.decode(errors="replace")
    assert "epoch 1: 100%" in drawn and "4/4" in drawn, drawn[-2000:]
    assert "validation: 100%" in drawn and "2/2" in drawn, drawn[-2000:]
    assert "batches done after" not in stdout  # log lines only without a terminal
