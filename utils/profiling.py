"""Leave-in profiling: named ranges, a profiler window and CUDA memory snapshots, all free when off.

The training code is instrumented once and for all::

    with annotate("forward"):
        outputs = model(inputs)

``annotate`` costs a dictionary look-up and two no-op method calls until profiling is switched
on, at start-up, by :class:`Profiling` (or :func:`enable_annotations`). Then every range is an
NVTX range on CUDA (what Nsight Systems shows) and a ``torch.profiler.record_function`` range
everywhere (what the torch profiler trace shows). This replaces the original tutorial's ten
``if profiling: nvtx.range_push(...)`` lines in the loop.

:class:`Profiling` turns the profiling options of ``config/UNet.yaml`` into actions at the right
training steps. The loop calls ``profiling.step(global_step)`` at the start of every step; it
compares one integer until something is due:

- ``enable_manual_profiling``: NVTX ranges, and on rank 0 ``torch.cuda.profiler.start()`` at the
  first step of epoch ``profile_start_epoch`` (1-based) and ``stop()`` ``profile_steps`` steps
  later, for ``nsys profile -c cudaProfilerApi``.
- ``profiler: torch``: a torch.profiler trace of the same window on rank 0, written to
  ``<run_dir>/profile/`` as ``*.pt.trace.json`` (Perfetto, chrome://tracing, or TensorBoard's
  profiler plugin).
- ``memory_snapshot``: the CUDA allocator's history over the first ``memory_snapshot_steps``
  steps, dumped to ``<run_dir>/memory_snapshot.pickle`` for https://pytorch.org/memory_viz, and
  a snapshot on ``torch.cuda.OutOfMemoryError`` when the loop runs inside ``with profiling:``.
"""
import contextlib
import functools
import glob
import logging
import math
import os

import torch

from utils.errors import UserError

# The module-level switch read by annotate(). Set once at start-up; the loop never tests it itself.
_annotations_on = False
_nvtx_on = False

# Snapshots keep this many allocator events: enough for tens of steps of this model.
MEMORY_HISTORY_ENTRIES = 100_000
_MAX_CACHED_NAMES = 512


# ----------------------------------------------------------------------------- annotate

class _Annotation:
    """What ``annotate(name)`` returns: usable with ``with`` and as a decorator."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __call__(self, function):
        # Decorators are applied at import time, before profiling is switched on, so the wrapper
        # asks annotate() again at every call instead of freezing today's answer.
        name = self.name

        @functools.wraps(function)
        def annotated(*args, **kwargs):
            with annotate(name):
                return function(*args, **kwargs)

        return annotated


class _Inactive(_Annotation):
    """Profiling is off: entering and leaving do nothing. One shared instance per range name."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False


class _Range(_Annotation):
    """Profiling is on: an NVTX range (CUDA only) around a record_function range."""

    __slots__ = ("_record", "_nvtx")

    def __enter__(self):
        # Remember whether NVTX was pushed, so that the pop matches even if the switch changes inside.
        self._nvtx = _nvtx_on
        if self._nvtx:
            torch.cuda.nvtx.range_push(self.name)
        self._record = torch.profiler.record_function(self.name)
        self._record.__enter__()
        return self

    def __exit__(self, *exc_info):
        self._record.__exit__(*exc_info)
        if self._nvtx:
            torch.cuda.nvtx.range_pop()
        return False


_inactive = {}


def annotate(name, index=None):
    """A named range for profilers: ``with annotate("forward"):`` or ``@annotate("loss")``.

    ``index`` is appended to the name (``annotate("step", 7)`` is the range ``step 7``), and only
    when profiling is on, so that a per-step name costs no string formatting when it is off.
    """
    if _annotations_on:
        return _Range(name if index is None else f"{name} {index}")
    inactive = _inactive.get(name)
    if inactive is None:
        inactive = _Inactive(name)
        if len(_inactive) < _MAX_CACHED_NAMES:  # names made on the fly must not grow this forever
            _inactive[name] = inactive
    return inactive


def range_name(name):
    """The name :func:`annotate` was given, from the range it made (``"step 7"`` -> ``"step"``)."""
    base, _, last = name.rpartition(" ")
    return base if base and last.isdigit() else name


def enable_annotations(nvtx=False):
    """Switch annotate() on: record_function ranges everywhere, plus NVTX ranges when ``nvtx``.

    NVTX needs a CUDA build of PyTorch: ``torch.cuda.nvtx.range_push`` raises "NVTX functions not
    installed" on a CPU build, so NVTX is probed once here and left off where it cannot work.
    """
    global _annotations_on, _nvtx_on
    if nvtx:
        try:
            torch.cuda.nvtx.range_push("nvtx probe")
            torch.cuda.nvtx.range_pop()
        except (RuntimeError, AttributeError) as error:
            logging.info("NVTX ranges are not available (%s): profiler ranges only.", error)
            nvtx = False
    _annotations_on, _nvtx_on = True, nvtx


def disable_annotations():
    global _annotations_on, _nvtx_on
    _annotations_on, _nvtx_on = False, False


def annotations_enabled():
    return _annotations_on


# ----------------------------------------------------------------------------- options

# The original tutorial's nsys windows: train.py's from the 4th epoch for 60 steps; train_graph.py's,
# whose shorter runs warm up and capture first, from the 2nd epoch for 30 steps.
DEFAULT_WINDOWS = {"train.py": {"profile_start_epoch": 4, "profile_steps": 60},
                   "train_graph.py": {"profile_start_epoch": 2, "profile_steps": 30}}


def default_profile_window(params, script="train.py"):
    """Give the window keys that the config leaves null the original's values for ``script``."""
    params.update({key: value for key, value in DEFAULT_WINDOWS[script].items() if params.get(key) is None})


def profile_window(params, steps_per_epoch):
    """``(first, stop)``: the global steps (0-based, ``stop`` excluded) of the profiling window."""
    first = (params.get("profile_start_epoch", 1) - 1) * steps_per_epoch
    return first, first + params.get("profile_steps", 1)


def check_profiling_options(params, steps_per_epoch, device=None):
    """Refuse profiling and benchmarking options that cannot work, before anything is trained.

    Call once, when the loader (hence ``steps_per_epoch``) is known; ``device`` tells whether the
    GitHub benchy (CUDA only) would run, which needs one more epoch than the built-in one.
    """
    benchy, manual = params.get("enable_benchy"), params.get("enable_manual_profiling")
    traced = params.get("profiler", "none") == "torch"
    if benchy and (manual or traced):
        other = "--enable_manual_profiling" if manual else "--profiler=torch"
        raise UserError(f"--enable_benchy and {other} cannot be combined: benchy measures throughput, "
                        "and the profiler slows down the very steps it times (benchy also drives the "
                        "CUDA profiler window itself). Run the benchmark and the profile as two jobs.")
    if manual or traced:
        epochs = params.num_epochs
        start_epoch = params.get("profile_start_epoch", 1)
        option = "--enable_manual_profiling" if manual else "--profiler=torch"
        if start_epoch > epochs:
            raise UserError(f"{option} profiles from epoch profile_start_epoch={start_epoch}, but the run "
                            f"has only num_epochs={epochs}. Use --profile_start_epoch={epochs} (or less), "
                            f"or --num_epochs={start_epoch}.")
        first, stop = profile_window(params, steps_per_epoch)
        total = epochs * steps_per_epoch
        if stop > total:
            raise UserError(f"{option}: the window of profile_steps={params.profile_steps} steps from "
                            f"epoch {start_epoch} (global step {first}) runs past the end of training "
                            f"at step {total} ({epochs} epochs of {steps_per_epoch} steps). Use "
                            f"--profile_steps={total - first} or less, an earlier --profile_start_epoch, "
                            "or more --num_epochs.")
    if benchy:
        from utils.benchmark import check_benchy_options

        check_benchy_options(params, device)


# ----------------------------------------------------------------------------- the controller

class Profiling:
    """The profiling options of a run, turned into actions at the right steps.

    Build once (every rank), then::

        with profiling:                       # ends an open window; snapshot on CUDA OOM
            for ...:                          # the training loop
                profiling.step(global_step)   # at the start of every step
                with annotate("step", global_step):
                    ...

    When every option is off, ``step`` compares two integers and returns.
    """

    def __init__(self, params, is_main, device, run_dir, steps_per_epoch, with_stack=False):
        self.is_main = is_main
        self.cuda = torch.device(device).type == "cuda"
        self.run_dir = run_dir
        self.with_stack = with_stack
        self.manual = bool(params.get("enable_manual_profiling"))
        self.traced = params.get("profiler", "none") == "torch"
        self.first, self.stop = profile_window(params, steps_per_epoch)
        self.snapshot_steps = params.get("memory_snapshot_steps", 10)
        self.snapshot = bool(params.get("memory_snapshot")) and self._cuda_snapshot_possible()

        # Window state: rank 0 owns the CUDA profiler window and the trace (the original's choice).
        self._cuda_window = self.manual and self.cuda and is_main
        self._window_pending = (self._cuda_window or self.traced and is_main)
        self._window_open = False
        self._cuda_started = False
        self._torch_profiler = None
        self.trace_files = []

        self._snapshot_pending = self.snapshot
        self._snapshot_stop = None
        self.snapshot_file = None
        self._last_step = None  # the last step _advance saw: every step while a window is open

        if self.manual or self.traced:
            enable_annotations(nvtx=self.manual and self.cuda)
        if self.manual and not self.cuda and is_main:
            logging.info("--enable_manual_profiling on CPU: there is no CUDA profiler window for nsys; "
                         "annotate() emits torch.profiler ranges only.")
        self._next_event = 0 if (self._window_pending or self._snapshot_pending) else math.inf

    def _cuda_snapshot_possible(self):
        if not self.cuda:
            if self.is_main:
                logging.info("--memory_snapshot: CUDA memory snapshots need a GPU; nothing is recorded "
                             "on the CPU (see --profiler=torch for a CPU trace).")
            return False
        return True

    # --- the per-step hook

    def step(self, global_step):
        """Call at the start of every training step, with the number of steps taken so far."""
        if global_step < self._next_event:
            return
        self._advance(global_step)

    def _advance(self, step):
        self._last_step = step
        if self._snapshot_pending:
            self._start_memory_history(step)
        elif self._snapshot_stop is not None and step >= self._snapshot_stop:
            self._dump_memory_history()

        if self._window_open:
            if step >= self.stop:
                self._close_window(step)
            else:
                if self._torch_profiler is not None:
                    self._torch_profiler.step()
                if self._cuda_window and not self._cuda_started and step >= self.first:
                    self._start_cuda_profiler()
        elif self._window_pending and self._opens_at() <= step < self.stop:
            self._open_window(step)
        elif self._window_pending and step >= self.stop:  # resumed past the window
            self._window_pending = False
            logging.info("The profiling window (steps %d-%d) was passed before this run resumed at step "
                         "%d: nothing is profiled.", self.first, self.stop - 1, step)

        events = []
        if self._snapshot_stop is not None:
            events.append(self._snapshot_stop)
        if self._window_open:
            events.append(step + 1)  # a live torch profiler must see every step
        elif self._window_pending:
            events.append(self._opens_at())
        self._next_event = min(events, default=math.inf)

    # --- the profiling window

    def _opens_at(self):
        # The torch profiler starts one step early: that step is its warm-up, not in the trace.
        return max(self.first - 1, 0) if self.traced and self.is_main else self.first

    def _open_window(self, step):
        self._window_pending, self._window_open = False, True
        logging.info("Profiling window: global steps %d to %d.", max(step, self.first), self.stop - 1)
        if self.traced and self.is_main:
            self._start_torch_profiler(step)
        if self._cuda_window and step >= self.first:
            self._start_cuda_profiler()

    def _start_cuda_profiler(self):
        torch.cuda.synchronize()  # the window starts with no earlier work in flight
        torch.cuda.profiler.start()
        self._cuda_started = True

    def _start_torch_profiler(self, step):
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        warmup = max(self.first - step, 0)
        active = self.stop - max(step, self.first)
        self._trace_dir = os.path.join(self.run_dir, "profile")
        os.makedirs(self._trace_dir, exist_ok=True)
        self._traces_before = set(glob.glob(os.path.join(self._trace_dir, "*.pt.trace.json")))
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        trace_handler = torch.profiler.tensorboard_trace_handler(self._trace_dir, worker_name=f"rank{rank}")
        self._torch_profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=0, warmup=warmup, active=active, repeat=1),
            # *.pt.trace.json: Chrome trace JSON, which TensorBoard's profiler plugin also reads.
            on_trace_ready=trace_handler,
            record_shapes=True,
            with_stack=self.with_stack,
        )
        self._torch_profiler.start()

    def _close_window(self, step):
        self._window_open = False
        if self._cuda_started:
            torch.cuda.synchronize()  # the window ends with the last step's kernels inside it
            torch.cuda.profiler.stop()
            self._cuda_started = False
        if self._torch_profiler is not None:
            self._torch_profiler.stop()  # writes the trace if the schedule has not already
            self._torch_profiler = None
            after = set(glob.glob(os.path.join(self._trace_dir, "*.pt.trace.json")))
            self.trace_files = sorted(after - self._traces_before)
            for path in self.trace_files:
                logging.info("Torch profiler trace of steps %d-%d: %s (open in https://ui.perfetto.dev, "
                             "or TensorBoard with the torch-tb-profiler plugin)", self.first, step - 1, path)
        logging.info("Profiling window closed at global step %d.", step)

    # --- CUDA memory snapshots

    def _start_memory_history(self, step):
        self._snapshot_pending = False
        torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
        self._snapshot_stop = step + self.snapshot_steps

    def _dump_memory_history(self):
        if self.is_main:
            self.snapshot_file = os.path.join(self.run_dir, "memory_snapshot.pickle")
            torch.cuda.memory._dump_snapshot(self.snapshot_file)
            logging.info("CUDA memory snapshot of up to %d steps from global step %d: %s (drag it onto "
                         "https://pytorch.org/memory_viz)", self.snapshot_steps,
                         self._snapshot_stop - self.snapshot_steps, self.snapshot_file)
        torch.cuda.memory._record_memory_history(enabled=None)
        self._snapshot_stop = None

    def _dump_on_oom(self):
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        path = os.path.join(self.run_dir, f"memory_snapshot_oom_rank{rank}.pickle")
        try:
            os.makedirs(self.run_dir, exist_ok=True)
            torch.cuda.memory._dump_snapshot(path)
        except (RuntimeError, OSError) as error:  # reporting the OOM matters more than the snapshot
            logging.warning("Out of GPU memory; the memory snapshot could not be written (%s).", error)
        else:
            logging.warning("Out of GPU memory: allocator snapshot in %s (drag it onto "
                            "https://pytorch.org/memory_viz).", path)

    # --- around the training loop

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, traceback):
        """End what is still open: a window cut short by the end of the run, a snapshot not yet dumped."""
        if exc_type is not None and issubclass(exc_type, torch.cuda.OutOfMemoryError):
            if self.snapshot:
                self._dump_on_oom()
            elif self.is_main:
                logging.warning("Out of GPU memory. Rerun with --memory_snapshot to see what held it.")
        with contextlib.suppress(RuntimeError, OSError):  # never mask what ended the loop
            if self._window_open:
                self._close_window(self._last_step + 1)
            if self._snapshot_stop is not None:
                self._dump_memory_history()
        self._next_event = math.inf
        if self.manual or self.traced:
            disable_annotations()
        return False
