"""A scaling model on paper: one DDP training step's time on N GPUs, from one GPU's throughput, its data
loader's and the network's, checked against the original tutorial's final weak-scaling curves.

    python -m benchmarks.scaling_model                      # bs64_opt weak scaling on Perlmutter, 1 .. 1024 GPUs
    python -m benchmarks.scaling_model --check              # every published point: model, published, error
    python -m benchmarks.scaling_model --check --json       # the same as a JSON list
    python -m benchmarks.scaling_model --knobs              # which knob recovers what, at 32 nodes
    python -m benchmarks.scaling_model --network machine.json   # a measured network profile (benchmarks.allreduce)
    python -m benchmarks.scaling_model --machine h100 --local_batch_size=128 --ddp_comm_hook=bf16

One optimiser step on N GPUs takes

    compute                (local batch / one GPU's samples/s with nothing else to do: synthetic data, --noddp;
                            its last part, the optimiser's step, after the all-reduce)
  + DDP's work on the GPU  (copying the gradients into the buckets and back, and the all-reduce's NVLink
                            traffic within the node: NCCL's kernels take the SMs and memory bandwidth the
                            backward pass needs, so this does not hide)
  + the network's part of the all-reduce that the backward pass does not hide
  + the broadcast of buffers before the forward pass (DDP's broadcast_buffers; the U-Net has none)

and, with real data, no less than the loader needs for the local batch; where the loader reads its files
over the same network cards as the all-reduce (Perlmutter: its Lustre file system is reached over
Slingshot), no less than the loader's time plus the time the all-reduce's bytes hold the network.

The buckets are DDP's own assignment (``torch.distributed._compute_bucket_assignment_by_size``) of the
U-Net's real parameters, in the order their gradients become ready, which hooks record during a real
backward pass together with the share of the backward FLOPs done at that moment. Each bucket's
all-reduce across nodes starts when its last gradient is ready and the one before it is done, and
costs what NCCL 2.15.5's cost model (src/graph/tuning.cc, the version the original ran) says of a ring
or of a tree, whichever is faster, as NCCL's tuner picks them call by call: NCCL_LATENCY's comment
names each term's line and the terms left out.

One term is fitted to the original's final curves (NERSC/sc22-dl-tutorial commit 2074095, read off its
plots by benchmarks/read_scaling_plots.py into benchmarks/sc22_scaling_points.json): the ring's bus
bandwidth between nodes in NCCL's cost model, as a share of Slingshot's 100 GB/s per node, one for every
job, to the real-data runs at 8, 16 and 32 nodes together, with its standard error. It is a coefficient of
the model (a tree's bytes move at 0.92 x 0.7-0.9 of it), not a measured bandwidth. The latencies are not
fitted. Two published points are inputs: one GPU's compute (the synthetic --noddp run) and one GPU's
loader (the loader-alone ideal line); so is one measurement of this code: the share of a step's compute
paid once per step whatever the batch (PER_STEP_SHARE, from one H100's ladder at batch 64 and 8). Each
published point's standard error combines its reading error with the run-to-run spread of the original's
repeated runs (RUN_TO_RUN) and, for a prediction, with what the same spread in either input moves it by
(input_errors). ``--check`` opens with the synthetic runs' pattern against the model, lists every point
with its residual and errors, judges the independent predictions only (the synthetic runs and the runs at
local batch 16) under that spread and under the scaling data's own scatter, and ends with the fit (also
with the published loader-alone points) and the hypotheses for the misses: each computable one with its
share refitted and its residual at every judged prediction, each with its test.
"""
import argparse
import dataclasses
import functools
import inspect
import json
import math
import os
import sys

MIB = 2 ** 20
GPU_COUNTS = [2 ** i for i in range(11)]  # 1 .. 1024
NODE_COUNTS = [1, 2, 4, 8, 16, 32]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POINTS = os.path.join(os.path.dirname(os.path.realpath(__file__)), "sc22_scaling_points.json")  # beside this file


def published_curves(path=POINTS):
    """The original's final curves, {curve: {nodes: samples/s}}, each point the mean of the two plots
    where both draw it, and its reading error (samples/s, the largest disagreement of the reader's checks).
    The synthetic and loader runs' 1-node points are their ideal lines' 32-node points / 32: the markers
    at 1 node overlap, the ideal lines' end points stand alone (and N x the 1-node point is what an ideal
    line is)."""
    with open(path) as f:
        read = json.load(f)
    curves = {}
    for plot in ("eff", "comm"):
        for name, points in read[plot].items():
            for nodes, value in points.items():
                if value is not None:
                    curves.setdefault(name, {}).setdefault(int(nodes), []).append(value)
    curves = {name: {n: sum(v) / len(v) for n, v in sorted(points.items())} for name, points in curves.items()}
    for name in ("synthetic", "loader"):
        curves[name][1] = curves[f"{name}_ideal"][32] / 32
    return curves, read["reading_error_samples_per_s"]


CURVES, READING_ERROR = published_curves()


# The tree's bus bandwidth per channel in NCCL 2.15.5's cost model on Ampere, for 1, 2 and more nodes
# (src/graph/tuning.cc l.88-92; NCCL_LATENCY's comment).
TREE_CHANNEL_BW = (24.0, 23.6, 17.8)


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
    call_latency: float = 0.0    # the fixed cost of one ring all-reduce call, whatever its size
    memory_bw: float = None      # one GPU's memory bandwidth (GB/s); None: a CPU rank, whose all-reduce
    #                              runs beside its compute (nothing charged to DDP's work on the GPU)
    ring_only: bool = False      # across nodes a ring only (gloo, a measured profile); else, as NCCL's tuner
    #                              picks per call, the faster of ring and tree
    loader_shares_network: bool = False  # the loader reads over the network cards the all-reduce uses
    tree_intra_latency: float = None  # one hop of a tree within a node (None: the ring's)
    tree_inter_latency: float = None  # one hop of a tree between nodes (None: the ring's)
    tree_bw_share: float = 1.0   # the share of the bus bandwidth a tree reaches against a ring
    ring_plateau: float = 1.0    # a large ring all-reduce across nodes: its latency times this (NCCL: 1.9)
    tree_correction: tuple = ()  # a tree's bandwidth times entry log2(bytes / 64) (NCCL's Simple row; () none)
    tree_channels: int = 0       # the tree's channels, each capped at tree_channel_bw (0: no cap)
    tree_channel_bw: tuple = TREE_CHANNEL_BW  # GB/s a channel, for 1, 2 and more nodes (Ampere's)
    reported_latency: float = None  # a network plugin's reported latency (s): NCCL's tuner chooses ring or tree
    #                                 with it in place of both network hops' latencies; the time keeps them


# Perlmutter's GPU node (https://docs.nersc.gov/systems/perlmutter/architecture/): 4 A100-SXM4-40GB
# joined by NVLink 3 (12 links of 25 GB/s per direction per GPU: 300 GB/s; 1555 GB/s of HBM2: NVIDIA A100
# datasheet) and 4 HPE Slingshot 11 NICs of 200 Gb/s (25 GB/s) each: 100 GB/s per node; its Lustre file
# system (/pscratch) is reached over the same Slingshot network. Loader: the original's final loader-alone
# curve, its ideal line's 1-node point per GPU
# (4 loaders per node share the node's CPUs and file system: one A100's alone reached 937 samples/s in the
# original's benchy IO trial).
#
# The network: the all-reduce's time as NCCL 2.15.5's tuner computes it for its Simple protocol, which
# carries the large buckets (src/graph/tuning.cc at tag v2.15.5-1; nccl 2.15.5 is what the original's
# export_DDP_vars.sh loaded from commit ac5cc0a on, the commit that added the OFI plugin). A ring over N
# ranks on n nodes: 8.4 us a call (l.56) plus 2(N-1) steps, 2n of them network hops of 9.6 us (l.71, 129-134)
# and the rest NVLink hops of 3.4 us (l.65), and 2(N-1)/N x bytes / bus bandwidth; across nodes its
# latency x 1.9 once the message reaches N/16 x 64 KiB (the "plateau", l.325-326). A tree: 2((N/n - 1) +
# log2(n)) hops of 28 us, NVLink or network alike (l.65, 71, 183-184), nothing a call, and 2 x bytes /
# (0.92 x bus bandwidth) (l.148), that bandwidth times a factor of the message's size class (l.308-314,
# 323): TREE_CORRECTION. Within a node NCCL's cost model assumes an Ampere ring's bus bandwidth to be at
# most 235 GB/s (l.145). The tuner takes, call by call, the algorithm its model says is faster; so does
# this model. All-gathers and reduce-scatters (FSDP) have the ring only (l.137): N-1 steps, n-1 of them
# network hops, (N-1)/N x bytes. Left out: the tree's cap per channel (l.88-92, 148: min(0.92 x bus
# bandwidth, channels x 17.8 GB/s) on Ampere beyond 2 nodes), which needs the channel count only the job's
# log shows (the hypotheses bracket it: TREE_CHANNEL_BW); the bandwidth NCCL takes within the node for
# jobs of up to 2 nodes (it uses the search's intra-node speed there); the LL and LL128 protocols (whose
# caps depend on the CPU's vendor, l.82-86, 114-117); and a network plugin's own latency. A plugin that
# reports one (NCCL's IB transport reports 0; aws-ofi-nccl's AWS-branch releases of 2022 reported 150 us,
# tuned so that NCCL picks ring or tree well on EFA) replaces both network hops' latencies in the tuner's
# table (l.167, search.cc:468), which NCCL uses only to choose the algorithm (enqueue.cc's getAlgoInfo):
# it changes the choice, not the time on the wire (Machine.reported_latency). Which plugin the original's
# nccl-2.15.5-plugin build held is not recorded.
NCCL_VERSION = "2.15.5"
TREE_CORRECTION = (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9)
NCCL_LATENCY = {"intra_latency": 3.4e-6, "inter_latency": 9.6e-6, "call_latency": 8.4e-6,
                "tree_intra_latency": 28e-6, "tree_inter_latency": 28e-6, "tree_bw_share": 0.92,
                "ring_plateau": 1.9, "tree_correction": TREE_CORRECTION}
AMPERE_BUS_BW = 235.0  # GB/s, the A100 ring's bus bandwidth NCCL's cost model assumes (NVLink 3's datasheet: 300)
PERLMUTTER = Machine("Perlmutter (4 x A100 per node)", 4, AMPERE_BUS_BW, 100.0, loader_rate=CURVES["loader"][1] / 4,
                     source="docs.nersc.gov/systems/perlmutter/architecture; NVIDIA A100 datasheet; "
                     "the original's loader-alone curve", memory_bw=1555.0, loader_shares_network=True,
                     **NCCL_LATENCY)
# An NVIDIA DGX H100 node (NVIDIA DGX H100 user guide): 8 H100-SXM5 (3350 GB/s of HBM3, NVIDIA H100
# datasheet) on NVLink 4 (900 GB/s both directions: 450 GB/s each way) through NVSwitch, and 8 ConnectX-7
# NICs of 400 Gb/s (50 GB/s) for the compute network: 400 GB/s per node; storage has its own NICs.
# Loader: DALI is not measured on an H100 yet (this code's host loader is: 8 lowmem workers, 310 samples/s
# in its IO trial; on one H200 machine of 16 cores this code's DALI pipeline alone delivered 1849.5
# samples/s with 8 threads, benchmarks/results/loaders/, 2026-11-26); the A100's DALI pipeline alone
# reached 937 samples/s (the original's benchy IO trial), kept as the bound: a DGX node's cores per GPU
# and file system are not that machine's.
H100 = Machine("DGX H100 (8 x H100 per node)", 8, 450.0, 400.0, loader_rate=937.0,
               source="NVIDIA DGX H100 user guide (NVLink 4, 8 x ConnectX-7 400 Gb/s); H100 datasheet",
               memory_bw=3350.0, **NCCL_LATENCY)
MACHINES = {"perlmutter": PERLMUTTER, "h100": H100}

# One GPU's samples/s of bs64_opt (DALI, AMP fp16, apex, JIT) at local batch 64 when it only computes:
# the original's final synthetic --noddp curve at 32 nodes, per GPU (no communication: its points are
# N times one GPU's).
A100_RATE = CURVES["synthetic_noddp"][32] / 128
# On an H100, this code's own compute rate, measured: the ladder's SYNTHETIC trial of the rung with
# bs64_opt's precision and optimiser (AMP fp16, fused Adam; its TorchScript loss changed nothing in
# bf16), one H100 80GB HBM3, 2026-11-25, in the committed results file.
H100_RESULTS = os.path.join(os.path.dirname(os.path.realpath(__file__)), "results",  # beside this file
                            "nvidia-h100-80gb-hbm3-2026-11-25.json")
H100_RUNG = "gpu-inmem + AMP fp16 + fused Adam"


def measured_rate(path=H100_RESULTS, rung=H100_RUNG, trial="synthetic"):
    """samples/s of ``rung``'s ``trial`` (SYNTHETIC by default) in a ladder results file."""
    with open(path) as f:
        return next(run[trial] for run in json.load(f)["runs"] if run["name"] == rung)


H100_RATE = measured_rate()
# This code's DALI pipeline alone (the IO trial of its loaders' ladder: 8 threads, one H200 machine of 16
# cores, 2026-11-26): the H100 tables' second loader assumption, against the A100's 937.
LOADER_RESULTS = os.path.join(os.path.dirname(os.path.realpath(__file__)), "results", "loaders",
                              "nvidia-h200-2026-11-26.json")
H100_LOADER_MEASURED = measured_rate(LOADER_RESULTS, "DALI (bf16, fused)", "io")

# A step's compute is a cost per sample plus a cost per step that does not shrink with the batch (kernel
# launches, the deepest layers' grids too small to fill the GPU). Their split, measured with this code on
# the same H100: SYNTHETIC (compute alone) in bf16 with fused Adam at batch 64 and at batch 8, two rungs
# of the same ladder run; two points give both costs. The model assumes the same split on any GPU: a rate
# known at RATE_BATCH gives the compute at another local batch.
RATE_BATCH = 64
PER_STEP_RUNGS = ("+ fused Adam (bf16)", "batch 8: gpu-inmem bf16 fused")


def per_step_share(path=H100_RESULTS, rungs=PER_STEP_RUNGS, batches=(64, 8)):
    """The share of a batch-``batches[0]`` step's compute that is paid once per step, from two ladder rungs."""
    big, small = batches
    t_big, t_small = (batch / measured_rate(path, rung) for batch, rung in zip(batches, rungs))  # s per step
    per_sample = (t_big - t_small) / (big - small)
    return (t_small - small * per_sample) / t_big


PER_STEP_SHARE = per_step_share()


def compute_time(local_batch, one_gpu_rate, rate_batch=None):
    """Seconds of compute for ``local_batch`` samples on one GPU computing ``one_gpu_rate`` samples/s at
    local batch ``rate_batch`` (None: at every batch, all of it per sample)."""
    if rate_batch is None:
        return local_batch / one_gpu_rate
    at_rate_batch = rate_batch / one_gpu_rate
    return at_rate_batch * (PER_STEP_SHARE + (1 - PER_STEP_SHARE) * local_batch / rate_batch)


ONE_GPU_RATE = {"perlmutter": A100_RATE, "h100": H100_RATE}


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
    """DDP's first (smallest) bucket in the installed torch when ``bucket_cap_mb`` is given, as train.py
    gives it: 1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``) in the torch of 2022 that the original ran (its
    8 NCCL calls per step at 25 MB and 5 at 100 MB); the whole ``bucket_cap_mb`` since PyTorch pull request
    #121640 (2024, "[DDP] Bucket handling: make first bucket size equal to bucket_cap_mb if it was set"),
    which made DDP's ``bucket_cap_mb`` default to None so that a given cap can be told from the default.
    Read off that default, so that it holds for every torch since, whether the cap then lives in
    ``bucket_bytes_cap_default`` or in ``_BucketCapacityConfig`` (tests/test_scaling_model.py checks it
    against a real DDP's count of all-reduces)."""
    from torch.nn.parallel import DistributedDataParallel

    default = inspect.signature(DistributedDataParallel.__init__).parameters["bucket_cap_mb"].default
    return float(bucket_cap_mb) if default is None else 1.0


@functools.lru_cache(maxsize=None)
def buckets(network, bucket_cap_mb=25.0, first_bucket_mb=1.0):
    """DDP's buckets, as DDP assigns them when it rebuilds them after the first step: the gradients
    in the order they became ready, cut by torch's own function at ``first_bucket_mb`` for the first
    bucket and ``bucket_cap_mb`` after it. A tuple of (bytes, ready), ready being the share of the
    backward pass done when the bucket's last gradient is ready: its all-reduce can start then."""
    import torch
    import torch.distributed as dist

    tensors = [torch.empty(g.bytes // 4, device="meta") for g in network.gradients]  # fp32 gradients
    limits = [int(first_bucket_mb * MIB), int(bucket_cap_mb * MIB)]
    assignment = dist._compute_bucket_assignment_by_size(tensors, limits, [False] * len(tensors))[0]
    return tuple((sum(network.gradients[i].bytes for i in indices), max(network.gradients[i].ready for i in indices))
                 for indices in assignment)


def nccl_times(size, gpus, machine, collective="all-reduce"):
    """``size`` bytes over ``gpus`` GPUs as NCCL's tuner times them (NCCL_LATENCY's comment): a dict of
    algorithm -> (bandwidth term s, latency term s), the tree only for an all-reduce across nodes of a
    machine that is not ``ring_only``. ``collective``: "all-reduce", or "all-gather" / "reduce-scatter"
    (``size`` the whole tensor's bytes: half an all-reduce's steps and bytes, no plateau)."""
    nodes = math.ceil(gpus / machine.gpus_per_node)
    bandwidth = 1e9 * (machine.nvlink_bw if nodes == 1 else min(machine.nvlink_bw, machine.node_network_bw))
    if collective == "all-reduce":
        steps, network_steps, moved = 2 * (gpus - 1), 0 if nodes == 1 else min(2 * (gpus - 1), 2 * nodes), 2
    else:
        steps, network_steps, moved = gpus - 1, nodes - 1, 1
    latency = machine.call_latency + (steps - network_steps) * machine.intra_latency \
        + network_steps * machine.inter_latency
    if collective == "all-reduce" and nodes > 1 and size >= gpus / 16 * 65536:
        latency *= machine.ring_plateau
    times = {"ring": (moved * (gpus - 1) / gpus * size / bandwidth, latency)}
    if collective == "all-reduce" and nodes > 1 and not machine.ring_only:  # within a node a tree is a chain
        intra = machine.intra_latency if machine.tree_intra_latency is None else machine.tree_intra_latency
        inter = machine.inter_latency if machine.tree_inter_latency is None else machine.tree_inter_latency
        size_class = int(math.log2(max(size, 64) / 64))
        correction = machine.tree_correction[size_class] if size_class < len(machine.tree_correction) else 1.0
        per_node = min(gpus, machine.gpus_per_node)
        tree_bw = machine.tree_bw_share * bandwidth
        if machine.tree_channels:  # l.148: min(0.92 x bus bandwidth, channels x the cap a channel)
            tree_bw = min(tree_bw, 1e9 * machine.tree_channels * machine.tree_channel_bw[min(nodes, 3) - 1])
        times["tree"] = (2 * size / (correction * tree_bw), 2 * ((per_node - 1) * intra + math.log2(nodes) * inter))
    return times


def algorithm(size, gpus, machine, collective="all-reduce"):
    """The algorithm NCCL's tuner would take (its model, not a measurement): the fastest in nccl_times, with
    a plugin's reported latency (``machine.reported_latency``) in place of both network hops' latencies."""
    if machine.reported_latency is not None:
        machine = dataclasses.replace(machine, inter_latency=machine.reported_latency,
                                      tree_inter_latency=machine.reported_latency, reported_latency=None)
    return min(nccl_times(size, gpus, machine, collective).items(), key=lambda item: sum(item[1]))[0]


def allreduce_time(size, gpus, machine, bandwidth_only=False, collective="all-reduce"):
    """A collective of ``size`` bytes over ``gpus`` GPUs: within a node over NVLink, across nodes over the
    node's network cards, in the algorithm NCCL's tuner takes (``algorithm``), timed with the machine's own
    latencies (nccl_times). ``bandwidth_only``: that algorithm's bandwidth term alone, the time its bytes
    hold the links."""
    if gpus == 1:
        return 0.0
    times = nccl_times(size, gpus, machine, collective)
    chosen = times[algorithm(size, gpus, machine, collective)] if machine.reported_latency is not None \
        else min(times.values(), key=sum)
    return chosen[0] if bandwidth_only else sum(chosen)


def ddp_gpu_time(gradient_bytes, gpus, machine, wire_share=1.0):
    """What DDP costs the GPU itself per step, which the backward pass does not hide: copying the
    gradients into the buckets and back (4 x their bytes through memory) and the all-reduce's traffic
    over NVLink within the node (``wire_share`` of the gradients' bytes: 0.5 with a bf16 or fp16 comm
    hook), run by NCCL's kernels on the GPU's own SMs. Nothing on a CPU machine (``memory_bw`` None),
    whose whole all-reduce is in the overlap timeline."""
    if gpus == 1 or machine.memory_bw is None:
        return 0.0
    per_node = min(gpus, machine.gpus_per_node)
    wire = wire_share * gradient_bytes
    nvlink = 2 * (per_node - 1) / per_node * wire / (1e9 * machine.nvlink_bw) if per_node > 1 else 0.0
    return 4 * gradient_bytes / (1e9 * machine.memory_bw) + nvlink


def network_time(size, gpus, machine, bandwidth_only=False):
    """The part of an all-reduce that overlaps the backward pass: across nodes, the network's; within
    one node on a GPU machine, none (it is in ddp_gpu_time); on a CPU machine, all of it."""
    if machine.memory_bw is not None and gpus <= machine.gpus_per_node:
        return 0.0
    return allreduce_time(size, gpus, machine, bandwidth_only)


def broadcast_time(size, gpus, machine):
    """DDP's broadcast of the buffers from rank 0 before every forward: nothing if there are none
    (DDP skips the call, as for the U-Net), else a tree's log2(N) hops and the bytes once."""
    if gpus == 1 or size == 0:
        return 0.0
    nodes = math.ceil(gpus / machine.gpus_per_node)
    bandwidth = 1e9 * (machine.nvlink_bw if nodes == 1 else machine.node_network_bw)
    return size / bandwidth + math.log2(gpus) * machine.inter_latency


def comm_timeline(jobs, start=0.0):
    """One communication stream: each job (ready time, duration) starts when it is ready and the one
    before it has finished. Returns when the last one ends."""
    end = start
    for ready, duration in jobs:
        end = max(ready, end) + duration
    return end


# The optimiser's step runs once per optimiser step, after DDP's reducer has waited for every bucket:
# it cannot hide the all-reduce. Its time is estimated, not measured, as the bytes it moves through
# the GPU's memory: fused Adam reads the parameter, its gradient and two moments and writes the
# parameter and the moments (28 B a parameter in fp32), and fp16's GradScaler reads and writes each
# gradient to unscale it (8 B). It is part of the measured per-step cost (PER_STEP_SHARE).
OPTIMISER_BYTES_PER_PARAMETER = 28 + 8


def optimiser_time(gradient_bytes, machine):
    """Seconds of the optimiser's step for ``gradient_bytes`` of fp32 gradients (none on a CPU machine,
    whose measured step holds it)."""
    if machine.memory_bw is None:
        return 0.0
    return OPTIMISER_BYTES_PER_PARAMETER * gradient_bytes / 4 / (1e9 * machine.memory_bw)


# When each gradient becomes ready in time rather than in FLOPs: the committed per-layer table of one H100
# (benchmarks.layers, bf16, batch 64, 64^3, each convolution's forward and backward timed alone, 2026-11-25;
# that tool then fed every layer an fp32 input, which overstates the first and last layers: they sit at the
# two ends of the backward pass). Each layer's backward is its time's share of its FLOPs that are backward.
LAYER_RESULTS = os.path.join(os.path.dirname(os.path.realpath(__file__)), "results", "layers",
                             "nvidia-h100-80gb-hbm3-2026-11-25-bf16.json")


def layer_name(parameter, up_blocks):
    """The per-layer table's name of a U-Net parameter's layer: down.0 is "down 1", up.0 (the deepest)
    "up 5" of 5, last "last"."""
    kind, index = (parameter.split(".") + [""])[:2]
    if kind == "down":
        return f"down {int(index) + 1}"
    if kind == "up":
        return f"up {up_blocks - int(index)}"
    return kind


def timed_readiness(network, path=LAYER_RESULTS):
    """``network`` with each gradient's readiness in time, from a per-layer table of forward + backward times
    (benchmarks.layers' JSON): the layers' backward times summed in the order their gradients become ready.
    A layer's backward time is its table time times the share of its FLOPs that are backward (twice its
    forward, once for the first layer, which computes no input gradient), read off ``network``'s own FLOP
    shares. Returns the network and {layer: backward share of its time}."""
    with open(path) as f:
        table = {row["layer"]: row for row in json.load(f)["layers"]}
    up_blocks = len({g.name.split(".")[1] for g in network.gradients if g.name.startswith("up.")})
    backward_gflop = sum(row["gflop"] for row in table.values()) * (1 - network.forward_share)
    order, done = [], {}  # the layers in the order their gradients are ready, and each one's FLOP share done
    for g in network.gradients:
        layer = layer_name(g.name, up_blocks)
        if layer not in done:
            order.append(layer)
        done[layer] = max(done.get(layer, 0.0), g.ready)
    shares, elapsed, before = {}, {}, 0.0
    total = 0.0
    for layer in order:
        shares[layer] = (done[layer] - before) * backward_gflop / table[layer]["gflop"]
        before = done[layer]
        total += shares[layer] * table[layer]["ms"]
        elapsed[layer] = total
    gradients = tuple(dataclasses.replace(g, ready=elapsed[layer_name(g.name, up_blocks)] / total)
                      for g in network.gradients)
    return dataclasses.replace(network, gradients=gradients), shares


def fsdp_units(network):
    """train.py's FSDP units (utils/distributed.py's shard_model): one per U-Net block (``down.i``,
    ``up.i``) and the root holding the rest; (bytes, ready) each, in the order their gradients are ready."""
    units = {}
    for g in network.gradients:
        parts = g.name.split(".")
        key = ".".join(parts[:2]) if parts[0] in ("down", "up") else "root"
        size, ready = units.get(key, (0, 0.0))
        units[key] = (size + g.bytes, max(ready, g.ready))
    return sorted(units.values(), key=lambda unit: unit[1])


@dataclasses.dataclass(frozen=True)
class Step:
    compute: float       # s, one GPU's compute for one optimiser step (all its micro-batches, the optimiser)
    exposed: float       # s, network communication the backward pass does not hide
    broadcast: float     # s
    step: float          # s, the whole step with its data on the GPU (synthetic data)
    samples_per_s: float  # of the whole job, with the loader's bound where the machine has one
    buckets: int         # all-reduces per step (FSDP: units, each gathered and reduce-scattered)
    ddp_gpu: float = 0.0  # s, DDP's work on the GPU (ddp_gpu_time)
    loader: float = 0.0  # s, the loader's time for the step's samples, plus the network's bytes where it shares it
    synthetic_samples_per_s: float = 0.0  # of the whole job, without the loader's bound
    optimiser: float = 0.0  # s, the optimiser's step, part of compute, after the backward pass


def step_time(machine, gpus, local_batch, one_gpu_rate, network=None, bucket_cap_mb=25.0, first_bucket_mb=1.0,
              ddp_comm_hook="none", broadcast_buffers=True, parallel="ddp", grad_accum_steps=1, rate_batch=None):
    """One optimiser step on ``gpus`` GPUs, at ``one_gpu_rate`` samples/s per GPU when it only computes
    (at local batch ``rate_batch``; None: at any batch, see compute_time).

    DDP: each bucket's all-reduce starts when its last gradient is ready (forward, then that share of
    the backward) and the bucket before it is done; what runs past the end of the backward pass is
    exposed, and the optimiser's step (optimiser_time) comes after it. ``ddp_comm_hook`` bf16 or fp16
    halves the bytes on the wire. ``grad_accum_steps`` K, as train.py's flag does it
    (utils/accumulation.py): the local batch is split into K micro-batches of ``local_batch`` / K, run one
    after the other; the step's samples and the loader's work stay those of ``local_batch``, each
    micro-batch pays the compute's per-step cost again but the optimiser's once, and the one all-reduce
    per bucket is that of the last micro-batch's backward pass, which alone can hide it.
    ``parallel="fsdp"`` (no buckets, no comm hook, no broadcast: those are DDP's): one unit per U-Net
    block and the root (fsdp_units); the forward all-gathers every unit (overlapping the forward compute),
    the backward all-gathers them again (prefetched from its start) and reduce-scatters each unit's
    gradients once they are ready; both are ring collectives (NCCL 2.15.5 has no tree for them).
    """
    network = network or unet()
    total_bytes = sum(g.bytes for g in network.gradients)
    optimiser = optimiser_time(total_bytes, machine)
    micro = compute_time(local_batch / grad_accum_steps, one_gpu_rate, rate_batch) - optimiser  # forward, backward
    backward_end = grad_accum_steps * micro
    compute = backward_end + optimiser
    forward = backward_end - micro * (1 - network.forward_share)
    backward = backward_end - forward
    if parallel == "fsdp":
        units = fsdp_units(network)
        gather = [allreduce_time(size, gpus, machine, collective="all-gather") for size, _ in units]
        forward_wait = max(0.0, sum(gather) - micro * network.forward_share)  # the all-gathers outrun the forward
        reduce_scatters = [(forward + ready * backward,
                            allreduce_time(size, gpus, machine, collective="reduce-scatter")) for size, ready in units]
        end = comm_timeline([(forward, sum(gather))] + reduce_scatters)
        exposed = forward_wait + max(0.0, end - backward_end)
        # Its collectives run on the GPU's SMs as DDP's do: copies in and out, and 1.5 times DDP's bytes over
        # NVLink within the node.
        broadcast, count, ddp_gpu = 0.0, len(units), ddp_gpu_time(total_bytes, gpus, machine, 1.5)
        busy = sum(allreduce_time(size, gpus, machine, True, c) for size, _ in units
                   for c in ("all-gather", "all-gather", "reduce-scatter")) if gpus > machine.gpus_per_node else 0.0
    else:
        scale = 0.5 if ddp_comm_hook in ("bf16", "fp16") else 1.0
        cut = buckets(network, bucket_cap_mb, first_bucket_mb)
        end = comm_timeline([(forward + ready * backward, network_time(scale * size, gpus, machine))
                             for size, ready in cut])
        exposed = max(0.0, end - backward_end)
        broadcast = broadcast_time(network.buffer_bytes, gpus, machine) if broadcast_buffers else 0.0
        count = len(cut)
        ddp_gpu = ddp_gpu_time(total_bytes, gpus, machine, scale)
        busy = sum(network_time(scale * size, gpus, machine, bandwidth_only=True) for size, _ in cut)
    step = compute + ddp_gpu + exposed + broadcast
    samples = gpus * local_batch  # whatever grad_accum_steps: it splits the local batch
    loader = 0.0
    if machine.loader_rate:
        crossing = gpus > machine.gpus_per_node and machine.loader_shares_network
        loader = local_batch / machine.loader_rate + (busy if crossing else 0.0)
    return Step(compute, exposed, broadcast, max(step, loader), samples / max(step, loader), count, ddp_gpu,
                loader, samples / step, optimiser)


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


def fitted_machine(share, machine=PERLMUTTER, ring_only=False, **changes):
    """``machine`` with its network at ``share`` of the datasheet's bandwidth between nodes, whatever the
    job's size; across nodes the faster of ring and tree call by call (NCCL's tuner) or, ``ring_only``, a
    ring; ``changes``: other fields replaced (a hypothesis's latencies)."""
    return dataclasses.replace(machine, node_network_bw=machine.node_network_bw * share, ring_only=ring_only,
                               **changes)


def curve_model(curve, nodes, machine, rate=A100_RATE, local_batch=64, loader="ideal", network=None):
    """The model's samples/s for one of the original's curves at ``nodes`` Perlmutter nodes. ``loader``:
    "ideal", one GPU's loader times N (the loader-alone ideal line); "published", the loader-alone
    curve's own point where the plots show it (16 and 32 nodes). ``network``: step_time's (None: the U-Net's
    gradients, ready as their FLOPs say)."""
    gpus = nodes * machine.gpus_per_node
    if loader == "published" and nodes in CURVES["loader"] and nodes > 1:
        machine = dataclasses.replace(machine, loader_rate=CURVES["loader"][nodes] / gpus)
    if curve == "synthetic_noddp":
        return gpus * rate
    if curve in ("loader", "loader_ideal"):
        return gpus * machine.loader_rate
    if curve == "real_noddp":
        return gpus * min(rate, machine.loader_rate)
    step = step_time(machine, gpus, local_batch, rate, network, rate_batch=RATE_BATCH)
    return step.synthetic_samples_per_s if curve == "synthetic" else step.samples_per_s


# What the original published besides the curves: its final README's text (32 nodes, local batch 64: "around
# 84%" for the real-data efficiency, "around 12%" for the communication overhead of the synthetic runs, the
# solid against the dotted orange line) and the runs at local batch 16 that every README from commit 6608f46
# (2022-11-11) to the last holds, run under nsys (ENABLE_PROFILING=1): each run's two logged epochs (2 and
# 3), with its GPUs, --bucket_cap_mb (25: the default) and broadcast_buffers.
TEXT = {"efficiency_real": 0.84, "comm_overhead_synthetic": 0.12}
RUNS_16 = (
    {"gpus": 4, "bucket_cap_mb": 25, "broadcast_buffers": True, "epochs": (2004.6, 1923.9)},
    {"gpus": 4, "bucket_cap_mb": 25, "broadcast_buffers": False, "epochs": (2037.1, 2037.1)},
    {"gpus": 4, "bucket_cap_mb": 100, "broadcast_buffers": False, "epochs": (2059.1, 2056.8)},
    {"gpus": 8, "bucket_cap_mb": 25, "broadcast_buffers": True, "epochs": (3501.1, 3353.3)},
    {"gpus": 8, "bucket_cap_mb": 100, "broadcast_buffers": False, "epochs": (3529.3, 3588.4)},
)


def run_name(run):
    bucket = "" if run["bucket_cap_mb"] == 25 else f"_bucket_{run['bucket_cap_mb']}"
    return f"{run['gpus']}_gpus_local_batch_16{bucket}" + ("" if run["broadcast_buffers"] else "_no_broadcast")


def run_to_run(runs=RUNS_16):
    """How far two runs of one setting differ: the relative standard deviation of the 4-GPU runs' logged
    epochs, which the model holds to be one setting (within a node the buckets and the broadcast change
    nothing in it: the U-Net has no buffers). Taken to hold for every published point."""
    values = [v for run in runs if run["gpus"] == 4 for v in run["epochs"]]
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) / mean


RUN_TO_RUN = run_to_run()


def sigma(published, reading):
    """A published samples/s point's standard error, relative: its reading error and the run-to-run
    spread combined."""
    return math.hypot(reading / published, RUN_TO_RUN)


# The points the one fitted term is fitted to: the real-data runs, where the step is the loader's time plus
# the time the all-reduce's bytes hold the network, so the share sets them (the synthetic runs hide most
# of the network behind the backward pass and are predicted).
FIT_POINTS = (("real", 8), ("real", 16), ("real", 32))


def share_to(curve, nodes, loader="ideal", rate=A100_RATE, network=None, **changes):
    """The network share that makes the model meet one published point alone (``rate``, ``network``:
    curve_model's; ``changes``: fitted_machine's ring_only and fields)."""
    return solve(lambda s: curve_model(curve, nodes, fitted_machine(s, **changes), rate, loader=loader,
                                       network=network), CURVES[curve][nodes], 0.05, 4.0)


def misfit(share, points=FIT_POINTS, loader="ideal", rate=A100_RATE, network=None, **changes):
    """The sum of the squared residuals at ``points``, each in units of its standard error."""
    machine = fitted_machine(share, **changes)
    return sum(((curve_model(c, n, machine, rate, loader=loader, network=network) / CURVES[c][n] - 1)
                / sigma(CURVES[c][n], READING_ERROR)) ** 2 for c, n in points)


def fit(points=FIT_POINTS, loader="ideal", rate=A100_RATE, network=None, **changes):
    """The one fitted term and its standard error: the ring's bus bandwidth between nodes in NCCL's cost
    model, as a share of Slingshot's 100 GB/s per node, the same in every job, minimising the squared
    residuals at ``points`` in units of their standard errors (sigma); its error from the curvature of that
    sum (the points taken as independent). ``loader``, ``rate``, ``network``: curve_model's; ``changes``:
    fitted_machine's ring_only and fields (a hypothesis's, or another loader_rate)."""
    return _fit(points, loader, rate, network, tuple(sorted(changes.items())))


@functools.lru_cache(maxsize=None)
def _fit(points, loader, rate, network, changes):
    fixed = {"loader": loader, "rate": rate, "network": network, **dict(changes)}
    alone = [share_to(*point, **fixed) for point in points]
    low, high = min(alone), max(alone)
    for _ in range(60):  # golden-section search for the minimum
        a, b = low + 0.382 * (high - low), high - 0.382 * (high - low)
        low, high = (low, b) if misfit(a, points, **fixed) < misfit(b, points, **fixed) else (a, high)
    share = (low + high) / 2
    h = 0.01 * share
    curvature = (misfit(share + h, points, **fixed) - 2 * misfit(share, points, **fixed)
                 + misfit(share - h, points, **fixed)) / h ** 2
    return share, math.sqrt(2 / curvature)


def row_16(machine, run, rate=A100_RATE, network=None):
    """samples/s of one run at local batch 16 (RUNS_16)."""
    return step_time(machine, run["gpus"], 16, rate, network, bucket_cap_mb=run["bucket_cap_mb"],
                     broadcast_buffers=run["broadcast_buffers"], rate_batch=RATE_BATCH).samples_per_s


# The independent predictions --check judges: the synthetic runs at 1, 8, 16 and 32 nodes, the two runs at
# local batch 16 on 2 nodes and the mean of the three on 1 node (the model holds them to be one setting).
FOUR_GPU_MEAN = "4_gpus_local_batch_16 (mean of the 3 runs)"
FOUR_GPU_RUNS = [run for run in RUNS_16 if run["gpus"] == 4]
JUDGED = [("synthetic", n) for n in (1, 8, 16, 32)] + [(run_name(r), 2) for r in RUNS_16 if r["gpus"] == 8] \
    + [(FOUR_GPU_MEAN, 1)]


def published_point(curve, nodes):
    """A published samples/s: a curve's point, or the mean of a local-batch-16 run's two logged epochs (of
    the three 4-GPU runs' six, for their mean)."""
    if curve == FOUR_GPU_MEAN:
        return sum(sum(run["epochs"]) for run in FOUR_GPU_RUNS) / (2 * len(FOUR_GPU_RUNS))
    run = next((run for run in RUNS_16 if run_name(run) == curve), None)
    return sum(run["epochs"]) / 2 if run else CURVES[curve][nodes]


JUDGED_LABELS = {**{f"synthetic {n}": f"synthetic, {n} node{'s' * (n > 1)}" for n in (1, 8, 16, 32)},
                 "8_gpus_local_batch_16 2": "local batch 16, 2 nodes",
                 "8_gpus_local_batch_16_bucket_100_no_broadcast 2": "local batch 16, 2 nodes, 100 MB, no broadcast",
                 f"{FOUR_GPU_MEAN} 1": "local batch 16, 1 node (3 runs)"}


def judged_model(machine, rate=A100_RATE, network=None):
    """The model's value of each judged prediction (JUDGED): {(curve, nodes): samples/s}."""
    values = {}
    for curve, nodes in JUDGED:
        if curve == "synthetic":
            values[(curve, nodes)] = curve_model(curve, nodes, machine, rate, network=network)
        else:
            run = FOUR_GPU_RUNS[0] if curve == FOUR_GPU_MEAN else next(r for r in RUNS_16 if run_name(r) == curve)
            values[(curve, nodes)] = row_16(machine, run, rate, network)
    return values


def judged_residuals(machine, rate=A100_RATE, network=None):
    """Each judged prediction's residual, model / published - 1."""
    return {key: value / published_point(*key) - 1 for key, value in judged_model(machine, rate, network).items()}


@functools.lru_cache(maxsize=None)
def input_errors(noise=None, changes=(), readiness=None):
    """What the two inputs' own run-to-run noise does: each is one published run (one A100's compute, the
    synthetic --noddp line; one GPU's loader, the loader-alone ideal line), moved by -``noise`` and +``noise``
    (default RUN_TO_RUN), the share refitted each time; half the difference. ``changes`` (fitted_machine's,
    as sorted items) and ``readiness`` (hypothesis_network's): a hypothesis's model. Returns {"share":
    {input: the share's error}, "points": {judged key: {input: relative error}}}."""
    noise = RUN_TO_RUN if noise is None else noise
    network, changes = hypothesis_network(readiness), dict(changes)
    moves = {"compute": lambda f: ({"rate": A100_RATE * f}, {}),
             "loader": lambda f: ({}, {"loader_rate": PERLMUTTER.loader_rate * f})}
    shares, points = {}, {key: {} for key in JUDGED}
    for name, move in moves.items():
        ends = []
        for factor in (1 - noise, 1 + noise):
            model_input, machine_change = move(factor)
            share = fit(network=network, **model_input, **changes, **machine_change)[0]
            ends.append((share, judged_model(fitted_machine(share, **changes, **machine_change), network=network,
                                             **model_input)))
        (low_share, low), (high_share, high) = ends
        shares[name] = abs(high_share - low_share) / 2
        for key in JUDGED:
            points[key][name] = abs(high[key] - low[key]) / 2 / published_point(*key)
    return {"share": shares, "points": points}


def input_error(key, noise=None, changes=(), readiness=None):
    """A judged prediction's relative error from both inputs' noise, combined."""
    return math.hypot(*input_errors(noise, changes, readiness)["points"][key].values())


def judged_sigma(key, data=False, changes=(), readiness=None):
    """A judged prediction's standard error, relative: its reading error, its run-to-run spread and its
    inputs' noise through the model (``changes``, ``readiness``: a hypothesis's), combined; ``data``: with
    the scaling data's own scatter for a synthetic point's spread and for the inputs' noise."""
    reading, run = point_errors(*key)
    if not data:
        return math.hypot(reading, run, input_error(key, None, changes, readiness))
    scatter = scaling_scatter()
    return math.hypot(reading, scatter if key[0] == "synthetic" else run, input_error(key, scatter, changes, readiness))


def point_errors(curve, nodes):
    """A judged prediction's reading error and run-to-run spread, relative (check_rows gives the same): a
    synthetic point's reading error (its 1-node point a 32nd of the ideal line's), and a local-batch-16 run
    none, read off a log; the mean of the three 4-GPU runs, the spread over the square root of 3."""
    if curve != "synthetic":
        return 0.0, RUN_TO_RUN / (math.sqrt(len(FOUR_GPU_RUNS)) if curve == FOUR_GPU_MEAN else 1)
    published = published_point(curve, nodes)
    return READING_ERROR / (32 * published if nodes == 1 else published), RUN_TO_RUN


def fitted_share_error():
    """The fitted share's standard error with the inputs' noise: the fit's own (its curvature) and what
    each input's run-to-run noise moves it by, combined."""
    return math.hypot(fit()[1], *input_errors()["share"].values())


def scaling_scatter():
    """How far the scaling data's own separate runs scatter: the relative standard deviation of the synthetic
    --noddp points per node (one job each at 8, 16 and 32 nodes, where the plots draw them apart), whose
    ideal is one constant: N x one GPU's rate."""
    values = [value / nodes for nodes, value in CURVES["synthetic_noddp"].items()]
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) / mean


INPUTS = {("synthetic_noddp", 32): "input: one GPU's compute", ("loader_ideal", 32): "input: one GPU's loader"}
# Curves whose points the model gives as N times an input: they check the plot's reading, not the model.
N_TIMES_AN_INPUT = {"synthetic_noddp": "N x one GPU's compute", "real_noddp": "N x one GPU's loader",
                    "loader": "N x one GPU's loader"}
# --check's verdict judges the independent predictions only (the synthetic runs and the runs at local batch
# 16): a prediction passes within this many standard errors (reading and run-to-run combined).
VERDICT_SIGMAS = 2


def term(curve, nodes):
    if (curve, nodes) in INPUTS:
        return INPUTS[(curve, nodes)]
    if (curve, nodes) in FIT_POINTS:
        return "fitted: the one network share"
    if curve.startswith(RATIO_CURVES):
        return "derived: a ratio of the curves' points"
    return N_TIMES_AN_INPUT.get(curve, "predicted, judged")


def check_rows(share=None):
    """Every published point of the final curves (and the text's and the local-batch-16 runs' numbers)
    with the model's value: dicts with curve, nodes, published, model, fitted (an input or a fitted point),
    term, error (the residual: relative for samples/s, in points for the ratios), reading (the reading
    error, alike), inputs (a judged prediction's error from its inputs' run-to-run noise, input_error; else
    0), sigma (reading, run-to-run and inputs combined) and sigmas (|error| / sigma); and for the judged
    predictions sigma_data and sigmas_data, the same with the scaling data's own scatter (scaling_scatter)
    as the curves' points' and the inputs' run-to-run noise (None for the other rows)."""
    machine = fitted_machine(fit()[0] if share is None else share)
    scatter = scaling_scatter()
    rows = []

    def add(curve, nodes, published, model, ratio=False, reading=None, run=RUN_TO_RUN, name=None):
        name = name or term(curve, nodes)
        error = model - published if ratio else model / published - 1
        reading = reading if reading is not None else READING_ERROR / published
        inputs, data = 0.0, None
        if name == "predicted, judged":
            inputs = input_error((curve, nodes))
            own = scatter if curve == "synthetic" else run  # the runs at local batch 16: their epochs' spread
            data = math.hypot(reading, own, input_error((curve, nodes), scatter))
        combined = math.hypot(reading, run, inputs)
        rows.append({"curve": curve, "nodes": nodes, "published": published, "model": model,
                     "fitted": name.startswith(("input", "fitted")), "term": name, "error": error,
                     "reading": reading, "inputs": inputs, "sigma": combined, "sigmas": abs(error) / combined,
                     "sigma_data": data, "sigmas_data": None if data is None else abs(error) / data})

    for curve in ("real", "synthetic", "real_noddp", "synthetic_noddp", "loader"):
        for nodes, value in sorted(CURVES[curve].items()):
            if (curve, nodes) == ("loader", 1):
                continue  # the loader_ideal row's number / 32: the input
            from_ideal = nodes == 1 and curve == "synthetic"  # the ideal line's end / 32: a 32nd of its reading error
            add(curve, nodes, value, curve_model(curve, nodes, machine),
                reading=READING_ERROR / (32 * value) if from_ideal else None)
    add("loader_ideal", 32, CURVES["loader_ideal"][32], curve_model("loader_ideal", 32, machine))
    overhead = {}
    for kind in ("real", "synthetic"):
        for nodes, value in CURVES[f"{kind}_noddp"].items():
            if nodes in CURVES[kind]:
                ratio = CURVES[kind][nodes] / value
                model = 1 - curve_model(kind, nodes, machine) / curve_model(f"{kind}_noddp", nodes, machine)
                overhead[(kind, nodes)] = model
                add(f"comm_overhead_{kind}", nodes, 1 - ratio, model, ratio=True,
                    reading=2 * READING_ERROR / value, run=math.sqrt(2) * RUN_TO_RUN * ratio)
    real = {n: curve_model("real", n, machine) for n in (1, 32)}
    efficiency = real[32] / (32 * real[1])
    add("efficiency_real (README text)", 32, TEXT["efficiency_real"], efficiency, ratio=True, reading=0.005,
        run=math.sqrt(2) * RUN_TO_RUN * efficiency)
    add("comm_overhead_synthetic (README text)", 32, TEXT["comm_overhead_synthetic"], overhead[("synthetic", 32)],
        ratio=True, reading=0.005, run=math.sqrt(2) * RUN_TO_RUN * (1 - overhead[("synthetic", 32)]))
    for run in RUNS_16:
        add(run_name(run), run["gpus"] // 4, published_point(run_name(run), run["gpus"] // 4), row_16(machine, run),
            reading=0.0, name="the run-to-run estimate" if run in FOUR_GPU_RUNS else "predicted, judged")
    add(FOUR_GPU_MEAN, 1, published_point(FOUR_GPU_MEAN, 1), row_16(machine, FOUR_GPU_RUNS[0]), reading=0.0,
        run=RUN_TO_RUN / math.sqrt(len(FOUR_GPU_RUNS)), name="predicted, judged")
    return rows


def judged(row):
    return row["term"] == "predicted, judged"


SIGMA_NAMES = {"sigmas": "reading, run-to-run and inputs",
               "sigmas_data": "the scaling data's own scatter in place of the run-to-run spread"}


def verdict(rows, key="sigmas"):
    """The verdict on the independent predictions (judged): PASS when each is within VERDICT_SIGMAS of its
    standard errors (``key``: "sigmas", or "sigmas_data" with the scaling data's own scatter); the ones
    that miss, worst first."""
    predictions = [r for r in rows if judged(r)]
    misses = sorted((r for r in predictions if r[key] > VERDICT_SIGMAS), key=lambda r: -r[key])
    return {"pass": not misses, "checked": len(predictions), "within": len(predictions) - len(misses),
            "tolerance_sigmas": VERDICT_SIGMAS, "errors": SIGMA_NAMES[key],
            "misses": [{"curve": r["curve"], "nodes": r["nodes"], "error": r["error"], "sigmas": r[key]}
                       for r in misses]}


def verdict_line(result):
    """One line: PASS or FAIL, how many independent predictions are within tolerance, and each miss."""
    head = (f"verdict on the {result['checked']} independent predictions: {'PASS' if result['pass'] else 'FAIL'}: "
            f"{result['within']} of {result['checked']} within {result['tolerance_sigmas']} standard errors "
            f"({result['errors']})")
    misses = [f"{m['curve']} at {m['nodes']} nodes {100 * m['error']:+.1f}% ({m['sigmas']:.1f} standard errors)"
              for m in result["misses"]]
    return head + ("; missed: " + ", ".join(misses) if misses else "")


RATIO_CURVES = ("comm_overhead", "efficiency")


# The knobs the tutorial teaches, each alone on top of bs64_opt's weak-scaling run (local batch 64,
# 25 MB buckets, broadcast on, fp32 gradients on the wire, DDP), and together.
KNOBS = [
    ("bs64_opt as published (the baseline)", {}),
    ("--local_batch_size=128", {"local_batch": 128}),
    ("--grad_accum_steps=2", {"grad_accum_steps": 2}),
    ("--bucket_cap_mb=100", {"bucket_cap_mb": 100}),
    ("--bucket_cap_mb=10", {"bucket_cap_mb": 10}),
    ("--disable_broadcast_buffers", {"broadcast_buffers": False}),
    ("--ddp_comm_hook=bf16", {"ddp_comm_hook": "bf16"}),
    ("--parallel=fsdp", {"parallel": "fsdp"}),
    # Accumulation's use: a local batch larger than fits, here 128 in micro-batches of the baseline's 64.
    ("--local_batch_size=128 --grad_accum_steps=2", {"local_batch": 128, "grad_accum_steps": 2}),
]
DDP_ONLY = {"bucket_cap_mb", "broadcast_buffers", "ddp_comm_hook"}


def knob_efficiency(machine, one_gpu_rate, knob, nodes=32):
    """Weak-scaling efficiency on ``nodes`` nodes with ``knob``: (real data, synthetic data), each the
    job's samples/s over that many GPUs' samples/s alone (one GPU: no DDP, the same local batch)."""
    batch = knob.get("local_batch", 64)
    options = {key: value for key, value in knob.items() if key != "local_batch"}
    gpus = nodes * machine.gpus_per_node
    many = step_time(machine, gpus, batch, one_gpu_rate, first_bucket_mb=1.0, rate_batch=RATE_BATCH, **options)
    one = step_time(machine, 1, batch, one_gpu_rate, rate_batch=RATE_BATCH)
    return many.samples_per_s / (gpus * one.samples_per_s), \
        many.synthetic_samples_per_s / (gpus * one.synthetic_samples_per_s)


def knob_settings():
    """Each knob alone, then every combination of knobs that are not alternatives of one another
    (train.py refuses --ddp_comm_hook with FSDP; buckets and broadcast are DDP's)."""
    import itertools

    settings = list(KNOBS)
    groups = [[("", {})] + [k for k in KNOBS[1:] if list(k[1]) == [key]]
              for key in ("local_batch", "grad_accum_steps", "bucket_cap_mb", "broadcast_buffers",
                          "ddp_comm_hook", "parallel")]
    for choice in itertools.product(*groups):
        chosen = [k for k in choice if k[0]]
        if any("parallel" in k for _, k in chosen) and any(set(k) & DDP_ONLY for _, k in chosen):
            continue
        if len(chosen) > 1 and " ".join(name for name, _ in chosen) not in dict(settings):
            settings.append((" ".join(name for name, _ in chosen),
                             {key: value for _, k in chosen for key, value in k.items()}))
    return settings


def knob_table(machine_name="perlmutter", network=None):
    """Each knob's efficiency at 32 nodes as a band: the network at the fitted share less and plus its
    standard error with the inputs' noise (fitted_share_error), at one GPU's compute rate (ONE_GPU_RATE);
    with ``network`` (a measured Machine) that
    one network. Each knob alone best first (by real data), then the best combination. Rows: (name,
    {column: (low, high)}), the columns "real" and "synthetic" and, on the H100, "real, DALI measured"
    (the loader at this code's DALI rate, H100_LOADER_MEASURED)."""
    base = MACHINES[machine_name]
    rate = ONE_GPU_RATE[machine_name]
    if network:
        machines = [network]
    else:
        share, error = fit()[0], fitted_share_error()
        machines = [fitted_machine(max(share - error, 0.05), base), fitted_machine(share + error, base)]
    loaders = {"real": None}
    if machine_name == "h100" and not network:
        loaders["real, DALI measured"] = H100_LOADER_MEASURED
    rows = []
    for name, knob in knob_settings():
        columns = {}
        for column, loader in loaders.items():
            values = [knob_efficiency(dataclasses.replace(m, loader_rate=loader) if loader else m, rate, knob)
                      for m in machines]
            columns[column] = (min(v[0] for v in values), max(v[0] for v in values))
        values = [knob_efficiency(m, rate, knob) for m in machines]
        columns["synthetic"] = (min(v[1] for v in values), max(v[1] for v in values))
        rows.append((name, columns))
    singles = [name for name, _ in KNOBS]
    ranked = sorted(rows, key=lambda row: (-round(sum(row[1]["real"]), 3), -round(sum(row[1]["synthetic"]), 3),
                                           row[0].count("--")))
    return [row for row in ranked if row[0] in singles] + [row for row in ranked if row[0] not in singles][:1]


def scaling_table(machine, local_batch, one_gpu_rate, counts=GPU_COUNTS, rate_batch=RATE_BATCH, **options):
    """One row per GPU count: weak scaling (``local_batch`` per GPU), with real data (the loader's bound)
    and with synthetic data, each against that many GPUs alone; ``one_gpu_rate`` at local batch
    ``rate_batch``."""
    rows = []
    alone = step_time(machine, 1, local_batch, one_gpu_rate, rate_batch=rate_batch, **options)
    for gpus in counts:
        weak = step_time(machine, gpus, local_batch, one_gpu_rate, rate_batch=rate_batch, **options)
        rows.append({"gpus": gpus, "nodes": math.ceil(gpus / machine.gpus_per_node), "buckets": weak.buckets,
                     "compute_ms": 1e3 * weak.compute, "ddp_gpu_ms": 1e3 * weak.ddp_gpu,
                     "exposed_ms": 1e3 * weak.exposed, "loader_ms": 1e3 * weak.loader,
                     "synthetic_samples_per_s": weak.synthetic_samples_per_s,
                     "synthetic_efficiency": weak.synthetic_samples_per_s / (gpus * alone.synthetic_samples_per_s),
                     "samples_per_s": weak.samples_per_s,
                     "weak_efficiency": weak.samples_per_s / (gpus * alone.samples_per_s)})
    return rows


def network_profile(path, base=PERLMUTTER):
    """``base`` with its network measured: a machine profile written by benchmarks.allreduce (keys
    backend, world_size, nodes, latency_us, busbw_GBps). Its bus bandwidth replaces the datasheet's
    (across nodes if it was measured across nodes, else NVLink's), and its latency, the time of a small
    all-reduce over world_size ranks, is spread evenly over a ring's 2(N-1) steps."""
    with open(path) as f:
        profile = json.load(f)
    missing = [key for key in ("world_size", "nodes", "latency_us", "busbw_GBps") if key not in profile]
    if missing:
        raise ValueError(f"{path} is not a machine profile of benchmarks.allreduce: it lacks {', '.join(missing)}")
    ranks = int(profile["world_size"])
    hop = profile["latency_us"] * 1e-6 / (2 * max(ranks - 1, 1))
    name = f"{base.name}, network measured ({profile.get('backend', '?')}, {ranks} ranks on {profile['nodes']} nodes)"
    if profile["nodes"] > 1:
        return dataclasses.replace(base, name=name, node_network_bw=float(profile["busbw_GBps"]),
                                   intra_latency=hop, inter_latency=hop, ring_only=True, source=path,
                                   ring_plateau=1.0)  # measured: no term of NCCL's model on top
    return dataclasses.replace(base, name=name, nvlink_bw=float(profile["busbw_GBps"]), intra_latency=hop,
                               source=path)


def resolve_machine(name, network_share="fitted", network=None):
    """A named machine: its network measured (``network``, a profile's path), at ``network_share`` of
    its datasheet, or ("fitted") at the share fitted to the original's real-data runs (on another
    machine than Perlmutter an assumption). Returns the machine and the share used (None when measured)."""
    if network:
        return network_profile(network, MACHINES[name]), None
    share = fit()[0] if network_share == "fitted" else float(network_share)
    return fitted_machine(share, MACHINES[name]), share


def percent(value):
    return f"{100 * value:.1f}%"


def signed(error):
    """+9.1%, and +0.0% for a fitted row's rounding error (not -0.0%)."""
    return f"{100 * error:+.1f}%".replace("-0.0%", "+0.0%")


def whole(low, high):
    """A range in whole percent: 86% where both ends round alike, else 84-88%."""
    low, high = round(100 * low), round(100 * high)
    return f"{low}%" if low == high else f"{low}-{high}%"


def is_ratio(row):
    return row["published"] < 1.5


def check_markdown(rows):
    lines = ["| curve | nodes | published | model | residual | reading error | inputs' error | standard error | "
             "residual / standard error | term |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        inputs = f"±{100 * r['inputs']:.1f}%" if judged(r) else "-"
        if is_ratio(r):
            values = [percent(r["published"]), percent(r["model"]), f"{100 * r['error']:+.1f} points".replace(
                "-0.0", "+0.0"), f"±{100 * r['reading']:.1f} points", inputs, f"±{100 * r['sigma']:.1f} points"]
        else:
            values = [f"{r['published']:.0f}", f"{r['model']:.0f}", signed(r["error"]), f"±{100 * r['reading']:.1f}%",
                      inputs, f"±{100 * r['sigma']:.1f}%"]
        term = f"**{r['term']}**" if r["fitted"] else r["term"]
        lines.append(f"| {r['curve']} | {r['nodes']} | " + " | ".join(values) + f" | {r['sigmas']:.1f} | {term} |")
    return "\n".join(lines)


def scaling_markdown(rows):
    lines = ["| GPUs | nodes | buckets | compute ms | DDP on the GPU ms | exposed network ms | loader ms | "
             "synthetic samples/s | synthetic efficiency | real-data samples/s | real-data efficiency |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['gpus']} | {r['nodes']} | {r['buckets']} | {r['compute_ms']:.1f} | {r['ddp_gpu_ms']:.1f} | "
                     f"{r['exposed_ms']:.1f} | {r['loader_ms']:.1f} | {r['synthetic_samples_per_s']:.0f} | "
                     f"{percent(r['synthetic_efficiency'])} | {r['samples_per_s']:.0f} | "
                     f"{percent(r['weak_efficiency'])} |")
    return "\n".join(lines)


def knobs_markdown(ranked, published=None):
    """The knob table; ``published``: the original's own efficiencies at 32 nodes, a row beside the model's."""
    columns = list(ranked[0][1])
    titles = [f"{column.replace('real', 'real data', 1)} at 32 nodes" if column != "synthetic"
              else "synthetic data at 32 nodes" for column in columns]
    lines = ["| knobs on bs64_opt (local batch 64, 25 MB buckets) | " + " | ".join(titles) + " |",
             "|---" * (1 + len(columns)) + "|"]
    if published:
        lines.append("| *published: the original's 32-node runs* | " + " | ".join(
            f"*{percent(published[c.split(',')[0]])}*" for c in columns) + " |")
    for name, values in ranked:
        lines.append(f"| {name} | " + " | ".join(whole(*values[c]) for c in columns) + " |")
    return "\n".join(lines)


PUBLISHED_32 = {"real": CURVES["real"][32] / CURVES["loader_ideal"][32],
                "synthetic": CURVES["synthetic"][32] / CURVES["synthetic_noddp"][32]}


# The hypotheses for the missed synthetic runs that the model can compute: each changes one thing, its share is
# refitted to the real-data runs, and it is judged by what it does to all seven independent predictions (JUDGED):
# a hypothesis that closes the misses at 16 and 32 nodes by breaking the runs at 2 nodes does not survive.
# (name, what it says, fitted_machine's changes, the gradients' readiness: None as in FLOPs, "timed" from the
# H100's per-layer times, "end" every bucket at the backward pass's end), the test of each below.
PLUGIN_LATENCY = 150e-6  # s: what aws-ofi-nccl's AWS-branch releases of 2022 reported
HYPOTHESES = [
    ("model", "the model as it stands", {}, None),
    ("ring", "NCCL ran the ring where its model takes the tree (a ring only)", {"ring_only": True}, None),
    ("reported", "the plugin reported 150 us, which NCCL uses only to choose ring or tree",
     {"reported_latency": PLUGIN_LATENCY}, None),
    ("hop", "each network hop is physically slower than NCCL's constants: 150 us, in the choice and the time",
     {"inter_latency": PLUGIN_LATENCY, "tree_inter_latency": PLUGIN_LATENCY}, None),
    *((f"channels{n}", f"the tree's cap per channel binds: {n} tree channels of 17.8 GB/s", {"tree_channels": n}, None)
      for n in (4, 3, 2)),
    ("timed", "gradients ready as the H100's per-layer times say, not its FLOPs", {}, "timed"),
    ("end", "the limit of late gradients: every bucket ready at the backward pass's end", {}, "end"),
]
HYPOTHESIS_FAMILIES = {**{f"channels{n}": "the tree's cap per channel binds" for n in (4, 3, 2)},
                       "timed": "gradients become ready later in time than in FLOPs",
                       "end": "gradients become ready later in time than in FLOPs"}
CHANNEL_TEST = "the channel count in NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=GRAPH), and the sweep with NCCL_ALGO=Tree"
READY_TEST = "the gradient-ready hooks timed with CUDA events in a real step on one GPU"
HYPOTHESIS_TESTS = {
    "model": None,
    "ring": "the sweep at 16 and 32 nodes with NCCL_ALGO=Ring and again with NCCL_ALGO=Tree; NCCL 2.20 and later log "
            "each call's algorithm under NCCL_DEBUG_SUBSYS=TUNING (2.15.5 logs only the table it chooses from)",
    "reported": "the TUNING table's latencies, and the plugin's version in the NCCL_DEBUG=INFO log",
    "hop": "the sweep's small-message latency between 2 nodes",
    "channels4": CHANNEL_TEST, "channels3": CHANNEL_TEST, "channels2": CHANNEL_TEST,
    "timed": READY_TEST, "end": READY_TEST,
}


def hypothesis_network(readiness):
    """The U-Net's gradients as a hypothesis has them ready: None (their FLOPs), "timed", "end"."""
    network = unet()
    if readiness == "timed":
        return timed_readiness(network)[0]
    if readiness == "end":
        return dataclasses.replace(network, gradients=tuple(dataclasses.replace(g, ready=1.0)
                                                            for g in network.gradients))
    return None


@functools.lru_cache(maxsize=None)
def hypotheses():
    """What could make the published synthetic runs at 16 and 32 nodes slower than the model: for each that
    the model can compute (HYPOTHESES), its share refitted to the real-data runs and its residual at every
    judged prediction; for the rest, why not; each with the measurement that would test it."""
    listed = []
    for name, text, changes, readiness in HYPOTHESES:
        network = hypothesis_network(readiness)
        share = fit(network=network, **changes)[0]
        residuals = judged_residuals(fitted_machine(share, **changes), network=network)
        model = tuple(sorted(changes.items())), readiness
        sigmas = {key: abs(residuals[key]) / judged_sigma(key, False, *model) for key in JUDGED}
        data = {key: abs(residuals[key]) / judged_sigma(key, True, *model) for key in JUDGED}
        listed.append({"name": name, "hypothesis": text, "family": HYPOTHESIS_FAMILIES.get(name, text),
                       "share": share,
                       "residuals": {f"{curve} {nodes}": residuals[(curve, nodes)] for curve, nodes in JUDGED},
                       "sigmas": {f"{curve} {nodes}": sigmas[(curve, nodes)] for curve, nodes in JUDGED},
                       "within": sum(value <= VERDICT_SIGMAS for value in sigmas.values()),
                       "within_data": sum(value <= VERDICT_SIGMAS for value in data.values()),
                       "test": HYPOTHESIS_TESTS[name]})
    optimiser = optimiser_time(sum(g.bytes for g in unet().gradients), PERLMUTTER)
    for name, text, moves, test in (
        ("optimiser", f"the optimiser's step takes longer than its memory-bound estimate ({1e3 * optimiser:.1f} ms "
         "on an A100), so the backward pass ends earlier than the model says", "at most the estimate's excess",
         "the optimiser and GradScaler's step alone, timed with CUDA events on one GPU"),
        ("sms", "NCCL's kernels hold SMs for the whole network phase, which grows with the nodes, while the model "
         "charges the GPU a fixed DDP cost", "not computed", "an Nsight Systems profile of one step at 2 and at 16 "
         "nodes: compute kernels' time with and without NCCL's kernels beside them"),
        ("placement", "the network gave a large job less than a small one (placement on the dragonfly, other jobs' "
         "traffic on the links between groups)", "not computed", "the all-reduce sweep at 2, 8, 16 and 32 nodes, "
         "repeated at different times"),
        ("slow run", "each synthetic point is one run, and a slow one", f"the --noddp runs scatter "
         f"{100 * scaling_scatter():.2f}% about one rate, far less than either miss", "three runs of each point"),
    ):
        listed.append({"name": name, "hypothesis": text, "family": text, "share": None, "residuals": None,
                       "sigmas": None, "within": None, "within_data": None, "moves": moves, "test": test})
    return listed


def hypotheses_markdown(listed):
    """The computed hypotheses' residuals at every judged prediction, one row each."""
    computed = [h for h in listed if h["residuals"]]
    keys = list(computed[0]["residuals"])
    lines = ["| hypothesis (its share refitted) | share | " + " | ".join(JUDGED_LABELS[key] for key in keys)
             + f" | within {VERDICT_SIGMAS} standard errors | within {VERDICT_SIGMAS}, the data's own scatter |",
             "|---" * (4 + len(keys)) + "|"]
    for h in computed:
        lines.append(f"| {h['hypothesis']} | {percent(h['share'])} | "
                     + " | ".join(f"{signed(h['residuals'][key])} ({h['sigmas'][key]:.1f})" for key in keys)
                     + f" | {h['within']} of {len(keys)} | {h['within_data']} of {len(keys)} |")
    return "\n".join(lines)


def synthetic_pattern(share=None):
    """The misses' pattern: the published synthetic runs' efficiency against N x one GPU's rate, the
    model's, what share of the network each asks for alone, and the algorithm the model takes for each
    bucket (T tree, R ring), at 8, 16 and 32 nodes."""
    machine = fitted_machine(fit()[0] if share is None else share)
    cut = buckets(unet(), 25, 1.0)
    rows = []
    for nodes in (8, 16, 32):
        gpus = 4 * nodes
        rows.append({"nodes": nodes, "published": CURVES["synthetic"][nodes] / (gpus * A100_RATE),
                     "reading": READING_ERROR / (gpus * A100_RATE),
                     "model": curve_model("synthetic", nodes, machine) / (gpus * A100_RATE),
                     "share_alone": share_to("synthetic", nodes),
                     "algorithms": "".join(algorithm(size, gpus, machine)[0].upper() for size, _ in cut)})
    return rows


def tree_above(sizes, gpus, machine=PERLMUTTER, low=0.05, high=4.0):
    """The share of the network above which NCCL's tuner takes the tree for all-reduces of each of ``sizes``
    bytes over ``gpus`` GPUs, the ring for one of them below it (bisection between ``low`` and ``high``); None
    where that is not so at ``low`` and at ``high``."""
    def tree(share):
        chosen = {algorithm(size, gpus, fitted_machine(share, machine)) for size in sizes}
        return 1.0 if chosen == {"tree"} else 0.0

    return solve(tree, 0.5, low, high) if tree(low) == 0.0 and tree(high) == 1.0 else None


def fit_lines():
    """The fitted share with its standard errors (the fit's own, and with the inputs' noise), its chi-squared,
    what each real-data run asks for alone, and the variant with the published loader-alone points."""
    share, error = fit()
    moved = input_errors()["share"]
    lines = [f"- the loader N x one GPU's (the ideal line): {percent(share)} ± {100 * error:.1f} points (the fit's "
             f"curvature); with the inputs' run-to-run noise (the loader's moves it ±{100 * moved['loader']:.1f} "
             f"points, the compute's ±{100 * moved['compute']:.1f}) ± {100 * fitted_share_error():.1f} points; "
             f"chi-squared {misfit(share):.2f} for {len(FIT_POINTS) - 1} degrees of freedom; each run alone asks for "
             + ", ".join(f"{percent(share_to(c, n))} ({c} {n})" for c, n in FIT_POINTS)]
    share, error = fit(loader="published")
    lines.append(f"- the loader-alone curve's own points at 16 and 32 nodes: {percent(share)} ± {100 * error:.1f} "
                 "points (the fit's curvature); each run alone asks for "
                 + ", ".join(f"{percent(share_to(c, n, loader='published'))} ({c} {n})" for c, n in FIT_POINTS))
    return lines


def pattern_lines(pattern):
    """synthetic_pattern's rows, one line each, and the shares above which the tuner takes the tree for every
    bucket."""
    above = all_trees_above()
    return [f"- {p['nodes']} nodes: published {percent(p['published'])} (reading ±{100 * p['reading']:.1f} points), "
            f"model {percent(p['model'])}; alone it asks for a share of {percent(p['share_alone'])}; the model's "
            f"buckets, in the order they are ready: {p['algorithms']}" for p in pattern] + [
        "- every bucket on the tree (T) from a share of " + " and ".join(
            f"{percent(share)} at {nodes} nodes" for nodes, share in above.items()) + ", one or more on the ring "
        "below it"]


def all_trees_above(nodes=(16, 32)):
    """The share above which the tuner takes the tree for every one of bs64_opt's buckets (25 MB, a 1 MiB
    first bucket), at each of ``nodes``: {nodes: share}."""
    cut = [size for size, _ in buckets(unet(), 25, 1.0)]
    return {n: tree_above(cut, 4 * n) for n in nodes}


def plot(series, path, title):
    """Weak scaling: samples/s against the ideal line, and the efficiency, with real and synthetic data;
    ``series`` maps a label to scaling_table rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullLocator

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    for (label, rows), color in zip(series.items(), ("C0", "C1", "C2", "C3")):
        gpus = [r["gpus"] for r in rows]
        for key, efficiency, style, kind in (("samples_per_s", "weak_efficiency", "o-", "real data"),
                                             ("synthetic_samples_per_s", "synthetic_efficiency", "s--", "synthetic")):
            left.plot(gpus, [r[key] for r in rows], style, color=color, label=f"{label}, {kind}", markersize=3)
            right.plot(gpus, [100 * r[efficiency] for r in rows], style, color=color, markersize=3,
                       label=f"{label}, {kind}")
        left.plot(gpus, [g * rows[0]["synthetic_samples_per_s"] for g in gpus], ":", color=color)
    left.plot([], [], ":", color="gray", label="ideal (N x one GPU, synthetic)")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xticks(GPU_COUNTS, [str(n) for n in GPU_COUNTS])
        axis.xaxis.set_minor_locator(NullLocator())
        axis.set_xlabel("GPUs")
    left.set_yscale("log")
    left.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    left.set_ylabel("samples/s (weak scaling)")
    left.set_title(title, fontsize=9)
    left.legend(fontsize=6)
    right.set_ylabel("weak-scaling efficiency (%)")
    right.set_ylim(0, 105)
    right.set_title("predicted efficiency (against N GPUs alone)", fontsize=9)
    right.legend(fontsize=6)
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
                   f"benchmarks/results/allreduce/{measured['name']}.md", ring_only=True)  # gloo's ring


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


def predicted_tables(share):
    """bs64_opt's weak scaling on each machine, the network as fitted, to 32 nodes: as far as the fit
    reaches."""
    return {name: scaling_table(fitted_machine(share, machine), 64, ONE_GPU_RATE[name],
                                counts=[g for g in GPU_COUNTS if g <= 32 * machine.gpus_per_node])
            for name, machine in MACHINES.items()}


def check_summary(rows=None):
    """What ``--check --json`` prints: the NCCL version the cost model is of, the fitted share with its
    standard errors (and with the published loader-alone points), the run-to-run spread and the scaling data's
    own scatter, the synthetic runs' pattern, every published point with its residual and errors, the two
    verdicts and the hypotheses for the misses."""
    rows = rows if rows is not None else check_rows()
    share = fit()
    return {"nccl": NCCL_VERSION, "algorithm": "ring or tree, the faster per call in NCCL's cost model",
            "fitted_share": list(share), "fitted_share_with_inputs": [share[0], fitted_share_error()],
            "fitted_share_chi2": misfit(share[0]), "fitted_share_loader_published": list(fit(loader="published")),
            "fitted_to": [f"{c} {n}" for c, n in FIT_POINTS], "run_to_run": RUN_TO_RUN,
            "scaling_scatter": scaling_scatter(), "input_errors_share": input_errors()["share"],
            "pattern": synthetic_pattern(share[0]),
            "all_trees_above": {str(nodes): above for nodes, above in all_trees_above().items()},
            "points": [{key: row[key] for key in ("curve", "nodes", "published", "model", "fitted", "term", "error",
                                                 "reading", "inputs", "sigma", "sigmas", "sigma_data", "sigmas_data")}
                       for row in rows],
            "verdict": verdict(rows), "verdict_data": verdict(rows, "sigmas_data"), "hypotheses": hypotheses()}


def check_text(rows):
    """--check's printout: the synthetic runs' pattern, the table, the two verdicts, the errors, the fit and
    the hypotheses."""
    listed = hypotheses()
    tests = {}  # each test once, with the hypotheses it tests
    for h in listed:
        if h["test"] and h["family"] not in tests.setdefault(h["test"], []):
            tests[h["test"]].append(h["family"])
    real = [share_to(c, n) for c, n in FIT_POINTS]
    return "\n\n".join([
        "The synthetic runs against the model: the published efficiency against N x one GPU's rate, the model's, "
        f"and the share of the network each run asks for alone (the real-data runs ask for {percent(min(real))} "
        f"to {percent(max(real))}):\n"
        + "\n".join(pattern_lines(synthetic_pattern())),
        check_markdown(rows), verdict_line(verdict(rows)), verdict_line(verdict(rows, "sigmas_data")),
        f"Standard error: the reading error, a run-to-run spread of {percent(RUN_TO_RUN)} and, for the judged "
        "predictions, the inputs' own run-to-run noise carried through the model (one A100's rate and one GPU's "
        "loader, each one published run, moved by that spread, the share refitted), combined. The spread is the "
        "relative standard deviation of the original's six logged epochs of 4-GPU runs at local batch 16: "
        f"{sum(len(r['epochs']) for r in FOUR_GPU_RUNS) - 1} degrees of freedom, and one setting only by the "
        "model's own claim that neither knob changes a node's step. The scaling data scatter far less: the "
        f"synthetic --noddp runs at 8, 16 and 32 nodes lie within {100 * scaling_scatter():.2f}% of one rate per GPU "
        "(relative standard deviation), and the fit's chi-squared is "
        f"{misfit(fit()[0]):.2f} for {len(FIT_POINTS) - 1} degrees of freedom. The second verdict takes that "
        "scatter for the synthetic points' and the inputs' run-to-run noise. Judged: the independent predictions "
        "only (fitted points, inputs, N x an input and ratios of the curves' points are listed, not judged).",
        "The fitted share: the ring's bus bandwidth between nodes in NCCL's cost model, as a share of Slingshot "
        "11's 100 GB/s per node (a tree's bytes then move at 0.92 x 0.7-0.9 of it), fitted to the real-data runs "
        "at 8, 16 and 32 nodes, with its standard error:\n" + "\n".join(fit_lines()),
        "Why the synthetic runs at 16 and 32 nodes may be slower than the model. Each hypothesis the model can "
        "compute, with its share refitted, at all seven judged predictions: its residual and, in brackets, that "
        "in standard errors (reading, run-to-run and the inputs' noise through the hypothesis's own model):\n\n"
        + hypotheses_markdown(listed)
        + "\n\nThe others, what they move:\n"
        + "\n".join(f"- {h['hypothesis']}: {h['moves']}" for h in listed if not h["residuals"])
        + "\n\nThe test of each:\n"
        + "\n".join(f"- {', or '.join(names)}: {test}." for test, names in tests.items())])


def report(out_dir, image=None):
    """Everything the chapter quotes, one markdown table per file in ``out_dir`` (check.md, cpu.md,
    perlmutter.md, h100.md, knobs-*.md) and all of it in report.json; and the plot (``image``)."""
    share, error = fit()
    rows = check_rows(share)
    machines = {"perlmutter": fitted_machine(share), "h100": fitted_machine(share, H100)}
    tables = predicted_tables(share)
    knobs = {name: knob_table(name) for name in machines}
    cpu = cpu_check()
    result = {"command": "python -m benchmarks.scaling_model --report", **check_summary(rows),
              "nccl_latencies": {k: v for k, v in NCCL_LATENCY.items() if k != "tree_correction"},
              "check": rows, "one_gpu_rate": A100_RATE, "loader_rate": PERLMUTTER.loader_rate,
              "reading_error": READING_ERROR,
              "optimiser_ms": 1e3 * optimiser_time(sum(g.bytes for g in unet().gradients), PERLMUTTER),
              "cpu": cpu, "tables": tables, "published_32": PUBLISHED_32,
              "knobs": {name: [{"knobs": k, **{c: list(v) for c, v in values.items()}} for k, values in ranked]
                        for name, ranked in knobs.items()}}
    made = ("Made by `python -m benchmarks.scaling_model --report`: a computation from published and "
            "committed numbers, the same on any machine.")
    error = fitted_share_error()
    network = (f"the ring's bus bandwidth between nodes in NCCL {NCCL_VERSION}'s cost model at {percent(share)} ± "
               f"{100 * error:.1f} points of Slingshot 11's 100 GB/s per node (fitted to the real-data runs at 8, 16 "
               "and 32 nodes; its error with the inputs' noise)")
    texts = {
        "check": (f"# The model against the original tutorial's final scaling curves\n\n{made} The published points "
                  "are read off the original's plots (NERSC/sc22-dl-tutorial commit 2074095, 2022-11-12) by "
                  "`python -m benchmarks.read_scaling_plots`, into `benchmarks/sc22_scaling_points.json`; "
                  f"reading error ±{READING_ERROR:.0f} samples/s; the runs at local batch 16 are its README's logs "
                  f"(the mean of two epochs). Inputs: one A100 computes {A100_RATE:.0f} samples/s (synthetic "
                  f"--noddp), its loader delivers {PERLMUTTER.loader_rate:.0f} (the loader-alone ideal line).\n\n"
                  + check_text(rows) + "\n"),
        "cpu": ("# The demo model's DDP step on 2 CPU ranks: predicted from gloo's profiles, against measured\n\n"
                f"{made} The step times are "
                f"[{CPU_SCALING}](../{CPU_SCALING}/README.md)'s; the gloo profiles are "
                "[two-ranks-one-machine](../allreduce/two-ranks-one-machine.md) and "
                "[two-nodes-slurm](../allreduce/two-nodes-slurm.md).\n\n" + cpu_markdown(cpu) + "\n"),
        "perlmutter": (f"# bs64_opt weak scaling on Perlmutter, predicted\n\n{made} Local batch 64, 25 MB buckets, "
                       f"one A100 computing {A100_RATE:.0f} samples/s and loading {PERLMUTTER.loader_rate:.0f}, "
                       f"{network}.\n\n" + scaling_markdown(tables["perlmutter"]) + "\n"),
        "h100": (f"# bs64_opt weak scaling on DGX H100 nodes, predicted\n\n{made} Local batch 64, 25 MB buckets, one "
                 f"H100 computing {H100_RATE:.1f} samples/s (this code's, measured: the SYNTHETIC trial of the ladder's "
                 f"'{H100_RUNG}' rung in benchmarks/results/{os.path.basename(H100_RESULTS)}; "
                 f"{H100_RATE / A100_RATE:.2f} times the original's A100 at {A100_RATE:.0f}), its loader "
                 f"bound at the A100's 937 samples/s, {network} (Perlmutter's share: an assumption).\n\n"
                 + scaling_markdown(tables["h100"]) + "\n"),
    }
    for name, ranked in knobs.items():
        gpus = 32 * machines[name].gpus_per_node
        extra = "" if name == "perlmutter" else (
            f"; one H100 computing {H100_RATE:.1f} samples/s (measured with this code); its loader at the A100's 937 "
            f"samples/s or, \"DALI measured\", at the {H100_LOADER_MEASURED:.1f} this code's DALI pipeline delivered "
            "alone on an H200 machine (benchmarks/results/loaders/)")
        texts[f"knobs-{name}"] = (
            f"# The knobs at 32 nodes ({gpus} GPUs): {machines[name].name}\n\n{made} Weak-scaling efficiency against "
            f"as many GPUs alone, in whole percent; a range where the network's share less and plus its standard error "
            "with the inputs' noise "
            f"({percent(max(share - error, 0.05))} and {percent(share + error)}) give different values{extra}. "
            "The model misses the published synthetic runs at 16 and 32 nodes (check.md): differences in the synthetic column "
            "smaller than that miss are not resolved.\n\n"
            + knobs_markdown(ranked, PUBLISHED_32 if name == "perlmutter" else None) + "\n")
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
    """The README's plot: bs64_opt on Perlmutter and on DGX H100 nodes, the network as fitted."""
    if tables is None:
        tables = predicted_tables(fit()[0])
    plot({"Perlmutter A100 (network as fitted)": tables["perlmutter"],
          "DGX H100 (network at the same share)": tables["h100"]}, path,
         "bs64_opt weak scaling, local batch 64, predicted")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--machine", choices=sorted(MACHINES), default="perlmutter")
    parser.add_argument("--one_gpu_rate", type=float, help="one GPU's samples/s at this local batch when it only "
                        f"computes (default: {A100_RATE:.0f}, the original's A100; on h100 {H100_RATE:.1f}, this code's, measured)")
    parser.add_argument("--local_batch_size", type=int, default=64)
    parser.add_argument("--grad_accum_steps", type=int, default=1)
    parser.add_argument("--bucket_cap_mb", type=float, default=25.0)
    parser.add_argument("--first_bucket_mb", type=float, default=1.0, help="DDP's first bucket (1 MiB in the "
                        "original's torch)")
    parser.add_argument("--ddp_comm_hook", choices=("none", "bf16", "fp16"), default="none")
    parser.add_argument("--disable_broadcast_buffers", action="store_true")
    parser.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp")
    parser.add_argument("--network_share", default="fitted", help="the share of the datasheet's network "
                        "bandwidth reached, a number or 'fitted' (to the original's real-data runs at 8, 16 and 32 "
                        "nodes)")
    parser.add_argument("--network", help="a machine profile measured by benchmarks.allreduce (JSON with "
                        "latency_us and busbw_GBps): the network as measured, in place of the datasheet")
    parser.add_argument("--check", action="store_true", help="print every published point with the model's value, "
                        "its residual and errors, a verdict on the independent predictions, the fitted share with its "
                        "error, and the hypotheses for the misses")
    parser.add_argument("--json", action="store_true", help="with --check: JSON instead of a table")
    parser.add_argument("--knobs", action="store_true", help="print the knobs' efficiencies at 32 nodes")
    parser.add_argument("--report", action="store_true", help="write benchmarks/results/scaling_model/ and "
                        "tutorial_images/scaling_model.png")
    parser.add_argument("--out", help="a plot of the scaling table (png; a bare file name goes to runs/benchmarks/)")
    args = parser.parse_args(argv)

    if args.report:
        report(os.path.join(ROOT, "benchmarks", "results", "scaling_model"),
               os.path.join(ROOT, "tutorial_images", "scaling_model.png"))
        print("wrote benchmarks/results/scaling_model/ and tutorial_images/scaling_model.png")
        return
    if args.check:
        rows = check_rows()
        print(json.dumps(check_summary(rows), indent=1) if args.json else check_text(rows))
        return
    try:
        machine, share = resolve_machine(args.machine, args.network_share, args.network)
    except (OSError, ValueError, json.JSONDecodeError) as error:
        parser.exit(2, f"scaling_model: cannot use --network {args.network}: {error}. Give the JSON file that "
                       "`python -m benchmarks.allreduce` writes (it holds latency_us and busbw_GBps).\n")
    rate = args.one_gpu_rate or ONE_GPU_RATE[args.machine]
    if args.knobs:
        published = PUBLISHED_32 if args.machine == "perlmutter" and not args.network else None  # none on H100s
        print(knobs_markdown(knob_table(args.machine, machine if args.network else None), published))
        return
    options = {"bucket_cap_mb": args.bucket_cap_mb, "first_bucket_mb": args.first_bucket_mb,
               "ddp_comm_hook": args.ddp_comm_hook, "broadcast_buffers": not args.disable_broadcast_buffers,
               "parallel": args.parallel, "grad_accum_steps": args.grad_accum_steps}
    # A rate given on the command line is at this local batch; the default ones are at RATE_BATCH.
    rate_batch = args.local_batch_size if args.one_gpu_rate else RATE_BATCH
    rows = scaling_table(machine, args.local_batch_size, rate, rate_batch=rate_batch, **options)
    network = f"the network at {percent(share)} of its datasheet bandwidth, NCCL {NCCL_VERSION}'s latencies" \
        if share is not None else f"the network measured ({machine.source})"
    print(f"{machine.name}: one GPU computing {rate:.0f} samples/s, {network}; local batch {args.local_batch_size}, "
          + " ".join(f"{k}={v}" for k, v in options.items()) + "\n")
    print(scaling_markdown(rows))
    if args.out:
        from benchmarks.common import relative, user_file

        plot({machine.name: rows}, user_file(args.out), f"local batch {args.local_batch_size}, predicted")
        print(f"Plot: {relative(user_file(args.out))}")


if __name__ == "__main__":
    sys.exit(main())
