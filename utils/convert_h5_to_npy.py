"""Convert one HDF5 file of the data set into channel-last .npy files for a DALI numpy loader.

Why: DALI's numpy reader reads .npy files (memory-mapped, with cheap region-of-interest crops)
but not HDF5, and it expects the channels last. For ``path/name.h5`` this writes, as the original
tutorial's converter does, ``path/name_data.npy`` (from dataset ``-d``, default ``Nbody``) and
``path/name_label.npy`` (from dataset ``-l``, default ``Hydro``) next to the input (``-o DIR``
puts the same names in DIR), each transposed from (C, D, H, W) to (D, H, W, C), float32,
C-contiguous, in the ordinary .npy format. The DALI loader finds them there by itself, or through
the original's config keys ``train_path_npy_data``, ``train_path_npy_label``, ``val_path_npy_data``
and ``val_path_npy_label``.

A full-size box is several GB, so the array is never held twice: the output is a memory-mapped
.npy filled slab by slab along D straight from the HDF5 dataset. Each file is written under a
temporary name and renamed into place, so an interrupted run leaves no half-written file, and
existing outputs are only replaced with ``--force``.

Usage:
    python -m utils.convert_h5_to_npy -i data/synthetic_train.h5 -d Nbody -l Hydro [-o OUT_DIR] [--force]
"""
import argparse
import os

import h5py
import numpy as np

from utils.errors import UserError, exit_on_user_error
from utils.files import atomic_path

SLAB_BYTES = 64 * 2**20  # read and write about this much at a time


def output_paths(h5_path, out_dir=None):
    """The (data, label) .npy paths that convert writes for ``h5_path``: ``name_data.npy`` and
    ``name_label.npy`` beside it, or in ``out_dir``."""
    stem = os.path.splitext(h5_path)[0]
    if out_dir is not None:
        stem = os.path.join(out_dir, os.path.basename(stem))
    return f"{stem}_data.npy", f"{stem}_label.npy"


def open_h5(h5_path):
    """Open an HDF5 file for reading, or explain why it cannot be."""
    if not os.path.exists(h5_path):
        raise UserError(f"input file {h5_path} does not exist; check the path given with -i.")
    if os.path.isdir(h5_path):
        raise UserError(f"input {h5_path} is a directory; -i needs an HDF5 file.")
    try:
        return h5py.File(h5_path, "r")
    except OSError as error:
        raise UserError(
            f"cannot read {h5_path} as an HDF5 file ({error}); is it an HDF5 file, complete and readable?"
        ) from None


def dataset_names(h5_file):
    """Names of every dataset in the file, groups included, for error messages."""
    names = []
    h5_file.visititems(lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None)
    return names


def checked_dataset(h5_file, key, h5_path, flag):
    """The 4-D numeric dataset ``key``, or a UserError that says what the file holds instead."""
    item = h5_file.get(key)
    if not isinstance(item, h5py.Dataset):
        present = ", ".join(dataset_names(h5_file)) or "no datasets at all"
        raise UserError(
            f"{h5_path} has no dataset {key!r}; it holds: {present}. Pick one with {flag}."
        )
    if item.ndim != 4:
        raise UserError(
            f"dataset {key!r} in {h5_path} has shape {item.shape}, but a 4-D channel-first "
            "(C, D, H, W) array is needed."
        )
    if not np.issubdtype(item.dtype, np.number):
        raise UserError(f"dataset {key!r} in {h5_path} has non-numeric type {item.dtype}.")
    return item


def make_writable_dir(path, what):
    """Create directory ``path`` if needed; refuse clearly if it cannot be created or written to."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"{what} {path} exists and is not a directory; pick another path.")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise UserError(f"cannot create {what} {path} ({error.strerror}); pick a writable path.") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{what} {path} is not writable; pick a writable path.")


def write_channel_last(dataset, path):
    """Write ``dataset`` (C, D, H, W) to ``path`` as a (D, H, W, C) float32 .npy, atomically."""
    channels, depth, height, width = dataset.shape
    with atomic_path(path) as temporary:
        out = np.lib.format.open_memmap(
            temporary, mode="w+", dtype=np.float32, shape=(depth, height, width, channels)
        )
        planes = max(1, SLAB_BYTES // (channels * height * width * 4))
        for start in range(0, depth, planes):
            stop = min(depth, start + planes)
            # One hyperslab read per slab: (C, d, H, W) -> (d, H, W, C), converted on assignment.
            out[start:stop] = np.moveaxis(dataset[:, start:stop], 0, -1)
        out.flush()
        del out  # close the memory map before the rename


def convert(h5_path, out_dir=None, data_key="Nbody", label_key="Hydro", force=False):
    """Write the channel-last NAME_data.npy and NAME_label.npy for ``h5_path``; returns their paths.

    Everything is checked before anything is written: the input, both datasets (present, 4-D,
    same spatial shape, since the loader crops them together) and the outputs (refused if present
    unless ``force``).
    """
    data_path, label_path = output_paths(h5_path, out_dir)
    out_dir = os.path.dirname(data_path) or "."
    with open_h5(h5_path) as h5_file:
        data = checked_dataset(h5_file, data_key, h5_path, "-d")
        label = checked_dataset(h5_file, label_key, h5_path, "-l")
        if data.shape[1:] != label.shape[1:]:
            raise UserError(
                f"in {h5_path}, {data_key!r} has spatial shape {data.shape[1:]} but {label_key!r} has "
                f"{label.shape[1:]}; data and label must cover the same voxels."
            )
        existing = [path for path in (data_path, label_path) if os.path.exists(path)]
        if existing and not force:
            raise UserError(
                f"refusing to overwrite {', '.join(existing)}. Pass --force to overwrite, or choose "
                "another output directory with -o."
            )
        make_writable_dir(out_dir, "output directory (-o)")
        write_channel_last(data, data_path)
        write_channel_last(label, label_path)
    return data_path, label_path


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m utils.convert_h5_to_npy",
        description="Write channel-last (D, H, W, C) float32 NAME_data.npy and NAME_label.npy from an "
        "HDF5 file NAME.h5 with channel-first (C, D, H, W) datasets.",
    )
    parser.add_argument("-i", "--input", required=True, help="HDF5 file to convert")
    parser.add_argument("-d", "--data_key", default="Nbody",
                        help="dataset written to NAME_data.npy (default: Nbody)")
    parser.add_argument("-l", "--label_key", default="Hydro",
                        help="dataset written to NAME_label.npy (default: Hydro)")
    parser.add_argument("-o", "--out_dir", default=None,
                        help="output directory (default: the input's directory)")
    parser.add_argument("--force", action="store_true", help="overwrite existing .npy files")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    for path in convert(args.input, args.out_dir, args.data_key, args.label_key, args.force):
        print(path)


if __name__ == "__main__":
    main()
