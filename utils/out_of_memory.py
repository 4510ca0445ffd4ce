"""A CUDA out-of-memory error in a training run, ended in one paragraph: the batch, the memory, the fixes.

torch's own message names bytes and allocator settings; what a user changes is the batch, the
precision or the number of ranks a sample is split over. What allocates GPU memory in a training
run runs under :func:`explained_out_of_memory` (:func:`guard_out_of_memory` for a function): in
train.py building the model (``--exact_forms=auto`` times each layer at the run's micro-batch), the
step, validation and the loop around them (the loader's next batch, with the device prefetcher's
copy or ``--side_stream_gather``'s gather; a batch's copy to the device); in utils/checkpoint.py the
writing of a checkpoint. There an error that :func:`is_out_of_memory` recognises becomes
:class:`OutOfMemory`, a paragraph that says:

- the batch: samples per rank, per micro-batch (``--grad_accum_steps``), the global batch, the
  crop and the precision;
- the memory: what the GPU has, and what PyTorch had allocated and reserved at the failure (read
  from torch.cuda before the failed step's tensors are released);
- the fixes: a smaller ``--local_batch_size``, more ``--grad_accum_steps`` (the same global batch
  in smaller micro-batches), a domain mesh (each sample split over ranks), a lower precision.

Not every out-of-memory error is torch's ``torch.cuda.OutOfMemoryError``. Other libraries fail to
allocate too, and torch raises their error as a ``RuntimeError`` whose text says so: cuDNN under
memory pressure ("FIND was unable to find an engine", ``CUDNN_STATUS_INTERNAL_ERROR``,
``CUDNN_STATUS_ALLOC_FAILED``), cuFFT's plans (``CUFFT_ALLOC_FAILED``, the validation metrics'
spectra), cuBLAS's handles, the CUDA driver outside the allocator ("CUDA error: out of memory", a
``torch.AcceleratorError`` in newer torch: a stream, an event, a CUDA graph's instantiation) and
NCCL's own buffers (a ``DistBackendError`` that says "out of memory";
:func:`utils.distributed.is_lost_rank_error` does not call it a lost rank). The paragraph quotes
the line of such an error that says so, since some of these (cuDNN's internal error) have other
causes too.

:class:`OutOfMemory` is a :class:`~utils.errors.RankError` (only the rank that ran out knows it; it
prints its own paragraph and the run ends with status 2, the others when they lose it) and still a
``torch.cuda.OutOfMemoryError``, so that :class:`utils.profiling.Profiling` dumps its memory snapshot
on the way out; the paragraph, printed after that, names the snapshot it wrote. Nothing is written
on the way: the last checkpoint, written whole at an epoch's end, stays as it was.
"""
import contextlib
import functools
import os
import re
import time

import torch

from utils.errors import RankError

GIB = 2**30


# What the error of a library other than torch's allocator says when it could not allocate (lower case).
OUT_OF_MEMORY_PHRASES = ("out of memory",                   # the CUDA driver's error, NCCL's "Cuda failure"
                         "alloc_failed",                    # CUDNN_STATUS_, CUFFT_, CUBLAS_STATUS_ALLOC_FAILED
                         "unable to find an engine",        # cuDNN: no algorithm whose workspace fits
                         "cudnn_status_internal_error")     # cuDNN, most often an allocation inside it


def is_out_of_memory(error):
    """Whether ``error`` says that the GPU ran out of memory: torch's own error, or a runtime error of
    cuDNN, cuFFT, cuBLAS, the CUDA driver or NCCL whose text says so."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    runtime = (RuntimeError, getattr(torch, "AcceleratorError", RuntimeError))  # torch 2.4 has no AcceleratorError
    return isinstance(error, runtime) and line_saying_so(error) is not None


def line_saying_so(error):
    """The line of ``error``'s text that says it is out of memory, or None."""
    return next((line.strip() for line in str(error).splitlines()
                 if any(phrase in line.lower() for phrase in OUT_OF_MEMORY_PHRASES)), None)


class OutOfMemory(RankError, torch.cuda.OutOfMemoryError):
    """Out of GPU memory, explained. The memory snapshot, when Profiling writes one after this error is
    raised, is named when the paragraph is printed; ``snapshot`` False: none can be recorded where it
    happened (before training starts)."""

    def __init__(self, text, snapshot=None):
        super().__init__(text)
        self.text, self.snapshot, self.raised = text, snapshot, time.time()

    def __str__(self):
        if self.snapshot is False:
            return self.text
        written = (self.snapshot is not None and os.path.exists(self.snapshot)
                   and os.path.getmtime(self.snapshot) >= self.raised - 1)
        if written:
            return (f"{self.text} The memory snapshot at the failure: {self.snapshot} (drag it onto "
                    "https://pytorch.org/memory_viz to see which tensors held the memory).")
        return f"{self.text} Rerun with --memory_snapshot to record which tensors held the memory."


def memory_at_failure(device):
    """What the GPU has and what PyTorch holds on it, in bytes: None off CUDA, or where the driver
    cannot answer."""
    if device.type != "cuda":
        return None
    try:
        free, total = torch.cuda.mem_get_info(device)
        return {"total": total, "free": free, "allocated": torch.cuda.memory_allocated(device),
                "reserved": torch.cuda.memory_reserved(device), "peak": torch.cuda.max_memory_allocated(device)}
    except RuntimeError:
        return None


def larger_divisor(number, than):
    """The smallest divisor of ``number`` above ``than``, or None."""
    return next((k for k in range(than + 1, number + 1) if number % k == 0), None)


@contextlib.contextmanager
def explained_out_of_memory(where, params, world, device, run_dir=None):
    """Raise an out-of-memory error in the block (:func:`is_out_of_memory`; ``where``: "a training step",
    ...) as :class:`OutOfMemory`; pass any other error, and one already explained, as it is. ``run_dir``:
    the run directory, None before it is known (nothing is written then)."""
    try:
        yield
    except OutOfMemory:
        raise
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        raise explain(error, where, params, world, device, run_dir) from error


def guard_out_of_memory(function, where, params, world, device, run_dir):
    """``function`` run under :func:`explained_out_of_memory`. A few Python calls more per call; no host
    synchronisation."""
    @functools.wraps(function)
    def guarded(*args, **kwargs):
        with explained_out_of_memory(where, params, world, device, run_dir):
            return function(*args, **kwargs)
    return guarded


def explain(error, where, params, world, device, run_dir=None):
    """The :class:`OutOfMemory` paragraph for ``error``, read while the failed step's tensors live."""
    ranks_per_sample = params.domain_mesh[0] * params.domain_mesh[1] * params.domain_mesh[2]
    data_parallel = max(world.size // ranks_per_sample, 1)
    local = params.global_batch_size // data_parallel
    steps = params.grad_accum_steps
    micro = local // steps
    text = (f"Rank {world.rank} ran out of GPU memory on {device} in {where}{what_failed(error)}. "
            f"The batch: {local} sample(s) per rank"
            + (f" in {steps} micro-batches of {micro} (--grad_accum_steps={steps})" if steps > 1 else "")
            + f", a global batch of {params.global_batch_size} over {data_parallel} data-parallel rank(s)"
            + (f", each sample split over {ranks_per_sample} ranks (--domain_mesh={list(params.domain_mesh)})"
               if ranks_per_sample > 1 else "")
            + f", crops of {params.crop_size}^3, precision {precision_name(params.amp_mode)}. "
            + describe_memory(memory_at_failure(device)) + " " + fixes(params, local, steps, micro)
            + (" Nothing was written." if run_dir is None else
               f" Nothing was written after the last checkpoint: the run directory {run_dir} keeps it, if the run "
               "has one, as its last epoch left it."))
    if run_dir is None:  # before training: no memory history is recorded yet
        return OutOfMemory(text, snapshot=False)
    snapshot = os.path.join(run_dir, f"memory_snapshot_oom_rank{world.rank}.pickle")
    return OutOfMemory(text, snapshot if params.memory_snapshot else None)


def what_failed(error):
    """What the error says it could not do: torch's allocator the size it asked for ("tried to allocate
    2.00 GiB"), another library the line that says so (cuDNN's internal error may have other causes too)."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        asked = re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", str(error))
        return f" (tried to allocate {asked.group(1)})" if asked else ""
    return f" ({type(error).__name__}: {line_saying_so(error)})"


def fixes(params, local, steps, micro):
    """What lowers the memory of one forward and backward, each with the option to pass."""
    found = []
    if local > 1:
        found.append(f"a smaller --local_batch_size (e.g. --local_batch_size={local // 2}; the global batch "
                     "shrinks with it)")
    more = larger_divisor(local, steps)
    if micro > 1 and more is not None:
        found.append(f"--grad_accum_steps={more}, which keeps the global batch and runs it in micro-batches of "
                     f"{local // more}")
    depth, height, width = params.domain_mesh
    found.append(f"a domain mesh, --domain_mesh=[{2 * depth},{height},{width}] on twice the ranks, which splits "
                 "each sample's activations over them")
    if params.amp_mode == "none":
        found.append("--amp_mode=bf16, which about halves the activations' memory of this fp32 run")
    return "To fit, use " + "; or ".join(found) + "."


def precision_name(amp_mode):
    return "fp32 (--amp_mode=none)" if amp_mode == "none" else f"{amp_mode} autocast (--amp_mode={amp_mode})"


def describe_memory(memory):
    if memory is None:
        return "PyTorch reports no GPU memory figures for this device."
    return (f"The memory: the GPU has {memory['total'] / GIB:.1f} GiB, {memory['free'] / GIB:.1f} GiB of it free at "
            f"the failure, when PyTorch had {memory['allocated'] / GIB:.1f} GiB allocated and "
            f"{memory['reserved'] / GIB:.1f} GiB reserved (peak allocated: {memory['peak'] / GIB:.1f} GiB).")
