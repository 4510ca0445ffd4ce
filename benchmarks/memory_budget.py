"""What one GPU holds while it trains: the per-GPU memory budget of any config, crop and batch.

    python -m benchmarks.memory_budget --config=bs64_opt                       # one GPU, local batch 64
    python -m benchmarks.memory_budget --config=bs256_opt --ranks=4 --gpu_memory_gib=40
    python -m benchmarks.memory_budget --config=bs64_opt --crop_size=128 --local_batch_size=8
    python -m benchmarks.memory_budget --config=base --crop_size=256 --local_batch_size=1 "--domain_mesh=[4,1,1]"

A calculation from the model's shapes, not a measurement: nothing is allocated and no GPU is
needed, so it answers "does it fit, and what limits the batch?" before a job is submitted. Any
train.py option changes the configuration (``--amp_mode``, ``--parallel=fsdp``,
``--data_loader_config=gpu-inmem``, ``--gpu_inmem_dtype``, ``--gradient_as_bucket_view``, ...).

The rows:

* model states, 16 bytes per parameter in fp32: weights, gradients and Adam's two moments (FSDP
  holds 1/N of each on N ranks);
* DDP's gradient buckets, one more fp32 copy of the gradients (the gradients become views of
  them with ``--gradient_as_bucket_view``, which then saves one copy);
* autocast's 16-bit copies of the weights (``--amp_mode=bf16|fp16``);
* the activations saved for the backward pass, per sample times the local batch, for the
  precision: :func:`saved_activation_bytes` adds up the tensors autograd keeps in this U-Net,
  and tests/test_memory_budget.py checks it against the bytes that
  ``torch.autograd.graph.saved_tensors_hooks`` sees in a real forward pass on the CPU;
* under ``--domain_mesh`` (docs/06), a rank's block of each of them and of the batch, plus the halo
  slabs its convolutions keep: the rank with the most neighbours, the one that needs the most.
  ``--ranks`` is then the whole world (data-parallel groups x the mesh's ranks; one domain group by
  default) and the local batch counts the samples of a data-parallel group;
* the batch on the device (input and target, fp32);
* the ``gpu-inmem`` loader's training and validation volumes (``--train_box``/``--val_box``: the
  real data's 1024 and 512 by default).

Not included, because they depend on the GPU, the libraries and the allocator rather than on the
model: the CUDA context, cuDNN's workspace, the transient gradients of the activations during the
backward pass, the halo exchange's transient padded copies, NCCL's buffers and fragmentation. Leave
several GiB for them. The host memory of
``inmem`` (both volumes in every rank's RAM) is printed apart.
"""
import argparse
import sys

import torch

from utils.YParams import load_params
from utils.errors import UserError, exit_on_user_error

GIB = 2 ** 30
FP32 = 4
# The real data set's box sides (downsamp_2048crop_train.h5, downsamp_1024crop_valid.h5).
REAL_TRAIN_BOX, REAL_VAL_BOX = 1024, 512
INMEM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def parameter_count(params):
    """Parameters of the configured U-Net, counted on the meta device (no memory)."""
    from networks.UNet import UNet
    with torch.device("meta"):
        model = UNet(params.N_in_channels, params.N_out_channels, params.base_channels, params.full_scale)
    return sum(p.numel() for p in model.parameters())


def level_widths(params):
    """Channel width of each encoder level, as networks/UNet.py builds them."""
    c = params.base_channels
    return [c, 2 * c, 4 * c, 8 * c, 8 * c] + ([8 * c] if params.full_scale else [])


def mesh_of(params):
    """The run's domain mesh, ``[d, h, w]``: ``[1, 1, 1]`` (whole samples) unless ``--domain_mesh`` splits them."""
    return list(params.get("domain_mesh") or [1, 1, 1])


def ranks_per_sample(params):
    d, h, w = mesh_of(params)
    return d * h * w


def saved_activation_bytes(params, amp_mode=None):
    """``{what: bytes per sample}`` of the tensors autograd saves for the backward pass, on one rank.

    Per sample, at crop side S, with e bytes per element (4 in fp32, 2 under 16-bit autocast):

    * each encoder level's output (saved by its in-place LeakyReLU, and the same storage is the next
      convolution's saved input);
    * each decoder block's output (saved by its in-place ReLU) and the concatenation with the skip
      (a new tensor, saved by the next transposed convolution);
    * the prediction (saved by tanh);
    * the loss's difference prediction - target, which ``abs`` saves; autocast runs l1_loss in fp32, so
      this one is fp32 in every precision;
    * under autocast, the 16-bit copy of the input crop that the first convolution saves (in fp32 it
      saves the batch's own input, counted with the batch).

    Under a domain mesh of N ranks a rank holds its block of each, 1/N, and the halo slabs its
    convolutions keep (benchmarks/domain.py's ``busiest_slabs``: the rank with the most neighbours),
    in the dtype of each convolution's input: the first one's in fp32, the batch's. The first
    convolution then saves the fp32 block itself, the batch's, and casts it to 16 bits again in backward.

    The weights' 16-bit copies are saved too, but once per step, not per sample: see :func:`budget`.
    This is the eager model with ``lambda_rho: 0`` (every config's); the density term of the loss and
    torch.compile's own choices of what to save change it a little.
    """
    amp_mode = params.amp_mode if amp_mode is None else amp_mode
    half = amp_mode in ("bf16", "fp16")
    e = 2 if half else FP32
    side = params.crop_size
    widths = level_widths(params)
    sides = [side // 2 ** (i + 1) for i in range(len(widths))]
    encoder = sum(w * s ** 3 for w, s in zip(widths, sides))
    # Decoder block j upsamples to the side of encoder level -(j+2) with that level's width.
    skips = list(zip(widths[:-1], sides[:-1]))
    decoder = sum(w * s ** 3 for w, s in skips)
    concatenations = 2 * decoder
    prediction = params.N_out_channels * side ** 3
    rows = {"encoder outputs": e * encoder, "decoder outputs": e * decoder,
            "concatenations (decoder + skip)": e * concatenations, "prediction": e * prediction,
            "the loss's prediction - target (fp32)": FP32 * prediction}
    n = ranks_per_sample(params)
    if half and n == 1:
        rows["16-bit copy of the input crop"] = e * params.N_in_channels * side ** 3
    if n == 1:
        return rows
    from benchmarks.domain import busiest_slabs

    rows = {what: value // n for what, value in rows.items()}  # the mesh divides every side: exact
    slabs = busiest_slabs(side, params.base_channels, mesh_of(params), params.full_scale, params.N_in_channels)
    rows["halo slabs kept for backward"] = FP32 * slabs[0] + e * sum(slabs[1:])
    return rows


def check_mesh(params, ranks):
    """Refuse a ``--domain_mesh`` that train.py would refuse, and a ``--ranks`` it does not divide."""
    from networks.UNet import UNet
    from utils import distributed

    mesh, n = mesh_of(params), ranks_per_sample(params)
    distributed.check_domain_crop(mesh, params.crop_size, UNet.size_multiple(params.full_scale))
    if ranks % n:
        raise UserError(f"--ranks={ranks} cannot hold --domain_mesh={mesh}: each sample is split over {n} ranks, "
                        f"so the world is a multiple of {n} (data-parallel groups x {n}). Pass --ranks={n} (one "
                        f"domain group, the default) or a multiple of it.")
    distributed.check_domain_options(params, distributed.World(size=ranks), graph_capture=False)


def budget(params, ranks, train_box=REAL_TRAIN_BOX, val_box=REAL_VAL_BOX):
    """``[(what, bytes per GPU, note)]`` for the configured run on ``ranks`` GPUs."""
    n_params = parameter_count(params)
    local_batch = local_batch_size(params, ranks)
    fsdp = params.parallel == "fsdp" and ranks > 1
    ddp = params.parallel == "ddp" and ranks > 1 and not params.noddp
    shard = ranks if fsdp else 1
    rows = [("weights (fp32)", FP32 * n_params / shard, f"{n_params / 1e6:.1f} M parameters"),
            ("gradients (fp32)", 0 if ddp and params.gradient_as_bucket_view else FP32 * n_params / shard,
             "views of DDP's buckets" if ddp and params.gradient_as_bucket_view else ""),
            ("Adam's two moments (fp32)", 2 * FP32 * n_params / shard, "")]
    if ddp:
        rows.append(("DDP gradient buckets (fp32)", FP32 * n_params, f"bucket_cap_mb={params.bucket_cap_mb}"))
    if fsdp:
        rows.append(("FSDP: one block gathered (weights + gradients)", 2 * FP32 * largest_block(params),
                     "the largest block, unsharded while it computes"))
    if params.amp_mode in ("bf16", "fp16"):
        rows.append((f"autocast's {params.amp_mode} weight copies", 2 * n_params, "made once per step"))
    n = ranks_per_sample(params)
    share = f" (its block: 1/{n}, and halos)" if n > 1 else ""
    per_sample = sum(saved_activation_bytes(params).values())
    rows.append(("activations saved for backward", per_sample * local_batch,
                 f"{per_sample / 2 ** 20:.1f} MiB per sample{share} x {local_batch}"))
    side = params.crop_size
    sample = (params.N_in_channels + params.N_out_channels) * side ** 3 * FP32 // n
    rows.append(("the batch: input + target (fp32)", sample * local_batch,
                 f"{sample / 1e6:.1f} MB per sample{f' (its block: 1/{n})' if n > 1 else ''}"))
    if params.data_loader_config == "gpu-inmem":
        volumes = inmem_bytes(params, train_box, val_box, INMEM_BYTES[params.gpu_inmem_dtype])
        rows.append((f"gpu-inmem volumes ({params.gpu_inmem_dtype})", volumes,
                     f"training {train_box}^3 + validation {val_box}^3"))
    return rows


def local_batch_size(params, ranks):
    """Samples a rank computes (under a domain mesh: the samples its data-parallel group shares)."""
    return params.global_batch_size // (ranks // ranks_per_sample(params))


def largest_block(params):
    """Parameters of the U-Net's largest block: what FSDP gathers at once."""
    from networks.UNet import UNet
    with torch.device("meta"):
        model = UNet(params.N_in_channels, params.N_out_channels, params.base_channels, params.full_scale)
    blocks = [*model.down, *model.up, model.last]
    return max(sum(p.numel() for p in block.parameters()) for block in blocks)


def inmem_bytes(params, train_box, val_box, itemsize):
    """Both volumes (input and target channels) of the training and validation files."""
    channels = params.N_in_channels + params.N_out_channels
    return channels * (train_box ** 3 + val_box ** 3) * itemsize


def gib(value):
    return f"{value / GIB:.2f}"


def report(params, ranks, gpu_memory_gib=None, train_box=REAL_TRAIN_BOX, val_box=REAL_VAL_BOX):
    """The budget as markdown, with what it implies."""
    rows = budget(params, ranks, train_box, val_box)
    total = sum(value for _, value, _ in rows)
    local_batch = local_batch_size(params, ranks)
    n = ranks_per_sample(params)
    mesh = f", domain mesh {mesh_of(params)} (each sample split over {n} ranks)" if n > 1 else ""
    lines = [f"Per-GPU memory budget: config {params.config_name}, {ranks} rank(s){mesh}, local batch {local_batch}, "
             f"crop {params.crop_size}^3, amp_mode={params.amp_mode}, parallel={params.parallel}, "
             f"loader {params.data_loader_config}.", "",
             "| what | GiB per GPU | note |", "|---|---|---|"]
    lines += [f"| {what} | {gib(value)} | {note} |" for what, value, note in rows]
    lines += [f"| total (without CUDA context, cuDNN workspace, fragmentation) | {gib(total)} | |", ""]
    per_sample = sum(saved_activation_bytes(params).values())
    n_params = parameter_count(params)
    states = 4 * FP32 * n_params
    if gpu_memory_gib:
        left = gpu_memory_gib * GIB - total
        lines.append(f"On a {gpu_memory_gib:g} GiB GPU: " + (
            f"fits, with {gib(left)} GiB left for the unlisted items (CUDA context, cuDNN workspace, the "
            f"backward pass's transient activation gradients); each more sample of local batch needs "
            f"{per_sample / 2 ** 20:.1f} MiB of saved activations." if left > 0 else
            f"does NOT fit: {gib(-left)} GiB too much before the unlisted items."))
    if ranks > 1:
        gradient_bytes = FP32 * n_params
        ring = 2 * (ranks - 1) / ranks * gradient_bytes
        saved = states - states / ranks
        lines.append(f"DDP's ring all-reduce moves 2(N-1)/N x {gradient_bytes / 1e6:.0f} MB = {ring / 1e6:.0f} MB "
                     f"per GPU per step (the same under autocast: gradients are fp32). FSDP would hold "
                     f"{gib(saved)} GiB less of the model states per GPU, and moves about 1.5 times DDP's "
                     f"bytes ({1.5 * ring / 1e6:.0f} MB: all-gathers in forward and backward, a reduce-scatter).")
    lines.append(f"Activation checkpointing would trade most of the {gib(per_sample * local_batch)} GiB of "
                 "saved activations for a second forward pass (about a third more FLOPs per step).")
    return "\n".join(lines) + "\n"


def host_report(params, ranks_per_node, train_box=REAL_TRAIN_BOX, val_box=REAL_VAL_BOX):
    """The inmem loader's host memory: every rank reads both volumes into its own RAM."""
    per_rank = inmem_bytes(params, train_box, val_box, FP32)
    return (f"Host memory of --data_loader_config=inmem: {per_rank / 1e9:.1f} GB per rank (training "
            f"{train_box}^3 + validation {val_box}^3, fp32), {ranks_per_node * per_rank / 1e9:.1f} GB for "
            f"{ranks_per_node} ranks on a node.\n")


@exit_on_user_error
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=None,
                        help="GPUs the run uses (the world size; default 1, or one domain group under --domain_mesh)")
    parser.add_argument("--ranks_per_node", type=int, default=4, help="for the host memory of inmem")
    parser.add_argument("--gpu_memory_gib", type=float, default=None, help="the GPU's memory, e.g. 40 or 80")
    parser.add_argument("--train_box", type=int, default=REAL_TRAIN_BOX, help="side of the training volume")
    parser.add_argument("--val_box", type=int, default=REAL_VAL_BOX, help="side of the validation volume")
    args, options = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    ranks = args.ranks or ranks_per_sample(load_params(options))
    params = load_params(options, world_size=ranks)
    check_mesh(params, ranks)
    print(report(params, ranks, args.gpu_memory_gib, args.train_box, args.val_box), end="")
    print(host_report(params, args.ranks_per_node, args.train_box, args.val_box), end="")


if __name__ == "__main__":
    main()
