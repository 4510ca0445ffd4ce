"""An all-reduce sweep, as nccl-tests' all_reduce_perf measures one, written as a machine profile.

Run on every rank, with torch.distributed's variables set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT): NCCL between GPUs where CUDA is available, gloo between CPU processes otherwise.

    torchrun --standalone --nproc_per_node=4 -m benchmarks.allreduce --out network.json    # 4 GPUs of a node
    torchrun --standalone --nproc_per_node=2 -m benchmarks.allreduce --max_bytes 64M --out cpu.json
    sbatch -N 2 --ntasks-per-node=1 --cpus-per-task=1 tests/slurm/allreduce.sh --out two-nodes.json

then model the scaling with the measured network: ``python -m benchmarks.scaling_model --network FILE``.

Each size, from ``--min_bytes`` (1 MiB) to ``--max_bytes`` (1 GiB) by factors of two, is all-reduced
``--warmup`` times untimed, then ``--iters`` times back to back between two barriers; its time is
the average over ranks of each rank's time per all-reduce, and its bandwidths are nccl-tests' own
(doc/PERFORMANCE.md of github.com/NVIDIA/nccl-tests):

    algbw = bytes / time                 what one all-reduce of this size delivers
    busbw = algbw x 2 (n - 1) / n        n ranks: the bandwidth each rank's link carried, comparable
                                         across rank counts and with the hardware's peak

Rank 0 prints one line a size and writes the profile (``--out``), a JSON object with exactly the keys
``backend``, ``world_size``, ``nodes``, ``rows`` (one {bytes, time_us, algbw_GBps, busbw_GBps} a
size), ``latency_us`` and ``busbw_GBps``: see :func:`profile` for the last two. GB/s are 1e9 bytes/s.
"""
import argparse
import json
import os
import re
import socket
import time

from utils.errors import UserError, exit_on_user_error

KEYS = ("backend", "world_size", "nodes", "rows", "latency_us", "busbw_GBps")
ROW_KEYS = ("bytes", "time_us", "algbw_GBps", "busbw_GBps")
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_bytes(text):
    """'64M' -> 67108864: a whole number of bytes with an optional K, M or G (powers of 1024)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.I)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: write bytes as e.g. 4096, 64K, 1M or 1G")
    return int(match.group(1)) * UNITS[match.group(2).upper()]


def sizes(min_bytes, max_bytes, factor=2):
    """The sweep's message sizes, whole float32 elements: min_bytes, x factor, ..., up to max_bytes."""
    if min_bytes < 4 or max_bytes < min_bytes:
        raise UserError(f"The sweep runs from --min_bytes to --max_bytes (here {min_bytes} and {max_bytes}): "
                        "give a --min_bytes of at least 4 (one float32) and a --max_bytes at least as large.")
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size // 4 * 4)
        size *= factor
    return out


def bus_factor(world_size):
    """nccl-tests' correction from algorithm to bus bandwidth for an all-reduce: 2 (n - 1) / n."""
    return 2 * (world_size - 1) / world_size


def row(size, seconds, world_size):
    algbw = size / seconds / 1e9
    return {"bytes": size, "time_us": seconds * 1e6, "algbw_GBps": algbw, "busbw_GBps": algbw * bus_factor(world_size)}


def fit_latency(rows):
    """The fitted small-message time in us: the intercept of time = latency + bytes / bandwidth over the
    rows, fitted in relative terms (each row's residual divided by its time, so that the small sizes,
    whose time is mostly latency, set the intercept and the large ones the slope). 0 when the sizes do
    not resolve it (a negative intercept: measure smaller sizes, e.g. --min_bytes 8)."""
    if len(rows) < 2:
        return rows[0]["time_us"] if rows else 0.0
    # Weighted least squares of t = a + b x with weights 1 / t^2.
    weights = [1 / r["time_us"] ** 2 for r in rows]
    xs, ys = [r["bytes"] for r in rows], [r["time_us"] for r in rows]
    total = sum(weights)
    mean_x = sum(w * x for w, x in zip(weights, xs)) / total
    mean_y = sum(w * y for w, y in zip(weights, ys)) / total
    spread = sum(w * (x - mean_x) ** 2 for w, x in zip(weights, xs))
    slope = sum(w * (x - mean_x) * (y - mean_y) for w, x, y in zip(weights, xs, ys)) / spread
    return max(0.0, mean_y - slope * mean_x)


def profile(backend, world_size, nodes, rows):
    """The machine profile: the rows, ``latency_us`` (:func:`fit_latency`) and ``busbw_GBps``, the
    bus bandwidth of the largest message (where the latency weighs least, as nccl-tests' docs advise
    reading bandwidth at large sizes)."""
    largest = max(rows, key=lambda r: r["bytes"])
    return {"backend": backend, "world_size": world_size, "nodes": nodes, "rows": rows,
            "latency_us": fit_latency(rows), "busbw_GBps": largest["busbw_GBps"]}


def check_profile(data):
    """The profile's keys, as readers of it expect them; raise ValueError if they are not."""
    if not isinstance(data, dict) or tuple(sorted(data)) != tuple(sorted(KEYS)):
        raise ValueError(f"a network profile has exactly the keys {', '.join(KEYS)}")
    if not data["rows"] or any(tuple(sorted(r)) != tuple(sorted(ROW_KEYS)) for r in data["rows"]):
        raise ValueError(f"a network profile's rows each have exactly the keys {', '.join(ROW_KEYS)}")
    return data


def measure(size, iters, warmup, device):
    """This rank's seconds per all-reduce of ``size`` bytes (float32, in place), ``iters`` launched
    back to back after ``warmup`` untimed ones; on a GPU the clock stops when the GPU is done."""
    import torch
    import torch.distributed as dist

    tensor = torch.zeros(size // 4, device=device)  # zeros: sums of zeros never overflow
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        dist.all_reduce(tensor)
    synchronize()
    dist.barrier()  # every rank starts together
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    synchronize()  # waits for the GPU: the all-reduces are done
    return (time.perf_counter() - start) / iters


def check_sum(device):
    """One all-reduce of each rank's number: the sum must arrive on every rank (nccl-tests' #wrong)."""
    import torch
    import torch.distributed as dist

    tensor = torch.full((1024,), float(dist.get_rank() + 1), device=device)
    dist.all_reduce(tensor)
    n = dist.get_world_size()
    if not bool((tensor == n * (n + 1) / 2).all()):
        raise RuntimeError(f"rank {dist.get_rank()}: the all-reduce returned a wrong sum")


def sweep(message_sizes, iters, warmup, device):
    """The rows of the sweep, the time of each size averaged over the ranks (nccl-tests' default)."""
    import torch
    import torch.distributed as dist

    check_sum(device)
    world_size = dist.get_world_size()
    rows = []
    for size in message_sizes:
        seconds = torch.tensor([measure(size, iters, warmup, device)], dtype=torch.float64, device=device)
        dist.all_reduce(seconds)
        rows.append(row(size, seconds.item() / world_size, world_size))
        if dist.get_rank() == 0:
            print(format_row(rows[-1]), flush=True)
    return rows


def format_row(r):
    return f"{r['bytes']:>12} {r['time_us']:>12.1f} {r['algbw_GBps']:>10.3f} {r['busbw_GBps']:>10.3f}"


def node_count():
    """The number of hosts the ranks run on (one name a host)."""
    import torch.distributed as dist

    names = [None] * dist.get_world_size()
    dist.all_gather_object(names, socket.gethostname())
    return len(set(names))


@exit_on_user_error
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min_bytes", type=parse_bytes, default=parse_bytes("1M"))
    parser.add_argument("--max_bytes", type=parse_bytes, default=parse_bytes("1G"))
    parser.add_argument("--iters", type=int, default=20, help="timed all-reduces a size (nccl-tests: 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed all-reduces first (nccl-tests: 5)")
    parser.add_argument("--backend", choices=("nccl", "gloo"), help="default: nccl where CUDA is, else gloo")
    parser.add_argument("--out", help="the profile's JSON file (rank 0 writes it); refused if it exists")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    args = parser.parse_args(argv)
    message_sizes = sizes(args.min_bytes, args.max_bytes)
    if args.iters < 1 or args.warmup < 0:
        raise UserError(f"--iters must be at least 1 and --warmup at least 0 (got {args.iters} and {args.warmup}).")
    if "RANK" not in os.environ:
        raise UserError("benchmarks.allreduce runs on every rank of a job: launch it with torchrun (e.g. torchrun "
                        "--standalone --nproc_per_node=2 -m benchmarks.allreduce) or srun (tests/slurm/allreduce.sh).")
    if args.out and int(os.environ["RANK"]) == 0:
        from benchmarks.common import claim_files

        claim_files([args.out], args.overwrite, "an earlier sweep")

    import torch
    import torch.distributed as dist

    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    dist.init_process_group(backend)
    nodes = node_count()
    if dist.get_rank() == 0:
        print(f"# all-reduce, float32 sum in place, {backend}: {dist.get_world_size()} ranks on {nodes} node(s); "
              f"{args.warmup} warm-up and {args.iters} timed all-reduces a size", flush=True)
        print(f"# {'size (B)':>10} {'time (us)':>12} {'algbw GB/s':>10} {'busbw GB/s':>10}", flush=True)
    rows = sweep(message_sizes, args.iters, args.warmup, device)
    result = profile(backend, dist.get_world_size(), nodes, rows)
    if dist.get_rank() == 0:
        print(f"# latency {result['latency_us']:.1f} us (fitted small-message time), bus bandwidth "
              f"{result['busbw_GBps']:.3f} GB/s (at {rows[-1]['bytes']} bytes)", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
            print(f"# wrote {args.out}", flush=True)
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
