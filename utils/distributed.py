"""Process-group set-up and the data-parallel wrapper: the only module that touches torch.distributed set-up.

One process per device. The launcher sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT`` (torchrun does; under Slurm ``export_DDP_vars.sh`` maps them from ``SLURM_*``).
Without them the run is a single process and nothing here does anything.
"""
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from utils.errors import UserError


@dataclass(frozen=True)
class World:
    size: int = 1
    rank: int = 0
    local_rank: int = 0

    @property
    def is_main(self):
        return self.rank == 0


def read_world():
    """This process's place in the job, from the launcher's environment variables."""
    try:
        return World(int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0)),
                     int(os.environ.get("LOCAL_RANK", 0)))
    except ValueError:
        raise UserError("WORLD_SIZE, RANK and LOCAL_RANK must be integers; they are set by torchrun or, "
                        "under Slurm, by export_DDP_vars.sh.") from None


def init_process_group(world, device):
    """Join the other ranks: NCCL between GPUs, gloo between CPU processes."""
    if world.size == 1:
        return
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise UserError(f"WORLD_SIZE={world.size} but {' and '.join(missing)} is not set, so the ranks "
                        "cannot find each other. Launch with torchrun, or under Slurm source "
                        "export_DDP_vars.sh and set MASTER_ADDR to the first node of the allocation.")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=world.rank,
                            world_size=world.size)


def parallelize(model, params, world, device):
    """Wrap the model for data-parallel training (DDP), unless there is one rank or ``noddp``.

    ``noddp`` leaves every rank training on its own: no gradient communication at all, which
    measures the compute part of a multi-GPU step.
    """
    if world.size == 1 or params.noddp:
        return model
    # Newer torch deprecates the broadcast_buffers argument (with a warning), so pass it only to change it.
    buffers = {"broadcast_buffers": False} if params.disable_broadcast_buffers else {}
    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=params.bucket_cap_mb,
        **buffers,
    )


def all_reduce_mean(tensor, world):
    """The mean of ``tensor`` over all ranks (in place); the identity on one rank."""
    if world.size > 1:
        dist.all_reduce(tensor)
        tensor /= world.size
    return tensor


def shutdown(world):
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
