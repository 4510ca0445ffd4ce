"""Nsight Compute on the U-Net's first and last layers, each plain and in its exact form.

    python -m benchmarks.ncu_layers --enable_fused --channels_last   # on a GPU with ncu: the report, its CSV, a log
    python -m benchmarks.ncu_layers --preset cpu --dry_run           # prints the ncu command; runs the layers alone

The first (4 -> 64 channels) and last (128 -> 5) convolutions use the tensor cores worst: few channels, large
volumes (``python -m benchmarks.layers`` times them). This tool runs each of them, plain and in its exact form
(utils/exact_forms.py), forward and backward at the run's shapes, as ``benchmarks.layers`` builds them. Each
runs twice untimed first (cuDNN's autotuning happens there), then once inside a profiler window
(``cudaProfilerStart``/``Stop``) and an NVTX range named after it (``ncu_layers: last sub-pixel``, which the
report shows beside each kernel). ncu records the kernels inside the windows only:

    ncu --clock-control none --profile-from-start off --nvtx \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats ...

``--clock-control none`` keeps the GPU's own clocks, as in training. Results, in ``--out_dir`` (default
``runs/benchmarks/ncu_layers/``): ``ncu_layers.ncu-rep`` (open it in Nsight Compute), ``ncu_layers.csv``
(``ncu --import ... --page details --csv``: every kernel's section metrics, readable anywhere) and
``ncu_layers.log`` (the command, the layers' lines, ncu's output); refused where they exist, unless
``--overwrite``.

The tool says why it measures nothing and ends with status 0 where ncu cannot run: no CUDA GPU, no
``ncu`` found, or a GPU where ncu fails to start its profiler (an H200 in a gVisor sandbox ends with
``LibraryNotLoaded``; ``--force`` tries anyway); with ``--out_dir``, ``ncu_layers.log`` says why too.
``--dry_run`` runs on any machine: it prints the ncu command it would run, then runs the layers without
ncu (``--preset cpu`` on a CPU).
"""
import argparse
import contextlib
import glob
import os
import re
import shlex
import shutil
import sys
import time

import torch

import train
from benchmarks.common import add_output_options, claim_files, outcome, relative, results_folder, run, user_folder
from benchmarks.layers import PRESETS, layer_call, layer_flops, time_it
from utils.YParams import load_params
from utils.distributed import World
from utils.errors import exit_on_user_error
from utils.exact_forms import exact_form
from utils.optim import Precision

NAME = "ncu_layers"  # the NVTX ranges' prefix, and the results' file names
LAYERS = ("down 1", "last")
SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats")
LAUNCH_COUNT = 200  # a guard: the four calls launch a few dozen kernels
# Where ncu fails to start its profiler: a device name's text, and what happens there.
NO_PROFILER = {"H200": "ncu fails to start its profiler on the H200 machines measured so far (a gVisor sandbox: "
                       "LibraryNotLoaded); --force tries anyway"}


def find_ncu():
    """An ncu executable: on PATH, or in an Nsight Compute or CUDA installation; None where there is none."""
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda*/bin/ncu",
                    "/usr/local/cuda*/nsight-compute*/ncu"):
        candidates = sorted(glob.glob(pattern))
        if candidates:
            return candidates[-1]
    return None


def ncu_command(ncu, report, child):
    """ncu recording the kernels inside the child's profiler windows and NVTX ranges, into ``report``."""
    sections = [option for section in SECTIONS for option in ("--section", section)]
    return [ncu, "--clock-control", "none", "--profile-from-start", "off", "--nvtx", *sections,
            "--launch-count", str(LAUNCH_COUNT), "--force-overwrite", "--export", report, *child]


def why_not(ncu, force):
    """Why ncu cannot record here (None where it can)."""
    if not torch.cuda.is_available():
        return "no CUDA GPU: ncu records a GPU's kernels"
    if ncu is None:
        return "no ncu here (PATH, /opt/nvidia/nsight-compute, /usr/local/cuda)"
    name = torch.cuda.get_device_name(0)
    for model, why in NO_PROFILER.items():
        if re.search(rf"\b{model}\b", name) and not force:  # a whole word: "H200" is not the "GH200"
            return f"{name}: {why}"
    return None


@contextlib.contextmanager
def window(label, device):
    """A profiler window and an NVTX range ``ncu_layers: <label>`` around the block (CUDA only)."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.synchronize(device)  # nothing launched before the window lands in it
    torch.cuda.profiler.start()
    torch.cuda.nvtx.range_push(f"{NAME}: {label}")
    try:
        yield
        torch.cuda.synchronize(device)
    finally:
        torch.cuda.nvtx.range_pop()
        torch.cuda.profiler.stop()


def run_layers(options, preset, repeats=5):
    """Each chosen layer, plain and in its exact form: two untimed calls, one call in its window, then
    ``repeats`` timed calls; prints one line each."""
    params = load_params([*PRESETS[preset]["options"], *options])
    device = train.pick_device(params, World())  # cuDNN's autotuning and TF32 as the options say
    precision = Precision(params.amp_mode, device)
    memory_format = train.memory_format(params)
    rows = [row for row in layer_flops(params, params.global_batch_size) if row[0] in LAYERS]
    print(f"{NAME}: {', '.join(LAYERS)} at batch {params.global_batch_size}, crop {params.crop_size}, "
          f"{params.amp_mode}, {'channels_last' if params.channels_last else 'contiguous'}, on {device}", flush=True)
    for name, module, shape, flops in rows:
        form = exact_form(module)
        for each in (None, form):
            label = f"{name} {each.name if each else 'plain'}"
            call = layer_call(module, shape, name == "down 1", precision, device, memory_format, each)
            for _ in range(2):
                call()
            with window(label, device):
                call()
            seconds = time_it(call, device, repeats)
            print(f"{NAME}: {label}: {1e3 * seconds:.2f} ms forward + backward, {flops / seconds / 1e12:.2f} "
                  "TFLOP/s", flush=True)
            del call
            if device.type == "cuda":
                torch.cuda.empty_cache()


@exit_on_user_error
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpu")
    add_output_options(parser, None, NAME)
    parser.add_argument("--dry_run", action="store_true", help="print the ncu command, then run the layers without "
                        "ncu (any machine)")
    parser.add_argument("--force", action="store_true", help="run ncu where it is known to fail to start")
    parser.add_argument("--overwrite", action="store_true", help="replace the results an earlier run left in the "
                        "output folder (refused without it)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds for ncu's run")
    parser.add_argument("--export_timeout", type=int, default=120, help="seconds for exporting its report's "
                        "table as CSV, after the run")
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)  # the process ncu profiles
    args, options = parser.parse_known_args(argv)  # the rest: train.py options (--channels_last, --amp_mode=...)
    if args.run:
        return run_layers(options, args.preset)
    folder = results_folder(args, None, NAME) if args.out_dir else user_folder(NAME)
    base = os.path.join(folder, NAME)
    ncu = find_ncu()
    child = [sys.executable, "-m", "benchmarks.ncu_layers", "--run", "--preset", args.preset, *options]
    command = ncu_command(ncu or "ncu", base, child)
    if args.dry_run:
        print(f"{NAME}: would run: {shlex.join(relative(part) if os.sep in part else part for part in command)}",
              flush=True)
        return run_layers(options, args.preset, repeats=1)
    why = why_not(ncu, args.force)
    if why:
        print(f"{NAME}: not run: {why}")
        if not args.out_dir:
            return 0
    claim_files([base + suffix for suffix in (".ncu-rep", ".csv", ".log")], args.overwrite)
    os.makedirs(folder, exist_ok=True)
    log = base + ".log"
    with open(log, "w") as f:  # a folder named for the results (the GPU suite's) keeps why there are none
        f.write(f"{NAME}: not run: {why}\n" if why else f"$ {shlex.join(command)}\n")
    if why:
        return 0
    start = time.perf_counter()
    code = run(command, log, args.timeout, mode="a")
    print(f"{NAME}: ncu ended ({outcome(code)}) after {time.perf_counter() - start:.0f} s; its log: {relative(log)}")
    if not os.path.exists(base + ".ncu-rep"):
        print(f"{NAME}: ncu wrote no report; the end of its log:\n" + "".join(open(log).readlines()[-20:]))
        return 1
    export = [ncu, "--import", base + ".ncu-rep", "--page", "details", "--csv"]
    exported = run(export, base + ".csv", args.export_timeout)
    if exported != 0:  # the report stays: its table can be exported later, on any machine with ncu
        with open(base + ".csv") as output, open(log, "a") as f:
            f.write(f"$ {shlex.join(export)}\n{output.read()}")
        os.remove(base + ".csv")
        print(f"{NAME}: its table was not exported ({outcome(exported)}); export it later with: ncu --import "
              f"{relative(base)}.ncu-rep --page details --csv > {relative(base)}.csv")
        print(f"{NAME}: results: {relative(base)}.ncu-rep, {relative(log)}")
        return 1
    print(f"{NAME}: results: {relative(base)}.ncu-rep, {relative(base)}.csv, {relative(log)}")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
