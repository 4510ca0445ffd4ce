"""The gpu-inmem loader: the native loader's samples bit for bit, shapes, resume, ranks, no host sync.

Runs on the CPU (the loader takes the device it is given); the synchronisation check also runs on
CUDA when there is a GPU.
"""
import math
import re

import numpy as np
import pytest
import torch

import quotes
from conftest import needs_cuda
from utils import get_data_loader_distributed, symmetry
from utils.YParams import YParams
from utils.data_loader import build_dataset
from utils.data_loader_gpu import DeviceCropLoader, crop_and_augment, upload_volume
from utils.errors import UserError

VECTORS = [(1, 2, 3), (4 + 2, 4 + 3, 4 + 4)]  # nbody's and hydro's velocities in the 9-channel volume


def make_params(data_files, **changes):
    params = YParams("config/UNet.yaml", "test")
    params.update({"train_path": data_files["train"], "val_path": data_files["valid"],
                   "data_loader_config": "gpu-inmem", **changes})
    return params


def epoch_batches(loader, epoch, start=0):
    loader.sampler.set_epoch(epoch, start=start)
    return list(loader)


def native_sample(dataset, corner, element):
    """What the native loader makes of a crop: read_crop, then apply_numpy, input and target."""
    nbody, hydro = dataset.read_crop(corner, key=None)
    (_, nbody_vectors), (_, hydro_vectors) = dataset.spec.channel_groups
    return (symmetry.apply_numpy(nbody, element, nbody_vectors),
            symmetry.apply_numpy(hydro, element, hydro_vectors))


def assert_bits_equal(actual, expected):
    """Bit for bit, so that even the sign of a zero counts."""
    np.testing.assert_array_equal(np.asarray(actual).view(np.uint32), np.asarray(expected).view(np.uint32))


@pytest.fixture(scope="module")
def native_train(data_files):
    """The native in-memory dataset of the training file: the reference."""
    return build_dataset(make_params(data_files, data_loader_config="inmem"), data_files["train"], 48,
                         split=0, augment=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_element_matches_the_native_loader_bit_for_bit(data_files, native_train, dtype):
    # The native loader's corners for 48 samples, and each of the 48 elements once.
    corners = np.stack([native_train.spec.draw((0, index))[0] for index in range(48)])
    volume = upload_volume(data_files["train"], torch.device("cpu"), dtype)
    batch = crop_and_augment(volume, torch.from_numpy(corners), torch.arange(48), 32, VECTORS)
    assert batch.shape == (48, 9, 32, 32, 32) and batch.dtype == torch.float32
    for index, element in enumerate(symmetry.ELEMENTS):
        nbody, hydro = native_sample(native_train, corners[index], element)
        if dtype != torch.float32:  # stored rounded: the native result rounded the same way
            nbody, hydro = (torch.from_numpy(a).to(dtype).float().numpy() for a in (nbody, hydro))
        assert_bits_equal(batch[index, :4].numpy(), nbody)
        assert_bits_equal(batch[index, 4:].numpy(), hydro)


def test_loader_batches_are_the_drawn_crops_of_the_native_loader(data_files, native_train):
    train_loader, _ = get_data_loader_distributed(make_params(data_files), 0, None)
    assert isinstance(train_loader, DeviceCropLoader)
    train_loader.sampler.set_epoch(3)
    corners, elements = train_loader.sampler.draws()
    index = 0
    for inputs, targets in train_loader:
        for x, y in zip(inputs, targets):
            nbody, hydro = native_sample(native_train, corners[index].numpy(),
                                         symmetry.ELEMENTS[int(elements[index])])
            assert_bits_equal(x.numpy(), nbody)
            assert_bits_equal(y.numpy(), hydro)
            index += 1
    assert index == 16 and len(set(elements.tolist())) > 1  # a whole epoch, augmented


def test_shapes_lengths_and_batch_size(data_files):
    params = make_params(data_files, Nsamples_val=6)
    train_loader, val_loader = get_data_loader_distributed(params, 0, torch.device("cpu"))
    assert train_loader.batch_size == val_loader.batch_size == 4
    assert len(train_loader) == 16 // 4 and len(val_loader) == math.ceil(6 / 4)
    train = epoch_batches(train_loader, 0)
    val = epoch_batches(val_loader, 0)
    assert len(train) == len(train_loader) and len(val) == len(val_loader)
    for inputs, targets in train:
        assert inputs.shape == (4, 4, 32, 32, 32) and targets.shape == (4, 5, 32, 32, 32)
        assert inputs.dtype == targets.dtype == torch.float32 and inputs.device.type == "cpu"
        assert inputs.is_contiguous() and targets.is_contiguous()
    assert [len(inputs) for inputs, _ in val] == [4, 2]  # validation keeps the partial batch


def test_bfloat16_storage_returns_float32_batches_of_rounded_values(data_files):
    loaders = [get_data_loader_distributed(make_params(data_files, gpu_inmem_dtype=dtype), 0, None)[0]
               for dtype in ("float32", "bfloat16")]
    assert loaders[1].volume.dtype == torch.bfloat16
    (x32, y32), (x16, y16) = (epoch_batches(loader, 0)[0] for loader in loaders)
    assert x16.dtype == y16.dtype == torch.float32
    assert torch.equal(x16, x32.bfloat16().float()) and torch.equal(y16, y32.bfloat16().float())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_channels_last_batches_are_the_same_values_stored_channels_last(data_files, dtype):
    """With --channels_last the batches come stored as channels_last_3d, so that train.py's move to
    that layout copies nothing; every value is the channel-first loader's, bit for bit."""
    loaders = [get_data_loader_distributed(make_params(data_files, channels_last=last, gpu_inmem_dtype=dtype), 0,
                                           None)[0] for last in (False, True)]
    for (x, y), (x_last, y_last) in zip(epoch_batches(loaders[0], 2), epoch_batches(loaders[1], 2)):
        for first, last in ((x, x_last), (y, y_last)):
            assert last.is_contiguous(memory_format=torch.channels_last_3d) and not last.is_contiguous()
            assert last.shape == first.shape and last.dtype == torch.float32
            assert_bits_equal(last.numpy(), first.numpy())
            moved = last.to("cpu", memory_format=torch.channels_last_3d)  # train.py's to_device
            assert moved.data_ptr() == last.data_ptr()


def test_set_epoch_with_start_resumes_exactly(data_files):
    train_loader, _ = get_data_loader_distributed(make_params(data_files), 0, None)
    full = epoch_batches(train_loader, 2)
    resumed = epoch_batches(train_loader, 2, start=8)
    assert len(train_loader) == 2 and len(resumed) == 2
    for (a, b), (c, d) in zip(full[2:], resumed):
        assert torch.equal(a, c) and torch.equal(b, d)
    # A new loader (a restarted process) draws the same epoch.
    again, _ = get_data_loader_distributed(make_params(data_files), 0, None)
    assert torch.equal(epoch_batches(again, 2, start=8)[0][0], resumed[0][0])


def test_epochs_and_seeds_change_the_crops_validation_does_not(data_files):
    train_loader, val_loader = get_data_loader_distributed(make_params(data_files), 0, None)
    assert not torch.equal(epoch_batches(train_loader, 0)[0][0], epoch_batches(train_loader, 1)[0][0])
    first, later = epoch_batches(val_loader, 0), epoch_batches(val_loader, 7)
    for (a, b), (c, d) in zip(first, later):
        assert torch.equal(a, c) and torch.equal(b, d)
    other_seed, _ = get_data_loader_distributed(make_params(data_files, seed=1), 0, None)
    assert not torch.equal(epoch_batches(train_loader, 0)[0][0], epoch_batches(other_seed, 0)[0][0])


def test_ranks_draw_different_crops_and_split_the_epoch(data_files):
    # Crop 16: the validation box (side 32) has a single position for a crop of 32.
    params = make_params(data_files, crop_size=16)
    loaders = [get_data_loader_distributed(params, rank, None, world_size=2) for rank in (0, 1)]
    assert [train.batch_size for train, _ in loaders] == [2, 2]
    assert [len(train) for train, _ in loaders] == [4, 4]  # 16 samples / (2 ranks x 2)
    for which in (0, 1):  # training and validation
        a, b = (epoch_batches(pair[which], 0)[0][0] for pair in loaders)
        assert not torch.equal(a, b)


def test_validation_is_not_augmented(data_files):
    params = make_params(data_files, data_loader_config="inmem")
    native = build_dataset(params, data_files["valid"], 8, split=1, augment=False)
    _, val_loader = get_data_loader_distributed(make_params(data_files), 0, None)
    corners, elements = val_loader.sampler.draws()
    assert not elements.any()  # the identity, always
    inputs, targets = next(iter(val_loader))
    nbody, hydro = native_sample(native, corners[0].numpy(), symmetry.IDENTITY)
    assert_bits_equal(inputs[0].numpy(), nbody)
    assert_bits_equal(targets[0].numpy(), hydro)


def test_crop_larger_than_the_box_is_a_user_error(data_files):
    with pytest.raises(UserError, match="crop_size=64 is larger than the box side"):
        get_data_loader_distributed(make_params(data_files, crop_size=64), 0, None)


# Tensor methods and torch functions that make the host wait for the device, or copy to the host.
SYNCHRONISING = {"item", "cpu", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__",
                 "nonzero", "any", "all", "equal", "unique", "masked_select", "to"}


class RecordTorchCalls(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_iterating_calls_nothing_that_synchronises(data_files):
    # On the CPU nothing can be measured, but every torch call can be seen: none may be one that
    # would wait for a GPU (the CUDA test below checks the same thing on the device itself).
    train_loader, val_loader = get_data_loader_distributed(make_params(data_files, augment="full"), 0, None)
    for loader in (train_loader, val_loader):
        loader.sampler.set_epoch(1)
        with RecordTorchCalls() as record:
            batches = list(loader)
        assert batches and not record.names & SYNCHRONISING, record.names & SYNCHRONISING


@needs_cuda()
def test_no_host_synchronisation_on_cuda(data_files):
    device = torch.device("cuda", torch.cuda.current_device())
    train_loader, val_loader = get_data_loader_distributed(make_params(data_files), 0, device)
    for loader in (train_loader, val_loader):
        loader.sampler.set_epoch(1)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            batches = list(loader)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert batches[0][0].device == device


def test_out_of_memory_recommends_float16_storage(data_files, monkeypatch):
    """A volume the GPU cannot hold ends in one paragraph that points to float16 storage (8 times less
    rounding error than bfloat16 for values in (-1, 1)). The allocation fails through a stand-in for
    torch.empty, since no CPU allocation raises CUDA's out-of-memory error."""
    def no_room(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(torch, "empty", no_room)
    with pytest.raises(UserError, match=r"--gpu_inmem_dtype=float16 to halve it.*validation file"
                                        r"|validation file.*--gpu_inmem_dtype=float16 to halve it"):
        upload_volume(data_files["train"], "cpu", torch.float32)


def test_float16_storage_rounds_data_in_the_unit_interval_8_times_less_than_bfloat16(data_files):
    """Why float16 is the recommended 16-bit storage: the file's values lie in (-1, 1), where float16's
    11 significant bits beat bfloat16's 8 and its range is not needed."""
    import h5py
    with h5py.File(data_files["train"], "r") as f:
        values = torch.from_numpy(f["Hydro"][...])
    assert float(values.abs().max()) < 1
    error = {dtype: float((values.to(dtype).float() - values).abs().mean()) for dtype in (torch.float16, torch.bfloat16)}
    assert 6 < error[torch.bfloat16] / error[torch.float16] < 10, error


def test_readme_rounding_errors_are_those_of_the_make_data_targets(tmp_path):
    """Chapter 03's reason for float16 over bfloat16 in gpu-inmem, in its data loading section: on `make data`'s
    training targets, which lie in (-1, 1), float16's mean absolute rounding error is 8 times smaller than
    bfloat16's (2.1e-5 against 1.7e-4: their 10 and 7 mantissa bits)."""
    import h5py
    from utils import generate_data
    generate_data.main(["--out_dir", str(tmp_path)])  # what `make data` runs
    with h5py.File(tmp_path / "synthetic_train.h5", "r") as f:
        values = torch.from_numpy(f["Hydro"][...])
    error = {dtype: float((values.to(dtype).float() - values).abs().mean()) for dtype in (torch.float16, torch.bfloat16)}
    assert (f"{error[torch.float16]:.1e}", f"{error[torch.bfloat16]:.1e}") == ("2.1e-05", "1.7e-04")
    ratio = f"{error[torch.bfloat16] / error[torch.float16]:.0f}"
    assert ratio == f"{2 ** (10 - 7)}"  # the mantissas' bits
    quotes.assert_quoted(quotes.prose(quotes.section("docs/03-profiling-and-optimisation.md", "Data loading")), ratio)


# The blocks of a [2, 2, 1] mesh, and of a [1, 2, 2] one, whose blocks are not cubes: a permutation
# then changes the shape of the box each block is read from.
MESH_BLOCKS = {"2x2x1": [((0, 16), (0, 16), (0, 32)), ((0, 16), (16, 32), (0, 32)),
                         ((16, 32), (0, 16), (0, 32)), ((16, 32), (16, 32), (0, 32))],
               "1x2x2": [((0, 32), (0, 16), (0, 16)), ((0, 32), (0, 16), (16, 32)),
                         ((0, 32), (16, 32), (0, 16)), ((0, 32), (16, 32), (16, 32))]}


def assert_blocks_make_up_the_batch(params, device, blocks):
    """Each block's loaders (training, validation) yield that window of the undivided loaders' batches, bit
    for bit, stored as the undivided ones are."""
    layout = torch.channels_last_3d if params.channels_last else torch.contiguous_format
    whole = [epoch_batches(loader, 1) for loader in get_data_loader_distributed(params, 0, device)]
    for block in blocks:
        window = (slice(None), slice(None), *(slice(a, b) for a, b in block))
        for loader, batches in zip(get_data_loader_distributed(params, 0, device, block=block), whole):
            parts = epoch_batches(loader, 1)
            assert len(parts) == len(batches)
            for (x, y), (x_whole, y_whole) in zip(parts, batches):
                assert x.shape[2:] == tuple(b - a for a, b in block) and x.is_contiguous(memory_format=layout)
                assert_bits_equal(x.cpu().numpy(), x_whole[window].cpu().numpy())
                assert_bits_equal(y.cpu().numpy(), y_whole[window].cpu().numpy())


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("mesh", MESH_BLOCKS)
def test_the_blocks_of_a_domain_group_make_up_the_undivided_batch(data_files, mesh, channels_last):
    """Under --domain_mesh each rank gathers its block of the same turned crops, training (every element
    of the group) and validation, bit for bit the window of the undivided batch."""
    params = make_params(data_files, channels_last=channels_last, Nsamples=48)
    drawn = get_data_loader_distributed(params, 0, None)[0].sampler
    drawn.set_epoch(1)
    assert len(set(drawn.draws()[1].tolist())) > 24  # reflections and permutations alike
    assert_blocks_make_up_the_batch(params, None, MESH_BLOCKS[mesh])


@needs_cuda()
def test_on_cuda_the_blocks_make_up_the_undivided_batch(data_files):
    device = torch.device("cuda", torch.cuda.current_device())
    for mesh in MESH_BLOCKS:
        assert_blocks_make_up_the_batch(make_params(data_files, Nsamples=48), device, MESH_BLOCKS[mesh])
