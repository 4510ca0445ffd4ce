"""Progress through a long phase (an epoch's training, a validation), shown by rank 0.

On a terminal, a tqdm bar; otherwise (a batch job's output file, a pipe) a log line after the
first ten seconds, with the time left, then one every minute, from a timer thread, so that even a
phase whose single steps take minutes says where it stands from its first steps. Neither waits for the device: the count advances when the loop takes the next batch.
"""
import logging
import sys
import threading
import time

from tqdm import tqdm

LOG_EVERY_SECONDS = 60.0
FIRST_LOG_SECONDS = 10.0


class Progress:
    """``progress(iterable, label)`` yields the iterable's items and shows how far it got.

    ``enabled``: whether this process shows anything (rank 0); ``terminal``: a bar instead of log
    lines (default: whether stderr, where the bar is drawn, is a terminal).
    """

    def __init__(self, enabled=True, terminal=None, every_seconds=LOG_EVERY_SECONDS, first_seconds=FIRST_LOG_SECONDS):
        self.enabled, self.every_seconds, self.first_seconds = enabled, every_seconds, min(first_seconds, every_seconds)
        self.terminal = sys.stderr.isatty() if terminal is None else terminal

    def __call__(self, iterable, label):
        if not self.enabled:
            return iterable
        if self.terminal:
            # Redrawn at every step (mininterval 0: a step takes milliseconds at least), so the last
            # step's count is drawn before the bar is cleared at the end of the phase.
            return tqdm(iterable, desc=label, total=len(iterable), leave=False, dynamic_ncols=True, unit="step",
                        mininterval=0)
        return self._logged(iterable, label)

    def _logged(self, iterable, label):
        total, done, start = len(iterable), [0], time.monotonic()
        finished = threading.Event()

        def report():
            wait = self.first_seconds
            while not finished.wait(wait):
                wait = self.every_seconds
                elapsed = time.monotonic() - start
                left = f", about {elapsed / done[0] * (total - done[0]) / 60:.1f} min left" if done[0] else ""
                logging.info("  %s: %d of %d batches done after %.1f min%s", label, done[0], total, elapsed / 60,
                             left)

        timer = threading.Thread(target=report, name="progress", daemon=True)
        timer.start()
        try:
            for item in iterable:
                yield item
                done[0] += 1
        finally:
            finished.set()
