"""Data parallelism on real processes: two CPU ranks over gloo against one rank doing the same work.

The ranks are separate Python processes started the way torchrun starts them (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), running tests/dist_worker.py. Fed the same global batches, two ranks
must reach the weights one rank reaches (DDP averages the gradients of the halves, which is the
gradient of the mean loss over the whole batch), unless told not to communicate (noddp).
"""
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
import torch

import dist_worker
from conftest import ROOT, free_port, timeout_for
from utils import distributed
from utils.distributed import World
from utils.errors import UserError

CPU, GPU = torch.device("cpu"), torch.device("cuda")  # the device the ranks would train on (none is used)

WORKER = os.path.join(ROOT, "tests", "dist_worker.py")
EXACT_DDP = ["ddp", "ddp_bucket_view", "ddp_static"]


@contextlib.contextmanager
def ranks(scenario, out_dir, world_size=2, timeout_s=60):
    """Start ``world_size`` worker processes; whatever happens, none outlives the block."""
    port = free_port()
    processes = []
    try:
        for rank in range(world_size):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TEST_DIST_TIMEOUT_S": str(timeout_s),
                   "OMP_NUM_THREADS": "1"}
            with open(out_dir / f"{scenario}.rank{rank}.log", "w") as log:
                processes.append(subprocess.Popen([sys.executable, WORKER, scenario, str(out_dir)], cwd=ROOT,
                                                  env=env, stdout=log, stderr=subprocess.STDOUT))
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()


def logs(out_dir, scenario, world_size=2):
    return "\n".join(f"--- rank {rank}:\n" + (out_dir / f"{scenario}.rank{rank}.log").read_text()
                     for rank in range(world_size))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every variant trained on two ranks (one run of the worker), and the one-rank reference."""
    out_dir = tmp_path_factory.mktemp("variants")
    with ranks("variants", out_dir) as processes:
        reference = dist_worker.train(dist_worker.make_params(), World())  # meanwhile, in this process
        for process in processes:
            process.wait(timeout=timeout_for(240))
    assert [p.returncode for p in processes] == [0, 0], logs(out_dir, "variants")
    return out_dir, reference


def load(runs, variant):
    """Both ranks' results for ``variant``; fails the test with the rank's traceback if it raised."""
    out_dir, _ = runs
    results = []
    for rank in (0, 1):
        error = out_dir / f"{variant}.rank{rank}.error"
        if error.exists():
            pytest.fail(f"{variant} failed on rank {rank}:\n{error.read_text()}")
        results.append(torch.load(out_dir / f"{variant}.rank{rank}.pt", weights_only=True))
    return results


def relative_error(a, b):
    return float((a - b).norm() / b.norm())


def assert_ranks_identical(results):
    for name, value in results[0]["weights"].items():
        assert torch.equal(value, results[1]["weights"][name]), name


def assert_matches_reference(result, reference):
    """Equal to one rank's run up to float64 rounding (measured: 4e-15 relative, 7e-16 absolute on
    Intel and AMD CPUs); a real bug moves weights by a fraction of the learning rate (1e-3)."""
    # Per tensor, so that the tiny gradients of the deep layers count as much as the large ones.
    for name, grad in reference["grads"].items():
        assert relative_error(result["grads"][name], grad) < 1e-12, name
    for name, weight in reference["weights"].items():
        torch.testing.assert_close(result["weights"][name], weight, rtol=0, atol=1e-12, msg=name)
    for index, state in reference["optimizer"]["state"].items():
        for key, value in state.items():
            scale = float(value.abs().max())  # Adam's moments span many decades; compare at the tensor's scale
            torch.testing.assert_close(result["optimizer"]["state"][index][key], value, rtol=1e-10,
                                       atol=1e-12 * scale)


def assert_reload_round_trips(result):
    """Gathered states, loaded into a fresh (sharded) model and optimiser, gather back unchanged."""
    assert result["round_trip"]


# ----------------------------------------------------------------------------- DDP

@pytest.mark.parametrize("variant", EXACT_DDP)
def test_ddp_matches_one_rank(runs, variant):
    """Plain DDP; bucket_cap_mb=1 with gradient_as_bucket_view and no buffer broadcast; static_graph."""
    results = load(runs, variant)
    assert_ranks_identical(results)
    assert_matches_reference(results[0], runs[1])
    assert_reload_round_trips(results[0])


def test_exact_comparison_fails_on_a_wrong_average(runs):
    """The check above is not blind: gradients summed instead of averaged fail it, and so do
    weights that differ by bf16 rounding of the gradients alone."""
    summed = load(runs, "ddp_summed")
    assert_ranks_identical(summed)
    with pytest.raises(AssertionError):
        assert_matches_reference(summed[0], runs[1])
    bf16 = load(runs, "ddp_bf16")[0]
    weights_only = {**runs[1], "grads": {}, "optimizer": {"state": {}}}
    with pytest.raises(AssertionError):
        assert_matches_reference(bf16, weights_only)


def test_bf16_hook_matches_within_bf16_rounding(runs):
    results = load(runs, "ddp_bf16")
    assert_ranks_identical(results)
    reference = runs[1]
    # bf16 keeps 8 significant bits: about 0.4 % per element, far less over a whole tensor.
    errors = {name: relative_error(results[0]["grads"][name], grad) for name, grad in reference["grads"].items()}
    assert max(errors.values()) < 1e-2, errors
    assert min(errors.values()) > 1e-4, "every gradient must have gone through bf16"
    fp32 = load(runs, "ddp")[0]
    assert any(not torch.equal(value, fp32["weights"][name]) for name, value in results[0]["weights"].items())
    for name, weight in reference["weights"].items():
        torch.testing.assert_close(results[0]["weights"][name], weight, rtol=0, atol=3 * dist_worker.LR, msg=name)


def test_fp16_hook_matches_within_fp16_rounding(runs):
    results = load(runs, "ddp_fp16")
    assert_ranks_identical(results)
    # fp16 has 11 significant bits but a narrow range: most of the tiny U-Net's gradients at
    # initialisation (1e-13 and up in the deep layers) underflow. Where a gradient stays in fp16's
    # normal range after the hook halves it (above 2 x 6.1e-5), it is exact to fp16 rounding.
    checked = 0
    for name, grad in runs[1]["grads"].items():
        normal = grad.abs() > 1.3e-4
        checked += int(normal.sum())
        torch.testing.assert_close(results[0]["grads"][name][normal], grad[normal], rtol=2e-3, atol=0, msg=name)
    assert checked >= 20
    assert any(not torch.equal(results[0]["grads"][name], grad) for name, grad in runs[1]["grads"].items())


def test_noddp_ranks_train_apart(runs):
    """Without the wrapper no gradient is exchanged: each rank follows its own half of the batch."""
    results = load(runs, "noddp")
    differences = [float((results[0]["weights"][name] - value).abs().max())
                   for name, value in results[1]["weights"].items()]
    assert max(differences) > 1e-4
    assert relative_error(results[0]["grads"]["last.bias"], runs[1]["grads"]["last.bias"]) > 1e-2


# ----------------------------------------------------------------------------- FSDP

requires_fully_shard = pytest.mark.skipif(
    distributed.import_fully_shard() is None or distributed.torch_release() < (2, 9),
    reason=f"FSDP on CPU processes needs torch 2.9 (this is {torch.__version__}); train.py refuses it")


@requires_fully_shard
def test_fsdp_matches_one_rank(runs):
    results = load(runs, "fsdp")
    assert_ranks_identical(results)
    assert_matches_reference(results[0], runs[1])
    assert_reload_round_trips(results[0])
    # The gathered states have the one-device layout, so checkpoints move between DDP and FSDP.
    assert results[0]["weights"].keys() == runs[1]["weights"].keys()


@requires_fully_shard
def test_fsdp_holds_half_of_ddp_per_rank(runs):
    ddp = load(runs, "ddp")
    fsdp = load(runs, "fsdp")
    for rank in (0, 1):
        assert ddp[rank]["memory"] == runs[1]["memory"], "DDP holds the whole model on every rank"
        ratio = fsdp[rank]["memory"]["model_total"] / ddp[rank]["memory"]["model_total"]
        assert 0.45 < ratio < 0.55, (rank, fsdp[rank]["memory"], ddp[rank]["memory"])
    for key in ("parameters", "gradients", "optimizer_state"):
        # The shards cover the model exactly once (Adam's step counters are per rank).
        together = fsdp[0]["memory"][key] + fsdp[1]["memory"][key]
        assert together == pytest.approx(ddp[0]["memory"][key], abs=8 * 20 * 2), key
    assert "optimizer state" in distributed.describe_memory(fsdp[0]["memory"])


@requires_fully_shard
def test_train_py_reports_ddp_and_fsdp_memory_per_rank(data_files, tmp_path):
    """train.py under torchrun, DDP then FSDP: the memory report in out.log and TensorBoard; rank 0 writes."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def torchrun(parallel):
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                   os.path.join(ROOT, "train.py"), "--config=test", f"--train_path={data_files['train']}",
                   f"--val_path={data_files['valid']}", f"--expdir={tmp_path}", f"--run_num={parallel}",
                   f"--parallel={parallel}", "--local_batch_size=3", "--num_epochs=1", "--val_metrics=false"]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(300),
                              env={**os.environ, "OMP_NUM_THREADS": "1"})

    reports = {}
    for parallel in ("ddp", "fsdp"):
        result = torchrun(parallel)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        run_dir = tmp_path / "test" / "2CPU" / parallel
        log = (run_dir / "out.log").read_text()
        assert ("FSDP (fully_shard" if parallel == "fsdp" else "Data parallel: DDP over 2 ranks") in log
        assert "INFO - global_batch_size 6\n" in log and "local batch 3" in log  # --local_batch_size=3 on 2 ranks
        match = re.search(r"Memory per rank: parameters ([\d.]+) MiB, gradients ([\d.]+) MiB, "
                          r"optimizer state ([\d.]+) MiB, total ([\d.]+) MiB", log)
        assert match, log[-3000:]
        events = EventAccumulator(str(run_dir / "logs"), size_guidance={"scalars": 0})
        events.Reload()
        scalars = {key: events.Scalars(f"Memory/{key}_MiB")[0].value
                   for key in ("parameters", "gradients", "optimizer_state", "model_total")}
        assert [round(v, 1) for v in scalars.values()] == [float(g) for g in match.groups()]
        reports[parallel] = scalars
        # Logs, TensorBoard and checkpoints come from rank 0 alone: one event file, one checkpoint.
        assert len(list((run_dir / "logs").glob("events.out.tfevents.*"))) == 1
        assert sorted(os.listdir(run_dir)) == ["checkpoint.pt", "config.yaml", "logs", "out.log"]
    for key, ddp_value in reports["ddp"].items():  # each FSDP rank holds about half of what a DDP rank holds
        assert 0.4 < reports["fsdp"][key] / ddp_value < 0.6, (key, reports)

    # The same run again, without --resume: the ranks refuse with the message and status 2 (an error
    # after the ranks' first collective could make a rank abort with SIGABRT in its clean-up). A rank
    # still exiting when torchrun sees the first failure gets torchrun's SIGTERM (-15).
    log = (tmp_path / "test" / "2CPU" / "ddp" / "out.log").read_text()
    result = torchrun("ddp")
    assert result.returncode != 0 and "already holds a run" in result.stderr, result.stderr[-3000:]
    statuses = re.findall(r"exitcode\s*: (-?\d+)", result.stderr)
    assert "2" in statuses and set(statuses) <= {"2", "-15"}, result.stderr[-3000:]
    assert (tmp_path / "test" / "2CPU" / "ddp" / "out.log").read_text() == log


# ----------------------------------------------------------------------------- stopping together

def test_agree_to_stop(runs):
    out_dir, _ = runs
    for rank in (0, 1):
        agreed = json.loads((out_dir / f"agree.rank{rank}.json").read_text())
        assert agreed == {"rank0_flags": True, "none_flags": False, "last_flags": True, "and_steps": [True, 3]}, rank
    assert distributed.agree_to_stop(True, World(), torch.device("cpu")) is True
    assert distributed.agree_to_stop_and_steps(False, 5, World(), torch.device("cpu")) == (False, 5)


@pytest.mark.parametrize("how", ["die", "hang"])
def test_lost_rank_ends_the_others_with_a_message(tmp_path, how):
    """Rank 1 is SIGKILLed (or stops answering) mid-run; rank 0 must exit within the timeout."""
    timeout_s = 5
    with ranks(how, tmp_path, timeout_s=timeout_s) as processes:
        try:
            processes[0].wait(timeout=timeout_s + 90)
        except subprocess.TimeoutExpired:
            pytest.fail("rank 0 hangs after losing rank 1:\n" + logs(tmp_path, how))
        finished = time.time()
    output = (tmp_path / f"{how}.rank0.log").read_text()
    left = re.search(r"rank 1 leaving at ([\d.]+)", (tmp_path / f"{how}.rank1.log").read_text())
    assert left, logs(tmp_path, how)
    waited = finished - float(left.group(1))
    assert processes[0].returncode == 2, logs(tmp_path, how)
    assert waited < timeout_s + 15, waited
    if how == "hang":
        assert waited > timeout_s * 0.8, "rank 0 must wait out the timeout for a silent rank"
    message = " ".join(output.split())
    assert message.startswith("error: Rank 0 of 2 stopped") and "Traceback" not in output, output
    assert "another rank died" in message and f"dist_timeout_s={timeout_s}" in message


def test_missing_rank_at_start_ends_with_a_message(tmp_path):
    """Rank 0 of two, alone: the rendezvous gives up after dist_timeout_s."""
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "TEST_DIST_TIMEOUT_S": "3"}
    start = time.time()
    result = subprocess.run([sys.executable, WORKER, "variants", str(tmp_path)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=timeout_for(90))
    assert result.returncode == 2, result.stderr
    assert time.time() - start < 3 + 30
    message = " ".join(result.stderr.split())
    assert "could not meet the other ranks" in message and "Traceback" not in result.stderr


# ----------------------------------------------------------------------------- bad input

def test_world_without_master_addr(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(UserError, match="MASTER_ADDR is not set"):
        distributed.init_process_group(World(2, 0, 0), torch.device("cpu"), dist_worker.make_params())


def test_port_in_use(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(taken.getsockname()[1]))
        with pytest.raises(UserError, match="another program"):
            distributed.init_process_group(World(2, 0, 0), torch.device("cpu"),
                                           dist_worker.make_params(dist_timeout_s=5))


@pytest.mark.parametrize("overrides, fragment", [
    ({"parallel": "fsdp", "noddp": True}, "cannot be combined with --noddp"),
    ({"parallel": "fsdp", "ddp_comm_hook": "bf16"}, "does not use DDP"),
    ({"noddp": True, "ddp_comm_hook": "fp16"}, "--noddp sends none"),
])
def test_contradictory_options_refused(overrides, fragment):
    for world in (World(), World(2, 1, 1)):
        with pytest.raises(UserError, match=fragment):
            distributed.check_parallel_options(dist_worker.make_params(**overrides), world, CPU)


def test_fsdp_refused_in_a_cuda_graph():
    with pytest.raises(UserError, match="captured CUDA graph"):
        distributed.check_parallel_options(dist_worker.make_params(parallel="fsdp"), World(2, 0, 0), GPU,
                                           graph_capture=True)


def test_fsdp_refuses_channels_last_weights():
    """fully_shard raises NotImplementedError on non-contiguous parameters; the user gets the reason."""
    params = dist_worker.make_params(parallel="fsdp", channels_last=True)
    with pytest.raises(UserError, match="Drop --channels_last"):
        distributed.check_parallel_options(params, World(2, 0, 0), GPU)
    distributed.check_parallel_options(params, World(), GPU)  # one rank shards nothing


def test_ddp_in_a_cuda_graph_needs_eleven_warm_up_steps():
    world = World(2, 0, 0)
    with pytest.raises(UserError, match="--graph_warmup_steps=11 or more"):
        distributed.check_parallel_options(dist_worker.make_params(graph_warmup_steps=10), world, GPU,
                                           graph_capture=True)
    distributed.check_parallel_options(dist_worker.make_params(graph_warmup_steps=11), world, GPU, graph_capture=True)
    distributed.check_parallel_options(dist_worker.make_params(graph_warmup_steps=3), World(), GPU, graph_capture=True)


@contextlib.contextmanager
def one_rank_group(tmp_path):
    """A real gloo process group of one rank in this process, for building DDP wrappers."""
    if torch.distributed.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def grad_storages(model):
    """How many distinct storages the parameters' gradients live in."""
    return len({p.grad.untyped_storage().data_ptr() for p in model.parameters()})


@pytest.mark.parametrize("broadcast_off, bucket_view", [(True, False), (False, True), (True, True)])
def test_ddp_knobs_are_separate_and_broadcast_is_a_no_op_for_the_unet(tmp_path, broadcast_off, bucket_view):
    """--disable_broadcast_buffers and --gradient_as_bucket_view each set only their own DDP option. The
    U-Net has no buffers, so DDP syncs none whatever the flag says; with bucket views the gradients share
    DDP's few bucket storages after backward, also after zero_grad(set_to_none=True) as train.py does it."""
    from networks.UNet import UNet
    params = dist_worker.make_params(disable_broadcast_buffers=broadcast_off, gradient_as_bucket_view=bucket_view,
                                     bucket_cap_mb=1)
    torch.manual_seed(0)
    model = UNet(4, 5, 4, False)
    assert not list(model.buffers())
    with one_rank_group(tmp_path):
        ddp = distributed.wrap_ddp(model, params, CPU)
        assert ddp.gradient_as_bucket_view is bucket_view
        assert getattr(ddp, "forward_sync_buffers", getattr(ddp, "broadcast_buffers", None)) is not broadcast_off
        assert not ddp.will_sync_module_buffers()  # no buffers: nothing to broadcast either way
        optimizer = torch.optim.Adam(ddp.parameters())
        for _ in range(2):  # the second step after set_to_none, as in train.py
            optimizer.zero_grad(set_to_none=True)
            ddp(torch.randn(1, 4, 32, 32, 32)).abs().mean().backward()
            storages = grad_storages(model)
            optimizer.step()
    parameters = len(list(model.parameters()))
    if bucket_view:
        assert storages < parameters / 4, (storages, parameters)  # views of a few buckets
    else:
        assert storages == parameters


def test_sensible_options_accepted():
    for overrides in ({}, {"parallel": "fsdp"}, {"noddp": True}, {"ddp_comm_hook": "bf16", "static_graph": True}):
        distributed.check_parallel_options(dist_worker.make_params(**overrides), World(2, 0, 0), GPU)


@pytest.mark.parametrize("release, refused", [((2, 8), True), ((2, 9), False)])
def test_fsdp_on_cpu_processes_needs_torch_2_9(monkeypatch, release, refused):
    monkeypatch.setattr(distributed, "torch_release", lambda: release)
    params = dist_worker.make_params(parallel="fsdp")
    distributed.check_parallel_options(params, World(2, 0, 0), GPU)  # NCCL's fully_shard: no such limit
    distributed.check_parallel_options(params, World(), CPU)  # one rank shards nothing
    if refused:
        with pytest.raises(UserError, match="needs PyTorch 2.9 or newer"):
            distributed.check_parallel_options(params, World(2, 0, 0), CPU)
    else:
        distributed.check_parallel_options(params, World(2, 0, 0), CPU)


@pytest.fixture(scope="module")
def knobs(tmp_path_factory):
    """Every DDP knob on two gloo ranks (one run of the worker): rank 1's results, as both see the same."""
    out_dir = tmp_path_factory.mktemp("ddp_knobs")
    with ranks("ddp_knobs", out_dir) as processes:
        for process in processes:
            process.wait(timeout=timeout_for(120))
    assert [p.returncode for p in processes] == [0, 0], logs(out_dir, "ddp_knobs")
    return [json.loads((out_dir / f"ddp_knobs.rank{rank}.json").read_text()) for rank in (0, 1)]


def knob_run(knobs, name):
    result = knobs[1][name]
    assert "raised" not in result, result
    return result


def test_bucket_cap_mb_reaches_ddp_and_sizes_its_buckets(knobs):
    """3.16 MB of float32 gradients: one rebuilt bucket under DDP's default cap (25 MB), three of
    1052672 bytes (four weights and four biases of 256 x 256, the first past 1 MiB) under --bucket_cap_mb=1."""
    default, capped = knob_run(knobs, "default"), knob_run(knobs, "cap_1mb")
    assert default["wrapped"]["bucket_cap_bytes"] == 25 * 2**20
    assert capped["wrapped"]["bucket_cap_bytes"] == 2**20
    assert default["buckets"] == [default["gradient_bytes"]]
    assert capped["buckets"] == [4 * (256 * 256 + 256) * 4] * 3
    assert sum(capped["buckets"]) == capped["gradient_bytes"]
    assert capped["error"] < 1e-5  # the buckets still average the ranks' gradients


def test_static_graph_reaches_ddp_and_lets_a_parameter_go_without_gradient(knobs):
    """A layer that forward never calls: DDP without static_graph (and without find_unused_parameters)
    refuses the second step; with --static_graph it trains, and the used layers' gradients are right."""
    assert "Expected to have finished reduction" in knobs[1]["dynamic_unused"]["raised"]
    static = knob_run(knobs, "static")
    assert static["wrapped"]["static_graph"] is True
    assert knob_run(knobs, "default")["wrapped"]["static_graph"] is False
    assert static["error"] < 1e-5


def test_gradient_as_bucket_view_makes_the_gradients_views_of_the_buckets(knobs):
    view, default = knob_run(knobs, "bucket_view"), knob_run(knobs, "default")
    assert view["wrapped"]["gradient_as_bucket_view"] is True and default["wrapped"]["gradient_as_bucket_view"] is False
    assert view["grads_in_buckets"] and not default["grads_in_buckets"]
    assert view["error"] < 1e-5


def test_disable_broadcast_buffers_keeps_each_ranks_own_buffer(knobs):
    """Each rank sets the model's buffer to rank + 1 before forward: DDP's default broadcast makes rank 1's
    rank 0's (1.0); --disable_broadcast_buffers leaves it 2.0."""
    off, default = knob_run(knobs, "no_broadcast"), knob_run(knobs, "default")
    assert off["wrapped"]["broadcast_buffers"] is False and default["wrapped"]["broadcast_buffers"] is True
    assert default["stamp"] == 1.0 and off["stamp"] == 2.0
    assert knobs[0]["no_broadcast"]["stamp"] == knobs[0]["default"]["stamp"] == 1.0


def test_ddp_comm_hook_registers_the_hook_and_rounds_the_reduced_gradients(knobs):
    """fp16: every reduced gradient is an fp16 number (not every one a bf16 number), off the exact average
    by fp16's rounding and underflow; bf16 the same in bf16. Without a hook the average is float32's."""
    fp16, bf16, plain = knob_run(knobs, "fp16"), knob_run(knobs, "bf16"), knob_run(knobs, "default")
    assert fp16["wrapped"]["comm_hook"] == "fp16_compress_hook"
    assert bf16["wrapped"]["comm_hook"].endswith("bf16_compress_hook")
    assert fp16["fp16_exact"] and not fp16["bf16_exact"]
    assert bf16["bf16_exact"] and not bf16["fp16_exact"]
    assert not plain["fp16_exact"] and not plain["bf16_exact"]
    assert plain["error"] < 1e-5
    for rounded in (fp16, bf16):
        assert 1e-4 < rounded["error"] < 0.1, rounded["error"]
