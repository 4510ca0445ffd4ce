"""The CUDA-graph lesson measured where it can show: eager steps against train_graph.py's replayed graph.

    python -m benchmarks.graph_lesson                         # on a GPU: both settings below
    python -m benchmarks.graph_lesson --batches 1 2 --steps 50  # fewer, shorter

A CUDA graph replaces the hundreds of kernel launches of a step with one. That pays where the host's
launches, not the GPU's kernels, set the pace: a small model on small batches. Two settings:

- launch-bound: the demo's width (``--config=demo``: 16 base channels, not full scale) at crop 32,
  local batch 1, 2, 4 and 8;
- production: ``--config=base`` (64 base channels, full scale) at crop 64, local batch 64, where the
  kernels are long and one launch saved per kernel is a small share of the step.

Each point times the host's wall clock over ``--steps`` steps, ``--trials`` times, with the device
synchronised only at a trial's start and end and no profiler attached (its callbacks cost the host
time per launch, the very thing measured): eager with train.py's step, then train_graph.py's, which
warms up ``graph_warmup_steps`` steps and captures before any trial. Both train on one batch of
random inputs already on the GPU, in bf16 with fused Adam (the ladder's graph rungs), so that no
loader shares the host. The table gives milliseconds per step (the median of the trials), the
spread of each side's trials, and eager over graph; utils/noise.py's line says when the trials are
too spread to compare.

Results: ``runs/benchmarks/graph_lesson/<device>-<date>.json`` and ``.md`` (``--out_dir`` elsewhere;
refused if they exist, unless ``--overwrite``). A CUDA graph needs a GPU: on a CPU the tool refuses
before anything is measured or written.
"""
import argparse
import datetime
import os
import shlex
import statistics
import sys
import time

import torch

import train
from benchmarks.common import (add_output_options, claim_files, device_name, device_slug, free_name,
                               results_folder, software, software_text, write_report)
from benchmarks.ladder import build_step
from utils import noise
from utils.YParams import load_params
from utils.distributed import World
from utils.errors import UserError, exit_on_user_error

# The layers plain (--exact_forms=off) on both sides: the forms change the kernels a step launches, the very
# thing compared, and neither side times them first.
PRECISION = ["--amp_mode=bf16", "--enable_fused", "--exact_forms=off"]
SETTINGS = {
    "launch-bound": {"options": ["--config=demo", "--crop_size=32"], "batches": (1, 2, 4, 8)},
    "production": {"options": ["--config=base", "--crop_size=64"], "batches": (64,)},
}
def points(args):
    """``[(setting, local batch, options), ...]`` in the order they are measured: the launch-bound
    setting's batches (``--batches`` when given), then the production setting unless ``--no_production``."""
    chosen = [("launch-bound", batch) for batch in (args.batches or SETTINGS["launch-bound"]["batches"])]
    if not args.no_production:
        chosen += [("production", batch) for batch in SETTINGS["production"]["batches"]]
    return [(name, batch, [*SETTINGS[name]["options"], *PRECISION, f"--global_batch_size={batch}",
                           "--device=cuda", "--checkpoint=false", *shlex.split(args.extra)]) for name, batch in chosen]


def time_steps(step_fn, inputs, targets, steps, trials, synchronize):
    """Milliseconds per step of ``trials`` trials of ``steps`` calls each, by the host's clock, with
    ``synchronize()`` only at each trial's start and end (what a step costs the host and device together,
    without a wait inside)."""
    per_step = []
    for _ in range(trials):
        synchronize()
        started = time.perf_counter()
        for _ in range(steps):
            step_fn(inputs, targets)
        synchronize()
        per_step.append(1e3 * (time.perf_counter() - started) / steps)
    return per_step


def measure_point(options, args, graph):
    """One side of a point: the step train.py (``graph`` False) or train_graph.py would train with
    ``options``, warmed up (and captured), then timed. The eager side runs on a CPU too (the tests)."""
    params = load_params(options)
    device = train.pick_device(params, World())
    step_fn = build_step(params, device, graph)
    crop, batch = params.crop_size, params.global_batch_size
    inputs = torch.randn(batch, params.N_in_channels, crop, crop, crop, device=device)
    targets = torch.randn(batch, params.N_out_channels, crop, crop, crop, device=device)
    warmup = params.graph_warmup_steps + 2 if graph else args.warmup  # the capture and a replay included
    for _ in range(warmup):
        step_fn(inputs, targets)
    synchronize = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    return time_steps(step_fn, inputs, targets, args.steps, args.trials, synchronize)


def row(setting, batch, eager, graph):
    """One point of the report: each side's trials and summary, and eager's median over graph's."""
    ratio = statistics.median(eager) / statistics.median(graph) if eager and graph else None
    return {"setting": setting, "local_batch": batch, "eager_ms": noise.summary(eager),
            "graph_ms": noise.summary(graph), "speedup": ratio}


def markdown_table(report):
    lines = [f"Measured by `{report['command']}` on {report['device']} ({software_text(report)}), {report['date']}: "
             f"{report['steps']} steps per trial, {report['trials']} trials, host wall clock, no profiler; bf16, fused "
             "Adam, one batch of random inputs on the GPU. Milliseconds per step (median of the trials; spread: "
             "(max - min) / mean).", "",
             "| setting | local batch | eager (ms/step) | spread | CUDA graph (ms/step) | spread | eager / graph |",
             "|---|---|---|---|---|---|---|"]
    for point in report["points"]:
        if "error" in point:
            lines.append(f"| {point['setting']} | {point['local_batch']} | failed: {point['error']} | | | | |")
            continue
        eager, graph = point["eager_ms"], point["graph_ms"]
        lines.append(f"| {point['setting']} | {point['local_batch']} | {eager['median']:.2f} "
                     f"| {noise.spread_text(eager['trials'])} | {graph['median']:.2f} "
                     f"| {noise.spread_text(graph['trials'])} | {point['speedup']:.2f} |")
    busy = judgement(report)
    return "\n".join(lines + ([f"\nNot a comparison: {busy}."] if busy else [])) + "\n"


def judgement(report):
    """utils/noise.py's line when a point's trials are too spread to compare eager and graph."""
    measurements = {}
    for point in report["points"]:
        if "error" not in point:
            for side in ("eager", "graph"):
                measurements[f"{point['setting']}, batch {point['local_batch']}: {side}"] = \
                    point[f"{side}_ms"]["trials"]
    return noise.busy_line(measurements)


@exit_on_user_error
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_options(parser, None, "graph_lesson")
    parser.add_argument("--overwrite", action="store_true", help="replace today's results of an earlier run")
    parser.add_argument("--batches", type=int, nargs="+", help="local batches of the launch-bound setting "
                        "(default: 1 2 4 8)")
    parser.add_argument("--no_production", action="store_true", help="leave out the production setting")
    parser.add_argument("--steps", type=int, default=100, help="steps per trial")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=20, help="eager steps before the eager trials")
    parser.add_argument("--extra", default="", help="more train.py options for every point, e.g. "
                        "'--channels_last'")
    args = parser.parse_args(argv)
    if min(args.batches or [1]) < 1 or args.steps < 1 or args.trials < 1:
        raise UserError("--batches, --steps and --trials must be at least 1.")
    if not torch.cuda.is_available():
        raise UserError("benchmarks.graph_lesson measures CUDA graphs, which need a CUDA GPU, and PyTorch sees none "
                        "here. Run it on a GPU machine; nothing was measured or written.")
    name = device_name(True)
    stamp = datetime.datetime.now(datetime.timezone.utc)
    base = free_name(os.path.join(results_folder(args, None, "graph_lesson"), f"{device_slug(name)}-{stamp:%Y-%m-%d}"),
                     args, lambda b: any(os.path.exists(b + suffix) for suffix in (".json", ".md")))
    claim_files([base + ".json", base + ".md"], args.overwrite, earlier="an earlier run on this device today")
    report = {"device": name, **software(), "date": stamp.isoformat(timespec="seconds"),
              "command": "python -m benchmarks.graph_lesson " + " ".join(sys.argv[1:] if argv is None else argv),
              "steps": args.steps, "trials": args.trials, "points": []}
    return measure_points(report, base, points(args), args)


def measure_points(report, base, chosen, args, measure=measure_point):
    """Each point of ``chosen``, eager then graph, into ``report``, written to ``base``.json and .md after every
    point: a run stopped at a time limit keeps what it measured."""
    for setting, batch, options in chosen:
        print(f"=== {setting}, local batch {batch}", flush=True)
        try:
            point = row(setting, batch, measure(options, args, False), measure(options, args, True))
        except torch.cuda.OutOfMemoryError as error:  # one point too large must not lose the others
            point = {"setting": setting, "local_batch": batch, "error": f"out of memory ({str(error)[:80]})"}
        torch.cuda.empty_cache()
        print(point, flush=True)
        report["points"].append(point)
        write_report(base, report, markdown_table(report))
    return report


if __name__ == "__main__":
    main()
