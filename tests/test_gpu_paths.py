"""The CUDA paths that no CPU run reaches, end to end on a GPU: the profiling window with its trace and
memory snapshot, torch.compile's CUDA graphs, a train.py checkpoint resumed by train_graph.py, and the
3-D convolution health line. Skipped without a GPU; benchmarks/suite/gpu_suite.sh runs them (-m gpu)."""
import json
import os
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from benchmarks.suite.preflight import compile_problem
from conftest import ROOT, needs_cuda, run_train, timeout_for

pytestmark = [pytest.mark.slow]


def gpu_args(data_files, expdir, *extra):
    return ["--config=test", f"--train_path={data_files['train']}", f"--val_path={data_files['valid']}",
            f"--expdir={expdir}", "--device=cuda", "--Nsamples=32", *extra]


def scalars(run_dir, tag):
    events = EventAccumulator(str(run_dir / "logs"), size_guidance={"scalars": 0})
    events.Reload()
    return [event.value for event in events.Scalars(tag)]


@needs_cuda()
def test_profiling_window_trace_and_memory_snapshot_on_cuda(data_files, tmp_path):
    result = run_train(gpu_args(data_files, tmp_path, "--run_num=p", "--num_epochs=2", "--enable_manual_profiling",
                                "--profile_start_epoch=2", "--profile_steps=4", "--profiler=torch",
                                "--memory_snapshot", "--memory_snapshot_steps=3"))
    run_dir = tmp_path / "test" / "1GPU" / "p"
    assert "CUDA profiler window: global steps 8 to 11" in result.stdout
    assert [p.name for p in (run_dir / "profile").iterdir()] == ["rank0.steps8-11.pt.trace.json"]
    # A file is not a profile: the trace must hold the steps' CUDA kernels (CUPTI records none on some
    # sandboxed machines, and then this fails rather than passes).
    trace = json.loads((run_dir / "profile" / "rank0.steps8-11.pt.trace.json").read_text())
    kernels = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    assert len(kernels) >= 4 * 10, f"{len(kernels)} CUDA kernel events in four training steps"
    assert (run_dir / "memory_snapshot.pickle").stat().st_size > 0
    log = (run_dir / "out.log").read_text()
    assert "3-D convolutions: torch" in log and "cuDNN none" not in log


@needs_cuda()
@pytest.mark.skipif(compile_problem() is not None, reason=str(compile_problem()))
def test_compile_with_cuda_graphs_keeps_every_loss(data_files, tmp_path):
    """reduce-overhead records CUDA graphs whose outputs the next call overwrites: model and loss are
    compiled as one training function, validation starts a new step per batch, and the epoch's losses
    and the preview sample are copies, so reading them later works. Skipped, with the reason, where
    torch.compile cannot build its C wrappers (no compiler or no Python.h)."""
    run_train(gpu_args(data_files, tmp_path, "--run_num=c", "--num_epochs=2", "--jit_mode=compile",
                       "--compile_mode=reduce-overhead", "--amp_mode=bf16", "--enable_fused", "--preview_image"),
              timeout=timeout_for(600))
    losses = scalars(tmp_path / "test" / "1GPU" / "c", "Loss/train")
    assert len(losses) == 3 and all(0 < loss < 10 for loss in losses)


@needs_cuda()
def test_a_train_py_checkpoint_resumes_in_train_graph_py(data_files, tmp_path):
    """The capturable Adam of train_graph.py takes over train.py's optimiser state (flags of its own)."""
    common = gpu_args(data_files, tmp_path, "--run_num=r", "--graph_warmup_steps=3", "--enable_fused")
    run_train([*common, "--num_epochs=1"])
    graph = subprocess.run([sys.executable, os.path.join(ROOT, "train_graph.py"), *common, "--num_epochs=2",
                            "--resume", "--allow_changes=num_epochs"], cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout_for(600))
    assert graph.returncode == 0, graph.stderr[-3000:]
    assert "Resumed from" in graph.stdout
    assert len(scalars(tmp_path / "test" / "1GPU" / "r", "Loss/valid")) == 3  # step 0, epoch 1, epoch 2
