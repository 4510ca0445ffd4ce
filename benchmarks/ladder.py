"""The single-GPU optimisation ladder, measured side by side in one run.

    python -m benchmarks.ladder                      # the GPU suite: batch 64, crop 64, full-scale U-Net
    python -m benchmarks.ladder --preset cpu         # the loader rungs on a CPU: crop 32, batch 8

Each rung is the tutorial's training step with a few more options switched on (the same builders
as train.py, so it measures exactly what `python train.py ...` runs), timed with the benchy method:
IO (the loader alone), SYNTHETIC (one cached batch: no loader, but on a GPU a host loader's batch is
still copied every step) and FULL (real training), in
samples/s, with the model FLOP utilisation and the peak GPU memory. The results go to
``benchmarks/results/<device>-<date>.json`` (``device``, ``torch``, ``cuda``, ``date``,
``command``, ``runs``: a list of ``{name, full, synthetic, io, mfu, peak_mem_gb}``), a markdown table
beside it, and the raw log. Ratios between rungs are only meaningful within one such file. A run
refuses to write over such files already there (the same device, the same day) before it measures
anything: pass another ``--out_dir``, or ``--overwrite`` to replace them.

The data set is the synthetic one (a 256^3 training box on a GPU), made first if it is missing.

Each rung is measured in a process of its own (``python -m benchmarks.ladder --measure_rung ...``,
its output in the log): a rung that ends in a sticky CUDA error (an illegal address, a device-side
assert) or runs out of memory cannot take the rungs after it. ``--group`` measures a part of the
ladder (``gpu``: the GPU-resident rungs; ``loaders``: DALI's and the host loaders'). Where the
dispatcher says that a rung's 3-D convolutions leave cuDNN here (utils/conv3d.py: several times
slower), the rung is measured with one trial of at most 5 batches and marked in the table; its
MFU, like every rung's, is against the peak of the precision its convolutions run in (fp32 where
this PyTorch and cuDNN turn TF32 off for them).
"""
import argparse
import datetime
import functools
import json
import logging
import os
import sys
import tempfile
from dataclasses import dataclass

import torch

import train
from benchmarks.common import (add_output_options, argument_parser, check_preset, claim_files, dali_importable,
                               device_name, device_slug, free_name, make_data, outcome, results_folder, run,
                               software, software_text)
from benchmarks.trials import BatchStream, run_trials
from utils import get_data_loader_distributed
from utils.YParams import load_params
from utils.compiler import compile_problem
from utils.distributed import World, parallelize
from utils.conv3d import AMP_DTYPES, conv_backends, known_issues, on_cudnn, running_precision
from utils.errors import exit_on_user_error
from utils.flops import resolve_peak_flops, unet_flops_per_sample
from utils.losses import build_loss
from utils.optim import Precision, build_optimizer
from utils.prefetch import device_prefetcher

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
         step=11),
    Rung("+ torch.compile (bf16, fused)", [*BF16_FUSED, "--jit_mode=compile"], step=10),
    Rung("+ fused Adam (bf16)", BF16_FUSED, step=7),
    # fused: the scaler's inf check stays on the device, so fp16 and bf16 compare like for like
    Rung("gpu-inmem + AMP fp16 + fused Adam", ["--data_loader_config=gpu-inmem", "--amp_mode=fp16", "--enable_fused"],
         step=6),
    Rung("batch 8: + CUDA graph", ["--data_loader_config=gpu-inmem", "--amp_mode=bf16", "--global_batch_size=8"],
         "train_graph.py", step=14),
    Rung("batch 8: gpu-inmem bf16 fused", [*BF16_FUSED, "--global_batch_size=8"], step=13),
    Rung("gpu-inmem", ["--data_loader_config=gpu-inmem"], step=4),
    Rung("gpu-inmem + AMP bf16", ["--data_loader_config=gpu-inmem", "--amp_mode=bf16"], step=5),
    Rung("+ channels_last (bf16, fused)", [*BF16_FUSED, "--channels_last"], step=8),
    Rung("+ TorchScript loss (bf16, fused)", [*BF16_FUSED, "--enable_jit"], step=9),
]
DALI_RUNGS = [
    Rung("DALI (bf16, fused)", ["--data_loader_config=dali-lowmem", "--num_data_workers=8", "--amp_mode=bf16",
                                "--enable_fused"], step=12),
]
HOST_LOADER_RUNGS = [
    Rung("lowmem, 8 workers + device prefetch", ["--data_loader_config=lowmem", "--num_data_workers=8",
                                                 "--device_prefetch=true"], nbatches=5, step=3),
    Rung("lowmem, 8 workers", ["--data_loader_config=lowmem", "--num_data_workers=8", "--device_prefetch=false"],
         nbatches=5, step=2),
    Rung("baseline: lowmem, 2 workers", ["--data_loader_config=lowmem", "--num_data_workers=2",
                                         "--device_prefetch=false"], nbatches=5, step=1),
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


def rungs_for(preset, dali=None, group="all"):
    """The preset's rungs in the order they are measured (DALI's when it is importable); ``group``
    ``gpu`` or ``loaders`` keeps those of the GPU-resident loader, or the others (on a CPU: the
    gpu-inmem rung, or the host loaders')."""
    if preset == "cpu":
        rungs = CPU_RUNGS
    else:
        if dali is None:
            dali = dali_importable()
        rungs = GPU_RUNGS + (DALI_RUNGS if dali else []) + HOST_LOADER_RUNGS
    if group == "all":
        return rungs
    return [rung for rung in rungs if ("--data_loader_config=gpu-inmem" in rung.options) == (group == "gpu")]


PRESETS = {
    "gpu": {"options": ["--config=base"], "box": 256},
    "cpu": {"options": ["--config=demo", "--global_batch_size=8"], "box": 128},
}


def skip_reason(rung):
    """Why this machine cannot run the rung (None when it can): torch.compile's toolchain."""
    if "--jit_mode=compile" in rung.options:
        return compile_problem()
    return None


def slow_convolutions(options, device):
    """Why the rung's 3-D convolutions run several times slower here (None when they do not): the
    dispatcher's choice for its precision and layout (microseconds, nothing computed), with the
    known PyTorch/cuDNN pair behind it where there is one."""
    amp_mode = next((option.split("=", 1)[1] for option in options if option.startswith("--amp_mode=")), "none")
    if device.type != "cuda" or amp_mode not in AMP_DTYPES:
        return None
    layout = torch.channels_last_3d if "--channels_last" in options else torch.contiguous_format
    if on_cudnn(conv_backends(device, AMP_DTYPES[amp_mode], layout)) is not False:
        return None
    issues = known_issues(torch.__version__, torch.backends.cudnn.version(), amp_mode)
    return f"{amp_mode} 3-D convolutions leave cuDNN here" + (f" ({issues[0].source})" if issues else "")


def trial_sizes(args, nbatches, slow):
    """(nbatches, ntrials, nwarmup) of a rung: one short trial where its convolutions are slow."""
    return (min(nbatches, 5), 1, min(args.nwarmup, 1)) if slow else (nbatches, args.ntrials, args.nwarmup)


def warmup_calls(params, graph):
    """Step calls that must come before timing: train_graph.py's ``graph_warmup_steps`` eager steps,
    its capture and one replay; torch.compile's first (compiling) call; none otherwise."""
    if graph:
        return params.graph_warmup_steps + 2
    return 1 if params.jit_mode == "compile" else 0


def prime(step_fn, loader, move, calls):
    """Train ``calls`` steps on the first batch of ``loader`` (a :class:`BatchStream`), and wait for
    them: what is left to time is the steady state (benchy's warm-up trials then see replays, not a
    capture)."""
    if not calls:
        return
    inputs, targets = (move(tensor) for tensor in next(loader))
    for _ in range(calls):
        loss = step_fn(inputs, targets)
    float(loss)  # waits for the device: the capture and its replay are done


def measure_rung(options, script, args, nbatches):
    """Build what `python <script> <options>` would train and time it; returns the trial summary."""
    params = load_params(options)
    device = train.pick_device(params, World())  # as train.py: cuDNN autotuning and TF32 as the rung says
    move = functools.partial(train.to_device, device=device, memory_format=train.memory_format(params))
    train_loader = device_prefetcher(get_data_loader_distributed(params, 0, device)[0], params, device, move)
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
    batches = BatchStream(train_loader)  # one stream: the priming batch and the trials' never reset the loader
    # Compilation and capture happen before any trial, never inside a timed one.
    prime(step_fn, batches, move, warmup_calls(params, graph))
    precision = running_precision(params.amp_mode, params.tf32, device)
    peak, _ = resolve_peak_flops(device, precision)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    summary = run_trials(lambda x, y: step_fn(move(x), move(y)), batches, device,
                         nbatches=nbatches, ntrials=args.ntrials, nwarmup=args.nwarmup,
                         batch_size=params.global_batch_size, flops_per_sample=unet_flops_per_sample(params),
                         peak_flops=peak)
    return {**summary, "precision": precision}


def measure_in_process(rung, common, args, sizes, log_path):
    """:func:`measure_rung` in a process of its own, its output appended to ``log_path``: the summary,
    or ``{"error": ...}`` when the process failed (a sticky CUDA error ends that process only)."""
    nbatches, ntrials, nwarmup = sizes
    with tempfile.TemporaryDirectory() as folder:
        result = os.path.join(folder, "summary.json")
        code = run([sys.executable, "-m", "benchmarks.ladder", "--measure_rung",
                    json.dumps({"options": common + rung.options, "script": rung.script}), "--result", result,
                    "--nbatches", str(nbatches), "--ntrials", str(ntrials), "--nwarmup", str(nwarmup)],
                   log_path, args.rung_timeout, mode="a")
        if code != 0 or not os.path.exists(result):
            return {"error": f"its process failed ({outcome(code)}); see {os.path.basename(log_path)}"}
        with open(result) as f:
            return json.load(f)


def measure_one(args):
    """The child of :func:`measure_in_process`: one rung, its summary written to ``--result``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(message)s", stream=sys.stdout)
    spec = json.loads(args.measure_rung)
    summary = measure_rung(spec["options"], spec["script"], args, args.nbatches)
    with open(args.result, "w") as f:
        json.dump(summary, f)


def write_report(base, report):
    with open(base + ".json", "w") as f:
        json.dump(report, f, indent=2)
    with open(base + ".md", "w") as f:
        f.write(markdown_table(report))


def markdown_table(report):
    lines = [f"Measured by `{report['command']}` on {report['device']} ({software_text(report)}), {report['date']}. "
             "Samples/s; MFU of SYNTHETIC and FULL.", "",
             "| rung | FULL | SYNTHETIC | IO | MFU (synthetic) | MFU (full) | peak memory (GB) |",
             "|---|---|---|---|---|---|---|"]

    def number(value, digits=1):
        return "n/a" if value is None else f"{value:.{digits}f}"

    for entry in sorted(report["runs"], key=lambda entry: entry.get("step", 0)):  # the ladder's order
        if "error" in entry:
            outcome = entry["error"] if entry["error"].startswith("skipped") else f"failed: {entry['error']}"
            lines.append(f"| {entry['name']} | {outcome} | | | | | |")
            continue
        mfu = entry["mfu"] or {}
        name = f"{entry['name']} (slow here: {entry['slow']})" if entry.get("slow") else entry["name"]
        lines.append(f"| {name} | {number(entry['full'])} | {number(entry['synthetic'])} | {number(entry['io'])} "
                     f"| {number(mfu.get('synthetic'), 3)} | {number(mfu.get('full'), 3)} "
                     f"| {number(entry['peak_mem_gb'], 2)} |")
    return "\n".join(lines) + "\n"


@exit_on_user_error
def main(argv=None):
    parser = argument_parser(__doc__, PRESETS)
    add_output_options(parser, "benchmarks/results", "ladder")
    parser.add_argument("--nbatches", type=int, default=20, help="batches per trial")
    parser.add_argument("--ntrials", type=int, default=3)
    parser.add_argument("--nwarmup", type=int, default=1)
    parser.add_argument("--only", default="", help="run only rungs whose name contains this text")
    parser.add_argument("--group", choices=["all", "gpu", "loaders"], default="all",
                        help="gpu: the GPU-resident loader's rungs; loaders: DALI's and the host loaders'")
    parser.add_argument("--rung_timeout", type=int, default=900, help="seconds per rung's process")
    parser.add_argument("--measure_rung", help=argparse.SUPPRESS)  # a rung's process: JSON {options, script}
    parser.add_argument("--result", help=argparse.SUPPRESS)        # where that process writes its summary
    args = parser.parse_args(argv)
    if args.measure_rung:
        return measure_one(args)

    preset = PRESETS[args.preset]
    device = torch.device("cuda" if args.preset == "gpu" else "cpu")
    check_preset(args.preset)
    rungs = [rung for rung in rungs_for(args.preset, group=args.group) if args.only in rung.name]

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
    report = {"device": name, **software(), "date": stamp.isoformat(timespec="seconds"), "command": "python -m benchmarks.ladder "
              + " ".join(sys.argv[1:] if argv is None else argv), "runs": []}
    for rung in rungs:
        logging.info("=== %s: %s %s", rung.name, rung.script, " ".join(rung.options))
        entry = {"name": rung.name, "step": rung.step, "script": rung.script, "options": rung.options}
        skip = skip_reason(rung)
        if skip:  # one clear line, and the next rung: not a crash of the whole ladder
            logging.warning("rung %r skipped: %s", rung.name, skip)
            report["runs"].append({**entry, "error": f"skipped: {skip}"})
            write_report(base, report)
            continue
        slow = slow_convolutions(rung.options, device)
        if slow:
            entry["slow"] = f"{slow}: one trial of at most 5 batches"
            logging.warning("rung %r: %s", rung.name, entry["slow"])
        sizes = trial_sizes(args, min(args.nbatches, rung.nbatches or args.nbatches), slow)
        summary = measure_in_process(rung, common, args, sizes, base + ".log")
        if "error" in summary:  # one broken rung must not lose the others' numbers
            logging.error("rung %r failed: %s", rung.name, summary["error"])
            report["runs"].append({**entry, "error": summary["error"]})
            write_report(base, report)
            continue
        run = {**entry, "nbatches": sizes[0], "ntrials": sizes[1], "nwarmup": summary["nwarmup"],
               "precision": summary["precision"], "full": summary["full"], "synthetic": summary["synthetic"],
               "io": summary["io"], "mfu": summary["mfu"], "peak_mem_gb": summary["peak_mem_gb"]}
        report["runs"].append(run)
        logging.info("%s", json.dumps(run))
        write_report(base, report)  # after every rung: a run stopped at a time limit keeps what it measured

    write_report(base, report)
    print(markdown_table(report))
    print(f"Results: {base}.json, {base}.md, {base}.log")


if __name__ == "__main__":
    main()
