"""Checkpoints that survive interruption.

A checkpoint holds everything needed to continue exactly: the bare model's full weights, the
optimiser and gradient-scaler states, the position (epoch, step, batches done in the epoch), the
random-number-generator states and the resolved config. It is written to a temporary file in
the same directory and renamed over the old one, so a run killed at any moment leaves either
the previous checkpoint or the new one, never half of one. It is read back with
``weights_only=True``: only tensors and plain containers, no arbitrary code. The weights are
stored as on one device, whatever the run's parallelism (under FSDP rank 0 gathers the shards),
so a checkpoint moves freely between one device, DDP and FSDP.

:class:`Checkpointer` decides when to write: a checkpoint of the 117 M-parameter model with Adam's
state is about 1.3 GiB, and with hundreds of short epochs (the large-batch configs on many GPUs)
writing one per epoch can take as long as the training. Each write's duration is logged in a line
of its own: it is outside the epoch timer but inside the job's time to solution and time limit.
"""
import dataclasses
import logging
import os
import time

import torch

from utils.distributed import World, agree_to_stop, full_state_dicts, load_full_state_dicts
from utils.files import atomic_path
from utils.out_of_memory import explained_out_of_memory

CHECKPOINT_NAME = "checkpoint.pt"


def save_checkpoint(path, model, optimizer, scaler, position, params, world=World()):
    """Write the checkpoint from rank 0. Call it on every rank: under FSDP the shards are gathered."""
    states = full_state_dicts(model, optimizer, world)
    if states is None:  # not rank 0
        return
    device = next(model.parameters()).device
    payload = {
        "model": states[0],
        "optimizer": states[1],
        "scaler": scaler.state_dict(),
        "position": dict(position),
        "rng": {
            "torch": torch.get_rng_state(),
            # This GPU's generator (a CPU run never touches the GPU): it fits any number of GPUs on resume.
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        },
        "params": params.to_dict(),
    }
    with atomic_path(path) as temporary:
        torch.save(payload, temporary)


def load_checkpoint(path, model, optimizer, scaler):
    """Restore the states saved by :func:`save_checkpoint`; return the saved position."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    learning_rates = [group["lr"] for group in optimizer.param_groups]
    load_full_state_dicts(model, optimizer, payload["model"], with_implementation(payload["optimizer"], optimizer))
    for group, lr in zip(optimizer.param_groups, learning_rates):
        if torch.is_tensor(lr):  # a capturable optimiser's LR: keep the device tensor a CUDA graph reads
            lr.fill_(float(group["lr"]))
            group["lr"] = lr
    scaler.load_state_dict(payload["scaler"])
    torch.set_rng_state(payload["rng"]["torch"])
    device = next(model.parameters()).device
    if payload["rng"]["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(payload["rng"]["cuda"], device)
    return payload["position"]


# How the optimiser computes its update, which this run chooses, not the checkpoint.
IMPLEMENTATION_FLAGS = ("fused", "foreach", "capturable", "differentiable")


def with_implementation(optimizer_state, optimizer):
    """The saved optimiser state with ``optimizer``'s own implementation flags in its param groups.

    ``load_state_dict`` replaces each param group whole, flags included: without this, resuming a
    train.py checkpoint with train_graph.py would lose the capturable Adam the CUDA graph needs,
    and a run resumed with --enable_fused would silently go on unfused. Loading with this run's
    flags also puts Adam's step counts where a capturable or fused Adam keeps them.
    """
    groups = [{**saved, **{flag: live[flag] for flag in IMPLEMENTATION_FLAGS if flag in live}}
              for saved, live in zip(optimizer_state["param_groups"], optimizer.param_groups)]
    return {**optimizer_state, "param_groups": groups}


class Checkpointer:
    """Writes ``checkpoint.pt`` in the run directory when one is due.

    Due at the end of an epoch once ``checkpoint_interval_s`` seconds have passed since the last
    write (0: after every epoch), and always when the caller says so (a stop signal, the run's end).
    Every rank calls :meth:`save` with the same ``due`` and the ranks agree on the clock's verdict
    (one tiny all-reduce per epoch), because under FSDP all of them take part in gathering the
    weights. Off with ``checkpoint: false``.
    """

    def __init__(self, run_dir, params, world=World(), device=torch.device("cpu")):
        self.path = os.path.join(run_dir, CHECKPOINT_NAME)
        self.params, self.world, self.device = params, world, device
        self.last_write = time.monotonic()  # the run's start counts as a write: the interval runs from there

    def save(self, model, optimizer, scaler, position, due=False):
        """``position``: train.py's Position (a dataclass of epoch, step and batches done in the epoch)."""
        if not self.params.checkpoint:
            return
        elapsed = time.monotonic() - self.last_write
        if not agree_to_stop(due or elapsed >= self.params.checkpoint_interval_s, self.world, self.device):
            return
        start = time.monotonic()
        # Out of GPU memory (the gather of FSDP's shards; copies to the host): the old checkpoint stays.
        with explained_out_of_memory("writing the checkpoint", self.params, self.world, self.device,
                                     os.path.dirname(self.path)):
            save_checkpoint(self.path, model, optimizer, scaler, dataclasses.asdict(position), self.params, self.world)
        self.last_write = time.monotonic()
        if self.world.is_main:
            logging.info("Checkpoint written in %.2f sec (%.2f GiB): %s", self.last_write - start,
                         os.path.getsize(self.path) / 2**30, self.path)
