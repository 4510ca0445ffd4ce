"""Validation metrics a physicist reads before trusting the emulator, not just the loss.

The L1 loss says how far the prediction is from the truth on average over all five fields. It
does not say which field is wrong, whether the predicted structures sit where the true ones do,
or on which scales the network loses power; a network trained with an L1 loss tends to predict
a smoothed field, which shows up as missing power at high wavenumber k long before the loss stops
falling. These metrics answer those questions, on the validation crops (B, 5, S, S, S) in the
data's transformed units (see utils/generate_data.py):

- **L1 per field**, in transformed units, for ``FIELD_NAMES``: gas density (log, ``ln(rho/mean)/14``),
  temperature (``log10 T - 4``) and the gas velocity components along the array axes D, H and W
  (channels 2, 3, 4). Axis names rather than x/y/z, because which physical axis an array axis is
  depends on how the data were written; the D/H/W order is fixed by the tensors.
- **Pearson correlation** of predicted and true gas density and temperature (transformed, i.e.
  logarithmic, units), computed per sample and averaged over samples. Per sample, because the
  pooled correlation over all voxels of many crops also rewards getting each crop's *mean* right
  (crop-to-crop differences of the mean add to the covariance), which is the easy part; the
  per-sample value measures the structure inside a crop. It also does not depend on how
  the validation set is split into batches or ranks.
- **Power spectrum ratio** P_pred(k) / P_true(k) of the gas overdensity ``delta = rho / mean - 1``
  with the physical density ``rho = exp(14 x)``, in ``n_bins`` logarithmic bins of |k| from the
  fundamental (2 pi / S) to the Nyquist (pi) wavenumber of the crop, in radians per cell. The
  physical overdensity, not the log field, because that is the field whose spectrum cosmologists
  measure and compare with simulations, and because it weighs the dense gas the way the physics
  does: the log transform compresses exactly the peaks an emulator most often gets wrong. Each
  field is normalised by its own crop mean, so the ratio measures the shape of the fluctuations;
  an offset of the mean shows up in the L1 of gas density instead. The spectra are averaged over
  all samples before the ratio is taken (a single crop's bin holds few modes and is noisy).
  Crops are not periodic, so their edges leak some power into every bin; truth and prediction go
  through the same estimator, and the ratio cancels most of that.
- **Cross-correlation coefficient** r(k) = P_cross / sqrt(P_pred P_true) per bin: 1 when the
  predicted Fourier phases match the true ones whatever the amplitudes, the complement of the
  ratio (which ignores phases).

Everything is computed on the tensors' device, whatever the input dtype (bf16 autocast outputs
included): in float32 within a sample (element-wise work, FFTs, and sums over one crop, which
torch reduces pairwise, to about 1e-7), in float64 across samples, batches and ranks. Nothing here
waits for the device: ``ValidationMetrics.update`` only queues work, and ``compute`` reads the
results once.
"""
import contextlib
import functools
import math
import time
from dataclasses import dataclass

import numpy as np
import torch

FIELD_NAMES = ("gas_density", "temperature", "velocity_D", "velocity_H", "velocity_W")
CORRELATED_FIELDS = ("gas_density", "temperature")  # channels 0 and 1
DENSITY_CHANNEL = 0
DENSITY_LOG_SCALE = 14.0  # the data's convention: physical density = exp(14 x) times the mean
DEFAULT_BINS = 6


# ----------------------------------------------------------------------------- functions on one batch

def l1_per_field(prediction, target):
    """Mean absolute error per channel over batch and voxels: a float64 tensor of shape (C,)."""
    voxels = prediction.shape[0] * prediction[0, 0].numel()
    return _l1_sums(prediction, target) / voxels


def _l1_sums(prediction, target):
    error = (prediction.float() - target.float()).abs()
    return error.flatten(start_dim=2).sum(dim=2).double().sum(dim=0)  # per sample in float32, then float64


def pearson_per_sample(prediction, target, channels=(0, 1)):
    """Pearson correlation of each sample's predicted and true field: float64 (B, len(channels)).

    A constant prediction gives 0 (it carries no structure); a constant truth gives NaN, since no
    prediction can correlate with it (``ValidationMetrics`` leaves such samples out of the mean).
    """
    r, defined = _pearson(prediction, target, list(channels))
    return torch.where(defined, r, torch.full_like(r, math.nan))


def _pearson(prediction, target, channels):
    """(r, defined): r per sample and channel, and whether the truth varies (r is meaningful)."""
    # One channel at a time: indexing with a list would copy the list to the GPU and wait for it.
    p = torch.stack([prediction[:, c].float().flatten(start_dim=1) for c in channels], dim=1)
    t = torch.stack([target[:, c].float().flatten(start_dim=1) for c in channels], dim=1)
    # Centre first, so that the products below lose nothing to cancellation.
    p = p - p.mean(dim=2, keepdim=True)
    t = t - t.mean(dim=2, keepdim=True)
    covariance = (p * t).sum(dim=2).double()
    variance_p = (p * p).sum(dim=2).double()
    variance_t = (t * t).sum(dim=2).double()
    r = covariance / (variance_p * variance_t).sqrt()
    r = torch.where(variance_p == 0, torch.zeros_like(r), r)  # NaN and inf predictions stay NaN
    return r, variance_t > 0


def overdensity(log_density):
    """delta = rho / mean(rho) - 1 per sample, with rho = exp(14 x); x of shape (B, S, S, S)."""
    rho = torch.exp(DENSITY_LOG_SCALE * log_density.float())
    return rho / rho.mean(dim=(1, 2, 3), keepdim=True) - 1.0


@dataclass(frozen=True)
class KBins:
    """Logarithmic |k| bins of the rfftn grid of a cubic crop (radians per cell).

    ``weights`` (n_bins, modes) averages a quantity over the modes of each bin, counting the
    modes that rfftn stores once but stand for a conjugate pair twice, so a bin's value is the
    average over all of its modes, not over half of them.
    """
    side: int
    centres: torch.Tensor  # (n_bins,) mean |k| of each bin's modes, float64
    edges: torch.Tensor    # (n_bins + 1,) from the fundamental to the Nyquist wavenumber
    weights: torch.Tensor  # (n_bins, side * side * (side // 2 + 1)), float64


@functools.lru_cache(maxsize=16)
def k_bins(side, n_bins=DEFAULT_BINS, device="cpu"):
    """The bins for crops of side ``side``, built on ``device`` without a host sync (cached)."""
    device = torch.device(device)
    full = 2 * math.pi * torch.fft.fftfreq(side, device=device, dtype=torch.float64)
    half = 2 * math.pi * torch.fft.rfftfreq(side, device=device, dtype=torch.float64)
    k = (full[:, None, None] ** 2 + full[None, :, None] ** 2 + half[None, None, :] ** 2).sqrt()
    # A mode of the last axis strictly between 0 and Nyquist stands for itself and its conjugate.
    paired = (half > 0) & (half < math.pi)
    multiplicity = (1.0 + paired.double()).expand_as(k).flatten()
    k = k.flatten()

    fundamental, nyquist = 2 * math.pi / side, math.pi
    edges = torch.logspace(math.log10(fundamental), math.log10(nyquist), n_bins + 1,
                           device=device, dtype=torch.float64)
    # Bins are closed below and open above, [lo, hi), the last one closed at Nyquist. Many modes lie
    # exactly on an edge (|k| = 4 fundamentals on the middle edge at side 32), and the CPU's and the
    # GPU's last bits differ: the edges move down by a relative 1e-9 (the last one up), so that such a
    # mode falls in the bin above on every device. Neighbouring |k| differ by more than 1e-5 up to side 256.
    padded = edges * (1 - 1e-9)
    padded[-1] = edges[-1] * (1 + 1e-9)
    index = torch.bucketize(k, padded, right=True)  # 1..n_bins inside, 0 or n_bins + 1 outside
    member = index[None, :] == torch.arange(1, n_bins + 1, device=device)[:, None]
    weights = member.double() * multiplicity
    weights /= weights.sum(dim=1, keepdim=True).clamp_min(1.0)  # an empty bin (too many bins for the side) stays 0
    return KBins(side, weights @ k, edges, weights)


def binned_power(field_a, field_b=None, bins=None):
    """Bin-averaged (cross-)power of real fields (B, S, S, S): float64 (B, n_bins).

    P(k) = Re(a_k conj(b_k)) / N with N = S^3 voxels, i.e. in units of the cell volume, the usual
    convention in which white noise of variance s^2 has P = s^2.
    """
    bins = bins or _bins_for(field_a, DEFAULT_BINS)
    a = _modes(field_a)
    b = a if field_b is None else _modes(field_b)
    return _binned(a, b, bins)


def _modes(field):
    """The rfftn modes of a (B, S, S, S) field, flattened to (B, modes), complex64."""
    return torch.fft.rfftn(field.float(), dim=(-3, -2, -1)).flatten(start_dim=1)


def _binned(a, b, bins):
    cross = a.real * b.real + a.imag * b.imag  # Re(a conj(b)), in float32 like the FFT
    return (cross.double() @ bins.weights.T) / bins.side**3


def power_ratio(prediction, target, n_bins=DEFAULT_BINS):
    """P_pred(k) / P_true(k) of the gas overdensity, spectra averaged over the batch: (n_bins,)."""
    bins = _bins_for(target[:, DENSITY_CHANNEL], n_bins)
    p_pred = binned_power(overdensity(prediction[:, DENSITY_CHANNEL]), bins=bins).sum(dim=0)
    p_true = binned_power(overdensity(target[:, DENSITY_CHANNEL]), bins=bins).sum(dim=0)
    return p_pred / p_true


def _bins_for(field, n_bins):
    side = field.shape[-1]
    if tuple(field.shape[-3:]) != (side,) * 3:
        raise ValueError(f"power spectra need cubic crops, got spatial shape {tuple(field.shape[-3:])}")
    return k_bins(side, n_bins, field.device)


# ----------------------------------------------------------------------------- accumulating over batches

@dataclass(frozen=True)
class Spectra:
    """Gas-overdensity spectra averaged over all validation samples, for the figure."""
    k: np.ndarray          # bin centres, radians per cell
    true: np.ndarray       # P_true(k), cell volumes
    predicted: np.ndarray  # P_pred(k)
    cross: np.ndarray      # Re P_cross(k)

    @property
    def ratio(self):
        return self.predicted / self.true

    @property
    def correlation(self):
        """r(k) = P_cross / sqrt(P_pred P_true)."""
        return self.cross / np.sqrt(self.predicted * self.true)


class WorkClock:
    """Seconds spent in the measured blocks, summed over calls without waiting for the device.

    On a GPU each block's work is queued, not done, when the block ends: a CUDA event is recorded
    before and after it, and :meth:`seconds` (called where the caller waits anyway) adds up the
    times between them. On a CPU the work is done by then, and the host clock measures it.
    """

    def __init__(self):
        self.events, self.host_seconds = [], 0.0

    @contextlib.contextmanager
    def measure(self, device):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.events.append((start, end))
        else:
            begin = time.perf_counter()
            yield
            self.host_seconds += time.perf_counter() - begin

    def seconds(self):
        if self.events:
            self.events[-1][1].synchronize()  # waits for the device
        return self.host_seconds + sum(start.elapsed_time(end) for start, end in self.events) / 1000


class ValidationMetrics:
    """Accumulates the metrics over the batches of one validation pass; create one per pass.

        metrics = ValidationMetrics()
        for inputs, targets in loader:
            metrics.update(model(inputs), targets)       # queues device work, never waits
        values = metrics.compute(reduce_fn)              # one all-reduce, one host sync
        image = power_spectrum_figure(metrics.spectra)

    Only sums are kept, in float64 on the device, and every reported value is a ratio of two
    sums. So ``reduce_fn``, which combines the state over ranks, may sum or average it: both
    give the same numbers, and a caller's existing mean all-reduce can be passed as it is.
    """

    def __init__(self, n_bins=DEFAULT_BINS):
        self.n_bins = n_bins
        self.bins = None
        self.sums = None
        self.spectra = None  # set by compute()
        self.clock = WorkClock()  # the time update() costs, reported apart from the validation loss pass

    def update(self, prediction, target):
        """Add one batch: ``prediction`` and ``target`` of shape (B, 5, S, S, S), any float dtype."""
        with self.clock.measure(target.device):
            self._update(prediction, target)

    def _update(self, prediction, target):
        if prediction.shape != target.shape or prediction.dim() != 5 or prediction.shape[1] != len(FIELD_NAMES):
            raise ValueError(f"expected prediction and target of the same shape (B, {len(FIELD_NAMES)}, S, S, S), "
                             f"got {tuple(prediction.shape)} and {tuple(target.shape)}")
        prediction, target = prediction.detach(), target.detach()
        bins = _bins_for(target, self.n_bins)
        if self.bins is None:
            self.bins = bins
            self.sums = self._zeros(target.device)
        elif bins.side != self.bins.side:
            raise ValueError(f"every batch of a validation pass must have the crop side {self.bins.side}, "
                             f"got {target.shape[-1]}")

        batch = prediction.shape[0]
        sums = self.sums
        sums["l1"] += _l1_sums(prediction, target)
        sums["voxels"] += batch * target[0, 0].numel()

        r, defined = _pearson(prediction, target, list(range(len(CORRELATED_FIELDS))))
        sums["correlation"] += torch.where(defined, r, torch.zeros_like(r)).sum(dim=0)
        sums["correlated_samples"] += defined.sum(dim=0)

        modes_pred = _modes(overdensity(prediction[:, DENSITY_CHANNEL]))
        modes_true = _modes(overdensity(target[:, DENSITY_CHANNEL]))
        sums["power_true"] += _binned(modes_true, modes_true, bins).sum(dim=0)
        sums["power_predicted"] += _binned(modes_pred, modes_pred, bins).sum(dim=0)
        sums["power_cross"] += _binned(modes_pred, modes_true, bins).sum(dim=0)
        sums["samples"] += batch

    def compute(self, reduce_fn=None):
        """The metrics as plain floats; waits for the device once.

        ``reduce_fn(tensor) -> tensor``, if given, combines a flat float64 tensor over all ranks
        (sum or mean, e.g. ``lambda t: all_reduce_mean(t, world)``); it is called exactly once, so
        every rank must call compute().
        """
        if self.sums is None:
            raise RuntimeError("ValidationMetrics.compute() before any update(): no batch was seen")
        flat = torch.cat([value.reshape(-1) for value in self.sums.values()])
        if reduce_fn is not None:
            flat = reduce_fn(flat)
        values = torch.cat([flat, self.bins.centres]).tolist()  # the host waits for the device here, once
        sums, start = {}, 0
        for name, tensor in self.sums.items():
            sums[name] = np.array(values[start:start + tensor.numel()])
            start += tensor.numel()

        samples = sums["samples"]
        self.spectra = Spectra(k=np.array(values[start:]), true=sums["power_true"] / samples,
                               predicted=sums["power_predicted"] / samples, cross=sums["power_cross"] / samples)
        results = {f"L1_{name}": l1 for name, l1 in zip(FIELD_NAMES, sums["l1"] / sums["voxels"])}
        # 0 / 0 (no sample whose truth varies, or an empty k bin) reports NaN rather than failing.
        with np.errstate(invalid="ignore", divide="ignore"):
            correlation = sums["correlation"] / sums["correlated_samples"]
            ratio, coefficient = self.spectra.ratio, self.spectra.correlation
        results.update({f"corr_{name}": r for name, r in zip(CORRELATED_FIELDS, correlation)})
        results.update({f"Pk_ratio_k{k:.3g}": value for k, value in zip(self.spectra.k, ratio)})
        results.update({f"rk_k{k:.3g}": value for k, value in zip(self.spectra.k, coefficient)})
        return {name: float(value) for name, value in results.items()}

    def _zeros(self, device):
        def zeros(size=()):
            return torch.zeros(size, dtype=torch.float64, device=device)

        return {"l1": zeros(len(FIELD_NAMES)), "voxels": zeros(), "correlation": zeros(len(CORRELATED_FIELDS)),
                "correlated_samples": zeros(len(CORRELATED_FIELDS)), "power_true": zeros(self.n_bins),
                "power_predicted": zeros(self.n_bins), "power_cross": zeros(self.n_bins), "samples": zeros()}


def format_metrics(values):
    """The values of ``ValidationMetrics.compute`` as a few readable log lines."""
    def pick(prefix):
        return "  ".join(f"{name[len(prefix):]} {value:.4g}" for name, value in values.items()
                         if name.startswith(prefix))

    return [f"  L1 per field (transformed units): {pick('L1_')}",
            f"  Pearson r per sample: {pick('corr_')}",
            f"  gas overdensity P_pred/P_true at k [rad/cell]: {pick('Pk_ratio_k')}",
            f"  gas overdensity r(k) at k [rad/cell]: {pick('rk_k')}"]


# ----------------------------------------------------------------------------- the picture

def power_spectrum_figure(spectra, title=""):
    """An (H, W, 3) uint8 image: true and predicted P(k), their ratio, and r(k), for TensorBoard."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed; safe in batch jobs
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (ax_power, ax_ratio, ax_r) = plt.subplots(3, 1, sharex=True, figsize=(5.6, 6.4), dpi=80,
                                                   gridspec_kw={"height_ratios": (2, 1, 1)})
    ax_power.loglog(spectra.k, spectra.true, "o-", color="black", label="true")
    ax_power.loglog(spectra.k, spectra.predicted, "s--", color="tab:orange", label="predicted")
    ax_power.set_ylabel("P(k) [cell$^3$]")
    ax_power.legend(frameon=False)
    ax_power.set_title(title or "gas overdensity power spectrum", fontsize=10)

    with np.errstate(invalid="ignore", divide="ignore"):
        ratio, coefficient = spectra.ratio, spectra.correlation
    ax_ratio.axhline(1.0, color="grey", lw=0.8)
    ax_ratio.semilogx(spectra.k, ratio, "s-", color="tab:orange")
    finite = ratio[np.isfinite(ratio) & (ratio > 0)]
    if finite.size and (finite.max() > 3 or finite.min() < 1 / 3):
        ax_ratio.set_yscale("log")  # a badly wrong early model: show how far off, not a clipped line
    ax_ratio.set_ylabel("P$_{pred}$ / P$_{true}$")

    ax_r.axhline(1.0, color="grey", lw=0.8)
    ax_r.semilogx(spectra.k, coefficient, "o-", color="tab:blue")
    ax_r.set_ylim(min(0.0, float(np.nanmin(coefficient, initial=0.0))) - 0.05, 1.05)
    ax_r.set_ylabel("r(k)")
    ax_r.set_xlabel("k [rad / cell]")
    # Label the bins themselves: log-axis minor labels would overlap on a span of one decade.
    ax_r.set_xticks(spectra.k, labels=[f"{k:.2g}" for k in spectra.k])
    ax_r.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    fig.tight_layout()
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return image
