"""The distributed code on CUDA tensors, with two ranks on ONE GPU over gloo (DIST_BACKEND=gloo).

NCCL refuses two ranks on one GPU, so a machine with a single GPU runs DDP, FSDP and gradient accumulation
on CUDA tensors over gloo, which copies each CUDA tensor through host memory for its collectives. Each is
compared with one rank, as the CPU tests do (tests/test_distributed.py, tests/test_accumulation.py,
tests/test_domain_parallel.py): the workers of tests/dist_worker.py with TEST_DEVICE=cuda, and train.py
itself under torchrun (DDP with buckets and the device prefetcher, FSDP, --grad_accum_steps, --resume).

What gloo cannot do on CUDA tensors (torch's ProcessGroupGloo): its send and recv hand the tensor's own
pointer to gloo's TCP transport, without the host copy its collectives make, so the halo exchange of a
domain mesh (batch_isend_irecv) does not run; train.py refuses the mesh over gloo on GPUs, and a test here
sends CUDA tensors that way to show that the refusal is still needed. What stays untested without NCCL (a
machine with two GPUs or more: the multi-gpu stage of benchmarks/suite/gpu_suite.sh): NCCL itself, the halo
exchange on CUDA tensors, the CUDA-graph step under DDP, and any overlap of communication with compute.

The backend's choice and its refusals are checked here on the CPU; the rest needs a GPU (``-m gpu``).
"""
import json
import os
import subprocess
import sys

import pytest
import torch

import test_distributed
from conftest import ROOT, SIGNAL_DURING_STEP, needs_cuda, timeout_for
from test_accumulation import assert_one_all_reduce_per_bucket
from test_distributed import assert_matches_reference, load, logs, ranks
from test_domain_parallel import assert_same_training, checkpoint
from utils import distributed
from utils.distributed import World, choose_backend
from utils.errors import UserError

import dist_worker

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)  # the device the ranks would train on (none is used)
GLOO_ON_GPU = {"DIST_BACKEND": "gloo", "TEST_DEVICE": "cuda", "OMP_NUM_THREADS": "1"}


# ----------------------------------------------------------------------------- the backend's choice (CPU)

@pytest.mark.parametrize("asked, device, backend", [(None, CPU, "gloo"), (None, GPU, "nccl"), ("", GPU, "nccl"),
                                                    ("gloo", GPU, "gloo"), (" Gloo ", CPU, "gloo"),
                                                    ("nccl", GPU, "nccl")])
def test_nccl_between_gpus_gloo_between_cpus_unless_asked(monkeypatch, asked, device, backend):
    if asked is None:
        monkeypatch.delenv("DIST_BACKEND", raising=False)
    else:
        monkeypatch.setenv("DIST_BACKEND", asked)
    assert choose_backend(device) == backend


@pytest.mark.parametrize("asked, device, fragment", [("mpi", GPU, "DIST_BACKEND=mpi is not a backend this code uses"),
                                                     ("nccl", CPU, "DIST_BACKEND=nccl needs GPUs")])
def test_a_backend_that_cannot_work_is_refused(monkeypatch, asked, device, fragment):
    monkeypatch.setenv("DIST_BACKEND", asked)
    with pytest.raises(UserError, match=fragment):
        choose_backend(device)


def test_init_process_group_joins_over_the_chosen_backend(monkeypatch):
    joined = []
    monkeypatch.setenv("DIST_BACKEND", "gloo")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend, **kwargs: joined.append(backend))
    monkeypatch.setattr(distributed, "build_domain_mesh", lambda params, world, device: "mesh")
    assert distributed.init_process_group(World(2, 0, 0), GPU, dist_worker.make_params()) == "mesh"
    monkeypatch.delenv("DIST_BACKEND")
    distributed.init_process_group(World(2, 0, 0), GPU, dist_worker.make_params())
    assert joined == ["gloo", "nccl"]


def test_gloo_on_gpus_refuses_a_domain_mesh_and_old_fsdp(monkeypatch):
    monkeypatch.setenv("DIST_BACKEND", "gloo")
    mesh = dist_worker.make_params(domain_mesh=[2, 1, 1])
    with pytest.raises(UserError, match=r"DIST_BACKEND=gloo cannot exchange the halos of --domain_mesh=\[2, 1, 1\]"):
        distributed.check_parallel_options(mesh, World(2, 0, 0), GPU)
    distributed.check_parallel_options(mesh, World(2, 0, 0), CPU)  # gloo between CPU processes sends host memory
    monkeypatch.setattr(distributed, "torch_release", lambda: (2, 8))
    with pytest.raises(UserError, match="over gloo .* needs PyTorch 2.9 or newer"):
        distributed.check_parallel_options(dist_worker.make_params(parallel="fsdp"), World(2, 0, 0), GPU)
    monkeypatch.delenv("DIST_BACKEND")
    distributed.check_parallel_options(dist_worker.make_params(parallel="fsdp"), World(2, 0, 0), GPU)  # NCCL
    distributed.check_parallel_options(mesh, World(2, 0, 0), GPU)


def test_the_halo_exchange_probe_works_between_cpu_ranks(tmp_path):
    """The probe the GPU test sends CUDA tensors with, on CPU tensors: each rank receives the other's."""
    assert exchange_halos(tmp_path, {}) == [{"received": [2.0]}, {"received": [1.0]}]


def test_a_probe_whose_ranks_crash_counts_as_failing_not_as_an_error(tmp_path):
    """gloo on CUDA tensors may abort a rank rather than raise: the GPU test takes that as "cannot send".
    Here a rank crashes at once (a device that does not exist)."""
    assert exchange_halos(tmp_path, {"TEST_DEVICE": "no_such_device"}, failed="crashed") == "crashed"
    with pytest.raises(AssertionError):
        exchange_halos(tmp_path, {"TEST_DEVICE": "no_such_device"})


def exchange_halos(out_dir, env, failed=None):
    """Each rank's received halo. A rank that crashes or hangs fails the test, or, with ``failed``, returns
    ``failed`` in place of the outcomes (gloo on CUDA tensors may abort or hang instead of raising)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        with ranks("halo_exchange", out_dir, timeout_s=30) as processes:
            try:
                for process in processes:
                    process.wait(timeout=timeout_for(120))
            except subprocess.TimeoutExpired:
                if failed is None:
                    raise
                return failed  # the ranks context ends the processes
    if failed is not None and [p.returncode for p in processes] != [0, 0]:
        return failed
    assert [p.returncode for p in processes] == [0, 0], logs(out_dir, "halo_exchange")
    return [json.loads((out_dir / f"halo_exchange.rank{rank}.json").read_text()) for rank in (0, 1)]


# ----------------------------------------------------------------------------- two ranks on one GPU

@pytest.fixture(scope="module")
def cuda_runs(tmp_path_factory):
    """tests/dist_worker.py's variants (DDP and its knobs, the fp16 and bf16 comm hooks, FSDP) and its
    accumulation variants, on two ranks sharing the GPU over gloo; the one-rank references on the GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    out = {}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in GLOO_ON_GPU.items():
            patch.setenv(name, value)
        for scenario in ("variants", "accumulation"):
            out_dir = tmp_path_factory.mktemp(f"cuda_{scenario}")
            with ranks(scenario, out_dir, timeout_s=120) as processes:
                for process in processes:
                    process.wait(timeout=timeout_for(400))
            assert [p.returncode for p in processes] == [0, 0], logs(out_dir, scenario)
            out[scenario] = out_dir
        device = dist_worker.ranks_device()
        reference = dist_worker.train(dist_worker.make_params(), World(), device)
        accumulated = dist_worker.train_accumulating(dist_worker.make_params(grad_accum_steps=1), World(), device)
    return out, reference, accumulated


@needs_cuda()
@pytest.mark.parametrize("variant", test_distributed.EXACT_DDP + ["fsdp"])
def test_ddp_and_fsdp_on_cuda_tensors_match_one_rank(cuda_runs, variant):
    out, reference, _ = cuda_runs
    results = load((out["variants"], None), variant)
    test_distributed.assert_ranks_identical(results)
    assert_matches_reference(results[0], reference)
    test_distributed.assert_reload_round_trips(results[0])


@needs_cuda()
@pytest.mark.parametrize("variant", ["fp16", "bf16"])
def test_the_comm_hooks_on_cuda_tensors_match_within_their_rounding(cuda_runs, variant):
    out, reference, _ = cuda_runs
    runs = (out["variants"], reference)
    getattr(test_distributed, f"test_{variant}_hook_matches_within_{variant}_rounding")(runs)


@needs_cuda()
def test_the_exact_comparison_still_fails_on_a_wrong_average_on_cuda(cuda_runs):
    out, reference, _ = cuda_runs
    test_distributed.test_exact_comparison_fails_on_a_wrong_average((out["variants"], reference))


@needs_cuda()
@pytest.mark.parametrize("variant", ["ddp_k2", "ddp_bucket_view_k2", "fsdp_k2"])
def test_accumulation_on_cuda_tensors_matches_one_rank(cuda_runs, variant):
    out, _, accumulated = cuda_runs
    results = load((out["accumulation"], None), variant)
    assert_matches_reference(results[0], accumulated)
    if variant.startswith("ddp"):
        assert_one_all_reduce_per_bucket(results[0])


@needs_cuda()
def test_gloo_still_cannot_send_cuda_tensors_point_to_point(tmp_path):
    """Why a domain mesh is refused over gloo on GPUs: the halo exchange's messages, on CUDA tensors, fail
    or arrive wrong (a rank that crashes or hangs counts as failing). If this test fails, gloo has learnt to
    send them: drop the refusal in utils.distributed.check_parallel_options and add the mesh to the train.py
    runs below."""
    outcomes = exchange_halos(tmp_path, GLOO_ON_GPU, failed="a rank crashed or hung")
    assert outcomes != [{"received": [2.0]}, {"received": [1.0]}], outcomes


# train.py under torchrun on the GPU: float32 with deterministic cuDNN and no TF32, so that two ranks and one
# agree as closely as on the CPU (test_domain_parallel.assert_same_training's tolerances). 3 steps an epoch.
TRAIN = ["--config=test", "--device=cuda", "--deterministic=true", "--tf32=false", "--data_loader_config=synthetic",
         "--crop_size=64", "--Nsamples_val=2", "--val_metrics=true", "--preview_image=true", "--global_batch_size=4",
         "--Nsamples=12", "--num_epochs=2"]
TRAIN_RUNS = {
    "one": (1, []),
    "ddp": (2, ["--bucket_cap_mb=1"]),
    "ddp_prefetch": (2, ["--data_loader_config=lowmem", "--num_data_workers=1", "--device_prefetch=true"]),
    "fsdp": (2, ["--parallel=fsdp"]),
    "ddp_k2": (2, ["--grad_accum_steps=2"]),
}


def torchrun(ranks, expdir, run_num, *args, script=os.path.join(ROOT, "train.py"), stopped=False):
    """train.py (or ``script``) on ``ranks`` ranks sharing the GPU over gloo; its run directory. ``stopped``:
    the run is expected to stop at a signal (torchrun then ends non-zero, as one of its workers did)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", script,
               *TRAIN, f"--expdir={expdir}", f"--run_num={run_num}", *args]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(400),
                            env={**os.environ, "DIST_BACKEND": "gloo", "OMP_NUM_THREADS": "1"})
    output = result.stdout[-3000:] + result.stderr[-3000:]
    if stopped:
        assert result.returncode != 0 and "continue with --resume" in result.stdout + result.stderr, output
    else:
        assert result.returncode == 0, output
    return os.path.join(expdir, "test", f"{ranks}GPU", run_num)


@pytest.fixture(scope="module")
def train_runs(tmp_path_factory, data_files):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    expdir = tmp_path_factory.mktemp("cuda_train")
    data = [f"--train_path={data_files['train']}", f"--val_path={data_files['valid']}"]
    return {name: torchrun(ranks, expdir, name, *data, *options) for name, (ranks, options) in TRAIN_RUNS.items()}


@needs_cuda()
@pytest.mark.parametrize("name", [name for name in TRAIN_RUNS if name != "one"])
def test_train_py_on_two_ranks_of_one_gpu_trains_as_one_rank(train_runs, name):
    """DDP with small buckets, the host loader with the device prefetcher under DDP, FSDP, and two
    micro-batches: the losses, metrics, learning rates and final checkpoint of one rank."""
    assert_same_training(train_runs[name], train_runs["one"])


@needs_cuda()
def test_resume_on_two_ranks_of_one_gpu_continues_the_same_training(train_runs, data_files, tmp_path):
    """Stopped by SIGUSR1 in epoch 2 (at each rank's 5th step), then --resume: the uninterrupted DDP run."""
    script = tmp_path / "signalling_train.py"
    script.write_text(f"import sys\nsys.path.insert(0, {ROOT!r})\n" + SIGNAL_DURING_STEP)
    data = [f"--train_path={data_files['train']}", f"--val_path={data_files['valid']}", "--bucket_cap_mb=1"]
    os.environ["SIGNAL_AT"] = "5"
    try:
        torchrun(2, tmp_path, "cut", *data, script=str(script), stopped=True)
    finally:
        del os.environ["SIGNAL_AT"]
    assert checkpoint(os.path.join(tmp_path, "test", "2GPU", "cut"))["position"]["epoch"] == 1
    resumed = torchrun(2, tmp_path, "cut", *data, "--resume")
    assert_same_training(resumed, train_runs["ddp"])


@needs_cuda()
def test_train_py_refuses_a_domain_mesh_over_gloo_on_the_gpu(data_files, tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               os.path.join(ROOT, "train.py"), *TRAIN, f"--train_path={data_files['train']}",
               f"--val_path={data_files['valid']}", f"--expdir={tmp_path}", "--domain_mesh=[2,1,1]",
               "--global_batch_size=2"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(300),
                            env={**os.environ, "DIST_BACKEND": "gloo"})
    assert result.returncode != 0 and "DIST_BACKEND=gloo cannot exchange the halos" in result.stderr
    assert not (tmp_path / "test").exists()  # refused before anything is written
