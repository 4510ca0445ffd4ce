"""Helpers of the training scripts: the data-loader dispatcher and the learning-rate schedule.

The loader modules are imported only when asked for, so that optional dependencies of one
loader kind are never needed by another.
"""
import math

NATIVE_LOADERS = ("synthetic", "inmem", "lowmem")


def get_data_loader_distributed(params, world_rank, device=None, world_size=1, block=None):
    """``(train_loader, val_loader)`` for ``params.data_loader_config``: rank ``world_rank``'s share.

    ``device`` is the training device (a ``torch.device``; None is the CPU). On a GPU the native
    loaders pin their batches, so that the copy to the device leaves the host free (the copy still
    runs on the compute stream, between steps: see train.py's ``to_device``), ``gpu-inmem`` keeps the
    volumes on it and cuts the crops there, and ``dali-lowmem`` augments there. ``world_size`` ranks
    share each epoch's samples. ``block`` (domain parallelism):
    ``(start, stop)`` per axis, the part of every turned crop this rank reads and trains on.
    """
    kind = params.data_loader_config
    if kind in NATIVE_LOADERS:
        from utils.data_loader import get_data_loaders

        on_gpu = device is not None and device.type == "cuda"
        return get_data_loaders(params, world_rank, world_size, pin_memory=on_gpu, block=block)
    if kind == "gpu-inmem":
        from utils.data_loader_gpu import get_data_loaders

        return get_data_loaders(params, world_rank, world_size, device, block=block)
    if kind == "dali-lowmem":
        from utils.data_loader_dali import get_data_loaders  # DALI itself is imported only in there

        return get_data_loaders(params, world_rank, world_size, device, block=block)
    raise ValueError(f"unknown data_loader_config {kind!r}")  # YParams.validate refuses it earlier


def lr_schedule(step, total_steps, params):
    """The learning rate for optimiser step ``step`` (0-based): the original tutorial's schedule.

    When the global batch is larger than ``base_batch_size`` and ``lr_scaling`` is ``sqrt`` or
    ``linear``, the initial rate is ``start_lr`` times the square root (or the ratio) of
    global/base, reached linearly over ``warmup_steps``; a cosine then decays it towards ``end_lr``.
    As in the original, the cosine's phase starts where the warm-up ends and runs over
    ``total_steps``, so after a warm-up the last step's rate stays a little above ``end_lr``.
    The original counts steps from 1 (its loop increments the counter before setting the rate):
    step ``s`` here is its step ``s + 1``.
    """
    i = step + 1
    ratio = params.global_batch_size / params.base_batch_size
    initial = params.start_lr * {"none": 1.0, "sqrt": math.sqrt(ratio), "linear": ratio}[params.lr_scaling]
    warmup = params.warmup_steps if ratio > 1 and params.lr_scaling != "none" else 0
    if i < warmup:
        return initial * i / warmup
    phase = (i - warmup) / max(total_steps, 1)
    return params.end_lr + 0.5 * (initial - params.end_lr) * (1.0 + math.cos(math.pi * phase))
