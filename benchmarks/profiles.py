"""Sample profiles of the optimisation ladder's rungs, from real short runs of train.py.

    python -m benchmarks.profiles                          # on a GPU: five rungs -> sample_nsys_profiles/
    python -m benchmarks.profiles --preset cpu             # on a CPU: two rungs -> example_logs/cpu_profiles/
    python -m benchmarks.profiles --only graph --nsys      # one rung, and try Nsight Systems too

Each rung is one real command, `python train.py <options> --profiler=torch ...` (train_graph.py
for the CUDA-graph rung), that trains two short epochs and records the torch profiler over a few
steps of the second one. The trace is kept as gzipped Chrome/Perfetto JSON (open it in
https://ui.perfetto.dev, or in TensorBoard's profiler plugin after un-gzipping it into a run's
``logs/plugins/profile``). Beside the traces, ``profiles.json`` and the folder's README.md say
for each file which command made it, on which device and when, and summarise it: the mean time
per step of each annotated phase (step, data copy in, forward, backward, optimizer) and, on a
GPU, the kernels that took the most device time and how busy the device was.

With ``--nsys`` each rung is also run under Nsight Systems when an ``nsys`` can be found (on a GPU
`nsys profile -c cudaProfilerApi` around `--enable_manual_profiling`, the tutorial's own recipe; on
a CPU the whole run and its OS calls: see NSYS_OPTIONS); a ``.nsys-rep`` that it makes is kept, with
what ``nsys stats`` reads in it (benchmarks/nsight.py), and when none can be made, profiles.json says
why. Nothing is renamed or made up: every file here comes out of the run it is listed with.

Without ``--out_dir``, the profiles go to the preset's folder, or, when it holds files (the
committed ones), to a dated folder beside it (``example_logs/cpu_profiles-<device>-<date>``, then
``-2``, ...); ``--overwrite`` replaces the preset folder's profiles instead. A folder named with
``--out_dir`` that already holds files is refused before anything runs.
"""
import collections
import datetime
import glob
import gzip
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

import torch

from benchmarks import nsight
from benchmarks.common import (NOT_IN_TREE, ROOT, add_output_options, argument_parser, check_preset, claim_folder,
                               committed_json, dali_importable, device_name, device_slug, free_name, holds_files,
                               make_data, outcome, relative_args, results_folder, run)
from utils import noise
from utils.errors import UserError, exit_on_user_error
from utils.profiling import range_name

PHASES = ("step", "data copy in", "forward", "backward", "optimizer")

# (slug, what it shows, script, options): the tutorial's rungs whose profiles it discusses.
GPU_RUNGS = [
    ("baseline", "lowmem loader, 2 workers, fp32", "train.py",
     ["--data_loader_config=lowmem", "--num_data_workers=2"]),
    ("gpu_inmem", "the GPU-resident loader, fp32", "train.py", ["--data_loader_config=gpu-inmem"]),
    ("gpu_inmem_bf16", "+ AMP bf16", "train.py", ["--data_loader_config=gpu-inmem", "--amp_mode=bf16"]),
    ("gpu_inmem_bf16_fused_jit", "+ fused Adam + TorchScript loss", "train.py",
     ["--data_loader_config=gpu-inmem", "--amp_mode=bf16", "--enable_fused", "--enable_jit"]),
    ("gpu_inmem_bf16_graph", "+ the whole step in a CUDA graph", "train_graph.py",
     ["--data_loader_config=gpu-inmem", "--amp_mode=bf16", "--graph_warmup_steps=5"]),
]
# Where DALI imports (benchmarks/ladder.py's DALI rung: its reader on the host, crops and rotations on the GPU).
DALI_RUNG = ("dali_bf16_fused", "the DALI loader (GPU augmentation), bf16 + fused Adam", "train.py",
             ["--data_loader_config=dali-lowmem", "--num_data_workers=8", "--amp_mode=bf16", "--enable_fused"])
CPU_RUNGS = [
    ("baseline", "lowmem loader, 2 workers", "train.py", ["--data_loader_config=lowmem", "--num_data_workers=2"]),
    ("gpu_inmem", "the GPU-resident loader on CPU tensors", "train.py", ["--data_loader_config=gpu-inmem"]),
]
PRESETS = {
    # Steps profiled per rung. On a shared CPU one step slowed by other work moves the mean of 12 by a
    # twelfth of its excess and their median (what the tool compares) not at all; the spread printed
    # beside it says how far the steps disagree. A GPU's steps agree (its traces of 4 steps already
    # run to thousands of kernels each, and the folder is committed).
    # The layers stay plain (--exact_forms=off), as in the committed profiles: no process times them first.
    "gpu": {"options": ["--config=base", "--device=cuda", "--exact_forms=off"], "batch": 64, "box": 256, "steps": 4,
            "out_dir": os.path.join(ROOT, "sample_nsys_profiles")},
    "cpu": {"options": ["--config=demo", "--device=cpu"], "batch": 8, "box": 128, "steps": 12,
            "out_dir": os.path.join(ROOT, "example_logs", "cpu_profiles")},
}


def written_here(name):
    """Whether a file of the output folder is one that this tool writes: --overwrite removes those
    first, so that an earlier run's trace or report cannot pass for this run's."""
    slugs = {rung[0] for rung in GPU_RUNGS + [DALI_RUNG] + CPU_RUNGS}
    suffixes = (".log", "_nsys.log", ".pt.trace.json.gz", ".nsys-rep", ".qdstrm")
    return name in ("profiles.json", "README.md") or any(name == slug + suffix for slug in slugs for suffix in suffixes)


# ----------------------------------------------------------------------------- reading a trace

def summarise_trace(trace, steps, cuda=False):
    """Mean milliseconds per step of each phase; on a GPU also the busiest kernels.

    ``trace`` is the Chrome-trace dict the torch profiler writes. Phases are the ``annotate``
    ranges of train.py (CPU-side: when the host issued the work). Kernel times are device-side,
    and so is ``device_busy``: :func:`device_busy` of the kernels, measured on the GPU's own
    timeline (the host's ranges end long before the kernels they launch, by a whole step or more
    when the host runs ahead or replays a CUDA graph). A ``cuda`` trace without kernels gets an
    ``error``: a profile that shows no device work is a result to report, not one to pass.
    """
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    phases, step_ms, forward_ms = collections.defaultdict(float), [], []
    for event in events:
        if event.get("cat") != "user_annotation":
            continue
        base = range_name(event["name"])
        if base in PHASES:
            phases[base] += event["dur"] / 1e3
        if base == "step":
            step_ms.append(round(event["dur"] / 1e3, 3))
        if base == "forward":
            forward_ms.append(round(event["dur"] / 1e3, 3))
    summary = {"steps": steps, "phase_ms_per_step": {p: round(phases[p] / steps, 3) for p in PHASES if p in phases},
               "step_ms": step_ms, "forward_ms": forward_ms}

    kernels = [e for e in events if e.get("cat") == "kernel"]
    if kernels:
        per_name = collections.defaultdict(lambda: [0.0, 0])
        for event in kernels:
            per_name[event["name"]][0] += event["dur"]
            per_name[event["name"]][1] += 1
        total = sum(duration for duration, _ in per_name.values())
        top = sorted(per_name.items(), key=lambda item: -item[1][0])[:12]
        summary.update({
            "kernel_ms_per_step": round(total / 1e3 / steps, 3),
            "device_busy": round(device_busy(kernels), 3),
            "top_kernels": [{"name": name[:160], "share": round(duration / total, 4), "calls": calls,
                             "ms_per_step": round(duration / 1e3 / steps, 3)} for name, (duration, calls) in top],
        })
    elif cuda:
        summary["error"] = NO_KERNELS
    return summary


def device_busy(kernels):
    """The share of the GPU timeline from the first kernel's start to the last kernel's end in which
    at least one kernel runs: the union of the kernels' intervals (kernels of several streams that
    overlap count once) over that span. At most 1 by construction."""
    intervals = sorted((event["ts"], event["ts"] + event["dur"]) for event in kernels)
    busy, end = 0.0, intervals[0][0]
    for start, stop in intervals:
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    span = end - intervals[0][0]
    return busy / span if span > 0 else 1.0


NO_KERNELS = ("the profiler saw no CUDA kernels in the window (CUPTI cannot trace on this machine, or the "
              "steps ran elsewhere): no device times; see the trace")


# ----------------------------------------------------------------------------- running a rung

def rung_command(script, common, options, expdir, run_num, steps, extra=()):
    """The train.py command of one profiled rung: two epochs, the window inside the second."""
    return [script, *common, *options, f"--expdir={expdir}", f"--run_num={run_num}", "--num_epochs=2",
            "--profile_start_epoch=2", f"--profile_steps={steps}", "--val_metrics=false",
            "--preview_image=false", "--checkpoint=false", *extra]


# How each rung runs under Nsight Systems. On a GPU: the CUDA API, cuDNN and NVTX, recorded inside the
# window that train.py opens with cudaProfilerStart (--enable_manual_profiling), sampling and CPU context
# switches off (they make the report large and the run slow). On a CPU there is no such window, and no
# NVTX (a CPU build of PyTorch has none): the whole run, and its calls into the OS (the loader's reads,
# the waits for batches).
NSYS_OPTIONS = {True: ["--trace=cuda,cudnn,nvtx", "--sample=none", "--cpuctxsw=none", "-c", "cudaProfilerApi",
                       "--kill", "none"],
                False: ["--trace=osrt", "--sample=none", "--cpuctxsw=none"]}


def try_nsys(nsys, command, out_base, log_path, timeout, cuda=True):
    """Profile ``command`` under Nsight Systems; returns ``{file}`` or ``{error}``, honestly. All of it,
    the importer of a .qdstrm capture included, ends within ``timeout`` seconds. The command runs in
    nsight.profile_environment(): the report keeps the environment it ran in."""
    scope = nsight.own_processes()
    wrapped = [*scope, nsys, "profile", *NSYS_OPTIONS[cuda], "-f", "true", "-o", out_base, sys.executable, *command]
    deadline = time.monotonic() + timeout
    code = run(wrapped, log_path, timeout, env=nsight.profile_environment())
    seen = "its own processes" if scope else "every process of the machine (no PID namespace of its own here)"
    if os.path.exists(out_base + ".nsys-rep"):
        return {"file": os.path.basename(out_base + ".nsys-rep"), "processes": seen}
    qdstrm = out_base + ".qdstrm"
    if os.path.exists(qdstrm):
        importers = nsight.importers(nsys)
        for importer in importers:
            if deadline - time.monotonic() < 1:
                code = f"timed out after {timeout} s"
                break
            code = run([importer, "-i", qdstrm], log_path, max(1, int(deadline - time.monotonic())), mode="a")
            if os.path.exists(out_base + ".nsys-rep"):
                os.remove(qdstrm)
                return {"file": os.path.basename(out_base + ".nsys-rep"), "processes": seen,
                        "importer": os.path.basename(importer)}
        # Kept: the importer of the same version makes the report of it on another machine.
        return {"error": f"{nsys} wrote a .qdstrm capture but no .nsys-rep report "
                         f"({'no QdstrmImporter found' if not importers else 'QdstrmImporter failed'}); "
                         f"{outcome(code)}, see {os.path.basename(log_path)}; the capture is kept: "
                         f"python -m benchmarks.nsight import {os.path.basename(qdstrm)}",
                "capture": os.path.basename(qdstrm)}
    return {"error": f"{nsys} made no report ({outcome(code)}), see {os.path.basename(log_path)}"}


def read_report(nsys, entry, out_dir):
    """What ``nsys stats`` reads in the rung's report (its kernels, NVTX ranges, OS calls), into the entry."""
    try:
        entry["nsys"]["tables"] = nsight.summary(nsys, os.path.join(out_dir, entry["nsys"]["file"]))
    except (UserError, subprocess.TimeoutExpired) as error:
        entry["nsys"]["tables_error"] = str(error)


NSYS_PROBE = ("import torch; torch.cuda.profiler.start(); x = torch.ones(1 << 20, device='cuda'); "
              "torch.cuda.synchronize(); torch.cuda.profiler.stop()")


NO_NSYS = ("no nsys found (PATH, /opt/nvidia, /usr/local/cuda, or the Debian one that "
           "`python -m benchmarks.nsight install` unpacks)")
NSYS_PROBE_LIMIT = 45  # seconds for the probe, its importer included: a .qdstrm without a report must not cost more


def probe_nsys(work_dir, timeout):
    """``(nsys, None)`` when an nsys here can make a report of a ten-second CUDA program, else
    ``(None, why)``: on some machines nsys writes a .qdstrm capture and never a report, and trying
    it on every rung would spend half the stage making nothing."""
    nsys = nsight.find_nsys()
    if nsys is None:
        return None, NO_NSYS
    os.makedirs(work_dir, exist_ok=True)
    result = try_nsys(nsys, ["-c", NSYS_PROBE], os.path.join(work_dir, "nsys_probe"),
                      os.path.join(work_dir, "nsys_probe.log"), timeout)
    if "file" in result:
        return nsys, None
    return None, f"the probe of {nsys} made no report: {result['error']}"


def profile_rung(rung, preset, args, common, work_dir, device, nsys=None, nsys_error=None):
    slug, description, script, options = rung
    steps = args.steps
    batches = steps + 4  # per epoch: the window opens with the second epoch and ends 4 steps before it does
    sizes = [f"--Nsamples={preset['batch'] * batches}", f"--Nsamples_val={preset['batch']}"]
    command = rung_command(script, common + sizes, options, os.path.join(work_dir, "runs"), slug, steps,
                           extra=["--profiler=torch"])
    log_path = os.path.join(args.out_dir, f"{slug}.log")
    started = datetime.datetime.now(datetime.timezone.utc)
    code = run([sys.executable, *command], log_path, args.timeout)
    entry = {"rung": slug, "what": description, "command": "python " + shlex.join(relative_args(command)),
             "device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
             "date": started.isoformat(timespec="seconds"), "log": os.path.basename(log_path)}
    if code != 0:
        entry["error"] = f"the run failed ({outcome(code)}); see {entry['log']}"
        return entry
    # The run directory is <expdir>/<config>/1GPU|1CPU/<slug>; the scratch expdir starts empty.
    traces = glob.glob(os.path.join(work_dir, "runs", "*", "*", slug, "profile", "*.pt.trace.json"))
    if len(traces) != 1:
        entry["error"] = f"expected one torch profiler trace, found {len(traces)}; see {entry['log']}"
        return entry
    trace_path = traces[0]
    with open(trace_path) as f:
        trace = json.load(f)
    entry["file"] = f"{slug}.pt.trace.json.gz"
    with open(trace_path, "rb") as source, gzip.open(os.path.join(args.out_dir, entry["file"]), "wb") as target:
        shutil.copyfileobj(source, target)
    entry.update(summarise_trace(trace, steps, cuda="--device=cuda" in preset["options"]))

    if args.nsys:
        if nsys is None:
            entry["nsys"] = {"error": nsys_error}
        else:
            manual = rung_command(script, common + sizes, options, os.path.join(work_dir, "runs"), slug + "_nsys",
                                  steps, extra=["--enable_manual_profiling"])
            cuda = "--device=cuda" in preset["options"]
            entry["nsys"] = try_nsys(nsys, manual, os.path.join(args.out_dir, slug),
                                     os.path.join(args.out_dir, f"{slug}_nsys.log"), args.timeout, cuda)
            entry["nsys"]["command"] = (f"nsys profile {' '.join(NSYS_OPTIONS[cuda])} -f true -o {slug} python "
                                        + shlex.join(relative_args(manual)))
            if "file" in entry["nsys"]:
                read_report(nsys, entry, args.out_dir)
    return entry


def gpu_rungs(dali):
    """The GPU preset's rungs: the DALI rung last, where DALI imports; where it does not, a line says so."""
    if dali:
        return GPU_RUNGS + [DALI_RUNG]
    print(f"{DALI_RUNG[0]}: not profiled, DALI does not import here (its wheels: ../shared/gpu/pack-wheels.sh)",
          flush=True)
    return list(GPU_RUNGS)


# ----------------------------------------------------------------------------- the folder's README

README_HEAD = """# {title}

Made by `{command}` ({date}); every file below comes out of the run whose command is listed with it.
Regenerate the folder with that command and `--overwrite` (without it, a folder that holds files is
refused); `python -m figures.tutorial_images` draws a timeline of each trace into `tutorial_images/`.

How to open them:
- `*.pt.trace.json.gz`: torch profiler traces (Chrome trace JSON, gzipped). Drag one onto
  <https://ui.perfetto.dev> (it reads the .gz directly), or un-gzip it into a run's `logs/plugins/profile/<name>/`
  and open TensorBoard's profiler tab (the `torch-tb-profiler` plugin).
- `*.nsys-rep`: Nsight Systems reports, opened with `nsys-ui` or `nsys stats`.
- `*.log`: the output of each run.
"""


def ranking_notes(entries):
    """Under the table: for each rung whose steps the trials do not separate from the first rung's
    (utils/noise.py), a line saying that the table does not rank the two."""
    timed = [entry for entry in entries if len(entry.get("step_ms", ())) > 1]
    notes = [f"- `{entry['rung']}` against `{timed[0]['rung']}`: {note}; the table does not rank them."
             for entry in timed[1:]
             for note in [noise.unranked_note(timed[0]["rung"], timed[0]["step_ms"], entry["rung"], entry["step_ms"])]
             if note]
    return ["", "Not a ranking (the steps' times overlap):", "", *notes] if notes else []


def write_readme(out_dir, entries, title, command, date):
    lines = [README_HEAD.format(title=title, command=command, date=date), "| file | rung | device | date | "
             "mean ms per step: step / data copy in / forward / backward / optimizer | device busy |",
             "|---|---|---|---|---|---|"]
    for entry in entries:
        if "error" in entry:
            lines.append(f"| {'`' + entry['file'] + '`' if 'file' in entry else '(none)'} | {entry['rung']}: {entry['what']} | {entry['device']} | {entry['date']} | "
                         f"failed: {entry['error']} | |")
            continue
        phases = entry["phase_ms_per_step"]
        cells = " / ".join(f"{phases[p]:.1f}" if p in phases else "-" for p in PHASES)
        busy = f"{entry['device_busy']:.0%}" if entry.get("device_busy") is not None else "n/a (CPU)"
        lines.append(f"| `{entry['file']}` | {entry['rung']}: {entry['what']} | {entry['device']} | {entry['date']} "
                     f"| {cells} | {busy} |")
    lines += ranking_notes(entries)
    busy = judgement(entries)
    lines += [f"\nNot a ranking: {busy}."] if busy else []
    lines += ["", "The commands, one per trace:", ""]
    for entry in entries:
        lines.append(f"- `{entry['rung']}`: `{entry['command']}`")
        nsys = entry.get("nsys")
        if nsys:
            made = (f"`{nsys['file']}` (it lists {nsys['processes']}), made by `{nsys['command']}`"
                    if "file" in nsys else "no report: " + nsys["error"])
            lines.append(f"  - Nsight Systems: {made}")
    kernel_entries = [entry for entry in entries if entry.get("top_kernels")]
    for entry in kernel_entries:
        lines += ["", f"Kernels with the most device time in `{entry['file']}` "
                  f"({entry['kernel_ms_per_step']:.1f} ms of kernels per step):", "",
                  "| kernel | share | calls | ms per step |", "|---|---|---|---|"]
        for kernel in entry["top_kernels"]:
            lines.append(f"| `{kernel['name'][:100]}` | {kernel['share']:.1%} | {kernel['calls']} "
                         f"| {kernel['ms_per_step']:.2f} |")
    for entry in entries:
        report = entry.get("nsys", {})
        if "tables" in report:
            lines += ["", f"What `nsys stats` reads in `{report['file']}` (`python -m benchmarks.nsight summary "
                      f"{report['file']}`):", "", nsight.summary_text(report["tables"])]
        elif "tables_error" in report:
            lines += ["", f"`{report['file']}` could not be read back: {report['tables_error']}"]
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


@exit_on_user_error
def main(argv=None):
    parser = argument_parser(__doc__, PRESETS, scratch="profiles")
    add_output_options(parser, "example_logs/cpu_profiles; GPU: sample_nsys_profiles", "cpu_profiles-<device>-<date>")
    parser.add_argument("--steps", type=int, default=None, help="profiled steps per rung (default: the preset's, "
                        "12 on a CPU, 4 on a GPU)")
    parser.add_argument("--only", default="", help="profile only rungs whose slug contains this text")
    parser.add_argument("--nsys", action="store_true", help="also try Nsight Systems on each rung")
    args = parser.parse_args(argv)

    preset = PRESETS[args.preset]
    args.steps = args.steps or preset["steps"]
    dated = (f"{os.path.basename(preset['out_dir'])}-{device_slug(device_name(args.preset == 'gpu'))}-"
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}")
    if args.committed and (args.overwrite or not holds_files(preset["out_dir"])):
        args.out_dir = args.out_dir or preset["out_dir"]  # the committed profiles, remade
    beside = results_folder(args, os.path.relpath(os.path.dirname(preset["out_dir"]), ROOT), "")
    args.out_dir = args.out_dir or free_name(os.path.join(beside, dated), args, holds_files)
    check_preset(args.preset)
    claim_folder(args.out_dir, args.overwrite, written_here)  # before anything is made, removed or run
    rungs = [rung for rung in gpu_rungs(dali_importable()) if args.only in rung[0]] if args.preset == "gpu" else \
        [rung for rung in CPU_RUNGS if args.only in rung[0]]
    name = device_name(args.preset == "gpu")
    train_path, val_path = make_data(args.data_dir, preset["box"])
    common = [*preset["options"], f"--train_path={train_path}", f"--val_path={val_path}"]
    os.makedirs(args.out_dir, exist_ok=True)
    shutil.rmtree(os.path.join(args.work_dir, "runs"), ignore_errors=True)

    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    command = "python -m benchmarks.profiles " + shlex.join(sys.argv[1:] if argv is None else argv)
    nsys, nsys_error = None, None
    if args.nsys and args.preset == "gpu":
        nsys, nsys_error = probe_nsys(args.work_dir, min(args.timeout, NSYS_PROBE_LIMIT))
    elif args.nsys:  # the probe is a CUDA program; on a CPU each rung's run is the test
        nsys = nsight.find_nsys()
        nsys_error = None if nsys else NO_NSYS
    if args.nsys:
        print(f"nsys: {nsys}" if nsys else f"nsys: not used ({nsys_error})", flush=True)
    entries = []
    for rung in rungs:
        print(f"=== {rung[0]}: {rung[1]}", flush=True)
        entry = profile_rung(rung, preset, args, common, args.work_dir, name, nsys, nsys_error)
        print(json.dumps({k: v for k, v in entry.items() if k != "top_kernels"}), flush=True)
        if entry.get("forward_ms"):
            print(f"{entry['rung']}: {forward_text(entry)}", flush=True)
        entries.append(entry)
        # After every rung, so that a run stopped at a time limit keeps the index of what it made.
        with open(os.path.join(args.out_dir, "profiles.json"), "w") as f:
            json.dump({"command": command, "date": date, "profiles": entries}, f, indent=2)
        title = "Sample profiles (GPU)" if args.preset == "gpu" else "Sample profiles of the CPU demo model"
        write_readme(args.out_dir, entries, title, command, date)
    busy = judgement(entries)
    if busy:
        print(f"Not a ranking: {busy}.")
    if args.preset == "cpu":
        print(compare_line(entries, busy))
    print(f"Profiles, profiles.json and README.md in {args.out_dir}")
    return entries


def forward_text(entry):
    """"forward pass per step: median 50.3 ms, the middle half of its 12 steps within 6% (mean 52.1 ms)"."""
    forward = entry["forward_ms"]
    return (f"forward pass per step: median {statistics.median(forward):.1f} ms, the middle half of its "
            f"{len(forward)} steps within {100 * noise.middle_spread(forward):.0f}% (mean {statistics.fmean(forward):.1f} ms)")


def judgement(entries):
    """utils/noise.py's line when the profiled steps (their times, and their forward passes') are too
    spread to rank the rungs, else None."""
    measurements = {}
    for entry in entries:
        measurements[f"{entry['rung']}: step"] = entry.get("step_ms", [])
        measurements[f"{entry['rung']}: forward"] = entry.get("forward_ms", [])
    return noise.busy_line(measurements, steps=True)  # a loader worker's late batch stalls a step in several


# The committed CPU profiles whose forward passes the README's CPU track quotes (step 3).
REFERENCE = os.path.join("example_logs", "cpu_profiles", "profiles.json")


def compare_line(entries, busy):
    """The README's number (the forward pass per step of each CPU rung) here, as medians, beside the
    committed profiles' means."""
    committed = (committed_json(REFERENCE) or {}).get("profiles")
    if not committed:
        return f"The number to compare (README): the committed profiles ({REFERENCE}) are {NOT_IN_TREE}."
    reference = {entry["rung"]: entry["phase_ms_per_step"]["forward"] for entry in committed}
    here = {entry["rung"]: statistics.median(entry["forward_ms"]) for entry in entries if entry.get("forward_ms")}
    rungs = [rung for rung in reference if rung in here]
    if not rungs:
        return "The number to compare (README): the forward pass per step needs the baseline or gpu_inmem rung."
    return noise.compare_line("forward pass per step", ", ".join(f"{here[rung]:.1f} ms ({rung})" for rung in rungs)
                              + " (medians of the steps)", ", ".join(f"{reference[rung]:.1f} ms" for rung in rungs)
                              + f" (means of {committed[0]['steps']} steps)", REFERENCE, busy)


if __name__ == "__main__":
    # A rung that failed, or whose trace holds no kernels, is reported in the folder and in the status.
    raise SystemExit(1 if any("error" in entry for entry in main()) else 0)
