"""Stop signals: a batch system's request to stop (SIGTERM at the time limit or on scancel; SIGUSR1,
``#SBATCH --signal``, as a warning before it), taken by the main process alone.

:class:`StopSignals` records a signal; the training loop asks it between steps, saves a checkpoint
and stops. :class:`ShieldedDataLoader` keeps the loader's worker processes from being stopped (or
logging the request again) when the signal goes to every process of the job.
"""
import functools
import logging
import os
import signal
import threading
from multiprocessing import resource_tracker

import torch
from torch.utils.data import DataLoader

from utils.distributed import World, agree_to_stop

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopSignals:
    """Remembers a SIGTERM or SIGUSR1 (a batch system's warning before the time limit).

    The handler only records the signal; the training loop asks :meth:`agreed` between steps,
    saves a checkpoint and stops, so no step is left half done. With several ranks they must all
    stop at the same step (a rank that went on would wait forever in its next all-reduce), so
    ``agreed`` asks the others: one tiny all-reduce, which is why the loop asks only every few steps.
    """

    def __init__(self, world=World(), device=torch.device("cpu")):
        self.world, self.device = world, device
        self.received = None
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame):
        first, self.received = self.received is None, self.received or signum  # the first signal decides
        if first:
            logging.info("Received %s: stopping after this step with a checkpoint.", signal.Signals(signum).name)

    def agreed(self):
        """Whether any rank received a stop signal (on one rank: whether this one did, no communication)."""
        if self.world.size > 1 and agree_to_stop(self.received is not None, self.world, self.device):
            self.received = self.received or signal.SIGTERM  # another rank got the signal
        return self.received is not None


# Linux has sigwaitinfo, macOS not: there the workers stay as torch makes them.
CAN_SHIELD = hasattr(signal, "sigwaitinfo")


class ShieldedDataLoader(DataLoader):
    """A DataLoader whose worker processes leave SIGTERM and SIGUSR1 to the main process.

    Slurm (at the time limit, on scancel), ``timeout`` and ``kill -- -PGID`` signal every process
    of the job, loader workers included. A worker ended by that SIGTERM makes the main process fail
    with "DataLoader worker ... is killed by signal" before it can save a checkpoint, and a forked
    worker logs the main process's "Received SIGUSR1" again. Shielded, the workers let the main
    process alone stop (:class:`StopSignals`), and it ends them as usual.

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
