"""Throughput trials in the manner of benchy: IO, SYNTHETIC and FULL, plus model FLOP utilisation.

benchy (https://github.com/romerojosh/benchy, not the unrelated PyPI package of that name) wraps
the training data loader and turns the run's epochs into timed trials:

- IO: the loader alone, iterated and discarded; the trials run before the first epoch.
- SYNTHETIC: one batch fetched once and handed to training again and again: the loader's time is
  gone. Where that batch is on the GPU it is compute alone: the device loaders' (``gpu-inmem``,
  ``dali-lowmem``) and, under the device prefetcher (``--device_prefetch``, the default on a GPU),
  the host loaders', whose batch benchy caches after the prefetcher's copy. With
  ``--device_prefetch=false`` a host loader's batch (``synthetic``, ``inmem``, ``lowmem``) is copied
  from pinned host memory every step, on the compute stream, and SYNTHETIC includes that copy.
- FULL: real batches, real training.

Each trial is ``nbatches`` batches; ``nwarmup`` untimed warm-up trials come before ``ntrials``
timed ones. Configuration is benchy's YAML (sections ``global``, ``IO``, ``synthetic``, ``full``),
named by ``BENCHY_CONFIG_FILE``; without it, ``benchy_config.yaml`` at the top of the repository
(the tutorial's settings). The summary is benchy's, to the character::

    BENCHY::SUMMARY::IO average trial throughput: 84.468 +/- 0.463
    BENCHY::SUMMARY:: SYNTHETIC average trial throughput: 481.618 +/- 1.490
    BENCHY::SUMMARY::FULL average trial throughput: 83.212 +/- 0.433

Throughputs are samples per second of the whole job, as benchy counts them: rank 0's trial time
for ``nbatches`` local batches times the number of ranks. Mean and population standard deviation
are over the timed trials. The results go to a JSON file: ``$BENCHY_OUTPUT.json`` (from the working
directory) when that is set, else ``output_filename`` in ``output_dir`` (default: the run directory).

When the GitHub benchy is importable and the device is a GPU, its own ``benchy.torch`` wrapper
runs the trials. Otherwise the built-in :class:`BenchyLoader` below does, with one difference in
method: benchy synchronises the GPU after every batch to time each iteration, which stalls the
CPU's run-ahead; this one synchronises only at trial boundaries, so it times what training does,
and reports trial throughputs only (no per-iteration rates).

Both add the model FLOP utilisation (MFU): training FLOPs per sample, counted once with
``torch.utils.flop_counter.FlopCounterMode`` on the meta device, times samples per second, over
the GPUs' peak FLOP/s (NVIDIA datasheets, dense; ``PEAK_TFLOPS`` overrides). For IO it is the
ceiling the loader alone would allow.

``benchmarks/trials.py`` runs the same trials for any step function and loader, without
train.py's epochs: the entry point of the benchmark suite.
"""
import copy
import difflib
import json
import logging
import os
import statistics
import tempfile
import time

import torch
import yaml

from utils.errors import UserError
from utils.conv3d import running_precision
from utils.flops import env_peak_tflops, mfu, resolve_peak_flops, unet_flops_per_sample
from utils.noise import order_note

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPOSITORY_CONFIG = os.path.join(ROOT, "benchy_config.yaml")
KINDS = ("IO", "SYNTHETIC", "FULL")
SECTION_OF = {"IO": "IO", "SYNTHETIC": "synthetic", "FULL": "full"}

# benchy's own defaults (benchy/__init__.py). Keys marked "ours" are not benchy's; benchy ignores them.
DEFAULT_CONFIG = {
    "global": {
        "report_freq": 10,               # benchy: print an iteration rate every N batches (not used here)
        "exit_after_tests": True,        # end the run when the trials are complete
        "profiler_mode": "single",       # CUDA profiler window for nsys -c cudaProfilerApi: single|all|none
        "output_filename": "benchy_result.json",
        "output_dir": None,              # benchy: the working directory; here None means the run directory
        "json_prefix": "benchy_result",  # older benchy's name for output_filename; accepted, not used here
        "use_distributed_barrier": False,  # also a barrier over ranks at trial boundaries
        "peak_tflops": None,             # ours: peak TFLOP/s per GPU for the MFU (env PEAK_TFLOPS wins)
    },
    "IO": {"run_benchmark": True, "nbatches": 50, "ntrials": 3, "nwarmup": 1},
    "synthetic": {"run_benchmark": True, "nbatches": 50, "ntrials": 3, "nwarmup": 1},
    "full": {"run_benchmark": True, "nbatches": 50, "ntrials": 3, "nwarmup": 1},
}

# ----------------------------------------------------------------------------- configuration

def config_path():
    """The benchy config file in force: ``$BENCHY_CONFIG_FILE``, else the repository's."""
    path = os.environ.get("BENCHY_CONFIG_FILE")
    if path:
        return path
    return REPOSITORY_CONFIG if os.path.isfile(REPOSITORY_CONFIG) else None


def load_benchy_config(path=None):
    """benchy's defaults overridden, key by key, by the YAML file at ``path`` (or :func:`config_path`).

    benchy itself replaces whole sections (a section that sets only ``nbatches`` loses the other
    keys); merging key by key keeps the defaults of whatever a file leaves out. Unknown keys are
    refused rather than silently ignored.
    """
    path = path or config_path()
    config = copy.deepcopy(DEFAULT_CONFIG)
    if path is None:
        return config
    where = f"BENCHY_CONFIG_FILE={path}" if os.environ.get("BENCHY_CONFIG_FILE") == path else path
    try:
        with open(path) as f:
            user = yaml.safe_load(f) or {}
    except FileNotFoundError:
        raise UserError(f"The benchy config file {where} does not exist. Point BENCHY_CONFIG_FILE at a "
                        f"YAML file like {REPOSITORY_CONFIG}, or unset it to use that one.") from None
    except yaml.YAMLError as error:
        raise UserError(f"The benchy config file {where} is not valid YAML: {error}") from None
    if not isinstance(user, dict):
        raise UserError(f"The benchy config file {where} must hold the sections global, IO, synthetic "
                        "and full (a YAML mapping).")
    for section, values in user.items():
        if section not in config:
            raise UserError(f"The benchy config file {where} has an unknown section '{section}'."
                            f"{_closest(section, config)} Sections: {', '.join(config)}.")
        if not isinstance(values, dict):
            raise UserError(f"Section '{section}' of the benchy config file {where} must be a mapping of "
                            f"keys to values, e.g. nbatches: 50.")
        for key, value in values.items():
            if key not in config[section]:
                raise UserError(f"The benchy config file {where} has an unknown key '{key}' in section "
                                f"'{section}'.{_closest(key, config[section])} Keys: "
                                f"{', '.join(config[section])}.")
            config[section][key] = value
    _validate(config, where)
    return config


def _closest(name, valid):
    match = difflib.get_close_matches(str(name), list(valid), n=1)
    return f" Did you mean '{match[0]}'?" if match else ""


def _validate(config, where):
    def refuse(section, key, what):
        raise UserError(f"{section}.{key}={config[section][key]!r} in the benchy config file {where} is "
                        f"invalid: it must be {what}.")

    for section in ("IO", "synthetic", "full"):
        values = config[section]
        if not isinstance(values["run_benchmark"], bool):
            refuse(section, "run_benchmark", "true or false")
        for key, least in (("nbatches", 1), ("ntrials", 1), ("nwarmup", 0)):
            if not isinstance(values[key], int) or isinstance(values[key], bool) or values[key] < least:
                refuse(section, key, "a positive integer" if least else "a non-negative integer")
    values = config["global"]
    for key in ("exit_after_tests", "use_distributed_barrier"):
        if not isinstance(values[key], bool):
            refuse("global", key, "true or false")
    if values["profiler_mode"] not in ("single", "all", "none"):
        refuse("global", "profiler_mode", "one of single, all, none")
    peak = values["peak_tflops"]
    if peak is not None and (isinstance(peak, bool) or not isinstance(peak, (int, float)) or peak <= 0):
        refuse("global", "peak_tflops", "a positive number of TFLOP/s or null")


def trial_plan(config):
    """The training-epoch trials in order: ``[(kind, label, is_warmup), ...]``, SYNTHETIC then FULL."""
    plan = []
    for kind in ("SYNTHETIC", "FULL"):
        section = config[SECTION_OF[kind]]
        if section["run_benchmark"]:
            for n in range(section["nwarmup"] + section["ntrials"]):
                warmup = n < section["nwarmup"]
                label = f"{kind}_WARMUP_{n}" if warmup else f"{kind}_{n - section['nwarmup']}"
                plan.append((kind, label, warmup))
    return plan


def epoch_length(config, plan, trial_index, loader_length):
    """Batches the next epoch yields: a trial's (SYNTHETIC adds its untimed first batch), or the loader's."""
    if trial_index >= len(plan):
        return loader_length
    kind = plan[trial_index][0]
    return min(loader_length, config[SECTION_OF[kind]]["nbatches"]) + (kind == "SYNTHETIC")


def epochs_needed(config, github_benchy=False):
    """Training epochs the trials take. The GitHub benchy reports at the start of one more epoch."""
    return max(len(trial_plan(config)), 1) + (1 if github_benchy else 0)


def github_benchy_available(device):
    """True when the GitHub benchy's ``benchy.torch`` imports and the device is a GPU.

    benchy synchronises CUDA and pushes NVTX ranges unconditionally, so on a CPU it cannot run.
    A failure to import is not an error: the PyPI package of the same name (unrelated, Python 2)
    may be what is installed, and the built-in trials are used instead.
    """
    if device is None or torch.device(device).type != "cuda":
        return False
    try:
        from benchy.torch import BenchmarkGenericIteratorWrapper  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure to import means: not the benchy we know
        return False
    return True


def check_benchy_options(params, device=None):
    """Refuse a benchy run that cannot finish its trials, before anything is trained (nothing to
    check without ``enable_benchy``)."""
    if not params.enable_benchy:
        return
    config = load_benchy_config()
    env_peak_tflops()  # refuses a malformed PEAK_TFLOPS now rather than after the trials
    needed = epochs_needed(config, github_benchy_available(device))
    if params.num_epochs < needed:
        counts = ", ".join(f"{kind} {config[SECTION_OF[kind]]['nwarmup']} warm-up + "
                           f"{config[SECTION_OF[kind]]['ntrials']}" for kind in ("SYNTHETIC", "FULL")
                           if config[SECTION_OF[kind]]["run_benchmark"])
        where = config_path() or "a file named by BENCHY_CONFIG_FILE"
        raise UserError(f"--enable_benchy runs its trials at epoch boundaries, one trial per epoch "
                        f"({counts or 'IO only'}), so it needs {needed} epochs, but num_epochs="
                        f"{params.num_epochs}. Pass --num_epochs={needed} or more (the tutorial used 15), "
                        f"or configure fewer trials in {where}.")


def output_path(config, run_dir):
    """Where the JSON results go.

    ``BENCHY_OUTPUT=name`` writes ``name.json``, a path from the working directory as users type it
    (``BENCHY_OUTPUT=scaling/ddp_4`` -> ./scaling/ddp_4.json), or inside ``output_dir`` when the
    config sets one. Without it: ``output_filename`` in ``output_dir``, else in the run directory.
    """
    name = os.environ.get("BENCHY_OUTPUT")
    if name:
        filename = name if name.endswith(".json") else name + ".json"
        return os.path.join(config["global"]["output_dir"] or os.getcwd(), filename)
    directory = config["global"]["output_dir"] or run_dir or os.getcwd()
    return os.path.join(directory, config["global"]["output_filename"])


# ----------------------------------------------------------------------------- the built-in trials

def _batch_length(batch):
    """Samples in a batch ``(inputs, targets)``: the inputs' first dimension (host metadata, no sync)."""
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else None


class _Trial:
    """One trial: an iterator over ``nbatches`` batches, timed from its first request to its last.

    SYNTHETIC first fetches one batch and hands it out untimed (like benchy), then hands out the
    same object ``nbatches`` times. The device is synchronised when the clock starts and when it
    stops, never in between.
    """

    def __init__(self, owner, kind, label, warmup, batches, nbatches, cached):
        self.owner, self.kind, self.label, self.warmup = owner, kind, label, warmup
        self.batches, self.nbatches, self.cached = batches, nbatches, cached
        self.batch = None
        self.count = self.samples = 0
        self.started = None
        self.ended = False

    def __iter__(self):
        return self

    def __next__(self):
        if self.ended:
            raise StopIteration
        if self.cached and self.batch is None:
            self.batch = self._fetch()
            return self.batch
        if self.started is None:
            self.owner.synchronize()  # earlier work must not count against this trial
            self.owner.range_push(f"BENCHY::{self.label}")
            self.started = time.perf_counter()
        if self.count == self.nbatches:
            self._end()
        batch = self.batch if self.cached else self._fetch()
        self.count += 1
        self.samples += _batch_length(batch) or self.owner.batch_size
        return batch

    def _fetch(self):
        try:
            return next(self.batches)
        except StopIteration:
            self._end()  # the loader ran dry before nbatches: the trial ends here

    def _end(self):
        self.ended = True
        elapsed = None
        if self.started is not None:
            self.owner.synchronize()  # the last batch's work is inside the trial
            elapsed = time.perf_counter() - self.started
            self.owner.range_pop()
        self.batches = self.batch = None  # release the loader's iterator and the cached batch
        self.owner.trial_ended(self, elapsed if self.count else None)
        raise StopIteration


class _TrialEpochs:
    """A training loader whose epochs are benchy's trials, then the loader's own epochs.

    What the built-in trials and the GitHub benchy's share: the plan of trials, one per epoch;
    ``len()`` (like a DataLoader's, the number of batches the next ``iter()`` yields: a trial's
    ``nbatches``, one more for SYNTHETIC, while trials remain, then the loader's length); the
    wrapped loader's other attributes (``sampler``, ``batch_size``, ...); and when to stop.
    Subclasses say how a trial epoch runs (:meth:`_trial`).
    """

    def __init__(self, loader, config):
        self.loader, self.config = loader, config
        self.trials_complete = False
        self._plan = trial_plan(config)
        self._next_trial = 0

    def __getattr__(self, name):
        # Only called for attributes the wrapper lacks: sampler, dataset, ... of the wrapped loader.
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __len__(self):
        return epoch_length(self.config, self._plan, self._next_trial, len(self.loader))

    def __iter__(self):
        if self._next_trial < len(self._plan):
            kind, label, warmup = self._plan[self._next_trial]
            self._next_trial += 1
            return self._trial(kind, label, warmup)
        return iter(self.loader)

    def _trial(self, kind, label, warmup):
        raise NotImplementedError

    @property
    def stop_training(self):
        """True once every trial has run and benchy's config says to end the run then."""
        return self.trials_complete and self.config["global"]["exit_after_tests"]


class BenchyLoader(_TrialEpochs):
    """The built-in benchy: the first epoch's ``iter()`` runs the IO trials, then every epoch is
    the next SYNTHETIC or FULL trial; the end of the last trial prints the summary and writes the
    JSON file. ``trials_complete`` is then true, and ``stop_training`` too when the config asks to
    end the run (``exit_after_tests``). Epochs after the trials are the loader's own.
    """

    def __init__(self, loader, config, *, batch_size=None, device="cpu", world_size=1, rank=0,
                 flops_per_sample=None, peak_flops=None, peak_source="", precision=None,
                 json_path=None, verbose=True):
        super().__init__(loader, config)
        self.batch_size = batch_size or getattr(loader, "batch_size", None) or 1
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.world_size, self.rank = world_size, rank
        self.flops_per_sample, self.peak_flops = flops_per_sample, peak_flops
        self.peak_source, self.precision = peak_source, precision
        self.json_path = json_path
        self.verbose = verbose and rank == 0
        self.results = {"nranks": world_size}
        self._io_done = False
        self._profiler_started = False

    def __iter__(self):
        self.run_io_trials()
        return super().__iter__()

    def _trial(self, kind, label, warmup):
        return _Trial(self, kind, label, warmup, iter(self.loader), self._nbatches(self.config[SECTION_OF[kind]]),
                      cached=kind == "SYNTHETIC")

    def _nbatches(self, section):
        try:
            available = len(self.loader)
        except TypeError:
            return section["nbatches"]
        if available < section["nbatches"] and self.verbose:
            print(f"BENCHY::INFO::Message: an epoch has {available} batches, fewer than nbatches="
                  f"{section['nbatches']}: trials are {available} batches long.", flush=True)
        return min(available, section["nbatches"])

    # --- the IO trials, run before the first training epoch

    def run_io_trials(self):
        if self._io_done:
            return
        self._io_done = True
        self._start_profiler()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        section = self.config["IO"]
        if section["run_benchmark"]:
            for n in range(section["nwarmup"] + section["ntrials"]):
                warmup = n < section["nwarmup"]
                label = f"IO_WARMUP_{n}" if warmup else f"IO_{n - section['nwarmup']}"
                for _ in _Trial(self, "IO", label, warmup, iter(self.loader), self._nbatches(section),
                                cached=False):
                    pass
        if not self._plan:
            self._finalize()

    # --- called by the trials

    def synchronize(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)
        if self.config["global"]["use_distributed_barrier"] and self.world_size > 1:
            torch.distributed.barrier()

    def range_push(self, name):
        if self.cuda:
            torch.cuda.nvtx.range_push(name)

    def range_pop(self):
        if self.cuda:
            torch.cuda.nvtx.range_pop()

    def trial_ended(self, trial, elapsed):
        if elapsed:
            rate = trial.samples * self.world_size / elapsed
            if self.verbose:
                print(f"BENCHY::{trial.label}::Trial Throughput: {rate:.3f}", flush=True)
            if not trial.warmup:
                entry = self.results.setdefault(trial.kind, {"trial_throughput": [], "trial_time": [],
                                                             "nbatches": trial.count})
                entry["trial_throughput"].append(rate)
                entry["trial_time"].append(elapsed)
        elif self.verbose:
            print(f"BENCHY::{trial.label}::the loader yielded no batch: trial not timed.", flush=True)
        if trial.kind != "IO" and self._next_trial == len(self._plan) and not self.trials_complete:
            self._finalize()

    # --- profiler window and the end

    def _start_profiler(self):
        mode = self.config["global"]["profiler_mode"]
        if self.cuda and (mode == "all" or mode == "single" and self.rank == 0):
            torch.cuda.profiler.start()
            self._profiler_started = True

    def _finalize(self):
        self.trials_complete = True
        if self._profiler_started:
            torch.cuda.profiler.stop()
        summary = self.summary()
        self.results.update({
            "local_batch_size": self.batch_size,
            "device": torch.cuda.get_device_name(self.device) if self.cuda else self.device.type,
            "flops_per_sample": self.flops_per_sample,
            "peak_flops": self.peak_flops,
            "precision": self.precision,
            "mfu": {kind: summary["mfu"][kind.lower()] for kind in KINDS if kind in self.results},
            "peak_mem_gb": summary["peak_mem_gb"],
        })
        if self.verbose:
            print_summary(self.results, self.peak_source)
        if self.json_path and self.rank == 0:
            write_json(self.json_path, self.results, self.verbose)
        if self.verbose and self.stop_training:
            print("BENCHY::INFO::Message: Tests completed.... exiting.", flush=True)

    def summary(self):
        """``{io, synthetic, full}``: mean samples/s (all ranks); their ``std``, ``mfu``; ``peak_mem_gb``."""
        out = {"std": {}, "mfu": {}}
        for kind in KINDS:
            rates = self.results.get(kind, {}).get("trial_throughput", [])
            mean = statistics.fmean(rates) if rates else None
            out[kind.lower()] = mean
            out["std"][kind.lower()] = statistics.pstdev(rates) if rates else None
            out["mfu"][kind.lower()] = mfu(self.flops_per_sample, mean, self.peak_flops, self.world_size)
        out["peak_mem_gb"] = torch.cuda.max_memory_allocated(self.device) / 1e9 if self.cuda else None
        out["flops_per_sample"], out["peak_flops"] = self.flops_per_sample, self.peak_flops
        return out


LABELS = {"IO": "IO", "SYNTHETIC": " SYNTHETIC", "FULL": "FULL"}  # benchy's spacing, kept


def trial_rates(results, kind):
    """The timed trials' throughputs of ``kind`` (older benchy versions call them avg_throughput)."""
    entry = results.get(kind, {})
    return entry.get("trial_throughput") or entry.get("avg_throughput") or []


def print_summary(results, peak_source=""):
    """benchy's three summary lines, then this project's MFU and peak-memory lines."""
    for kind in KINDS:
        rates = trial_rates(results, kind)
        if rates:
            print(f"BENCHY::SUMMARY::{LABELS[kind]} average trial throughput: "
                  f"{statistics.fmean(rates):.3f} +/- {statistics.pstdev(rates):.3f}", flush=True)
    print_noise_note(results)
    print_mfu(results, peak_source)


def print_noise_note(results):
    note = noise_note(results)
    if note:
        print(f"BENCHY::SUMMARY::Noise: {note}. These throughputs rank nothing.", flush=True)


def noise_note(results):
    """What the trials' spread says of the summary (utils/noise.py): None, or why it ranks nothing.
    FULL does the loading of IO and the training of SYNTHETIC, so it cannot be faster than either."""
    measured = {kind: trial_rates(results, kind) for kind in KINDS if trial_rates(results, kind)}
    return order_note(measured, above=[("SYNTHETIC", "FULL"), ("IO", "FULL")])


def print_mfu(results, peak_source=""):
    """One MFU line per kind measured, how it was computed, and the peak memory on CUDA."""
    flops, peak = results.get("flops_per_sample"), results.get("peak_flops")
    for kind in KINDS:
        if not trial_rates(results, kind):
            continue
        value = results.get("mfu", {}).get(kind)
        if value is None:
            text = f"n/a ({peak_source or 'no peak FLOP/s known'})"
        else:
            text = f"{100 * value:.2f}%"
        note = " (the ceiling the loader alone allows)" if kind == "IO" and value is not None else ""
        print(f"BENCHY::MFU::{LABELS[kind]} model FLOP utilisation: {text}{note}", flush=True)
    if flops and peak:
        about = ", ".join(str(part) for part in (results.get("precision"), peak_source) if part)
        print(f"BENCHY::INFO::Message: MFU from {flops / 1e9:.3g} GFLOP per sample (forward + backward) and "
              f"a peak of {peak / 1e12:g} TFLOP/s per GPU" + (f" ({about})." if about else "."), flush=True)
    elif flops:
        print(f"BENCHY::INFO::Message: Training costs {flops / 1e9:.3g} GFLOP per sample (forward + "
              "backward); set PEAK_TFLOPS to the device's peak TFLOP/s for the MFU.", flush=True)
    if results.get("peak_mem_gb") is not None:
        print(f"BENCHY::INFO::Message: Peak GPU memory allocated: {results['peak_mem_gb']:.2f} GB.",
              flush=True)


def write_json(path, results, verbose=True):
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    if verbose:
        print(f"BENCHY::INFO::Message: Writing JSON output to {path}.", flush=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


# ----------------------------------------------------------------------------- the GitHub benchy

class _GitHubBenchyLoader(_TrialEpochs):
    """The GitHub benchy's ``BenchmarkGenericIteratorWrapper`` running the same trials, with this
    project's end of run and MFU lines.

    benchy calls ``sys.exit()`` inside the loader once its trials are done, which would skip the
    process group's shutdown; it runs here with ``exit_after_tests: false`` and the training loop
    ends itself on ``stop_training``. benchy's IO trials run when the wrapper is built.
    """

    def __init__(self, loader, config, batch_size, device, world_size, rank, flops_per_sample,
                 peak_flops, peak_source, precision, json_path):
        from benchy.torch import BenchmarkGenericIteratorWrapper

        super().__init__(loader, config)
        self.device, self.world_size, self.rank = torch.device(device), world_size, rank
        self.flops_per_sample, self.peak_flops = flops_per_sample, peak_flops
        self.peak_source, self.precision, self.json_path = peak_source, precision, json_path
        resolved = copy.deepcopy(config)
        resolved["global"].update({
            "exit_after_tests": False,
            "output_dir": os.path.dirname(json_path) or ".",
            "output_filename": os.path.basename(json_path),
        })
        # benchy reads its config from BENCHY_CONFIG_FILE when the wrapper is built: point it at the
        # resolved copy for that moment only. One file per process, so ranks never race.
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump(resolved, f)
        previous = os.environ.get("BENCHY_CONFIG_FILE")
        os.environ["BENCHY_CONFIG_FILE"] = f.name
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        try:
            self.wrapper = BenchmarkGenericIteratorWrapper(loader, batch_size)
        finally:
            os.remove(f.name)
            if previous is None:
                del os.environ["BENCHY_CONFIG_FILE"]
            else:
                os.environ["BENCHY_CONFIG_FILE"] = previous
        if not self._plan:
            self._finish()

    def _trial(self, kind, label, warmup):
        yield from iter(self.wrapper)  # benchy counts its trials itself, in the same order
        if self._next_trial == len(self._plan) and not self.trials_complete:
            self._finish()

    def _finish(self):
        iter(self.wrapper)  # benchy reports on the request after its last trial: summary and JSON
        self.trials_complete = True
        results = dict(self.wrapper.results)
        means = {kind: statistics.fmean(trial_rates(results, kind)) if trial_rates(results, kind) else None
                 for kind in KINDS}
        results.update({
            "flops_per_sample": self.flops_per_sample, "peak_flops": self.peak_flops,
            "precision": self.precision,
            "mfu": {kind: mfu(self.flops_per_sample, means[kind], self.peak_flops, self.world_size)
                    for kind in KINDS if means[kind] is not None},
            "peak_mem_gb": (torch.cuda.max_memory_allocated(self.device) / 1e9
                            if self.device.type == "cuda" else None),
        })
        if self.rank == 0:
            print_noise_note(results)  # under benchy's summary lines
            print_mfu(results, self.peak_source)
            if os.path.isfile(self.json_path):
                write_json(self.json_path, results, verbose=False)
            if self.stop_training:
                print("BENCHY::INFO::Message: Tests completed.... exiting.", flush=True)


# ----------------------------------------------------------------------------- entry points

def wrap_for_benchy(loader, params, world, device, run_dir):
    """The training loader of a ``--enable_benchy`` run: the GitHub benchy's, or the built-in one
    (``loader`` itself without ``--enable_benchy``).

    Counts the model's FLOPs once and resolves the GPU's peak for the MFU. With the GitHub benchy
    the IO trials run now; with the built-in one, at the first epoch.
    """
    if not params.enable_benchy:
        return loader
    path = config_path()
    config = load_benchy_config(path)
    if world.rank == 0:
        print(f"BENCHY::INFO::Message: Using benchy configuration file {path}." if path else
              "BENCHY::INFO::Message: Using default benchy configuration.", flush=True)
    on_gpu = torch.device(device).type == "cuda"
    precision = running_precision(params.amp_mode, params.get("tf32", False), torch.device(device))
    peak, source = resolve_peak_flops(device, precision, config["global"]["peak_tflops"])
    arguments = dict(batch_size=params.global_batch_size // world.size, device=device,
                     world_size=world.size, rank=world.rank, flops_per_sample=unet_flops_per_sample(params),
                     peak_flops=peak, peak_source=source, precision=precision,
                     json_path=output_path(config, run_dir))
    if on_gpu and github_benchy_available(device):
        logging.info("benchy: using the GitHub benchy (benchy.torch).")
        return _GitHubBenchyLoader(loader, config, **arguments)
    logging.info("benchy: using the built-in trials (%s).",
                 "the GitHub benchy is not importable" if on_gpu else "the GitHub benchy needs a GPU")
    return BenchyLoader(loader, config, **arguments)
