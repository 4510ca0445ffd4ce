"""Domain parallelism's costs, counted beside the model's prediction: memory per rank and halo bytes.

    python -m benchmarks.domain                              # CPU: full-width U-Net, 128^3 on 1 and 2 ranks
    python -m benchmarks.domain --crops 128 256 --ranks 1 2 4 # and 256^3 on 1, 2 and 4 ranks

For each crop and each number of ranks N (mesh [N,1,1], one sample split along depth), N gloo
processes run one forward and backward pass of the U-Net (``--base_channels``, 64 is the original's
width; batch 1, fp32) on their blocks, and report:

* the bytes of the activations saved for the backward pass on each rank (every tensor the autograd
  graph keeps, counted once per storage, parameters excluded), read with ``saved_tensors_hooks``;
* the halo bytes of the step, forward and backward, as utils/halo.py counts what it posts: what all
  ranks sent to their neighbours together, the mean per rank, and what the busiest rank sent (one
  with a neighbour on each side of a split axis).

Both are counts, not a reading of the memory or the wire: beside each is the prediction made from
the U-Net's shapes alone (:func:`predict`), and their agreement checks that the prediction describes
the code. The peak memory is higher: the padded copies, DDP's buckets and the workspace come on top.

Two more tables are computed, not measured (no GPU run of domain parallelism is in the repository
yet): the prediction extended to 512^3 and 1024^3 crops (per-rank activations plus the model's
parameters, gradients and Adam state, against an 80 GB H100's memory, and the smallest mesh whose
ranks fit), and a step's halo cost on DGX H100 nodes against its compute (:func:`costs`).

Results: ``runs/benchmarks/domain/<device>-<date>/domain.json`` and ``domain.md`` (``-2``, ``-3``, ...
when that folder holds files); ``--committed`` writes under ``benchmarks/results/domain/`` instead,
``--out_dir`` anywhere (refused if it holds files, unless ``--overwrite``).
"""
import argparse
import datetime
import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from benchmarks.common import (add_output_options, claim_folder, device_name, device_slug, free_name,  # noqa: E402
                               holds_files, relative, results_folder)
from networks.UNet import UNet  # noqa: E402
from utils.YParams import YParams  # noqa: E402
from utils.errors import UserError, exit_on_user_error  # noqa: E402
from utils.halo import HALO  # noqa: E402

MIB, GIB = 2**20, 2**30
H100_BYTES = 80e9   # an H100 SXM's memory
ADAM_BYTES_PER_PARAMETER = 16  # fp32 weight, gradient and Adam's two moments
# Past the 8 GPUs of a node the axis split the most ways comes last: its neighbours are consecutive ranks,
# on the same node, and its faces are the block's largest (docs/06, placing a group on the nodes).
MESHES = ([1, 1, 1], [2, 1, 1], [2, 2, 1], [2, 2, 2], [2, 2, 4], [2, 4, 4], [4, 4, 4], [4, 4, 8], [4, 8, 8],
          [8, 8, 8])


# ----------------------------------------------------------------------------- the prediction

def unet_tensors(crop, base, full_scale=True, n_in=4, n_out=5):
    """The U-Net's shapes, batch 1: ``(saved, conv_inputs)``, each a list of ``(channels, side)``.

    Saved for backward: the input (the first convolution's), every encoder output (its LeakyReLU's
    output, also the next convolution's input and a skip), every decoder block's ReLU output and the
    concatenation after it (the next transposed convolution's input), and the tanh's output.
    """
    widths = [base, 2 * base, 4 * base, 8 * base, 8 * base] + ([8 * base] if full_scale else [])
    levels = len(widths)
    saved, conv_inputs = [(n_in, crop)], [(n_in, crop)]
    for level, width in enumerate(widths):
        saved.append((width, crop >> (level + 1)))
        if level + 1 < levels:
            conv_inputs.append((width, crop >> (level + 1)))
    conv_inputs.append((widths[-1], crop >> levels))  # the deepest output enters the decoder
    for j, skip_width in enumerate(reversed(widths[:-1])):
        side = crop >> (levels - 1 - j)
        saved += [(skip_width, side), (2 * skip_width, side)]
        conv_inputs.append((2 * skip_width, side))
    saved.append((n_out, crop))
    return saved, conv_inputs


def faces(channels, side, mesh):
    """One face of a block of a convolution's (channels, side^3) input, per split axis in exchange order:
    ``[(axis, values)]``. Each face includes the halos of the axes exchanged before it."""
    block, result = [side // parts for parts in mesh], []
    for axis in range(3):
        if mesh[axis] > 1:
            result.append((axis, channels * block[(axis + 1) % 3] * block[(axis + 2) % 3]))
            block[axis] += 2 * HALO
    return result


def busiest_slabs(crop, base, mesh, full_scale=True, n_in=4):
    """Values of the halo slabs that the busiest rank receives, keeps for backward and sends, per
    convolution in the U-Net's order: one per neighbour along each split axis, so two on an axis split
    three ways or more (a middle block) and one on an axis split in two. A face that is the crop's has none."""
    _, conv_inputs = unet_tensors(crop, base, full_scale, n_in)
    return [sum(min(2, mesh[axis] - 1) * values for axis, values in faces(channels, side, mesh))
            for channels, side in conv_inputs]


def predict(crop, base, mesh, full_scale=True, bytes_per_value=4):
    """Predicted ``(saved bytes on the busiest rank, halo bytes per step)`` for one sample split over ``mesh``.

    Saved: every saved tensor's block (its side divided by the mesh), plus the halo slabs each
    convolution keeps with its input on the rank with the most neighbours (:func:`busiest_slabs`).
    Halo bytes, all ranks together: each face between two blocks carries one slab each way, per
    convolution forward and per convolution but the first backward (the input needs no gradient).
    """
    saved, conv_inputs = unet_tensors(crop, base, full_scale)
    per_rank = sum(channels * (side // mesh[0]) * (side // mesh[1]) * (side // mesh[2]) for channels, side in saved)
    sent_per_pass = []
    for channels, side in conv_inputs:
        sent_per_pass.append(sum(2 * (mesh[axis] - 1) * mesh[(axis + 1) % 3] * mesh[(axis + 2) % 3] * values
                                 for axis, values in faces(channels, side, mesh)))
    halo_bytes = (sum(sent_per_pass) + sum(sent_per_pass[1:])) * bytes_per_value
    return (per_rank + sum(busiest_slabs(crop, base, mesh, full_scale))) * bytes_per_value, halo_bytes


def busiest_halo(crop, base, mesh, full_scale=True, bytes_per_value=4):
    """Predicted halo bytes that the busiest rank sends in one step: the slabs it receives, sent back the
    other way (:func:`busiest_slabs`), forward, and backward for all but the first convolution."""
    slabs = busiest_slabs(crop, base, mesh, full_scale)
    return (sum(slabs) + sum(slabs[1:])) * bytes_per_value


def largest_tensor(crop, base, mesh, full_scale=True):
    """Elements of the largest tensor a rank holds in a forward pass: a saved block, or a convolution's
    input padded with its halos."""
    saved, conv_inputs = unet_tensors(crop, base, full_scale)
    sizes = [channels * (side // mesh[0]) * (side // mesh[1]) * (side // mesh[2]) for channels, side in saved]
    for channels, side in conv_inputs:
        padded = [side // parts + (2 if parts > 1 else 0) for parts in mesh]
        sizes.append(channels * padded[0] * padded[1] * padded[2])
    return max(sizes)


def smallest_fitting_mesh(crop, base, full_scale, bytes_per_value, parameters):
    """The first mesh of MESHES whose ranks hold their activations and the model's states in an H100,
    whose largest tensor stays below 2^31 elements (the 32-bit index limit of some GPU kernels), and
    whose blocks the U-Net can halve at every level: ``(mesh, bytes per rank)`` or ``(None, None)``."""
    multiple = UNet.size_multiple(full_scale)
    for mesh in MESHES:
        if any(crop % (parts * multiple) for parts in mesh) or largest_tensor(crop, base, mesh, full_scale) >= 2**31:
            continue
        saved, _ = predict(crop, base, mesh, full_scale, bytes_per_value)
        total = saved + parameters * ADAM_BYTES_PER_PARAMETER
        if total <= H100_BYTES:
            return mesh, total
    return None, None


# ----------------------------------------------------------------------------- a step's cost, computed

def rank_coords(mesh):
    """The coordinates of a domain group's ranks, in rank order: row-major, width fastest, as
    utils/distributed.py's build_domain_mesh places them."""
    return [(index // (mesh[1] * mesh[2]), index // mesh[2] % mesh[1], index % mesh[2])
            for index in range(mesh[0] * mesh[1] * mesh[2])]


def placed_halo(crop, base, mesh, gpus_per_node, full_scale=True):
    """``[(values to peers on the same node, values to peers on other nodes)]`` that each rank of a
    domain group sends in one step, the group on consecutive ranks from a node's first GPU: forward,
    and backward for all but the first convolution."""
    _, conv_inputs = unet_tensors(crop, base, full_scale)
    strides = (mesh[1] * mesh[2], mesh[2], 1)
    per_rank = []
    for rank, coords in enumerate(rank_coords(mesh)):
        sent = [0, 0]
        for index, (channels, side) in enumerate(conv_inputs):
            passes = 2 if index else 1
            for axis, values in faces(channels, side, mesh):
                for step in (-1, 1):
                    if 0 <= coords[axis] + step < mesh[axis]:
                        peer = rank + step * strides[axis]
                        sent[peer // gpus_per_node != rank // gpus_per_node] += passes * values
        per_rank.append(tuple(sent))
    return per_rank


def copy_values(crop, base, mesh, full_scale=True, n_out=5):
    """Values that the halo exchange's transient copies read and write on a rank in one step, copies the
    undivided model does not make (utils/halo.py): per convolution, the padded copy of its input (the
    block read, the padded block written), made in forward and again in backward, and the block's part
    cut out of the padded gradient (all but the first convolution); per transposed convolution, its
    output's crop (forward) and its gradient padded back (backward). The halos themselves are left out."""
    widths = [base, 2 * base, 4 * base, 8 * base, 8 * base] + ([8 * base] if full_scale else [])
    _, conv_inputs = unet_tensors(crop, base, full_scale)
    out_channels = list(reversed(widths[:-1])) + [n_out]
    first_transposed = len(conv_inputs) - len(out_channels)
    total = 0
    for index, (channels, side) in enumerate(conv_inputs):
        block = [side // parts for parts in mesh]
        padded = [n + 2 * HALO if parts > 1 else n for n, parts in zip(block, mesh)]
        inside, whole = channels * math.prod(block), channels * math.prod(padded)
        total += 2 * (inside + whole) + (2 * inside if index else 0)
        if index >= first_transposed:
            kept = [2 * n for n in block]
            computed = [n + 4 * HALO if parts > 1 else n for n, parts in zip(kept, mesh)]
            channels_out = out_channels[index - first_transposed]
            total += 3 * channels_out * math.prod(kept) + channels_out * math.prod(computed)
    return total


COST_CASES = ((256, [2, 1, 1]), (256, [4, 1, 1]), (1024, [16, 1, 1]), (1024, [4, 2, 2]), (1024, [2, 2, 4]))
COST_RUNG = "gpu-inmem"  # the H100 ladder's fp32 rung: this code's step without autocast


def costs(base, cases=COST_CASES):
    """A step's halo costs on DGX H100 nodes against its compute, computed from the shapes:
    ``(rows, the fp32 samples/s at 64^3 they scale, the machine)``."""
    from benchmarks import scaling_model

    machine = scaling_model.H100
    rate = scaling_model.measured_rate(scaling_model.H100_RESULTS, COST_RUNG)
    nic = machine.node_network_bw / machine.gpus_per_node
    rows = []
    for crop, mesh in cases:
        ranks = mesh[0] * mesh[1] * mesh[2]
        placed = placed_halo(crop, base, mesh, machine.gpus_per_node)
        seconds = [4 * (inside / (1e9 * machine.nvlink_bw) + between / (1e9 * nic)) for inside, between in placed]
        convolutions = len(unet_tensors(crop, base)[1])  # each exchanges forward, all but the first backward
        exchanges = (2 * convolutions - 1) * sum(parts > 1 for parts in mesh)
        spans = ranks > machine.gpus_per_node
        latency = exchanges * (machine.inter_latency if spans else machine.intra_latency)
        rows.append({"crop": crop, "mesh": mesh, "compute_s": (crop / 64) ** 3 / rate / ranks,
                     "halo_bytes_busiest": busiest_halo(crop, base, mesh),
                     "halo_bytes_between_nodes": 4 * max(between for _, between in placed),
                     "halo_s": max(seconds), "exchanges": exchanges, "latency_s": latency,
                     "copy_s": 4 * copy_values(crop, base, mesh) / (1e9 * machine.memory_bw)})
        rows[-1]["share"] = (rows[-1]["halo_s"] + latency + rows[-1]["copy_s"]) / rows[-1]["compute_s"]
    return rows, rate, machine



def cost_table(base, rows, rate, machine):
    from benchmarks.scaling_model import H100_RESULTS

    nic = machine.node_network_bw / machine.gpus_per_node
    lines = ["", f"## Computed, not measured: a step's halo cost on DGX H100 nodes (base_channels {base}, fp32)", "",
             f"Compute per rank: this code's fp32 rate on one H100 at 64^3 (the `{COST_RUNG}` rung, {rate:.1f} "
             f"samples/s, {relative(H100_RESULTS)}) scaled by the voxels and "
             f"divided by the ranks, as if a block computed as fast per voxel. Halo: the slowest rank's bytes over "
             f"NVLink ({machine.nvlink_bw:g} GB/s) to peers on its node and over its share of the network "
             f"({nic:g} GB/s) to the others, the group on consecutive ranks of {machine.gpus_per_node}-GPU nodes; "
             f"its messages' latency at NCCL's modelled hop ({machine.intra_latency * 1e6:g} us in a node, "
             f"{machine.inter_latency * 1e6:g} us between nodes) per exchange. Copies: the padded copies and "
             f"gradient cuts that the undivided model does not make (copy_values), read and written at the H100's "
             f"{machine.memory_bw:g} GB/s. The exchange is blocking: the share adds to the step.", "",
             "| crop, mesh | compute per rank (ms) | halo, busiest rank (MiB) | of it between nodes (MiB) | "
             "halo time, slowest rank (ms) | exchanges in a row | their latency (ms) | copies (ms) | "
             "share of the compute |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['crop']}^3, {row['mesh']} | {row['compute_s'] * 1e3:.1f} | "
                     f"{row['halo_bytes_busiest'] / MIB:.1f} | {row['halo_bytes_between_nodes'] / MIB:.1f} | "
                     f"{row['halo_s'] * 1e3:.2f} | {row['exchanges']} | {row['latency_s'] * 1e3:.2f} | "
                     f"{row['copy_s'] * 1e3:.2f} | {100 * row['share']:.1f}% |")
    return lines


# ----------------------------------------------------------------------------- one rank's measurement

def measure_rank(crop, base, out_path):
    """One forward and backward pass on this rank's block; writes its saved bytes and halo bytes."""
    from utils import distributed, halo

    world = distributed.read_world()
    params = YParams(os.path.join(ROOT, "config", "UNet.yaml"), "base")
    params.update({"domain_mesh": [world.size, 1, 1], "crop_size": crop, "global_batch_size": 1,
                   "val_metrics": False, "preview_image": False})
    mesh = distributed.init_process_group(world, torch.device("cpu"), params) if world.size > 1 else None
    torch.manual_seed(0)
    model = UNet(4, 5, base, full_scale=True)
    if mesh is not None:
        halo.split_domain(model, mesh)
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    block = torch.randn(1, 4, crop // world.size, crop, crop)
    halo.reset_counters()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = model(block)
    output.sum().backward()
    with open(out_path, "w") as f:
        json.dump({"rank": world.rank, "saved_bytes": sum(saved.values()), "halo_bytes_sent": halo.COUNTERS["bytes_sent"],
                   "exchanges": halo.COUNTERS["exchanges"]}, f)
    distributed.shutdown(world)


def measure(crop, base, ranks, work_dir):
    """Run ``ranks`` processes (gloo, like torchrun) on one sample; their reports."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    processes, paths = [], []
    for rank in range(ranks):
        path = os.path.join(work_dir, f"crop{crop}-ranks{ranks}-rank{rank}.json")
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(ranks),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        processes.append(subprocess.Popen([sys.executable, "-m", "benchmarks.domain", "--worker", str(crop), str(base),
                                           path], cwd=ROOT, env=env))
        paths.append(path)
    codes = [process.wait() for process in processes]
    if any(codes):
        raise UserError(f"A rank of the {ranks}-rank measurement at crop {crop} failed (exit statuses {codes}); its "
                        "output is above. Measure fewer ranks or a smaller crop (--ranks, --crops).")
    reports = []
    for path in paths:
        with open(path) as f:
            reports.append(json.load(f))
        os.remove(path)
    return reports


# ----------------------------------------------------------------------------- the tables

def table(rows, base, date, device):
    lines = [f"# Domain parallelism: memory per rank and halo bytes (U-Net base_channels {base}, batch 1, fp32)", "",
             f"Measured with `python -m benchmarks.domain` on {device}, {date}: N gloo processes on one CPU machine, "
             "mesh [N,1,1]. Saved activations: the largest rank's, counted with saved_tensors_hooks. Halo bytes of "
             "one step, forward and backward, as the exchange counts what it posts: all ranks together, the mean "
             "per rank, and the busiest rank's. Counts, not the peak memory or the wire: the padded copies, DDP's "
             "buckets and the workspace come on top.", "",
             "| crop, ranks | saved per rank (MiB) | saved, predicted (MiB) | ratio to 1 rank | "
             "halo, all ranks (MiB) | all, predicted (MiB) | halo per rank, mean (MiB) | halo, busiest rank (MiB) | "
             "busiest, predicted (MiB) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['crop']}^3, {row['ranks']} | {row['saved_bytes'] / MIB:.1f} | "
                     f"{row['predicted_saved_bytes'] / MIB:.1f} | {row['ratio_to_one_rank']:.3f} | "
                     f"{row['halo_bytes'] / MIB:.1f} | {row['predicted_halo_bytes'] / MIB:.1f} | "
                     f"{row['halo_bytes'] / row['ranks'] / MIB:.1f} | {row['halo_bytes_busiest'] / MIB:.1f} | "
                     f"{row['predicted_halo_busiest'] / MIB:.1f} |")
    return lines


def extension_rows(base, parameters, crops=(256, 512, 1024)):
    """Predictions for the real data's crops on H100s, one dict per crop: the smallest mesh whose ranks fit."""
    rows = []
    for crop in crops:
        row = {"crop": crop, "activations_bytes": predict(crop, base, [1, 1, 1])[0],
               "largest_tensor": largest_tensor(crop, base, [1, 1, 1]),
               "halo_bytes_2x1x1": predict(crop, base, [2, 1, 1])[1],
               "halo_bytes_2x1x1_each": busiest_halo(crop, base, [2, 1, 1])}
        for name, bytes_per_value in (("fp32", 4), ("bf16", 2)):
            row[f"mesh_{name}"], row[f"bytes_per_rank_{name}"] = smallest_fitting_mesh(crop, base, True, bytes_per_value,
                                                                                      parameters)
        rows.append(row)
    return rows


def extension(base, parameters, rows):
    lines = ["", f"## Predicted, not measured: larger crops on 80 GB H100s (base_channels {base})", "",
             "Per rank: the predicted saved activations plus parameters, gradients and Adam state "
             f"({parameters / 1e6:.1f} M parameters x {ADAM_BYTES_PER_PARAMETER} bytes, fp32). The smallest mesh is "
             "the first of " + ", ".join(str(mesh) for mesh in MESHES[:6]) + ", ... whose ranks fit in 80 GB and whose "
             "largest tensor stays below 2^31 elements (the 32-bit indexing limit of some GPU kernels). bf16 counts "
             "every saved tensor at 2 bytes. Not included: the halo exchange's transient padded copy of each "
             "convolution's input, DDP's buckets and the convolutions' workspace: leave headroom.",
             "", "| crop | activations, 1 rank, fp32 (GiB) | largest tensor, 1 rank (elements) | smallest mesh, fp32 | "
             "per rank, fp32 (GiB) | smallest mesh, bf16 | per rank, bf16 (GiB) | halo per step, [2,1,1] fp32, "
             "all ranks (GiB) | the same, each rank (GiB) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        cells = [f"{row['crop']}^3", f"{row['activations_bytes'] / GIB:.1f}", f"{row['largest_tensor'] / 2**30:.2f} x 2^30"]
        for name in ("fp32", "bf16"):
            mesh, total = row[f"mesh_{name}"], row[f"bytes_per_rank_{name}"]
            cells += [str(mesh) if mesh else "none in the list", f"{total / GIB:.1f}" if total else "-"]
        cells += [f"{row['halo_bytes_2x1x1'] / GIB:.2f}", f"{row['halo_bytes_2x1x1_each'] / GIB:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def skipped_cases(crops, ranks, multiple):
    """The (crop, ranks) pairs asked for that cannot be split: each rank's block must be a multiple of
    ``multiple`` voxels (the U-Net's downsampling) along the split axis."""
    return [(crop, n) for crop in crops for n in ranks if crop % (n * multiple)]


@exit_on_user_error
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        return measure_rank(int(argv[1]), int(argv[2]), argv[3])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crops", type=int, nargs="+", default=[128])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--base_channels", type=int, default=64)
    add_output_options(parser, "benchmarks/results/domain", "domain")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    date = datetime.date.today().isoformat()
    device = device_name(gpu=False)
    out_dir = args.out_dir or free_name(os.path.join(results_folder(args, "benchmarks/results/domain", "domain"),
                                                     f"{device_slug(device)}-{date}"), args, holds_files)
    claim_folder(out_dir, args.overwrite, lambda name: name in ("domain.json", "domain.md"))
    multiple = UNet.size_multiple(True)
    plan = [(crop, ranks) for crop in args.crops for ranks in args.ranks if crop % (ranks * multiple) == 0]
    skipped = [f"{crop}^3 on {ranks} ranks: each rank would hold {crop / ranks:g} voxels along the split, and the "
               f"U-Net needs a multiple of {multiple} (a crop divisible by {multiple} x ranks)"
               for crop, ranks in skipped_cases(args.crops, args.ranks, multiple)]
    for line in skipped:
        print(f"Skipped: {line}.", flush=True)
    if not plan or args.ranks[0] != 1:
        raise UserError(f"Nothing to measure: --ranks must start with 1 (the reference), and each crop must split into "
                        f"blocks of at least {multiple} voxels (crop >= 64 x ranks).")
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for crop, ranks in plan:
        reports = measure(crop, args.base_channels, ranks, out_dir)
        predicted_saved, predicted_halo = predict(crop, args.base_channels, [ranks, 1, 1])
        rows.append({"crop": crop, "ranks": ranks, "saved_bytes": max(r["saved_bytes"] for r in reports),
                     "halo_bytes": sum(r["halo_bytes_sent"] for r in reports),
                     "halo_bytes_busiest": max(r["halo_bytes_sent"] for r in reports),
                     "exchanges_per_rank": reports[0]["exchanges"],
                     "predicted_saved_bytes": predicted_saved, "predicted_halo_bytes": predicted_halo,
                     "predicted_halo_busiest": busiest_halo(crop, args.base_channels, [ranks, 1, 1])})
        one = next(row for row in rows if row["crop"] == crop and row["ranks"] == 1)
        rows[-1]["ratio_to_one_rank"] = rows[-1]["saved_bytes"] / one["saved_bytes"]
        print(rows[-1], flush=True)
    parameters = sum(p.numel() for p in UNet(4, 5, args.base_channels, True).parameters())
    predicted = extension_rows(args.base_channels, parameters)
    costed, rate, machine = costs(args.base_channels)
    lines = table(rows, args.base_channels, date, device) + [f"\nNot measured: {line}." for line in skipped] + \
        extension(args.base_channels, parameters, predicted) + cost_table(args.base_channels, costed, rate, machine)
    command = "python -m benchmarks.domain " + " ".join(argv)
    with open(os.path.join(out_dir, "domain.json"), "w") as f:
        json.dump({"command": command.strip(), "device": device, "date": date, "base_channels": args.base_channels,
                   "rows": rows, "skipped": skipped, "predicted": predicted,
                   "costs": {"h100_fp32_samples_per_s_at_64": rate, "machine": machine.name, "rows": costed}},
                  f, indent=1)
    with open(os.path.join(out_dir, "domain.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"Results: {relative(out_dir)}/domain.json and domain.md")


if __name__ == "__main__":
    main()
