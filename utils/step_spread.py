"""The spread of step times and data waits across ranks, once an epoch: which rank is the straggler.

In data-parallel training every step ends with the gradients' all-reduce, so every rank's step
takes as long as the slowest rank's: the whole-step times of all ranks are the same, and they
cannot tell who is slow. What differs is the work each rank does before it waits for the others.
:class:`StepSpread` times, on each rank, every step from its start (the call of the step function)
to the moment the rank's last gradient is computed, before the wait for the other ranks' gradients:
its forward and backward. A rank whose GPU is throttled, whose CPU core is shared, or whose
process is held up in its step shows there, and the fast ranks wait for it in the all-reduce.

A rank can also be late before its step starts: its loader is starved (a slow disk or file system on
its node, too few workers, workers whose cores are taken). That time is outside the step, so the
meter also times each rank's data wait: the host's time in ``next()`` of the training loader
(:meth:`StepSpread.waited`) plus the copy of the batch to the device (:meth:`StepSpread.timed_copy`).
It is host time (the wall clock, on CPU and GPU alike): a host loader's workers prepare batches while
the host is busy launching the step, so the host waits in ``next()`` only for what they have not
finished, which is the time the device goes without work once the host has caught up with it. The
copy from pinned memory is queued, not waited for (from pageable memory it would wait for the device's
earlier work too). A data wait that is a sizeable share of the step's own time says that the loader,
not the device, sets that rank's pace.

Each rank averages its own steps and data waits; at the epoch's end one all-gather of three numbers
per rank (never one per step) gives rank 0 the spreads, logged as

    Step time across ranks (forward and backward, before the gradients' all-reduce): min 0.2101 s,
    median 0.2113 s, max 0.4125 s (rank 1, the slowest)
    Data wait across ranks (next batch and its copy to the device, host time): min 0.0012 s,
    median 0.0015 s, max 0.0019 s (rank 2, the longest)

and to TensorBoard as ``Step spread/min_s``, ``median_s``, ``max_s`` and ``slowest_rank``, and beside
them ``Step spread/data_wait_min_s``, ``data_wait_median_s``, ``data_wait_max_s`` and
``data_wait_longest_rank``.

Beside them, under DDP, rank 0 logs DDP's own timers of its forward, backward and gradient
communication, and how much of that communication overlapped the backward pass (:func:`ddp_timers`):

    DDP's timers on rank 0 (averages over the iterations DDP sampled): forward 0.0912 s, backward
    0.1755 s, gradient communication 0.1315 s, of which 0.0938 s during the backward pass (0.0377 s after it)

(two gloo ranks of the demo model on a 2-core CPU, --bucket_cap_mb=1, 2026-11-27: the run and its command are in
docs/10-going-further-distributed.md)

and to TensorBoard as ``Step spread/ddp_forward_s``, ``ddp_backward_s``, ``ddp_communication_s``,
``ddp_overlap_s`` and ``ddp_exposed_s``. DDP takes them itself (CUDA events on a GPU, the wall clock on a CPU) in iterations
1 to 10 and every 100th after (``_set_ddp_runtime_logging_sample_rate`` changes the 100); reading
them once an epoch costs nothing in the steps.

How it is timed: on a GPU with CUDA events recorded on the stream (read at the epoch's end, when the
device has finished anyway: no synchronisation in the steps); on a CPU with the wall clock. The end
of a step's own work is marked by a hook on every parameter after its gradient is accumulated (the
last one to run marks it). Where no such hook runs, the spread is not measured and the line says so:
a step replayed as one CUDA graph (train_graph.py after its warm-up) runs no Python; its data wait is
still measured. Under
--parallel=fsdp and --domain_mesh the step's own work holds collectives too (FSDP's all-gathers, the
halo exchanges), which wait for every rank, so a straggler shows less there than under DDP. The
marks cost a CUDA event record per parameter tensor a step (24 in the U-Net), a few microseconds each.
"""
import logging
import math
import statistics
import time

import torch
import torch.distributed as dist


class _WallClock:
    """Marks on the host's wall clock: a CPU's work is done when the host gets past it."""

    def mark(self, _=None):
        return time.perf_counter()

    def seconds(self, start, end):
        return end - start


class _EventClock:
    """Marks as CUDA events on the current stream: the time at which the GPU gets to them."""

    def mark(self, event=None):
        """Record ``event`` again (its last record stands), or a new one."""
        event = event if event is not None else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end):
        return start.elapsed_time(end) / 1e3  # waits for ``end``: called once the epoch's work is done


# DDP's own timers (torch's DDP logger, ``_get_ddp_logging_data()``: nanoseconds, averaged over the iterations
# it sampled), by the names they are logged under. Overlap: from the first bucket's all-reduce to the end of
# the backward pass.
DDP_TIMERS = {"forward_s": "avg_forward_compute_time", "backward_s": "avg_backward_compute_time",
              "communication_s": "avg_backward_comm_time", "overlap_s": "avg_backward_compute_comm_overlap_time"}


def ddp_timers(model):
    """This rank's DDP timers in seconds (DDP_TIMERS, and ``exposed_s``: the communication after the
    backward pass); None for a model that is not DDP (FSDP, --noddp, one rank) or before DDP timed a step."""
    logging_data = getattr(getattr(model, "_orig_mod", model), "_get_ddp_logging_data", None)
    if logging_data is None:
        return None
    data = logging_data()
    timers = {name: data.get(key, 0) / 1e9 for name, key in DDP_TIMERS.items()}
    if not timers["backward_s"]:
        return None
    return {**timers, "exposed_s": max(0.0, timers["communication_s"] - timers["overlap_s"])}


def step_spread(model, device, world):
    """The spread's timer where there are ranks to compare; on one rank, one that does nothing (no
    hooks, no log line: a single rank has no straggler)."""
    return StepSpread(model, device, world) if world.size > 1 else _OneRank()


class _OneRank:
    def timed(self, step_fn):
        return step_fn

    def timed_copy(self, move):
        return move

    def waited(self, loader):
        return loader

    def log(self, tensorboard, step):
        return None


class _Waited:
    """A loader whose ``next()`` adds its host time to ``meter.waiting`` (``len()`` is the loader's)."""

    def __init__(self, loader, meter):
        self.loader, self.meter = loader, meter

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        # iter() itself is not timed: benchy's loader runs its IO trials there, before the first epoch.
        batches = iter(self.loader)
        while True:
            start = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                self.meter.waiting += time.perf_counter() - start
            yield batch


class StepSpread:
    """Times each step's own work and the wait for its data on this rank; :meth:`log` gathers and
    reports them once an epoch."""

    def __init__(self, model, device, world):
        self.world, self.device, self.model = world, device, model
        self.clock = _EventClock() if device.type == "cuda" else _WallClock()
        self.steps = []        # (start mark, end mark) of each step this epoch; end None if never marked
        self._current = None   # the step under way: [start, end]
        self.waiting = 0.0     # host seconds this epoch in the loader's next() and the copies to the device
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.register_post_accumulate_grad_hook(self._gradient_ready)

    def timed(self, step_fn):
        """``step_fn`` with its start and the end of its own work marked."""
        def step(*args, **kwargs):
            self._current = [self.clock.mark(), None]
            self.steps.append(self._current)
            return step_fn(*args, **kwargs)

        return step

    def waited(self, loader):
        """``loader`` with the host time of each ``next()`` counted as data wait."""
        return _Waited(loader, self)

    def timed_copy(self, move):
        """``move`` (the copy of a tensor to the device) with its host time counted as data wait."""
        def timed_move(tensor):
            start = time.perf_counter()
            try:
                return move(tensor)
            finally:
                self.waiting += time.perf_counter() - start

        return timed_move

    def _gradient_ready(self, _parameter):
        # Every parameter's hook re-marks the step's end, so the last one to run stands. Nothing is
        # recorded while a CUDA graph is captured: a replay would not update the event.
        if self._current is None or (self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return
        self._current[1] = self.clock.mark(self._current[1])

    def mean_seconds(self):
        """This rank's mean own time per step this epoch; NaN unless every step was timed to its end."""
        if not self.steps or any(end is None for _, end in self.steps):
            return float("nan")
        return sum(self.clock.seconds(start, end) for start, end in self.steps) / len(self.steps)

    def mean_wait_seconds(self):
        """This rank's mean data wait per step this epoch (NaN without steps)."""
        return self.waiting / len(self.steps) if self.steps else float("nan")

    def gather(self):
        """Every rank's (mean step, steps timed, mean data wait), one all-gather for the epoch (called
        on all ranks alike); then it starts afresh."""
        local = torch.tensor([self.mean_seconds(), len(self.steps), self.mean_wait_seconds()], dtype=torch.float64,
                             device=self.device if self.device.type == "cuda" else "cpu")  # NCCL: on the GPU
        self.steps, self._current, self.waiting = [], None, 0.0
        if self.world.size == 1:
            return [local.tolist()]
        parts = [torch.empty_like(local) for _ in range(self.world.size)]
        dist.all_gather(parts, local)
        return [part.tolist() for part in parts]

    def log(self, tensorboard, step):
        """Gather the epoch's means and report their spreads at global ``step`` (on rank 0): a dict of
        the scalars written to TensorBoard. Nothing (None) when no rank took a step this epoch (a
        resumed run repeating a validation)."""
        gathered = self.gather()
        if not any(count for _, count, _ in gathered):
            return None
        spread = {}
        means = [mean for mean, _, _ in gathered]
        if any(math.isnan(mean) for mean in means):  # some rank could not time its steps to their end
            logging.info("Step time across ranks: not measured (no hook sees the end of a step replayed as a "
                         "CUDA graph)")
        else:
            spread.update(spread_of(means, "", "slowest_rank"))
            logging.info("Step time across ranks (forward and backward, before the gradients' all-reduce): "
                         "min %.4f s, median %.4f s, max %.4f s (rank %d, the slowest)", spread["min_s"],
                         spread["median_s"], spread["max_s"], spread["slowest_rank"])
        spread.update(spread_of([wait for _, _, wait in gathered], "data_wait_", "data_wait_longest_rank"))
        logging.info("Data wait across ranks (next batch and its copy to the device, host time): min %.4f s, "
                     "median %.4f s, max %.4f s (rank %d, the longest)", spread["data_wait_min_s"],
                     spread["data_wait_median_s"], spread["data_wait_max_s"], spread["data_wait_longest_rank"])
        for name, value in spread.items():
            tensorboard.scalar(f"Step spread/{name}", value, step)
        timers = ddp_timers(self.model)
        if timers:
            logging.info("DDP's timers on rank %d (averages over the iterations DDP sampled): forward %.4f s, backward "
                         "%.4f s, gradient communication %.4f s, of which %.4f s during the backward pass (%.4f s after "
                         "it)", self.world.rank, timers["forward_s"], timers["backward_s"], timers["communication_s"],
                         timers["overlap_s"], timers["exposed_s"])
            for name, value in timers.items():
                tensorboard.scalar(f"Step spread/ddp_{name}", value, step)
            spread.update({f"ddp_{name}": value for name, value in timers.items()})
        return spread


def spread_of(values, prefix, rank_name):
    """Minimum, median and maximum of one number per rank, and the rank of the maximum."""
    highest = max(range(len(values)), key=values.__getitem__)
    return {f"{prefix}min_s": min(values), f"{prefix}median_s": statistics.median(values),
            f"{prefix}max_s": values[highest], rank_name: highest}
