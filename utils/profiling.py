"""Leave-in profiling: named ranges, a profiling window and CUDA memory snapshots, all free when off.

The training code is instrumented once and for all::

    with annotate("forward"):
        outputs = model(inputs)

``annotate`` returns a shared null context until profiling is switched on, at start-up, by
:class:`Profiling` (or :func:`enable_annotations`). Then every range is an NVTX range on CUDA
(what Nsight Systems shows) and a ``torch.profiler.record_function`` range everywhere (what the
torch profiler trace shows). This replaces the original tutorial's ten
``if profiling: nvtx.range_push(...)`` lines in the loop.

:class:`Profiling` turns the profiling options of ``config/UNet.yaml`` into actions at the right
training steps; the loop calls ``profiling.step(global_step)`` at the start of every step:

- ``enable_manual_profiling``: NVTX ranges, and on every rank ``torch.cuda.profiler.start()`` at
  the first step of epoch ``profile_start_epoch`` (1-based) and ``stop()`` ``profile_steps`` steps
  later, for ``nsys profile -c cudaProfilerApi`` (one report per rank).
- ``profiler: torch``: a torch.profiler trace of the same window on rank 0, scheduled by
  ``torch.profiler.schedule``, written to ``<run_dir>/profile/rank0.steps<A>-<B>.pt.trace.json``
  (Perfetto, chrome://tracing, or TensorBoard's profiler plugin).
- ``memory_snapshot``: the CUDA allocator's history over the first ``memory_snapshot_steps``
  steps, dumped to ``<run_dir>/memory_snapshot.pickle`` for https://pytorch.org/memory_viz, and a
  snapshot on ``torch.cuda.OutOfMemoryError`` when the loop runs inside ``with profiling:``.
"""
import contextlib
import logging
import os

import torch

from utils.errors import UserError

# Snapshots keep this many allocator events: enough for tens of steps of this model.
MEMORY_HISTORY_ENTRIES = 100_000

# The switches read by annotate(). Set once at start-up; the loop never tests them itself.
_ranges_on = False
_nvtx_on = False
_OFF = contextlib.nullcontext()


# ----------------------------------------------------------------------------- annotate

class _Range:
    """An NVTX range (CUDA only) around a record_function range."""

    __slots__ = ("name", "_record", "_nvtx")

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self._nvtx = _nvtx_on  # the pop must match the push even if the switch changes inside
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


def annotate(name, index=None):
    """A named range for profilers: ``with annotate("forward"):``; a null context when profiling is off.

    ``index`` is appended to the name (``annotate("step", 7)`` is the range ``step 7``), and only
    when profiling is on, so that a per-step name costs no string formatting when it is off.
    """
    if not _ranges_on:
        return _OFF
    return _Range(name if index is None else f"{name} {index}")


def range_name(name):
    """The name :func:`annotate` was given, from the range it made (``"step 7"`` -> ``"step"``)."""
    base, _, last = name.rpartition(" ")
    return base if base and last.isdigit() else name


def enable_annotations(nvtx=False):
    """Switch annotate() on: record_function ranges everywhere, plus NVTX ranges when ``nvtx``.

    NVTX needs a CUDA build of PyTorch: ``torch.cuda.nvtx.range_push`` raises "NVTX functions not
    installed" on a CPU build, so NVTX is probed once here and left off where it cannot work.
    """
    global _ranges_on, _nvtx_on
    if nvtx:
        try:
            torch.cuda.nvtx.range_push("nvtx probe")
            torch.cuda.nvtx.range_pop()
        except (RuntimeError, AttributeError) as error:
            logging.info("NVTX ranges are not available (%s): profiler ranges only.", error)
            nvtx = False
    _ranges_on, _nvtx_on = True, nvtx


def disable_annotations():
    global _ranges_on, _nvtx_on
    _ranges_on, _nvtx_on = False, False


def annotations_enabled():
    return _ranges_on


# ----------------------------------------------------------------------------- options

# The original tutorial's nsys windows: train.py's from the 4th epoch for 60 steps; train_graph.py's,
# whose shorter runs warm up and capture first, from the 2nd epoch for 30 steps. The config's nulls
# mean these (utils.YParams.load_params fills them in for the script that runs).
DEFAULT_WINDOWS = {"train.py": {"profile_start_epoch": 4, "profile_steps": 60},
                   "train_graph.py": {"profile_start_epoch": 2, "profile_steps": 30}}


def profile_window(params, steps_per_epoch):
    """``(first, stop)``: the global steps (0-based, ``stop`` excluded) of the profiling window."""
    first = (params.profile_start_epoch - 1) * steps_per_epoch
    return first, first + params.profile_steps


def check_profiling_options(params, steps_per_epoch):
    """Refuse profiling options that cannot work, before anything is trained (``steps_per_epoch``
    comes from the training loader)."""
    manual, traced = params.enable_manual_profiling, params.profiler == "torch"
    if params.enable_benchy and (manual or traced):
        other = "--enable_manual_profiling" if manual else "--profiler=torch"
        raise UserError(f"--enable_benchy and {other} cannot be combined: benchy measures throughput, "
                        "and the profiler slows down the very steps it times (benchy also drives the "
                        "CUDA profiler window itself). Run the benchmark and the profile as two jobs.")
    if not (manual or traced):
        return
    epochs, start_epoch = params.num_epochs, params.profile_start_epoch
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


# ----------------------------------------------------------------------------- the window

class Profiling:
    """The profiling options of a run, turned into actions at the right steps.

    Build once, on every rank, when the loop is about to start at global step ``start_step``
    (non-zero for a resumed run), then::

        with profiling:                       # ends an open window; snapshot on CUDA OOM
            for ...:                          # the training loop
                profiling.step(global_step)   # at the start of every step
                with annotate("step", global_step):
                    ...

    When every option is off, ``step`` tests one attribute and returns.
    """

    def __init__(self, params, world, device, run_dir, steps_per_epoch, start_step=0):
        cuda = device.type == "cuda"
        manual, traced = params.enable_manual_profiling, params.profiler == "torch"
        self.run_dir, self.rank = run_dir, world.rank
        self.first, self.stop = profile_window(params, steps_per_epoch)
        self.cuda_window = manual and cuda and start_step < self.stop
        self.cuda_started = False
        self.torch_profiler = None
        self.trace_files = []
        self.snapshot_at = None  # the step at which the memory history is dumped

        if manual or traced:
            enable_annotations(nvtx=manual and cuda)
        if manual and not cuda and world.is_main:
            logging.info("--enable_manual_profiling on CPU: there is no CUDA profiler window for nsys; "
                         "annotate() emits torch.profiler ranges only.")
        if (manual or traced) and start_step >= self.stop and world.is_main:
            logging.info("The profiling window (steps %d-%d) was passed before this run resumed at step "
                         "%d: nothing is profiled.", self.first, self.stop - 1, start_step)
        elif traced and world.is_main:  # the original's choice: one trace, rank 0's
            self.torch_profiler = self._start_torch_profiler(cuda, start_step)
        if params.memory_snapshot and not cuda and world.is_main:
            logging.info("--memory_snapshot: CUDA memory snapshots need a GPU; nothing is recorded "
                         "on the CPU (see --profiler=torch for a CPU trace).")
        elif params.memory_snapshot and cuda:
            # Python stacks only: C++ frames take minutes to symbolise for every recorded event.
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES, stacks="python")
            self.snapshot_at = start_step + params.memory_snapshot_steps
        self.active = self.cuda_window or self.torch_profiler is not None or self.snapshot_at is not None

    def _start_torch_profiler(self, cuda, start_step):
        """A torch profiler whose schedule traces the window's steps, started now.

        ``step()`` is called at the start of every step, so the schedule's step k is the global
        step ``start_step + k - 1``; k = 0 is the set-up before the first step. One untraced
        warm-up step precedes the window when there is room for it.
        """
        opens = max(self.first - 1, start_step)
        warmup = max(self.first - opens, 0)  # 1, or 0 when the window starts at this run's first step or earlier
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(skip_first=opens - start_step + 1, wait=0, warmup=warmup,
                                             active=self.stop - max(self.first, start_step), repeat=1),
            on_trace_ready=self._save_trace, record_shapes=True)
        profiler.start()
        logging.info("Profiling window: global steps %d to %d.", max(self.first, start_step), self.stop - 1)
        return profiler

    def _save_trace(self, profiler):
        directory = os.path.join(self.run_dir, "profile")
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"rank{self.rank}.steps{self.first}-{self.stop - 1}.pt.trace.json")
        profiler.export_chrome_trace(path)  # Chrome trace JSON, which TensorBoard's profiler plugin also reads
        self.trace_files.append(path)
        logging.info("Torch profiler trace of steps %d-%d: %s (open in https://ui.perfetto.dev, or "
                     "TensorBoard with the torch-tb-profiler plugin)", self.first, self.stop - 1, path)

    def step(self, global_step):
        """Call at the start of every training step, with the number of steps taken so far."""
        if not self.active:
            return
        if self.cuda_window:
            if not self.cuda_started and self.first <= global_step < self.stop:
                torch.cuda.synchronize()  # the window starts with no earlier work in flight
                torch.cuda.profiler.start()
                self.cuda_started = True
                logging.info("CUDA profiler window: global steps %d to %d.", global_step, self.stop - 1)
            elif global_step >= self.stop:
                self._stop_cuda_window()
        if self.torch_profiler is not None:
            self.torch_profiler.step()
        if self.snapshot_at is not None and global_step >= self.snapshot_at:
            self._dump_memory_history()

    def _stop_cuda_window(self):
        if self.cuda_started:
            torch.cuda.synchronize()  # the window ends with the last step's kernels inside it
            torch.cuda.profiler.stop()
        self.cuda_window = self.cuda_started = False

    def _dump_memory_history(self, suffix=""):
        """Rank 0's history into memory_snapshot.pickle, then stop recording; with ``suffix``
        (out of memory) every rank's, and recording goes on."""
        path = os.path.join(self.run_dir, f"memory_snapshot{suffix}.pickle")
        if self.rank == 0 or suffix:
            torch.cuda.memory._dump_snapshot(path)
            logging.info("CUDA memory snapshot: %s (drag it onto https://pytorch.org/memory_viz)", path)
        if not suffix:
            torch.cuda.memory._record_memory_history(enabled=None)
            self.snapshot_at = None

    # --- around the training loop

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, traceback):
        """End what is still open: a window cut short by the end of the run, a snapshot not yet dumped."""
        with contextlib.suppress(RuntimeError, OSError):  # never mask what ended the loop
            if exc_type is not None and issubclass(exc_type, torch.cuda.OutOfMemoryError):
                if self.snapshot_at is not None:
                    os.makedirs(self.run_dir, exist_ok=True)
                    self._dump_memory_history(suffix=f"_oom_rank{self.rank}")
                elif self.rank == 0:
                    logging.warning("Out of GPU memory. Rerun with --memory_snapshot to see what held it.")
            self._stop_cuda_window()
            if self.torch_profiler is not None:
                self.torch_profiler.stop()  # writes the trace of a window cut short
                self.torch_profiler = None
            if self.snapshot_at is not None:
                self._dump_memory_history()
        self.active = False
        disable_annotations()
        return False
