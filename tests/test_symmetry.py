"""Tests of utils/symmetry.py: the group structure, the documented convention, and the physics.

The physics tests build fields whose relation is known exactly (a velocity that is the
gradient of a potential, a target computed voxelwise from its input) and check that
augmentation keeps the relation. Each of them also checks that a wrong treatment breaks
it, so none can pass by testing nothing.
"""
import itertools

import numpy as np
import pytest
import torch

from conftest import needs_cuda
from utils.errors import UserError
from utils.symmetry import (
    ELEMENTS,
    IDENTITY,
    ROTATIONS,
    SymmetryElement,
    apply_numpy,
    apply_torch,
    group,
    matrices,
    random_element,
    random_element_indices,
    source_box,
)


def centred_coordinates(shape):
    """Three arrays of the given spatial shape holding each voxel's centred coordinate per axis."""
    axes = [np.arange(n) - (n - 1) / 2 for n in shape]
    return np.stack(np.meshgrid(*axes, indexing="ij"))


def periodic_gradient(phi):
    """Central-difference gradient on a periodic grid, one component per spatial axis."""
    return np.stack([(np.roll(phi, -1, axis=a) - np.roll(phi, 1, axis=a)) / 2 for a in range(3)])


def smooth_periodic_field(n, seed=0):
    """A smooth, periodic scalar field on an n**3 grid with no symmetry of the cube of its own."""
    rng = np.random.default_rng(seed)
    x = 2 * np.pi * np.stack(np.meshgrid(*[np.arange(n) / n] * 3, indexing="ij"))
    phi = np.zeros((n, n, n))
    for _ in range(6):
        k = rng.integers(-2, 3, size=3)
        phase = rng.uniform(0, 2 * np.pi)
        phi += rng.normal() * np.cos(np.tensordot(k, x, axes=1) + phase)
    return phi


# --- group structure ---------------------------------------------------------------------


def test_elements_are_the_48_distinct_signed_permutations_in_documented_order():
    assert len(ELEMENTS) == 48
    assert len(set(ELEMENTS)) == 48
    assert ELEMENTS[0] == IDENTITY == SymmetryElement((0, 1, 2), (1, 1, 1))
    expected = [
        SymmetryElement(p, s)
        for proper in (True, False)
        for p in itertools.permutations((0, 1, 2))
        for s in itertools.product((1, -1), repeat=3)
        if SymmetryElement(p, s).is_proper == proper
    ]
    assert list(ELEMENTS) == expected


def test_exactly_24_proper_rotations_and_rotations_constant():
    proper = [e for e in ELEMENTS if e.is_proper]
    assert len(proper) == 24
    assert ROTATIONS == ELEMENTS[:24]
    assert ROTATIONS[0] == IDENTITY
    assert all(e.is_proper for e in ROTATIONS)
    for e in ELEMENTS:
        assert e.det == round(np.linalg.det(e.matrix)) in (1, -1)
        assert e.is_proper == (e.det == 1)


def test_closure_and_compose_matches_matrix_product():
    members = set(ELEMENTS)
    for a, b in itertools.product(ELEMENTS, repeat=2):
        c = a.compose(b)
        assert c in members
        np.testing.assert_array_equal(c.matrix, a.matrix @ b.matrix)
    # Rotations form a subgroup too.
    assert all(a.compose(b) in set(ROTATIONS) for a, b in itertools.product(ROTATIONS, repeat=2))


def test_identity_and_inverses():
    for e in ELEMENTS:
        assert e.compose(IDENTITY) == e == IDENTITY.compose(e)
        assert e.compose(e.inverse()) == IDENTITY == e.inverse().compose(e)
        np.testing.assert_array_equal(e.inverse().matrix, e.matrix.T)


def test_matrix_definition_and_from_matrix_round_trip():
    for e in ELEMENTS:
        m = e.matrix
        assert m.dtype.kind == "i"
        for i in range(3):
            assert m[i, e.perm[i]] == e.signs[i]
        assert np.count_nonzero(m) == 3
        assert SymmetryElement.from_matrix(m) == e
    np.testing.assert_array_equal(matrices(), np.stack([e.matrix for e in ELEMENTS]))
    with pytest.raises(ValueError):
        SymmetryElement.from_matrix([[1, 1, 0], [0, 1, 0], [0, 0, 1]])
    with pytest.raises(ValueError):
        SymmetryElement((0, 0, 1), (1, 1, 1))
    with pytest.raises(ValueError):
        SymmetryElement((0, 1, 2), (1, 2, 1))


def test_group_kinds_and_unknown_kind():
    assert len(group("full")) == 48 and group("full") == ELEMENTS
    assert len(group("rotations")) == 24 and group("rotations") == ROTATIONS
    assert group("none") == (IDENTITY,)
    with pytest.raises(UserError) as excinfo:
        group("octahedral")
    message = str(excinfo.value)
    assert "octahedral" in message
    for kind in ("full", "rotations", "none"):
        assert repr(kind) in message


def test_random_element_indices_stay_in_their_group_and_cover_it():
    rng = np.random.default_rng(0)
    for kind, size in (("full", 48), ("rotations", 24), ("none", 1)):
        indices = random_element_indices(rng, 2000, kind)
        assert indices.shape == (2000,) and indices.dtype == np.int64
        assert set(indices.tolist()) == set(range(size))
        assert all(ELEMENTS[i] in group(kind) for i in set(indices.tolist()))
    assert random_element(rng, "rotations").is_proper
    # The same seed gives the same draws: augmentation is reproducible.
    a = random_element_indices(np.random.default_rng(7), 10)
    b = random_element_indices(np.random.default_rng(7), 10)
    np.testing.assert_array_equal(a, b)


# --- the convention on arrays ------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 4, 4), (3, 4, 5)])
def test_scalar_application_matches_coordinate_map(shape):
    # Each channel holds a centred coordinate of its voxel, moved as a scalar: after the
    # transform the voxel at output position y must carry source coordinates x with y = R x.
    coords = centred_coordinates(shape)
    for e in ELEMENTS:
        out = apply_numpy(coords, e)
        out_shape = tuple(shape[p] for p in e.perm)
        assert out.shape == (3,) + out_shape
        y = centred_coordinates(out_shape)
        np.testing.assert_array_equal(np.einsum("ij,j...->i...", e.matrix, out), y)


@pytest.mark.parametrize("shape", [(4, 4, 4), (3, 4, 5)])
def test_position_field_is_equivariant(shape):
    # The position field v(x) = x is a vector field that every symmetry maps to itself:
    # R v(R^-1 y) = y. Treated as a vector, it must come out as the output's own grid.
    coords = centred_coordinates(shape)
    for e in ELEMENTS:
        out = apply_numpy(coords, e, vector_channels=[(0, 1, 2)])
        np.testing.assert_array_equal(out, centred_coordinates(out.shape[1:]))


def test_numpy_definition_transpose_then_flip():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(3, 4, 5))
    for e in ELEMENTS:
        expected = np.transpose(a, e.perm)
        for i in range(3):
            if e.signs[i] == -1:
                expected = np.flip(expected, axis=i)
        np.testing.assert_array_equal(apply_numpy(a[None], e)[0], expected)


def test_composition_of_applications_is_application_of_composition():
    rng = np.random.default_rng(2)
    volume = rng.normal(size=(5, 3, 4, 5))
    vectors = [(1, 2, 4)]  # deliberately not adjacent channels
    order_matters = False
    for a, b in itertools.product(ELEMENTS, repeat=2):
        twice = apply_numpy(apply_numpy(volume, b, vectors), a, vectors)
        np.testing.assert_array_equal(twice, apply_numpy(volume, a.compose(b), vectors))
        other_order = apply_numpy(volume, b.compose(a), vectors)
        order_matters |= other_order.shape != twice.shape or not np.array_equal(other_order, twice)
    assert order_matters  # the group is not commutative, so the check above pins the order


def test_apply_numpy_returns_a_new_contiguous_array_of_the_same_dtype():
    volume = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    for e in (IDENTITY, ELEMENTS[5], ELEMENTS[40]):
        out = apply_numpy(volume, e)
        assert out.dtype == np.float32
        assert out.flags["C_CONTIGUOUS"]
        assert not np.shares_memory(out, volume)
    with pytest.raises(ValueError):
        apply_numpy(volume, IDENTITY, vector_channels=[(0, 1)])
    with pytest.raises(ValueError):
        apply_numpy(volume, IDENTITY, vector_channels=[(0, 1, 2)])  # only 2 channels
    with pytest.raises(ValueError):
        apply_numpy(volume[0], IDENTITY)


# --- physics -----------------------------------------------------------------------------


def test_gradient_field_stays_a_gradient_field():
    # Velocities in the linear regime are gradients of a potential. A volume whose vector
    # channels are the gradient of its scalar channel must still be one after augmentation.
    phi = smooth_periodic_field(8)
    volume = np.concatenate([phi[None], periodic_gradient(phi)])
    vectors = [(1, 2, 3)]
    naive_failures = []
    for index, e in enumerate(ELEMENTS):
        out = apply_numpy(volume, e, vectors)
        np.testing.assert_allclose(out[1:], periodic_gradient(out[0]), rtol=0, atol=1e-12)

        # The naive treatment moves the velocity components like scalars: no longer a gradient.
        naive = apply_numpy(volume, e)
        if not np.allclose(naive[1:], periodic_gradient(naive[0]), rtol=0, atol=1e-6):
            naive_failures.append(index)
    # Only the identity leaves the components alone, so the naive check fails for all others.
    assert naive_failures == list(range(1, 48))


def test_input_and_target_stay_aligned():
    # Input: density + velocity (channels 1-3). Target: two scalars computed voxelwise
    # from the density, then a velocity (channels 2-4) that is a multiple of the input's.
    rng = np.random.default_rng(3)
    shape = (6, 6, 6)
    density = rng.normal(size=shape)
    velocity = rng.normal(size=(3,) + shape)
    inputs = np.concatenate([density[None], velocity])
    target = np.concatenate([np.exp(density)[None], (density**2)[None], 2 * velocity])
    for e in ELEMENTS:
        x = apply_numpy(inputs, e, [(1, 2, 3)])
        y = apply_numpy(target, e, [(2, 3, 4)])
        np.testing.assert_array_equal(y[0], np.exp(x[0]))
        np.testing.assert_array_equal(y[1], x[0] ** 2)
        np.testing.assert_array_equal(y[2:], 2 * x[1:])
    # Different elements for input and target break the relation: the check has teeth.
    x = apply_numpy(inputs, ELEMENTS[1], [(1, 2, 3)])
    y = apply_numpy(target, ELEMENTS[2], [(2, 3, 4)])
    assert not np.array_equal(y[0], np.exp(x[0]))


# --- the batched torch version -----------------------------------------------------------


def _devices():
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_torch_matches_apply_numpy_bit_for_bit(dtype, device):
    rng = np.random.default_rng(4)
    size, channels = 6, 8
    vectors = [(1, 2, 3), (5, 6, 7)]
    data = rng.normal(size=(48, channels, size, size, size)).astype(np.float32)
    data[:, 1, 0, 0, 0] = -0.0  # signed zeros in a vector channel must flip exactly like numpy
    batch = torch.from_numpy(data).to(device=device, dtype=dtype)
    indices = torch.arange(48, device=device)
    out = apply_torch(batch, indices, vectors)
    assert out.device == batch.device and out.dtype == dtype and out.shape == batch.shape

    # numpy has no bfloat16: transform the float32 copy of the exact same values.
    reference_input = batch.float().cpu().numpy()
    expected = np.stack([apply_numpy(reference_input[i], ELEMENTS[i], vectors) for i in range(48)])
    expected = torch.from_numpy(expected).to(dtype)
    got = out.cpu()
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert torch.equal(got.view(bits), expected.view(bits))


def test_apply_torch_with_repeated_indices_and_a_custom_element_list():
    rng = np.random.default_rng(5)
    data = torch.from_numpy(rng.normal(size=(5, 4, 4, 4, 4)).astype(np.float32))
    indices = torch.tensor([3, 3, 0, 23, 11])
    out = apply_torch(data, indices, [(1, 2, 3)], elements=ROTATIONS)
    for b in range(5):
        expected = apply_numpy(data[b].numpy(), ROTATIONS[int(indices[b])], [(1, 2, 3)])
        assert torch.equal(out[b], torch.from_numpy(expected))
    # No vector channels: everything moves as a scalar.
    out = apply_torch(data, indices)
    assert torch.equal(out[3], torch.from_numpy(apply_numpy(data[3].numpy(), ELEMENTS[23])))


def test_apply_torch_rejects_bad_shapes():
    with pytest.raises(ValueError):
        apply_torch(torch.zeros(2, 1, 4, 4, 5), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError):
        apply_torch(torch.zeros(2, 1, 4, 4, 4), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError):
        apply_torch(torch.zeros(1, 4, 4, 4), torch.zeros(1, dtype=torch.long))


@needs_cuda("needs CUDA to see host syncs")
def test_apply_torch_does_not_synchronise_with_the_host():
    batch = torch.randn(4, 4, 8, 8, 8, device="cuda")
    indices = torch.randint(0, 48, (4,), device="cuda")
    apply_torch(batch, indices, [(1, 2, 3)])  # build the cached tables outside the check
    torch.cuda.set_sync_debug_mode("error")
    try:
        apply_torch(batch, indices, [(1, 2, 3)])
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_source_box_turns_into_the_block_for_every_element():
    """Domain parallelism: a rank reads only the box of the unturned crop that becomes its block."""
    rng = np.random.default_rng(0)
    crop = rng.standard_normal((4, 8, 8, 8)).astype(np.float32)
    blocks = [((0, 4), (0, 8), (0, 8)), ((4, 8), (0, 4), (0, 8)), ((2, 6), (4, 8), (0, 2))]
    for element in ELEMENTS:
        whole = apply_numpy(crop, element, [(1, 2, 3)])
        for block in blocks:
            box = source_box(element, block, 8)
            part = apply_numpy(crop[(slice(None), *(slice(a, b) for a, b in box))], element, [(1, 2, 3)])
            np.testing.assert_array_equal(part, whole[(slice(None), *(slice(a, b) for a, b in block))])
