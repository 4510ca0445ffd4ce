"""The ``dali-lowmem`` loader: NVIDIA DALI reads crops from .npy files and augments them on the GPU.

Why: a ``lowmem`` worker spends its time in h5py and numpy, one crop at a time. DALI reads the
crops from memory-mapped, channel-last .npy copies of the data (``python -m
utils.convert_h5_to_npy``), uploads them to the GPU and applies the symmetry element there, in
a pipeline that runs ahead of training on its own threads and CUDA stream. Without a GPU the same
pipeline runs in DALI's CPU-only mode (what the tests use).

The pipeline, per sample (input and target alike, with the SAME crop and element):

1. ``fn.readers.numpy`` reads the window ``[corner, corner + S)`` of the (D, H, W, C) file (only
   a box of it under domain parallelism, see below): a region-of-interest read, so only the crop's
   pages are touched, whatever the box size.
2. ``fn.reshape`` gives it the layout "DHWC"; the reader's output has none, and without it the
   geometric operators would take the wrong axes for D, H and W. Then the crop goes to the GPU,
   when there is one, and the rest runs there.
3. ``fn.warp_affine`` with nearest-neighbour sampling moves the
   grid by the element's signed axis permutation, reflections included, in one pass. Its
   matrix maps output voxel centres exactly onto input voxel centres (entries 0 and +-1, shifts
   whole numbers), so the result equals ``symmetry.apply_numpy`` bit for bit. (The original
   tutorial used ``fn.rotate`` and then ``fn.flip`` on the un-rotated volume, which discarded the
   rotation; ``fn.rotate`` plus ``fn.flip`` done right also works, but takes two passes and an
   axis-angle table for the 24 rotations.)
4. ``fn.coord_transform`` with a per-sample C x C matrix, the identity on scalar channels and the
   element's 3 x 3 matrix on each vector triplet, turns the velocity components: output component
   i is ``signs[i]`` times input component ``perm[i]``. One operator for all channels, wherever
   the triplets are, rather than slicing them out and concatenating them back. Exact for finite
   data, since every product is by 0 or +-1, except that an exact zero comes out as +0.0 where
   numpy's negation gives -0.0 (equal as numbers); an infinite value would spread NaN to the
   other channels of its voxel (0 * inf), which data scaled into (-1, 1) never has.
5. ``fn.transpose`` puts the channels first: (C, D, H, W), the model's layout. With
   ``--channels_last`` it is left out: the batch is handed over as a (B, C, D, H, W) view of the
   channel-last buffer (channels_last_3d), the layout the model then trains in.

Domain parallelism (``block``): each rank of a domain group trains on one block of every turned
crop, ``(start, stop)`` per axis D, H, W, as the native loaders do. A rank reads only the box of
the unturned crop that the sample's element turns into its block (:meth:`CropSpec.source_box`),
and the warp maps the block's voxels onto that box (see :func:`warp_matrix`; its output ``size``
is the block's, given in D, H, W order, whereas its matrix is in W, H, D). The box's shape is the
block's permuted by the element, so for a non-cubic block it differs from sample to sample: the
callback hands out each sample's region of interest, start and shape, as two columns. Without
augmentation (validation) the box is the block itself and the read alone cuts it. Without a block
every rank reads and turns the whole crop: the same pipeline, with the whole crop as the block.

Which crop and element a sample gets comes from the native loader's own rule,
:meth:`utils.data_loader.CropSpec.draw` on the keys of a
:class:`utils.data_loader.CropSampler`, computed in an ``external_source`` callback. So
``dali-lowmem`` sees exactly the samples that ``inmem`` and ``lowmem`` see for the same seed and
number of ranks (ranks draw different crops; validation the same crops every pass), and a resumed
run continues with the very batches the interrupted one would have had.

DALI pipelines are stateful and run ahead: the callback is called for a batch or two before the
loop asks for them, across the end of an epoch too. The loader therefore tracks the position
(epoch, sample offset) of the next batch the pipeline will deliver. An epoch that continues where
the pipeline stands (the next epoch after a complete one, or the next validation pass) reuses it;
any other ``set_epoch`` (a resumed run with ``start > 0``, an epoch repeated, a pass broken off)
rebuilds the pipeline at the right position, which costs a second or two, once.
"""
import copy
import math
import os

import numpy as np
import torch

from utils import symmetry
from utils.convert_h5_to_npy import output_paths
from utils.data_loader import TRAIN_SPLIT, VALID_SPLIT, CropSampler, CropSpec, whole_crop
from utils.errors import UserError

DALI_REQUIREMENTS = "requirements-dali.txt"


def import_dali():
    """The DALI modules this loader uses, or a UserError that says how to install them.

    Imported here rather than at the top of the module, so that the project works without DALI
    for every other loader. ``from nvidia.dali import`` looks ``nvidia.dali`` up in ``sys.modules``
    first, which is how the tests simulate a missing DALI.
    """
    try:
        from nvidia.dali import fn, types
        from nvidia.dali.pipeline import Pipeline
    except ImportError as error:
        raise UserError(f"--data_loader_config=dali-lowmem needs NVIDIA DALI, which cannot be imported "
                        f"({error}). Install it with `pip install -r {DALI_REQUIREMENTS}` (about 1 GB; it "
                        "also runs without a GPU), or choose another loader, e.g. "
                        "--data_loader_config=lowmem.") from None
    return fn, types, Pipeline


NPY_KEYS = {TRAIN_SPLIT: ("train_path", "train_path_npy_data", "train_path_npy_label"),
            VALID_SPLIT: ("val_path", "val_path_npy_data", "val_path_npy_label")}


def npy_paths(params, split):
    """The (data, label) .npy paths of a split: the original's keys ``train_path_npy_data`` and
    ``train_path_npy_label`` (``val_...`` for validation), or where the converter writes them by
    default: ``<train_path without .h5>_data.npy`` and ``..._label.npy``, beside the HDF5 file."""
    h5_key, data_key, label_key = NPY_KEYS[split]
    defaults = output_paths(params[h5_key])
    return params[data_key] or defaults[0], params[label_key] or defaults[1]


def inspect_npy(params, split):
    """The box side of a split's pair of channel-last .npy files, after checking they fit the loader."""
    paths = npy_paths(params, split)
    h5_key, data_key, label_key = NPY_KEYS[split]
    command = f"python -m utils.convert_h5_to_npy -i {params[h5_key]} -d Nbody -l Hydro"
    missing = [path for path in paths if not os.path.isfile(path)]
    if missing:
        verb = "does" if len(missing) == 1 else "do"
        raise UserError(f"dali-lowmem reads channel-last .npy copies of the data, and "
                        f"{' and '.join(missing)} {verb} not exist. Make them with `{command}` (it writes "
                        f"them beside the HDF5 file, where the loader looks), or point --{data_key} and "
                        f"--{label_key} at your copies.")
    shapes = []
    for path, channels in zip(paths, (params.N_in_channels, params.N_out_channels)):
        try:
            array = np.load(path, mmap_mode="r")  # reads the header only
        except (OSError, ValueError) as error:
            raise UserError(f"{path} cannot be read as a .npy file ({error}). Make it again with "
                            f"`{command} --force`.") from None
        side = array.shape[0] if array.ndim == 4 else 0
        if array.shape != (side, side, side, channels) or array.dtype != np.float32:
            raise UserError(f"{path} holds a {array.dtype} array of shape {array.shape}, where float32 of "
                            f"shape (L, L, L, {channels}) is expected (channel last). Make it again with "
                            f"`{command} --force`.")
        shapes.append(side)
    if shapes[0] != shapes[1]:
        raise UserError(f"{paths[0]} and {paths[1]} cover different boxes (sides {shapes[0]} and "
                        f"{shapes[1]}). Make both again from one HDF5 file with `{command} --force`.")
    return shapes[0]


def warp_matrix(element, crop_size, block=None):
    """``fn.warp_affine``'s 3 x 4 matrix for ``element`` on an S^3 crop: it maps ``block`` of the
    turned crop (the output; None: the whole crop) onto its source box of the unturned one (the input).

    warp_affine maps each output voxel's centre to the input point it samples, in its (x, y, z) =
    (W, H, D) order, with voxel k's centre at k + 0.5: so the crop's centre is c = S/2 on every axis.
    ``out(R x) = in(x)`` about that centre gives ``X = R^T (Y - c) + c`` between crop coordinates.
    The output and the input start at the block's start b and the box's start a (Y = y + b,
    X = x + a), so ``x = R^T y + R^T (b - c) + c - a``. The shift comes out as 0 along an input axis
    read forwards and as the block's extent along one read reversed: integers, and the linear part
    is 0 and +-1, so every output centre lands exactly on an input centre.
    """
    block = block or whole_crop(crop_size)
    box = symmetry.source_box(element, block, crop_size)
    inverse = element.inverse().matrix  # R^T, axes D, H, W
    centre = np.full(3, crop_size / 2)
    block_start, box_start = (np.array([start for start, _ in b], dtype=np.float64) for b in (block, box))
    shift = inverse @ (block_start - centre) + centre - box_start
    # Axes D, H, W reversed to warp_affine's W, H, D: rows and columns of R^T, entries of the shift.
    matrix = np.concatenate([inverse[::-1, ::-1], shift[::-1, None]], axis=1)
    return np.ascontiguousarray(matrix, dtype=np.float32)


def channel_matrix(element, n_channels, vector_triplets):
    """``fn.coord_transform``'s C x C matrix: scalars kept, each triplet turned by the element."""
    matrix = np.eye(n_channels, dtype=np.float32)
    for triplet in vector_triplets:
        for i in range(3):
            matrix[triplet[i]] = 0
            matrix[triplet[i], triplet[element.perm[i]]] = element.signs[i]
    return matrix


class CropStream:
    """The ``external_source`` callback: per batch, each sample's region of interest (start and
    shape: the crop's corner plus the box its element needs) and element matrices.

    It starts at ``position = (epoch, offset)`` and walks on through the loader's batches and
    epochs (see :meth:`DaliCropLoader.next_position`), independently of the training loop, since
    DALI calls it ahead of time.
    """

    def __init__(self, loader, position):
        self.loader = loader
        self.position = position

    def __call__(self):
        loader = self.loader
        epoch, offset = self.position
        keys = loader.keys(epoch)[offset:offset + loader.batch_size]
        # The tail of a validation pass: padded to a full batch, the padding cut off by the loader.
        keys += keys[-1:] * (loader.batch_size - len(keys))
        corners, elements = zip(*(loader.spec.draw(key) for key in keys))
        boxes = [loader.boxes[element] for element in elements]
        starts = [[int(c) + start for c, (start, _) in zip(corner, box)] for corner, box in zip(corners, boxes)]
        shapes = [[stop - start for start, stop in box] for box in boxes]
        columns = [np.array(starts, dtype=np.int32), np.array(shapes, dtype=np.int32)]
        for table in loader.tables:
            columns.append(np.stack([table[element] for element in elements]))
        self.position = loader.next_position(epoch, offset)
        return columns


class DaliCropLoader:
    """Yields ``(input, target)`` batches from a DALI pipeline; a DataLoader look-alike.

    ``paths`` are the input's and the target's .npy files; ``spec`` (the native loaders'
    :class:`CropSpec`) supplies the crop size, the group of elements, the channel counts and vector
    triplets of input and target, this rank's ``block`` of each crop and ``draw(key)``; ``sampler``
    (a :class:`CropSampler`) this rank's keys and ``set_epoch(epoch, start)``.
    ``device_id`` is the CUDA device, None for DALI's CPU-only mode; ``channels_last`` hands the
    batches over stored channels-last.
    """

    def __init__(self, paths, spec, sampler, batch_size, drop_last, device_id, num_threads, seed,
                 channels_last=False):
        self.channels_last = channels_last
        self.paths = paths
        self.spec = spec
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.device_id = device_id
        self.num_threads = num_threads
        self.seed = seed
        # The block this rank trains on, and per element the box of the unturned crop it reads.
        self.block = spec.block or whole_crop(spec.crop_size)
        self.boxes = {e: symmetry.source_box(e, self.block, spec.crop_size) for e in spec.elements}
        # Per-element arrays that the callback hands out after the regions of interest, one column
        # each: the warp matrix, then a channel matrix per output with vector channels. Without
        # augmentation (the identity alone) there are none, and the pipeline has no geometric operators.
        self.tables = []
        self.vector_outputs = []
        if len(spec.elements) > 1:
            self.tables.append({e: warp_matrix(e, spec.crop_size, spec.block) for e in spec.elements})
            for index, (n_channels, triplets) in enumerate(spec.channel_groups):
                if triplets:
                    self.vector_outputs.append(index)
                    self.tables.append({e: channel_matrix(e, n_channels, triplets) for e in spec.elements})
        self._pipeline = None
        self._next = None  # (epoch, offset) of the batch the pipeline delivers next
        self._keys = (None, [])  # (epoch, this rank's keys of that epoch)

    # ------------------------------------------------------------------ positions and keys

    def keys(self, epoch):
        """This rank's ``(epoch, index)`` keys of an epoch, from a copy of the sampler (DALI runs ahead)."""
        if self._keys[0] != epoch:  # the stream only moves forwards: one epoch is enough to keep
            sampler = copy.copy(self.sampler)
            sampler.set_epoch(epoch, start=0)
            self._keys = (epoch, list(sampler))
        return self._keys[1]

    def next_position(self, epoch, offset):
        """The position after the batch at ``(epoch, offset)``: the next batch, or the next epoch's first."""
        offset += self.batch_size
        remaining = self.sampler.num_samples - offset
        if remaining <= 0 or (self.drop_last and remaining < self.batch_size):
            return (epoch if self.sampler.fixed_epoch is not None else epoch + 1), 0
        return epoch, offset

    def __len__(self):
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return math.ceil(len(self.sampler) / self.batch_size)

    # ------------------------------------------------------------------ the pipeline

    def build_pipeline(self, position):
        """A DALI pipeline whose first batch is the one at ``position``."""
        fn, types, Pipeline = import_dali()
        # warp_affine's output size is in the layout's order, D, H, W (its matrix is in W, H, D).
        block_shape = [stop - start for start, stop in self.block]
        # exec_dynamic: every batch's outputs are new buffers, alive while a tensor refers to them,
        # so the zero-copy torch tensors stay valid after the next run() (see run_pipeline).
        pipeline = Pipeline(batch_size=self.batch_size, num_threads=self.num_threads,
                            device_id=self.device_id, seed=self.seed, exec_dynamic=True)
        with pipeline:
            columns = fn.external_source(source=CropStream(self, position), num_outputs=2 + len(self.tables),
                                         batch=True)
            roi_start, roi_shape, extra = columns[0], columns[1], list(columns[2:])
            warp = extra.pop(0) if self.tables else None
            outputs = []
            for index, path in enumerate(self.paths):
                volume = fn.readers.numpy(file_root=os.path.dirname(path), files=[os.path.basename(path)],
                                          roi_start=roi_start, roi_shape=roi_shape, roi_axes=[0, 1, 2],
                                          cache_header_information=True)
                volume = fn.reshape(volume, layout="DHWC")
                if self.device_id is not None:
                    volume = volume.gpu()
                if warp is not None:
                    volume = fn.warp_affine(volume, matrix=warp, size=block_shape, interp_type=types.INTERP_NN)
                if index in self.vector_outputs:
                    volume = fn.coord_transform(volume, M=extra.pop(0))
                outputs.append(volume if self.channels_last else fn.transpose(volume, perm=[3, 0, 1, 2]))
            pipeline.set_outputs(*outputs)
        pipeline.build()
        return pipeline

    def run_pipeline(self):
        """One batch as torch tensors: zero-copy through DLPack, on the GPU bound to torch's stream.

        With DALI's dynamic executor the tensors keep their buffers: a whole epoch's batches can be
        held and stay intact (the tests compare them with the native loader's after the epoch).
        """
        if self.device_id is None:
            return [torch.from_dlpack(output.as_tensor()) for output in self._pipeline.run()]
        # No host synchronisation: the outputs are ordered on torch's current stream of the device.
        with torch.cuda.device(self.device_id):
            outputs = self._pipeline.run(torch.cuda.current_stream())
            return [torch.from_dlpack(output.as_tensor()) for output in outputs]

    def __iter__(self):
        # Positioned here rather than at the first batch, so that a (re)build happens when the
        # iterator is made, not inside whatever times the first batch (e.g. a benchmark trial).
        epoch = self.sampler.epoch if self.sampler.fixed_epoch is None else self.sampler.fixed_epoch
        position = (epoch, self.sampler.start)
        if self._pipeline is None or self._next != position:
            self._pipeline = None  # free the old pipeline before building the new one
            self._pipeline = self.build_pipeline(position)
            self._next = position
        return self._batches(len(self))

    def _batches(self, count):
        for _ in range(count):
            inputs, targets = self.run_pipeline()
            if self.channels_last:  # (B, D, H, W, C) as a (B, C, D, H, W) view: channels_last_3d strides
                inputs, targets = inputs.permute(0, 4, 1, 2, 3), targets.permute(0, 4, 1, 2, 3)
            real = min(self.batch_size, self.sampler.num_samples - self._next[1])
            self._next = self.next_position(*self._next)
            yield inputs[:real], targets[:real]


def device_index(device):
    """The CUDA index DALI needs for ``device`` (a torch.device, an int or None); None for the CPU."""
    if device is None:
        return None
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def get_data_loaders(params, world_rank, world_size, device=None, block=None):
    """Training and validation loaders reading the .npy copies of ``train_path`` and ``val_path``; of
    this rank's ``block`` of each crop under domain parallelism (``world_rank`` and ``world_size`` then
    count the data-parallel groups, whose ranks all draw the same samples)."""
    import_dali()  # a clear message before anything else when DALI is missing
    device_id = device_index(device)
    local_batch_size = params.global_batch_size // world_size
    loaders = []
    for num_samples, split in ((params.Nsamples, TRAIN_SPLIT), (params.Nsamples_val, VALID_SPLIT)):
        is_train = split == TRAIN_SPLIT
        paths = npy_paths(params, split)
        spec = CropSpec.from_params(params, split, inspect_npy(params, split), augment=is_train, source=paths[0],
                                    block=block)
        sampler = CropSampler(num_samples, world_size, world_rank, fixed_epoch=None if is_train else 0)
        # The crops come from the callback; this seed is for DALI's own state, distinct per rank.
        seed = int(np.random.SeedSequence((params.seed, split, world_rank)).generate_state(1)[0])
        loaders.append(DaliCropLoader(paths, spec, sampler, local_batch_size, drop_last=is_train,
                                      device_id=device_id, num_threads=max(1, params.num_data_workers),
                                      seed=seed, channels_last=params.channels_last))
    return tuple(loaders)
