"""The time estimate before training: a GPU-sized config on a CPU is refused with one paragraph, unless --device=cpu."""
import os
import re
import types

import pytest
import torch

from conftest import run_train
from utils.estimate import check_run_time, format_duration, measure_cpu_flops, run_flops
from utils.distributed import World
from utils.YParams import YParams


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


def test_a_short_run_says_nothing_and_measures_nothing():
    params = YParams("config/UNet.yaml", "demo")
    assert run_flops(params, 0.86e9) < 1e13  # the demo: far below the size that is checked
    check_run_time(params, World(), types.SimpleNamespace(type="cpu"))  # returns at once, no error


def test_the_cpu_rate_is_a_plausible_measurement():
    rate = measure_cpu_flops()
    assert 1e8 < rate < 1e14  # between a tenth of a GFLOP/s and 100 TFLOP/s


@pytest.mark.parametrize("seconds, text", [(30, "30 s"), (600, "10 min"), (3 * 3600, "3.0 hours"),
                                           (5 * 86400, "5.0 days")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_a_cpu_run_logs_its_thread_count_and_warns_about_fp16(tmp_path):
    # The run stops at its missing data file, after the device checks have logged.
    result = run_train(["--config=test", "--amp_mode=fp16", f"--expdir={tmp_path}", "--train_path=/nowhere.h5"],
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    assert result.returncode == 2 and "/nowhere.h5" in result.stderr
    assert "CPU threads: 1 (torch.get_num_threads(); OMP_NUM_THREADS sets it)" in result.stdout
    assert "--amp_mode=fp16 on a CPU is slow" in result.stdout and "use --amp_mode=bf16 or none" in result.stdout
