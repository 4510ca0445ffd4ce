"""The ``gpu-inmem`` loader: both volumes live on the training device, crops are cut there.

Why: the native loaders cut every crop on the host, in worker processes, and copy each batch to
the GPU. When the volumes fit in GPU memory, all of that can go: the volumes are uploaded ONCE,
and a batch is one gather on the device that cuts the crops and applies the symmetry elements
together, plus one pass that orders the channels. No worker processes, no per-step
host-to-device copy, and no host synchronisation per step: corners and element indices are
drawn on the device, and the loop has no data-dependent Python control flow (no ``.item()``, no
``.cpu()``), so the host can run ahead and queue the next batch's gather behind the current
training step.

Memory: the real training box (L = 1024) holds 9 * 1024^3 voxels, 38.7 GB as float32, 19.3 GB
with ``gpu_inmem_dtype: float16`` (or bfloat16); the validation box (L = 512) adds 4.8 GB (2.4 GB), so
the fp32 pair (43.5 GB) does not fit a 40 GB A100 and the 16-bit pair (21.7 GB) does. Batches are returned as float32 whatever the
storage type, so the model sees the same input contract as with every other loader (and the
loss compares against float32 targets); the cast costs one pass over the batch, fused with the
sign flip of the vector channels. Values in (-1, 1) lose precision in storage: bfloat16 keeps 8
significant bits (relative error up to 0.4 %), float16 keeps 11 and, for values this size, has the
range it needs: float16 is the better 16-bit storage here (8 times less rounding error).

Layout on the device: ONE channel-last tensor (L, L, L, 4 + 5) holding input and target. The
gather then needs one index per voxel (B * S^3 int64, not B * C * S^3), and each index fetches
the voxel's nine channels from one place; on the CPU this measured faster than every
channel-first variant tried (one advanced-indexing gather, per-channel ``index_select``). A
second pass picks each output channel (the vector components are permuted per element) and
puts the channels first; with ``--channels_last`` it keeps them last, and hands the batch over
stored as channels_last_3d, the layout the model then trains in.

Reproducibility: the crops of an epoch are drawn at once by a ``torch.Generator`` on the device,
seeded from (seed, split, rank, epoch): ranks draw different crops, a run repeats for a seed on
the same kind of device (CPU and CUDA generators give different streams), and
``sampler.set_epoch(epoch, start)`` resumes exactly where an interrupted epoch stopped, since
the draws do not depend on how many batches were taken. Validation draws its crops once (epoch
key 0) and never augments, so its losses compare across epochs. The crops are not the native
loaders' (those are drawn on the host, sample by sample); for the same corners and elements the
samples are the native ones bit for bit, which the tests check for all 48 elements.

Domain parallelism (``--domain_mesh``): every rank of a domain group uploads the whole volume (the
crops are drawn anywhere in it), draws the same corners and elements (the draws are seeded by the
data-parallel rank), and gathers only its block of each turned crop: the affine map above starts at
the block's first voxel instead of the crop's, over the block's extents. No voxel outside the block
is read, and the block equals that window of the undivided batch bit for bit.
"""
import logging
import math

import h5py
import numpy as np
import torch

from utils import symmetry
from utils.data_loader import (TRAIN_SPLIT, VALID_SPLIT, CropSpec, check_host_memory, inspect_volume,
                               whole_crop)
from utils.errors import UserError

SLAB_BYTES = 256 * 2**20  # upload the volume this many bytes at a time: bounds host memory


def seed_for(*key):
    """A 64-bit seed for a ``torch.Generator`` from a tuple of non-negative ints, well mixed."""
    return int(np.random.SeedSequence(key).generate_state(1, dtype=np.uint64)[0])


class CropAugment:
    """Cut crops from a channel-last volume and apply symmetry elements, batched, on its device.

    ``channel_groups`` splits the volume's channel axis into consecutive groups, one output
    tensor each: ``[(4, [(1, 2, 3)]), (5, [(2, 3, 4)])]`` for input and target, each with its
    own vector-channel triplets (numbered within the group). The per-element tables are built
    once here; a call builds one int64 index of B * S^3 entries (134 MB at B=64, S=64).
    """

    def __init__(self, box_side, crop_size, channel_groups, device, elements=symmetry.ELEMENTS,
                 channels_last=False, block=None):
        block = block or whole_crop(crop_size)
        self.shape = tuple(stop - start for start, stop in block)  # of each output sample
        self.channels_last = channels_last
        device = torch.device(device)
        perm = torch.tensor([e.perm for e in elements])
        signs = torch.tensor([e.signs for e in elements])
        # Flat voxel index in a contiguous (L, L, L) grid: axis a has stride L**(2 - a). Output axis
        # i walks input axis perm[i] from the crop voxel that lands on the block's first voxel: the
        # block's start along i, counted from the crop's far side when signs[i] == -1 (backwards).
        axis_stride = box_side ** (2 - perm)
        start = torch.tensor([first for first, _ in block])
        first_voxel = torch.where(signs < 0, crop_size - 1 - start, start)  # (E, 3)
        self.corner_stride = torch.tensor([box_side**2, box_side, 1], device=device)
        self.voxel_stride = (signs * axis_stride).to(device)  # (E, 3): per output axis
        self.voxel_offset = (first_voxel * axis_stride).sum(1).to(device)  # (E,)
        self.ramps = [torch.arange(side, device=device) for side in self.shape]

        # Output channel c of a group reads channel source[e, c] of the volume, times sign[e, c].
        self.groups = []
        first = 0
        for n_channels, triplets in channel_groups:
            triplets = symmetry._check_vector_channels(triplets, n_channels)  # apply_numpy's own check
            source = torch.arange(first, first + n_channels).repeat(len(elements), 1)
            sign = torch.ones(len(elements), n_channels)
            for e, element in enumerate(elements):
                for triplet in triplets:
                    for i in range(3):
                        source[e, triplet[i]] = first + triplet[element.perm[i]]
                        sign[e, triplet[i]] = element.signs[i]
            # Without vector channels, or with the identity alone, every sign is +1: skip the multiply.
            has_signs = bool((sign < 0).any())
            self.groups.append((source.to(device), sign.to(device) if has_signs else None))
            first += n_channels

    def __call__(self, volume, corners, element_indices):
        """``volume`` (L, L, L, C) on the device, ``corners`` (B, 3) and ``element_indices`` (B,) long.

        Returns one float32 tensor (B, C_k, S, S, S) per channel group (B, C_k, d, h, w with a
        ``block``: its part of each turned crop, cut directly from the volume): contiguous, or stored
        channels-last (channels_last_3d) when made with ``channels_last``, the layout the model
        then trains in, so that nothing transposes the batch on the way in.
        """
        n_batch, shape = len(corners), self.shape
        n_voxels = math.prod(shape)
        stride = self.voxel_stride[element_indices]
        base = (corners * self.corner_stride).sum(1) + self.voxel_offset[element_indices]
        # The source voxel of every (sample, output voxel), by broadcasting the per-sample affine
        # map over the three output axes.
        ramp_d, ramp_h, ramp_w = self.ramps
        voxels = (base.view(-1, 1, 1, 1)
                  + stride[:, 0].view(-1, 1, 1, 1) * ramp_d.view(1, -1, 1, 1)
                  + stride[:, 1].view(-1, 1, 1, 1) * ramp_h.view(1, 1, -1, 1)
                  + stride[:, 2].view(-1, 1, 1, 1) * ramp_w.view(1, 1, 1, -1))
        # Pass 1: one row of all C channels per voxel. Pass 2: per output channel, the right source
        # channel, channels first (the transpose is a view; the indexing writes a contiguous copy).
        rows = volume.view(-1, volume.shape[-1]).index_select(0, voxels.view(-1)).view(n_batch, n_voxels, -1)
        outputs = []
        for source, sign in self.groups:
            if self.channels_last:  # (B, S^3, C_k): each voxel's channels gathered in place
                index = source[element_indices].unsqueeze(1).expand(-1, n_voxels, -1)
                out = torch.gather(rows, 2, index)
                sign_shape = (n_batch, 1, -1)
            else:  # (B, C_k, S^3): channels first
                sample = torch.arange(n_batch, device=volume.device).view(-1, 1)
                out = rows.transpose(1, 2)[sample, source[element_indices]]
                sign_shape = (n_batch, -1, 1)
            if sign is None:
                out = out.float()  # a no-op for float32 storage
            elif out.dtype == torch.float32:
                out.mul_(sign[element_indices].view(sign_shape))  # +-1: exact, like np.negative
            else:
                out = out * sign[element_indices].view(sign_shape)  # promotes: cast and sign in one pass
            if self.channels_last:  # a view: (B, C_k, S, S, S) with channels_last_3d strides
                outputs.append(out.view(n_batch, *shape, -1).permute(0, 4, 1, 2, 3))
            else:
                outputs.append(out.view(n_batch, -1, *shape))
        return outputs


def crop_and_augment(volume, corners, element_indices, crop_size, vector_channels=()):
    """Crops of a channel-last ``volume`` (L, L, L, C) at ``corners`` (B, 3), each transformed by
    ``symmetry.ELEMENTS[element_indices[b]]``: a float32 (B, C, S, S, S) tensor on the volume's device.

    Equal, bit for bit, to ``symmetry.apply_numpy`` on each channel-first window (rounded to the
    storage type first when ``volume`` is bfloat16 or float16). Builds its tables per call: the
    loader keeps a :class:`CropAugment` instead.
    """
    augment = CropAugment(volume.shape[0], crop_size, [(volume.shape[-1], vector_channels)], volume.device)
    return augment(volume, corners, element_indices)[0]


def upload_volume(path, device, dtype):
    """``Nbody`` and ``Hydro`` of ``path`` as ONE channel-last (L, L, L, 4 + 5) tensor on ``device``.

    Read slab by slab along D, so the host never holds more than ``SLAB_BYTES`` of the file; each
    slab goes to the device as it is (one contiguous copy) and is transposed and cast there.
    """
    with h5py.File(path, "r") as f:
        datasets = (f["Nbody"], f["Hydro"])
        side = datasets[0].shape[-1]
        channels = sum(d.shape[0] for d in datasets)
        if torch.device(device).type == "cpu":  # "GPU-resident" on CPU tensors: host memory must hold it
            check_host_memory(path, side, channels, torch.finfo(dtype).bits // 8, "gpu-inmem")
        try:
            volume = torch.empty((side, side, side, channels), dtype=dtype, device=device)
        except torch.cuda.OutOfMemoryError:
            gigabytes = side**3 * channels * torch.finfo(dtype).bits / 8 / 1e9
            raise UserError(f"gpu-inmem needs {gigabytes:.1f} GB of GPU memory for {path} as {dtype}, and "
                            f"{device} does not have that much free (the validation file needs a volume of its "
                            "own too). Use --gpu_inmem_dtype=float16 to halve it (values in (-1, 1) keep 11 "
                            "significant bits: 8 times less rounding error than bfloat16), or a loader that "
                            "reads crops from disk: --data_loader_config=dali-lowmem or lowmem.") from None
        planes = max(1, SLAB_BYTES // (channels * side * side * 4))
        for start in range(0, side, planes):
            stop = min(side, start + planes)
            first = 0
            for dataset in datasets:
                slab = torch.from_numpy(dataset[:, start:stop].astype(np.float32, copy=False)).to(device)
                volume[start:stop, ..., first:first + len(slab)].copy_(slab.permute(1, 2, 3, 0))
                first += len(slab)
    return volume


class DeviceCropSampler:
    """This rank's crop corners and element indices for one epoch, drawn on the device.

    The contract of the native sampler: ``set_epoch(epoch, start)`` chooses the epoch and skips
    the first ``start`` samples (a resumed run); ``len()`` is the number of samples left.
    ``fixed_epoch`` pins the draws (validation).
    """

    def __init__(self, num_samples, spec, rank, device, fixed_epoch=None):
        self.num_samples = num_samples
        self.corner_high = spec.corner_high  # corners uniform in [0, corner_high), as the native loaders'
        self.num_elements = len(spec.elements)
        self.seed, self.split, self.rank = spec.seed, spec.split, rank
        self.device = device
        self.fixed_epoch = fixed_epoch
        self.epoch, self.start = 0, 0
        self._drawn_for, self._draws = None, None

    def set_epoch(self, epoch, start=0):
        self.epoch, self.start = epoch, start

    def __len__(self):
        return self.num_samples - self.start

    def draws(self):
        """``(corners, element_indices)`` of the whole epoch, (N, 3) and (N,) long, on the device."""
        epoch = self.epoch if self.fixed_epoch is None else self.fixed_epoch
        if self._drawn_for != epoch:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(seed_for(self.seed, self.split, self.rank, epoch))
            corners = torch.randint(0, self.corner_high, (self.num_samples, 3), generator=generator,
                                    device=self.device)
            elements = torch.randint(0, self.num_elements, (self.num_samples,), generator=generator,
                                     device=self.device)
            self._drawn_for, self._draws = epoch, (corners, elements)
        return self._draws


class DeviceCropLoader:
    """Yields ``(input, target)`` batches cut from a volume on the device; a DataLoader look-alike."""

    def __init__(self, volume, augment, sampler, batch_size, drop_last):
        self.volume = volume
        self.augment = augment
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __len__(self):
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return math.ceil(len(self.sampler) / self.batch_size)

    def __iter__(self):
        corners, elements = self.sampler.draws()
        start, size = self.sampler.start, self.batch_size
        for batch in range(len(self)):
            # Slices of device tensors with host-known bounds: views, no synchronisation.
            first = start + batch * size
            inputs, targets = self.augment(self.volume, corners[first:first + size],
                                           elements[first:first + size])
            yield inputs, targets


def get_data_loaders(params, world_rank, world_size, device=None, block=None):
    """Training and validation loaders whose batches are cut on ``device`` (the CPU when None), or
    only this rank's ``block`` of each turned crop (domain parallelism: ``world_rank`` and
    ``world_size`` then count the data-parallel groups, whose ranks all draw the same crops)."""
    if device is None:
        device = torch.device("cpu")
    elif isinstance(device, int):
        device = torch.device("cuda", device)
    dtype = getattr(torch, params.gpu_inmem_dtype)
    local_batch_size = params.global_batch_size // world_size
    loaders = []
    for path, num_samples, split in ((params.train_path, params.Nsamples, TRAIN_SPLIT),
                                     (params.val_path, params.Nsamples_val, VALID_SPLIT)):
        is_train = split == TRAIN_SPLIT
        spec = CropSpec.from_params(params, split, inspect_volume(path, params.N_in_channels, params.N_out_channels),
                                    augment=is_train, source=path, block=block)
        volume = upload_volume(path, device, dtype)
        logging.info("gpu-inmem: %s on %s as %s, %.3g GB", path, device, params.gpu_inmem_dtype,
                     volume.numel() * volume.element_size() / 1e9)
        augment = CropAugment(spec.box_side, spec.crop_size, spec.channel_groups, device, spec.elements,
                              channels_last=params.channels_last, block=spec.block)
        # As many samples per rank as the native DistributedSampler gives, so len() agrees.
        sampler = DeviceCropSampler(math.ceil(num_samples / world_size), spec, world_rank, device,
                                    fixed_epoch=None if is_train else 0)
        loaders.append(DeviceCropLoader(volume, augment, sampler, local_batch_size, drop_last=is_train))
    return tuple(loaders)
