"""A scaling model on paper: one DDP training step's time on N GPUs, from one GPU's throughput and the network.

    python -m benchmarks.scaling_model                      # bs64_opt weak scaling on Perlmutter, 1 .. 1024 GPUs
    python -m benchmarks.scaling_model --machine h100 --local_batch_size=128 --bucket_cap_mb=100 --ddp_comm_hook=bf16
    python -m benchmarks.scaling_model --check              # against the original tutorial's published numbers
    python -m benchmarks.scaling_model --knobs              # which knob recovers what, at 32 nodes

One step on N GPUs takes

    compute (local batch / one GPU's samples/s)
  + the gradient all-reduce that the backward pass does not hide
  + the broadcast of buffers before the forward pass (DDP's broadcast_buffers)

and no less than the loader needs for the local batch. The all-reduce is DDP's: its buckets come from
DDP's own assignment (``torch.distributed._compute_bucket_assignment_by_size``) of the U-Net's real
parameters, in the order their gradients become ready, which hooks record during a real backward pass
together with the share of the backward FLOPs done at that moment. Each bucket's all-reduce starts
when its last gradient is ready and the one before it is done, and costs what NCCL's own cost model
says (nccl/src/graph/tuning.cc): a ring, 2(N-1)/N x bytes / bus bandwidth + 2(N-1) hops of latency,
or a tree, 2 x bytes / bus bandwidth + 2 log2(nodes) hops, whichever is faster. Within a node the
bus bandwidth is a GPU's NVLink; across nodes it is the node's network cards (a ring through each
node's k NICs moves k times one NIC's bandwidth). What the model leaves out is listed in README's
"A scaling model on paper".

The compute time is split between forward and backward by FLOPs (time is taken to follow FLOPs).
Every number that is not measured is either a public specification (cited beside it) or fitted to
the original's published runs, and then named as fitted (``--check`` prints which).
"""
import argparse
import dataclasses
import functools
import json
import math
import os
import sys

MIB = 2 ** 20
GPU_COUNTS = [2 ** i for i in range(11)]  # 1 .. 1024


@dataclasses.dataclass(frozen=True)
class Machine:
    """A node type and its network: bandwidths in GB/s (10^9 bytes/s, one direction), latencies in s."""
    name: str
    gpus_per_node: int
    nvlink_bw: float        # one GPU's NVLink bandwidth, one direction: the bus bandwidth within a node
    node_network_bw: float  # all of a node's network cards together, one direction
    intra_latency: float    # one hop of a ring within a node
    inter_latency: float    # one hop between nodes
    loader_rate: float      # samples/s that one GPU's data loader delivers (the loader's bound), or None
    source: str             # where the numbers come from
    call_latency: float = 0.0  # the fixed cost of one collective call, whatever its size


# Perlmutter's GPU node (https://docs.nersc.gov/systems/perlmutter/architecture/): 4 A100-SXM4-40GB
# joined by NVLink 3 (12 links of 25 GB/s per direction per GPU: 300 GB/s, NVIDIA A100 datasheet) and
# 4 HPE Slingshot 11 NICs of 200 Gb/s (25 GB/s) each: 100 GB/s per node. Latencies: NCCL's own cost
# model (nccl/src/graph/tuning.cc, hwLat and baseLat for the Simple protocol that large messages use):
# 3.4 us per NVLink hop and 14 us per network hop of a ring, 8.4 us per call. Loader: the original's
# DALI IO trial, 937 samples/s on one A100 (its README, "DALI + AMP + apex + JIT").
NCCL_LATENCY = {"intra_latency": 3.4e-6, "inter_latency": 14e-6, "call_latency": 8.4e-6}
PERLMUTTER = Machine("Perlmutter (4 x A100 per node)", 4, 300.0, 100.0, loader_rate=937.0,
                     source="docs.nersc.gov/systems/perlmutter/architecture; NVIDIA A100 datasheet; "
                     "the original tutorial's benchy IO trial", **NCCL_LATENCY)
# An NVIDIA DGX H100 node (NVIDIA DGX H100 user guide): 8 H100-SXM5 on NVLink 4 (18 links, 900 GB/s
# both directions: 450 GB/s each way) through NVSwitch, and 8 ConnectX-7 NICs of 400 Gb/s (50 GB/s):
# 400 GB/s per node. No loader's bound: none is measured on an H100 (the A100's DALI rate, 937
# samples/s, would bound it below its predicted compute).
H100 = Machine("DGX H100 (8 x H100 per node)", 8, 450.0, 400.0, loader_rate=None,
               source="NVIDIA DGX H100 user guide (NVLink 4, 8 x ConnectX-7 400 Gb/s)", **NCCL_LATENCY)
MACHINES = {"perlmutter": PERLMUTTER, "h100": H100}

# One GPU's samples/s of bs64_opt (DALI, AMP fp16, apex, JIT) at local batch 64, epoch 4: the original's
# README ("DALI + AMP + apex + JIT", A100-40GB). On an H100 nothing is measured yet: the A100's rate
# times the ratio of the dense fp16 peaks (989 / 312 TFLOP/s, utils/flops.py), i.e. the same model FLOP
# utilisation (20%): a prediction, to be replaced by a measurement.
ONE_GPU_RATE = {"perlmutter": 782.0, "h100": 782.0 * 989 / 312}


@dataclasses.dataclass(frozen=True)
class Gradient:
    name: str
    bytes: int
    ready: float  # share of the backward pass's FLOPs done when this gradient is ready (0 .. 1)


@dataclasses.dataclass(frozen=True)
class Network:
    """What the model needs to know about the network being trained."""
    gradients: tuple     # in the order they become ready
    forward_share: float  # forward FLOPs / (forward + backward) FLOPs
    buffer_bytes: int    # what broadcast_buffers sends before every forward


def record_gradients(model, inputs):
    """Run one forward and backward pass of ``model`` under torch's FLOP counter, with a hook on
    every parameter that notes when its gradient is accumulated: the order in which DDP's buckets
    fill, and how far into the backward pass (in FLOPs) each gradient is ready."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    names = {id(p): name for name, p in model.named_parameters()}
    counter = FlopCounterMode(display=False)
    events = []
    handles = [p.register_post_accumulate_grad_hook(
        lambda p: events.append((names[id(p)], p.numel() * p.element_size(), counter.get_total_flops())))
        for p in model.parameters() if p.requires_grad]
    with counter:
        loss = model(inputs).float().abs().mean()
        forward = counter.get_total_flops()
        loss.backward()
    total = counter.get_total_flops()
    for handle in handles:
        handle.remove()
    gradients = tuple(Gradient(name, size, (flops - forward) / (total - forward)) for name, size, flops in events)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return Network(gradients, forward / total, buffers)


@functools.lru_cache(maxsize=None)
def unet(base_channels=64, full_scale=True, crop_size=64):
    """The tutorial's U-Net (117 M parameters at base_channels 64), recorded on the meta device:
    shapes only, so the full model takes a fraction of a second on any machine, and autograd calls
    the hooks in the same order as on a CPU or a GPU."""
    import torch
    from networks.UNet import UNet

    with torch.device("meta"):
        model = UNet(4, 5, base_channels, full_scale)
        inputs = torch.empty(1, 4, crop_size, crop_size, crop_size)
    return record_gradients(model, inputs)


def first_bucket_mb_of_this_torch(bucket_cap_mb):
    """DDP's first (smallest) bucket: 1 MiB in the torch of 2022 that the original ran (its 8 NCCL
    calls at 25 MB and 5 at 100 MB), and in newer torch only when bucket_cap_mb is left at its
    default; a torch with ``_BucketCapacityConfig`` makes the first bucket as large as the others
    when bucket_cap_mb is given, as train.py gives it."""
    from torch.nn.parallel import distributed

    return float(bucket_cap_mb) if hasattr(distributed, "_BucketCapacityConfig") else 1.0


def buckets(network, bucket_cap_mb=25.0, first_bucket_mb=1.0):
    """DDP's buckets, as DDP assigns them when it rebuilds them after the first step: the gradients
    in the order they became ready, cut by torch's own function at ``first_bucket_mb`` for the first
    bucket and ``bucket_cap_mb`` after it. A list of (bytes, ready), ready being the share of the
    backward pass done when the bucket's last gradient is ready: its all-reduce can start then."""
    import torch
    import torch.distributed as dist

    tensors = [torch.empty(g.bytes // 4, device="meta") for g in network.gradients]  # fp32 gradients
    limits = [int(first_bucket_mb * MIB), int(bucket_cap_mb * MIB)]
    assignment = dist._compute_bucket_assignment_by_size(tensors, limits, [False] * len(tensors))[0]
    return [(sum(network.gradients[i].bytes for i in indices), max(network.gradients[i].ready for i in indices))
            for indices in assignment]


def allreduce_time(size, gpus, machine):
    """NCCL's all-reduce of ``size`` bytes over ``gpus`` GPUs: the faster of a ring and a tree."""
    if gpus == 1:
        return 0.0
    nodes = math.ceil(gpus / machine.gpus_per_node)
    per_node = min(gpus, machine.gpus_per_node)
    bandwidth = 1e9 * (machine.nvlink_bw if nodes == 1 else min(machine.nvlink_bw, machine.node_network_bw))
    hop = machine.intra_latency if nodes == 1 else machine.inter_latency
    ring = 2 * (gpus - 1) / gpus * size / bandwidth + 2 * (gpus - 1) * hop
    tree = 2 * size / bandwidth + 2 * ((per_node - 1) * machine.intra_latency
                                       + math.log2(nodes) * machine.inter_latency)
    return machine.call_latency + min(ring, tree)


def broadcast_time(size, gpus, machine):
    """DDP's broadcast of the buffers from rank 0 before every forward: nothing if there are none
    (DDP skips the call, as for the U-Net), else a tree's log2(N) hops and the bytes once."""
    if gpus == 1 or size == 0:
        return 0.0
    bandwidth = 1e9 * (machine.nvlink_bw if gpus <= machine.gpus_per_node else machine.node_network_bw)
    return size / bandwidth + math.log2(gpus) * machine.inter_latency


def comm_timeline(jobs, start=0.0):
    """One communication stream: each job (ready time, duration) starts when it is ready and the one
    before it has finished. Returns when the last one ends."""
    end = start
    for ready, duration in jobs:
        end = max(ready, end) + duration
    return end


@dataclasses.dataclass(frozen=True)
class Step:
    compute: float       # s, one GPU's step at this local batch
    exposed: float       # s, communication the backward pass does not hide
    broadcast: float     # s
    step: float          # s, the whole step
    samples_per_s: float  # of the whole job
    buckets: int         # all-reduces per step (FSDP: units, each gathered and reduce-scattered)


def step_time(machine, gpus, local_batch, one_gpu_rate, network=None, bucket_cap_mb=25.0, first_bucket_mb=1.0,
              ddp_comm_hook="none", broadcast_buffers=True, parallel="ddp"):
    """One training step on ``gpus`` GPUs, at ``one_gpu_rate`` samples/s per GPU when alone.

    DDP: each bucket's all-reduce starts when its last gradient is ready (forward, then that share of
    the backward) and the bucket before it is done; what runs past the end of the backward pass is
    exposed. ``ddp_comm_hook`` bf16 or fp16 halves the bytes. ``parallel="fsdp"`` (no buckets, no comm
    hook, no broadcast: those are DDP's): each parameter tensor is sharded, so the forward
    all-gathers every one (overlapping the forward compute), the backward all-gathers them again
    (prefetched from its start) and reduce-scatters each gradient once it is ready. An all-gather
    and a reduce-scatter each cost half an all-reduce: 1.5 times DDP's bytes in all.
    """
    network = network or unet()
    compute = local_batch / one_gpu_rate
    forward = compute * network.forward_share
    backward = compute - forward
    if parallel == "fsdp":
        units = [(g.bytes, g.ready) for g in network.gradients]
        half = [allreduce_time(size, gpus, machine) / 2 for size, _ in units]
        forward_wait = max(0.0, sum(half) - forward)  # the forward's all-gathers outrun its compute
        reduce_scatters = [(forward + ready * backward, cost) for (_, ready), cost in zip(units, half)]
        end = comm_timeline([(forward, sum(half))] + reduce_scatters)
        exposed = forward_wait + max(0.0, end - compute)
        broadcast, count = 0.0, len(units)
    else:
        scale = 0.5 if ddp_comm_hook in ("bf16", "fp16") else 1.0
        cut = buckets(network, bucket_cap_mb, first_bucket_mb)
        end = comm_timeline([(forward + ready * backward, allreduce_time(scale * size, gpus, machine))
                             for size, ready in cut])
        exposed = max(0.0, end - compute)
        broadcast = broadcast_time(network.buffer_bytes, gpus, machine) if broadcast_buffers else 0.0
        count = len(cut)
    step = compute + exposed + broadcast
    if machine.loader_rate:
        step = max(step, local_batch / machine.loader_rate)  # the loader cannot keep up
    return Step(compute, exposed, broadcast, step, gpus * local_batch / step, count)


def scaling_table(machine, local_batch, one_gpu_rate, global_batch=1024, counts=GPU_COUNTS, **options):
    """One row per GPU count: weak scaling (``local_batch`` per GPU) and strong scaling
    (``global_batch`` split over the GPUs, at the same samples/s per GPU: optimistic for small local
    batches, which use a GPU less well; blank where a GPU would get less than one sample)."""
    rows = []
    alone = step_time(machine, 1, local_batch, one_gpu_rate, **options)
    strong_alone = step_time(machine, 1, global_batch, one_gpu_rate, **options)
    for gpus in counts:
        weak = step_time(machine, gpus, local_batch, one_gpu_rate, **options)
        row = {"gpus": gpus, "nodes": math.ceil(gpus / machine.gpus_per_node), "buckets": weak.buckets,
               "compute_ms": 1e3 * weak.compute, "exposed_ms": 1e3 * weak.exposed,
               "samples_per_s": weak.samples_per_s,
               "weak_efficiency": weak.samples_per_s / (gpus * alone.samples_per_s),
               "strong_samples_per_s": None, "strong_efficiency": None}
        if global_batch % gpus == 0:
            strong = step_time(machine, gpus, global_batch // gpus, one_gpu_rate, **options)
            row["strong_samples_per_s"] = strong.samples_per_s
            row["strong_efficiency"] = strong.samples_per_s / (gpus * strong_alone.samples_per_s)
        rows.append(row)
    return rows


# The original tutorial's published multi-GPU numbers (its README; A100-40GB, Perlmutter, Nov 2022), each
# with the run's settings. Its 4- and 8-GPU rows ran bs64_opt at local batch 16 with
# --disable_broadcast_buffers --bucket_cap_mb 100; its weak scaling to 32 nodes kept the defaults
# (25 MB buckets, broadcast on), at local batch 64 and 128.
# ``tolerance``: the relative error tests/test_scaling_model.py allows; a fitted row's is the fit's own
# precision, a predicted row's the error the model makes today, so that a change that makes it worse fails.
PUBLISHED = [
    {"label": "4 GPUs (1 node), local batch 16, 100 MB buckets, no broadcast", "gpus": 4, "local_batch": 16,
     "options": {"bucket_cap_mb": 100, "broadcast_buffers": False}, "samples_per_s": 2059.1, "tolerance": 0.001},
    {"label": "8 GPUs (2 nodes), local batch 16, 100 MB buckets, no broadcast", "gpus": 8, "local_batch": 16,
     "options": {"bucket_cap_mb": 100, "broadcast_buffers": False}, "samples_per_s": 3588.4, "tolerance": 0.42},
    {"label": "32 nodes, local batch 64, weak-scaling efficiency", "gpus": 128, "local_batch": 64,
     "options": {}, "efficiency": 0.78, "tolerance": 0.001},
    {"label": "32 nodes, local batch 128, weak-scaling efficiency", "gpus": 128, "local_batch": 128,
     "options": {}, "efficiency": 0.89, "tolerance": 0.10},
]


def solve(function, target, low, high, steps=60):
    """The x in [low, high] where the increasing or decreasing ``function(x)`` equals ``target`` (bisection)."""
    rising = function(high) > function(low)
    for _ in range(steps):
        middle = (low + high) / 2
        if (function(middle) < target) == rising:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def predict(row, rates, machine):
    """The model's value for a published row: samples/s, or weak-scaling efficiency."""
    rate = rates[row["local_batch"]]
    options = {"first_bucket_mb": 1.0, **row["options"]}  # the original's torch: a 1 MiB first bucket
    step = step_time(machine, row["gpus"], row["local_batch"], rate, **options)
    if "efficiency" in row:
        return step.samples_per_s / (row["gpus"] * step_time(machine, 1, row["local_batch"], rate).samples_per_s)
    return step.samples_per_s


@functools.lru_cache(maxsize=None)
def fit_published(machine=PERLMUTTER):
    """Fit the two terms the published numbers do not give, each to one row, and predict the others.

    - One GPU's samples/s at local batch 16: the original published it at 64 only (782). Fitted to the
      4-GPU row, where NVLink at its datasheet bandwidth hides the all-reduce almost entirely.
    - The share of the network's datasheet bandwidth that NCCL reaches across nodes (on NVLink the
      datasheet's is kept). Fitted to the 32-node efficiency at local batch 64.
    Local batch 64 and 128 use the published 782 samples/s (the same samples/s per GPU at 128: none
    was published).
    """
    rates = {64: ONE_GPU_RATE["perlmutter"], 128: ONE_GPU_RATE["perlmutter"]}
    four, _, weak64, _ = PUBLISHED
    # One node: the network between nodes plays no part, so the two fits do not depend on each other.
    rates[16] = solve(lambda r: predict(four, {**rates, 16: r}, machine), four["samples_per_s"], 50.0, 5000.0)

    def with_share(share):
        return dataclasses.replace(machine, node_network_bw=machine.node_network_bw * share)

    share = solve(lambda s: predict(weak64, rates, with_share(s)), weak64["efficiency"], 0.01, 1.0)
    fitted = with_share(share)
    rows = []
    for row in PUBLISHED:
        value = predict(row, rates, fitted)
        published = row.get("efficiency", row.get("samples_per_s"))
        rows.append({"label": row["label"], "published": published, "predicted": value,
                     "error": value / published - 1, "tolerance": row["tolerance"],
                     "term": {four["label"]: "fitted: one GPU's samples/s at local batch 16",
                              weak64["label"]: "fitted: the network's reached bandwidth"}.get(row["label"],
                                                                                            "predicted")})
    return {"rate_16": rates[16], "network_share": share, "machine": fitted, "rows": rows}


# The knobs the tutorial teaches, each alone on top of bs64_opt's weak-scaling run (local batch 64,
# 25 MB buckets, broadcast on, fp32 gradients on the wire, DDP), and together.
KNOBS = [
    ("bs64_opt as published (the baseline)", {}),
    ("--local_batch_size=128", {"local_batch": 128}),
    ("--bucket_cap_mb=100", {"bucket_cap_mb": 100}),
    ("--bucket_cap_mb=10", {"bucket_cap_mb": 10}),
    ("--disable_broadcast_buffers", {"broadcast_buffers": False}),
    ("--ddp_comm_hook=bf16", {"ddp_comm_hook": "bf16"}),
    ("--parallel=fsdp", {"parallel": "fsdp"}),
]


DDP_ONLY = {"bucket_cap_mb", "broadcast_buffers", "ddp_comm_hook"}


def knob_options(knob):
    return {key: value for key, value in knob.items() if key != "local_batch"}


def rank_knobs(machine, one_gpu_rate, nodes=32, combinations=True):
    """The weak-scaling efficiency on ``nodes`` nodes of each knob alone and, with ``combinations``,
    of every combination of the knobs that are not alternatives of one another; best first."""
    import itertools

    gpus = nodes * machine.gpus_per_node

    def efficiency(knob):
        batch = knob.get("local_batch", 64)
        step = step_time(machine, gpus, batch, one_gpu_rate, first_bucket_mb=1.0, **knob_options(knob))
        return step.samples_per_s / (gpus * step_time(machine, 1, batch, one_gpu_rate).samples_per_s)

    results = [(name, efficiency(knob)) for name, knob in KNOBS]
    if combinations:
        groups = [[("", {})] + [k for k in KNOBS[1:] if list(k[1]) == [key]]
                  for key in ("local_batch", "bucket_cap_mb", "broadcast_buffers", "ddp_comm_hook", "parallel")]
        for choice in itertools.product(*groups):
            chosen = [k for k in choice if k[0]]
            if any("parallel" in k for _, k in chosen) and any(set(k) & DDP_ONLY for _, k in chosen):
                continue  # train.py refuses --ddp_comm_hook with FSDP; buckets and broadcast are DDP's
            if len(chosen) > 1:
                knob = {key: value for _, k in chosen for key, value in k.items()}
                results.append((" ".join(name for name, _ in chosen), efficiency(knob)))
    return sorted(results, key=lambda item: -item[1])


def resolve_machine(name, network_share):
    """A named machine, its network at ``network_share`` of the datasheet ("fitted": the share fitted
    to the original's 32-node run on Perlmutter, also used for another machine's network, an assumption)."""
    share = fit_published()["network_share"] if network_share == "fitted" else float(network_share)
    machine = MACHINES[name]
    return dataclasses.replace(machine, node_network_bw=machine.node_network_bw * share), share


def percent(value):
    return f"{100 * value:.1f}%"


def signed(error):
    """+9.1%, and +0.0% for a fitted row's rounding error (not -0.0%)."""
    return f"{100 * error:+.1f}%".replace("-0.0%", "+0.0%")


def scaling_markdown(rows):
    lines = ["| GPUs | nodes | buckets | compute ms | exposed comm ms | samples/s (weak) | weak efficiency | "
             "samples/s (strong) | strong efficiency |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        strong = [f"{r['strong_samples_per_s']:.0f}", percent(r["strong_efficiency"])] \
            if r["strong_efficiency"] is not None else ["-", "-"]
        lines.append(f"| {r['gpus']} | {r['nodes']} | {r['buckets']} | {r['compute_ms']:.1f} | {r['exposed_ms']:.1f} | "
                     f"{r['samples_per_s']:.0f} | {percent(r['weak_efficiency'])} | " + " | ".join(strong) + " |")
    return "\n".join(lines)


def check_markdown(fit):
    lines = ["| published run (original tutorial, Perlmutter A100) | published | model | error | term |",
             "|---|---|---|---|---|"]
    for r in fit["rows"]:
        show = percent if r["published"] < 1.5 else (lambda v: f"{v:.0f} samples/s")
        lines.append(f"| {r['label']} | {show(r['published'])} | {show(r['predicted'])} | "
                     f"{signed(r['error'])} | {r['term']} |")
    return "\n".join(lines)


def knobs_markdown(ranked):
    lines = ["| knobs on bs64_opt (local batch 64, 25 MB buckets) | predicted efficiency at 32 nodes |", "|---|---|"]
    for name, value in ranked:
        lines.append(f"| {name} | {percent(value)} |")
    return "\n".join(lines)


def plot(series, path, title):
    """Two panels in the style of benchmarks.plot_scaling: throughput against the ideal line, and
    weak- and strong-scaling efficiency; ``series`` maps a label to scaling_table rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullLocator

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    for (label, rows), color in zip(series.items(), ("C0", "C1", "C2", "C3")):
        gpus = [r["gpus"] for r in rows]
        left.plot(gpus, [r["samples_per_s"] for r in rows], "o-", color=color, label=label, markersize=4)
        left.plot(gpus, [g * rows[0]["samples_per_s"] for g in gpus], ":", color=color)
        right.plot(gpus, [100 * r["weak_efficiency"] for r in rows], "o-", color=color, markersize=4,
                   label=f"{label}, weak")
        strong = [r for r in rows if r["strong_efficiency"] is not None]
        right.plot([r["gpus"] for r in strong], [100 * r["strong_efficiency"] for r in strong], "s--",
                   color=color, markersize=3, label=f"{label}, strong")
    left.plot([], [], ":", color="gray", label="ideal (N x one GPU)")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xticks(GPU_COUNTS, [str(n) for n in GPU_COUNTS])
        axis.xaxis.set_minor_locator(NullLocator())
        axis.set_xlabel("GPUs")
    left.set_yscale("log")
    left.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    left.set_ylabel("samples/s (weak scaling)")
    left.set_title(title, fontsize=9)
    left.legend(fontsize=7)
    right.set_ylabel("scaling efficiency (%)")
    right.set_ylim(0, 105)
    right.set_title("predicted efficiency: weak and strong (global batch 1024)", fontsize=9)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "results")
# The committed CPU measurements the CPU check uses: gloo all-reduce times (benchmarks/allreduce.py) and
# the demo model's weak scaling on 1 and 2 ranks of one core each (benchmarks/scaling.py --preset cpu).
CPU_NETWORKS = {"two ranks on one machine (loopback)": "allreduce/two-ranks-one-machine.json",
                "two Slurm nodes (tests/slurm)": "allreduce/two-nodes-slurm.json"}
CPU_SCALING = "scaling/cpu-vm-2-cores-2026-11-25"
# Its torch (2.13.0, its scaling.json says) gave DDP's first bucket the whole bucket_cap_mb: the demo
# model's 16 MiB went in one bucket (first_bucket_mb_of_this_torch, checked against a real DDP by
# tests/test_scaling_model.py). Fixed here, so that the check reads the same under another torch.
CPU_SCALING_TORCH, CPU_SCALING_FIRST_BUCKET_MB = "2.13.0", 25.0


def cpu_machine(allreduce_json):
    """A CPU profile from a gloo measurement: one rank per node, its bandwidth and latency."""
    with open(allreduce_json) as f:
        measured = json.load(f)
    bandwidth, latency = measured["bandwidth_Bps"] / 1e9, measured["latency_s"]
    return Machine(f"CPU ranks: {measured['name']}", 1, bandwidth, bandwidth, latency, latency, None,
                   f"benchmarks/results/allreduce/{measured['name']}.md")


def cpu_check(results=RESULTS):
    """The demo model's 2-rank DDP step predicted from its measured 1-rank step and a measured gloo
    profile, against the 2-rank step measured the same day (FULL trials, local batch 8, one core per
    rank). One 16 MiB bucket, ready when the backward pass ends, so nothing hides."""
    from benchmarks import plot_scaling

    index, ddp, noddp = plot_scaling.read_folder(os.path.join(results, CPU_SCALING))
    if index["torch"].split("+")[0] != CPU_SCALING_TORCH:
        raise ValueError(f"{CPU_SCALING} was made with torch {index['torch']}, whose DDP may bucket differently "
                         f"from {CPU_SCALING_TORCH}'s: set CPU_SCALING_FIRST_BUCKET_MB for it")
    batch = index["local_batch"]
    one, two = batch / ddp[1], 2 * batch / ddp[2]  # step times, s
    network = unet(16, False, 32)  # the demo config's U-Net
    rows = [{"label": "measured", "step_ms": 1e3 * two, "samples_per_s": ddp[2], "error": 0.0}]
    for label, path in CPU_NETWORKS.items():
        step = step_time(cpu_machine(os.path.join(results, path)), 2, batch, ddp[1], network,
                         first_bucket_mb=CPU_SCALING_FIRST_BUCKET_MB)
        rows.append({"label": f"predicted, {label}", "step_ms": 1e3 * step.step, "exposed_ms": 1e3 * step.exposed,
                     "samples_per_s": step.samples_per_s, "error": step.step / two - 1})
    return {"one_rank_step_ms": 1e3 * one, "one_rank_samples_per_s": ddp[1], "rows": rows,
            "noddp_two_ranks": noddp.get(2), "source": f"benchmarks/results/{CPU_SCALING}/README.md"}


def cpu_markdown(check):
    lines = ["| demo model, 2 CPU ranks, DDP | step ms | samples/s | error in the step |", "|---|---|---|---|"]
    lines.append(f"| 1 rank, measured | {check['one_rank_step_ms']:.1f} | {check['one_rank_samples_per_s']:.1f} | - |")
    for r in check["rows"]:
        error = "-" if r["label"] == "measured" else signed(r["error"])
        lines.append(f"| 2 ranks, {r['label']} | {r['step_ms']:.1f} | {r['samples_per_s']:.1f} | {error} |")
    return "\n".join(lines)


def knob_table(machine, one_gpu_rate):
    """Each knob alone, best first, and then the best combination of knobs."""
    ranked = best_first(rank_knobs(machine, one_gpu_rate))
    singles = [item for item in ranked if item[0].count("--") <= 1]
    combined = [item for item in ranked if item[0].count("--") > 1]
    return singles + combined[:1]


def best_first(ranked):
    """The knob settings best first; among equal efficiencies (to 0.1%), the fewest knobs first."""
    return sorted(ranked, key=lambda item: (-round(item[1], 3), item[0].count("--")))


def report(out_dir, image=None):
    """Everything the README quotes, one markdown table per file in ``out_dir`` (check.md, cpu.md,
    perlmutter.md, h100.md, knobs-*.md) and all of it in report.json; and the plot (``image``)."""
    fit = fit_published()
    share = fit["network_share"]
    machines = {"perlmutter": resolve_machine("perlmutter", share)[0], "h100": resolve_machine("h100", share)[0],
                "h100-datasheet": MACHINES["h100"]}
    rates = {"perlmutter": ONE_GPU_RATE["perlmutter"], "h100": ONE_GPU_RATE["h100"],
             "h100-datasheet": ONE_GPU_RATE["h100"]}
    tables = {name: scaling_table(machines[name], 64, rates[name]) for name in ("perlmutter", "h100")}
    knobs = {name: knob_table(machines[name], rates[name]) for name in machines}
    cpu = cpu_check()
    result = {"command": "python -m benchmarks.scaling_model --report", "network_share": share,
              "rate_16": fit["rate_16"], "check": fit["rows"], "cpu": cpu, "tables": tables,
              "knobs": {name: [{"knobs": k, "efficiency": e} for k, e in ranked] for name, ranked in knobs.items()}}
    made = ("Made by `python -m benchmarks.scaling_model --report`: a computation from published and "
            "committed numbers, the same on any machine.")
    texts = {
        "check": (f"# The model against the original tutorial's published numbers\n\n{made}\n\n{check_markdown(fit)}"
                  f"\n\nFitted: one A100's samples/s at local batch 16, {fit['rate_16']:.0f} (782 at local batch 64 is "
                  f"published); the share of Slingshot 11's 100 GB/s per node that NCCL reached, {percent(share)}.\n"),
        "cpu": (f"# The model against this project's CPU measurements\n\n{made} The step times are "
                f"[{CPU_SCALING}](../{CPU_SCALING}/README.md)'s; the gloo profiles are "
                "[two-ranks-one-machine](../allreduce/two-ranks-one-machine.md) and "
                "[two-nodes-slurm](../allreduce/two-nodes-slurm.md).\n\n" + cpu_markdown(cpu) + "\n"),
        "perlmutter": (f"# bs64_opt weak scaling on Perlmutter, predicted\n\n{made} Local batch 64, 25 MB buckets, "
                       f"one A100 at 782 samples/s, the network at the fitted {percent(share)} of its datasheet; "
                       "strong scaling: global batch 1024 at the same samples/s per GPU.\n\n"
                       + scaling_markdown(tables["perlmutter"]) + "\n"),
        "h100": (f"# bs64_opt weak scaling on DGX H100 nodes, predicted\n\n{made} Local batch 64, 25 MB buckets, "
                 f"one H100 at 782 x 989 / 312 = {rates['h100']:.0f} samples/s (the A100's model FLOP "
                 f"utilisation), the network at the share fitted on Perlmutter ({percent(share)}).\n\n"
                 + scaling_markdown(tables["h100"]) + "\n"),
    }
    for name, ranked in knobs.items():
        network = "network at its datasheet bandwidth" if name.endswith("datasheet") else "network at the fitted share"
        texts[f"knobs-{name}"] = (f"# The knobs at 32 nodes ({32 * machines[name].gpus_per_node} GPUs): "
                                  f"{machines[name].name}, {network}"
                                  f"\n\n{made}\n\n" + knobs_markdown(ranked) + "\n")
    os.makedirs(out_dir, exist_ok=True)
    for name, text in texts.items():
        with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
            f.write(text)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(result, f, indent=1)
    if image:
        figure(image, tables)
    return result


def figure(path, tables=None):
    """The README's plot: bs64_opt on Perlmutter and on DGX H100 nodes, the network at the fitted share."""
    if tables is None:
        share = fit_published()["network_share"]
        tables = {name: scaling_table(resolve_machine(name, share)[0], 64, ONE_GPU_RATE[name])
                  for name in ("perlmutter", "h100")}
    plot({"Perlmutter A100 (network as fitted)": tables["perlmutter"],
          "DGX H100 (network at the same share)": tables["h100"]}, path,
         "bs64_opt weak scaling, local batch 64, predicted")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--machine", choices=sorted(MACHINES), default="perlmutter")
    parser.add_argument("--one_gpu_rate", type=float, help="one GPU's samples/s at this local batch (default: "
                        "782, the original's A100 at local batch 64; on h100 that times 989/312)")
    parser.add_argument("--local_batch_size", type=int, default=64)
    parser.add_argument("--global_batch_size", type=int, default=1024, help="for the strong-scaling columns")
    parser.add_argument("--bucket_cap_mb", type=float, default=25.0)
    parser.add_argument("--first_bucket_mb", type=float, default=1.0, help="DDP's first bucket (1 MiB in the "
                        "original's torch)")
    parser.add_argument("--ddp_comm_hook", choices=("none", "bf16", "fp16"), default="none")
    parser.add_argument("--disable_broadcast_buffers", action="store_true")
    parser.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp")
    parser.add_argument("--network_share", default="fitted", help="the share of the datasheet's network "
                        "bandwidth reached, a number or 'fitted' (to the original's 32-node run)")
    parser.add_argument("--check", action="store_true", help="print the check against the published numbers")
    parser.add_argument("--knobs", action="store_true", help="print the knobs' ranking at 32 nodes")
    parser.add_argument("--report", action="store_true", help="write benchmarks/results/scaling_model/ and "
                        "tutorial_images/scaling_model.png")
    parser.add_argument("--out", help="a plot of the scaling table (png; a bare file name goes to runs/benchmarks/)")
    args = parser.parse_args(argv)

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if args.report:
        report(os.path.join(root, "benchmarks", "results", "scaling_model"),
               os.path.join(root, "tutorial_images", "scaling_model.png"))
        print("wrote benchmarks/results/scaling_model/ and tutorial_images/scaling_model.png")
        return
    if args.check:
        print(check_markdown(fit_published()))
        return
    machine, share = resolve_machine(args.machine, args.network_share)
    rate = args.one_gpu_rate or ONE_GPU_RATE[args.machine]
    if args.knobs:
        print(knobs_markdown(knob_table(machine, rate)))
        return
    options = {"bucket_cap_mb": args.bucket_cap_mb, "first_bucket_mb": args.first_bucket_mb,
               "ddp_comm_hook": args.ddp_comm_hook, "broadcast_buffers": not args.disable_broadcast_buffers,
               "parallel": args.parallel}
    rows = scaling_table(machine, args.local_batch_size, rate, args.global_batch_size, **options)
    print(f"{machine.name}: one GPU at {rate:.0f} samples/s, the network at {percent(share)} of its datasheet "
          f"bandwidth; local batch {args.local_batch_size}, " + " ".join(f"{k}={v}" for k, v in options.items()) + "\n")
    print(scaling_markdown(rows))
    if args.out:
        from benchmarks.common import relative, user_file

        plot({machine.name: rows}, user_file(args.out), f"local batch {args.local_batch_size}, predicted")
        print(f"Plot: {relative(user_file(args.out))}")


if __name__ == "__main__":
    sys.exit(main())
