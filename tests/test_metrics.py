"""Validation metrics on fields whose answers are known: identical, offset, negated, smoothed, plane waves."""
import math

import numpy as np
import pytest
import torch

from conftest import needs_cuda
from utils.generate_data import gaussian_smooth, generate_box
from utils.metrics import (FIELD_NAMES, ValidationMetrics, binned_power, format_metrics, k_bins, overdensity,
                           pearson_per_sample, power_ratio, power_spectrum_figure)

SIDE = 32


@pytest.fixture(scope="module")
def target():
    """Two samples (2, 5, 32, 32, 32) of the generator's gas fields, in the data's transformed units."""
    return torch.from_numpy(np.stack([generate_box(SIDE, seed)[1] for seed in (3, 4)]))


def evaluate(prediction, target, **kwargs):
    metrics = ValidationMetrics(**kwargs)
    metrics.update(prediction, target)
    return metrics.compute(), metrics


def values_of(results, prefix):
    return np.array([value for name, value in results.items() if name.startswith(prefix)])


def test_a_perfect_prediction_scores_perfectly(target):
    results, metrics = evaluate(target.clone(), target)
    assert len(values_of(results, "L1_")) == 5 and np.all(values_of(results, "L1_") == 0)
    assert values_of(results, "corr_") == pytest.approx([1, 1], abs=1e-12)
    assert values_of(results, "Pk_ratio_k") == pytest.approx([1] * 6, abs=1e-12)
    assert values_of(results, "rk_k") == pytest.approx([1] * 6, abs=1e-12)
    assert metrics.spectra.true.shape == (6,) and np.all(metrics.spectra.true > 0)


def test_a_constant_offset_shows_in_the_l1_of_its_field_only(target):
    offsets = torch.tensor([0.01, -0.02, 0.03, -0.04, 0.05])
    results, _ = evaluate(target + offsets[None, :, None, None, None], target)
    assert [results[f"L1_{name}"] for name in FIELD_NAMES] == pytest.approx(offsets.abs().tolist(), rel=1e-4)
    # An offset moves no structure: the correlations stay 1, and, since each density field is
    # normalised by its own mean, the overdensity spectrum is unchanged.
    assert values_of(results, "corr_") == pytest.approx([1, 1], abs=1e-6)
    assert values_of(results, "Pk_ratio_k") == pytest.approx([1] * 6, rel=1e-4)


def test_a_negated_field_is_anticorrelated(target):
    results, _ = evaluate(-target, target)
    assert results["corr_gas_density"] == pytest.approx(-1, abs=1e-9)
    assert results["corr_temperature"] == pytest.approx(-1, abs=1e-9)
    assert pearson_per_sample(-target, target).numpy() == pytest.approx(-np.ones((2, 2)), abs=1e-9)


def test_correlation_is_per_sample_so_matching_crop_means_earns_nothing(target):
    # A dense, hot crop and an ordinary one, each predicted as its own true mean: the pooled
    # correlation over all voxels of both is high (the crops' means differ), though the prediction
    # has no structure inside a crop at all.
    target = target.clone()
    target[1, :2] += 0.2
    prediction = target.mean(dim=(2, 3, 4), keepdim=True).expand_as(target).contiguous()
    results, _ = evaluate(prediction, target)
    assert values_of(results, "corr_") == pytest.approx([0, 0], abs=1e-6)
    pooled = np.corrcoef(prediction[:, 0].flatten(), target[:, 0].flatten())[0, 1]
    assert pooled > 0.5  # the case really does tell the two definitions apart


def test_smoothing_the_density_removes_power_at_high_k_only(target):
    # Smooth the *physical* density (the field whose spectrum is measured) with a Gaussian of
    # sigma cells: its overdensity modes are multiplied by exp(-k^2 sigma^2 / 2), so the power
    # ratio of a bin lies between exp(-k^2 sigma^2) at the bin's two edges.
    sigma = 1.0
    prediction = target.clone()
    for sample in range(len(target)):
        rho = np.exp(14.0 * target[sample, 0].double().numpy())
        prediction[sample, 0] = torch.from_numpy(np.log(gaussian_smooth(rho, sigma)) / 14.0)
    results, metrics = evaluate(prediction, target)
    ratio = values_of(results, "Pk_ratio_k")
    edges = k_bins(SIDE).edges.numpy()
    assert np.all(ratio <= np.exp(-(edges[:-1] * sigma) ** 2) * (1 + 1e-4))
    assert np.all(ratio >= np.exp(-(edges[1:] * sigma) ** 2) * (1 - 1e-4))
    assert ratio[0] > 0.9 and ratio[-1] < 0.1
    assert np.all(np.diff(ratio) < 0)
    # The phases are untouched; r(k) falls short of 1 only because the filter varies inside a bin.
    assert np.all(values_of(results, "rk_k") > 0.98)
    assert results["corr_gas_density"] < 1  # the structure did change


def test_the_ratio_sees_amplitudes_and_r_k_sees_phases(target):
    # Fluctuations damped to half: a quarter of the power in every bin, phases exact.
    damped = target.clone()
    delta = overdensity(target[:, 0]).double()
    damped[:, 0] = (torch.log1p(0.5 * delta) / 14.0).float()
    results, _ = evaluate(damped, target)
    assert values_of(results, "Pk_ratio_k") == pytest.approx([0.25] * 6, rel=1e-4)
    assert values_of(results, "rk_k") == pytest.approx([1] * 6, abs=1e-6)

    # The field moved by two cells (the box is periodic): all the power, structures misplaced,
    # worse the smaller they are.
    shifted = target.roll(2, dims=2)
    results, _ = evaluate(shifted, target)
    assert values_of(results, "Pk_ratio_k") == pytest.approx([1] * 6, rel=1e-4)
    r_k = values_of(results, "rk_k")
    assert r_k[0] > 0.9 and r_k[-1] < 0.5 and np.all(np.diff(r_k) < 0)


def test_the_log_field_smoothed_also_loses_power(target):
    # What a network that blurs its output does: smooth the log density. No closed form, but the
    # power must fall increasingly short towards high k.
    prediction = target.clone()
    prediction[:, 0] = torch.from_numpy(np.stack([gaussian_smooth(x.numpy(), 1.5) for x in target[:, 0]]))
    ratio = power_ratio(prediction, target).numpy()
    assert np.all(ratio < 1) and ratio[-1] < 0.5 * ratio[0]


def test_power_spectrum_units_and_mode_counting():
    side = 16
    generator = torch.Generator().manual_seed(0)
    # White noise of variance s^2 has P(k) = s^2 in every bin, in cell-volume units.
    noise = 0.5 * torch.randn(8, side, side, side, generator=generator)
    power = binned_power(noise).mean(dim=0).numpy()
    assert power[-3:] == pytest.approx([0.25] * 3, rel=0.05)

    # A plane wave puts its power into its own bin only, with the same value whether it runs along
    # an axis that rfftn halves (W) or not (D): conjugate pairs are counted once either way.
    grid = torch.arange(side, dtype=torch.float64)
    wave = torch.cos(2 * math.pi * 3 * grid / side)
    along_d = wave[:, None, None].expand(side, side, side)[None]
    along_w = wave[None, None, :].expand(side, side, side)[None]
    power_d, power_w = binned_power(along_d)[0].numpy(), binned_power(along_w)[0].numpy()
    wave_bin = int(np.searchsorted(k_bins(side).edges.numpy(), 2 * math.pi * 3 / side)) - 1
    assert power_d[wave_bin] > 0
    assert power_d == pytest.approx(power_w, rel=1e-6)
    assert np.delete(power_d, wave_bin) == pytest.approx(np.zeros(5), abs=1e-9 * power_d[wave_bin])


@pytest.mark.parametrize("side", [16, 32, 64, 128])
def test_a_mode_on_a_bin_edge_falls_in_the_bin_above_on_every_device(side):
    # Edge i of n log-spaced bins lies at |k|^2 = (side / 2)^(2 i / n) fundamentals^2, so a mode of integer
    # |k|^2 = m is at or above it exactly when m^n >= (side / 2)^(2 i): integers, no rounding. The GPU's
    # last bits differ from the CPU's, and a rule left to rounding put such modes in different bins.
    n_bins, half = 6, side // 2
    bins = k_bins(side, n_bins)
    freq = [round(f * side) for f in np.fft.fftfreq(side)]
    m = np.add.outer(np.add.outer(np.square(freq), np.square(freq)), np.square(np.arange(half + 1))).ravel()
    expected = np.full(m.shape, -1)
    for index, value in enumerate(m.tolist()):
        if 1 <= value <= half**2:
            expected[index] = max(i for i in range(n_bins) if value**n_bins >= half ** (2 * i))
    member = bins.weights > 0
    assert (member.sum(dim=0) <= 1).all()
    got = np.where(member.any(dim=0).numpy(), member.double().argmax(dim=0).numpy(), -1)
    assert (got == expected).all(), f"{int((got != expected).sum())} modes in another bin"


def test_overdensity_is_the_physical_field_about_its_own_mean():
    x = torch.log(torch.tensor([1.0, 3.0]).repeat(4)).reshape(1, 2, 2, 2) / 14.0
    assert overdensity(x).flatten().tolist() == pytest.approx([-0.5, 0.5] * 4, rel=1e-5)


def test_two_batches_accumulate_like_one_batch_of_both(target):
    prediction = 0.9 * target + 0.01 * torch.randn(target.shape, generator=torch.Generator().manual_seed(1))
    whole, _ = evaluate(prediction, target)
    metrics = ValidationMetrics()
    metrics.update(prediction[:1], target[:1])
    metrics.update(prediction[1:], target[1:])
    # Equal up to float32 FFT rounding, which differs between batch sizes (abs: values near zero).
    assert metrics.compute() == pytest.approx(whole, rel=1e-5, abs=1e-6)
    assert whole["L1_gas_density"] > 0 and whole["Pk_ratio_k0.251"] != pytest.approx(1, abs=1e-3)


@pytest.mark.parametrize("combine", ["sum", "mean"])
def test_ranks_combine_through_reduce_fn_whether_it_sums_or_averages(target, combine):
    prediction = target + 0.02 * torch.randn(target.shape, generator=torch.Generator().manual_seed(2))
    whole, _ = evaluate(prediction, target)
    other_rank, seen = ValidationMetrics(), []
    other_rank.update(prediction[1:], target[1:])
    other_rank.compute(reduce_fn=lambda flat: seen.append(flat.clone()) or flat)
    this_rank = ValidationMetrics()
    this_rank.update(prediction[:1], target[:1])
    if combine == "sum":
        reduced = this_rank.compute(reduce_fn=lambda flat: flat + seen[0])
    else:
        reduced = this_rank.compute(reduce_fn=lambda flat: (flat + seen[0]) / 2)
    assert reduced == pytest.approx(whole, rel=1e-5, abs=1e-6)  # float32 FFT rounding, as above


def test_low_precision_inputs_are_measured_in_float32_or_better(target):
    results, _ = evaluate(target.bfloat16(), target.bfloat16())
    assert values_of(results, "Pk_ratio_k") == pytest.approx([1] * 6, abs=1e-12)
    assert values_of(results, "corr_") == pytest.approx([1, 1], abs=1e-12)
    offset, _ = evaluate((target + 0.25).bfloat16(), target.bfloat16())
    assert offset["L1_temperature"] == pytest.approx(0.25, rel=0.02)


def test_a_diverged_prediction_reports_nan_instead_of_hiding_it(target):
    prediction = target.clone()
    prediction[0, :, 0, 0, 0] = float("nan")
    results, _ = evaluate(prediction, target)
    assert math.isnan(results["L1_gas_density"]) and math.isnan(results["corr_temperature"])


def test_mistakes_are_refused(target):
    metrics = ValidationMetrics()
    with pytest.raises(RuntimeError, match="before any update"):
        metrics.compute()
    with pytest.raises(ValueError, match="same shape"):
        metrics.update(target[:, :4], target[:, :4])
    metrics.update(target, target)
    with pytest.raises(ValueError, match="crop side 32"):
        metrics.update(target[..., :16, :16, :16], target[..., :16, :16, :16])


def test_the_report_and_the_figure(target):
    results, metrics = evaluate(0.8 * target, target)
    lines = format_metrics(results)
    assert len(lines) == 4 and "gas_density" in lines[0] and "0.251" in lines[2]
    image = power_spectrum_figure(metrics.spectra, title="step 0")
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    assert image.shape[0] > 200 and image.shape[1] > 200
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 20  # lines and text, not a blank canvas


@needs_cuda()
def test_update_never_waits_for_the_gpu(target):
    prediction, truth = (0.9 * target).cuda(), target.cuda()
    metrics = ValidationMetrics()
    k_bins.cache_clear()  # building the k bins on the device must not wait either
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            metrics.update(prediction, truth)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    on_cpu = ValidationMetrics()
    for _ in range(3):
        on_cpu.update(0.9 * target, target)
    assert metrics.compute() == pytest.approx(on_cpu.compute(), rel=1e-5)
