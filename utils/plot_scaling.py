"""Weak-scaling plots from the benchmark JSON files of runs on 1, 2, 4, ... GPUs.

    BENCHY_OUTPUT=scaling/ddp_4 sbatch -n 4 ./submit_pm.sh --config=bs64_opt --enable_benchy --num_epochs 15
    BENCHY_OUTPUT=scaling/noddp_4 sbatch -n 4 ./submit_pm.sh --config=bs64_opt --enable_benchy --num_epochs 15 --noddp
    python -m utils.plot_scaling --ddp scaling/ddp_*.json --noddp scaling/noddp_*.json --out scaling.png

Weak scaling keeps the local batch fixed, so N GPUs should do N times the work of one. Two panels:
throughput (samples/s of the whole job) against the number of GPUs, with the ideal line N times the
one-GPU throughput of each series; and the communication overhead, 1 - DDP / noddp throughput at
each size: the share of the step that gradient communication does not hide. `--noddp` runs skip
the all-reduce, so they measure compute (and loading) alone. Each file's ``nranks`` says its size.
"""
import argparse
import json
import statistics
import sys


def read_series(paths, kind):
    """``{nranks: mean throughput}`` of trial ``kind`` (FULL, SYNTHETIC, IO) over the given files."""
    series = {}
    for path in paths:
        with open(path) as f:
            result = json.load(f)
        if kind not in result or "nranks" not in result:
            sys.exit(f"error: {path} is not a benchmark result with {kind} trials (written by --enable_benchy).")
        series.setdefault(int(result["nranks"]), []).append(statistics.mean(result[kind]["trial_throughput"]))
    return {n: statistics.mean(values) for n, values in sorted(series.items())}


def efficiency(series):
    """Weak-scaling efficiency: throughput on N over N times the smallest run's throughput per rank."""
    smallest = min(series)
    per_rank = series[smallest] / smallest
    return {n: value / (n * per_rank) for n, value in series.items()}


def plot(ddp, noddp, kind, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    for label, series, marker in (("DDP", ddp, "o"), ("noddp (no communication)", noddp, "s")):
        if not series:
            continue
        ranks = list(series)
        left.plot(ranks, [series[n] for n in ranks], marker + "-", label=label)
        per_rank = series[ranks[0]] / ranks[0]
        left.plot(ranks, [n * per_rank for n in ranks], ":", color="gray")
    left.plot([], [], ":", color="gray", label="ideal (N x smallest run per GPU)")
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("GPUs")
    left.set_ylabel(f"{kind} samples/s")
    left.set_title("weak scaling")
    left.legend(fontsize=8)
    shared = sorted(set(ddp) & set(noddp))
    if shared:
        right.bar([str(n) for n in shared], [100 * (1 - ddp[n] / noddp[n]) for n in shared])
    right.set_xlabel("GPUs")
    right.set_ylabel("communication overhead (%)")
    right.set_title("1 - DDP / noddp throughput")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Weak-scaling plots from --enable_benchy JSON files.")
    parser.add_argument("--ddp", nargs="+", required=True, help="results of runs with gradient communication")
    parser.add_argument("--noddp", nargs="*", default=[], help="results of the same runs with --noddp")
    parser.add_argument("--kind", default="FULL", choices=("FULL", "SYNTHETIC", "IO"))
    parser.add_argument("--out", default="scaling.png")
    args = parser.parse_args(argv)

    ddp, noddp = read_series(args.ddp, args.kind), read_series(args.noddp, args.kind)
    print(f"{'GPUs':>5} {'DDP':>12} {'efficiency':>10} {'noddp':>12} {'overhead':>9}")
    ddp_efficiency = efficiency(ddp)
    for n in sorted(set(ddp) | set(noddp)):
        cells = [f"{ddp[n]:12.1f}" if n in ddp else f"{'-':>12}",
                 f"{ddp_efficiency[n]:10.1%}" if n in ddp else f"{'-':>10}",
                 f"{noddp[n]:12.1f}" if n in noddp else f"{'-':>12}",
                 f"{1 - ddp[n] / noddp[n]:9.1%}" if n in ddp and n in noddp else f"{'-':>9}"]
        print(f"{n:>5} " + " ".join(cells))
    plot(ddp, noddp, args.kind, args.out)
    print(f"Plot: {args.out}")


if __name__ == "__main__":
    main()
