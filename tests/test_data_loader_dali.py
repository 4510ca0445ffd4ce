"""The dali-lowmem loader, in DALI's CPU-only mode (and on the GPU where there is one): a real
pipeline on real .npy files, no mocks.

Its samples must be the native loader's, bit for bit: same crops, same symmetry elements, the
vector channels turned the same way.
"""
import itertools
import os
import shutil
import sys

import numpy as np
import pytest
import torch

from conftest import dali_installed, needs_cuda, needs_dali
from utils import get_data_loader_distributed, symmetry
from utils.YParams import YParams
from utils.convert_h5_to_npy import convert
from utils.data_loader import CropSampler, CropSpec, InMemoryDataset, build_dataset
from utils.data_loader import get_data_loaders as native_loaders
from utils.data_loader_dali import DaliCropLoader, get_data_loaders, npy_paths, warp_matrix
from utils.errors import UserError


@pytest.mark.skipif(not os.environ.get("CI"), reason="only CI must have DALI (make test installs it)")
def test_dali_is_installed_under_ci():
    # Elsewhere the DALI tests skip without DALI; under CI that would hide a broken DALI loader.
    assert dali_installed(), "make test installs requirements-dali.txt; DALI must be importable under CI"


@pytest.fixture(scope="module")
def h5_with_npy(data_files, tmp_path_factory):
    """Copies of the train (side 48) and validation (side 32) files, each with <name>_data.npy and
    <name>_label.npy beside it."""
    directory = tmp_path_factory.mktemp("dali")
    paths = {}
    for name, source in data_files.items():
        paths[name] = str(directory / f"{name}.h5")
        shutil.copy(source, paths[name])
        convert(paths[name])  # beside the HDF5 file, where the loader finds them by itself
    return paths


# The native loaders compared with DALI's load in this process (num_data_workers=0): forking loader
# workers from a process that runs DALI's threads can crash the child (a segfault in a worker, seen on
# a fresh clone's make test, 2026-11-26), and the workers change nothing in the values compared.
IN_PROCESS = {"num_data_workers": 0}


def make_params(files, **changes):
    params = YParams("config/UNet.yaml", "test")
    params.update({"train_path": files["train"], "val_path": files["valid"],
                   "data_loader_config": "dali-lowmem", "num_data_workers": 2, **changes})
    return params


def epoch_batches(loader, epoch, start=0):
    loader.sampler.set_epoch(epoch, start=start)
    return list(loader)


def assert_bits_equal(actual, expected):
    """Bit for bit (the sign of a zero included: the generated data has no exact zeros)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype == np.float32
    np.testing.assert_array_equal(actual.view(np.uint32), expected.view(np.uint32))


class EveryElement(CropSpec):
    """The native crops, except that sample ``index`` gets element ``index % 48``."""

    def draw(self, key):
        corner, _ = super().draw(key)
        return corner, symmetry.ELEMENTS[key[1] % len(symmetry.ELEMENTS)]


@needs_dali
def test_every_element_matches_the_native_augmentation_bit_for_bit(h5_with_npy):
    params = make_params(h5_with_npy, Nsamples=48, global_batch_size=16)
    spec = EveryElement(**vars(CropSpec.from_params(params, 0, 48, augment=True, source="test")))
    reference = InMemoryDataset(spec, 48, h5_with_npy["train"])
    loader = DaliCropLoader(npy_paths(params, 0), spec, CropSampler(48, 1, 0), batch_size=16,
                            drop_last=True, device_id=None, num_threads=2, seed=0)
    samples = [pair for inputs, targets in epoch_batches(loader, 0) for pair in zip(inputs, targets)]
    assert len(samples) == 48
    for index, (x, y) in enumerate(samples):
        nbody, hydro = reference[(0, index)]  # read_crop + apply_numpy, the native path
        assert (nbody != 0).all() and (hydro != 0).all()  # see assert_bits_equal
        assert_bits_equal(x.numpy(), nbody.numpy())
        assert_bits_equal(y.numpy(), hydro.numpy())


@needs_dali
def test_batches_equal_the_native_loaders_epoch_after_epoch(h5_with_npy):
    # Crop 16 so that validation crops vary too (the validation box has side 32); 6 validation
    # samples in batches of 4 leave a partial batch.
    changes = {"crop_size": 16, "Nsamples_val": 6}
    dali = get_data_loader_distributed(make_params(h5_with_npy, **changes), 0, None)
    native_params = make_params(h5_with_npy, data_loader_config="inmem", **changes, **IN_PROCESS)
    native = get_data_loader_distributed(native_params, 0, None)
    assert native[0].num_workers == native[1].num_workers == 0  # nothing forked beside DALI's threads
    for which in (0, 1):  # training, then validation
        assert len(dali[which]) == len(native[which]) and dali[which].batch_size == native[which].batch_size
        for epoch in (0, 1, 2):  # the pipeline is reused from one epoch to the next
            ours, theirs = epoch_batches(dali[which], epoch), epoch_batches(native[which], epoch)
            sizes = [4, 4, 4, 4] if which == 0 else [4, 2]
            assert [len(x) for x, _ in ours] == [len(x) for x, _ in theirs] == sizes
            for (a, b), (c, d) in zip(ours, theirs):
                assert_bits_equal(a.numpy(), c.numpy())
                assert_bits_equal(b.numpy(), d.numpy())


@needs_dali
@needs_cuda("DALI's GPU pipeline needs a CUDA device")
def test_on_the_gpu_the_batches_are_the_native_loaders_and_stay_valid(h5_with_npy):
    """Augmentation on the GPU, zero-copy into torch: a whole epoch's batches held, then compared."""
    changes = {"crop_size": 16, "Nsamples_val": 6}
    dali = get_data_loader_distributed(make_params(h5_with_npy, **changes), 0, torch.device("cuda"))
    native = get_data_loader_distributed(make_params(h5_with_npy, data_loader_config="inmem", **changes, **IN_PROCESS),
                                         0, None)
    for which in (0, 1):
        for epoch in (0, 1):
            ours, theirs = epoch_batches(dali[which], epoch), epoch_batches(native[which], epoch)
            assert len(ours) == len(theirs) and all(x.device.type == "cuda" for x, _ in ours)
            for (a, b), (c, d) in zip(ours, theirs):
                assert_bits_equal(a.cpu().numpy(), c.numpy())
                assert_bits_equal(b.cpu().numpy(), d.numpy())


@needs_dali
def test_shapes_dtype_and_validation_without_augmentation(h5_with_npy):
    train_loader, val_loader = get_data_loader_distributed(make_params(h5_with_npy), 0, torch.device("cpu"))
    inputs, targets = epoch_batches(train_loader, 0)[0]
    assert inputs.shape == (4, 4, 32, 32, 32) and targets.shape == (4, 5, 32, 32, 32)
    assert inputs.dtype == targets.dtype == torch.float32 and inputs.device.type == "cpu"
    # Validation: the whole 32^3 box, untransformed, every time.
    reference = build_dataset(make_params(h5_with_npy, data_loader_config="inmem"), h5_with_npy["valid"], 8,
                              split=1, augment=False)
    nbody, hydro = (torch.from_numpy(a) for a in (reference.nbody, reference.hydro))
    for epoch in (0, 3):
        for inputs, targets in epoch_batches(val_loader, epoch):
            for x, y in zip(inputs, targets):
                assert torch.equal(x, nbody) and torch.equal(y, hydro)


@needs_dali
def test_channels_last_batches_are_the_same_values_stored_channels_last(h5_with_npy):
    """--channels_last leaves the pipeline's transpose out: the batch is a channels_last_3d view of
    DALI's channel-last buffer, which train.py's move to that layout does not copy."""
    first, last = (get_data_loader_distributed(make_params(h5_with_npy, channels_last=channels_last), 0,
                                               torch.device("cpu"))[0] for channels_last in (False, True))
    for (x, y), (x_last, y_last) in zip(epoch_batches(first, 1), epoch_batches(last, 1)):
        for expected, actual in ((x, x_last), (y, y_last)):
            assert actual.is_contiguous(memory_format=torch.channels_last_3d) and not actual.is_contiguous()
            assert_bits_equal(actual.numpy(), expected.numpy())
            assert actual.to("cpu", memory_format=torch.channels_last_3d).data_ptr() == actual.data_ptr()


@needs_dali
def test_resume_and_ranks(h5_with_npy):
    full, _ = get_data_loader_distributed(make_params(h5_with_npy), 0, None)
    batches = epoch_batches(full, 5)
    resumed = epoch_batches(full, 5, start=8)  # rebuilds the pipeline at sample 8 of epoch 5
    assert len(full) == len(resumed) == 2
    for (a, b), (c, d) in zip(batches[2:], resumed):
        assert torch.equal(a, c) and torch.equal(b, d)
    params = make_params(h5_with_npy)
    ranks = [get_data_loader_distributed(params, rank, None, world_size=2)[0] for rank in (0, 1)]
    assert [len(loader) for loader in ranks] == [4, 4] and ranks[0].batch_size == 2
    assert not torch.equal(epoch_batches(ranks[0], 0)[0][0], epoch_batches(ranks[1], 0)[0][0])


def mesh_blocks(shape, size):
    """The blocks of a crop split ``shape`` ways along D, H, W, in the order of the ranks' coords."""
    return [tuple((c * size // n, (c + 1) * size // n) for c, n in zip(coords, shape))
            for coords in itertools.product(*(range(n) for n in shape))]


def test_the_warp_maps_each_block_voxel_onto_its_source_in_the_box():
    """warp_affine's arithmetic done in numpy, nearest neighbour on voxel centres k + 0.5: for every
    element, the block of the turned crop sampled from the source box through warp_matrix is
    apply_numpy's block, and every output centre lands exactly on an input centre."""
    size = 6
    crop = np.random.default_rng(0).standard_normal((1, size, size, size)).astype(np.float32)
    block = ((0, 3), (2, 6), (1, 6))  # neither cubic nor at the origin: a wrong shift shows
    output = np.stack(np.meshgrid(*(np.arange(stop - start) for start, stop in block), indexing="ij"))
    centres = output[::-1].reshape(3, -1) + 0.5  # (x, y, z) = (W, H, D)
    for element in symmetry.ELEMENTS:
        box = symmetry.source_box(element, block, size)
        matrix = warp_matrix(element, size, block).astype(np.float64)
        source = matrix[:, :3] @ centres + matrix[:, 3:]
        assert np.array_equal(source - 0.5, np.floor(source))  # on a centre, no rounding involved
        index = np.floor(source).astype(int)[::-1]  # back to D, H, W, inside the box
        box_shape = np.array([stop - start for start, stop in box])[:, None]
        assert (index >= 0).all() and (index < box_shape).all()
        voxels = crop[(slice(None), *(slice(start, stop) for start, stop in box))]
        warped = voxels[0][tuple(index)].reshape(output.shape[1:])
        expected = symmetry.apply_numpy(crop, element)[(0, *(slice(start, stop) for start, stop in block))]
        assert_bits_equal(warped, expected)
    whole = ((0, size),) * 3
    assert all(np.array_equal(warp_matrix(e, size), warp_matrix(e, size, whole)) for e in symmetry.ELEMENTS)


@needs_dali
@pytest.mark.parametrize("shape", [(2, 2, 1), (1, 2, 2)], ids=["mesh_2x2x1", "mesh_1x2x2"])
def test_the_blocks_of_a_domain_group_make_up_the_undivided_sample(h5_with_npy, shape):
    """Under --domain_mesh each rank's dali-lowmem loader yields its block of the same turned crops:
    the window of the undivided batch, and the native lowmem loader's block, bit for bit, with
    augmentation (training) and without (validation). Blocks are not cubic, so the box each sample
    reads changes shape with the element's permutation."""
    # Crop 16 so that validation crops vary too (the validation box has side 32); 48 samples so that
    # many elements occur, reflections and permutations among them.
    params = make_params(h5_with_npy, crop_size=16, Nsamples=48, global_batch_size=8, Nsamples_val=6)
    native_params = make_params(h5_with_npy, data_loader_config="lowmem", **IN_PROCESS, crop_size=16,
                                Nsamples=48, global_batch_size=8, Nsamples_val=6)
    whole = get_data_loaders(params, 0, 1)
    elements = {whole[0].spec.draw(key)[1] for key in whole[0].keys(1)}
    assert len(elements) >= 16 and any(not e.is_proper for e in elements)
    for which in (0, 1):  # training (all 48 elements), then validation (no augmentation)
        undivided = epoch_batches(whole[which], 1)
        assert [len(x) for x, _ in undivided] == ([8] * 6 if which == 0 else [6])
        for block in mesh_blocks(shape, 16):
            # The boxes read take all three arrangements of the block's extents (16, 8, 8).
            assert len({tuple(stop - start for start, stop in symmetry.source_box(e, block, 16))
                        for e in elements}) == 3
            ours = epoch_batches(get_data_loader_distributed(params, 0, None, block=block)[which], 1)
            theirs = epoch_batches(native_loaders(native_params, 0, 1, pin_memory=False, block=block)[which], 1)
            assert len(ours) == len(theirs) == len(undivided)
            window = (slice(None), slice(None), *(slice(start, stop) for start, stop in block))
            for (x, y), (x_native, y_native), (x_whole, y_whole) in zip(ours, theirs, undivided):
                assert x.shape[2:] == tuple(stop - start for start, stop in block)
                assert_bits_equal(x.numpy(), x_whole[window].numpy())
                assert_bits_equal(y.numpy(), y_whole[window].numpy())
                assert_bits_equal(x.numpy(), x_native.numpy())
                assert_bits_equal(y.numpy(), y_native.numpy())


@needs_dali
@needs_cuda("DALI's GPU pipeline needs a CUDA device")
def test_on_the_gpu_each_block_is_the_native_loaders(h5_with_npy):
    """The blocks of a [1,2,2] mesh read and warped on the GPU: the native loader's blocks, bit for bit."""
    changes = {"crop_size": 16, "Nsamples": 48, "global_batch_size": 8, "Nsamples_val": 6}
    for block in mesh_blocks((1, 2, 2), 16):
        dali = get_data_loader_distributed(make_params(h5_with_npy, **changes), 0, torch.device("cuda"), block=block)
        native = get_data_loader_distributed(make_params(h5_with_npy, data_loader_config="inmem", **changes,
                                                         **IN_PROCESS), 0, None, block=block)
        for which in (0, 1):
            ours, theirs = epoch_batches(dali[which], 1), epoch_batches(native[which], 1)
            assert len(ours) == len(theirs) and all(x.device.type == "cuda" for x, _ in ours)
            for (a, b), (c, d) in zip(ours, theirs):
                assert_bits_equal(a.cpu().numpy(), c.numpy())
                assert_bits_equal(b.cpu().numpy(), d.numpy())


@needs_dali
def test_missing_npy_files_name_the_converter_command(data_files, tmp_path):
    h5_path = tmp_path / "alone.h5"
    shutil.copy(data_files["train"], h5_path)
    with pytest.raises(UserError) as error:
        get_data_loader_distributed(make_params({"train": str(h5_path), "valid": str(h5_path)}), 0, None)
    message = " ".join(str(error.value).split())
    assert f"python -m utils.convert_h5_to_npy -i {h5_path} -d Nbody -l Hydro" in message
    assert str(tmp_path / "alone_data.npy") in message and "--train_path_npy_data" in message


@needs_dali
def test_the_original_npy_keys_and_names(h5_with_npy, tmp_path):
    """Both directions: copies named as the original's converter names them, kept in another folder,
    are read through the original's four keys; and what the loader reads by default is exactly the
    original's layout (<h5 stem>_data.npy and <h5 stem>_label.npy beside the HDF5 file)."""
    elsewhere = tmp_path / "npy"
    elsewhere.mkdir()
    keys = {}
    for name, split in (("train", "train"), ("valid", "val")):
        stem = os.path.splitext(h5_with_npy[name])[0]
        assert npy_paths(make_params(h5_with_npy), 0 if split == "train" else 1) == (f"{stem}_data.npy",
                                                                                      f"{stem}_label.npy")
        for kind in ("data", "label"):
            target = elsewhere / f"downsamp_{name}_{kind}.npy"
            shutil.copy(f"{stem}_{kind}.npy", target)
            keys[f"{split}_path_npy_{kind}"] = str(target)
    missing = {"train": str(tmp_path / "no.h5"), "valid": str(tmp_path / "no.h5")}  # the HDF5 files are not read
    params = make_params(missing, **keys)
    train_loader, val_loader = get_data_loader_distributed(params, 0, torch.device("cpu"))
    default_train, default_val = get_data_loader_distributed(make_params(h5_with_npy), 0, torch.device("cpu"))
    for loader, reference in ((train_loader, default_train), (val_loader, default_val)):
        for (a, b), (c, d) in zip(epoch_batches(loader, 0), epoch_batches(reference, 0)):
            assert torch.equal(a, c) and torch.equal(b, d)


@needs_dali
def test_crop_larger_than_the_box_is_a_user_error(h5_with_npy):
    with pytest.raises(UserError, match="crop_size=64 is larger than the box side 48"):
        get_data_loader_distributed(make_params(h5_with_npy, crop_size=64), 0, None)


def test_missing_dali_says_how_to_install_it(data_files, monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # what `import nvidia.dali` sees without DALI
    with pytest.raises(UserError, match=r"pip install -r requirements-dali\.txt"):
        get_data_loader_distributed(make_params(data_files), 0, None)
