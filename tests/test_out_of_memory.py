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

from conftest import ROOT, needs_cuda, timeout_for
from test_profiling import fake_cuda, params_for
from utils.distributed import World
from utils.out_of_memory import OutOfMemory, explain, guard_out_of_memory
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


# train.py with a step that runs out of memory at call OOM_AT (an epoch after the first checkpoint), after
# writing the size and sha256 of every file of the run directory as they are then. On the CPU it raises torch's
# error; with ALLOCATE=1 it asks the GPU for a petabyte, a real CUDA out-of-memory error.
OOM_AT_STEP = """
import hashlib, json, os, sys
import torch
import train

def running_out_of_memory(model, optimizer, loss_fn, precision, params):
    step, calls = train.default_step(model, optimizer, loss_fn, precision, params), [0]
    def run(inputs, targets):
        calls[0] += 1
        if calls[0] == int(os.environ["OOM_AT"]):
            run_dir, files = os.environ["RUN_DIR"], {}
            for parent, _, names in os.walk(run_dir):
                for name in names:
                    content = open(os.path.join(parent, name), "rb").read()
                    files[os.path.relpath(os.path.join(parent, name), run_dir)] = [
                        len(content), hashlib.sha256(content).hexdigest()]
            json.dump(files, open(os.environ["BEFORE"], "w"))
            if os.environ.get("ALLOCATE"):
                torch.empty(2**50, dtype=torch.uint8, device=inputs.device)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        return step(inputs, targets)
    return run

train.main(sys.argv[1:], make_step=running_out_of_memory)
"""


def run_out_of_memory_in_epoch_2(data_files, tmp_path, *options, env=()):
    """train.py on the test config (4 steps an epoch), out of memory at the second step of epoch 2; returns
    the process and the paragraph, after checking that nothing of the run directory was rewritten."""
    run_dir = tmp_path / "runs" / "test" / ("1GPU" if "--device=cuda" in options else "1CPU") / "oom"
    before = tmp_path / "before.json"
    result = subprocess.run(
        [sys.executable, "-c", OOM_AT_STEP, "--config=test", f"--train_path={data_files['train']}",
         f"--val_path={data_files['valid']}", f"--expdir={tmp_path / 'runs'}", "--run_num=oom", *options],
        cwd=ROOT, env={**os.environ, "OOM_AT": "6", "RUN_DIR": str(run_dir), "BEFORE": str(before), **dict(env)},
        capture_output=True, text=True, timeout=timeout_for(300))
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    [error] = [block for block in result.stderr.split("\n\n") if block.startswith("error: ")]
    # Nothing new, nothing removed, nothing rewritten: every file begins as it did before the failure (out.log
    # and TensorBoard's events may have grown), and the checkpoint of epoch 1 is the same to the byte.
    files = json.loads(before.read_text())
    assert "checkpoint.pt" in files
    after = {os.path.relpath(os.path.join(parent, name), run_dir): os.path.join(parent, name)
             for parent, _, names in os.walk(run_dir) for name in names}
    assert set(after) == set(files)
    for name, (size, digest) in files.items():
        content = open(after[name], "rb").read()
        assert hashlib.sha256(content[:size]).hexdigest() == digest, name
        if name in ("checkpoint.pt", "config.yaml"):
            assert len(content) == size, name
    return result, " ".join(error.split())


def test_train_py_ends_in_one_paragraph_and_keeps_the_checkpoint(data_files, tmp_path):
    """Injected on the CPU: status 2, one paragraph on stderr and no traceback, the checkpoint kept."""
    _, text = run_out_of_memory_in_epoch_2(data_files, tmp_path)
    assert text.startswith("error: Rank 0 ran out of GPU memory on cpu in a training step (tried to allocate "
                           "2.00 GiB).")
    assert "4 sample(s) per rank, a global batch of 4 over 1 data-parallel rank(s)" in text
    for fix in ("--local_batch_size=2", "--grad_accum_steps=2", "--domain_mesh=[2,1,1]", "--amp_mode=bf16"):
        assert fix in text, fix


@needs_cuda("provokes a real CUDA out-of-memory error")
def test_a_real_cuda_out_of_memory_keeps_the_checkpoint(data_files, tmp_path):
    """The same on the GPU, the error the CUDA allocator's own: a petabyte asked for in epoch 2."""
    _, text = run_out_of_memory_in_epoch_2(data_files, tmp_path, "--device=cuda", env={"ALLOCATE": "1"})
    total = torch.cuda.get_device_properties(0).total_memory / GIB
    assert text.startswith("error: Rank 0 ran out of GPU memory on cuda:0 in a training step (tried to allocate ")
    assert f"The memory: the GPU has {total:.1f} GiB" in text and " allocated and " in text


@needs_cuda("provokes a real CUDA out-of-memory error")
def test_an_absurd_local_batch_on_the_gpu_ends_in_one_paragraph(data_files, tmp_path):
    """2048 crops of 32^3 a step through the full-width U-Net: each of its first level's activations alone
    is 16 GiB in fp32, and training keeps dozens of them."""
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), "--config=test", f"--train_path={data_files['train']}",
         f"--val_path={data_files['valid']}", f"--expdir={tmp_path / 'runs'}", "--device=cuda", "--base_channels=64",
         "--crop_size=32", "--global_batch_size=2048", "--Nsamples=2048", "--Nsamples_val=2048", "--num_epochs=1"],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(600))
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    text = " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr and "error: Rank 0 ran out of GPU memory on cuda:0 in " in text, text
    assert "2048 sample(s) per rank, a global batch of 2048" in text and "The memory: the GPU has " in text
    for fix in ("--local_batch_size=1024", "--grad_accum_steps=2", "--domain_mesh=[2,1,1]", "--amp_mode=bf16"):
        assert fix in text, fix
