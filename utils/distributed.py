"""Process-group set-up and data parallelism: the only module that touches torch.distributed set-up.

One process per device. The launcher sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT`` (torchrun does; under Slurm ``export_DDP_vars.sh`` maps them from ``SLURM_*``).
Without them the run is a single process and nothing here does anything.

Two ways to train on several ranks, chosen with ``--parallel``:

* ``ddp`` (the original tutorial's): every rank holds the whole model, gradients are averaged with
  all-reduce while the backward pass runs. Knobs: ``bucket_cap_mb``, ``disable_broadcast_buffers``,
  ``gradient_as_bucket_view``, ``static_graph``, ``ddp_comm_hook`` (fp16/bf16 gradients on the wire)
  and ``noddp`` (no gradient communication at all, to measure the compute part of a step).
* ``fsdp``: torch's ``fully_shard``. Every rank keeps only its shard of the parameters, gradients
  and optimiser state, and gathers a block's full weights just before using them. Per-rank memory
  for the model and optimiser drops to about 1/N of DDP's; :func:`memory_report` shows it.

A rank that dies or hangs must not leave the others waiting forever: every collective gives up
after ``dist_timeout_s``, and :func:`exit_on_lost_rank` turns the resulting error into one paragraph
that names the likely cause. On CUDA the NCCL watchdog enforces the timeout (see
:func:`init_process_group`).
"""
import dataclasses
import datetime
import functools
import inspect
import logging
import os
import re
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from utils.errors import RankError, UserError, exit_now
from utils.out_of_memory import is_out_of_memory


def dtensor_module():
    """The imported module of DTensor, FSDP's shards (torch.distributed.tensor; torch 2.4's private
    torch.distributed._tensor), or None. Only FSDP makes DTensors, and it imports that module first: where
    it is not imported, no tensor is one, and a run without FSDP is spared its import (half a second a
    process)."""
    for name in ("torch.distributed.tensor", "torch.distributed._tensor"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "DTensor"):
            return module
    return None


def is_dtensor(tensor):
    module = dtensor_module()
    return module is not None and isinstance(tensor, module.DTensor)


@dataclass(frozen=True)
class World:
    size: int = 1
    rank: int = 0
    local_rank: int = 0

    @property
    def is_main(self):
        return self.rank == 0


class LostRankError(RankError):
    """Another rank died or stopped answering; this one gives up instead of waiting forever."""


# The timeout in force, for the message of exit_on_lost_rank (set by init_process_group).
_timeout_s = None


def read_world():
    """This process's place in the job, from the launcher's environment variables."""
    try:
        return World(int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0)),
                     int(os.environ.get("LOCAL_RANK", 0)))
    except ValueError:
        raise UserError("WORLD_SIZE, RANK and LOCAL_RANK must be integers; they are set by torchrun or, "
                        "under Slurm, by export_DDP_vars.sh.") from None


@dataclass(frozen=True)
class DomainMesh:
    """This rank's place in the 2-D mesh of ranks: data-parallel groups x domain groups.

    ``world_size = data_size * prod(shape)``. The ranks of one domain group (consecutive ranks, so
    that a group sits on one node) train on the same samples, each on its block of the crop: block
    ``coords`` of a crop split ``shape[0]`` ways along depth, ``shape[1]`` along height and
    ``shape[2]`` along width. Different domain groups (the data-parallel axis) train on different
    samples. ``group`` is the domain group's own process group, so that halo messages never queue
    behind DDP's gradient all-reduces; ``neighbours`` holds, per axis, the global ranks of the blocks
    below and above (None at the crop's faces). Without a mesh (the default): one block per rank.
    """
    shape: tuple = (1, 1, 1)
    data_size: int = 1
    data_rank: int = 0
    coords: tuple = (0, 0, 0)
    group: object = None
    neighbours: tuple = ((None, None),) * 3
    whole_fields: bool = True  # validation gathers each sample's whole fields (metrics, preview)
    block: tuple = None        # this rank's block of the crop (``block_in(crop_size)``); None: all of it

    @property
    def size(self):
        """Ranks per domain group."""
        return self.shape[0] * self.shape[1] * self.shape[2]

    def block_in(self, crop_size):
        """This rank's block of a ``crop_size``^3 crop: ``(start, stop)`` per axis (D, H, W)."""
        return tuple((c * crop_size // n, (c + 1) * crop_size // n) for c, n in zip(self.coords, self.shape))

    def whole(self, blocks):
        """The whole crops of a (B, C, d, h, w) batch of blocks, on every rank of the domain group: an
        all-gather of whole volumes, for validation only (training never gathers)."""
        if self.size == 1:
            return blocks
        parts = [torch.empty_like(blocks) for _ in range(self.size)]
        dist.all_gather(parts, blocks.contiguous(), group=self.group)
        d, h, w = self.shape  # the group's ranks hold the blocks in row-major order of their coords
        rows = [torch.cat([torch.cat(parts[(i * h + j) * w:(i * h + j + 1) * w], dim=4) for j in range(h)], dim=3)
                for i in range(d)]
        return torch.cat(rows, dim=2)


def build_domain_mesh(params, world, device):
    """The mesh for ``params.domain_mesh``; every rank calls it (each domain group's process group is
    made by all ranks together, in the same order). See :func:`check_domain_options` for what is refused.

    Validation's physics metrics and preview need each sample's whole fields, gathered over the domain
    group. When one validation batch of them (input, target, prediction) would take more than half of
    the memory free now, they are switched off (``val_metrics``, ``preview_image``) with a log line.
    """
    shape = tuple(params.domain_mesh) if params is not None else (1, 1, 1)
    size = shape[0] * shape[1] * shape[2]
    if size == 1:
        return DomainMesh(data_size=world.size, data_rank=world.rank)
    data_rank, index = divmod(world.rank, size)
    coords = (index // (shape[1] * shape[2]), index // shape[2] % shape[1], index % shape[2])
    group = None
    for first in range(0, world.size, size):
        ranks = list(range(first, first + size))
        made = dist.new_group(ranks)
        if world.rank in ranks:
            group = made
    strides = (shape[1] * shape[2], shape[2], 1)
    neighbours = tuple((world.rank - stride if c > 0 else None, world.rank + stride if c < n - 1 else None)
                       for c, n, stride in zip(coords, shape, strides))
    logging.info("Domain parallel: mesh %s, %d data-parallel group(s) of %d ranks; rank %d holds block %s",
                 list(shape), world.size // size, size, world.rank, list(coords))
    whole_fields = whole_fields_fit(params, world.size // size, device)
    mesh = DomainMesh(shape, world.size // size, data_rank, coords, group, neighbours, whole_fields)
    return dataclasses.replace(mesh, block=mesh.block_in(params.crop_size))


def whole_fields_fit(params, data_size, device):
    """Whether a validation batch's whole fields fit in half the free memory; if not, the metrics and
    the preview, which need them, are switched off (with a log line saying so)."""
    channels = params.N_in_channels + 2 * params.N_out_channels
    needed = params.global_batch_size // data_size * channels * params.crop_size ** 3 * 4
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        pages = os.sysconf("SC_AVPHYS_PAGES") if "SC_AVPHYS_PAGES" in getattr(os, "sysconf_names", {}) else None
        free = pages * os.sysconf("SC_PAGE_SIZE") if pages else None
    if free is None or needed <= free / 2 or not (params.val_metrics or params.preview_image):
        return True
    logging.info("Validation metrics and preview skipped: gathering a validation batch's whole fields "
                 "(%.1f GiB) would take more than half of the %.1f GiB free on this rank.", needed / 2**30,
                 free / 2**30)
    params["val_metrics"], params["preview_image"] = False, False
    return False


def check_domain_crop(shape, crop_size, size_multiple):
    """Refuse a ``domain_mesh`` that is not three positive integers, or whose blocks the U-Net cannot
    halve ``log2(size_multiple)`` times (``size_multiple``: what the undivided crop must be a multiple of)."""
    if not (isinstance(shape, list) and len(shape) == 3
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shape)):
        raise UserError(f"--domain_mesh={shape} is invalid: it takes three positive integers, the ranks "
                        "along depth, height and width of the crop, e.g. --domain_mesh=[2,1,1].")
    if any(crop_size % (n * size_multiple) for n in shape):
        side = max(shape) * size_multiple
        raise UserError(f"crop_size={crop_size} is too small for --domain_mesh={shape}: every level of the "
                        f"U-Net halves each rank's block, so the block's side along every axis must be a "
                        f"multiple of {size_multiple}. The smallest crop for this mesh is --crop_size={side}; "
                        "or use a mesh with fewer ranks per axis.")


def check_domain_options(params, world, graph_capture):
    """Refuse a ``domain_mesh`` that cannot work with the run's other options, with the fix."""
    shape = params.domain_mesh
    size = shape[0] * shape[1] * shape[2]
    if size == 1:
        return
    if world.size % size:
        raise UserError(f"--domain_mesh={shape} needs a multiple of {size} ranks (one domain group of {size} "
                        f"ranks per data-parallel group), and this run has {world.size}. Start "
                        f"{size} x N ranks (torchrun --nproc_per_node={size}), or change --domain_mesh.")
    refused = {"noddp": "the ranks of a domain group must add up their blocks' gradients",
               "channels_last": "the halo exchange is written and tested for the default (channel-first) "
                                "memory layout only"}
    for key, reason in refused.items():
        if params[key]:
            raise UserError(f"--domain_mesh={shape} cannot be combined with --{key}: {reason}. Drop one of the "
                            "two options.")
    if graph_capture:
        raise UserError(f"--domain_mesh={shape} cannot run in train_graph.py: the halo exchange's "
                        "point-to-point messages are not captured in the CUDA graph. Train with train.py.")
    if params.jit_mode == "compile":
        raise UserError(f"--domain_mesh={shape} cannot be combined with --jit_mode=compile: the halo exchange "
                        "(an autograd function around point-to-point messages) has not been made to compile, "
                        "nor tested compiled. Use --jit_mode=none or script.")


# PyTorch's CUDA-graph notes: DDP must run at least 11 eager iterations before a capture. DDP gathers
# runtime statistics (its logging sample rate) over iterations 1 to 10, with host work that a graph cannot
# replay; its buckets are rebuilt once, after iteration 1, well before that.
DDP_GRAPH_WARMUP = 11


def check_parallel_options(params, world, device, graph_capture=False):
    """Refuse combinations of the distributed options that cannot work, before any rank trains.

    Called on every rank with the same options, so every rank refuses the same way. ``device``: the
    device the ranks train on; ``graph_capture``: the step is captured in a CUDA graph (train_graph.py).
    """
    check_domain_options(params, world, graph_capture)
    backend = choose_backend(device) if world.size > 1 else None
    mesh = params.domain_mesh
    if backend == "gloo" and device.type == "cuda" and mesh[0] * mesh[1] * mesh[2] > 1:
        # torch's ProcessGroupGloo copies CUDA tensors through host memory for its collectives, but its
        # send and recv hand the tensor's own (device) pointer to gloo's TCP transport.
        raise UserError(f"DIST_BACKEND=gloo cannot exchange the halos of --domain_mesh={mesh} on GPUs: gloo's "
                        "point-to-point messages take host memory only, and the halos are CUDA tensors. Unset "
                        "DIST_BACKEND (NCCL, one GPU per rank), or run the mesh on CPU processes (--device=cpu).")
    if params.parallel == "fsdp" and params.noddp:
        raise UserError("--parallel=fsdp cannot be combined with --noddp: FSDP needs communication to "
                        "gather each block's sharded weights, so there is no FSDP run without it. Use "
                        "--noddp with --parallel=ddp to measure the compute alone, or drop --noddp.")
    if params.ddp_comm_hook != "none" and params.parallel == "fsdp":
        raise UserError(f"--ddp_comm_hook={params.ddp_comm_hook} compresses DDP's gradient all-reduce, "
                        "and --parallel=fsdp does not use DDP. Drop --ddp_comm_hook (or set it to none), "
                        "or train with --parallel=ddp.")
    if params.ddp_comm_hook != "none" and params.noddp:
        raise UserError(f"--ddp_comm_hook={params.ddp_comm_hook} compresses the gradients that DDP sends, "
                        "and --noddp sends none. Drop one of the two options.")
    if params.parallel == "fsdp" and params.amp_mode == "fp16" and torch_release() < (2, 6):
        # Before 2.6 the gradient scaler checked only this rank's shards for inf/NaN, so ranks could
        # disagree on skipping a step; since then the check is all-reduced over the shards.
        raise UserError(f"--parallel=fsdp with --amp_mode=fp16 needs PyTorch 2.6 or newer (this is "
                        f"{torch.__version__}): older gradient scalers do not agree across shards on "
                        "skipping a step. Use --amp_mode=bf16 (no scaler needed), or --parallel=ddp.")
    if params.parallel == "fsdp" and graph_capture:
        raise UserError("--parallel=fsdp cannot run in a captured CUDA graph: FSDP gathers and frees each "
                        "block's weights in every step, with allocations and stream waits that a graph "
                        "cannot replay. Train with train.py, or use --parallel=ddp with train_graph.py.")
    if graph_capture and world.size > 1 and not params.noddp and params.graph_warmup_steps < DDP_GRAPH_WARMUP:
        raise UserError(f"train_graph.py with DDP needs at least {DDP_GRAPH_WARMUP} eager steps before the "
                        f"capture (DDP collects runtime statistics over its first 10 iterations, host work "
                        f"that a graph cannot replay), and graph_warmup_steps={params.graph_warmup_steps}. "
                        f"Use --graph_warmup_steps={DDP_GRAPH_WARMUP} or more (the default is 20).")
    if params.parallel == "fsdp" and params.channels_last and world.size > 1:
        raise UserError("--parallel=fsdp cannot shard channels_last weights: FSDP splits each parameter as "
                        "one contiguous block, and channels_last_3d convolution weights are not contiguous. "
                        "Drop --channels_last, or train with --parallel=ddp.")
    if params.parallel == "fsdp" and backend == "gloo" and torch_release() < (2, 9):
        # Measured on CPU: fully_shard makes CUDA streams in torch 2.4 to 2.6, and in 2.7 and 2.8 it sums
        # the ranks' gradients over gloo instead of averaging them (tests/test_distributed.py catches both).
        raise UserError(f"--parallel=fsdp over gloo (CPU processes, or DIST_BACKEND=gloo) needs PyTorch 2.9 or "
                        f"newer (this is {torch.__version__}): older versions of fully_shard need CUDA or, over "
                        "gloo, add up the ranks' gradients instead of averaging them. Use --parallel=ddp over "
                        "gloo, or install a newer PyTorch.")
    if params.parallel == "fsdp" and world.size > 1 and import_fully_shard() is None:
        raise UserError(f"--parallel=fsdp needs torch.distributed's fully_shard, which this PyTorch "
                        f"({torch.__version__}) does not provide. Install PyTorch 2.4 or newer, or train "
                        "with --parallel=ddp.")


def torch_release():
    """(major, minor) of the installed torch; pre-releases such as NGC's 2.6.0a0 count as 2.6."""
    return tuple(int(part) for part in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())


def import_fully_shard():
    """torch's ``fully_shard`` (FSDP2), or None: public since torch 2.6, private in 2.4 and 2.5."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard
        except ImportError:
            return None
    return fully_shard


def init_process_group(world, device, params=None):
    """Join the other ranks: NCCL between GPUs, gloo between CPU processes (:func:`choose_backend`).

    ``params.dist_timeout_s`` (600 s without ``params``) bounds every wait for the other ranks, the
    rendezvous included, so that a dead or stuck rank makes the others stop instead of hanging until
    the batch system's time limit. gloo raises the timeout in the waiting call, which
    :func:`exit_on_lost_rank` turns into a message. NCCL collectives run asynchronously on the GPU,
    so there a watchdog thread enforces the timeout: with ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` at 3
    (torch's default since 2.2) or 1 (what torchrun sets), it logs "Watchdog caught collective
    operation timeout" and ends the process. ``TORCH_NCCL_BLOCKING_WAIT=1`` would raise the timeout
    in Python instead, but makes the CPU wait for every collective, a host sync in the hot loop, so
    it is left to users.

    Returns this rank's :class:`DomainMesh` (data-parallel groups x domain groups), made here
    because its domain groups are process groups too.
    """
    global _timeout_s
    if world.size == 1:
        return DomainMesh()
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise UserError(f"WORLD_SIZE={world.size} but {' and '.join(missing)} is not set, so the ranks "
                        "cannot find each other. Launch with torchrun, or under Slurm source "
                        "export_DDP_vars.sh and set MASTER_ADDR to the first node of the allocation.")
    backend = choose_backend(device)
    if backend == "nccl" and os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") in ("0", "2"):
        logging.warning("TORCH_NCCL_ASYNC_ERROR_HANDLING=%s: a rank whose partner died will not be "
                        "stopped by --dist_timeout_s. Unset it (or set 1 or 3) to make timeouts end "
                        "the run.", os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"])
    _timeout_s = params.dist_timeout_s if params is not None else 600
    address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    try:
        dist.init_process_group(backend, rank=world.rank, world_size=world.size,
                                timeout=datetime.timedelta(seconds=_timeout_s))
    except RuntimeError as error:  # a DistError; for a taken port torch 2.4 and 2.5 raise a plain RuntimeError
        detail = first_line(error)
        if "EADDRINUSE" in str(error) or "address already in use" in str(error).lower():
            raise RankError(f"Rank 0 cannot listen on MASTER_PORT={os.environ['MASTER_PORT']}: another "
                            "program (perhaps an earlier run that is still alive) uses that port. Choose "
                            "another port, e.g. torchrun --master_port=29501, or end the old run.") from None
        if not isinstance(error, dist.DistError):
            raise
        raise RankError(f"Rank {world.rank} of {world.size} could not meet the other ranks at {address} "
                        f"within dist_timeout_s={_timeout_s} s ({detail}). Check that every rank "
                        "was started with the same WORLD_SIZE, MASTER_ADDR and MASTER_PORT, that "
                        "MASTER_ADDR is the node running rank 0 and is reachable from this node, and "
                        "that no rank failed before joining (see its output).") from None
    return build_domain_mesh(params, world, device)


BACKENDS = ("nccl", "gloo")


def choose_backend(device):
    """The process group's backend: NCCL between GPUs, gloo between CPU processes, unless the environment's
    ``DIST_BACKEND`` says otherwise.

    ``DIST_BACKEND=gloo`` on GPUs lets several ranks share ONE GPU, which NCCL refuses: the GPU test stage
    runs the distributed code on CUDA tensors that way, on a machine with a single GPU. gloo copies each
    CUDA tensor to host memory and back for every collective, so it is for tests, not for speed; its
    point-to-point messages take host memory only (the halo exchange of a domain mesh is refused).
    """
    asked = os.environ.get("DIST_BACKEND", "").strip().lower()
    if not asked:
        return "nccl" if device.type == "cuda" else "gloo"
    if asked not in BACKENDS:
        raise UserError(f"DIST_BACKEND={asked} is not a backend this code uses: set it to nccl or gloo, or unset "
                        "it (NCCL between GPUs, gloo between CPU processes).")
    if asked == "nccl" and device.type != "cuda":
        raise UserError("DIST_BACKEND=nccl needs GPUs, and these ranks train on the CPU. Unset DIST_BACKEND "
                        "(CPU processes use gloo), or train on GPUs with --device=cuda.")
    return asked


def first_line(error):
    """The gist of an error's text: gloo and NCCL add source locations, advice and C++ traces."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    text = re.sub(r"^\[[^\]]*\]\s*", "", lines[0])  # e.g. "[.../gloo/transport/tcp/pair.cc:553] "
    return text.split(". ")[0].rstrip(".")


# Phrases of the errors gloo and NCCL raise when a peer is gone or silent. Not every torch
# version raises a DistError subclass for them, so the text is the reliable part.
LOST_RANK_PHRASES = ("connection closed by peer", "connection reset by peer", "broken pipe",
                     "timed out waiting", "nccl communicator was aborted", "ncclremoteerror",
                     "watchdog caught collective operation timeout")


def is_lost_rank_error(error):
    """Whether ``error`` says that another rank died or stopped answering in a collective. NCCL's own
    out-of-memory error is a ``DistError`` too, but this rank ran out: utils/out_of_memory.py says so."""
    if not (dist.is_available() and dist.is_initialized()):
        return False  # no process group: there is no other rank to lose
    if is_out_of_memory(error):
        return False
    if isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(phrase in text for phrase in LOST_RANK_PHRASES)


def exit_on_lost_rank(main):
    """Decorate an entry point so that losing another rank ends it with one clear paragraph.

    Place it inside :func:`utils.errors.exit_on_user_error`, which prints the paragraph and exits
    with status 2. The process group is not destroyed on the way out: after a failed collective
    that could wait on the very peer that is gone.
    """

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except (RuntimeError, dist.DistError) as error:
            if not is_lost_rank_error(error):
                raise
            rank, size = dist.get_rank(), dist.get_world_size()
            raise LostRankError(
                f"Rank {rank} of {size} stopped because a collective operation with the other ranks "
                f"failed ({first_line(error)}). The most likely cause is that another rank died (a "
                "crash, running out of memory, or killed by the batch system) or stopped answering; "
                "look for the first error in the other ranks' output. A rank waits at most "
                f"dist_timeout_s={_timeout_s} s for the others: raise --dist_timeout_s only if a step "
                "legitimately takes longer on some rank (e.g. a slow first validation or checkpoint). "
                "Continue the run with --resume from its last checkpoint.") from None

    return wrapper


# ----------------------------------------------------------------------------- wrapping the model

def parallelize(model, params, world, device, graph_capture=False):
    """The model, ready for data-parallel training: DDP, FSDP, or unchanged (one rank, ``noddp``).

    Call it BEFORE creating the optimiser: ``fully_shard`` replaces every parameter with its
    shard, and an optimiser made earlier would update the old tensors (DDP keeps the parameters,
    so there the order does not matter). Call it before ``torch.compile`` too, and compile the
    wrapped model, so that the compiler sees DDP's buckets and FSDP's blocks.
    """
    if world.size == 1:
        return model
    if params.parallel == "fsdp":
        logging.info("Data parallel: FSDP (fully_shard per U-Net block) over %d ranks", world.size)
        return shard_model(model, world, device)
    if params.noddp:
        # Every rank trains on its own: no gradient communication at all. This measures the
        # compute part of a multi-GPU step; the ranks' weights drift apart.
        logging.info("noddp: %d ranks train independently, without gradient communication", world.size)
        return model
    logging.info("Data parallel: DDP over %d ranks (bucket_cap_mb=%s, disable_broadcast_buffers=%s, "
                 "gradient_as_bucket_view=%s, static_graph=%s, ddp_comm_hook=%s)", world.size,
                 params.bucket_cap_mb, params.disable_broadcast_buffers, params.gradient_as_bucket_view,
                 params.static_graph, params.ddp_comm_hook)
    return wrap_ddp(model, params, device, graph_capture)


def wrap_ddp(model, params, device, graph_capture=False):
    """DDP with the tutorial's knobs; each one trades something for speed (see the config)."""
    options = {
        "device_ids": [device.index] if device.type == "cuda" else None,
        "bucket_cap_mb": params.bucket_cap_mb,
        # DDP already rebuilds its buckets once, after the first iteration, in the order the gradients
        # became ready; static_graph adds support for reentrant checkpointing, unused parameters that
        # change and the like, none of which this model has.
        "static_graph": params.static_graph,
        # The gradients become views into DDP's communication buckets. The reducer copies a gradient
        # into its bucket unless .grad already aliases it; train.py's zero_grad(set_to_none=True) makes
        # a fresh .grad every step, so the copy stays and what is saved is the memory of a second copy
        # of the gradients between backward and the optimiser step.
        "gradient_as_bucket_view": params.gradient_as_bucket_view,
    }
    if params.disable_broadcast_buffers:
        # No broadcast of buffers from rank 0 before every forward. DDP broadcasts only when the model
        # has buffers, and the U-Net has none: for this model the flag changes nothing. Newer torch
        # renames the option and warns about the old name; torch 2.4 knows only the old one. The two
        # differ at the start: forward_sync_buffers=False still makes the buffers equal once, when DDP
        # starts, while broadcast_buffers=False skips that too.
        if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters:
            options["forward_sync_buffers"] = False
        else:
            options["broadcast_buffers"] = False
    if graph_capture and device.type == "cuda":
        # PyTorch's CUDA-graph notes: DDP built on a side stream, so that the capture of the whole
        # step (train_graph.py) can take in DDP's gradient all-reduces.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            model = DistributedDataParallel(model, **options)
        torch.cuda.current_stream(device).wait_stream(side)
    else:
        model = DistributedDataParallel(model, **options)
    if params.ddp_comm_hook != "none":
        model.register_comm_hook(state=None, hook=compression_hook(params.ddp_comm_hook, device))
    return model


def compression_hook(name, device):
    """torch's built-in DDP hook that sends gradients as fp16 or bf16: half the bytes on the wire.

    The hooks cast each gradient bucket to 16 bits, divide it by the world size (in 16 bits, before
    the all-reduce), all-reduce it (a sum over all ranks in 16 bits) and copy the result back into
    the fp32 bucket. So with fp16 a small gradient divided by the world size can underflow to zero,
    and one above fp16's largest value, 65504, becomes inf on the wire: with --amp_mode=fp16 the
    scaled gradients can get there, and the gradient scaler then skips the step and lowers its
    scale. bf16 has fp32's range, but sums in 8 significant bits.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    if name == "fp16":
        return default_hooks.fp16_compress_hook
    if device.type == "cuda":
        return default_hooks.bf16_compress_hook

    # DDP refuses the bf16 hook by its name unless NCCL is present, although gloo reduces bf16
    # tensors too. Under another name the same torch code runs between CPU processes.
    def gloo_bf16_compress_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return default_hooks.bf16_compress_hook(state, bucket)

    return gloo_bf16_compress_hook


def shard_model(model, world, device):
    """Shard the U-Net with ``fully_shard``: one communication group per block, then the root.

    Order matters. Each ``fully_shard(block)`` makes that block a unit whose full weights are
    gathered just before its forward (and again for its backward) and freed right after, so only
    one block is ever unsharded at a time. The root goes last: it collects the parameters no block
    owns (the final transposed convolution) and drives the whole schedule. Sharding the root first
    would put every parameter into one unit, gathered all at once: no memory saved.
    """
    fully_shard = import_fully_shard()
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(device.type, (world.size,))
    for block in (*model.down, *model.up):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


# ----------------------------------------------------------------------------- state for checkpoints

def local_tensor(tensor):
    """The part of ``tensor`` that this rank holds: its shard for FSDP, the tensor otherwise."""
    return tensor.to_local() if is_dtensor(tensor) else tensor


def full_tensor(tensor):
    """The whole of a possibly sharded tensor; a collective for FSDP shards (every rank must call)."""
    return tensor.full_tensor() if is_dtensor(tensor) else tensor


def is_sharded(model):
    """Whether FSDP has replaced the model's parameters with shards (DTensors)."""
    return any(is_dtensor(p) for p in bare_model(model).parameters())


def bare_model(model):
    """The model inside DDP and torch.compile wrappers (FSDP changes the model in place)."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = getattr(model, "module", None) or model._orig_mod
    return model


def full_state_dicts(model, optimizer, world):
    """Model and optimiser states as full CPU tensors on rank 0 (None on the other ranks).

    The result has the layout of the bare model's ``state_dict()`` and ``optimizer.state_dict()``,
    so a checkpoint written from an FSDP run can be resumed with DDP or on one device, and the other
    way round. Under FSDP this gathers every shard, a collective: call it on EVERY rank, and let
    rank 0 write the file. Without sharding the other ranks return at once.
    """
    if not (world.is_main or is_sharded(model)):
        return None

    def gathered(value):
        value = full_tensor(value)  # every rank takes part in the gather ...
        return value.detach().cpu() if world.is_main else None  # ... only rank 0 keeps the result

    model_state = {name: gathered(value) for name, value in bare_model(model).state_dict().items()}
    optimizer_state = optimizer.state_dict()
    optimizer_state["state"] = {
        index: {key: gathered(value) if torch.is_tensor(value) else value for key, value in state.items()}
        for index, state in sorted(optimizer_state["state"].items())}
    return (model_state, optimizer_state) if world.is_main else None


def load_full_state_dicts(model, optimizer, model_state, optimizer_state):
    """Load states made by :func:`full_state_dicts` (or on one device), sharding them for FSDP.

    Call after :func:`parallelize` and after creating the optimiser. For a model that is not
    sharded this is the plain ``load_state_dict`` of both.
    """
    model = bare_model(model)
    if not is_sharded(model):
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
        return
    own = model.state_dict()
    missing, unexpected = own.keys() - model_state.keys(), model_state.keys() - own.keys()
    if missing or unexpected:
        raise RuntimeError(f"state_dict keys differ: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    with torch.no_grad():
        for name, value in own.items():
            local_tensor(value).copy_(local_tensor(shard_like(model_state[name], value)))
    # Optimiser state is indexed by parameter position; each state tensor shaped like its
    # parameter is sharded the same way (Adam's step count stays a plain scalar).
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    sharded = dict(optimizer_state)
    sharded["state"] = {
        index: {key: shard_like(value, parameters[int(index)])
                if torch.is_tensor(value) and value.shape == parameters[int(index)].shape else value
                for key, value in state.items()}
        for index, state in optimizer_state["state"].items()}
    optimizer.load_state_dict(sharded)


def shard_like(full, reference):
    """``full`` distributed over the ranks as ``reference`` (a DTensor) is; unchanged otherwise."""
    if not is_dtensor(reference):
        return full
    if full.shape != reference.shape:
        raise RuntimeError(f"size mismatch: checkpoint {tuple(full.shape)}, model {tuple(reference.shape)}")
    local = full.to(device=reference.device, dtype=reference.dtype)
    return dtensor_module().distribute_tensor(local, reference.device_mesh, reference.placements)


# ----------------------------------------------------------------------------- measuring and agreeing

def memory_report(model, optimizer):
    """Bytes that THIS rank holds for parameters, gradients and optimiser state (plus CUDA peak).

    Shows what sharding saves: DDP holds the full tensors on every rank, FSDP only its shard of
    each (a DTensor's local part). Call it after at least one optimiser step, when Adam's state
    exists and gradients are still there. Reading sizes needs no device sync. DDP also keeps a
    gradient-sized set of communication buckets (shared with the gradients under
    ``gradient_as_bucket_view``) that only the CUDA peak shows.
    """
    def nbytes(tensor):
        tensor = local_tensor(tensor)
        return tensor.numel() * tensor.element_size()

    parameters = list(model.parameters())
    report = {
        "parameters": sum(nbytes(p) for p in parameters),
        "gradients": sum(nbytes(p.grad) for p in parameters if p.grad is not None),
        "optimizer_state": sum(nbytes(value) for state in optimizer.state.values()
                               for value in state.values() if torch.is_tensor(value)),
    }
    report["model_total"] = sum(report.values())
    device = parameters[0].device if parameters else torch.device("cpu")
    if device.type == "cuda":
        report["peak_allocated"] = torch.cuda.max_memory_allocated(device)
    return {key: float(value) for key, value in report.items()}


def describe_memory(report):
    """One log line for :func:`memory_report`, in MiB."""
    names = {"parameters": "parameters", "gradients": "gradients", "optimizer_state": "optimizer state",
             "model_total": "total", "peak_allocated": "CUDA peak allocated"}
    return ", ".join(f"{names.get(key, key)} {value / 2**20:.1f} MiB" for key, value in report.items())


def agree_to_stop(local_flag, world, device):
    """True on every rank if any rank wants to stop, so that all stop after the same step.

    A stop signal reaches the ranks at slightly different moments; a rank that stopped alone would
    leave the others waiting in their next collective. One all-reduce (MAX) of a single number,
    and one host sync to read it: call it every few steps, not every step.
    """
    if world.size == 1:
        return bool(local_flag)
    flag = torch.tensor([1 if local_flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())  # waits for the device and the other ranks


def agree_to_stop_and_steps(local_flag, steps, world, device):
    """``(stop, fewest steps)``: :func:`agree_to_stop`, and the smallest ``steps`` any rank proposes,
    in the same single all-reduce (MAX of the flag and of minus the steps)."""
    if world.size == 1:
        return bool(local_flag), steps
    values = torch.tensor([1 if local_flag else 0, -steps], dtype=torch.int64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    flag, minus_steps = values.tolist()  # waits for the device and the other ranks
    return bool(flag), -minus_steps


def all_reduce_mean(tensor, world):
    """The mean of ``tensor`` over all ranks (in place); the identity on one rank."""
    if world.size > 1:
        dist.all_reduce(tensor)
        tensor /= world.size
    return tensor


def shutdown(world, status=0):
    """Leave the process group at the end of a run; a gloo (CPU) rank then exits at once with ``status``.

    Gloo's worker threads outlive destroy_process_group, and one of them may still be releasing the
    tensors of the last collective when the interpreter shuts down: that aborts the process (SIGABRT,
    "terminate called without an active exception"; 1 run in 20 with 2 ranks on 2 cores). All is
    written by then, so the rank skips the interpreter's clean-up. NCCL ranks exit normally.
    """
    if world.size == 1 or not dist.is_initialized():
        return
    gloo = dist.get_backend() == "gloo"
    dist.destroy_process_group()
    if gloo:
        exit_now(status)
