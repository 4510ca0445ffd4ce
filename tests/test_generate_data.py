"""Tests of the synthetic data generator and the HDF5 -> channel-last .npy converter.

The generator stands in for the real data set, so besides the layout these tests check that its
fields are the physics it claims (periodic, mass-conserving, Zel'dovich velocities along the
right axes, a gas smoother than the dark matter, a tight temperature-density relation) and
learnable from the inputs; each check is one that a plausible bug would fail.
"""
import itertools
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import snapshot, timeout_for
from utils import convert_h5_to_npy, generate_data
from utils.generate_data import gaussian_smooth, generate_box

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H5_NAMES = ("synthetic_train.h5", "synthetic_valid.h5")


def run_main(main, argv):
    """Call a CLI's main(argv); return its exit code (0 when it returns normally)."""
    try:
        main(argv)
    except SystemExit as exit_:
        return exit_.code
    return 0




def squeezed(text):
    """Text without whitespace: error paragraphs are wrapped, possibly inside a path (at a hyphen)."""
    return "".join(text.split())


def correlation(a, b):
    return float(np.corrcoef(np.ravel(a), np.ravel(b))[0, 1])


def divergence(velocity, axes=(1, 2, 3)):
    """Central-difference divergence of a (3, L, L, L) field whose component k lies along ``axes[k]``
    of the (C, D, H, W) layout (so along axis ``axes[k] - 1`` of one channel)."""
    return sum(
        (np.roll(velocity[k], -1, axis=axes[k] - 1) - np.roll(velocity[k], 1, axis=axes[k] - 1)) / 2
        for k in range(3)
    )


@pytest.fixture(scope="module")
def box():
    """One 32^3 box with the default physics, shared by the physics checks."""
    return generate_box(32, 0)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """A CLI run: train 32^3 and validation 16^3 from seed 5, with the .npy copies."""
    out_dir = str(tmp_path_factory.mktemp("generated"))
    assert run_main(generate_data.main, ["--out_dir", out_dir, "--train_size", "32", "--val_size", "16",
                                         "--seed", "5"]) == 0
    return out_dir


# -----------------------------------------------------------------------------
# Layout

def test_files_have_the_real_layout(generated):
    arrays = {}
    for name, side in zip(H5_NAMES, (32, 16)):
        with h5py.File(os.path.join(generated, name), "r") as f:
            assert set(f.keys()) == {"Nbody", "Hydro"}
            assert f["Nbody"].shape == (4, side, side, side)
            assert f["Hydro"].shape == (5, side, side, side)
            for key in ("Nbody", "Hydro"):
                data = f[key][...]
                assert data.dtype == np.float32
                assert np.all(np.isfinite(data))
                assert np.abs(data).max() < 1, f"{name}/{key} reaches +-1, out of reach of a tanh output"
            assert f.attrs["generator"] == "utils.generate_data"
            assert f.attrs["box_side"] == side
            arrays[name] = f["Hydro"][0]
    # Validation is a different universe, not a crop of the train box.
    train, valid = arrays.values()
    assert not np.array_equal(train[:16, :16, :16], valid)


def test_seeds_and_split_are_recorded(generated):
    with h5py.File(os.path.join(generated, "synthetic_train.h5"), "r") as f:
        assert f.attrs["seed"] == 5 and f.attrs["split"] == "train"
    with h5py.File(os.path.join(generated, "synthetic_valid.h5"), "r") as f:
        assert f.attrs["seed"] == 5 and f.attrs["split"] == "valid"


def test_same_seed_same_box_other_seed_other_box():
    nbody, hydro = generate_box(16, 3)
    nbody_again, hydro_again = generate_box(16, 3)
    nbody_other, hydro_other = generate_box(16, 4)
    assert np.array_equal(nbody, nbody_again) and np.array_equal(hydro, hydro_again)
    for channel in range(4):
        assert not np.allclose(nbody[channel], nbody_other[channel])
    for channel in range(5):
        assert not np.allclose(hydro[channel], hydro_other[channel])


def test_values_use_a_good_part_of_the_range_and_rarely_clip(box):
    nbody, hydro = box
    for name, channels in (("Nbody", nbody), ("Hydro", hydro)):
        for channel, data in enumerate(channels):
            clipped = np.mean(np.abs(data) >= generate_data.LIMIT)
            # Density: the few cells no particle reached sit at the floor by design.
            assert clipped < 0.01, f"{name}[{channel}] clips {clipped:.2%} of its voxels"
            assert data.std() > 0.03, f"{name}[{channel}] is nearly constant"


# -----------------------------------------------------------------------------
# Physics

def test_fields_are_periodic(box):
    """Across the box boundary neighbours differ no more than inside; a crop of a periodic box
    (not periodic itself) gives ratios above 15, so the check can fail."""
    gas = box[1][0]
    for axis in range(3):
        inside = np.mean(np.diff(gas, axis=axis) ** 2)
        across = np.mean((np.take(gas, 0, axis) - np.take(gas, -1, axis)) ** 2)
        assert across / inside < 3, f"axis {axis}: boundary jump {across / inside:.1f} x the inner steps"


def test_mass_is_conserved(box):
    """The mean of exp(14 x) is the mean density, 1. Cloud-in-cell and Gaussian smoothing keep it
    exactly; only float32 rounding of x (relative error ~1e-7 in x, ~1e-6 in exp(14 x)) and the
    floor of empty cells (8e-7 each) add to it, so 1e-3 is a generous tolerance."""
    nbody, hydro = box
    for name, x in (("dark matter", nbody[0]), ("gas", hydro[0])):
        mean = np.exp(14 * x.astype(np.float64)).mean()
        assert abs(mean - 1) < 1e-3, f"{name}: mean density {mean}"


def test_gas_is_smoother_than_dark_matter(box):
    """Pressure smoothing: voxel-to-neighbour steps, relative to the field's spread, shrink."""
    nbody, hydro = box

    def roughness(x):
        return np.mean([np.mean(np.diff(x, axis=axis) ** 2) for axis in range(3)]) / x.var()

    assert roughness(hydro[0]) < 0.3 * roughness(nbody[0])


def test_temperature_follows_the_gas_density(box):
    """T = T0 rho^(gamma - 1) with a small scatter: both channels are logs, so Pearson in log space."""
    hydro = box[1]
    assert correlation(hydro[0], hydro[1]) > 0.8


def test_temperature_slope_is_gamma_minus_one(box):
    """The fitted slope of log10 T on log10 rho is gamma - 1 (the scatter is independent of rho)."""
    hydro = box[1]
    log10_rho = hydro[0] * generate_data.DENSITY_LOG_SCALE / np.log(10)
    log10_t = hydro[1] * generate_data.TEMPERATURE_SCALE + generate_data.TEMPERATURE_CENTRE
    slope = np.polyfit(log10_rho.ravel(), log10_t.ravel(), 1)[0]
    assert slope == pytest.approx(generate_data.PHYSICS_DEFAULTS["gamma"] - 1, abs=0.1)


def test_gas_velocity_follows_dark_matter_velocity(box):
    nbody, hydro = box
    for k in range(3):
        assert correlation(hydro[2 + k], nbody[1 + k]) > 0.9, f"velocity component {k}"


def test_velocity_converges_where_matter_collects(box):
    """Zel'dovich: delta = -div(psi) and v ~ psi, so div(v) anticorrelates with the density.

    Only with component k taken along array axis k + 1: every other assignment of components to
    axes correlates clearly less, so this also pins down the channel convention.
    """
    nbody, hydro = box
    dm_density = gaussian_smooth(nbody[0], 1.5)  # CIC noise blurs the point-wise relation
    right = correlation(divergence(nbody[1:]), dm_density)
    assert right < -0.6
    assert correlation(divergence(hydro[2:]), hydro[0]) < -0.9
    for axes in itertools.permutations((1, 2, 3)):
        if axes != (1, 2, 3):
            wrong = correlation(divergence(nbody[1:], axes), dm_density)
            assert wrong > right + 0.2, f"components along axes {axes} fit as well as (1, 2, 3)"


def test_hydro_is_predictable_from_nbody(box):
    """Not noise: a linear fit of the gas log-density on the smoothed dark-matter log-density
    explains most of its variance (and the velocities much more)."""
    nbody, hydro = box

    def r_squared(target, feature):
        design = np.column_stack([np.ones(target.size), feature.ravel()])
        coefficients = np.linalg.lstsq(design, target.ravel(), rcond=None)[0]
        return 1 - np.var(target.ravel() - design @ coefficients) / np.var(target)

    assert r_squared(hydro[0], gaussian_smooth(nbody[0], 1.5)) > 0.7
    for k in range(3):
        assert r_squared(hydro[2 + k], gaussian_smooth(nbody[1 + k], 1.5)) > 0.9


def test_unknown_or_impossible_physics_is_refused():
    with pytest.raises(TypeError, match="jeans"):
        generate_box(16, 0, jeans=2.0)
    with pytest.raises(generate_data.UserError, match="spectral_index"):
        generate_box(16, 0, spectral_index=-3.5)


# -----------------------------------------------------------------------------
# Generator command line

def test_cli_writes_both_files_and_npy_copies(generated):
    # The original tutorial's names, beside each HDF5 file; no temporary files are left behind.
    copies = [name.replace(".h5", suffix) for name in H5_NAMES for suffix in ("_data.npy", "_label.npy")]
    assert sorted(os.listdir(generated)) == sorted([*H5_NAMES, *copies])


def test_cli_refuses_to_overwrite_without_force(tmp_path, capsys):
    argv = ["--out_dir", str(tmp_path), "--train_size", "16", "--val_size", "8"]
    assert run_main(generate_data.main, argv) == 0
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert run_main(generate_data.main, argv + ["--seed", "7"]) == 2
    error = squeezed(capsys.readouterr().err)
    assert "refusingtooverwrite" in error and "--force" in error
    assert snapshot(tmp_path) == before

    # A single existing output is enough to refuse, and then nothing else is written either.
    os.remove(os.path.join(tmp_path, "synthetic_valid.h5"))
    before = snapshot(tmp_path)
    assert run_main(generate_data.main, argv) == 2
    assert snapshot(tmp_path) == before


def test_the_same_command_again_finds_its_data_set_and_writes_nothing(tmp_path):
    """`make data`, then the README's `python -m utils.generate_data --out_dir data`: the second finds
    the files the first made (same sizes, seed and physics) and exits 0 without touching them."""
    command = [sys.executable, "-m", "utils.generate_data", "--out_dir", str(tmp_path), "--train_size", "16",
               "--val_size", "8"]
    subprocess.run(command, check=True, capture_output=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    before = snapshot(tmp_path)
    again = subprocess.run(command, capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert again.returncode == 0 and "already holds this data set" in again.stdout, again.stderr
    assert snapshot(tmp_path) == before
    bigger = subprocess.run(command[:-1] + ["16"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.dirname(__file__)))
    assert bigger.returncode == 2 and "refusing to overwrite" in bigger.stderr  # another data set: refused
    assert snapshot(tmp_path) == before


def test_cli_overwrites_with_force(tmp_path):
    argv = ["--out_dir", str(tmp_path), "--train_size", "16", "--val_size", "8"]
    assert run_main(generate_data.main, argv) == 0
    with h5py.File(tmp_path / "synthetic_train.h5", "r") as f:
        old = f["Hydro"][...]
    assert run_main(generate_data.main, argv + ["--seed", "7", "--force"]) == 0
    with h5py.File(tmp_path / "synthetic_train.h5", "r") as f:
        assert f.attrs["seed"] == 7
        new = f["Hydro"][...]
    assert not np.array_equal(old, new)
    # The .npy copies were refreshed too.
    assert np.array_equal(np.load(tmp_path / "synthetic_train_label.npy"), np.moveaxis(new, 0, -1))


@pytest.mark.parametrize("option, value", [("--train_size", "33"), ("--val_size", "6"),
                                           ("--train_size", "0")])
def test_cli_refuses_odd_or_small_sizes(tmp_path, capsys, option, value):
    out_dir = tmp_path / "out"
    assert run_main(generate_data.main, ["--out_dir", str(out_dir), option, value]) == 2
    error = squeezed(capsys.readouterr().err)
    assert "evenintegerofatleast8" in error and f"got{value}" in error
    assert not out_dir.exists()


def test_cli_refuses_a_box_larger_than_memory(tmp_path, capsys):
    assert run_main(generate_data.main, ["--out_dir", str(tmp_path / "out"), "--train_size", "100000"]) == 2
    assert "GiBofmemory" in squeezed(capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_cli_no_npy_writes_no_copies(tmp_path):
    assert run_main(generate_data.main, ["--out_dir", str(tmp_path), "--train_size", "16", "--val_size", "8",
                                         "--no_npy"]) == 0
    assert sorted(os.listdir(tmp_path)) == sorted(H5_NAMES)


def test_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    """write_h5 renames a finished temporary file into place; if that fails, nothing is left."""
    nbody, hydro = generate_box(8, 0)

    def fail(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(generate_data.os, "replace", fail)
    with pytest.raises(KeyboardInterrupt):
        generate_data.write_h5(str(tmp_path / "out.h5"), nbody, hydro, {"seed": 0})
    assert os.listdir(tmp_path) == []


def test_module_entry_point_runs(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "utils.generate_data", "--out_dir", str(tmp_path), "--train_size", "16",
         "--val_size", "8", "--no_npy"],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(120),
    )
    assert result.returncode == 0, result.stderr
    for name in H5_NAMES:
        assert os.path.join(str(tmp_path), name) in result.stdout
        with h5py.File(tmp_path / name, "r") as f:
            assert f["Nbody"].shape[0] == 4
    # A refused second run exits with status 2 and one "error:" paragraph, not a traceback.
    again = subprocess.run(
        [sys.executable, "-m", "utils.generate_data", "--out_dir", str(tmp_path), "--no_npy"],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(120),
    )
    assert again.returncode == 2
    assert again.stderr.startswith("error:") and "Traceback" not in again.stderr


# -----------------------------------------------------------------------------
# Converter

@pytest.fixture
def small_h5(tmp_path):
    """A 12^3 file in the real layout, with values that differ in every voxel and channel."""
    path = str(tmp_path / "box.h5")
    rng = np.random.default_rng(0)
    nbody = rng.uniform(-1, 1, (4, 12, 12, 12)).astype(np.float32)
    hydro = rng.uniform(-1, 1, (5, 12, 12, 12)).astype(np.float32)
    generate_data.write_h5(path, nbody, hydro, {})
    return path


def test_converter_round_trip(small_h5, monkeypatch):
    # A tiny slab forces several slabs, so their seams are tested too.
    monkeypatch.setattr(convert_h5_to_npy, "SLAB_BYTES", 5 * 12 * 12 * 4 * 5)
    assert run_main(convert_h5_to_npy.main, ["-i", small_h5, "-d", "Nbody", "-l", "Hydro"]) == 0
    out_dir = os.path.dirname(small_h5)
    assert sorted(os.listdir(out_dir)) == ["box.h5", "box_data.npy", "box_label.npy"]  # the original's names
    with h5py.File(small_h5, "r") as f:
        for name, key in (("box_data.npy", "Nbody"), ("box_label.npy", "Hydro")):
            loaded = np.load(os.path.join(out_dir, name))
            assert loaded.dtype == np.float32 and loaded.flags.c_contiguous
            assert np.array_equal(loaded, np.moveaxis(f[key][...], 0, -1))


def test_converter_out_dir_and_return_value(small_h5, tmp_path):
    out_dir = str(tmp_path / "elsewhere")
    data_path, label_path = convert_h5_to_npy.convert(small_h5, out_dir=out_dir)
    assert (data_path, label_path) == (os.path.join(out_dir, "box_data.npy"), os.path.join(out_dir, "box_label.npy"))
    assert np.load(label_path).shape == (12, 12, 12, 5)


def test_converter_matches_generator_output(generated):
    """The copies the generator wrote are the converter's channel-last view of its HDF5 file."""
    with h5py.File(os.path.join(generated, "synthetic_valid.h5"), "r") as f:
        nbody = f["Nbody"][...]
    data = np.load(os.path.join(generated, "synthetic_valid_data.npy"))
    assert np.array_equal(data, np.moveaxis(nbody, 0, -1))


def test_converter_refuses_a_missing_file(tmp_path, capsys):
    missing = str(tmp_path / "nowhere.h5")
    assert run_main(convert_h5_to_npy.main, ["-i", missing]) == 2
    assert squeezed(missing) in squeezed(capsys.readouterr().err)


def test_converter_refuses_a_file_that_is_not_hdf5(tmp_path, capsys):
    path = tmp_path / "notes.h5"
    path.write_text("not an HDF5 file\n")
    assert run_main(convert_h5_to_npy.main, ["-i", str(path)]) == 2
    assert squeezed(str(path)) in squeezed(capsys.readouterr().err)
    assert sorted(os.listdir(tmp_path)) == ["notes.h5"]


def test_converter_refuses_a_missing_dataset(small_h5, capsys):
    assert run_main(convert_h5_to_npy.main, ["-i", small_h5, "-l", "Gas"]) == 2
    error = squeezed(capsys.readouterr().err)
    assert "'Gas'" in error and "Nbody" in error and "Hydro" in error
    assert os.listdir(os.path.dirname(small_h5)) == ["box.h5"]


def test_converter_refuses_a_dataset_that_is_not_4d(tmp_path, capsys):
    path = str(tmp_path / "flat.h5")
    with h5py.File(path, "w") as f:
        f["Nbody"] = np.zeros((4, 8, 8), dtype=np.float32)
        f["Hydro"] = np.zeros((5, 8, 8, 8), dtype=np.float32)
    assert run_main(convert_h5_to_npy.main, ["-i", path]) == 2
    assert "(4,8,8)" in squeezed(capsys.readouterr().err)


def test_converter_refuses_to_overwrite_without_force(small_h5, capsys):
    assert run_main(convert_h5_to_npy.main, ["-i", small_h5]) == 0
    out_dir = os.path.dirname(small_h5)
    before = snapshot(out_dir)
    capsys.readouterr()
    assert run_main(convert_h5_to_npy.main, ["-i", small_h5]) == 2
    assert "--force" in squeezed(capsys.readouterr().err)
    assert snapshot(out_dir) == before
    assert run_main(convert_h5_to_npy.main, ["-i", small_h5, "--force"]) == 0
    assert sorted(os.listdir(out_dir)) == ["box.h5", "box_data.npy", "box_label.npy"]
