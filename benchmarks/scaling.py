"""Weak (or strong) scaling on one node: benchy trials at 1, 2, 4, ... ranks, with DDP and with --noddp.

    python -m benchmarks.scaling                   # on a GPU node: 1, 2, 4, ... ranks, one per GPU
    python -m benchmarks.scaling --preset cpu      # on a CPU: 1, 2, ... gloo ranks, one core each

Each point is one real run, ``torchrun --standalone --nproc_per_node=N train.py <options>
--enable_benchy``: the command the batch script runs on N GPUs. Weak scaling keeps the local batch
fixed, so N ranks train N times the samples per step, and ideal scaling is N times the throughput
of one. ``--global_batch_size=G`` measures strong scaling instead: G samples per step at every
size, G / N per rank, so that more ranks finish the same work sooner. Each size runs twice, with DDP and with ``--noddp`` (no gradient all-reduce): the gap
between the two is what communication costs that the backward pass does not hide. ``--mode ddp`` or
``--mode noddp`` runs one of the two alone (the table's overhead column needs both).

``--ddp_options`` tries DDP's knobs on the DDP runs. The results go to
``benchmarks/results/scaling/<device>-<date>/``, followed by the options that change what is
measured (``--local_batch_size``, ``--extra``, ``--ddp_options``) when given: each run's benchy
JSON (``ddp_N.json``, ``noddp_N.json``) and log, ``scaling.json`` (device, command, date, the
points) and ``README.md`` (the table, with efficiency and overhead). A folder that already holds
files (a rerun on the same device, the same day, with the same options) is refused before anything
runs: pass another ``--out_dir``, or ``--overwrite`` to replace its results. ``make figures`` plots
every such folder with ``benchmarks.plot_scaling``. Points on several nodes come from the batch script
(docs/04-distributed.md, "Multi-GPU performance"); this measures what one node can show.
"""
import datetime
import json
import os
import re
import shlex
import shutil
import sys

import torch

from benchmarks.common import (NOT_IN_TREE, ROOT, add_output_options, argument_parser, check_preset, claim_folder,
                               device_name, device_slug, free_name, holds_files, make_data, outcome, relative,
                               relative_args, results_folder, run, software, software_text)
from benchmarks import plot_scaling
from utils import noise
from utils.errors import exit_on_user_error

# The tutorial's weak-scaling settings (bs64_opt, local batch 64) with the GPU-resident loader, which
# needs no DALI wheel; on a CPU the demo model, one core per rank, so that ranks do not share cores. The
# layers stay plain (--exact_forms=off): every point computes the same arithmetic, and none times the forms.
PRESETS = {
    "gpu": {"options": ["--config=bs64_opt", "--data_loader_config=gpu-inmem", "--device=cuda", "--exact_forms=off"],
            "local_batch": 64, "box": 256, "threads": None, "unit": "GPUs"},
    "cpu": {"options": ["--config=demo", "--data_loader_config=gpu-inmem", "--device=cpu", "--exact_forms=off"],
            "local_batch": 8, "box": 128, "threads": 1, "unit": "CPU ranks (one core each)"},
}
# --mode: the runs at each size.
MODES = {"both": ("ddp", "noddp"), "ddp": ("ddp",), "noddp": ("noddp",)}
TRIALS = "IO: {{nbatches: {n}, ntrials: {t}, nwarmup: {w}}}\nsynthetic: {{nbatches: {n}, ntrials: {t}, " \
         "nwarmup: {w}}}\nfull: {{nbatches: {n}, ntrials: {t}, nwarmup: {w}}}\n"


def written_here(name):
    """Whether a file of the output folder is one that this tool writes: --overwrite removes those
    first, so that an earlier run's benchy JSON cannot pass for this run's."""
    return re.fullmatch(r"(no)?ddp_\d+\.(json|log)|scaling\.json|README\.md|benchy\.yaml", name) is not None


def default_ranks(preset):
    """1, 2, 4, ... up to the GPUs (or cores) this node has."""
    available = torch.cuda.device_count() if preset == "gpu" else os.cpu_count() or 1
    return [2 ** i for i in range(available.bit_length()) if 2 ** i <= available]


def point_command(preset, args, ranks, mode, train_path, val_path):
    """The torchrun command of one point: ``ranks`` processes, with DDP or with --noddp."""
    # Weak scaling: the same local batch at every size. Strong: one global batch, split over the ranks.
    local = args.global_batch_size // ranks if args.global_batch_size else preset["local_batch"]
    epochs = 2 * (args.nwarmup + args.ntrials) + 1  # one trial per epoch (SYNTHETIC, then FULL); +1 for benchy
    return ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", "train.py",
            *preset["options"], f"--train_path={train_path}", f"--val_path={val_path}",
            f"--local_batch_size={local}", f"--Nsamples={ranks * local * (args.nbatches + 1)}",
            f"--num_epochs={epochs}", "--enable_benchy", "--checkpoint=false",
            f"--expdir={os.path.join(args.work_dir, 'runs')}",
            f"--run_num={mode}_{ranks}", *(["--noddp"] if mode == "noddp" else shlex.split(args.ddp_options))]


def folder_name(device, stamp, args):
    """<device>-<date>, then the options that change what is measured: a variant never overwrites the baseline."""
    variant = " ".join([f"batch {args.local_batch_size}" if args.local_batch_size else "",
                        f"strong {args.global_batch_size}" if args.global_batch_size else "", args.extra,
                        args.ddp_options])
    return "-".join(filter(None, [device_slug(device), f"{stamp:%Y-%m-%d}", device_slug(variant)]))


def network_environment(environ=os.environ):
    """The NCCL_* and FI_* (libfabric) variables of this environment: a condition of every multi-rank
    result (algorithms, protocols, the network plugin and its settings), recorded beside it."""
    return {key: environ[key] for key in sorted(environ) if key.startswith(("NCCL_", "FI_"))}


def write_summary(out_dir, index):
    """scaling.json and README.md, rewritten after every point."""
    with open(os.path.join(out_dir, "scaling.json"), "w") as f:
        json.dump(index, f, indent=2)
    _, ddp, noddp = plot_scaling.read_folder(out_dir)
    lines = [f"# Scaling on one node: {index['device']}", "",
             f"Made by `{index['command']}` ({index['date']}, {software_text(index)}). FULL samples/s of the "
             f"whole job, {plot_scaling.batch_description(index)}; each point is the run named beside it, "
             "whose benchy JSON and log are in this folder.", "",
             plot_scaling.markdown_table(ddp, noddp, index["unit"], plot_scaling.folder_trials(out_dir)), "",
             "NCCL and libfabric environment: " + (" ".join(f"`{k}={v}`" for k, v in
                                                          index.get("network_environment", {}).items()) or "none set")
             + ".", "", "The runs:", ""]
    for point in index["points"]:
        result = f"`{point['file']}`" if "file" in point else f"no result, {point['error']}"
        lines.append(f"- {result}, log `{point['log']}` ({point['mode']}, {point['ranks']} "
                     f"{'rank' if point['ranks'] == 1 else 'ranks'}): `{point['command']}`")
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


@exit_on_user_error
def main(argv=None):
    parser = argument_parser(__doc__, PRESETS, scratch="scaling")
    parser.add_argument("--ranks", type=int, nargs="+", help="the sizes to run (default: 1, 2, 4, ... up to "
                        "the GPUs, or cores, of this node)")
    add_output_options(parser, "benchmarks/results/scaling", "scaling", "default: runs/benchmarks/scaling/"
                       "<device>-<date>, followed by the options that change what is measured (not tracked by git)")
    parser.add_argument("--nbatches", type=int, default=20, help="batches per trial")
    parser.add_argument("--ntrials", type=int, default=3)
    parser.add_argument("--nwarmup", type=int, default=1)
    parser.add_argument("--local_batch_size", type=int, help="per rank (default: the preset's, 64 or 8)")
    parser.add_argument("--global_batch_size", type=int, help="strong scaling instead of weak: this global batch "
                        "at every size, split over the ranks")
    parser.add_argument("--extra", default="", help="more train.py options for every run, e.g. '--amp_mode=bf16'")
    parser.add_argument("--ddp_options", default="", help="DDP's knobs, for the DDP runs only (the --noddp runs "
                        "send no gradients), e.g. '--bucket_cap_mb=100 --ddp_comm_hook=bf16'")
    parser.add_argument("--mode", choices=MODES, default="both", help="the runs at each size: ddp (DDP's gradient "
                        "all-reduce), noddp (--noddp: none) or both (default; the overhead column needs both)")
    args = parser.parse_args(argv)

    preset = PRESETS[args.preset]
    check_preset(args.preset)
    ranks = args.ranks or default_ranks(args.preset)
    if args.global_batch_size and (args.local_batch_size or any(args.global_batch_size % n for n in ranks)):
        parser.error(f"--global_batch_size={args.global_batch_size} must divide over every size ({ranks}), "
                     "and replaces --local_batch_size")
    if args.ddp_options and args.mode == "noddp":
        parser.error("--ddp_options sets DDP's knobs, and --mode noddp runs no DDP: leave out one of the two")
    name = device_name(args.preset == "gpu")
    stamp = datetime.datetime.now(datetime.timezone.utc)
    out_dir = args.out_dir or free_name(os.path.join(results_folder(args, "benchmarks/results/scaling", "scaling"),
                                                     folder_name(name, stamp, args)), args, holds_files)
    claim_folder(out_dir, args.overwrite, written_here)  # before anything is made, removed or run
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "benchy.yaml"), "w") as f:
        f.write(TRIALS.format(n=args.nbatches, t=args.ntrials, w=args.nwarmup))
    train_path, val_path = make_data(args.data_dir, preset["box"])
    shutil.rmtree(os.path.join(args.work_dir, "runs"), ignore_errors=True)  # the last measurement's run directories
    preset = {**preset, "options": preset["options"] + shlex.split(args.extra),
              "local_batch": args.local_batch_size or preset["local_batch"]}
    env = {**os.environ, "BENCHY_CONFIG_FILE": os.path.join(out_dir, "benchy.yaml")}
    if preset["threads"]:  # torchrun sets 1 thread per rank only for several ranks: the same for every size
        env["OMP_NUM_THREADS"] = str(preset["threads"])

    index = {"device": name, **software(), "date": stamp.isoformat(timespec="seconds"), "unit": preset["unit"],
             "local_batch": None if args.global_batch_size else preset["local_batch"],
             "global_batch": args.global_batch_size, "options": preset["options"], "ddp_options": args.ddp_options,
             "network_environment": network_environment(env),
             "command": "python -m benchmarks.scaling " + shlex.join(sys.argv[1:] if argv is None else argv),
             "points": []}
    for n in ranks:
        for mode in MODES[args.mode]:
            name = f"{mode}_{n}"
            command = point_command(preset, args, n, mode, train_path, val_path)
            env["BENCHY_OUTPUT"] = os.path.join(out_dir, name)
            variables = [f"{key}={relative(env[key])}" for key in ("OMP_NUM_THREADS", "BENCHY_CONFIG_FILE",
                                                                   "BENCHY_OUTPUT") if key in env]
            point = {"mode": mode, "ranks": n, "log": f"{name}.log",
                     "command": shlex.join([*variables, "python", *relative_args(command)])}
            print(f"=== {name}: {point['command']}", flush=True)
            code = run([sys.executable, *command], os.path.join(out_dir, point["log"]), args.timeout, env=env)
            if code == 0 and os.path.exists(os.path.join(out_dir, f"{name}.json")):
                point["file"] = f"{name}.json"
            else:
                point["error"] = f"the run failed ({outcome(code)})"  # its log says why
            print(json.dumps(point), flush=True)
            index["points"].append(point)
            write_summary(out_dir, index)  # after every point: a stage stopped at its time limit keeps them
    with open(os.path.join(out_dir, "README.md")) as f:
        print(f.read())
    if args.preset == "cpu" and args.mode == "both" and not (args.global_batch_size or args.ddp_options or args.extra):
        print(compare_efficiency(out_dir))
    print(f"Results in {relative(out_dir)}; plot them with `{plot_command(out_dir)}`.")
    return index


# The committed run whose 2-rank efficiency the README's CPU track quotes (step 6).
REFERENCE = os.path.join("benchmarks", "results", "scaling", "cpu-vm-2-cores-2026-11-25")


def plot_command(out_dir):
    """The command that plots a folder's runs (plot_scaling needs the files named)."""
    folder = shlex.quote(relative(out_dir))
    return (f"python -m benchmarks.plot_scaling --ddp {folder}/ddp_*.json --noddp {folder}/noddp_*.json "
            f"--out {folder}/scaling.png")


def efficiency_at_two(folder):
    """The DDP weak-scaling efficiency at 2 ranks of a folder, and the lost share (1 - DDP/noddp); None
    where it lacks either 2-rank point."""
    _, ddp, noddp = plot_scaling.read_folder(folder)
    if not {1, 2} <= set(ddp) or 2 not in noddp:
        return None
    return plot_scaling.efficiency(ddp)[2], 1 - ddp[2] / noddp[2]


def compare_efficiency(out_dir):
    """The README's number (2 ranks: weak-scaling efficiency, share lost to communication) here and in
    the committed run, judged by this run's trials (utils/noise.py)."""
    committed = os.path.join(ROOT, REFERENCE)
    here, reference = efficiency_at_two(out_dir), efficiency_at_two(committed) if os.path.isdir(committed) else None
    if here is None:
        return "The number to compare (README): needs 1 and 2 ranks (--ranks 1 2)."
    busy = noise.busy_line(plot_scaling.every_trial(plot_scaling.folder_trials(out_dir)))
    return noise.compare_line("2 ranks with DDP", f"{here[0]:.1%} weak-scaling efficiency, {here[1]:.1%} lost to "
                              "communication", f"{reference[0]:.1%}, {reference[1]:.1%}" if reference else NOT_IN_TREE,
                              REFERENCE, busy)


if __name__ == "__main__":
    main()
