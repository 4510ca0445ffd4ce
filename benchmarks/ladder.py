"""The single-GPU optimisation ladder, measured side by side in one run.

    python -m benchmarks.ladder                      # the GPU suite: batch 64, crop 64, full-scale U-Net
    python -m benchmarks.ladder --preset cpu         # the loader rungs on a CPU: crop 32, batch 8

Each rung is the tutorial's training step with a few more options switched on (the same builders
as train.py, so it measures exactly what `python train.py ...` runs), timed with the benchy method:
IO (the loader alone), SYNTHETIC (one cached batch: compute alone) and FULL (real training), in
samples/s, with the model FLOP utilisation and the peak GPU memory. The results go to
``benchmarks/results/<device>-<date>.json`` (``device``, ``torch``, ``cuda``, ``date``,
``command``, ``runs``: a list of ``{name, full, synthetic, io, mfu, peak_mem_gb}``), a markdown table
beside it, and the raw log. Ratios between rungs are only meaningful within one such file. A run
refuses to write over such files already there (the same device, the same day) before it measures
anything: pass another ``--out_dir``, or ``--overwrite`` to replace them.

The data set is the synthetic one (a 256^3 training box on a GPU), made first if it is missing.
"""
import datetime
import functools
import gc
import importlib.util
import json
import logging
import os
import sys
from dataclasses import dataclass

import torch

import train
from benchmarks.common import (add_output_options, argument_parser, check_preset, claim_files, device_name,
                               device_slug, free_name, make_data, results_folder)
from benchmarks.preflight import compile_problem
from benchmarks.trials import run_trials
from utils import get_data_loader_distributed
from utils.YParams import load_params
from utils.distributed import World, parallelize
from utils.errors import exit_on_user_error
from utils.flops import precision_of, resolve_peak_flops, unet_flops_per_sample
from utils.losses import build_loss
from utils.optim import Precision, build_optimizer

@dataclass(frozen=True)
class Rung:
    name: str
    options: list
    script: str = "train.py"
    nbatches: int = None  # batches per trial, when fewer than --nbatches
    step: int = 0         # its place on the tutorial's ladder: the order of the table


# Each rung adds to the tutorial's single-GPU settings. They are MEASURED in this order: first the
# rungs no GPU run has measured yet and whose numbers the tutorial lacks most (CUDA graph, compile,
# AMP with fused Adam, the GPU-resident loader), last the host loaders, which are slow at crop 64
# (the original's baseline: 85 samples/s on an A100) and get fewer batches. A suite stopped at its
# time limit then loses the least interesting rungs; the table lists them in the ladder's order.
BF16_FUSED = ["--data_loader_config=gpu-inmem", "--amp_mode=bf16", "--enable_fused"]
GPU_RUNGS = [
    Rung("+ CUDA graph (bf16, fused)", ["--data_loader_config=gpu-inmem", "--amp_mode=bf16"], "train_graph.py",
         step=10),
    Rung("+ torch.compile (bf16, fused)", [*BF16_FUSED, "--jit_mode=compile"], step=9),
    Rung("+ fused Adam (bf16)", BF16_FUSED, step=6),
    # fused: the scaler's inf check stays on the device, so fp16 and bf16 compare like for like
    Rung("gpu-inmem + AMP fp16 + fused Adam", ["--data_loader_config=gpu-inmem", "--amp_mode=fp16", "--enable_fused"],
         step=5),
    Rung("batch 8: + CUDA graph", ["--data_loader_config=gpu-inmem", "--amp_mode=bf16", "--global_batch_size=8"],
         "train_graph.py", step=13),
    Rung("batch 8: gpu-inmem bf16 fused", [*BF16_FUSED, "--global_batch_size=8"], step=12),
    Rung("gpu-inmem", ["--data_loader_config=gpu-inmem"], step=3),
    Rung("gpu-inmem + AMP bf16", ["--data_loader_config=gpu-inmem", "--amp_mode=bf16"], step=4),
    Rung("+ channels_last (bf16, fused)", [*BF16_FUSED, "--channels_last"], step=7),
    Rung("+ TorchScript loss (bf16, fused)", [*BF16_FUSED, "--enable_jit"], step=8),
]
DALI_RUNGS = [
    Rung("DALI (bf16, fused)", ["--data_loader_config=dali-lowmem", "--num_data_workers=8", "--amp_mode=bf16",
                                "--enable_fused"], step=11),
]
HOST_LOADER_RUNGS = [
    Rung("lowmem, 8 workers", ["--data_loader_config=lowmem", "--num_data_workers=8"], nbatches=5, step=2),
    Rung("baseline: lowmem, 2 workers", ["--data_loader_config=lowmem", "--num_data_workers=2"], nbatches=5, step=1),
]
# The loader comparison of the tutorial's CPU section: crop 32, batch 8, a width-16 U-Net. The first
# rung is the original tutorial's lowmem loader: the same reads, but one of 24 rotations applied to
# the grid alone (its velocity components were never turned); the second is this repository's.
ORIGINAL_AUGMENTATION = ["--augment=rotations", "--nbody_vector_channels=[]", "--hydro_vector_channels=[]"]
CPU_RUNGS = [
    Rung("original's lowmem: 24 rotations, velocities not turned, 2 workers",
         ["--data_loader_config=lowmem", "--num_data_workers=2", *ORIGINAL_AUGMENTATION], step=1),
    Rung("lowmem: 48 symmetries, velocities turned, 2 workers", ["--data_loader_config=lowmem", "--num_data_workers=2"],
         step=2),
    Rung("inmem, 2 workers", ["--data_loader_config=inmem", "--num_data_workers=2"], step=3),
    Rung("gpu-inmem on CPU tensors", ["--data_loader_config=gpu-inmem"], step=4),
]


def rungs_for(preset, dali=None):
    """The preset's rungs in the order they are measured (DALI's when it is importable)."""
    if preset == "cpu":
        return CPU_RUNGS
    if dali is None:
        dali = importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None
    return GPU_RUNGS + (DALI_RUNGS if dali else []) + HOST_LOADER_RUNGS


PRESETS = {
    "gpu": {"options": ["--config=base"], "box": 256},
    "cpu": {"options": ["--config=demo", "--global_batch_size=8"], "box": 128},
}


def skip_reason(rung):
    """Why this machine cannot run the rung (None when it can): torch.compile's toolchain."""
    if "--jit_mode=compile" in rung.options:
        return compile_problem()
    return None


def warmup_calls(params, graph):
    """Step calls that must come before timing: train_graph.py's ``graph_warmup_steps`` eager steps,
    its capture and one replay; torch.compile's first (compiling) call; none otherwise."""
    if graph:
        return params.graph_warmup_steps + 2
    return 1 if params.jit_mode == "compile" else 0


def prime(step_fn, loader, move, calls):
    """Train ``calls`` steps on the loader's first batch, and wait for them: what is left to time is
    the steady state (benchy's warm-up trials then see replays, not a capture)."""
    if not calls:
        return
    inputs, targets = (move(tensor) for tensor in next(iter(loader)))
    for _ in range(calls):
        loss = step_fn(inputs, targets)
    float(loss)  # waits for the device: the capture and its replay are done


def measure_rung(options, script, args, nbatches):
    """Build what `python <script> <options>` would train and time it; returns the trial summary."""
    params = load_params(options)
    device = train.pick_device(params, World())  # as train.py: cuDNN autotuning and TF32 as the rung says
    train_loader, _ = get_data_loader_distributed(params, 0, device)
    graph = script == "train_graph.py"
    torch.manual_seed(params.seed)
    model = parallelize(train.build_model(params, device), params, World(), device, graph)
    optimizer = build_optimizer(params, model, capturable=graph)
    precision = Precision(params.amp_mode, device, cache=not graph)
    if graph:
        from train_graph import make_graph_step
        step_fn = make_graph_step(model, optimizer, build_loss(params), precision, params)
    else:
        step_fn = train.default_step(model, optimizer, build_loss(params), precision, params)
    move = functools.partial(train.to_device, device=device, memory_format=train.memory_format(params))
    # Compilation and capture happen before any trial, never inside a timed one.
    prime(step_fn, train_loader, move, warmup_calls(params, graph))
    peak, _ = resolve_peak_flops(device, precision_of(params.amp_mode, params.tf32))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return run_trials(lambda x, y: step_fn(move(x), move(y)), train_loader, device,
                      nbatches=nbatches, ntrials=args.ntrials, nwarmup=args.nwarmup,
                      batch_size=params.global_batch_size, flops_per_sample=unet_flops_per_sample(params),
                      peak_flops=peak)


def write_report(base, report):
    with open(base + ".json", "w") as f:
        json.dump(report, f, indent=2)
    with open(base + ".md", "w") as f:
        f.write(markdown_table(report))


def markdown_table(report):
    lines = [f"Measured by `{report['command']}` on {report['device']} (torch {report['torch']}, "
             f"CUDA {report['cuda']}), {report['date']}. Samples/s; MFU of SYNTHETIC and FULL.", "",
             "| rung | FULL | SYNTHETIC | IO | MFU (synthetic) | MFU (full) | peak memory (GB) |",
             "|---|---|---|---|---|---|---|"]

    def number(value, digits=1):
        return "n/a" if value is None else f"{value:.{digits}f}"

    for run in sorted(report["runs"], key=lambda run: run.get("step", 0)):  # the ladder's order
        if "error" in run:
            outcome = run["error"] if run["error"].startswith("skipped") else f"failed: {run['error']}"
            lines.append(f"| {run['name']} | {outcome} | | | | | |")
            continue
        mfu = run["mfu"] or {}
        lines.append(f"| {run['name']} | {number(run['full'])} | {number(run['synthetic'])} | {number(run['io'])} "
                     f"| {number(mfu.get('synthetic'), 3)} | {number(mfu.get('full'), 3)} "
                     f"| {number(run['peak_mem_gb'], 2)} |")
    return "\n".join(lines) + "\n"


@exit_on_user_error
def main(argv=None):
    parser = argument_parser(__doc__, PRESETS)
    add_output_options(parser, "benchmarks/results", "ladder")
    parser.add_argument("--nbatches", type=int, default=20, help="batches per trial")
    parser.add_argument("--ntrials", type=int, default=3)
    parser.add_argument("--nwarmup", type=int, default=1)
    parser.add_argument("--only", default="", help="run only rungs whose name contains this text")
    args = parser.parse_args(argv)

    preset = PRESETS[args.preset]
    device = torch.device("cuda" if args.preset == "gpu" else "cpu")
    check_preset(args.preset)
    rungs = [rung for rung in rungs_for(args.preset) if args.only in rung.name]

    name = device_name(device.type == "cuda")
    stamp = datetime.datetime.now(datetime.timezone.utc)
    out_dir = results_folder(args, "benchmarks/results", "ladder")
    base = free_name(os.path.join(out_dir, f"{device_slug(name)}-{stamp:%Y-%m-%d}"), args,
                     lambda b: any(os.path.exists(b + suffix) for suffix in (".json", ".md", ".log")))
    # Before anything is made or measured: the folder is shared, so only this run's three names count.
    claim_files([base + suffix for suffix in (".json", ".md", ".log")], args.overwrite,
                earlier="an earlier run on this device today")
    os.makedirs(out_dir, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(message)s",
                        handlers=[logging.StreamHandler(sys.stdout), logging.FileHandler(base + ".log")])

    train_path, val_path = make_data(args.data_dir, preset["box"])
    common = [*preset["options"], f"--train_path={train_path}", f"--val_path={val_path}",
              f"--device={device.type}", "--checkpoint=false"]
    report = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda,
              "date": stamp.isoformat(timespec="seconds"), "command": "python -m benchmarks.ladder "
              + " ".join(sys.argv[1:] if argv is None else argv), "runs": []}
    for rung in rungs:
        logging.info("=== %s: %s %s", rung.name, rung.script, " ".join(rung.options))
        gc.collect()  # the last rung's model, optimiser and graph go now, not into this rung's peak memory
        if device.type == "cuda":
            torch.cuda.empty_cache()
        entry = {"name": rung.name, "step": rung.step, "script": rung.script, "options": rung.options}
        skip = skip_reason(rung)
        if skip:  # one clear line, and the next rung: not a crash of the whole ladder
            logging.warning("rung %r skipped: %s", rung.name, skip)
            report["runs"].append({**entry, "error": f"skipped: {skip}"})
            write_report(base, report)
            continue
        try:
            nbatches = min(args.nbatches, rung.nbatches or args.nbatches)
            summary = measure_rung(common + rung.options, rung.script, args, nbatches)
        except Exception as error:  # one broken rung must not lose the others' numbers
            logging.exception("rung %r failed", rung.name)
            report["runs"].append({**entry, "error": str(error)[:200]})
            write_report(base, report)
            continue
        run = {**entry, "nbatches": nbatches, "full": summary["full"], "synthetic": summary["synthetic"],
               "io": summary["io"], "mfu": summary["mfu"], "peak_mem_gb": summary["peak_mem_gb"]}
        report["runs"].append(run)
        logging.info("%s", json.dumps(run))
        write_report(base, report)  # after every rung: a run stopped at a time limit keeps what it measured

    write_report(base, report)
    print(markdown_table(report))
    print(f"Results: {base}.json, {base}.md, {base}.log")


if __name__ == "__main__":
    main()
