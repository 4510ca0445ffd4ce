"""The single-GPU optimisation ladder, measured side by side in one run.

    python -m benchmarks.ladder                      # the GPU suite: batch 64, crop 64, full-scale U-Net
    python -m benchmarks.ladder --preset cpu         # the loader rungs on a CPU: crop 32, batch 8

Each rung is the tutorial's training step with a few more options switched on (the same builders
as train.py, so it measures exactly what `python train.py ...` runs), timed with the benchy method:
IO (the loader alone), SYNTHETIC (one cached batch: no loader, but on a GPU a host loader's batch is
still copied every step) and FULL (real training), in
samples/s, with the model FLOP utilisation and the peak GPU memory. The results go to
``benchmarks/results/<device>-<date>.json`` (``device``, ``torch``, ``cuda``, ``date``,
``command``, ``runs``: a list of ``{name, table, full, synthetic, io, mfu, peak_mem_gb, trials}``,
``trials`` holding each kind's trials with their mean, median, std, min, max and spread; on a GPU
``batch_sweep``: the best rung at local batch 64, 128 and 256), markdown tables beside it (the
ladder, where each rung adds one thing to the one before; the rungs alone; the batch sweep), and
the raw log. Under the tables, utils/noise.py's line says when the trials cannot rank the rungs
(a spread over 20%, or FULL above SYNTHETIC or IO), and the CPU preset prints the ratio the
README asks to compare beside the committed run's. Ratios between rungs are only meaningful
within one such file. A run refuses to write over such files already there (the same device, the
same day) before it measures anything: pass another ``--out_dir``, or ``--overwrite`` to replace
them.

The data set is the synthetic one (a 256^3 training box on a GPU), made first if it is missing.

Each rung is measured in a process of its own (``python -m benchmarks.ladder --measure_rung ...``,
its output in the log): a rung that ends in a sticky CUDA error (an illegal address, a device-side
assert) or runs out of memory cannot take the rungs after it. ``--group`` measures a part of the
ladder (``gpu``: the GPU-resident rungs, or a part of them, ``ladder`` with the batch sweep or
``alone``; ``loaders``: DALI's and the host loaders'). Where the dispatcher says that a rung's 3-D convolutions leave cuDNN here (utils/conv3d.py: several times
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
from benchmarks.common import (NOT_IN_TREE, add_output_options, argument_parser, check_preset, claim_files,
                               committed_json, dali_importable, device_name, device_slug, free_name, make_data,
                               outcome, results_folder, run, software, software_text)
from benchmarks.trials import BatchStream, run_trials
from utils import get_data_loader_distributed, noise
from utils.YParams import load_params
from utils.compiler import compile_problem
from utils.distributed import World, parallelize
from utils.conv3d import AMP_DTYPES, conv_backends, known_issues, on_cudnn, running_precision
from utils.errors import UserError, exit_on_user_error
from utils.exact_forms import option_text
from utils.flops import resolve_peak_flops, unet_flops_per_sample
from utils.losses import build_loss
from utils.optim import Precision, build_optimizer
from utils.prefetch import device_prefetcher

@dataclass(frozen=True)
class Rung:
    name: str
    options: list
    script: str = "train.py"
    nbatches: int = None  # a host loader's rung: at least this many batches per trial (--host_nbatches)
    step: int = 0         # its place on the tutorial's ladder: the order of the table
    table: str = "ladder"  # "ladder": one more thing than the rung before; "alone": one thing on bf16 + fused Adam


# The ladder: each rung adds one thing to the one before it, so that the last is everything together,
# the best rung. The exact forms (--exact_forms) are off until their rung: a rung before it that left
# the switch at its default would take them where they are faster (ladder_options adds the "off"). Their
# rung is auto's, the layers the timing finds faster; the first rung measured with auto decides, and the
# others compute with its list of layers (ladder_options), so that every rung with the forms has the same.
FP32 = ["--data_loader_config=gpu-inmem"]
BF16 = [*FP32, "--amp_mode=bf16"]
BF16_FUSED = [*BF16, "--enable_fused"]
CHANNELS_LAST = [*BF16_FUSED, "--channels_last"]
COMPILED = [*CHANNELS_LAST, "--jit_mode=compile"]
EXACT_FORMS = [*COMPILED, "--exact_forms=auto"]
LADDER_RUNGS = [
    Rung("gpu-inmem", FP32, step=4),
    Rung("+ AMP bf16", BF16, step=5),
    Rung("+ fused Adam", BF16_FUSED, step=6),
    Rung("+ channels_last", CHANNELS_LAST, step=7),
    Rung("+ torch.compile", COMPILED, step=8),
    Rung("+ exact forms", EXACT_FORMS, step=9),
    # The step's launches in one graph: train_graph.py's capture of the compiled step, or torch.compile's
    # own CUDA graphs; whichever pays is the best rung, and the batch sweep runs at it.
    Rung("+ CUDA graph (train_graph.py)", EXACT_FORMS, "train_graph.py", step=10),
    Rung("+ compile's CUDA graphs (reduce-overhead)", [*EXACT_FORMS, "--compile_mode=reduce-overhead"], step=11),
]
# One thing at a time on gpu-inmem + bf16 + fused Adam: what each is worth alone.
ALONE_RUNGS = [
    # fused: the scaler's inf check stays on the device, so fp16 and bf16 compare like for like
    Rung("fp16 instead of bf16", [*FP32, "--amp_mode=fp16", "--enable_fused"], step=12, table="alone"),
    Rung("TorchScript loss", [*BF16_FUSED, "--enable_jit"], step=13, table="alone"),
    Rung("torch.compile", [*BF16_FUSED, "--jit_mode=compile"], step=14, table="alone"),
    Rung("exact forms", [*BF16_FUSED, "--exact_forms=on"], step=15, table="alone"),  # every layer that has one
    Rung("CUDA graph", BF16_FUSED, "train_graph.py", step=16, table="alone"),
    Rung("batch 8", [*BF16_FUSED, "--global_batch_size=8"], step=17, table="alone"),
    Rung("batch 8 + CUDA graph", [*BF16_FUSED, "--global_batch_size=8"], "train_graph.py", step=18, table="alone"),
    # The GPU-resident loader's gather on a side stream (utils/prefetch.py): FULL against this table's
    # SYNTHETIC says whether it pays.
    Rung("gather on a side stream", [*BF16_FUSED, "--side_stream_gather"], step=19, table="alone"),
]
GPU_RUNGS = LADDER_RUNGS + ALONE_RUNGS
DALI_RUNGS = [
    Rung("DALI", ["--data_loader_config=dali-lowmem", "--num_data_workers=8", "--amp_mode=bf16", "--enable_fused"],
         step=20, table="alone"),
]
# A host loader's trial (--host_nbatches) covers at least twice the batches its 8 workers x 2 prefetched hold in flight,
# and the first reads of the data set's file: with 5-batch trials (the H100 run of 2026-11-25) the
# lowmem loader's IO (296.5 samples/s) came out below its FULL (500.4), which cannot be.
HOST_LOADER_BATCHES = 32
HOST_LOADER_RUNGS = [
    Rung("lowmem, 8 workers + device prefetch", ["--data_loader_config=lowmem", "--num_data_workers=8",
                                                 "--device_prefetch=true"], nbatches=HOST_LOADER_BATCHES, step=3),
    Rung("lowmem, 8 workers", ["--data_loader_config=lowmem", "--num_data_workers=8", "--device_prefetch=false"],
         nbatches=HOST_LOADER_BATCHES, step=2),
    Rung("baseline: lowmem, 2 workers", ["--data_loader_config=lowmem", "--num_data_workers=2",
                                         "--device_prefetch=false"], nbatches=HOST_LOADER_BATCHES, step=1),
]
# The local batches of the sweep at the best rung (GPU only: it measures what a GPU's memory holds).
BATCH_SWEEP = (64, 128, 256)
# Every compiled rung runs with Inductor's layout optimisation on. Its heuristic turns it off for a whole
# graph that holds a convolution with at least twice as many input as output channels, as the sub-pixel
# form of the last layer (128 -> 40) is: held on, "+ exact forms" differs from "+ torch.compile" in the
# forms alone, and the compiled rung without them measures what it measured before (the heuristic keeps
# it on for the plain U-Net on a GPU). torch._inductor.config reads this variable when it is imported.
COMPILED_ENVIRONMENT = {"TORCHINDUCTOR_FORCE_LAYOUT_OPT": "1"}
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
    gpu-inmem rung, or the host loaders'); ``ladder`` and ``alone`` keep the GPU-resident rungs of
    that table.

    On a GPU the ladder is measured from its top down (the best rung first, then what each step below
    it leaves out), then the rungs alone, last the host loaders, which are slow at crop 64 (the
    original's baseline: 85 samples/s on an A100). A suite stopped at its time limit then loses the
    least interesting rungs; the tables list them in the ladder's order."""
    if preset == "cpu":
        rungs = CPU_RUNGS
    else:
        if dali is None:
            dali = dali_importable()
        rungs = LADDER_RUNGS[::-1] + ALONE_RUNGS + (DALI_RUNGS if dali else []) + HOST_LOADER_RUNGS
    if group == "all":
        return rungs
    if group in ("ladder", "alone"):  # a part of the GPU-resident rungs, for a session too short for all
        return [rung for rung in rungs if rung.table == group and "--data_loader_config=gpu-inmem" in rung.options]
    return [rung for rung in rungs if ("--data_loader_config=gpu-inmem" in rung.options) == (group == "gpu")]


def select_rungs(rungs, fragments, where):
    """``(selected, elsewhere)``: the ``rungs`` whose names hold any of ``fragments`` (``--only``; all of them where
    none is given), in their order, and the fragments that name none of them but a rung of another preset or group
    (or DALI's, left out where DALI is not installed): those select nothing here. A fragment that names no rung at
    all is the user's error; ``where`` says which rungs were searched (the preset and group)."""
    def named(fragment, pool):
        return any(fragment in rung.name for rung in pool)

    unknown = [fragment for fragment in fragments if not named(fragment, CPU_RUNGS + GPU_RUNGS + DALI_RUNGS
                                                                + HOST_LOADER_RUNGS)]
    if unknown:
        names = "; ".join(f'"{rung.name}"' for rung in rungs) or "none"
        raise UserError(f"--only {' '.join(map(repr, unknown))}: no rung has a name that holds "
                        f"{'it' if len(unknown) == 1 else 'them'}. The rungs of {where}: {names}. Pass a part of one "
                        "of these names (several parts: --only A B), or another --preset or --group.")
    selected = [rung for rung in rungs if not fragments or any(fragment in rung.name for fragment in fragments)]
    return selected, [fragment for fragment in fragments if not named(fragment, rungs)]


PRESETS = {
    "gpu": {"options": ["--config=base"], "box": 256},
    "cpu": {"options": ["--config=demo", "--global_batch_size=8"], "box": 128},
}


def has_config_key(key):
    """Whether the configuration (config/UNet.yaml) has ``key``: a rung whose switch a tree lacks is
    skipped with that reason rather than failed."""
    return key in load_params(["--config=base"])


def skip_reason(rung, exact_forms=None):
    """Why this machine cannot run the rung (None when it can): torch.compile's toolchain, or a tree
    without the exact forms' switch (``exact_forms``: whether the config has it; looked up when None)."""
    names_forms = any(option.startswith("--exact_forms=") for option in rung.options)
    if names_forms and not (has_config_key("exact_forms") if exact_forms is None else exact_forms):
        return "this tree's configuration has no exact_forms key (--exact_forms)"
    if "--jit_mode=compile" in rung.options:
        return compile_problem()
    return None


def ladder_options(rung, exact_forms, decided=None):
    """The rung's options, with ``--exact_forms=off`` where it does not name the switch and the config has
    it (``exact_forms``): a rung below the exact forms' own measures without them, whatever the default.
    ``decided``: the layers an earlier rung's ``--exact_forms=auto`` chose, which this rung's auto takes."""
    options = list(rung.options)
    if exact_forms and not any(option.startswith("--exact_forms=") for option in options):
        options.append("--exact_forms=off")
    if decided is not None and "--exact_forms=auto" in options:
        options[options.index("--exact_forms=auto")] = f"--exact_forms={option_text(decided)}"
    return options


def decided_forms(entries):
    """The layers the first measured rung with ``--exact_forms=auto`` computed in their forms (None before one)."""
    return next((entry["exact_forms"] for entry in entries if isinstance(entry.get("exact_forms"), list)), None)


def rung_environment(options):
    """The environment variables a rung's process gets beyond this one's: :data:`COMPILED_ENVIRONMENT` where
    it compiles."""
    return dict(COMPILED_ENVIRONMENT) if "--jit_mode=compile" in options else {}


def sweep_rungs(best, batches=BATCH_SWEEP):
    """The local-batch sweep at the best rung: one rung per batch size, the best's options with
    ``--global_batch_size`` (one GPU: the local batch)."""
    return [Rung(f"local batch {batch}", [*best.options, f"--global_batch_size={batch}"], best.script,
                 step=batch, table="batch") for batch in batches]


def best_rung(runs):
    """The ladder's rung (a measured entry of the report) with the highest FULL, as a :class:`Rung`; None
    when none was measured."""
    measured = [run for run in runs if run.get("table", "ladder") == "ladder" and run.get("full")
                and "--data_loader_config=gpu-inmem" in run["options"]]
    if not measured:
        return None
    best = max(measured, key=lambda run: run["full"])
    return Rung(best["name"], best["options"], best["script"], step=best["step"])


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


def build_step(params, device, graph):
    """The one-batch step ``params`` would train with: train.py's, or (``graph``) train_graph.py's captured
    one; the model seeded as train.py seeds it."""
    torch.manual_seed(params.seed)
    model = parallelize(train.build_model(params, device), params, World(), device, graph)
    optimizer = build_optimizer(params, model, capturable=graph)
    precision = Precision(params.amp_mode, device, cache=not graph)
    if graph:
        from train_graph import make_graph_step
        return make_graph_step(model, optimizer, build_loss(params), precision, params)
    return train.default_step(model, optimizer, build_loss(params), precision, params)


def measure_rung(options, script, args, nbatches):
    """Build what `python <script> <options>` would train and time it; returns the trial summary."""
    params = load_params(options)
    device = train.pick_device(params, World())  # as train.py: cuDNN autotuning and TF32 as the rung says
    move = functools.partial(train.to_device, device=device, memory_format=train.memory_format(params))
    train_loader = device_prefetcher(get_data_loader_distributed(params, 0, device)[0], params, device, move)
    graph = script == "train_graph.py"
    step_fn = build_step(params, device, graph)
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
    return {**summary, "precision": precision, "exact_forms": params.exact_forms}  # auto's choice: a list


def measure_in_process(rung, common, args, sizes, log_path):
    """:func:`measure_rung` in a process of its own, its output appended to ``log_path``: the summary,
    or ``{"error": ...}`` when the process failed (a sticky CUDA error ends that process only)."""
    nbatches, ntrials, nwarmup = sizes
    with tempfile.TemporaryDirectory() as folder:
        result = os.path.join(folder, "summary.json")
        code = run([sys.executable, "-m", "benchmarks.ladder", "--measure_rung",
                    json.dumps({"options": common + rung.options, "script": rung.script}), "--result", result,
                    "--nbatches", str(nbatches), "--ntrials", str(ntrials), "--nwarmup", str(nwarmup)],
                   log_path, args.rung_timeout, mode="a", env={**os.environ, **rung_environment(rung.options)})
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


TABLES = {
    "ladder": "The ladder: each rung adds one thing to the one before it",
    "alone": "Alone: each on gpu-inmem + AMP bf16 + fused Adam, one thing at a time",
    "batch": "The local-batch sweep at the best rung",
}
KINDS = ("full", "synthetic", "io")


def trials_of(entry):
    """``{FULL: trials, SYNTHETIC: ..., IO: ...}`` of a measured entry (none in files written before the
    entries kept their trials)."""
    return {kind.upper(): entry.get("trials", {}).get(kind, {}).get("trials", []) for kind in KINDS}


def judgement(report):
    """The line :mod:`utils.noise` prints when the report's trials cannot rank its rungs, else None:
    one rung's trials spread more than 20%, or its FULL above its SYNTHETIC or IO."""
    measurements, above = {}, []
    for entry in report["runs"] + report.get("batch_sweep", []):
        for kind, trials in trials_of(entry).items():
            measurements[f"{entry['name']}: {kind}"] = trials
        above += [(f"{entry['name']}: {high}", f"{entry['name']}: {low}") for high, low in noise.BENCHY_ORDER]
    return noise.busy_line(measurements, above)


def markdown_table(report):
    lines = [f"Measured by `{report['command']}` on {report['device']} ({software_text(report)}), {report['date']}. "
             "Samples/s (the mean of the trials; spread: (max - min) / mean of FULL's, SYNTHETIC's and IO's "
             "trials); MFU of SYNTHETIC and FULL."]

    def number(value, digits=1):
        return "n/a" if value is None else f"{value:.{digits}f}"

    def row(entry):
        if "error" in entry:
            outcome = entry["error"] if entry["error"].startswith("skipped") else f"failed: {entry['error']}"
            return f"| {entry['name']} | {outcome} | | | | | | |"
        mfu = entry["mfu"] or {}
        name = f"{entry['name']} (slow here: {entry['slow']})" if entry.get("slow") else entry["name"]
        if isinstance(entry.get("exact_forms"), list):  # auto's choice, or the one it took from the rung that made it
            name += f" (exact forms: {', '.join(entry['exact_forms']) or 'none'})"
        spreads = " / ".join(noise.spread_text(trials) for trials in trials_of(entry).values())
        return (f"| {name} | {number(entry['full'])} | {number(entry['synthetic'])} | {number(entry['io'])} "
                f"| {spreads if entry.get('trials') else 'n/a'} | {number(mfu.get('synthetic'), 3)} "
                f"| {number(mfu.get('full'), 3)} | {number(entry['peak_mem_gb'], 2)} |")

    header = ["| rung | FULL | SYNTHETIC | IO | spread | MFU (synthetic) | MFU (full) | peak memory (GB) |",
              "|---|---|---|---|---|---|---|---|"]
    tables = {name: [entry for entry in report["runs"] if entry.get("table", "ladder") == name] for name in TABLES}
    tables["batch"] = report.get("batch_sweep", [])
    for name, entries in tables.items():
        if not entries and name != "ladder":  # the ladder's header stands even over no rung
            continue
        if len(lines) > 1 or name != "ladder":
            lines += ["", f"{TABLES[name]}:"]
        lines += ["", *header, *(row(entry) for entry in sorted(entries, key=lambda entry: entry.get("step", 0)))]
    if report.get("batch_sweep_skipped"):
        lines += ["", f"{TABLES['batch']}: {report['batch_sweep_skipped']}."]
    held = sorted({f"{key}={value}" for entry in report["runs"] + tables["batch"]
                   for key, value in entry.get("environment", {}).items()})
    if held:
        lines += ["", f"The compiled rungs ran with {', '.join(held)}: Inductor's layout optimisation on in all of "
                  "them, with the exact forms and without."]
    busy = judgement(report)
    if busy:
        lines += ["", f"Not a ranking: {busy}."]
    return "\n".join(lines) + "\n"


# The committed run whose ratio the README's CPU track quotes (step 2): the GPU-resident loader's IO
# over the original's lowmem loader's.
REFERENCE = os.path.join("benchmarks", "results", "cpu-vm-2-cores-2026-11-25.json")
ORIGINAL, GPU_RESIDENT = CPU_RUNGS[0].name, CPU_RUNGS[-1].name


def loader_ratio(report):
    """``(ratio, GPU-resident IO, original's IO)`` of a CPU report, None where either rung is missing."""
    io = {entry["name"]: entry.get("io") for entry in report["runs"]}
    if not io.get(ORIGINAL) or not io.get(GPU_RESIDENT):
        return None
    return io[GPU_RESIDENT] / io[ORIGINAL], io[GPU_RESIDENT], io[ORIGINAL]


def compare_line(report):
    """The README's number (CPU track, step 2) measured here beside the README's, judged by the trials."""
    here = loader_ratio(report)
    if here is None:
        return None
    committed = committed_json(REFERENCE)
    reference = loader_ratio(committed) if committed else None
    return noise.compare_line("the GPU-resident loader's IO over the original's lowmem",
                              f"{here[0]:.1f} times ({here[1]:.1f} against {here[2]:.1f} samples/s)",
                              f"{reference[0]:.1f} times ({reference[1]:.1f} against {reference[2]:.1f})"
                              if reference else NOT_IN_TREE,
                              REFERENCE, judgement(report))


@exit_on_user_error
def main(argv=None):
    parser = argument_parser(__doc__, PRESETS)
    add_output_options(parser, "benchmarks/results", "ladder")
    parser.add_argument("--nbatches", type=int, default=20, help="batches per trial")
    parser.add_argument("--ntrials", type=int, default=3)
    parser.add_argument("--nwarmup", type=int, default=1)
    parser.add_argument("--only", nargs="+", default=[], metavar="TEXT",
                        help="run only the rungs whose names hold one of these parts (--only A B: either)")
    parser.add_argument("--group", choices=["all", "gpu", "ladder", "alone", "loaders"], default="all",
                        help="gpu: the GPU-resident loader's rungs (ladder: those of the ladder and the batch sweep; "
                        "alone: those measured alone); loaders: DALI's and the host loaders'")
    parser.add_argument("--host_nbatches", type=int, default=HOST_LOADER_BATCHES,
                        help="at least this many batches per trial of a host loader's rung (GPU preset)")
    parser.add_argument("--batch_sweep", type=int, nargs="*", default=list(BATCH_SWEEP),
                        help="local batches measured at the best rung (GPU only; none: no sweep)")
    parser.add_argument("--rung_timeout", type=int, default=900, help="seconds per rung's process")
    parser.add_argument("--measure_rung", help=argparse.SUPPRESS)  # a rung's process: JSON {options, script}
    parser.add_argument("--result", help=argparse.SUPPRESS)        # where that process writes its summary
    args = parser.parse_args(argv)
    if args.measure_rung:
        return measure_one(args)

    preset = PRESETS[args.preset]
    device = torch.device("cuda" if args.preset == "gpu" else "cpu")
    check_preset(args.preset)
    where = f"--preset {args.preset} --group {args.group}" + " here (no DALI rung: nvidia.dali is not installed)" * (
        args.preset == "gpu" and not dali_importable())
    rungs, elsewhere = select_rungs(rungs_for(args.preset, group=args.group), args.only, where)

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

    if elsewhere:
        logging.warning("--only %s: no rung of %s; %s a rung of another preset or group: none measured for %s",
                        " ".join(map(repr, elsewhere)), where, "names" if len(elsewhere) == 1 else "each names",
                        "it" if len(elsewhere) == 1 else "them")

    train_path, val_path = make_data(args.data_dir, preset["box"])
    common = [*preset["options"], f"--train_path={train_path}", f"--val_path={val_path}",
              f"--device={device.type}", "--checkpoint=false"]
    report = {"device": name, **software(), "date": stamp.isoformat(timespec="seconds"), "command": "python -m benchmarks.ladder "
              + " ".join(sys.argv[1:] if argv is None else argv), "runs": []}
    exact_forms = has_config_key("exact_forms")
    for rung in rungs:
        report["runs"].append(measure_entry(rung, common, args, device, exact_forms, base,
                                            decided_forms(report["runs"])))
        write_report(base, report)  # after every rung: a run stopped at a time limit keeps what it measured
    sweep(report, args, common, device, exact_forms, base)

    write_report(base, report)
    print(markdown_table(report))
    line = compare_line(report) if args.preset == "cpu" else None
    if line:
        print(line)
    print(f"Results: {base}.json, {base}.md, {base}.log")


def measure_entry(rung, common, args, device, exact_forms, base, decided=None):
    """One rung measured in its own process: the report's entry (its trials kept, with their mean, std, min
    and max), or the entry with the ``error`` that skipped or ended it."""
    options = ladder_options(rung, exact_forms, decided)
    environment = rung_environment(options)
    logging.info("=== %s: %s%s %s", rung.name, "".join(f"{k}={v} " for k, v in environment.items()), rung.script,
                 " ".join(options))
    entry = {"name": rung.name, "step": rung.step, "table": rung.table, "script": rung.script, "options": options,
             "environment": environment}
    skip = skip_reason(rung, exact_forms)
    if skip:  # one clear line, and the next rung: not a crash of the whole ladder
        logging.warning("rung %r skipped: %s", rung.name, skip)
        return {**entry, "error": f"skipped: {skip}"}
    slow = slow_convolutions(options, device)
    if slow:
        entry["slow"] = f"{slow}: one trial of at most 5 batches"
        logging.warning("rung %r: %s", rung.name, entry["slow"])
    nbatches = max(args.nbatches, args.host_nbatches) if rung.nbatches else args.nbatches
    sizes = trial_sizes(args, nbatches, slow)
    summary = measure_in_process(Rung(rung.name, options, rung.script), common, args, sizes, base + ".log")
    if "error" in summary:  # one broken rung must not lose the others' numbers
        logging.error("rung %r failed: %s", rung.name, summary["error"])
        return {**entry, "error": summary["error"]}
    run = {**entry, "nbatches": sizes[0], "ntrials": sizes[1], "nwarmup": summary["nwarmup"],
           "precision": summary["precision"], "full": summary["full"], "synthetic": summary["synthetic"],
           "io": summary["io"], "mfu": summary["mfu"], "peak_mem_gb": summary["peak_mem_gb"],
           "exact_forms": summary.get("exact_forms"),
           "trials": {kind: noise.summary(summary.get("trials", {}).get(kind, [])) for kind in KINDS}}
    logging.info("%s", json.dumps(run))
    return run


def sweep(report, args, common, device, exact_forms, base):
    """The local-batch sweep at the best rung measured, into ``report["batch_sweep"]``; on a CPU, or
    without a measured ladder rung, the reason it was not run, in ``batch_sweep_skipped``."""
    if not args.batch_sweep or args.group in ("loaders", "alone"):
        return
    if device.type != "cuda":
        report["batch_sweep_skipped"] = ("not measured with --preset cpu: it measures the throughput and peak "
                                         "memory of a GPU at local batches " + ", ".join(map(str, args.batch_sweep)))
        logging.info("%s: %s", TABLES["batch"], report["batch_sweep_skipped"])
        return
    best = best_rung(report["runs"])
    if best is None:
        report["batch_sweep_skipped"] = "not measured: no rung of the ladder was measured"
        return
    report["batch_sweep"] = []
    for rung in sweep_rungs(best, args.batch_sweep):
        entry = measure_entry(rung, common, args, device, exact_forms, base, decided_forms(report["runs"]))
        report["batch_sweep"].append({**entry, "best_rung": best.name})
        write_report(base, report)


if __name__ == "__main__":
    main()
