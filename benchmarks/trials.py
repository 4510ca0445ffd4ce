"""The benchy trials (IO, SYNTHETIC, FULL) of any training step on any loader, without train.py's epochs.

The benchmark tools (the ladder) measure each rung with this; train.py's ``--enable_benchy`` runs
the same trials (utils/benchy.py) inside its epochs.

The trials here time the loader's steady state. They read one :class:`BatchStream`, an endless
stream of the loader's batches: a trial takes the next ``nbatches`` of it, and the loader's
``iter()`` is called again only when an epoch has run out. A DataLoader with persistent workers
is never reset in the middle of an epoch (its reset first drains every batch in flight: 8 workers
x 2 prefetched batches), and each kind's warm-up trials cover at least twice the batches its
workers hold in flight (:func:`warmup_trials`), so that the batches the workers made ahead while
nothing read them (start-up, or the SYNTHETIC trials) are not timed as if they came at the
loader's rate.
"""
import copy
import math
import sys

from utils.benchy import DEFAULT_CONFIG, BenchyLoader


def in_flight(loader):
    """Batches a loader's workers can hold ready: ``num_workers x prefetch_factor`` of a DataLoader
    (of the one it wraps, for a wrapper with a ``loader`` attribute), 0 without workers."""
    while loader is not None:
        workers = getattr(loader, "num_workers", None)
        if isinstance(workers, int):
            return workers * (getattr(loader, "prefetch_factor", None) or 2) if workers else 0
        loader = getattr(loader, "loader", None)
    return 0


class BatchStream:
    """One endless stream of a loader's batches, shared by every ``iter()``: each trial (and a warm-up
    before them) continues where the last one stopped; a new epoch of the loader starts only when the
    last one ran out (``sampler.set_epoch`` advanced first, where the sampler has one)."""

    def __init__(self, loader):
        self.loader = loader
        self.epoch = 0
        self._batches = None

    def __iter__(self):
        return self

    def __next__(self):
        for _ in range(2):  # a fresh epoch that yields nothing ends the stream
            if self._batches is None:
                sampler = getattr(self.loader, "sampler", None)
                if hasattr(sampler, "set_epoch"):
                    sampler.set_epoch(self.epoch)
                self.epoch += 1
                self._batches = iter(self.loader)
            try:
                return next(self._batches)
            except StopIteration:
                self._batches = None
        raise StopIteration

    @property
    def batch_size(self):
        return getattr(self.loader, "batch_size", None)


def warmup_trials(nwarmup, nbatches, depth):
    """Warm-up trials of ``nbatches`` that cover at least ``2 x depth`` batches (``depth``: the
    batches in flight), and never fewer than ``nwarmup``."""
    return max(nwarmup, math.ceil(2 * depth / nbatches)) if depth else nwarmup


def run_trials(step_fn, loader, device, *, nbatches=50, ntrials=3, nwarmup=1, io=True, synthetic=True,
               full=True, batch_size=None, world_size=1, rank=0, flops_per_sample=None, peak_flops=None,
               use_distributed_barrier=False, verbose=False, json_path=None):
    """Run IO, SYNTHETIC and FULL trials of ``step_fn(inputs, targets)`` on ``loader``; no epochs needed.

    ``loader`` yields ``(inputs, targets)`` (a :class:`BatchStream` of it is made unless it is one);
    each batch is copied to ``device`` (a no-op for batches already there) and passed to
    ``step_fn``, which trains on it. Returns ``{io, synthetic, full}`` mean samples/s of all
    ``world_size`` ranks, ``std``, ``mfu`` (each None without ``flops_per_sample`` and
    ``peak_flops``, a fraction otherwise), ``peak_mem_gb`` (None off CUDA), ``nwarmup``, the
    warm-up trials each kind ran, and ``trials``: ``{io, synthetic, full}``, each kind's timed trials
    (samples/s), which utils/noise.py judges.
    """
    stream = loader if isinstance(loader, BatchStream) else BatchStream(loader)
    warmups = warmup_trials(nwarmup, nbatches, in_flight(stream.loader))
    config = copy.deepcopy(DEFAULT_CONFIG)
    config["global"].update(use_distributed_barrier=use_distributed_barrier, profiler_mode="none",
                            exit_after_tests=False)
    for section, enabled in (("IO", io), ("synthetic", synthetic), ("full", full)):
        config[section].update(run_benchmark=enabled, nbatches=nbatches, ntrials=ntrials, nwarmup=warmups)
    bench = BenchyLoader(stream, config, batch_size=batch_size or stream.batch_size, device=device,
                         world_size=world_size, rank=rank, flops_per_sample=flops_per_sample,
                         peak_flops=peak_flops, json_path=json_path, verbose=verbose)
    bench.run_io_trials()
    while not bench.trials_complete:
        for inputs, targets in bench:
            step_fn(inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True))
    trials = {kind.lower(): list(bench.results.get(kind, {}).get("trial_throughput", []))
              for kind in ("IO", "SYNTHETIC", "FULL")}
    return {**bench.summary(), "nwarmup": warmups, "trials": trials}


if __name__ == "__main__":  # a library module: `python -m ... --help` (or any use) says what it is
    print(__doc__.strip())
    print(f"\n{__spec__.name} has no command line of its own; it is imported (see above).")
    sys.exit(0 if sys.argv[1:] in ([], ["--help"], ["-h"]) else 2)
