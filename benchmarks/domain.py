"""Domain parallelism's costs, measured beside the model's prediction: memory per rank and halo bytes.

    python -m benchmarks.domain                              # CPU: full-width U-Net, 128^3 on 1 and 2 ranks
    python -m benchmarks.domain --crops 128 256 --ranks 1 2 4 # and 256^3 on 1, 2 and 4 ranks

For each crop and each number of ranks N (mesh [N,1,1], one sample split along depth), N gloo
processes run one forward and backward pass of the U-Net (``--base_channels``, 64 is the original's
width; batch 1, fp32) on their blocks, and report:

* the bytes of the activations saved for the backward pass on each rank (every tensor the autograd
  graph keeps, counted once per storage, parameters excluded), read with ``saved_tensors_hooks``;
* the halo bytes of the step, forward and backward: what all ranks sent to their neighbours together,
  the mean per rank, and what the busiest rank sent (one with a neighbour on each side of a split axis).

Beside each measurement is the prediction made from the U-Net's shapes alone (:func:`predict`), and a
second table extends the prediction to 512^3 and 1024^3 crops: per-rank activations plus the model's
parameters, gradients and Adam state, against the memory of an 80 GB H100, and the smallest mesh whose
ranks fit. Those rows are predictions: no GPU run of domain parallelism is in the repository yet.

Results: ``runs/benchmarks/domain/<device>-<date>/domain.json`` and ``domain.md`` (``-2``, ``-3``, ...
when that folder holds files); ``--committed`` writes under ``benchmarks/results/domain/`` instead,
``--out_dir`` anywhere (refused if it holds files, unless ``--overwrite``).
"""
import argparse
import datetime
import json
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

MIB, GIB = 2**20, 2**30
H100_BYTES = 80e9   # an H100 SXM's memory
ADAM_BYTES_PER_PARAMETER = 16  # fp32 weight, gradient and Adam's two moments
MESHES = ([1, 1, 1], [2, 1, 1], [2, 2, 1], [2, 2, 2], [4, 2, 2], [4, 4, 2], [4, 4, 4], [8, 4, 4], [8, 8, 4],
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


def predict(crop, base, mesh, full_scale=True, bytes_per_value=4):
    """Predicted ``(saved bytes per rank, halo bytes per step)`` for one sample split over ``mesh``.

    Per rank: every saved tensor's block (its side divided by the mesh), plus the two halo slabs per
    split axis that each convolution keeps with its input (axes in exchange order, so later slabs
    include the earlier halos). Halo bytes: each face between two blocks carries one slab each way,
    per convolution forward and per convolution but the first backward (the input needs no gradient).
    """
    saved, conv_inputs = unet_tensors(crop, base, full_scale)
    split = [axis for axis in range(3) if mesh[axis] > 1]
    per_rank = 0
    for channels, side in saved:
        per_rank += channels * (side // mesh[0]) * (side // mesh[1]) * (side // mesh[2])
    halo_values, sent_per_pass = 0, []
    for channels, side in conv_inputs:
        block = [side // parts for parts in mesh]
        slabs = sent = 0
        for axis in split:
            face = channels * block[(axis + 1) % 3] * block[(axis + 2) % 3]
            slabs += 2 * face
            others = mesh[(axis + 1) % 3] * mesh[(axis + 2) % 3]
            sent += 2 * (mesh[axis] - 1) * others * face
            block[axis] += 2  # the next axis's faces include this axis's halo
        halo_values += slabs
        sent_per_pass.append(sent)
    halo_bytes = (sum(sent_per_pass) + sum(sent_per_pass[1:])) * bytes_per_value
    return (per_rank + halo_values) * bytes_per_value, halo_bytes


def busiest_halo(crop, base, mesh, full_scale=True, bytes_per_value=4):
    """Predicted halo bytes that the busiest rank sends in one step: one with neighbours on both sides
    of every split axis sends two slabs per axis and convolution (one on each side), a rank of a
    2-wide axis one; forward, and backward for all but the first convolution, as in :func:`predict`."""
    _, conv_inputs = unet_tensors(crop, base, full_scale)
    sent_per_pass = []
    for channels, side in conv_inputs:
        block = [side // parts for parts in mesh]
        sent = 0
        for axis in range(3):
            if mesh[axis] > 1:
                sent += min(2, mesh[axis] - 1) * channels * block[(axis + 1) % 3] * block[(axis + 2) % 3]
                block[axis] += 2
        sent_per_pass.append(sent)
    return (sum(sent_per_pass) + sum(sent_per_pass[1:])) * bytes_per_value


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
             "mesh [N,1,1]. Saved activations: the largest rank's. Halo bytes of one step, forward and backward: "
             "all ranks together, the mean per rank, and the busiest rank's.", "",
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


def extension(base, parameters):
    """Predictions for the real data's crops on H100s: the smallest mesh whose ranks fit."""
    lines = ["", f"## Predicted, not measured: larger crops on 80 GB H100s (base_channels {base})", "",
             "Per rank: the predicted saved activations plus parameters, gradients and Adam state "
             f"({parameters / 1e6:.1f} M parameters x {ADAM_BYTES_PER_PARAMETER} bytes, fp32). The smallest mesh is "
             "the first of " + ", ".join(str(mesh) for mesh in MESHES[:6]) + ", ... whose ranks fit in 80 GB and whose "
             "largest tensor stays below 2^31 elements (the 32-bit indexing limit of some GPU kernels). bf16 counts "
             "every saved tensor at 2 bytes. The convolutions' transient workspace is not included: leave headroom.",
             "", "| crop | activations, 1 rank, fp32 (GiB) | largest tensor, 1 rank (elements) | smallest mesh, fp32 | "
             "per rank, fp32 (GiB) | smallest mesh, bf16 | per rank, bf16 (GiB) | halo per step, [2,1,1] fp32, "
             "all ranks (GiB) | the same, each rank (GiB) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for crop in (256, 512, 1024):
        whole, _ = predict(crop, base, [1, 1, 1], True, 4)
        cells = [f"{crop}^3", f"{whole / GIB:.1f}", f"{largest_tensor(crop, base, [1, 1, 1]) / 2**30:.2f} x 2^30"]
        for bytes_per_value in (4, 2):
            mesh, total = smallest_fitting_mesh(crop, base, True, bytes_per_value, parameters)
            cells += [str(mesh) if mesh else "none in the list", f"{total / GIB:.1f}" if total else "-"]
        cells += [f"{predict(crop, base, [2, 1, 1])[1] / GIB:.2f}", f"{busiest_halo(crop, base, [2, 1, 1]) / GIB:.2f}"]
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
    lines = table(rows, args.base_channels, date, device) + [f"\nNot measured: {line}." for line in skipped] + \
        extension(args.base_channels, parameters)
    command = "python -m benchmarks.domain " + " ".join(argv)
    with open(os.path.join(out_dir, "domain.json"), "w") as f:
        json.dump({"command": command.strip(), "device": device, "date": date, "base_channels": args.base_channels,
                   "rows": rows, "skipped": skipped}, f, indent=1)
    with open(os.path.join(out_dir, "domain.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"Results: {relative(out_dir)}/domain.json and domain.md")


if __name__ == "__main__":
    main()
