"""The symmetry group of the cube, applied to data samples the way the physics demands.

Why this module exists
----------------------
A periodic box of the universe has no preferred orientation, so a rotated or mirrored
crop is as valid a training sample as the original. Augmenting with the 48 symmetries of
the cube (24 proper rotations, each with or without a reflection) multiplies the data
for free, but only if two rules are kept:

1. input and target get the SAME element, or the network learns to map a field to a
   rotated copy of its partner;
2. vector channels (velocities) are transformed as vectors, v'(x) = R v(R^-1 x): the grid
   moves AND the components are permuted and sign-flipped. Moving the components around
   like scalars produces fields that no simulation could output (a flow pointing the
   wrong way relative to its own density gradient).

Every data loader of the project (numpy in worker processes, a batched torch one on the
GPU, a DALI one) takes its convention from here, so it is spelled out exactly.

Convention
----------
An element is a pair ``(perm, signs)``: ``perm`` a permutation of ``(0, 1, 2)`` and
``signs`` a triple of +1/-1. Spatial axes are numbered 0, 1, 2 = D, H, W, which are
array axes 1, 2, 3 of a channel-first ``(C, D, H, W)`` sample.

* Scalar field ``a`` of shape ``(D, H, W)``: output spatial axis ``i`` is input spatial
  axis ``perm[i]``, reversed when ``signs[i] == -1``. In numpy::

      out = np.transpose(a, perm)
      out = np.flip(out, axis=[i for i in range(3) if signs[i] == -1])

  On a non-cubic crop the transpose permutes the shape: the output has spatial shape
  ``(shape[perm[0]], shape[perm[1]], shape[perm[2]])``.
* Matrix: ``R[i, perm[i]] = signs[i]``, zeros elsewhere. With coordinates measured from
  the centre of the crop (voxel ``k`` along an axis of length ``n`` sits at
  ``k - (n - 1) / 2``), the voxel at ``x`` lands at ``y = R x``: ``out(R x) = a(x)``.
* Vector field with components along spatial axes 0, 1, 2 stored in channels
  ``(c0, c1, c2)``: output component ``i`` is ``signs[i]`` times input component
  ``perm[i]``, each component's grid transformed as a scalar field. This is
  ``v'(y) = R v(R^-1 y)``.
* Identity: ``perm=(0, 1, 2), signs=(1, 1, 1)``. Proper rotations have ``det R = +1``.
* Composition: ``a.compose(b)`` is ``a ∘ b``, "apply ``b`` first, then ``a``"; its matrix
  is ``a.matrix @ b.matrix``, and ``apply(a, apply(b, x)) == apply(a.compose(b), x)``.

Order of :data:`ELEMENTS` (fixed, so an index means the same element in every loader and
every run): the 24 proper rotations first, then the 24 improper ones; within each half,
``perm`` in lexicographic order of ``itertools.permutations((0, 1, 2))`` and, for each
``perm``, ``signs`` in the order of ``itertools.product((1, -1), repeat=3)``. Index 0 is
the identity, and :data:`ROTATIONS` is ``ELEMENTS[:24]``, so an index into
:data:`ROTATIONS` is also an index into :data:`ELEMENTS`.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from utils.errors import UserError


@dataclass(frozen=True)
class SymmetryElement:
    """One of the 48 signed axis permutations; see the module docstring for the convention.

    Frozen and hashable so that elements can key caches and be compared with ``==``.
    """

    perm: tuple[int, int, int]
    signs: tuple[int, int, int]

    def __post_init__(self):
        # Normalise to tuples of plain ints so that lists or numpy integers given by a
        # caller still hash and compare equal to the canonical elements.
        perm = tuple(int(p) for p in self.perm)
        signs = tuple(int(s) for s in self.signs)
        if sorted(perm) != [0, 1, 2]:
            raise ValueError(f"perm must be a permutation of (0, 1, 2), got {self.perm}")
        if len(signs) != 3 or any(s not in (1, -1) for s in signs):
            raise ValueError(f"signs must be three values of +1 or -1, got {self.signs}")
        object.__setattr__(self, "perm", perm)
        object.__setattr__(self, "signs", signs)

    @classmethod
    def from_matrix(cls, matrix) -> SymmetryElement:
        """The element whose matrix is ``matrix`` (a 3x3 signed permutation matrix)."""
        matrix = np.asarray(matrix)
        if matrix.shape != (3, 3):
            raise ValueError(f"expected a 3x3 matrix, got shape {matrix.shape}")
        # Read perm and signs off the largest entry of each row, then check that the
        # element rebuilds exactly this matrix, which rejects anything else.
        perm = tuple(int(np.argmax(np.abs(row))) for row in matrix)
        signs = tuple(1 if matrix[i, p] > 0 else -1 for i, p in enumerate(perm))
        try:
            element = cls(perm, signs)
        except ValueError:
            element = None
        if element is None or not np.array_equal(element.matrix, matrix):
            raise ValueError(f"not a signed permutation matrix: {matrix.tolist()}")
        return element

    @property
    def matrix(self) -> np.ndarray:
        """The 3x3 integer matrix R with ``R[i, perm[i]] = signs[i]``; ``y = R x``."""
        matrix = np.zeros((3, 3), dtype=np.int64)
        for i in range(3):
            matrix[i, self.perm[i]] = self.signs[i]
        return matrix

    @property
    def det(self) -> int:
        """det R: the parity of the permutation times the product of the signs."""
        # Count inversions rather than calling np.linalg.det, so the answer is an exact int.
        inversions = sum(self.perm[i] > self.perm[j] for i in range(3) for j in range(i + 1, 3))
        return (-1) ** inversions * self.signs[0] * self.signs[1] * self.signs[2]

    @property
    def is_proper(self) -> bool:
        """True for a proper rotation (det R = +1), False when a reflection is involved."""
        return self.det == 1

    def compose(self, other: SymmetryElement) -> SymmetryElement:
        """``self ∘ other``: apply ``other`` first, then ``self`` (matrix ``R_self @ R_other``).

        From ``y = R_other x``, ``y_j = s_o[j] x[p_o[j]]``, and ``z_i = s_s[i] y[p_s[i]]``
        follows ``z_i = s_s[i] s_o[p_s[i]] x[p_o[p_s[i]]]``.
        """
        perm = tuple(other.perm[self.perm[i]] for i in range(3))
        signs = tuple(self.signs[i] * other.signs[self.perm[i]] for i in range(3))
        return SymmetryElement(perm, signs)

    def inverse(self) -> SymmetryElement:
        """The element undoing this one; its matrix is the transpose ``R.T``."""
        perm = [0, 0, 0]
        signs = [0, 0, 0]
        for i in range(3):
            # R[i, perm[i]] = signs[i] becomes R.T[perm[i], i] = signs[i].
            perm[self.perm[i]] = i
            signs[self.perm[i]] = self.signs[i]
        return SymmetryElement(tuple(perm), tuple(signs))


def _all_elements() -> tuple[SymmetryElement, ...]:
    """The 48 elements in the documented order: proper first, then permutation, then signs."""
    elements = [
        SymmetryElement(perm, signs)
        for perm in itertools.permutations((0, 1, 2))
        for signs in itertools.product((1, -1), repeat=3)
    ]
    # sorted() is stable, so the lexicographic order survives within each half.
    return tuple(sorted(elements, key=lambda e: not e.is_proper))


ELEMENTS: tuple[SymmetryElement, ...] = _all_elements()
ROTATIONS: tuple[SymmetryElement, ...] = ELEMENTS[:24]
IDENTITY: SymmetryElement = ELEMENTS[0]

# The prefix of ELEMENTS that forms each group; the ordering of ELEMENTS makes each group
# a prefix, so group indices and ELEMENTS indices coincide.
_GROUP_SIZES = {"full": 48, "rotations": 24, "none": 1}


def group(kind: str) -> tuple[SymmetryElement, ...]:
    """The elements a loader may draw from: ``"full"`` (48), ``"rotations"`` (24), ``"none"`` (1).

    The kind usually comes from a config file, so a wrong one is a :class:`UserError`.
    """
    if kind not in _GROUP_SIZES:
        valid = ", ".join(repr(k) for k in _GROUP_SIZES)
        raise UserError(f"unknown symmetry group {kind!r}: the valid kinds are {valid}.")
    return ELEMENTS[: _GROUP_SIZES[kind]]


def matrices(elements: Sequence[SymmetryElement] = ELEMENTS) -> np.ndarray:
    """The matrices of ``elements`` stacked as an ``(N, 3, 3)`` int64 array (e.g. for DALI)."""
    return np.stack([e.matrix for e in elements])


def random_element_indices(
    generator: np.random.Generator, n: int, kind: str = "full"
) -> np.ndarray:
    """``n`` independent, uniform draws from ``group(kind)``, as int64 indices into ELEMENTS.

    Indices rather than elements, so that a batch of them can go straight to
    :func:`apply_torch` as one tensor. The caller owns the generator, which keeps the
    augmentation reproducible per worker and per epoch.
    """
    return generator.integers(0, len(group(kind)), size=n, dtype=np.int64)


def random_element(generator: np.random.Generator, kind: str = "full") -> SymmetryElement:
    """One uniform draw from ``group(kind)``, for loaders that augment sample by sample."""
    return ELEMENTS[int(random_element_indices(generator, 1, kind)[0])]


def source_box(element: SymmetryElement, block, size: int) -> tuple[tuple[int, int], ...]:
    """The box of an unturned ``size``^3 crop that ``element`` turns into ``block`` of the turned one.

    ``block`` is ``(start, stop)`` along each axis of the turned crop (one rank's block under domain
    parallelism); the answer is ``(start, stop)`` along each axis of the crop before turning, so that
    ``apply_numpy(crop[box], element) == apply_numpy(crop, element)[block]``: a rank reads only its
    box and turns only that. Output axis ``i`` reads input axis ``perm[i]``, reversed when
    ``signs[i] == -1``.
    """
    box = [None, None, None]
    for i, (start, stop) in enumerate(block):
        box[element.perm[i]] = (start, stop) if element.signs[i] == 1 else (size - stop, size - start)
    return tuple(box)


def _check_vector_channels(vector_channels, n_channels: int) -> tuple[tuple[int, int, int], ...]:
    """Normalise ``vector_channels`` to a tuple of int triplets and reject impossible ones.

    A channel listed twice would be overwritten by whichever triplet comes last, which
    silently corrupts a sample, so overlaps are an error rather than a surprise.
    """
    triplets = tuple(tuple(int(c) for c in triplet) for triplet in vector_channels)
    seen = set()
    for triplet in triplets:
        if len(triplet) != 3:
            raise ValueError(f"a vector field needs 3 channels, got {triplet}")
        for c in triplet:
            if not 0 <= c < n_channels:
                raise ValueError(f"vector channel {c} is out of range for {n_channels} channels")
            if c in seen:
                raise ValueError(f"channel {c} appears twice in vector_channels {triplets}")
            seen.add(c)
    return triplets


def apply_numpy(
    volume: np.ndarray,
    element: SymmetryElement,
    vector_channels: Sequence[Sequence[int]] = (),
) -> np.ndarray:
    """Apply ``element`` to one ``(C, D, H, W)`` sample; returns a new C-contiguous array.

    ``vector_channels`` lists channel triplets holding vector fields with components along
    spatial axes 0, 1, 2 (e.g. ``[(1, 2, 3)]``); every other channel is a scalar. The dtype
    is kept, and non-cubic crops are fine: their spatial shape is permuted with ``perm``.
    """
    if volume.ndim != 4:
        raise ValueError(f"expected a (C, D, H, W) array, got shape {volume.shape}")
    triplets = _check_vector_channels(vector_channels, volume.shape[0])

    # Move the grid: transpose the spatial axes (channel axis stays first), then reverse
    # the output axes whose sign is -1. Both are views; the copies below make it real.
    moved = np.transpose(volume, (0,) + tuple(1 + p for p in element.perm))
    flip_axes = tuple(1 + i for i in range(3) if element.signs[i] == -1)
    if flip_axes:
        moved = np.flip(moved, axis=flip_axes)
    # One pass over the voxels, channel by channel, into a new C-order array (torch.from_numpy and
    # pinned-memory transfers want contiguous data; the caller may modify it freely): a vector
    # field's components are permuted and negated on the way, instead of in a second pass.
    out = np.empty(moved.shape, dtype=volume.dtype)
    plan = _channel_plan(element, triplets, volume.shape[0])
    if plan is None:  # scalars only, or an element that leaves the vectors as they are
        out[...] = moved
        return out
    for channel, (source, sign) in enumerate(plan):
        if sign == 1:
            out[channel] = moved[source]
        else:  # negation is exact, which is what lets apply_torch agree bit for bit
            np.negative(moved[source], out=out[channel])
    return out


@functools.lru_cache(maxsize=1024)
def _channel_plan(element, triplets, n_channels):
    """``(input channel, sign)`` of each output channel: out component i of a vector field is
    ``signs[i]`` times input component ``perm[i]``; scalars stay where they are. None when every
    channel stays where it is, unchanged."""
    plan = [(channel, 1) for channel in range(n_channels)]
    for triplet in triplets:
        for i in range(3):
            plan[triplet[i]] = (triplet[element.perm[i]], element.signs[i])
    return None if plan == [(channel, 1) for channel in range(n_channels)] else tuple(plan)


@functools.lru_cache(maxsize=64)
def _torch_tables(elements, size: int, n_channels: int, triplets, device: torch.device):
    """Per-element lookup tables for :func:`apply_torch`, built once per configuration.

    For element e the output voxel at spatial index (y0, y1, y2) reads the input voxel at
    flat index ``base[e] + stride[e, 0] * y0 + stride[e, 1] * y1 + stride[e, 2] * y2``:
    along output axis i the input index is ``y_i`` on axis ``perm[i]`` (or ``size - 1 - y_i``
    when ``signs[i] == -1``), and axis ``a`` of a contiguous cube has stride ``size**(2 - a)``.
    Output channel c reads input channel ``channel_source[e, c]`` times ``channel_sign[e, c]``.
    These tables are tiny (a few ints per element); the per-voxel index is built per batch.
    """
    n = len(elements)
    base = torch.zeros(n, dtype=torch.long)
    stride = torch.zeros(n, 3, dtype=torch.long)
    channel_source = torch.arange(n_channels, dtype=torch.long).repeat(n, 1)
    channel_sign = torch.ones(n, n_channels, dtype=torch.long)
    for e, element in enumerate(elements):
        for i in range(3):
            axis_stride = size ** (2 - element.perm[i])
            if element.signs[i] == 1:
                stride[e, i] = axis_stride
            else:
                stride[e, i] = -axis_stride
                base[e] += (size - 1) * axis_stride
        for triplet in triplets:
            for i in range(3):
                channel_source[e, triplet[i]] = triplet[element.perm[i]]
                channel_sign[e, triplet[i]] = element.signs[i]
    ramp = torch.arange(size, dtype=torch.long)
    return tuple(t.to(device) for t in (base, stride, channel_source, channel_sign, ramp))


def apply_torch(
    batch: torch.Tensor,
    element_indices: torch.Tensor,
    vector_channels: Sequence[Sequence[int]] = (),
    elements: Sequence[SymmetryElement] = ELEMENTS,
) -> torch.Tensor:
    """Apply ``elements[element_indices[b]]`` to sample ``b`` of a ``(B, C, S, S, S)`` batch.

    Same result as :func:`apply_numpy` on each sample, bit for bit, on any device, for use
    by a loader that keeps its data on the GPU. Crops must be cubic so that every sample
    keeps the batch's shape. There is no loop over the batch and no host synchronisation:
    one advanced-indexing read does ``out[b, c, y] = batch[b, src_c(b, c), src_y(b, y)]``,
    followed (only when there are vector channels) by one in-place multiply by the
    per-sample, per-channel sign.

    Memory: besides the output, one int64 index of ``B * S**3`` entries is built per call
    (8 bytes per voxel per sample; 134 MB for B=64, S=64, against 604 MB for a float32
    batch with C=9), plus a few cached ints per element. A table of per-element voxel
    indices would cost ``len(elements) * S**3 * 8`` bytes (100 MB at S=64) and still need
    the per-batch gather, so it is not kept.

    Indices out of range are not checked here (checking would need a host sync); on CUDA
    they trigger a device-side assert.
    """
    if batch.ndim != 5:
        raise ValueError(f"expected a (B, C, D, H, W) tensor, got shape {tuple(batch.shape)}")
    n_batch, n_channels, depth, height, width = batch.shape
    if not depth == height == width:
        raise ValueError(
            f"apply_torch needs cubic crops (D == H == W), got {(depth, height, width)}; "
            "a rotation would change the shape of some samples but not others"
        )
    if element_indices.shape != (n_batch,):
        raise ValueError(
            f"expected {n_batch} element indices, got shape {tuple(element_indices.shape)}"
        )
    triplets = _check_vector_channels(vector_channels, n_channels)
    size = depth
    base, stride, channel_source, channel_sign, ramp = _torch_tables(
        tuple(elements), size, n_channels, triplets, batch.device
    )
    # A no-op when the indices already live on the batch's device, as they should.
    indices = element_indices.to(device=batch.device, dtype=torch.long)

    # Flat input voxel for every (sample, output voxel), by broadcasting the per-sample
    # affine map over the three output axes: shape (B, S, S, S), then (B, 1, S**3).
    b_stride = stride[indices]
    source_voxel = (
        base[indices].view(-1, 1, 1, 1)
        + b_stride[:, 0].view(-1, 1, 1, 1) * ramp.view(1, -1, 1, 1)
        + b_stride[:, 1].view(-1, 1, 1, 1) * ramp.view(1, 1, -1, 1)
        + b_stride[:, 2].view(-1, 1, 1, 1) * ramp.view(1, 1, 1, -1)
    ).view(n_batch, 1, -1)
    sample = torch.arange(n_batch, device=batch.device).view(-1, 1, 1)
    source_channel = channel_source[indices].view(n_batch, n_channels, 1)

    # One read for the whole batch; the three index tensors broadcast to (B, C, S**3).
    flat = batch.reshape(n_batch, n_channels, -1)
    out = flat[sample, source_channel, source_voxel]
    if triplets:
        # Multiplying by +1 or -1 is exact, so this matches np.negative in apply_numpy.
        out.mul_(channel_sign[indices].to(batch.dtype).view(n_batch, n_channels, 1))
    return out.view(n_batch, n_channels, size, size, size)
