"""The native loaders: shapes, crops that are really windows of the files, reproducibility, rank splits."""
import h5py
import numpy as np
import pytest
import torch

from utils import get_data_loader_distributed, symmetry
from utils.YParams import YParams
from utils.data_loader import CropSampler, build_dataset, fit_workers_to_shm, get_data_loaders

KINDS = ("synthetic", "inmem", "lowmem")


def make_params(data_files, **changes):
    params = YParams("config/UNet.yaml", "test")
    params.update({"train_path": data_files["train"], "val_path": data_files["valid"], **changes})
    return params


def first_batch(loader, epoch=0):
    loader.sampler.set_epoch(epoch)
    return next(iter(loader))


@pytest.mark.parametrize("kind", KINDS)
def test_loaders_yield_input_and_target_batches(data_files, kind):
    params = make_params(data_files, data_loader_config=kind)
    train_loader, val_loader = get_data_loader_distributed(params, 0, torch.device("cpu"))
    for loader in (train_loader, val_loader):
        inputs, targets = first_batch(loader)
        assert inputs.shape == (4, 4, 32, 32, 32) and targets.shape == (4, 5, 32, 32, 32)
        assert inputs.dtype == targets.dtype == torch.float32
    assert len(train_loader) == params.Nsamples // params.global_batch_size


@pytest.mark.parametrize("kind", ("inmem", "lowmem"))
def test_a_sample_is_the_transformed_window_of_the_file(data_files, kind):
    params = make_params(data_files, data_loader_config=kind)
    dataset = build_dataset(params, data_files["train"], 16, split=0, augment=True)
    with h5py.File(data_files["train"]) as f:
        nbody, hydro = f["Nbody"][...], f["Hydro"][...]
    seen_elements = set()
    for index in range(16):
        corner, element = dataset.spec.draw((3, index))
        seen_elements.add(element)
        window = (slice(None), *(slice(c, c + 32) for c in corner))
        x, y = dataset[(3, index)]
        np.testing.assert_array_equal(x.numpy(), symmetry.apply_numpy(nbody[window], element, [(1, 2, 3)]))
        np.testing.assert_array_equal(y.numpy(), symmetry.apply_numpy(hydro[window], element, [(2, 3, 4)]))
    assert len(seen_elements) > 1  # augmentation is on


def test_inmem_and_lowmem_agree(data_files):
    batches = []
    for kind in ("inmem", "lowmem"):
        loader, _ = get_data_loader_distributed(make_params(data_files, data_loader_config=kind), 0, None)
        batches.append(first_batch(loader, epoch=2))
    for a, b in zip(*batches):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_same_crops_for_any_number_of_workers(data_files):
    batches = []
    for workers in (0, 2):
        loader, _ = get_data_loader_distributed(
            make_params(data_files, data_loader_config="lowmem", num_data_workers=workers), 0, None)
        batches.append([torch.cat(batch) for batch in zip(*list_epoch(loader, 1))])
    torch.testing.assert_close(batches[0], batches[1], rtol=0, atol=0)


def list_epoch(loader, epoch):
    loader.sampler.set_epoch(epoch)
    return list(loader)


def test_epochs_and_seeds_change_the_crops_validation_does_not(data_files):
    params = make_params(data_files, data_loader_config="inmem")
    train_loader, val_loader = get_data_loader_distributed(params, 0, None)
    assert not torch.equal(first_batch(train_loader, 0)[0], first_batch(train_loader, 1)[0])
    torch.testing.assert_close(first_batch(val_loader, 0)[0], first_batch(val_loader, 5)[0], rtol=0, atol=0)
    other_seed, _ = get_data_loader_distributed(make_params(data_files, data_loader_config="inmem", seed=1), 0, None)
    assert not torch.equal(first_batch(train_loader, 0)[0], first_batch(other_seed, 0)[0])


def test_ranks_draw_different_crops_and_split_the_epoch(data_files):
    params = make_params(data_files, data_loader_config="inmem", global_batch_size=4)
    loaders = [get_data_loader_distributed(params, rank, None, world_size=2)[0] for rank in (0, 1)]
    assert [loader.batch_size for loader in loaders] == [2, 2]
    assert [len(loader) for loader in loaders] == [4, 4]  # 16 samples / (2 ranks x 2)
    a, b = (first_batch(loader)[0] for loader in loaders)
    assert not torch.equal(a, b)


def test_sampler_resumes_in_the_middle_of_an_epoch():
    sampler = CropSampler(10, num_replicas=1, rank=0)
    sampler.set_epoch(4)
    keys = list(sampler)
    sampler.set_epoch(4, start=6)
    assert list(sampler) == keys[6:] and len(sampler) == 4
    assert keys[0] == (4, 0)


def test_box_sides_come_from_the_files(data_files):
    params = make_params(data_files, data_loader_config="inmem", crop_size=48)
    train = build_dataset(params, data_files["train"], 4, split=0, augment=False)
    assert train.spec.box_side == 48
    corner, _ = train.spec.draw((0, 0))
    assert tuple(corner) == (0, 0, 0)  # a crop as large as the box has one position


def test_crop_corners_cover_the_originals_range(data_files):
    """Corners are uniform in [0, L - S) per axis, the original's np.random.randint(0, L - S)."""
    params = make_params(data_files, data_loader_config="lowmem", crop_size=8)
    dataset = build_dataset(params, data_files["train"], 4096, split=0, augment=True)
    high = dataset.spec.box_side - 8
    corners = np.array([dataset.spec.draw((0, index))[0] for index in range(4096)])
    assert corners.min() == 0 and corners.max() == high - 1  # L - S itself is never drawn
    assert set(np.unique(corners)) == set(range(high))


def test_a_crop_one_voxel_smaller_than_the_box_always_starts_at_the_origin(data_files):
    """With L = S + 1 the original's randint(0, 1) is always 0: the crop never touches the far faces."""
    params = make_params(data_files, data_loader_config="lowmem")
    dataset = build_dataset(params, data_files["train"], 64, split=0, augment=True)
    params.update({"crop_size": dataset.spec.box_side - 1})
    dataset = build_dataset(params, data_files["train"], 64, split=0, augment=True)
    assert all(tuple(dataset.spec.draw((0, index))[0]) == (0, 0, 0) for index in range(64))


def test_synthetic_samples_are_new_random_numbers_for_every_sample(data_files):
    params = make_params(data_files, data_loader_config="synthetic", augment="none")
    loader, _ = get_data_loader_distributed(params, 0, None)
    inputs, targets = first_batch(loader)
    assert all(not torch.equal(inputs[0], inputs[i]) for i in range(1, len(inputs)))
    assert abs(inputs.mean().item()) < 0.01 and abs(inputs.std().item() - 1) < 0.01  # normal(0, 1)
    second, _ = first_batch(loader)
    torch.testing.assert_close(second, inputs, rtol=0, atol=0)  # and the same for the same key


def test_workers_and_prefetch_are_capped_to_fit_dev_shm():
    batch = 64 * 9 * 64**3 * 4  # 604 MB: the GPU ladder's lowmem batch
    assert fit_workers_to_shm(8, batch, 1, free=64 * 10**9) == (8, 2)  # 9.7 GB in flight, 32 GB of room
    assert fit_workers_to_shm(8, batch, 1, free=16 * 10**9) == (8, 1)  # 8 GB of room: the prefetch halves first
    assert fit_workers_to_shm(8, batch, 4, free=16 * 10**9) == (3, 1)  # four ranks share it: 2 GB each
    assert fit_workers_to_shm(8, batch, 1, free=10**9) == (0, None)    # not one batch: the main process loads
    assert fit_workers_to_shm(8, batch, 1, free=None) == (8, 2)        # no /dev/shm to measure
    assert fit_workers_to_shm(0, batch, 1, free=10**9) == (0, None)


def test_on_a_gpu_lowmem_workers_start_from_a_forkserver_and_inmem_ones_fork(data_files):
    """pin_memory (a GPU run) makes lowmem's workers start from a forkserver, which never holds a CUDA
    context; their batches are the forked workers' (run here for real, on the CPU)."""
    params = make_params(data_files, data_loader_config="lowmem", num_data_workers=2)
    forked, _ = get_data_loaders(params, 0, 1, pin_memory=False)
    served, _ = get_data_loaders(params, 0, 1, pin_memory=True)
    assert forked.multiprocessing_context is None
    assert served.multiprocessing_context.get_start_method() == "forkserver"
    for (x, y), (x_served, y_served) in zip(forked, served):
        assert torch.equal(x, x_served) and torch.equal(y, y_served)
    inmem, _ = get_data_loaders(make_params(data_files, data_loader_config="inmem", num_data_workers=2), 0, 1,
                                pin_memory=True)
    assert inmem.multiprocessing_context is None  # fork: the volumes are shared, not copied per worker


@pytest.mark.parametrize("kind", KINDS)
def test_the_blocks_of_a_domain_group_make_up_the_undivided_sample(data_files, kind):
    """Under --domain_mesh=[2,2,1] each rank's loader yields its block of the same turned crops."""
    params = make_params(data_files, data_loader_config=kind)
    whole = first_batch(get_data_loader_distributed(params, 0, None)[0], epoch=1)
    blocks = [((0, 16), (0, 16), (0, 32)), ((0, 16), (16, 32), (0, 32)),
              ((16, 32), (0, 16), (0, 32)), ((16, 32), (16, 32), (0, 32))]
    for block in blocks:
        inputs, targets = first_batch(get_data_loader_distributed(params, 0, None, block=block)[0], epoch=1)
        window = (slice(None), slice(None), *(slice(a, b) for a, b in block))
        assert inputs.shape == (4, 4, 16, 16, 32)
        assert torch.equal(inputs, whole[0][window]) and torch.equal(targets, whole[1][window])
