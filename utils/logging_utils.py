"""Log lines (screen and ``out.log``) and TensorBoard, on the main rank only.

The format is the original tutorial's, e.g.
``2026-11-21 12:00:00,000 - root - INFO - Time taken for epoch 1 is 30.1 sec, avg 17.0 samples/sec``.
"""
import logging
import sys

FORMAT = "%(asctime)s - %(name)s - %(levelname)s - %(message)s"


def config_logger(is_main):
    """Log INFO to stdout on the main rank; other ranks log only warnings and errors."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(handler)
    root.setLevel(logging.INFO if is_main else logging.WARNING)


def log_to_file(path):
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(FORMAT))
    logging.getLogger().addHandler(handler)


class TensorBoard:
    """A ``SummaryWriter`` on the main rank; on other ranks every call does nothing."""

    def __init__(self, log_dir, enabled):
        self.writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=log_dir)

    def scalar(self, name, value, step):
        if self.writer is not None:
            self.writer.add_scalar(name, value, step)

    def image(self, name, image, step):
        """``image``: an (H, W, 3) uint8 array."""
        if self.writer is not None:
            self.writer.add_image(name, image, step, dataformats="HWC")

    def flush(self):
        if self.writer is not None:
            self.writer.flush()

    def close(self):
        if self.writer is not None:
            self.writer.close()
