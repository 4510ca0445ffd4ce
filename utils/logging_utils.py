"""Log lines (screen and ``out.log``) and TensorBoard, on the main rank only.

The format is the original tutorial's, e.g.
``2026-11-21 12:00:00,000 - root - INFO - Time taken for epoch 1 is 30.1 sec, avg 17.0 samples/sec``.
"""
import logging
import logging.handlers
import sys

FORMAT = "%(asctime)s - %(name)s - %(levelname)s - %(message)s"

# The lines logged before the run directory exists, kept for out.log. A run refused during set-up
# writes nothing at all, so the directory is created only once everything could be built.
_early_lines = None

# ``extra=`` of a log call whose line goes to out.log only (the configuration block), or to the screen only.
FILE_ONLY = {"where": "file"}
SCREEN_ONLY = {"where": "screen"}


def config_logger(is_main):
    """Log INFO to stdout on the main rank; other ranks log only warnings and errors."""
    global _early_lines
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(lambda record: getattr(record, "where", "screen") == "screen")
    root.addHandler(handler)
    # Never flushed on its own (no target yet, flush level above CRITICAL): log_to_file empties it.
    _early_lines = logging.handlers.MemoryHandler(capacity=100_000, flushLevel=logging.CRITICAL + 1)
    _early_lines.addFilter(for_the_file)
    root.addHandler(_early_lines)
    root.setLevel(logging.INFO if is_main else logging.WARNING)


def log_to_file(path):
    """From now on also log to ``path``, starting with the lines logged since :func:`config_logger`."""
    global _early_lines
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(for_the_file)
    if _early_lines is not None:
        _early_lines.setTarget(handler)
        _early_lines.flush()
        logging.getLogger().removeHandler(_early_lines)
        _early_lines = None
    logging.getLogger().addHandler(handler)


def for_the_file(record):
    return getattr(record, "where", "file") == "file"


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
