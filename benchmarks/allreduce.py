"""gloo all-reduce times for the U-Net's gradient sizes, and the bandwidth and latency they imply.

Run on every rank, with torch.distributed's variables set (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):

    torchrun --standalone --nproc_per_node=2 -m benchmarks.allreduce          # two ranks on this machine
    sbatch -N 2 --ntasks-per-node=1 --cpus-per-task=1 tests/slurm/allreduce.sh  # two nodes under Slurm

then read the lines back from the output and fit them:

    python -m benchmarks.allreduce --parse unet-allreduce-<jobid>.out --name two-nodes --where "..."

Each size is all-reduced ``--repeats`` times after ``--warmup`` untimed ones; a barrier before each
makes every rank start together, and rank 0 prints the median as one line

    ALLREDUCE ranks=2 bytes=83886080 seconds=0.0123 backend=gloo host=node1

The sizes are the buckets DDP makes of the full U-Net's gradients at 25 MB (with the 1 MiB first
bucket) and of the demo model's (all of it in one bucket), and a few small ones for the latency. The
fit is a ring's cost with N = 2, t = 2 x latency + bytes / bandwidth (see :func:`fit`): the CPU
profile that ``benchmarks.scaling_model`` predicts the demo model's two-rank step with.
"""
import argparse
import datetime
import json
import os
import re
import socket
import statistics
import time

from utils.errors import UserError, exit_on_user_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = re.compile(r"^ALLREDUCE ranks=(\d+) bytes=(\d+) seconds=([0-9.eE+-]+) backend=(\S+) host=(\S+)", re.M)
SMALL = [4 * 1024, 64 * 1024, 1024 * 1024]
SMALL_LIMIT = 64 * 1024  # sizes that measure the latency


def gradient_sizes():
    """The bucket sizes in bytes: the full U-Net's at 25 MB (the original's 8), the demo model's, and SMALL."""
    from benchmarks import scaling_model

    full = [size for size, _ in scaling_model.buckets(scaling_model.unet(), 25, first_bucket_mb=1)]
    demo = [size for size, _ in scaling_model.buckets(scaling_model.unet(16, False, 32), 25, first_bucket_mb=25)]
    return sorted(set(SMALL + full + demo))


def measure(sizes, repeats, warmup):
    """The median seconds of an all-reduce of each size (float32), on this process's group."""
    import torch
    import torch.distributed as dist

    times = {}
    for size in sizes:
        tensor = torch.ones(size // 4)
        samples = []
        for i in range(warmup + repeats):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            if i >= warmup:
                samples.append(time.perf_counter() - start)
        # The slowest rank's time is the all-reduce's: take the maximum over ranks of each median.
        median = torch.tensor([statistics.median(samples)], dtype=torch.float64)
        dist.all_reduce(median, op=dist.ReduceOp.MAX)
        times[size] = median.item()
    return times


def parse(text):
    """The measurement's lines in a job's output: a list of {ranks, bytes, seconds, backend, host}."""
    return [{"ranks": int(r), "bytes": int(b), "seconds": float(s), "backend": k, "host": h}
            for r, b, s, k, h in LINE.findall(text)]


def fit(points):
    """(latency per hop in s, bandwidth in bytes/s) of a ring of two, t = 2 x latency + bytes / bandwidth.
    The bandwidth is the least-squares slope over all the sizes (the large ones weigh most); the
    latency is half the fastest all-reduce of SMALL_LIMIT bytes or fewer, where the bytes cost
    nothing to speak of (an intercept fitted through the large sizes is lost in their noise)."""
    xs = [p["bytes"] for p in points]
    ys = [p["seconds"] for p in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    small = [p["seconds"] for p in points if p["bytes"] <= SMALL_LIMIT]
    if slope <= 0 or not small:
        raise ValueError("the times do not grow with the size, or no size of 64 KiB or less was measured: "
                         "nothing to fit a bandwidth and a latency to")
    return min(small) / 2, 1 / slope


def summary(points, name, where, command, date):
    latency, bandwidth = fit(points)
    lines = [f"# gloo all-reduce on two ranks: {name}", "", f"{where}. Made by `{command}` ({date}); "
             "the median of the repeats, the slowest rank's. The machine's 2 cores were shared with other "
             "work while it ran, so the times carry that load.", "",
             "| bytes | MiB | seconds | GB/s (bytes / seconds) |", "|---|---|---|---|"]
    for p in sorted(points, key=lambda p: p["bytes"]):
        lines.append(f"| {p['bytes']} | {p['bytes'] / 2**20:.2f} | {p['seconds']:.5f} | "
                     f"{p['bytes'] / p['seconds'] / 1e9:.2f} |")
    lines += ["", f"A ring of two, t = 2 x latency + bytes / bandwidth: latency {1e6 * latency:.0f} us per hop "
              f"(half the fastest all-reduce of 64 KiB or less), bandwidth {bandwidth / 1e9:.2f} GB/s (the "
              "least-squares slope over all the sizes)."]
    return {"name": name, "where": where, "command": command, "date": date, "points": points,
            "latency_s": latency, "bandwidth_Bps": bandwidth}, "\n".join(lines) + "\n"


@exit_on_user_error
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--parse", help="a job's output to read the ALLREDUCE lines from (no measurement)")
    parser.add_argument("--name", help="with --parse: the results' name, benchmarks/results/allreduce/<name>.*")
    parser.add_argument("--where", default="", help="with --parse: where it ran, for the results' README")
    parser.add_argument("--command", default="", help="with --parse: the command that measured it")
    parser.add_argument("--out_dir", default=os.path.join(ROOT, "benchmarks", "results", "allreduce"))
    parser.add_argument("--overwrite", action="store_true", help="with --parse: replace results of that name")
    args = parser.parse_args(argv)

    if args.parse:
        from benchmarks.common import claim_files

        if not args.name:
            raise UserError("--parse needs --name=<name>: the results go to <out_dir>/<name>.json and .md.")
        with open(args.parse) as f:
            points = parse(f.read())
        if not points:
            raise UserError(f"{args.parse} holds no ALLREDUCE lines: give the output of tests/slurm/allreduce.sh "
                            "or of torchrun ... -m benchmarks.allreduce (rank 0 prints them).")
        out = args.out_dir
        claim_files([os.path.join(out, f"{args.name}.{kind}") for kind in ("json", "md")], args.overwrite,
                    "an earlier measurement")
        # The output's time: when the job wrote it (parse right after the measurement).
        stamp = datetime.datetime.fromtimestamp(os.path.getmtime(args.parse), datetime.timezone.utc)
        result, text = summary(points, args.name, args.where, args.command, stamp.isoformat(timespec="seconds"))
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"{args.name}.json"), "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(out, f"{args.name}.md"), "w") as f:
            f.write(text)
        print(text)
        return result

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    times = measure(gradient_sizes(), args.repeats, args.warmup)
    if dist.get_rank() == 0:
        for size, seconds in times.items():
            print(f"ALLREDUCE ranks={dist.get_world_size()} bytes={size} seconds={seconds:.6f} backend=gloo "
                  f"host={socket.gethostname()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
