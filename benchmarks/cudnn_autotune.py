"""What cuDNN's autotuner (``torch.backends.cudnn.benchmark``) costs in the first steps, and when it runs again.

    python -m benchmarks.cudnn_autotune                  # the full-scale U-Net, batch 64, 64^3 crops
    python -m benchmarks.cudnn_autotune --amp_mode=bf16 --local_batch_size=32

train.py turns ``cudnn.benchmark`` on (off with --deterministic): at the first call of each
convolution with a new input shape, layout and dtype, cuDNN times every algorithm it has for it
(forward, and the backward's data and weight gradients) and keeps the fastest; later calls with that
key use it. This script trains a few steps of the U-Net, timing each step on its own (a host
synchronisation after every step, which train.py does not make), in five phases:

    off                 benchmark off: cuDNN's heuristics pick the algorithms
    on                  benchmark on, the same shape: step 1 searches, the steps after it do not
    partial batch       a new batch size (a last partial batch, as --drop_last=false would make): a search
    on again            back to the first shape: its algorithms are cached, no search
    channels_last       a new memory layout: a search again

PyTorch caches the algorithm of each shape, layout and dtype the first time it runs, whichever
chose it, and does not search again when benchmark mode is switched on later: ``off`` therefore runs
in a process of its own, and the four others in a second one, in the order above. Each process
first trains one step at a small shape of its own, which pays CUDA's and cuDNN's lazy initialisation,
so that a phase's first step holds the search alone. It prints, per phase, the first step's time,
the median of the others, the first step's excess over them (the search) and the peak memory of the
first step and of the others (the search's workspace shows in the first). On a machine without
CUDA it prints one line and exits 0: cuDNN is a GPU library, there is nothing to measure. A few
steps per phase keep it within about a minute and a half on an H100 at batch 64 and 64^3 crops.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

from benchmarks.common import ROOT
from utils.errors import UserError, exit_on_user_error

PHASES = (  # (label, cudnn.benchmark, batch: "full" or "partial", channels_last)
    ("off", False, "full", False),
    ("on", True, "full", False),
    ("partial batch", True, "partial", False),
    ("on again", True, "full", False),
    ("channels_last", True, "full", True),
)

# The phases each process runs, in order: cuDNN's choice for a shape is cached by the first phase that
# runs it, so the heuristics' phase cannot share a process with the autotuner's.
PROCESSES = (("heuristics", ("off",)), ("autotuner", ("on", "partial batch", "on again", "channels_last")))
RESULT_PREFIX = "cudnn_autotune results: "


def partial_batch(batch):
    """A batch size the full one never is, as the last batch of an epoch whose samples do not divide
    by the batch: half of it, rounded up."""
    return (batch + 1) // 2


def plan(batch, crop, steps, labels=None):
    """Each phase's (label, benchmark, input shape, channels_last, steps): those named in ``labels``
    (default all), in the order of PHASES."""
    return [(label, benchmark, (batch if size == "full" else partial_batch(batch), 4, crop, crop, crop),
             channels_last, steps) for label, benchmark, size, channels_last in PHASES
            if labels is None or label in labels]


def warm_up(step, crop, device):
    """One step at a shape no phase uses (batch 1), benchmark off: it pays CUDA's and
    cuDNN's lazy initialisation and caches nothing a phase will look up."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        time_steps(step, (1, 4, crop, crop, crop), False, 1, device)
    finally:
        torch.backends.cudnn.benchmark = before


def time_steps(step, shape, channels_last, steps, device):
    """Seconds and peak memory (MiB, CUDA only; None elsewhere) of each of ``steps`` steps at ``shape``."""
    layout = torch.channels_last_3d if channels_last else torch.contiguous_format
    inputs = torch.randn(shape, device=device).to(memory_format=layout)
    targets = torch.randn((shape[0], 5, *shape[2:]), device=device).to(memory_format=layout)
    cuda = device.type == "cuda"
    times, peaks = [], []
    for _ in range(steps):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        step(inputs, targets)
        if cuda:
            torch.cuda.synchronize()  # the step's kernels are done: its time is the GPU's
        times.append(time.perf_counter() - start)
        peaks.append(torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None)
    return times, peaks


def run(phases, step, model, device):
    """Run the phases in order (each sets cudnn.benchmark and the layout); one result a phase."""
    results, before = [], torch.backends.cudnn.benchmark
    try:
        for label, benchmark, shape, channels_last, steps in phases:
            torch.backends.cudnn.benchmark = benchmark
            model.to(memory_format=torch.channels_last_3d if channels_last else torch.contiguous_format)
            times, peaks = time_steps(step, shape, channels_last, steps, device)
            results.append(summary(label, benchmark, shape, channels_last, times, peaks))
    finally:
        torch.backends.cudnn.benchmark = before
    return results


def summary(label, benchmark, shape, channels_last, times, peaks):
    rest = statistics.median(times[1:]) if len(times) > 1 else float("nan")
    return {"phase": label, "benchmark": benchmark, "shape": list(shape), "channels_last": channels_last,
            "first_s": times[0], "rest_s": rest, "excess_s": times[0] - rest,
            "first_peak_MiB": peaks[0], "rest_peak_MiB": max(peaks[1:]) if len(peaks) > 1 and peaks[1] else None}


def markdown(results):
    lines = ["| phase | cudnn.benchmark | input | first step s | later steps s (median) | first's excess s | "
             "peak MiB, first / later |", "|---|---|---|---|---|---|---|"]
    for r in results:
        layout = "channels_last" if r["channels_last"] else "contiguous"
        peak = ("-" if r["first_peak_MiB"] is None else
                f"{r['first_peak_MiB']:.0f} / {r['rest_peak_MiB']:.0f}" if r["rest_peak_MiB"] else
                f"{r['first_peak_MiB']:.0f} / -")
        lines.append(f"| {r['phase']} | {'on' if r['benchmark'] else 'off'} | {'x'.join(map(str, r['shape']))} "
                     f"{layout} | {r['first_s']:.3f} | {r['rest_s']:.3f} | {r['excess_s']:+.3f} | {peak} |")
    return "\n".join(lines)


def build_step(argv, device):
    """The U-Net and train.py's own step for the config and overrides in ``argv``."""
    import train
    from utils.YParams import load_params
    from utils.losses import build_loss
    from utils.optim import Precision, build_optimizer

    params = load_params(argv)
    model = train.build_model(params, device)
    optimizer = build_optimizer(params, model)
    step = train.default_step(model, optimizer, build_loss(params), Precision(params.amp_mode, device), params)
    return params, model, step


def run_process(name, options):
    """One of PROCESSES in a fresh Python process: its phases' results."""
    command = [sys.executable, "-m", "benchmarks.cudnn_autotune", f"--process={name}", *options]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    lines = [line for line in result.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if result.returncode != 0 or len(lines) != 1:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"cudnn_autotune: the {name} process failed (exit status {result.returncode}); its "
                         "output is above.")
    return json.loads(lines[0][len(RESULT_PREFIX):])


@exit_on_user_error
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    parser.add_argument("--steps", type=int, default=4, help="steps a phase (the first, and the rest)")
    parser.add_argument("--process", choices=[name for name, _ in PROCESSES], help=argparse.SUPPRESS)
    parser.add_argument("-h", "--help", action="store_true")
    args, overrides = parser.parse_known_args(argv)
    if args.help:
        print(__doc__)
        print("Options: --steps N (default 4); any train.py option, e.g. --config=short --amp_mode=bf16 "
              "--local_batch_size=64 --crop_size=64 (these three are the defaults).")
        return None
    if not torch.cuda.is_available():
        print("cudnn_autotune: no CUDA GPU here; cudnn.benchmark chooses among cuDNN's GPU convolution "
              "algorithms, so on a CPU there is nothing to measure.")
        return None
    device = torch.device("cuda")
    if args.steps < 2:
        raise UserError(f"--steps={args.steps}: each phase needs at least 2 steps, the first and one to compare it with.")
    from utils.YParams import load_params

    options = ["--config=short", "--amp_mode=bf16", "--local_batch_size=64", "--crop_size=64", "--device=cuda",
               *overrides]
    params = load_params(options)
    if params.local_batch_size < 2:
        raise UserError("--local_batch_size=1 has no smaller last batch to show the search again with: use 2 or more.")
    if args.process:  # one of the two processes: its phases, after a warm-up step
        params, model, step = build_step(options, device)
        warm_up(step, params.crop_size, device)
        results = run(plan(params.local_batch_size, params.crop_size, args.steps, dict(PROCESSES)[args.process]),
                      step, model, device)
        print(RESULT_PREFIX + json.dumps(results), flush=True)
        return results
    start = time.perf_counter()
    results = [result for name, _ in PROCESSES for result in run_process(name, [f"--steps={args.steps}", *overrides])]
    print(f"cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name(device)}, config {params.config}, "
          f"amp_mode {params.amp_mode}; {args.steps} steps a phase, {len(PROCESSES)} processes, "
          f"{time.perf_counter() - start:.1f} s in all")
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
