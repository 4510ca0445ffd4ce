"""Gradient accumulation (utils/accumulation.py, --grad_accum_steps): K micro-batches of B train as one
batch of K*B, on one rank and on two gloo ranks (DDP, FSDP), in float64 with train.py's own step; DDP
all-reduces each bucket once per optimiser step, not K times; FSDP keeps the weights it gathered for a
backward until the next micro-batch's forward; options that cannot work are refused; train.py counts
steps and samples as without it."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

import dist_worker
from conftest import ROOT, run_train, timeout_for
from test_distributed import assert_matches_reference, load, logs, ranks, requires_fully_shard
from test_train import data_args, read_events
from utils.YParams import load_params
from utils.accumulation import GradAccumulation
from utils.distributed import World
from utils.errors import UserError


def reference():
    """One rank, one batch of GLOBAL_BATCH samples per optimiser step: what accumulation must reproduce."""
    return dist_worker.train_accumulating(dist_worker.make_params(grad_accum_steps=1), World())


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory):
    """Every accumulation variant of tests/dist_worker.py on two ranks, and the one-rank reference."""
    out_dir = tmp_path_factory.mktemp("accumulation")
    with ranks("accumulation", out_dir) as processes:
        one_rank = reference()  # meanwhile, in this process
        for process in processes:
            process.wait(timeout=timeout_for(240))
    assert [p.returncode for p in processes] == [0, 0], logs(out_dir, "accumulation")
    return out_dir, one_rank


# ----------------------------------------------------------------------------- one rank

@pytest.mark.parametrize("steps", [2, 4])
def test_k_micro_batches_train_as_one_batch_on_one_rank(steps):
    result = dist_worker.train_accumulating(dist_worker.make_params(grad_accum_steps=steps), World())
    assert_matches_reference(result, reference())


def test_the_comparison_fails_without_the_one_over_k_scale():
    unscaled = dist_worker.train_accumulating(dist_worker.make_params(grad_accum_steps=2), World(),
                                              accumulation=dist_worker.UnscaledAccumulation)
    with pytest.raises(AssertionError):
        assert_matches_reference(unscaled, reference())


def test_micro_batches_are_views_in_the_batchs_layout():
    inputs = torch.randn(4, 4, 8, 8, 8).to(memory_format=torch.channels_last_3d)
    targets = torch.randn(4, 5, 8, 8, 8)
    parts = list(GradAccumulation(torch.nn.Linear(1, 1), 2).micro_batches(inputs, targets))
    assert len(parts) == 2
    for index, (x, y, _) in enumerate(parts):
        assert torch.equal(x, inputs[2 * index:2 * index + 2]) and torch.equal(y, targets[2 * index:2 * index + 2])
        assert x.data_ptr() == inputs[2 * index].data_ptr()  # a view: no copy of the batch
        assert x.is_contiguous(memory_format=torch.channels_last_3d)


# ----------------------------------------------------------------------------- two ranks

@pytest.mark.slow
@pytest.mark.parametrize("variant", ["ddp_k2", "ddp_bucket_view_k2"])
def test_ddp_with_accumulation_matches_one_rank(accumulated, variant):
    results = load(accumulated, variant)
    for name, value in results[0]["weights"].items():
        assert torch.equal(value, results[1]["weights"][name]), name
    assert_matches_reference(results[0], accumulated[1])


@requires_fully_shard
def test_fsdp_with_accumulation_matches_one_rank(accumulated):
    results = load(accumulated, "fsdp_k2")
    assert_matches_reference(results[0], accumulated[1])


# Two gloo ranks shard the float64 test U-Net as train.py does (utils.distributed.shard_model: each block,
# then the root) and count FSDP's all-gathers in one optimiser step of train.py's step, for K = 1, 2, 4.
ALL_GATHER_WORKER = """
import json, sys
import torch, torch.distributed as dist
calls = []
for name in ("all_gather_single", "all_gather_into_tensor"):  # FSDP's all-gather, by torch version
    if hasattr(dist, name):
        def counted(*args, _collective=getattr(dist, name), **kwargs):
            calls.append(name)
            return _collective(*args, **kwargs)
        setattr(dist, name, counted)
sys.path.insert(0, "tests")
from dist_worker import GradAccumulation, Precision, build, build_loss, distributed, global_batch, make_params
from dist_worker import train_py_step, training_loss
world, cpu = distributed.read_world(), torch.device("cpu")
distributed.init_process_group(world, cpu, make_params())
counts = {}
for steps in (1, 2, 4):
    params = make_params(parallel="fsdp", grad_accum_steps=steps)
    model, optimizer = build(params, world, cpu)
    accumulation = GradAccumulation(model, steps)
    for step in range(2):  # the first makes FSDP's lazy state; the second is counted
        before = len(calls)
        train_py_step(training_loss(model, build_loss(params), params), optimizer, Precision("none", cpu),
                      accumulation, *global_batch(step))
    counts[steps] = len(calls) - before
counts["blocks"] = len(model.down) + len(model.up)
if world.rank == 0:
    json.dump(counts, open(sys.argv[1], "w"))
distributed.shutdown(world)
"""


@requires_fully_shard
@pytest.mark.skipif(not hasattr(getattr(torch.distributed.fsdp, "FSDPModule", None), "set_reshard_after_backward"),
                    reason="this torch's fully_shard has no set_reshard_after_backward")
@pytest.mark.slow
def test_fsdp_gathers_the_weights_again_for_a_later_micro_batch_only_for_its_backward(tmp_path):
    """One micro-batch (K = 1) gathers each unit's weights for its forward and each block's again for its
    backward (the root keeps its own after the forward). A later micro-batch finds the weights its
    predecessor's backward kept (set_reshard_after_backward(False)) and gathers only each block's, for its
    backward; without that each micro-batch would pay K = 1's gathers again (2x and 4x for K = 2, 4)."""
    worker, counts_path = tmp_path / "worker.py", tmp_path / "counts.json"
    worker.write_text(ALL_GATHER_WORKER)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(worker), str(counts_path)], cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(600),
                            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    counts = json.loads(counts_path.read_text())
    blocks = counts["blocks"]
    assert counts["1"] == 2 * blocks + 1, counts  # forward: the blocks and the root; backward: the blocks
    assert counts["2"] == counts["1"] + blocks and counts["4"] == counts["1"] + 3 * blocks, counts


def assert_one_all_reduce_per_bucket(result):
    """Every optimiser step all-reduces each of DDP's buckets exactly once."""
    for step, buckets in enumerate(result["all_reduces"]):
        assert buckets and sorted(buckets) == list(range(len(set(buckets)))), \
            f"step {step}: all-reduced buckets {buckets}, not each bucket once"


def test_ddp_all_reduces_each_bucket_once_per_optimiser_step(accumulated):
    k1, k2 = load(accumulated, "ddp_k1")[0], load(accumulated, "ddp_k2")[0]
    assert_one_all_reduce_per_bucket(k1)
    assert_one_all_reduce_per_bucket(k2)
    assert k2["all_reduces"] == k1["all_reduces"]  # the same buckets as without accumulation
    # Several buckets (1 MB ones; 2.1 MB of gradients) once DDP has rebuilt them after the first step.
    assert all(len(buckets) >= 2 for buckets in k2["all_reduces"][1:]), k2["all_reduces"]


def test_the_checks_fail_on_a_wrong_accumulation(accumulated):
    """Without no_sync() the weights are right (all-reduce is linear) but every micro-batch all-reduces:
    only the count shows it. Without the 1/K scale the gradients are K times too large."""
    every = load(accumulated, "ddp_k2_sync_every")[0]
    assert_matches_reference(every, accumulated[1])
    with pytest.raises(AssertionError, match="not each bucket once"):
        assert_one_all_reduce_per_bucket(every)
    # After DDP rebuilt its buckets (in the first step's second backward here), twice as many all-reduces.
    once = load(accumulated, "ddp_k1")[0]["all_reduces"]
    assert [len(b) for b in every["all_reduces"][1:]] == [2 * len(b) for b in once[1:]]
    with pytest.raises(AssertionError):
        assert_matches_reference(load(accumulated, "ddp_k2_unscaled")[0], accumulated[1])


# ----------------------------------------------------------------------------- refused, and train.py's counts

@pytest.mark.parametrize("argv, world_size, fragment", [
    (["--config=test", "--grad_accum_steps=3"], 1, r"does not divide the local batch of 4 samples per rank"),
    (["--config=test", "--local_batch_size=3", "--grad_accum_steps=2"], 2, r"Use a divisor of 3 \(1, 3\)"),
    (["--config=test", "--grad_accum_steps=0"], 1, r"must be a positive integer"),
])
def test_a_k_that_does_not_split_the_local_batch_is_refused(argv, world_size, fragment):
    with pytest.raises(UserError, match=fragment):
        load_params(argv, world_size)
    assert load_params(["--config=test", "--local_batch_size=3", "--grad_accum_steps=3"], 2).grad_accum_steps == 3


def test_train_graph_refuses_accumulation():
    from train_graph import make_graph_step
    params = load_params(["--config=test", "--grad_accum_steps=2"])
    with pytest.raises(UserError, match="cannot run in train_graph.py"):
        make_graph_step(torch.nn.Linear(1, 1), None, None, None, params)


@pytest.mark.slow
def test_train_py_counts_steps_and_samples_as_without_accumulation(data_files, tmp_path):
    """The same run with K = 1 and K = 2: the same steps in TensorBoard and the checkpoint, the same
    learning rates and samples per epoch, and losses equal up to float32 rounding; a resumed K = 2 run
    lands on the same step boundary."""
    runs = {}
    for steps in (1, 2):
        result = run_train(data_args(data_files, tmp_path, f"--run_num=k{steps}", f"--grad_accum_steps={steps}",
                                     "--val_metrics=false"))
        run_dir = tmp_path / "test" / "1CPU" / f"k{steps}"
        log = (run_dir / "out.log").read_text()
        assert re.search(r"Time taken for epoch 2 is [\d.]+ sec, avg [\d.]+ samples/sec", log), result.stdout
        events = read_events(run_dir)
        runs[steps] = {tag: [(e.step, e.value) for e in events.Scalars(tag)]
                       for tag in ("Loss/train", "Loss/valid", "Learning Rate")}
        assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["position"]["step"] == 8
    for tag, values in runs[1].items():
        assert [step for step, _ in runs[2][tag]] == [step for step, _ in values], tag
        for (_, got), (_, want) in zip(runs[2][tag], values):
            assert got == pytest.approx(want, rel=1e-4), tag
    assert runs[2]["Learning Rate"] == runs[1]["Learning Rate"]
    resumed = run_train(data_args(data_files, tmp_path, "--run_num=k2", "--grad_accum_steps=2", "--num_epochs=3",
                                  "--val_metrics=false", "--resume", "--allow_changes=num_epochs"))
    assert "Resumed from" in resumed.stdout and "at epoch 3, step 8" in resumed.stdout + resumed.stderr
    events = read_events(tmp_path / "test" / "1CPU" / "k2")
    assert [e.step for e in events.Scalars("Loss/train")] == [0, 4, 8, 12]


@pytest.mark.slow
def test_micro_batches_of_domain_blocks_train_as_one_undivided_process(tmp_path):
    """Two ranks sharing every 64^3 sample ([2,1,1]), each batch of 2 in two micro-batches of 1 (halo
    exchanges in each), against one process training whole batches: tests/test_domain_parallel.py's
    comparison of every scalar, the weights and Adam's first moments."""
    from test_domain_parallel import assert_same_training, torchrun
    batches = ["--global_batch_size=2", "--Nsamples=6"]
    one = torchrun(1, tmp_path, "one", *batches)
    accumulated = torchrun(2, tmp_path, "mesh_k2", *batches, "--domain_mesh=[2,1,1]", "--grad_accum_steps=2")
    assert_same_training(accumulated, one)
