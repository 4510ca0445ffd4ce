"""The learning-rate schedule: cosine decay, batch-size scaling and warm-up as in the original."""
import math

import pytest

from utils import lr_schedule
from utils.YParams import YParams


def params_for(**changes):
    params = YParams("config/UNet.yaml", "base")
    params.update(changes)
    return params


def test_cosine_from_start_to_end_without_scaling():
    params = params_for(start_lr=2e-4, end_lr=0.0)
    assert lr_schedule(0, 1000, params) == pytest.approx(2e-4)
    assert lr_schedule(500, 1000, params) == pytest.approx(1e-4)
    assert lr_schedule(1000, 1000, params) == pytest.approx(0.0, abs=1e-12)
    values = [lr_schedule(s, 1000, params) for s in range(1001)]
    assert all(a >= b for a, b in zip(values, values[1:]))


@pytest.mark.parametrize("scaling, factor", [("sqrt", 2.0), ("linear", 4.0)])
def test_scaled_lr_warms_up_linearly_then_decays(scaling, factor):
    params = params_for(global_batch_size=256, base_batch_size=64, lr_scaling=scaling, warmup_steps=128)
    peak = 2e-4 * factor
    assert lr_schedule(0, 10000, params) == pytest.approx(peak / 128)
    assert lr_schedule(63, 10000, params) == pytest.approx(peak * 64 / 128)
    assert lr_schedule(128, 10000, params) == pytest.approx(0.5 * peak * (1 + math.cos(math.pi * 128 / 10000)))


def test_no_warmup_when_not_scaled_up():
    params = params_for(global_batch_size=64, base_batch_size=64, lr_scaling="sqrt")
    assert lr_schedule(0, 100, params) == pytest.approx(2e-4)
