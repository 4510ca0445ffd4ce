"""The time estimate before training: a GPU-sized config on a CPU is refused with one paragraph, unless --device=cpu."""
import logging
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import AS_AVX2, ROOT, run_train, x86_only
from utils import estimate
from utils.estimate import check_run_time, format_duration, measure_cpu_flops
from utils.distributed import World
from utils.errors import UserError
from utils.YParams import load_params


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for CPUs")
def test_the_default_config_on_a_cpu_is_refused_before_anything_is_read_or_written(tmp_path):
    # No --config: the original's `base`, 117 M parameters, ten epochs of 65536 crops.
    result = run_train([f"--expdir={tmp_path}", "--train_path=/nowhere/train.h5"], check=False)
    message = " ".join(result.stderr.split())
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert re.search(r"--config=base would train for about [\d.]+ (hours|days) on this CPU: 10 epochs of 65536 "
                     r"samples at 80.5 GFLOP each", message), message
    assert "use --config=demo" in message and "pass --device=cpu" in message
    assert not os.listdir(tmp_path)  # refused before the data (here a missing file) is even looked at


def test_every_run_logs_its_estimate_and_a_tiny_one_measures_nothing(caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    params = load_params(["--config=demo", "--crop_size=64", "--full_scale", "--num_epochs=1"])
    monkeypatch.setattr(estimate, "measure_cpu_flops", lambda *_: (10e9, "a stand-in"))  # the rate only: the arithmetic is real
    check_run_time(params, World(), torch.device("cpu"))
    flops = 512 * 6.94e9 + 2 * 64 * 6.94e9 / 3  # one epoch of 512 samples and two validations of 64
    assert f"would train for about {format_duration(flops / 10e9)} on this CPU: 1 epoch of 512 samples at 6.94 " \
        "GFLOP each" in caplog.text, caplog.text
    monkeypatch.setattr(estimate, "measure_cpu_flops", None)  # not called for a run of seconds
    check_run_time(load_params(["--config=test"]), World(), torch.device("cpu"))
    assert "Estimated time: seconds (--config=test: " in caplog.text


def test_the_refusal_quotes_the_demo_by_the_same_estimate(monkeypatch):
    monkeypatch.setattr(estimate, "measure_cpu_flops", lambda *_: (20e9, "a stand-in"))
    with pytest.raises(UserError) as refusal:
        check_run_time(load_params(["--config=short"]), World(), torch.device("cpu"))
    demo = 4 * 512 * 0.86e9 + 5 * 64 * 0.86e9 / 3
    assert f"use --config=demo (about {format_duration(demo / 20e9)} of training on this CPU by the same " \
        "estimate)" in str(refusal.value)


@pytest.mark.parametrize("options, local_batch, probe", [
    (["--config=demo"], 8, "this run's training step at batch 8"),  # 0.86 GFLOP a sample: the whole batch
    (["--config=demo", "--crop_size=64", "--full_scale"], 8, "this run's training step at batch 2"),  # 6.94 each
    (["--config=short"], 64, "a 3-D convolution"),  # 80.5 GFLOP a sample: over PROBE_FLOPS even at batch 1
])
def test_the_cpu_rate_is_measured_on_the_runs_own_step_where_it_fits(options, local_batch, probe, monkeypatch):
    """The rate is the timed step's FLOPs over its time: the step runs for real, its time is set to 0.5 s."""
    timed_steps = []

    def half_a_second(step, repeats):
        step()
        timed_steps.append(repeats)
        return 0.5

    monkeypatch.setattr(estimate, "best_time", half_a_second)
    params = load_params(options)
    rate, timed = measure_cpu_flops(params, local_batch)
    assert timed == probe and timed_steps == [2]
    batch = int(probe.split("batch ")[1]) if "batch" in probe else None
    if batch:
        assert rate == batch * estimate.unet_flops_per_sample(params) / 0.5
        per_sample = {8: 0.86e9, 2: 6.94e9}[batch]  # the U-Net's training FLOPs a sample (test_flops.py)
        assert rate == pytest.approx(batch * per_sample / 0.5, rel=0.01)
    else:  # Conv3d(16, 16, 3) on 2 x 16 x 32^3: forward, input and weight gradients, 2 FLOPs a multiply-add
        assert rate == 3 * 2 * 16 * 16 * 27 * 32**3 * 2 / 0.5


@pytest.mark.cpu16
def test_the_probe_runs_the_configured_model_in_its_precision(monkeypatch):
    built, autocasts = [], []
    real_unet, real_precision = estimate.UNet, estimate.Precision
    monkeypatch.setattr(estimate, "UNet", lambda *args: built.append(args) or real_unet(*args))

    class Recording(real_precision):
        def autocast(self):
            autocasts.append(self.dtype)
            return super().autocast()

    monkeypatch.setattr(estimate, "Precision", Recording)
    measure_cpu_flops(load_params(["--config=test", "--base_channels=8", "--amp_mode=bf16"]), 4)
    assert built[-1] == (4, 5, 8, False)  # N_in, N_out, base_channels, full_scale of the run
    assert autocasts == [torch.bfloat16] * 3  # the step that picks the kernels, then two timed


@pytest.mark.parametrize("seconds, text", [(30, "30 s"), (600, "10 min"), (3 * 3600, "3.0 hours"),
                                           (5 * 86400, "5.0 days")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


@x86_only
@pytest.mark.parametrize("amp_mode", ["bf16", "fp16"])
def test_a_16_bit_run_on_a_cpu_without_it_says_why_it_is_slow_and_what_to_run(tmp_path, amp_mode):
    """As an AVX2-only CPU runs it: one paragraph after the thread count, before the estimate. The run stops at
    its missing data file, after the device checks have logged."""
    result = run_train(["--config=test", f"--amp_mode={amp_mode}", f"--expdir={tmp_path}", "--train_path=/nowhere.h5"],
                       env={**os.environ, **AS_AVX2, "OMP_NUM_THREADS": "1"}, check=False)
    assert result.returncode == 2 and "/nowhere.h5" in result.stderr
    lines = result.stdout.splitlines()
    threads = next(i for i, line in enumerate(lines) if "CPU threads: 1 (torch.get_num_threads(); " in line)
    assert lines[threads].endswith("AVX2). Losses differ in their last digits between thread counts.")
    paragraph = lines[threads + 1]
    assert f"WARNING - --amp_mode={amp_mode} is slow on this CPU: it has no native {amp_mode} arithmetic." in paragraph
    assert re.search(rf"this run takes \d+ times as long in {amp_mode} as in fp32; the time estimate counts", paragraph)
    assert "On this CPU, train in fp32 (leave out --amp_mode): " in paragraph  # bf16 is no way out under AVX2
    assert "Estimated time: " in lines[threads + 2]


@pytest.mark.parametrize("bf16_native", [False, True])
def test_the_estimate_of_an_emulated_16_bit_run_is_made_at_its_measured_rate(caplog, monkeypatch, bf16_native):
    """fp16 on a CPU that emulates it: the 16-bit step timed once at batch 1, fp32's at the run's batch, and the
    paragraph's ratio is theirs; where bf16 is native, it is the advice."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(estimate, "emulated_on_cpu", lambda mode: mode == "fp16" or not bf16_native)
    asked = []

    def rates(params, local_batch, repeats=2, limit=None, amp_mode=None):
        asked.append((amp_mode, local_batch, repeats, limit))
        return (40e9, "fp32's probe") if amp_mode == "none" else (2e9, "fp16's probe")

    monkeypatch.setattr(estimate, "measure_cpu_flops", rates)
    params = load_params(["--config=demo", "--amp_mode=fp16"])
    check_run_time(params, World(), torch.device("cpu"))
    assert asked == [(None, 1, 1, estimate.EMULATED_PROBE_FLOPS), ("none", 8, 2, None)]
    assert "(fp16's probe in fp16, fp32's probe in fp32), this run takes 20 times as long in fp16 as in fp32" \
        in caplog.text
    assert ("leave out --amp_mode, or --amp_mode=bf16, native here)" in caplog.text) is bf16_native
    demo = 4 * 512 * 0.86e9 + 5 * 64 * 0.86e9 / 3
    assert f"would train for about {format_duration(demo / 2e9)} on this CPU" in caplog.text
    assert "at the 2 GFLOP/s per rank this CPU reached just now on fp16's probe" in caplog.text


def test_the_paragraph_sends_the_learner_to_a_section_that_exists():
    import quotes

    paragraph = estimate.Emulated("bf16", 1e9, "a probe", 2e10, "another").paragraph()
    path, heading = re.search(r"\((docs/[\w-]+\.md)#([\w-]+)\)", paragraph).groups()
    headings = re.findall(r"^#+ (.+)$", quotes.read(path), flags=re.M)
    assert heading in {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-") for title in headings}


def test_a_run_the_cpu_computes_natively_measures_once_and_says_nothing_more(caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(estimate, "emulated_on_cpu", lambda mode: False)
    asked = []
    monkeypatch.setattr(estimate, "measure_cpu_flops", lambda *args, **kwargs: asked.append(args) or (40e9, "a probe"))
    check_run_time(load_params(["--config=demo", "--amp_mode=bf16"]), World(), torch.device("cpu"))
    assert len(asked) == 1 and "is slow on this CPU" not in caplog.text


def test_the_probes_compared_from_the_command_line():
    result = subprocess.run([sys.executable, "-m", "utils.estimate", "--config=test", "--base_channels=8"],
                            capture_output=True, text=True, check=True, cwd=ROOT)
    lines = result.stdout.splitlines()
    assert re.fullmatch(r".+, \d+ threads; --config=test: [\d.e+-]+ TFLOP of training and validation", lines[0])
    assert re.fullmatch(r"  its own step at batch 1: \d+ GFLOP/s, an estimate of [\d.]+ (s|min|hours|days)", lines[1]), lines
    assert re.fullmatch(r"  one 3-D convolution: \d+ GFLOP/s, an estimate of [\d.]+ (s|min|hours|days)", lines[2]), lines
