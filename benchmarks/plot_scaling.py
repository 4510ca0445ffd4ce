"""Scaling plots from the benchmark JSON files of runs on 1, 2, 4, ... GPUs.

    BENCHY_OUTPUT=scaling/ddp_4 sbatch -n 4 ./submit_pm.sh --config=bs64_opt --enable_benchy --num_epochs 15
    BENCHY_OUTPUT=scaling/noddp_4 sbatch -n 4 ./submit_pm.sh --config=bs64_opt --enable_benchy --num_epochs 15 --noddp
    python -m benchmarks.plot_scaling --ddp scaling/ddp_*.json --noddp scaling/noddp_*.json --out scaling/scaling.png

Weak scaling keeps the local batch fixed, so N GPUs should do N times the work of one; strong
scaling keeps the global batch fixed and splits it, so N GPUs should do the same work N times
faster. Either way the ideal throughput is N times one GPU's, and the plot is the same. Two panels:
throughput (samples/s of the whole job) against the number of GPUs, with the ideal line N times the
one-GPU throughput of each series; and the communication overhead, 1 - DDP / noddp throughput at
each size: the share of the step that gradient communication does not hide. `--noddp` runs skip
the all-reduce, so they measure compute (and loading) alone. Each file's ``nranks`` says its size.
"""
import argparse
import json
import os
import statistics

from benchmarks.common import relative, user_file
from utils import noise
from utils.errors import UserError, exit_on_user_error


def read_series(paths, kind):
    """``{nranks: mean throughput}`` of trial ``kind`` (FULL, SYNTHETIC, IO) over the given files."""
    series = {}
    for n, trials in read_trials(paths, kind).items():
        series[n] = statistics.mean(statistics.mean(file_trials) for file_trials in trials)
    return series


def read_trials(paths, kind):
    """``{nranks: [each file's trial throughputs]}`` of trial ``kind`` over the given files."""
    trials = {}
    for path in paths:
        result = read_result(path)
        if kind not in result or "nranks" not in result:
            raise UserError(f"{path} is not a benchmark result with {kind} trials (written by --enable_benchy).")
        trials.setdefault(int(result["nranks"]), []).append(result[kind]["trial_throughput"])
    return dict(sorted(trials.items()))


def read_result(path):
    """One --enable_benchy JSON file; a missing or unreadable one is refused with one paragraph."""
    if not os.path.isfile(path):
        raise UserError(f"{path} does not exist. Pass the JSON files that --enable_benchy runs wrote (the "
                        "sbatch loop of docs/04-distributed.md writes scaling/ddp_<N>.json and scaling/noddp_<N>.json; a "
                        "shell pattern that matches no file is passed on as it is, hence this name).")
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{path} is not a JSON file written by --enable_benchy.") from None


def rank_unit(paths):
    """What a rank is, for the labels: "GPUs", or "CPU ranks" when every run was on CPUs."""
    devices = {read_result(path).get("device", "cuda") for path in paths}
    return "CPU ranks" if devices == {"cpu"} else "GPUs"


def read_folder(folder, kind="FULL"):
    """``(index, ddp, noddp)`` of a folder written by ``python -m benchmarks.scaling``: its
    scaling.json and the two series of the points that finished."""
    with open(os.path.join(folder, "scaling.json")) as f:
        index = json.load(f)
    done = [point for point in index["points"] if "file" in point]
    ddp, noddp = (read_series([os.path.join(folder, p["file"]) for p in done if p["mode"] == mode], kind)
                  for mode in ("ddp", "noddp"))
    return index, ddp, noddp


def folder_trials(folder, kind="FULL"):
    """``{"ddp": {nranks: trials}, "noddp": ...}`` of a folder written by ``python -m benchmarks.scaling``."""
    with open(os.path.join(folder, "scaling.json")) as f:
        done = [point for point in json.load(f)["points"] if "file" in point]
    return {mode: read_trials([os.path.join(folder, p["file"]) for p in done if p["mode"] == mode], kind)
            for mode in ("ddp", "noddp")}


def batch_description(index):
    """How a scaling.json's runs split the batch: weak scaling keeps the local batch, strong the global one."""
    if index.get("global_batch"):
        return f"strong scaling: global batch {index['global_batch']}, split over the ranks"
    return f"weak scaling: local batch {index['local_batch']} per rank"


def efficiency(series):
    """Scaling efficiency: throughput on N over N times the smallest run's throughput per rank."""
    smallest = min(series)
    per_rank = series[smallest] / smallest
    return {n: value / (n * per_rank) for n, value in series.items()}


def markdown_table(ddp, noddp, unit="GPUs", trials=None):
    """Throughput, scaling efficiency and communication overhead at each size, as a markdown table.
    With ``trials`` (``{"ddp": read_trials(...), "noddp": ...}``) an overhead that the trials' spread
    does not separate from zero is said to be noise, not printed as a number (utils/noise.py), and a
    line under the table says when the trials are too spread to trust at all."""
    efficient = efficiency(ddp) if len(ddp) > 1 else {}  # one size is its own baseline: nothing to say
    measured = overheads(ddp, noddp, trials)
    lines = [f"| {unit} | DDP samples/s | efficiency | noddp samples/s | overhead (1 - DDP/noddp) |",
             "|---|---|---|---|---|"]
    for n in sorted(set(ddp) | set(noddp)):
        cells = [f"{ddp[n]:.1f}" if n in ddp else "-", f"{efficient[n]:.1%}" if n in efficient else "-",
                 f"{noddp[n]:.1f}" if n in noddp else "-", overhead_cell(*measured[n]) if n in measured else "-"]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    busy = noise.busy_line(every_trial(trials))
    return "\n".join(lines + ([f"\nNot a finding: {busy}."] if busy else []))


def every_trial(trials):
    """``{"ddp at 2": trials, ...}``: each point's trials, all its files' together."""
    return {f"{mode} at {n}": sum(runs, []) for mode, series in (trials or {}).items() for n, runs in series.items()}


def overheads(ddp, noddp, trials=None):
    """``{n: (1 - DDP/noddp, spread)}`` at each size measured both ways; ``spread`` is None where the
    trials (when given) separate the two, else the wider spread of the two: the overhead is within
    noise (DDP cannot be faster than no communication). The table and the plot both show this."""
    measured = {}
    for n in sorted(set(ddp) & set(noddp)):
        within = None
        if trials:
            ddp_trials, noddp_trials = sum(trials["ddp"][n], []), sum(trials["noddp"][n], [])
            if not noise.separated(ddp_trials, noddp_trials) or ddp[n] > noddp[n]:
                within = max(map(noise.spread, (ddp_trials, noddp_trials)))
        measured[n] = (1 - ddp[n] / noddp[n], within)
    return measured


def overhead_cell(overhead, within):
    """1 - DDP/noddp, or why the trials cannot tell it from zero."""
    return f"{overhead:.1%}" if within is None else f"within noise (trials vary {100 * within:.0f}%)"


def plot(ddp, noddp, kind, path, unit="GPUs", title="weak scaling", trials=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullLocator

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    for label, series, marker in (("DDP", ddp, "o"), ("noddp (no communication)", noddp, "s")):
        if not series:
            continue
        ranks = list(series)
        left.plot(ranks, [series[n] for n in ranks], marker + "-", label=label)
        per_rank = series[ranks[0]] / ranks[0]
        left.plot(ranks, [n * per_rank for n in ranks], ":", color="gray")
    left.plot([], [], ":", color="gray", label="ideal (N x smallest run per rank)")
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    sizes = sorted(set(ddp) | set(noddp))
    left.set_xticks(sizes, [str(n) for n in sizes])
    left.xaxis.set_minor_locator(NullLocator())
    plain = FuncFormatter(lambda value, _: f"{value:g}")  # 90, not 9 x 10^1
    left.yaxis.set_major_formatter(plain)
    left.yaxis.set_minor_formatter(plain)
    left.tick_params(axis="y", which="minor", labelsize=7)
    left.set_xlabel(unit)
    left.set_ylabel(f"{kind} samples/s")
    left.set_title(title, fontsize=9)
    left.legend(fontsize=8)
    measured = overheads(ddp, noddp, trials)
    if measured:
        # An overhead the trials cannot tell from zero is drawn as zero and labelled as the table says it.
        sizes = list(measured)
        bars = right.bar([str(n) for n in sizes], [0 if measured[n][1] is not None else 100 * measured[n][0]
                                                   for n in sizes])
        right.bar_label(bars, labels=[overhead_cell(*measured[n]).replace(" (", "\n(") for n in sizes], fontsize=8)
        right.axhline(0, color="black", linewidth=0.8)
    right.set_xlabel(unit)
    right.set_ylabel("communication overhead (%)")
    right.set_title("1 - DDP / noddp throughput", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@exit_on_user_error
def main(argv=None):
    parser = argparse.ArgumentParser(description="Weak-scaling plots from --enable_benchy JSON files.")
    parser.add_argument("--ddp", nargs="+", required=True, help="results of runs with gradient communication")
    parser.add_argument("--noddp", nargs="*", default=[], help="results of the same runs with --noddp")
    parser.add_argument("--kind", default="FULL", choices=("FULL", "SYNTHETIC", "IO"))
    parser.add_argument("--unit", default=None,
                        help='what a rank is, for the axis labels (default: "GPUs", or "CPU ranks" for CPU runs)')
    parser.add_argument("--title", default="weak scaling")
    parser.add_argument("--out", default=None, help="the plot (png), where given (default: "
                        "runs/benchmarks/scaling.png, not tracked by git)")
    args = parser.parse_args(argv)

    ddp, noddp = read_series(args.ddp, args.kind), read_series(args.noddp, args.kind)
    trials = {"ddp": read_trials(args.ddp, args.kind), "noddp": read_trials(args.noddp, args.kind)}
    args.unit = args.unit or rank_unit(args.ddp + args.noddp)
    print(markdown_table(ddp, noddp, args.unit, trials))
    path = args.out or user_file("scaling.png")  # a path the user names is honoured as given
    plot(ddp, noddp, args.kind, path, args.unit, args.title, trials)
    print(f"Plot: {relative(path)}")


if __name__ == "__main__":
    main()
