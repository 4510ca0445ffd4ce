"""Stop signals: a batch system's request to stop (SIGTERM at the time limit or on scancel; SIGUSR1,
``#SBATCH --signal``, as a warning before it) and Ctrl-C (SIGINT), taken by the main process alone.

:class:`StopSignals` records a signal; the training loop asks it before every step, training and
validation alike, saves a checkpoint and stops. A second Ctrl-C ends the process at once, without a
checkpoint. :class:`ShieldedDataLoader` keeps the loader's worker processes from being stopped (or
printing a KeyboardInterrupt) when the signal goes to every process of the job or of the terminal.
"""
import functools
import logging
import os
import signal
import threading
import time
from multiprocessing import resource_tracker

import torch
from torch.utils.data import DataLoader

from utils.distributed import World, agree_to_stop_and_steps
from utils.errors import exit_now

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

# With several ranks, how far apart in time the ranks ask each other whether to stop: one tiny
# all-reduce and one host sync each time, so not every step of a fast run; and a stop is acted on
# within about this long, far inside the warning submit_pm.sh asks Slurm for (180 s).
CHECK_SECONDS = 5.0

# A Ctrl-C reaches every process of the terminal's foreground group: under torchrun a rank gets it
# from the terminal and again from torchrun, which passes its own on, within milliseconds. A second
# SIGINT counts as a second Ctrl-C only this long after the first.
REPEAT_SECONDS = 1.0


class StopSignals:
    """Remembers a SIGTERM, SIGUSR1 (a batch system's warning before the time limit) or SIGINT (Ctrl-C).

    The handler only records the signal; the training loop asks :meth:`requested` before every
    step, saves a checkpoint and stops, so no step is left half done. With several ranks they must
    all stop at the same step (a rank that went on would wait forever in its next all-reduce), so
    the ranks ask each other, one tiny all-reduce, every few steps: as many as take about
    ``check_seconds``, a number they agree on at each check (the slowest rank's count).
    A second Ctrl-C exits at once with status 130, leaving the last checkpoint as it is.
    """

    def __init__(self, world=World(), device=torch.device("cpu"), check_seconds=CHECK_SECONDS):
        self.world, self.device, self.check_seconds = world, device, check_seconds
        self.received, self.received_at = None, None
        self.steps, self.interval, self.last_check = 0, 1, time.monotonic()
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame):
        now = time.monotonic()
        if self.received is None:  # the first signal decides
            self.received, self.received_at = signum, now
            logging.info("Received %s: stopping after this step with a checkpoint%s.", signal.Signals(signum).name,
                         " (Ctrl-C again to stop at once, without one)" if signum == signal.SIGINT else "")
        elif signum == signal.SIGINT == self.received and now - self.received_at > REPEAT_SECONDS:
            logging.info("Received SIGINT again: exiting now; the last checkpoint (if any) is kept.")
            exit_now(128 + signal.SIGINT)

    def requested(self):
        """Whether to stop before the next step; call it before every step (training or validation).

        On one rank: whether a signal arrived, with no communication. With several ranks: whether
        any rank received one, asked every ``interval`` calls (the same calls on every rank).
        """
        if self.world.size == 1:
            return self.received is not None
        self.steps += 1
        return self.steps >= self.interval and self.agreed()

    def agreed(self):
        """Whether any rank received a stop signal (on one rank: whether this one did, no communication).

        Every rank must call it at the same point. With several ranks the ranks also agree on how many
        steps to take before they next ask (:meth:`requested`): those that take ``check_seconds`` on the
        slowest rank, measured since the last check.
        """
        if self.world.size > 1:
            now = time.monotonic()
            per_step = (now - self.last_check) / max(self.steps, 1)
            proposal = max(1, int(self.check_seconds / max(per_step, 1e-6)))
            stop, self.interval = agree_to_stop_and_steps(self.received is not None, proposal, self.world, self.device)
            self.steps, self.last_check = 0, now
            if stop:
                self.received = self.received or signal.SIGTERM  # another rank got the signal
        return self.received is not None


# Linux has sigwaitinfo, macOS not: there the workers stay as torch makes them.
CAN_SHIELD = hasattr(signal, "sigwaitinfo")


class ShieldedDataLoader(DataLoader):
    """A DataLoader whose worker processes leave SIGTERM, SIGUSR1 and SIGINT to the main process.

    Slurm (at the time limit, on scancel), ``timeout`` and ``kill -- -PGID`` signal every process
    of the job, loader workers included. A worker ended by that SIGTERM makes the main process fail
    with "DataLoader worker ... is killed by signal" before it can save a checkpoint, and a forked
    worker logs the main process's "Received SIGUSR1" again. Ctrl-C in a terminal sends SIGINT to
    every process of the foreground group, and each worker would print its own KeyboardInterrupt.
    Shielded, the workers let the main process alone stop (:class:`StopSignals`), and it ends them
    as usual.

    Blocked, not ignored: one SIGTERM must still end a worker, the main process's own (that is how
    it ends its workers at exit), and only ``sigwaitinfo`` tells who sent a signal. The workers
    start with both signals blocked (the mask passes through fork, spawn and forkserver alike, and
    on to every thread a worker starts, numpy's included), so none reaches a worker before it is
    ready, nor a thread that would die of it; then :func:`take_stop_signals` takes them.
    """

    def __init__(self, *args, **kwargs):
        # The main process's pid travels with the function: under forkserver it is not the parent.
        take = functools.partial(take_stop_signals, os.getpid()) if CAN_SHIELD else None
        super().__init__(*args, worker_init_fn=take, **kwargs)

    def __iter__(self):  # starts the workers (once, with persistent workers): not the hot loop
        if not CAN_SHIELD:
            return super().__iter__()
        context = self.multiprocessing_context or torch.multiprocessing
        if self.num_workers and context.get_start_method() != "fork":
            resource_tracker.ensure_running()  # when it starts, it unblocks SIGTERM: not in the window below
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            return super().__iter__()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def take_stop_signals(main_process, worker_id):
    """``worker_init_fn``: a thread takes the worker's stop signals; a SIGTERM from ``main_process`` ends it.

    torch calls this after setting its own worker signal handlers, which then never run: with the
    signals blocked in every thread, the one waiting here is the only one that receives them.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # already so, if started by the loader

    def take():
        while True:
            sent = signal.sigwaitinfo(STOP_SIGNALS)
            if sent.si_signo == signal.SIGTERM and sent.si_pid == main_process:
                os._exit(0)  # as torch's own handler does: a worker ended on purpose, not a failure

    threading.Thread(target=take, name="stop_signals", daemon=True).start()
