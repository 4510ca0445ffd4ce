"""The benchy trials (IO, SYNTHETIC, FULL) of any training step on any loader, without train.py's epochs.

The benchmark tools (the ladder) measure each rung with this; train.py's ``--enable_benchy`` runs
the same trials (utils/benchy.py) inside its epochs.
"""
import copy
import sys

from utils.benchy import DEFAULT_CONFIG, BenchyLoader


def run_trials(step_fn, loader, device, *, nbatches=50, ntrials=3, nwarmup=1, io=True, synthetic=True,
               full=True, batch_size=None, world_size=1, rank=0, flops_per_sample=None, peak_flops=None,
               use_distributed_barrier=False, verbose=False, json_path=None):
    """Run IO, SYNTHETIC and FULL trials of ``step_fn(inputs, targets)`` on ``loader``; no epochs needed.

    ``loader`` yields ``(inputs, targets)``; each batch is copied to ``device`` (a no-op for
    batches already there) and passed to ``step_fn``, which trains on it. Returns
    ``{io, synthetic, full}`` mean samples/s of all ``world_size`` ranks, ``std``, ``mfu`` (each
    None without ``flops_per_sample`` and ``peak_flops``, a fraction otherwise) and ``peak_mem_gb``
    (None off CUDA).
    """
    config = copy.deepcopy(DEFAULT_CONFIG)
    config["global"].update(use_distributed_barrier=use_distributed_barrier, profiler_mode="none",
                            exit_after_tests=False)
    for section, enabled in (("IO", io), ("synthetic", synthetic), ("full", full)):
        config[section].update(run_benchmark=enabled, nbatches=nbatches, ntrials=ntrials, nwarmup=nwarmup)
    bench = BenchyLoader(loader, config, batch_size=batch_size, device=device, world_size=world_size,
                         rank=rank, flops_per_sample=flops_per_sample, peak_flops=peak_flops,
                         json_path=json_path, verbose=verbose)
    bench.run_io_trials()
    sampler = getattr(loader, "sampler", None)
    epoch = 0
    while not bench.trials_complete:
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        for inputs, targets in bench:
            step_fn(inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True))
        epoch += 1
    return bench.summary()



if __name__ == "__main__":  # a library module: `python -m ... --help` (or any use) says what it is
    print(__doc__.strip())
    print(f"\n{__spec__.name} has no command line of its own; it is imported (see above).")
    sys.exit(0 if sys.argv[1:] in ([], ["--help"], ["-h"]) else 2)
