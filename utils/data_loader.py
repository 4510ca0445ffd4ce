"""Native PyTorch data loaders: random 3-D crops of the N-body and hydro volumes.

A sample is a random ``crop_size``^3 window, the same for input (``Nbody``, 4 channels) and target
(``Hydro``, 5 channels), transformed by one random element of the cube's symmetry group
(:mod:`utils.symmetry`), vector channels included. Three kinds share that access pattern:

- ``synthetic``: random numbers of the crop's shape, no file access: isolates compute from I/O.
- ``inmem``: both volumes read into memory once; workers share them (fork, copy-on-write).
- ``lowmem``: each crop read from the HDF5 file when needed; each worker opens its own handle.

Workers pass their batches through /dev/shm: their number and prefetch are capped to fit its free
space (:func:`fit_workers_to_shm`), and on a GPU lowmem's start from a forkserver, never from a
process that holds a CUDA context (:func:`worker_context`).

Reproducibility: which crop and which symmetry element a sample gets is a pure function of
(seed, split, epoch, index), drawn by :meth:`CropSpec.draw`. The sampler hands out
``(epoch, index)`` keys, split over ranks by :class:`~torch.utils.data.DistributedSampler`, so
ranks and workers draw different crops, a run is the same for any number of workers, and a
resumed run sees exactly the crops the interrupted one would have seen. Validation uses the
same crops at every pass (epoch key 0, no augmentation), so its losses compare across epochs.

Signals: the worker processes leave SIGTERM and SIGUSR1 to the main process, even when the batch
system sends them to every process of the job (:class:`utils.signals.ShieldedDataLoader`).
"""
import logging
import multiprocessing
import os
import shutil
from dataclasses import dataclass

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler

from utils import symmetry
from utils.errors import UserError
from utils.signals import ShieldedDataLoader

TRAIN_SPLIT, VALID_SPLIT = 0, 1
MAKE_DATA = ("Make the synthetic data set with `python -m utils.generate_data` (it writes "
             "data/synthetic_train.h5 and data/synthetic_valid.h5), or point --train_path and "
             "--val_path at HDF5 files in the real data set's layout.")
# The boxes of domain_demo's 128^3 crops (config/UNet.yaml), in the folder data_large/.
MAKE_LARGE_DATA = ("Make the larger synthetic data set (a 256^3 training and a 128^3 validation box, 1.3 GB "
                   "with their .npy copies) with `python -m utils.generate_data --train_size 256 --val_size 128 "
                   "--out_dir data_large`, or point --train_path and --val_path at other HDF5 files.")


def in_data_large(path):
    return os.path.normpath(path).split(os.sep)[0] == "data_large"


def inspect_volume(path, n_in, n_out):
    """The box side of an HDF5 data file, after checking it has the layout the loaders expect."""
    if not os.path.isfile(path):
        raise UserError(f"The data file {path} does not exist. {MAKE_LARGE_DATA if in_data_large(path) else MAKE_DATA}")
    try:
        with h5py.File(path, "r") as f:
            missing = [name for name in ("Nbody", "Hydro") if name not in f]
            if missing:
                raise UserError(f"The data file {path} has no dataset {' or '.join(missing)} (it holds: "
                                f"{', '.join(f.keys()) or 'nothing'}). The loaders need 'Nbody' of shape "
                                f"({n_in}, L, L, L) and 'Hydro' of shape ({n_out}, L, L, L). {MAKE_DATA}")
            nbody, hydro = f["Nbody"].shape, f["Hydro"].shape
    except OSError as error:
        raise UserError(f"The data file {path} cannot be read as HDF5 ({error}). It may be truncated or "
                        f"not an HDF5 file at all. {MAKE_DATA}") from None
    side = nbody[-1] if nbody else 0
    if nbody != (n_in, side, side, side) or hydro != (n_out, side, side, side):
        raise UserError(f"The data file {path} has datasets of the wrong shape: Nbody {nbody} and Hydro "
                        f"{hydro}, where ({n_in}, L, L, L) and ({n_out}, L, L, L) with one box side L "
                        f"are expected (channel first). {MAKE_DATA}")
    return side


def available_host_memory():
    """Bytes of memory the kernel could give this process now (Linux), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_host_memory(path, side, channels, bytes_per_value, loader):
    """Refuse to load a volume that does not fit in memory, before the kernel kills the process."""
    needed, available = side**3 * channels * bytes_per_value, available_host_memory()
    if available is not None and needed > available:
        raise UserError(f"--data_loader_config={loader} reads the whole volume of {path} ({side}^3 voxels, "
                        f"{needed / 1e9:.1f} GB) into memory, but only {available / 1e9:.1f} GB is available "
                        "here. Use --data_loader_config=lowmem, which reads each crop from disk (or "
                        "dali-lowmem, or gpu-inmem on a GPU with room for it).")


class CropSampler(DistributedSampler):
    """This rank's share of the sample indices, as ``(epoch, index)`` keys.

    ``set_epoch(epoch, start)`` also skips the first ``start`` samples of this rank's share, so a
    run resumed in the middle of an epoch continues where it stopped. ``fixed_epoch`` pins the
    epoch key (validation draws the same crops every time).
    """

    def __init__(self, num_samples, num_replicas, rank, fixed_epoch=None):
        super().__init__(range(num_samples), num_replicas=num_replicas, rank=rank, shuffle=False)
        self.fixed_epoch = fixed_epoch
        self.start = 0

    def set_epoch(self, epoch, start=0):
        super().set_epoch(epoch)
        self.start = start

    def __iter__(self):
        epoch = self.epoch if self.fixed_epoch is None else self.fixed_epoch
        indices = list(super().__iter__())[self.start:]
        return iter([(epoch, index) for index in indices])

    def __len__(self):
        return super().__len__() - self.start


def whole_crop(crop_size):
    """The block that is the whole ``crop_size``^3 crop, ``(start, stop)`` per axis: what a rank reads
    and trains on without domain parallelism."""
    return ((0, crop_size),) * 3


@dataclass(frozen=True)
class CropSpec:
    """How every loader kind cuts and turns a sample; one per split, read by all three loader modules.

    A sample is the ``crop_size``^3 window at a corner drawn uniformly from [0, L - S) per axis (as
    in the original; a crop as large as the box, where the original fails, sits at 0), the same
    for input and target, turned by an element drawn from ``elements``, vector channels included.
    """

    crop_size: int
    box_side: int
    seed: int
    split: int
    elements: tuple
    channel_groups: tuple  # ((channels, velocity triplets) of the input, then of the target)
    block: tuple = None    # domain parallelism: this rank's (start, stop) per axis of the turned crop

    @classmethod
    def from_params(cls, params, split, box_side, augment, source, block=None):
        """The split's specification; refuses a crop larger than the box of ``source`` (a file).
        ``block``: the part of each turned crop this rank trains on (None: all of it)."""
        if params.crop_size > box_side:
            # The advice fits both files: the other split's box may be smaller still.
            other = params.val_path if split == TRAIN_SPLIT else params.train_path
            fits = min(box_side, other_box_side(params, other) or box_side)
            also = f" (and {other} has side {fits})" if fits < box_side else ""
            raise UserError(f"crop_size={params.crop_size} is larger than the box side {box_side} of {source}{also}. "
                            f"Use --crop_size={fits} or less, or larger boxes (python -m "
                            f"utils.generate_data --train_size ... --val_size ... --force).")

        def triplets(channels):
            return (tuple(channels),) if channels else ()

        return cls(params.crop_size, box_side, params.seed, split,
                   tuple(symmetry.group(params.augment if augment else "none")),
                   ((params.N_in_channels, triplets(params.nbody_vector_channels)),
                    (params.N_out_channels, triplets(params.hydro_vector_channels))), block)

    @property
    def corner_high(self):
        """Corners are drawn from [0, corner_high) per axis."""
        return max(self.box_side - self.crop_size, 1)

    def draw(self, key):
        """The crop corner and symmetry element of sample ``key = (epoch, index)``: a pure function of the key."""
        epoch, index = key
        rng = np.random.default_rng((self.seed, self.split, epoch, index))
        corner = rng.integers(0, self.corner_high, size=3)
        element = self.elements[rng.integers(len(self.elements))]
        return corner, element

    def window(self, corner, box=None):
        """The index of the crop at ``corner`` (or of ``box``, ``(start, stop)`` per axis inside
        it) in a channel-first volume."""
        box = box or whole_crop(self.crop_size)
        return (slice(None), *(slice(int(c) + start, int(c) + stop) for c, (start, stop) in zip(corner, box)))

    def source_box(self, element):
        """The box of the unturned crop that holds this rank's block after turning by ``element``
        (None: the whole crop, when there is no block)."""
        return None if self.block is None else symmetry.source_box(element, self.block, self.crop_size)


class RandomCropDataset(Dataset):
    """Samples cut and turned as ``spec`` says; subclasses say where the voxels come from."""

    def __init__(self, spec, num_samples):
        self.spec, self.num_samples = spec, num_samples

    def __len__(self):
        return self.num_samples

    def read_crop(self, corner, key, box=None):
        """Input and target voxels of sample ``key``'s crop at ``corner``, channel first, float32;
        only ``box`` of it when there is one (see :meth:`CropSpec.window`)."""
        raise NotImplementedError

    def __getitem__(self, key):
        corner, element = self.spec.draw(key)
        # Under domain parallelism every rank of a group draws the same corner and element (the key
        # decides both) and reads only the box that becomes its block once turned.
        nbody, hydro = self.read_crop(corner, key, box=self.spec.source_box(element))
        (_, nbody_vectors), (_, hydro_vectors) = self.spec.channel_groups
        nbody = symmetry.apply_numpy(nbody, element, nbody_vectors)
        hydro = symmetry.apply_numpy(hydro, element, hydro_vectors)
        return torch.from_numpy(nbody), torch.from_numpy(hydro)


class SyntheticDataset(RandomCropDataset):
    """Normal random numbers in place of the data, new for every sample: no file access."""

    def read_crop(self, corner, key, box=None):
        rng = np.random.default_rng((self.spec.seed, self.spec.split, *key, 1))
        shape = (self.spec.crop_size,) * 3
        (n_in, _), (n_out, _) = self.spec.channel_groups
        nbody = rng.standard_normal(size=(n_in, *shape), dtype=np.float32)
        hydro = rng.standard_normal(size=(n_out, *shape), dtype=np.float32)
        window = self.spec.window((0, 0, 0), box)  # a block's numbers are those of the whole crop
        return nbody[window], hydro[window]


class InMemoryDataset(RandomCropDataset):
    """Both volumes read into memory when the loader is built."""

    def __init__(self, spec, num_samples, path):
        super().__init__(spec, num_samples)
        channels = sum(n for n, _ in spec.channel_groups)
        check_host_memory(path, spec.box_side, channels, 4, "inmem")
        with h5py.File(path, "r") as f:
            self.nbody = f["Nbody"][...].astype(np.float32, copy=False)
            self.hydro = f["Hydro"][...].astype(np.float32, copy=False)

    def read_crop(self, corner, key, box=None):
        window = self.spec.window(corner, box)
        return self.nbody[window], self.hydro[window]


class LowMemDataset(RandomCropDataset):
    """Each crop read from disk; the HDF5 file is opened lazily, once per worker process."""

    def __init__(self, spec, num_samples, path):
        super().__init__(spec, num_samples)
        self.path = path
        self._datasets, self._pid = None, None

    def read_crop(self, corner, key, box=None):
        # A handle opened before a fork must not be shared, so each process opens its own. The two
        # datasets are looked up once: a lookup by name costs about as much as reading a 32^3 crop.
        if self._pid != os.getpid():
            f = h5py.File(self.path, "r")
            self._datasets, self._pid = (f["Nbody"], f["Hydro"]), os.getpid()
        window = self.spec.window(corner, box)
        return tuple(dataset[window].astype(np.float32, copy=False) for dataset in self._datasets)

    def __getstate__(self):
        # Worker processes started by spawn receive a copy without the open handle.
        return {**self.__dict__, "_datasets": None, "_pid": None}


def other_box_side(params, path):
    """The box side of the HDF5 file ``path``, or None if it cannot be read (the error comes in its turn)."""
    try:
        return inspect_volume(path, params.N_in_channels, params.N_out_channels)
    except (UserError, OSError, KeyError, ValueError):
        return None


def build_dataset(params, path, num_samples, split, augment, block=None):
    """The split's dataset for the native loader kinds (after checking the file's layout)."""
    kind = params.data_loader_config
    if kind == "synthetic":
        return SyntheticDataset(CropSpec.from_params(params, split, params.crop_size, augment, "synthetic",
                                                     block), num_samples)
    box_side = inspect_volume(path, params.N_in_channels, params.N_out_channels)
    spec = CropSpec.from_params(params, split, box_side, augment, path, block)
    return (InMemoryDataset if kind == "inmem" else LowMemDataset)(spec, num_samples, path)


SHM = "/dev/shm"
PREFETCH_FACTOR = 2  # torch's default: batches each worker keeps ready


def shm_free_bytes(path=SHM):
    """Free bytes in the shared-memory filesystem that worker processes pass their batches through
    (None where there is none: then torch falls back to files)."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def fit_workers_to_shm(workers, batch_bytes, ranks_here, free):
    """``(workers, prefetch_factor)`` whose batches in flight fit in /dev/shm.

    Each worker keeps ``prefetch_factor`` batches ready in shared memory: 8 workers x 2 batches of a
    64-sample, 64^3 crop batch (604 MB) hold 9.7 GB, times the ranks of the node. Half of the free
    space is shared among ``ranks_here`` (the rest is for the pinned copies' staging and whatever
    else uses /dev/shm); the prefetch goes down to 1 first, then the workers. ``free`` None: no limit.
    """
    prefetch = PREFETCH_FACTOR
    if not workers or free is None:
        return workers, prefetch if workers else None
    room = free // 2 // max(1, ranks_here)
    while workers and workers * prefetch * batch_bytes > room:
        if prefetch > 1:
            prefetch -= 1
        else:
            workers -= 1
    return workers, prefetch if workers else None


def worker_context(kind, pin_memory, workers):
    """How worker processes start. On a GPU, lowmem and synthetic workers start from a forkserver
    that has imported this module and never touched CUDA, so that no worker is forked from a
    process holding a CUDA context (and the forkserver's imports make each start cheap). inmem keeps
    fork: its workers share the in-memory volumes copy-on-write, which any other start method would
    copy into every worker; they run numpy and h5py only, never CUDA."""
    if not (pin_memory and workers) or kind == "inmem":
        return None
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["utils.data_loader"])
    return context


def get_data_loaders(params, world_rank, world_size, pin_memory, block=None):
    """Training and validation loaders yielding ``(input, target)`` of shape (B, 4|5, S, S, S), or of
    this rank's ``block`` of each crop (domain parallelism: ``world_rank`` and ``world_size`` then
    count the data-parallel groups, whose ranks all draw the same samples)."""
    local_batch_size = params.global_batch_size // world_size
    batch_bytes = local_batch_size * (params.N_in_channels + params.N_out_channels) * params.crop_size**3 * 4
    # Ranks of this node: one per GPU on a GPU, all of them on a CPU machine.
    ranks_here = min(world_size, torch.cuda.device_count()) if pin_memory else world_size
    free = shm_free_bytes()
    workers, prefetch = fit_workers_to_shm(params.num_data_workers, batch_bytes, ranks_here, free)
    if workers != params.num_data_workers or (workers and prefetch != PREFETCH_FACTOR):
        logging.warning("%d workers x %d batches of %.0f MB would not fit in %s (%.1f GB free, %d rank(s) here): "
                        "using %d worker(s) x %s batch(es) in flight", params.num_data_workers, PREFETCH_FACTOR,
                        batch_bytes / 1e6, SHM, free / 1e9, ranks_here, workers, prefetch or 0)
    context = worker_context(params.data_loader_config, pin_memory, workers)
    loaders = []
    for path, num_samples, split in ((params.train_path, params.Nsamples, TRAIN_SPLIT),
                                     (params.val_path, params.Nsamples_val, VALID_SPLIT)):
        is_train = split == TRAIN_SPLIT
        dataset = build_dataset(params, path, num_samples, split, augment=is_train, block=block)
        sampler = CropSampler(num_samples, world_size, world_rank, fixed_epoch=None if is_train else 0)
        loaders.append(ShieldedDataLoader(
            dataset,
            batch_size=local_batch_size,
            sampler=sampler,
            num_workers=workers,
            prefetch_factor=prefetch,
            multiprocessing_context=context,
            pin_memory=pin_memory,  # page-locked buffers: faster, asynchronous copies to the GPU
            persistent_workers=workers > 0,  # keep workers (and their open files) between epochs
            drop_last=is_train,  # every training step sees a full batch
        ))
    return tuple(loaders)
