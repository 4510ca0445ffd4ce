"""One rank of the distributed tests, started by tests/test_distributed.py as a real process.

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=... python tests/dist_worker.py SCENARIO OUT_DIR

The environment is what torchrun would set, so the process joins its group the way train.py does
(read_world, init_process_group). Scenarios:

  variants  train the small U-Net a few Adam steps under each data-parallel variant and save, per
            variant, the full first-step gradients, final weights, gathered states and memory report
  accumulation
            train.py's own step with --grad_accum_steps micro-batches under DDP and FSDP, counting
            DDP's all-reduces with a comm hook, and two wrong accumulations (see ACCUMULATION)
  die       train; rank 1 kills itself with SIGKILL after two steps
  hang      train; rank 1 stops answering (sleeps) after two steps
  ddp_knobs
            each of DDP's knobs (--bucket_cap_mb, --static_graph, --gradient_as_bucket_view,
            --disable_broadcast_buffers, --ddp_comm_hook) on a small model of Linear layers wrapped by
            train.py's parallelize: what the wrapped model says, and what the knob did (see KNOBS)
  halo_exchange
            one batch_isend_irecv of the halo exchange's kind between the two ranks; writes what came back
            (tests/test_cuda_distributed.py: whether gloo sends CUDA tensors)

With TEST_DEVICE=cuda (and DIST_BACKEND=gloo: two ranks on one GPU) the scenarios train on the GPU.

:func:`train` with a one-rank World is also the reference the test compares against.
"""
import contextlib
import functools
import json
import os
import signal
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402

from train import train_step as train_py_step, training_loss  # noqa: E402

from networks.UNet import UNet  # noqa: E402
from utils import distributed  # noqa: E402
from utils.YParams import YParams  # noqa: E402
from utils.accumulation import GradAccumulation  # noqa: E402
from utils.losses import build_loss  # noqa: E402
from utils.optim import Precision  # noqa: E402
from utils.errors import exit_on_user_error  # noqa: E402

CROP = 32
GLOBAL_BATCH = 4
STEPS = 3
LR = 1e-3
SEED = 0
# float64: the exact tests compare two ranks with one after several Adam steps, and Adam turns a
# rounding difference in a near-zero gradient element into a step of the order of the learning rate.
# In float32 that made the weights of some CPUs (2-core AMD EPYC) differ by 2e-5 after three steps;
# in float64 every x86-64 CPU agrees to far below any real bug's effect (the broken variants show one).
DTYPE = torch.float64

# Each variant's config overrides on top of the `test` config.
VARIANTS = {
    "ddp": {},
    "ddp_bucket_view": {"bucket_cap_mb": 1, "gradient_as_bucket_view": True, "disable_broadcast_buffers": True},
    "ddp_static": {"static_graph": True},
    "ddp_fp16": {"ddp_comm_hook": "fp16"},
    "ddp_bf16": {"ddp_comm_hook": "bf16"},
    "noddp": {"noddp": True},
    "fsdp": {"parallel": "fsdp"},
}


def summed_all_reduce(state, bucket):
    """A deliberately wrong DDP: the ranks' gradients added up instead of averaged."""
    work = torch.distributed.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda future: future.value()[0])


# Variants with a bug on purpose, to show that the exact tests fail on one: DDP with this comm hook.
BROKEN = {"ddp_summed": summed_all_reduce}


def make_params(**overrides):
    params = YParams(os.path.join(ROOT, "config", "UNet.yaml"), "test")
    params.update(overrides)
    return params


def global_batch(step):
    """The same global batch on every rank (and in the one-rank reference) for a given step."""
    generator = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(GLOBAL_BATCH, 4, CROP, CROP, CROP, generator=generator, dtype=DTYPE)
    targets = torch.rand(GLOBAL_BATCH, 5, CROP, CROP, CROP, generator=generator, dtype=DTYPE) * 2 - 1
    return inputs, targets


def build(params, world, device, hook=None):
    """The same initial U-Net on every rank, wrapped, and its Adam (made after wrapping, for FSDP)."""
    torch.manual_seed(SEED)
    model = UNet(base_channels=4, full_scale=False).to(device, DTYPE)
    model = distributed.parallelize(model, params, world, device)
    if hook is not None:
        model.register_comm_hook(state=None, hook=hook)
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def train_step(model, optimizer, world, step):
    """One step on this rank's share of the global batch; the mean L1 loss, as train.py's."""
    inputs, targets = global_batch(step)
    local = GLOBAL_BATCH // world.size
    part = slice(world.rank * local, (world.rank + 1) * local)
    loss = torch.nn.functional.l1_loss(model(inputs[part]), targets[part])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    return loss


def train(params, world, device=torch.device("cpu"), steps=STEPS, hook=None):
    """Train a few steps; return full first-step gradients, final states and the memory report.

    Every rank returns its own full weights (to show that the ranks agree); the gathered
    checkpoint states exist on rank 0 only, as in train.py.
    """
    model, optimizer = build(params, world, device, hook)
    named = list(distributed.bare_model(model).named_parameters())
    for step in range(steps):
        train_step(model, optimizer, world, step)
        if step == 0:
            grads = {name: distributed.full_tensor(p.grad).detach().clone() for name, p in named}
        optimizer.step()
        if step == 0:
            memory = distributed.memory_report(model, optimizer)
    weights = {name: distributed.full_tensor(p).detach().clone() for name, p in named}
    states = distributed.full_state_dicts(model, optimizer, world)
    result = {"grads": grads, "weights": weights, "memory": memory}
    if world.is_main:
        result["optimizer"] = states[1]
        assert all(torch.equal(states[0][name], value) for name, value in weights.items())

    # Round trip: the gathered states, loaded into a fresh (sharded) model that has taken a step of
    # its own, give the same states back. Every rank loads them, as from a checkpoint file.
    states = broadcast_object(states, world)
    fresh_model, fresh_optimizer = build(params, world, device)
    train_step(fresh_model, fresh_optimizer, world, 0)
    fresh_optimizer.step()
    distributed.load_full_state_dicts(fresh_model, fresh_optimizer, *states)
    reloaded = distributed.full_state_dicts(fresh_model, fresh_optimizer, world)
    if world.is_main:
        model_state, optimizer_state = states
        result["round_trip"] = (
            all(torch.equal(reloaded[0][name], value) for name, value in model_state.items())
            and all(torch.equal(reloaded[1]["state"][index][key], value)
                    for index, state in optimizer_state["state"].items() for key, value in state.items()))
    return result


def broadcast_object(value, world):
    """Rank 0's ``value`` on every rank (the stand-in for every rank reading the checkpoint file)."""
    if world.size == 1:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def ranks_device():
    """The ranks' device: TEST_DEVICE (cpu by default; cuda: the GPU, deterministic cuDNN, no TF32)."""
    device = torch.device(os.environ.get("TEST_DEVICE", "cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(0)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    return device


def save_or_record(out_dir, base, run):
    """``run()``'s result in ``base``.pt, or its traceback in ``base``.error: each variant is recorded on its own,
    so that each test reports its own failure."""
    try:
        torch.save(run(), os.path.join(out_dir, f"{base}.pt"))
    except Exception:
        with open(os.path.join(out_dir, f"{base}.error"), "w") as f:
            f.write(traceback.format_exc())


def run_variants(world, out_dir, device=torch.device("cpu")):
    runs = [(name, overrides, None) for name, overrides in VARIANTS.items()]
    runs += [(name, {}, hook) for name, hook in BROKEN.items()]
    for name, overrides, hook in runs:
        save_or_record(out_dir, f"{name}.rank{world.rank}",
                       lambda: train(make_params(**overrides), world, device, hook=hook))
    agreed = {
        "rank0_flags": distributed.agree_to_stop(world.rank == 0, world, device),
        "none_flags": distributed.agree_to_stop(False, world, device),
        "last_flags": distributed.agree_to_stop(world.rank == world.size - 1, world, device),
        # rank r proposes 7 - 4 r steps to the next check: all agree on the fewest, and on the flag
        "and_steps": distributed.agree_to_stop_and_steps(world.rank == 1, 7 - 4 * world.rank, world, device),
    }
    with open(os.path.join(out_dir, f"agree.rank{world.rank}.json"), "w") as f:
        json.dump(agreed, f)


# ----------------------------------------------------------------------------- gradient accumulation

class UnscaledAccumulation(GradAccumulation):
    """Wrong on purpose: the micro-batches' losses are not scaled by 1/K (K times the gradient)."""

    def scale(self, loss):
        return loss


class SyncEveryMicroBatch(GradAccumulation):
    """Wrong on purpose: no no_sync(), so DDP all-reduces the gradients after every micro-batch. The
    weights come out right (all-reduce is linear); only the count of all-reduces shows it."""

    def no_sync(self):
        return contextlib.nullcontext()


# Each variant: config overrides (grad_accum_steps among them) and the accumulation class. 1 MB buckets:
# the float64 U-Net's 2.1 MB of gradients make several, so that "once per bucket" counts more than one.
K2 = {"grad_accum_steps": 2, "bucket_cap_mb": 1}
ACCUMULATION = {
    "ddp_k1": ({**K2, "grad_accum_steps": 1}, GradAccumulation),
    "ddp_k2": (K2, GradAccumulation),
    "ddp_bucket_view_k2": ({**K2, "gradient_as_bucket_view": True}, GradAccumulation),
    "fsdp_k2": ({**K2, "parallel": "fsdp"}, GradAccumulation),
    "ddp_k2_unscaled": (K2, UnscaledAccumulation),
    "ddp_k2_sync_every": (K2, SyncEveryMicroBatch),
}


def counting_all_reduce(calls, bucket):
    """DDP's own all-reduce hook, noting each bucket it reduces."""
    calls.append(bucket.index())
    return default_hooks.allreduce_hook(None, bucket)


def train_accumulating(params, world, device=torch.device("cpu"), accumulation=GradAccumulation):
    """``STEPS`` optimiser steps of train.py's step with ``params.grad_accum_steps`` micro-batches per
    rank; returns first-step gradients, final weights and optimiser state (rank 0), and per step the
    indices of the buckets DDP all-reduced (empty without DDP)."""
    model, optimizer = build(params, world, device)
    calls = []
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model.register_comm_hook(state=calls, hook=counting_all_reduce)
    step_fn = functools.partial(train_py_step, training_loss(model, build_loss(params), params), optimizer,
                                Precision("none", device), accumulation(model, params.grad_accum_steps))
    named = list(distributed.bare_model(model).named_parameters())
    local = GLOBAL_BATCH // world.size
    part = slice(world.rank * local, (world.rank + 1) * local)
    all_reduces = []
    for step in range(STEPS):
        inputs, targets = global_batch(step)
        before = len(calls)
        step_fn(inputs[part].to(device), targets[part].to(device))
        all_reduces.append(calls[before:])
        if step == 0:  # train_step has updated the weights; the gradients stay until the next step
            grads = {name: distributed.full_tensor(p.grad).detach().clone() for name, p in named}
    weights = {name: distributed.full_tensor(p).detach().clone() for name, p in named}
    states = distributed.full_state_dicts(model, optimizer, world)
    result = {"grads": grads, "weights": weights, "all_reduces": all_reduces}
    if world.is_main:
        result["optimizer"] = states[1]
    return result


def run_accumulation(world, out_dir, device=torch.device("cpu")):
    for name, (overrides, accumulation) in ACCUMULATION.items():
        save_or_record(out_dir, f"{name}.rank{world.rank}",
                       lambda: train_accumulating(make_params(**overrides), world, device, accumulation=accumulation))


# ----------------------------------------------------------------------------- DDP's knobs

# Each run: config overrides, and whether the model has a parameter that gets no gradient. 12 Linear
# layers of 256 x 256 in float32 hold 3.16 MB of gradients: under DDP's default cap (25 MB) its rebuilt
# buckets are one, under --bucket_cap_mb=1 three (torch 2.13, two gloo ranks).
KNOBS = {
    "default": ({}, False),
    "cap_1mb": ({"bucket_cap_mb": 1}, False),
    "static": ({"static_graph": True}, True),
    "dynamic_unused": ({}, True),  # the same model without --static_graph: DDP refuses its second step
    "bucket_view": ({"gradient_as_bucket_view": True}, False),
    "no_broadcast": ({"disable_broadcast_buffers": True}, False),
    "fp16": ({"ddp_comm_hook": "fp16"}, False),
    "bf16": ({"ddp_comm_hook": "bf16"}, False),
}
KNOB_LAYERS, KNOB_WIDTH, KNOB_BATCH = 12, 256, 4


class KnobModel(torch.nn.Module):
    """Linear layers, a buffer that nothing computes with (``stamp``), and, if ``unused``, a layer that
    forward never calls: its parameters get no gradient."""

    def __init__(self, unused=False):
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(KNOB_WIDTH, KNOB_WIDTH) for _ in range(KNOB_LAYERS)])
        self.unused = torch.nn.Linear(KNOB_WIDTH, KNOB_WIDTH) if unused else None
        self.register_buffer("stamp", torch.zeros(1))

    def forward(self, x):
        return self.layers(x)


def knob_batch(step):
    generator = torch.Generator().manual_seed(2000 + step)
    return torch.randn(KNOB_BATCH, KNOB_WIDTH, generator=generator)


def knob_loss(model, inputs):
    return (model(inputs) ** 2).mean()


def recording_all_reduce(buckets, bucket):
    """DDP's own all-reduce, noting each bucket's bytes and the storage its buffer lives in."""
    buffer = bucket.buffer()
    buckets.append({"bytes": buffer.numel() * buffer.element_size(),
                    "storage": buffer.untyped_storage().data_ptr()})
    return default_hooks.allreduce_hook(None, bucket)


def train_knobs(params, world, unused):
    """Two steps of the knob model under train.py's DDP wrapping; what DDP says and what it did."""
    torch.manual_seed(SEED)
    bare = KnobModel(unused)
    reference = KnobModel(unused)
    reference.load_state_dict(bare.state_dict())
    model = distributed.parallelize(bare, params, world, torch.device("cpu"))
    local = KNOB_BATCH // world.size
    part = slice(world.rank * local, (world.rank + 1) * local)
    buckets = []
    if params.ddp_comm_hook == "none":
        model.register_comm_hook(state=buckets, hook=recording_all_reduce)
    for step in range(2):
        del buckets[:]  # the second step's buckets: DDP rebuilds them after the first
        bare.stamp.fill_(world.rank + 1)  # each rank's own; a broadcast before forward makes it rank 0's
        model.zero_grad(set_to_none=True)
        knob_loss(model, knob_batch(step)[part]).backward()
    stamp = float(bare.stamp)
    knob_loss(reference, knob_batch(1)).backward()  # the whole batch's gradient, in one process
    grads = [p.grad for p in bare.parameters() if p.grad is not None]
    expected = [p.grad for p in reference.parameters() if p.grad is not None]
    logged = model._get_ddp_logging_data()
    return {
        "wrapped": {"bucket_cap_bytes": logged.get("bucket_cap_bytes"), "static_graph": model.static_graph,
                    "gradient_as_bucket_view": model.gradient_as_bucket_view,
                    "broadcast_buffers": getattr(model, "forward_sync_buffers", getattr(model, "broadcast_buffers", None)),
                    "comm_hook": logged.get("comm_hook")},
        "buckets": [bucket["bytes"] for bucket in buckets],
        "gradient_bytes": sum(g.numel() * g.element_size() for g in grads),
        "grads_in_buckets": sorted({g.untyped_storage().data_ptr() for g in grads})
        == sorted({bucket["storage"] for bucket in buckets}),
        "stamp": stamp,
        "fp16_exact": all(torch.equal(g, g.half().float()) for g in grads),
        "bf16_exact": all(torch.equal(g, g.bfloat16().float()) for g in grads),
        "error": max(float(((g - e).abs() / e.abs().max()).max()) for g, e in zip(grads, expected)),
    }


def run_ddp_knobs(world, out_dir):
    results = {}
    for name, (overrides, unused) in KNOBS.items():
        try:
            results[name] = train_knobs(make_params(**overrides), world, unused)
        except RuntimeError as error:  # the outcome is the result
            results[name] = {"raised": str(error)[:300]}
    with open(os.path.join(out_dir, f"ddp_knobs.rank{world.rank}.json"), "w") as f:
        json.dump(results, f)


def run_halo_exchange(world, out_dir, device):
    """Each rank sends a tensor of its rank's value to the other with batch_isend_irecv, as utils/halo.py
    does, and writes what it received (or the error) to halo_exchange.rank<R>.json."""
    outgoing = torch.full((4, 8, 8), float(world.rank + 1), device=device)
    incoming = torch.zeros_like(outgoing)
    dist, peer = torch.distributed, 1 - world.rank
    try:
        for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, outgoing, peer),
                                               dist.P2POp(dist.irecv, incoming, peer)]):
            request.wait()
        outcome = {"received": incoming.unique().tolist()}
    except Exception as error:  # the outcome is the result
        outcome = {"error": f"{type(error).__name__}: {error}"}
    with open(os.path.join(out_dir, f"halo_exchange.rank{world.rank}.json"), "w") as f:
        json.dump(outcome, f)


def run_until_lost(world, scenario):
    """Train DDP steps for long; rank 1 dies (or goes silent) after two, and rank 0 must give up."""
    params = make_params()
    device = torch.device("cpu")
    model, optimizer = build(params, world, device)
    for step in range(10_000):
        if world.rank == 1 and step == 2:
            print(f"rank 1 leaving at {time.time()}", flush=True)
            if scenario == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(300)  # the test ends it
        train_step(model, optimizer, world, step % 4)
        optimizer.step()
        distributed.agree_to_stop(False, world, device)


@exit_on_user_error
@distributed.exit_on_lost_rank
def main(scenario, out_dir):
    torch.set_num_threads(1)  # two ranks share the test machine's cores
    world = distributed.read_world()
    params = make_params(dist_timeout_s=int(os.environ.get("TEST_DIST_TIMEOUT_S", 60)))
    device = ranks_device()
    distributed.check_parallel_options(params, world, device)
    distributed.init_process_group(world, device, params)
    if scenario == "variants":
        run_variants(world, out_dir, device)
    elif scenario == "accumulation":
        run_accumulation(world, out_dir, device)
    elif scenario == "ddp_knobs":
        run_ddp_knobs(world, out_dir)
    elif scenario == "halo_exchange":
        run_halo_exchange(world, out_dir, device)
    else:
        run_until_lost(world, scenario)
    distributed.shutdown(world)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
