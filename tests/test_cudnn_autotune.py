"""benchmarks/cudnn_autotune.py on a CPU: the one line it prints there, and its phases run for real on
the CPU (where cudnn.benchmark changes nothing: what is checked is what each phase sets and feeds)."""
import subprocess
import sys

import pytest
import torch

from benchmarks import cudnn_autotune
from conftest import ROOT, timeout_for


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine measures; tests/test_gpu_paths.py-style runs")
def test_without_cuda_it_says_there_is_nothing_to_measure():
    result = subprocess.run([sys.executable, "-m", "benchmarks.cudnn_autotune"], cwd=ROOT, capture_output=True,
                            text=True, timeout=timeout_for(120))
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.count("\n") == 1 and "nothing to measure" in result.stdout


def test_the_plan_retriggers_on_a_new_shape_and_layout_only():
    phases = cudnn_autotune.plan(64, 64, 4)
    keys = [(shape, channels_last) for _, benchmark, shape, channels_last, _ in phases if benchmark]
    assert [label for label, *_ in phases] == ["off", "on", "partial batch", "on again", "channels_last"]
    assert phases[0][1] is False and all(benchmark for _, benchmark, *_ in phases[1:])
    assert keys[0] == ((64, 4, 64, 64, 64), False) and keys[1][0] == (32, 4, 64, 64, 64)  # the last partial batch
    assert keys[2] == keys[0]  # the first shape again: its algorithms are cached
    assert keys[3] == ((64, 4, 64, 64, 64), True)  # a new layout: a new key
    assert len(set(keys)) == 3 and all(steps == 4 for *_, steps in phases)


def test_the_heuristics_phase_has_a_process_of_its_own():
    # PyTorch keeps the algorithm of a shape from the first time it runs, whichever chose it: "on" after
    # "off" at the same shape would reuse the heuristics' choice and search nothing.
    processes = dict(cudnn_autotune.PROCESSES)
    assert sorted(label for labels in processes.values() for label in labels) == \
        sorted(label for label, *_ in cudnn_autotune.PHASES)
    heuristics = cudnn_autotune.plan(64, 64, 4, processes["heuristics"])
    autotuner = cudnn_autotune.plan(64, 64, 4, processes["autotuner"])
    assert [benchmark for _, benchmark, *_ in heuristics] == [False]
    assert all(benchmark for _, benchmark, *_ in autotuner) and autotuner[0][0] == "on"
    assert heuristics[0][2:4] == autotuner[0][2:4]  # the same shape and layout, each fresh in its process


def test_the_warm_up_step_uses_a_shape_no_phase_uses():
    seen = []
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    cudnn_autotune.warm_up(lambda inputs, targets: seen.append((torch.backends.cudnn.benchmark, tuple(inputs.shape))),
                           64, torch.device("cpu"))
    assert torch.backends.cudnn.benchmark is True
    torch.backends.cudnn.benchmark = before
    assert seen == [(False, (1, 4, 64, 64, 64))]  # batch 1: no phase runs it; the U-Net needs the whole crop
    assert all(shape != seen[0][1] for _, _, shape, *_ in cudnn_autotune.plan(64, 64, 4))


def test_the_phases_run_train_py_s_step_with_each_setting():
    device = torch.device("cpu")
    params, model, step = cudnn_autotune.build_step(
        ["--config=test", "--device=cpu", "--local_batch_size=2", "--base_channels=2"], device)
    seen = []

    def recording_step(inputs, targets):
        seen.append((torch.backends.cudnn.benchmark, tuple(inputs.shape),
                     inputs.is_contiguous(memory_format=torch.channels_last_3d) and inputs.shape[0] > 1,
                     next(model.parameters()).is_contiguous(memory_format=torch.channels_last_3d)))
        return step(inputs, targets)

    before = torch.backends.cudnn.benchmark
    results = cudnn_autotune.run(cudnn_autotune.plan(2, params.crop_size, 2), recording_step, model, device)
    assert torch.backends.cudnn.benchmark == before  # restored
    crop = (params.crop_size,) * 3
    assert seen == [(False, (2, 4, *crop), False, False)] * 2 + [(True, (2, 4, *crop), False, False)] * 2 + \
        [(True, (1, 4, *crop), False, False)] * 2 + [(True, (2, 4, *crop), False, False)] * 2 + \
        [(True, (2, 4, *crop), True, True)] * 2
    for r in results:
        assert r["first_s"] > 0 and r["rest_s"] > 0 and r["excess_s"] == pytest.approx(r["first_s"] - r["rest_s"])
        assert r["first_peak_MiB"] is None  # no CUDA memory to read on a CPU
    table = cudnn_autotune.markdown(results)
    assert table.count("\n") == 6 and "| channels_last | on | 2x4x" in table
