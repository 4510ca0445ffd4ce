"""The learning-rate schedule is the original tutorial's, step for step, for every named config.

The original's formula is written out below, independently of utils.lr_schedule: per optimiser step
``i`` counted from 1, ``T`` total steps, ``w`` warm-up steps and the scaled initial rate ``init``,
``(i / w) * init`` while ``i < w`` and then ``end + 0.5 (init - end)(1 + cos(pi (i - w) / T))``
when the global batch exceeds the base batch with sqrt/linear scaling, else
``end + 0.5 (init - end)(1 + cos(pi i / T))``. The project's step ``s`` (0-based) is the original's ``i = s + 1``.
"""
import math

import pytest
import yaml

from utils import lr_schedule
from utils.YParams import YParams, data_parallel_size

CONFIG_FILE = "config/UNet.yaml"
CONFIG_NAMES = list(yaml.safe_load(open(CONFIG_FILE)))


def original_lr(i, global_bs, base_bs, scaling, start_lr, end_lr, tot_steps, warmup_steps):
    if scaling == "sqrt":
        init_lr = math.sqrt(global_bs / base_bs) * start_lr
    elif scaling == "linear":
        init_lr = (global_bs / base_bs) * start_lr
    else:
        init_lr = start_lr
    if global_bs > base_bs and scaling != "none":
        if i < warmup_steps:
            return (i / warmup_steps) * init_lr
        return end_lr + 0.5 * (init_lr - end_lr) * (1 + math.cos(math.pi * (i - warmup_steps) / tot_steps))
    return end_lr + 0.5 * (init_lr - end_lr) * (1 + math.cos(math.pi * i / tot_steps))


def original_for(params, step, tot_steps):
    return original_lr(step + 1, params.global_batch_size, params.base_batch_size, params.lr_scaling,
                       params.start_lr, params.end_lr, tot_steps, params.warmup_steps)


def steps_to_check(tot_steps, warmup_steps):
    around_warmup = [warmup_steps + d for d in (-2, -1, 0, 1)]
    candidates = [0, 1, *around_warmup, tot_steps // 2, tot_steps - 2, tot_steps - 1]
    return sorted({s for s in candidates if 0 <= s < tot_steps})


@pytest.mark.parametrize("config", CONFIG_NAMES)
def test_every_config_follows_the_original_schedule(config):
    params = YParams(CONFIG_FILE, config)
    tot_steps = params.num_epochs * (params.Nsamples // params.global_batch_size)  # the original's tot_steps
    for step in steps_to_check(tot_steps, params.warmup_steps):
        assert lr_schedule(step, tot_steps, params) == pytest.approx(
            original_for(params, step, tot_steps), rel=1e-12, abs=1e-18), (config, step)


@pytest.mark.parametrize("scaling", ["none", "sqrt", "linear"])
@pytest.mark.parametrize("warmup_steps", [0, 1, 128])
@pytest.mark.parametrize("global_bs, base_bs", [(64, 64), (512, 64), (32, 64)])
@pytest.mark.parametrize("end_lr", [0.0, 1e-5])
def test_every_setting_follows_the_original_schedule_at_every_step(scaling, warmup_steps, global_bs, base_bs,
                                                                   end_lr):
    params = YParams(CONFIG_FILE, "base")
    params.update({"lr_scaling": scaling, "warmup_steps": warmup_steps, "global_batch_size": global_bs,
                   "base_batch_size": base_bs, "end_lr": end_lr})
    tot_steps = 512
    for step in range(tot_steps):
        assert lr_schedule(step, tot_steps, params) == pytest.approx(
            original_for(params, step, tot_steps), rel=1e-12, abs=1e-18), step


def test_bs512_test_keeps_the_scaled_rate_across_the_end_of_the_warmup():
    """The numbers a user compares with the original's large-batch runs (fractions of the scaled rate)."""
    params = YParams(CONFIG_FILE, "bs512_test")
    tot_steps = params.num_epochs * (params.Nsamples // params.global_batch_size)
    assert tot_steps == 1280 and params.warmup_steps == 128  # the original's 10 epochs of 128 steps
    peak = params.start_lr * math.sqrt(512 / 64)
    fraction = [lr_schedule(step, tot_steps, params) / peak for step in range(tot_steps)]
    assert fraction[0] == pytest.approx(1 / 128)
    assert fraction[126] == pytest.approx(127 / 128)  # the original's i = 127, the last warm-up step
    assert fraction[127] == pytest.approx(1.0) and fraction[128] == pytest.approx(1.0, abs=1e-4)
    assert round(fraction[640], 3) == 0.653
    assert round(fraction[-1], 4) == 0.0245  # the cosine stops short of end_lr after a warm-up


def test_train_counts_the_originals_total_steps():
    """train.py's total (epochs x training batches per epoch) is the original's
    num_epochs * (Nsamples // global batch)."""
    from utils.data_loader import get_data_loaders

    for config in CONFIG_NAMES:
        params = YParams(CONFIG_FILE, config)
        params.update({"data_loader_config": "synthetic", "num_data_workers": 0})
        for world_size in (1, 4):
            groups = data_parallel_size(params.domain_mesh, world_size)  # the ranks that split the batch
            train_loader, _ = get_data_loaders(params, world_rank=groups - 1, world_size=groups, pin_memory=False)
            assert len(train_loader) == params.Nsamples // params.global_batch_size, (config, world_size)
