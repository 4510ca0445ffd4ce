"""A CUDA out-of-memory error ends a run in one paragraph (the batch, the memory, the fixes), with a non-zero
status and the last checkpoint intact: on the CPU by injecting torch's error into train.py's step, on a GPU
by a real one (an absurd local batch)."""
import hashlib
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from conftest import DURING_CALL, ROOT, needs_cuda, timeout_for
from test_profiling import fake_cuda, params_for
from test_distributed import one_rank_group
from utils.distributed import LostRankError, World, exit_on_lost_rank, is_lost_rank_error
from utils.out_of_memory import OutOfMemory, explain, guard_out_of_memory, is_out_of_memory
from utils.profiling import Profiling

GIB = 2**30
TORCH_MESSAGE = ("CUDA out of memory. Tried to allocate 12.50 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
                 "3.10 GiB is free. Including non-PyTorch memory, this process has 76.08 GiB memory in use.")


def fake_memory(monkeypatch):
    """The torch.cuda figures of an H100 80 GB nearly full, without a GPU."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (3.1 * GIB, 79.19 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 70.5 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 75.25 * GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 71.0 * GIB)


def paragraph(error):
    return " ".join(str(error).split())


def test_the_paragraph_names_the_batch_the_memory_and_the_fixes(monkeypatch, tmp_path):
    fake_memory(monkeypatch)
    params = params_for(global_batch_size=512, crop_size=64)
    text = paragraph(explain(torch.cuda.OutOfMemoryError(TORCH_MESSAGE), "a training step", params, World(2, 1, 1),
                             torch.device("cuda", 1), str(tmp_path)))
    assert text.startswith("Rank 1 ran out of GPU memory on cuda:1 in a training step (tried to allocate 12.50 GiB).")
    assert "256 sample(s) per rank, a global batch of 512 over 2 data-parallel rank(s), crops of 64^3" in text
    assert "precision fp32 (--amp_mode=none)" in text
    assert ("the GPU has 79.2 GiB, 3.1 GiB of it free at the failure, when PyTorch had 70.5 GiB allocated and "
            "75.2 GiB reserved (peak allocated: 71.0 GiB)") in text
    for fix in ("--local_batch_size=128", "--grad_accum_steps=2, which keeps the global batch and runs it in "
                "micro-batches of 128", "--domain_mesh=[2,1,1] on twice the ranks", "--amp_mode=bf16"):
        assert fix in text, fix
    assert f"the run directory {tmp_path} keeps it" in text
    assert text.endswith("Rerun with --memory_snapshot to record which tensors held the memory.")


def test_accumulation_a_mesh_and_bf16_change_the_advice(monkeypatch, tmp_path):
    """Under --grad_accum_steps the next divisor of the local batch is advised; under a domain mesh the batch
    splits over the data-parallel groups only, and the mesh's first axis doubles; bf16 is not advised again."""
    fake_memory(monkeypatch)
    params = params_for(global_batch_size=12, grad_accum_steps=2, domain_mesh=[2, 1, 1], amp_mode="bf16")
    text = paragraph(explain(torch.cuda.OutOfMemoryError("CUDA out of memory."), "validation", params,
                             World(4, 0, 0), torch.device("cuda", 0), str(tmp_path)))
    assert "in validation." in text and "tried to allocate" not in text
    assert ("6 sample(s) per rank in 2 micro-batches of 3 (--grad_accum_steps=2), a global batch of 12 over 2 "
            "data-parallel rank(s), each sample split over 2 ranks (--domain_mesh=[2, 1, 1])") in text
    assert "--grad_accum_steps=3, which keeps the global batch and runs it in micro-batches of 2" in text
    assert "--domain_mesh=[4,1,1]" in text and "--amp_mode=bf16, which" not in text


def test_off_cuda_the_paragraph_says_there_are_no_figures(tmp_path):
    text = paragraph(explain(torch.cuda.OutOfMemoryError("CUDA out of memory."), "a training step",
                             params_for(global_batch_size=1), World(), torch.device("cpu"), str(tmp_path)))
    assert "PyTorch reports no GPU memory figures for this device." in text
    assert "--local_batch_size" not in text and "--grad_accum_steps=" not in text  # one sample: nothing to split
    assert "--domain_mesh=[2,1,1]" in text


def test_the_guard_passes_results_and_other_errors_through():
    guarded = guard_out_of_memory(lambda x: x + 1, "a training step", params_for(), World(), torch.device("cpu"), ".")
    assert guarded(1) == 2

    def fails():
        raise RuntimeError("not memory")

    with pytest.raises(RuntimeError, match="not memory") as caught:
        guard_out_of_memory(fails, "a training step", params_for(), World(), torch.device("cpu"), ".")()
    assert not isinstance(caught.value, OutOfMemory)


def test_profiling_still_dumps_its_snapshot_and_the_paragraph_names_it(tmp_path, monkeypatch):
    """The explained error is still torch's out-of-memory error: Profiling dumps the snapshot on the way out,
    and the paragraph, printed after that, names it."""
    fake_cuda(monkeypatch, [], [None])
    fake_memory(monkeypatch)
    params = params_for(memory_snapshot=True, memory_snapshot_steps=100)
    profiler = Profiling(params, World(), torch.device("cuda"), str(tmp_path), steps_per_epoch=4)

    def step():
        raise torch.cuda.OutOfMemoryError(TORCH_MESSAGE)

    guarded = guard_out_of_memory(step, "a training step", params, World(), torch.device("cuda", 0), str(tmp_path))
    with pytest.raises(OutOfMemory) as caught:
        with profiler:
            profiler.step(0)
            guarded()
    snapshot = tmp_path / "memory_snapshot_oom_rank0.pickle"
    assert snapshot.exists()
    assert paragraph(caught.value).endswith(f"The memory snapshot at the failure: {snapshot} (drag it onto "
                                            "https://pytorch.org/memory_viz to see which tensors held the memory).")


def test_an_older_snapshot_is_not_named(tmp_path):
    snapshot = tmp_path / "memory_snapshot_oom_rank0.pickle"
    snapshot.write_bytes(b"an earlier run's")
    os.utime(snapshot, (time.time() - 3600,) * 2)
    assert "Rerun with --memory_snapshot" in str(OutOfMemory("Out of memory.", str(snapshot)))


# Errors that say the GPU ran out of memory, as torch raises them: its allocator's, and the runtime errors of
# cuDNN, cuFFT, cuBLAS, the CUDA driver and NCCL, each with the line the paragraph quotes; and errors that do not.
CUDA_DRIVER = "CUDA error: out of memory"
NCCL = "Cuda failure 2 'out of memory'"
OUT_OF_MEMORY_ERRORS = [
    (torch.cuda.OutOfMemoryError(TORCH_MESSAGE), None),
    (RuntimeError("FIND was unable to find an engine to execute this computation"),
     "FIND was unable to find an engine to execute this computation"),
    (RuntimeError("GET was unable to find an engine to execute this computation"),
     "GET was unable to find an engine to execute this computation"),
    (RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"), "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"),
    (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), "cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    (RuntimeError("cuFFT error: CUFFT_ALLOC_FAILED"), "cuFFT error: CUFFT_ALLOC_FAILED"),
    (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
     "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    (RuntimeError(f"{CUDA_DRIVER}\nCUDA kernel errors might be asynchronously reported at some other API call, so "
                  "the stacktrace below might be incorrect."), CUDA_DRIVER),
    (getattr(torch, "AcceleratorError", RuntimeError)(CUDA_DRIVER), CUDA_DRIVER),
    (torch.distributed.DistBackendError("NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled "
                                        "cuda error, NCCL version 2.20.5\nncclUnhandledCudaError: Call to CUDA "
                                        f"function failed.\nLast error:\n{NCCL}"), NCCL),
]
OTHER_ERRORS = [
    RuntimeError("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"),
    RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED"),
    torch.distributed.DistBackendError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"),
    ValueError("out of memory"),  # not a runtime error: not torch's, whatever it says
    KeyError("checkpoint"),
]


@pytest.mark.parametrize("error, quoted", OUT_OF_MEMORY_ERRORS, ids=repr)
def test_out_of_memory_is_told_by_type_and_text(error, quoted, tmp_path):
    """Each is explained, and the paragraph quotes the line of another library's error that says so."""
    def fails():
        raise error

    with pytest.raises(OutOfMemory) as caught:
        guard_out_of_memory(fails, "a training step", params_for(), World(), torch.device("cpu"), str(tmp_path))()
    assert caught.value.__cause__ is error
    said = f" ({type(error).__name__}: {quoted})" if quoted else " (tried to allocate 12.50 GiB)"
    assert paragraph(caught.value).startswith(f"Rank 0 ran out of GPU memory on cpu in a training step{said}. ")


@pytest.mark.parametrize("error", OTHER_ERRORS, ids=repr)
def test_other_errors_are_not_out_of_memory_and_pass_through(error):
    assert not is_out_of_memory(error)

    def fails():
        raise error

    with pytest.raises(type(error)) as caught:
        guard_out_of_memory(fails, "a training step", params_for(), World(), torch.device("cpu"), ".")()
    assert caught.value is error


def test_an_out_of_memory_error_of_nccl_is_no_lost_rank(tmp_path):
    """NCCL's own out-of-memory error is a DistBackendError, as a lost rank's is: with a process group the
    rank that ran out says so, and not that another rank died."""
    (nccl, _), lost = OUT_OF_MEMORY_ERRORS[-1], OTHER_ERRORS[2]
    params = params_for()

    @exit_on_lost_rank
    def main(error):
        guard_out_of_memory(lambda: raise_(error), "a training step", params, World(), torch.device("cpu"), ".")()

    with one_rank_group(tmp_path):
        assert is_lost_rank_error(lost) and not is_lost_rank_error(nccl)
        with pytest.raises(LostRankError):
            main(lost)
        with pytest.raises(OutOfMemory, match="ran out of GPU memory on cpu in a training step .DistBackendError"):
            main(nccl)


def raise_(error):
    raise error


def run_out_of_memory(data_files, tmp_path, target, at, error, *options):
    """train.py on the test config (4 steps an epoch; --exact_forms=auto, whose timing runs on a GPU only),
    with ``error`` (a Python expression: DURING_CALL's ERROR) raised at call ``at`` of ``target`` (DURING_CALL's
    TARGET); returns the paragraph, after checking the status (2), that there is no traceback, and that nothing
    of the run directory was rewritten: every file begins as it did before the failure (out.log and
    TensorBoard's events may have grown), the checkpoint and config.yaml are the same to the byte."""
    run_dir = tmp_path / "runs" / "test" / ("1GPU" if "--device=cuda" in options else "1CPU") / "oom"
    before = tmp_path / "before.json"
    result = subprocess.run(
        [sys.executable, "-c", DURING_CALL, "--config=test", f"--train_path={data_files['train']}",
         f"--val_path={data_files['valid']}", f"--expdir={tmp_path / 'runs'}", "--run_num=oom", "--exact_forms=auto",
         *options],
        cwd=ROOT, env={**os.environ, "TARGET": target, "FAIL_AT": str(at), "ERROR": error, "RUN_DIR": str(run_dir),
                       "BEFORE": str(before)},
        capture_output=True, text=True, timeout=timeout_for(300))
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    [error] = [block for block in result.stderr.split("\n\n") if block.startswith("error: ")]
    files = json.loads(before.read_text())
    after = {os.path.relpath(os.path.join(parent, name), run_dir): os.path.join(parent, name)
             for parent, _, names in os.walk(run_dir) for name in names}
    assert set(after) == set(files)
    for name, (size, digest) in files.items():
        content = open(after[name], "rb").read()
        assert hashlib.sha256(content[:size]).hexdigest() == digest, name
        if name in ("checkpoint.pt", "config.yaml"):
            assert len(content) == size, name
    return " ".join(error.split()), files


# Where train.py runs out of memory: the function that raises (DURING_CALL's TARGET), at which call, with what
# error (as the library raises it), and the words the paragraph then says. The test config has 4 steps of 4
# samples an epoch and 2 validation batches; validation runs at step 0 and after each epoch. The checkpoint of
# epoch 1 exists when the failure comes in epoch 2.
NCCL_OUT_OF_MEMORY = ("NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error (run "
                      "with NCCL_DEBUG=INFO for details), NCCL version 2.20.5\nncclUnhandledCudaError: Call to CUDA "
                      "function failed.\nLast error:\nCuda failure 2 'out of memory'")
ACCELERATOR_ERROR = "getattr(torch, 'AcceleratorError', RuntimeError)"  # torch 2.4 raises a plain RuntimeError
SITES = {
    # --exact_forms=auto times each layer at the run's micro-batch while the model is built (on a GPU; on a CPU
    # choose_forms returns at once, and fails here first): cuDNN finds no algorithm whose workspace fits.
    "build": ("utils.exact_forms:choose_forms", 1,
              "RuntimeError('FIND was unable to find an engine to execute this computation')",
              "in building the model (RuntimeError: FIND was unable to find an engine to execute this computation)."),
    # The second step of epoch 2: torch's allocator.
    "step": ("train:train_step", 6, "torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB.')",
             "in a training step (tried to allocate 2.00 GiB)."),
    # The first sample of epoch 2's second batch, in the loader's next() (8 validation samples, 16 of epoch 1,
    # 8 of its validation, 4 of epoch 2's first batch): the CUDA driver's error.
    "loader": ("utils.data_loader:RandomCropDataset.__getitem__", 37,
               f"{ACCELERATOR_ERROR}('CUDA error: out of memory\\nCUDA kernel errors might be asynchronously "
               "reported at some other API call')",
               "in loading or copying a batch (", "Error: CUDA error: out of memory)."),
    # The checkpoint of epoch 2 (the second): NCCL's own error in the gather of FSDP's shards.
    "checkpoint": ("utils.checkpoint:full_state_dicts", 2, f"torch.distributed.DistBackendError({NCCL_OUT_OF_MEMORY!r})",
                   "in writing the checkpoint (DistBackendError: Cuda failure 2 'out of memory')."),
    # The spectra of the validation metrics of epoch 1's end (the first batch): a cuFFT plan.
    "validation": ("utils.metrics:_modes", 5, "RuntimeError('cuFFT error: CUFFT_ALLOC_FAILED')",
                   "in validation (RuntimeError: cuFFT error: CUFFT_ALLOC_FAILED)."),
}


@pytest.mark.slow
@pytest.mark.parametrize("site", SITES)
def test_train_py_ends_in_one_paragraph_wherever_it_runs_out(data_files, tmp_path, site):
    """Injected on the CPU: status 2, one paragraph on stderr and no traceback, nothing rewritten; the
    checkpoint of epoch 1 kept where there is one."""
    target, at, error, *said = SITES[site]
    text, files = run_out_of_memory(data_files, tmp_path, target, at, error, "--val_metrics=true")
    assert text.startswith("error: Rank 0 ran out of GPU memory on cpu "), text
    for words in said:
        assert words in text, (words, text)
    assert "4 sample(s) per rank, a global batch of 4 over 1 data-parallel rank(s)" in text
    for fix in ("--local_batch_size=2", "--grad_accum_steps=2", "--domain_mesh=[2,1,1]", "--amp_mode=bf16"):
        assert fix in text, fix
    if site == "build":  # nothing is written before the model is built
        assert files == {} and text.endswith("Nothing was written."), text
    else:
        assert ("checkpoint.pt" in files) == (site != "validation"), sorted(files)


@needs_cuda("provokes a real CUDA out-of-memory error")
def test_a_real_cuda_out_of_memory_keeps_the_checkpoint(data_files, tmp_path):
    """The same on the GPU, the error the CUDA allocator's own: a petabyte asked for in epoch 2."""
    text, files = run_out_of_memory(data_files, tmp_path, "train:train_step", 6,
                                    "torch.empty(2**50, dtype=torch.uint8, device='cuda')", "--device=cuda")
    total = torch.cuda.get_device_properties(0).total_memory / GIB
    assert "checkpoint.pt" in files
    assert text.startswith("error: Rank 0 ran out of GPU memory on cuda:0 in a training step (tried to allocate ")
    assert f"The memory: the GPU has {total:.1f} GiB" in text and " allocated and " in text


@needs_cuda("provokes a real CUDA out-of-memory error")
def test_an_absurd_local_batch_on_the_gpu_ends_in_one_paragraph(data_files, tmp_path):
    """2048 crops of 32^3 a step through the full-width U-Net: each of its first level's activations alone
    is 16 GiB in fp32, and training keeps dozens of them."""
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), "--config=test", f"--train_path={data_files['train']}",
         f"--val_path={data_files['valid']}", f"--expdir={tmp_path / 'runs'}", "--device=cuda", "--base_channels=64",
         "--crop_size=32", "--global_batch_size=2048", "--Nsamples=2048", "--Nsamples_val=2048", "--num_epochs=1",
         "--exact_forms=off"],  # auto would time each layer at micro-batch 2048 first
        cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(600))
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    text = " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr and "error: Rank 0 ran out of GPU memory on cuda:0 in " in text, text
    assert "2048 sample(s) per rank, a global batch of 2048" in text and "The memory: the GPU has " in text
    for fix in ("--local_batch_size=1024", "--grad_accum_steps=2", "--domain_mesh=[2,1,1]", "--amp_mode=bf16"):
        assert fix in text, fix
