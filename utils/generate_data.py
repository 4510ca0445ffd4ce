"""Generate a synthetic stand-in for the tutorial's N-body -> hydrodynamics data set.

Why: the real data set is large and not always at hand, yet tests, CI and a first training run
on a laptop need files with exactly its layout whose targets are a learnable, physically
motivated function of the inputs (a network trained on noise teaches nothing). This script
writes ``synthetic_train.h5`` and ``synthetic_valid.h5`` with a toy universe in each:

1. Linear density contrast: a periodic Gaussian random field with power spectrum
   ``P(k) ~ k^n * k^2 / (k^2 + k_t^2) * exp(-(k r_c)^2)``. The ``k^n`` part (n about -2) gives
   cosmic-web-like filaments in small boxes; the turnover at ``k_t = 2 pi / turnover_cells``
   makes it white on large scales, like a real spectrum, so displacements and velocities stop
   growing with the box side (rms velocity 0.7, 0.8, 0.9 at sides 64, 128, 256) and one velocity
   scale fits train and validation boxes of any size;
   the Gaussian cut-off at ``r_c = cutoff_cells`` removes grid noise. The amplitude is fixed by
   the rms of the linear contrast in an infinite volume (``--sigma``, the growth factor in
   disguise), so boxes of different sides share one spectrum, as simulations of one cosmology do.
2. Zel'dovich approximation: displacement ``psi = -grad(phi)`` with ``laplacian(phi) = delta``,
   i.e. ``psi_k = i k delta_k / k^2``. One particle per cell moves from its grid point by ``psi``
   (in cells); its velocity is ``f * psi`` (``f`` the growth rate; velocities are in units of
   ``H`` times the cell size). Dark-matter density = cloud-in-cell deposit of the particles;
   dark-matter velocity = momentum deposit / mass deposit, with the linear velocity at the cell
   blended in where hardly any mass landed (see ``deposit_particles``).
3. Gas: density and velocity are the dark-matter ones smoothed by a Gaussian of the Jeans-like
   pressure scale ``jeans_cells``; temperature follows ``T = T0 (rho_gas / mean)^(gamma - 1)``
   times a log-normal scatter whose log is a smooth random field (correlation length
   ``scatter_cells``), not white noise per voxel.

Everything is FFT-based and therefore periodic, and deterministic for a seed
(``numpy.random.default_rng``; train draws from the stream ``[seed, 0]``, validation from
``[seed, 1]``, so no seed's validation box is another seed's training box).

Layout (that of the real data): dataset ``Nbody`` of shape (4, L, L, L) and dataset ``Hydro``
of shape (5, L, L, L), float32, channel first (C, D, H, W). Velocity component k lies along
array axis k + 1, i.e. channel 1 along D, 2 along H, 3 along W. Transforms, every value is
clipped into [-LIMIT, LIMIT] with LIMIT = 0.999 so that a tanh output can reach every target:

- ``Nbody[0]`` dark-matter density:  ``ln(rho_dm / mean) / 14``. Cells no particle reached
  (deep voids, about 0.4 % of voxels with the defaults) have rho = 0 and take the floor -LIMIT.
- ``Nbody[1:4]`` dark-matter velocity:  ``v / VELOCITY_SCALE`` with VELOCITY_SCALE = 4, then
  clipped. No squash, so the transform is linear and exactly invertible inside the range; with
  the default physics the rms is about a fifth of the range and under 0.001 % of voxels clip.
- ``Hydro[0]`` gas density:  ``ln(rho_gas / mean) / 14``, i.e. the physical value is
  ``exp(14 x)`` times the mean.
- ``Hydro[1]`` gas temperature:  ``(log10(T / K) - TEMPERATURE_CENTRE) / TEMPERATURE_SCALE``
  with centre 4 and scale 1 dex, i.e. 10^3 K .. 10^5 K maps to -1 .. 1, then clipped (the
  default relation spans about 2e3 .. 4e4 K, so nothing clips).
- ``Hydro[2:5]`` gas velocity:  like the dark-matter velocity.

Unless ``--no_npy``, each HDF5 file also gets its channel-last .npy copies (for the DALI loader)
from utils.convert_h5_to_npy, ``<name>_data.npy`` and ``<name>_label.npy`` beside it.
Memory: about 80 bytes per voxel of the larger box at peak (a 256^3 box needs about 1.3 GB).
`python -m utils.generate_data --train_size 256 --val_size 128` took 11.5 s of wall time on the
project's 2-core CPU machine (2026-11-23), .npy copies included.

Usage:
    python -m utils.generate_data                       # data/synthetic_{train,valid}.h5, 128^3 and 64^3
    python -m utils.generate_data --train_size 256 --val_size 128 --force
"""
import argparse
import functools
import itertools
import math
import os
import sys

import h5py
import numpy as np
from tqdm import tqdm

from utils.convert_h5_to_npy import convert, make_writable_dir, output_paths as npy_output_paths
from utils.errors import UserError, exit_on_user_error
from utils.files import atomic_path

GENERATOR_NAME = "utils.generate_data"
GENERATOR_VERSION = "1"

LIMIT = 0.999  # every stored value lies in [-LIMIT, LIMIT], strictly inside (-1, 1)
DENSITY_LOG_SCALE = 14.0  # x = ln(rho / mean) / 14, the real data's convention
DENSITY_FLOOR = math.exp(-DENSITY_LOG_SCALE * LIMIT)  # densities below this would clip anyway
TEMPERATURE_CENTRE = 4.0  # log10(T / K) stored as 0
TEMPERATURE_SCALE = 1.0  # dex stored as 1
VELOCITY_SCALE = 4.0  # in units of H times the cell size; see the module docstring
BYTES_PER_VOXEL = 80  # peak memory of a run per voxel of its larger box, measured at 256^3

# Physics knobs and their defaults. The defaults give clear filaments and voids in a 64^3 box,
# a gas density visibly smoother than the dark matter, a tight temperature-density relation
# (Pearson about 0.93) and almost no clipping.
PHYSICS_DEFAULTS = {
    "spectral_index": -2.0,
    "sigma": 1.0,
    "cutoff_cells": 1.0,
    "turnover_cells": 32.0,
    "growth_rate": 0.5,
    "jeans_cells": 1.5,
    "t0": 1.0e4,
    "gamma": 1.5,
    "scatter_dex": 0.05,
    "scatter_cells": 4.0,
}
PHYSICS_HELP = {
    "spectral_index": "slope n of P(k) ~ k^n between the turnover and the cut-off",
    "sigma": "rms linear density contrast at grid resolution (the growth factor)",
    "cutoff_cells": "Gaussian small-scale cut-off of the linear field, in cells",
    "turnover_cells": "wavelength where P(k) turns over to white noise, in cells",
    "growth_rate": "f = dln D / dln a; velocity = f H displacement",
    "jeans_cells": "Gaussian pressure-smoothing length of the gas, in cells",
    "t0": "gas temperature at the mean density, in K",
    "gamma": "slope of the temperature-density relation, T ~ rho^(gamma - 1)",
    "scatter_dex": "rms of the log-normal temperature scatter, in dex",
    "scatter_cells": "correlation length of that scatter, in cells",
}

# Stages reported to the progress callback of generate_box, in order.
STAGES = (
    "linear field",
    "displacements",
    "particle deposit",
    "dark matter",
    "gas density",
    "gas temperature",
    "gas velocity",
)

OUTPUT_NAMES = {"train": "synthetic_train.h5", "valid": "synthetic_valid.h5"}


# -----------------------------------------------------------------------------
# Fourier-space building blocks

def fft3(field):
    """Real-to-complex FFT of a (L, L, L) field; float32 in, complex64 out with NumPy >= 2."""
    return np.fft.rfftn(field, axes=(0, 1, 2))


def ifft3(modes, side):
    """Inverse of fft3 back to a real (side, side, side) field."""
    return np.fft.irfftn(modes, s=(side, side, side), axes=(0, 1, 2))


def wavenumbers(side):
    """Angular wavenumbers (radians per cell) per axis, broadcastable to the rfftn layout."""
    k_full = (2 * np.pi * np.fft.fftfreq(side)).astype(np.float32)
    k_half = (2 * np.pi * np.fft.rfftfreq(side)).astype(np.float32)
    return k_full[:, None, None], k_full[None, :, None], k_half[None, None, :]


def k_squared(side):
    """|k|^2 on the rfftn grid, float32 to keep a 256^3 box light."""
    kx, ky, kz = wavenumbers(side)
    return kx * kx + ky * ky + kz * kz


def spectrum_shape(k2, spectral_index, cutoff_cells, turnover_cells):
    """P(k) up to its amplitude, from |k|^2; zero at k = 0 because the mean is fixed by the box."""
    k_turn2 = (2 * np.pi / turnover_cells) ** 2
    safe_k2 = np.where(k2 > 0, k2, 1.0)  # the k = 0 value is zeroed below; avoid 0 ** negative
    shape = safe_k2 ** ((spectral_index + 2) / 2) / (safe_k2 + k_turn2) * np.exp(-safe_k2 * cutoff_cells**2)
    return np.where(k2 > 0, shape, 0.0)


def spectrum_amplitude(sigma, spectral_index, cutoff_cells, turnover_cells):
    """The amplitude A for which the linear contrast has rms ``sigma`` in an infinite volume.

    sigma^2 = 1 / (2 pi^2) * integral of k^2 P(k) dk. Using the integral rather than the sum over
    one box's modes keeps the spectrum identical for every box side (a small box then simply
    misses some large-scale power, as a small simulation would).
    """
    # Midpoint rule in ln k; the integrand vanishes at both ends of this generous range.
    ln_k = np.linspace(math.log(1e-6), math.log(50.0 / cutoff_cells), 20001)
    k = np.exp(0.5 * (ln_k[1:] + ln_k[:-1]))
    integrand = k**3 * spectrum_shape(k * k, spectral_index, cutoff_cells, turnover_cells)
    variance_per_amplitude = integrand.sum() * (ln_k[1] - ln_k[0]) / (2 * np.pi**2)
    return sigma**2 / variance_per_amplitude


def gaussian_smooth(field, sigma_cells, k2=None):
    """Periodic Gaussian smoothing with a standard deviation of ``sigma_cells``, via the FFT."""
    side = field.shape[0]
    if k2 is None:
        k2 = k_squared(side)
    modes = fft3(field)
    modes *= np.exp(np.float32(-0.5 * sigma_cells**2) * k2)
    return ifft3(modes, side)


# -----------------------------------------------------------------------------
# The toy universe

def linear_density_modes(side, rng, k2, physics):
    """Fourier modes (rfftn layout) of the linear density contrast.

    White noise of unit variance has <|W_k|^2> = L^3 in NumPy's unnormalised FFT convention, so
    multiplying by sqrt(P(k)) gives a field whose variance is the sum of P over the box's modes
    divided by L^3, which approximates the infinite-volume integral spectrum_amplitude matches.
    """
    noise = rng.standard_normal((side, side, side), dtype=np.float32)
    modes = fft3(noise)
    del noise
    amplitude = spectrum_amplitude(
        physics["sigma"], physics["spectral_index"], physics["cutoff_cells"], physics["turnover_cells"]
    )
    shape = spectrum_shape(k2, physics["spectral_index"], physics["cutoff_cells"], physics["turnover_cells"])
    modes *= np.sqrt(amplitude * shape).astype(np.float32)
    return modes


def zeldovich_displacement(delta_modes, side, k2):
    """Displacement psi = -grad(phi), laplacian(phi) = delta, in cells: (3, L, L, L) float32.

    psi_k = i k delta_k / k^2. The Nyquist wavenumber of each derivative is dropped: its
    derivative is not representable as a real field (the cut-off leaves no power there anyway).
    """
    safe_k2 = np.where(k2 > 0, k2, np.float32(1.0))
    potential = delta_modes / safe_k2  # -phi_k; the k = 0 mode of delta is already zero
    psi = np.empty((3, side, side, side), dtype=np.float32)
    for axis, k in enumerate(wavenumbers(side)):
        k = np.where(np.abs(k) >= np.float32(np.pi) - 1e-6, np.float32(0.0), k)
        psi[axis] = ifft3(1j * k * potential, side)
    return psi


def deposit_particles(psi, velocity, empty_mass=0.05):
    """Cloud-in-cell deposit of one particle per cell displaced by ``psi``.

    Returns the density in units of the mean (L^3 particles of unit mass on L^3 cells, so the
    mean is exactly 1) and the mass-weighted velocity (3, L, L, L). ``velocity`` holds each
    particle's velocity at its Lagrangian cell, which in the Zel'dovich approximation is also
    the linear velocity field there; it is blended in with weight ``empty_mass`` so that cells
    where (almost) no mass landed get that sensible value instead of 0/0, while well-populated
    cells keep their deposited velocity.

    np.bincount with weights does the scatter-add (np.add.at is far slower). Particles go in
    slabs of about 256 k particles, all eight CIC corners in one bincount, so temporaries stay
    small whatever the box side. Along D a slab's particles only reach the planes around
    it, so each bincount fills just that block of planes, which is then wrapped into the box:
    allocating and adding a full-box output per call would cost more than the counting.
    """
    side = psi.shape[1]
    mass = np.zeros((side, side, side), dtype=np.float32)
    momentum = np.zeros((3, side, side, side), dtype=np.float32)
    planes = max(1, (1 << 18) // (side * side))  # about 256 k particles per slab
    grid = np.arange(side, dtype=np.float32)
    for start in range(0, side, planes):
        stop = min(side, start + planes)
        count = (stop - start) * side * side
        # Lagrangian grid points (cell centres at integer coordinates) of this slab, per axis.
        origin = (grid[start:stop, None, None], grid[None, :, None], grid[None, None, :])
        lower, weights = [], []  # per axis: the two neighbouring cells and their CIC weights
        for axis in range(3):
            position = (origin[axis] + psi[axis, start:stop]).ravel()
            floor = np.floor(position)
            fraction = position - floor
            cell = floor.astype(np.int64)
            if axis == 0:
                first_plane = int(cell.min())  # D is counted from here, unwrapped
                cell -= first_plane
                lower.append((cell, cell + 1))
            else:
                cell %= side
                lower.append((cell, (cell + 1) % side))
            weights.append((1 - fraction, fraction))
        block_size = (int(lower[0][1].max()) + 1) * side * side
        index = np.empty((8, count), dtype=np.int64)
        weight = np.empty((8, count), dtype=np.float32)
        for corner, (a, b, c) in enumerate(itertools.product((0, 1), repeat=3)):
            index[corner] = (lower[0][a] * side + lower[1][b]) * side + lower[2][c]
            weight[corner] = weights[0][a] * weights[1][b] * weights[2][c]
        del lower, weights
        index = index.ravel()
        add_planes(mass, np.bincount(index, weight.ravel(), minlength=block_size), first_plane)
        for axis in range(3):
            particle_velocity = velocity[axis, start:stop].ravel()
            block = np.bincount(index, (weight * particle_velocity).ravel(), minlength=block_size)
            add_planes(momentum[axis], block, first_plane)
        del index, weight
    mean_velocity = (momentum + empty_mass * velocity) / (mass + empty_mass)
    return mass, mean_velocity


def add_planes(box, block, first_plane):
    """Add consecutive D-planes, the first at ``first_plane`` (any integer), into a periodic box."""
    side = box.shape[0]
    for offset, plane in enumerate(block.reshape(-1, side, side)):
        box[(first_plane + offset) % side] += plane


def encode_log_density(rho):
    """ln(rho / mean) / 14, clipped; the physical density is exp(14 x) times the mean."""
    x = np.log(np.maximum(rho, np.float32(DENSITY_FLOOR))) / np.float32(DENSITY_LOG_SCALE)
    return np.clip(x, -LIMIT, LIMIT).astype(np.float32)


def encode_temperature(log10_t):
    """(log10 T - centre) / scale, clipped."""
    x = (log10_t - np.float32(TEMPERATURE_CENTRE)) / np.float32(TEMPERATURE_SCALE)
    return np.clip(x, -LIMIT, LIMIT).astype(np.float32)


def encode_velocity(v):
    """v / VELOCITY_SCALE, clipped (linear, so exactly invertible inside the range)."""
    return np.clip(v / np.float32(VELOCITY_SCALE), -LIMIT, LIMIT).astype(np.float32)


def check_physics(physics):
    """Complete ``physics`` with the defaults and refuse values that make no sense."""
    unknown = sorted(set(physics) - set(PHYSICS_DEFAULTS))
    if unknown:
        raise TypeError(f"unknown physics parameter(s) {unknown}; known: {sorted(PHYSICS_DEFAULTS)}")
    physics = {**PHYSICS_DEFAULTS, **physics}
    problems = [f"{name} must be a finite number, got {value}" for name, value in physics.items()
                if not math.isfinite(value)]
    if not -3.0 < physics["spectral_index"] <= 1.0:
        problems.append(
            f"spectral_index {physics['spectral_index']} must be in (-3, 1]: at -3 and below the "
            "large-scale displacements diverge, above 1 grid-scale noise dominates"
        )
    positive = ("sigma", "cutoff_cells", "turnover_cells", "growth_rate", "t0", "scatter_cells")
    for name in positive:
        if not physics[name] > 0:
            problems.append(f"{name} must be positive, got {physics[name]}")
    for name in ("jeans_cells", "scatter_dex"):
        if not physics[name] >= 0:
            problems.append(f"{name} must be zero or positive, got {physics[name]}")
    if not 0.5 <= physics["gamma"] <= 3.0:
        problems.append(f"gamma {physics['gamma']} is outside the plausible range [0.5, 3]")
    if problems:
        raise UserError("; ".join(problems) + ". Change the value(s) or leave them at the defaults.")
    return {name: float(value) for name, value in physics.items()}


def check_side(side, what="box side"):
    """The box must have an even side (the rfft Nyquist plane and 2x pooling) of at least 8."""
    if isinstance(side, bool) or not isinstance(side, (int, np.integer)) or side < 8 or side % 2:
        raise UserError(
            f"the {what} must be an even integer of at least 8, got {side!r}; pick e.g. 64 or 128."
        )


def generate_box(side, seed, *, progress=None, **physics):
    """Generate one periodic box: returns (nbody (4, L, L, L), hydro (5, L, L, L)), both float32.

    ``physics`` overrides entries of PHYSICS_DEFAULTS. ``progress``, if given, is called with the
    name of each finished stage (see STAGES), so a caller can drive a progress bar.
    """
    check_side(side)
    physics = check_physics(physics)
    report = progress or (lambda stage: None)
    rng = np.random.default_rng(seed)
    k2 = k_squared(side)

    delta_modes = linear_density_modes(side, rng, k2, physics)
    report(STAGES[0])

    psi = zeldovich_displacement(delta_modes, side, k2)
    del delta_modes
    report(STAGES[1])

    # In the Zel'dovich approximation a particle's velocity is f H times its displacement.
    velocity = psi * np.float32(physics["growth_rate"])
    rho_dm, v_dm = deposit_particles(psi, velocity)
    del psi, velocity
    report(STAGES[2])

    nbody = np.empty((4, side, side, side), dtype=np.float32)
    nbody[0] = encode_log_density(rho_dm)
    for axis in range(3):
        nbody[1 + axis] = encode_velocity(v_dm[axis])
    report(STAGES[3])

    hydro = np.empty((5, side, side, side), dtype=np.float32)
    rho_gas = gaussian_smooth(rho_dm, physics["jeans_cells"], k2)
    del rho_dm
    hydro[0] = encode_log_density(rho_gas)
    report(STAGES[4])

    # A smooth unit-variance random field for the scatter: nearby cells share their deviation
    # from the temperature-density relation, as gas that was heated together does.
    white = rng.standard_normal((side, side, side), dtype=np.float32)
    scatter = gaussian_smooth(white, physics["scatter_cells"], k2)
    del white
    scatter /= max(float(scatter.std()), 1e-30)
    log10_t = (
        np.float32(math.log10(physics["t0"]))
        + np.float32(physics["gamma"] - 1) * np.log10(np.maximum(rho_gas, np.float32(DENSITY_FLOOR)))
        + np.float32(physics["scatter_dex"]) * scatter
    )
    del scatter, rho_gas
    hydro[1] = encode_temperature(log10_t)
    del log10_t
    report(STAGES[5])

    for axis in range(3):
        hydro[2 + axis] = encode_velocity(gaussian_smooth(v_dm[axis], physics["jeans_cells"], k2))
    report(STAGES[6])
    return nbody, hydro


# -----------------------------------------------------------------------------
# Writing

def write_h5(path, nbody, hydro, attrs=None):
    """Write datasets ``Nbody`` and ``Hydro`` (contiguous float32) and file attributes, atomically.

    The file is written under a temporary name in the same directory and renamed into place, so
    an interrupted run never leaves a half-written file under the final name.
    """
    with atomic_path(path) as temporary, h5py.File(temporary, "w") as f:
        f.create_dataset("Nbody", data=np.ascontiguousarray(nbody, dtype=np.float32))
        f.create_dataset("Hydro", data=np.ascontiguousarray(hydro, dtype=np.float32))
        for key, value in (attrs or {}).items():
            f.attrs[key] = value


def clipped_fraction(array):
    """Per channel, the fraction of voxels at the clip limit (provenance, and a warning sign)."""
    return np.array([float(np.mean(np.abs(channel) >= np.float32(LIMIT))) for channel in array])


def file_attributes(split, side, seed, physics, nbody, hydro):
    """Small provenance attributes stored on each HDF5 file."""
    return {
        "generator": GENERATOR_NAME,
        "generator_version": GENERATOR_VERSION,
        "split": split,
        "seed": seed,
        "box_side": side,
        **{f"physics_{name}": value for name, value in physics.items()},
        "nbody_channels": "dm log-density, dm velocity along D, H, W",
        "hydro_channels": "gas log-density, gas temperature, gas velocity along D, H, W",
        "density_transform": f"ln(rho / mean) / {DENSITY_LOG_SCALE:g}",
        "temperature_transform": f"(log10(T / K) - {TEMPERATURE_CENTRE:g}) / {TEMPERATURE_SCALE:g}",
        "velocity_transform": f"v / {VELOCITY_SCALE:g}, v in units of H times the cell size",
        "clip_limit": LIMIT,
        "nbody_clipped_fraction": clipped_fraction(nbody),
        "hydro_clipped_fraction": clipped_fraction(hydro),
    }


# -----------------------------------------------------------------------------
# Command line

def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m utils.generate_data",
        description="Write a synthetic train and validation set with the layout of the real data "
        "(Nbody (4, L, L, L), Hydro (5, L, L, L), float32, values in (-1, 1)).",
    )
    parser.add_argument("--out_dir", default="data", help="output directory (default: data)")
    parser.add_argument("--train_size", type=int, default=128,
                        help="box side of the train file, even, >= 8 (default: 128)")
    parser.add_argument("--val_size", type=int, default=64,
                        help="box side of the validation file, even, >= 8 (default: 64)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the data set (train and validation draw independent streams)")
    parser.add_argument("--force", action="store_true", help="overwrite existing output files")
    parser.add_argument("--no_npy", action="store_true", help="skip the channel-last .npy copies")
    physics = parser.add_argument_group("physics (see the module docstring)")
    for name, default in PHYSICS_DEFAULTS.items():
        physics.add_argument(f"--{name}", type=float, default=default,
                             help=f"{PHYSICS_HELP[name]} (default: {default:g})")
    args = parser.parse_args(argv)
    args.physics = {name: getattr(args, name) for name in PHYSICS_DEFAULTS}
    return args


def planned_outputs(out_dir, write_npy):
    """Every file a run would write, so all can be checked before anything is written."""
    paths = []
    for name in OUTPUT_NAMES.values():
        h5_path = os.path.join(out_dir, name)
        paths.append(h5_path)
        if write_npy:
            paths.extend(npy_output_paths(h5_path))
    return paths


def check_memory(sides):
    """Refuse a box that cannot fit in this machine's memory, instead of dying an hour later."""
    needed = BYTES_PER_VOXEL * max(sides) ** 3
    try:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return  # not a POSIX system that can tell; just try
    if needed > available:
        raise UserError(
            f"a {max(sides)}^3 box needs about {needed / 2**30:.0f} GiB of memory, but this machine has "
            f"{available / 2**30:.0f} GiB; choose smaller --train_size / --val_size."
        )


def advance(bar, label, stage):
    """Progress callback for generate_box: one tick of the bar per finished stage."""
    bar.set_postfix_str(f"{label}: {stage}", refresh=False)
    bar.update(1)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    check_side(args.train_size, "train size (--train_size)")
    check_side(args.val_size, "validation size (--val_size)")
    if args.seed < 0:
        raise UserError(f"--seed must be zero or positive, got {args.seed}.")
    physics = check_physics(args.physics)
    check_memory((args.train_size, args.val_size))

    # Check every output before writing any, so a refused run leaves everything as it was.
    planned = planned_outputs(args.out_dir, not args.no_npy)
    existing = [path for path in planned if os.path.exists(path)]
    if existing == planned and not args.force and holds_this_data_set(args, physics):
        print(f"{args.out_dir} already holds this data set (the same sizes, seed and physics): nothing to do.")
        return
    if existing and not args.force:
        raise UserError(
            f"refusing to overwrite {', '.join(existing)}. Pass --force to overwrite, "
            "or choose another --out_dir."
        )
    stale_npy = [path for path in planned_outputs(args.out_dir, True)
                 if path.endswith(".npy") and os.path.exists(path)]
    make_writable_dir(args.out_dir, "--out_dir")

    splits = (("train", args.train_size, 0), ("valid", args.val_size, 1))
    steps_per_split = len(STAGES) + 1 + (0 if args.no_npy else 1)
    with tqdm(total=len(splits) * steps_per_split, desc="generating", file=sys.stderr, unit="stage") as bar:
        for split, side, stream in splits:
            progress = functools.partial(advance, bar, f"{split} {side}^3")
            nbody, hydro = generate_box(side, [args.seed, stream], progress=progress, **physics)
            path = os.path.join(args.out_dir, OUTPUT_NAMES[split])
            attrs = file_attributes(split, side, args.seed, physics, nbody, hydro)
            write_h5(path, nbody, hydro, attrs)
            del nbody, hydro  # free this box before the next one is generated
            progress("written")
            if not args.no_npy:
                convert(path, force=args.force)
                progress("npy copies")
            warn_if_clipping(path, attrs)

    if args.no_npy and stale_npy:
        print(f"note: left {', '.join(stale_npy)} untouched; they were made from the previous files "
              "and no longer match them.", file=sys.stderr)
    for name in OUTPUT_NAMES.values():
        print(os.path.join(args.out_dir, name))


def holds_this_data_set(args, physics):
    """Whether the HDF5 files in ``args.out_dir`` are what this command would write: the same
    generator version, sizes, seed and physics (the generator is deterministic for them)."""
    for split, side in (("train", args.train_size), ("valid", args.val_size)):
        expected = {"generator_version": GENERATOR_VERSION, "split": split, "seed": args.seed, "box_side": side,
                    **{f"physics_{name}": value for name, value in physics.items()}}
        try:
            with h5py.File(os.path.join(args.out_dir, OUTPUT_NAMES[split]), "r") as f:
                if any(key not in f.attrs or f.attrs[key] != value for key, value in expected.items()):
                    return False
        except OSError:  # not HDF5, or truncated
            return False
    return True


def warn_if_clipping(path, attrs):
    """Non-default physics can push many values to the clip limit; say so instead of hiding it."""
    for dataset in ("nbody", "hydro"):
        fractions = attrs[f"{dataset}_clipped_fraction"]
        for channel, fraction in enumerate(fractions):
            if fraction > 0.01:
                print(
                    f"warning: {path}: {100 * fraction:.1f}% of {dataset.capitalize()}[{channel}] is clipped "
                    f"at +-{LIMIT}; the physics settings stretch this channel beyond its transform.",
                    file=sys.stderr,
                )


if __name__ == "__main__":
    main()
