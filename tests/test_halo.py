"""The halo exchange (utils/halo.py) on real gloo ranks: a block's convolutions equal the undivided ones.

Each test starts tests/domain_worker.py as separate processes with the environment torchrun sets;
every rank computes the undivided layer or U-Net itself and writes how far its block's result is
from it. The mesh and its checks (utils/distributed.py) are tested here too, without processes.
"""
import contextlib
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import quotes
from benchmarks import domain
from conftest import ROOT, free_port, timeout_for
from networks.UNet import UNet
from utils import distributed, halo
from utils.distributed import DomainMesh, World
from utils.errors import UserError

WORKER = os.path.join(ROOT, "tests", "domain_worker.py")


def run_ranks(scenario, mesh, out_dir, world_size=2, timeout=timeout_for(300)):
    """Run the worker on ``world_size`` ranks; return every rank's JSON result."""
    port, processes, text = free_port(), [], ",".join(map(str, mesh))
    with contextlib.ExitStack() as stack:
        for rank in range(world_size):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
            log = stack.enter_context(open(out_dir / f"{scenario}-{text}.rank{rank}.log", "w"))
            processes.append(subprocess.Popen([sys.executable, WORKER, scenario, text, str(out_dir)], cwd=ROOT,
                                              env=env, stdout=log, stderr=subprocess.STDOUT))
        try:
            for process in processes:
                process.wait(timeout=timeout)
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    logs = "\n".join((out_dir / f"{scenario}-{text}.rank{rank}.log").read_text() for rank in range(world_size))
    assert [p.returncode for p in processes] == [0] * world_size, logs[-4000:]
    return [json.loads((out_dir / f"{scenario}-{text}.rank{rank}.json").read_text()) for rank in range(world_size)]


AXES = [[2, 1, 1], [1, 2, 1], [1, 1, 2]]


@pytest.mark.parametrize("mesh", AXES, ids=["depth", "height", "width"])
def test_sharded_conv_and_transposed_conv_equal_the_undivided_ones_in_float64(mesh, tmp_path):
    for result in run_ranks("layers", mesh, tmp_path):
        for layer in ("Conv3d", "ConvTranspose3d"):
            for quantity, difference in result[layer].items():
                assert difference < 1e-12, (mesh, layer, quantity, difference)


@pytest.mark.parametrize("mesh", [[4, 1, 1], [3, 3, 1], [2, 2, 2]], ids=["4-depth", "3x3", "2x2x2"])
def test_blocks_with_neighbours_on_both_sides_equal_the_undivided_layers(mesh, tmp_path):
    """Middle blocks: [4, 1, 1] (docs/06 runs it) has two along depth; [3, 3, 1] has one with neighbours
    on both sides along depth and height at once, and middle blocks at the edges of the other axis;
    [2, 2, 2] splits all three axes, so every block's corner voxel comes from the diagonal neighbour
    across all three (two hops through the others, forward and backward)."""
    size = mesh[0] * mesh[1] * mesh[2]
    for result in run_ranks("layers", mesh, tmp_path, world_size=size, timeout=timeout_for(60)):
        for layer in ("Conv3d", "ConvTranspose3d"):
            for quantity, difference in result[layer].items():
                assert difference < 1e-12, (mesh, layer, quantity, difference)


@pytest.mark.cpu16
def test_under_bf16_autocast_the_block_computes_in_bf16_and_returns_float32_gradients(tmp_path):
    """As --amp_mode=bf16 runs it: outputs in bf16, gradients in the parameters' and input's float32,
    within bf16's rounding of the undivided layers' (measured: 3.6e-3 of the largest value at most)."""
    for result in run_ranks("autocast", [2, 1, 1], tmp_path):
        for layer in ("Conv3d", "ConvTranspose3d"):
            assert result[layer]["dtypes"] == ["torch.bfloat16", "torch.float32", "torch.float32"]
            for quantity in ("output", "input_grad", "weight_grad"):
                assert result[layer][quantity] < 2e-2, (layer, quantity, result[layer])


@pytest.mark.parametrize("mesh", AXES + [[2, 2, 1], [2, 2, 2]], ids=["depth", "height", "width", "2x2", "2x2x2"])
def test_the_small_unet_at_128_on_blocks_equals_the_undivided_one(mesh, tmp_path):
    """base_channels 4, full scale, 128^3, float32: outputs and summed weight gradients within 1e-4; the
    halo exchanges counted, the bytes saved and sent those benchmarks/domain.py predicts, and no collective
    (all-gather of a volume or otherwise) in forward or backward."""
    size = mesh[0] * mesh[1] * mesh[2]
    results = run_ranks("unet", mesh, tmp_path, world_size=size)
    split_axes = sum(n > 1 for n in mesh)
    # On these meshes every rank has one neighbour per split axis: each is the busiest rank the prediction
    # (benchmarks/domain.py) describes. Its slabs on the later axes include the earlier axes' halos.
    saved, _ = domain.predict(128, 4, mesh)
    slabs = domain.busiest_slabs(128, 4, mesh)
    for result in results:
        assert result["saved_bytes"] == saved
        assert result["forward"]["bytes_sent"] == 4 * sum(slabs)
        assert result["backward"]["bytes_sent"] == 4 * sum(slabs[1:])
        assert result["output"] < 1e-4
        assert max(result["grads"].values()) < 1e-4, result["grads"]
        assert result["names"]  # the parameters keep their names: checkpoints do not change
        # One exchange per split axis before each of the 12 convolutions (6 down, 5 up, the last); the
        # backward pass sends the halo gradients back for all but the first, whose input needs none.
        assert result["halo_convs"] == 12
        assert result["forward"]["exchanges"] == 12 * split_axes
        assert result["backward"]["exchanges"] == 11 * split_axes
        assert result["gathers"] == []  # only point-to-point halo messages: no collective on the way


def test_the_placement_splits_each_ranks_halo_between_its_node_and_the_others():
    """benchmarks/domain.py's cost table: what each rank sends, placed on nodes of 4 GPUs, adds up to the
    busiest rank's bytes on [2,2,2] (every rank has one neighbour per axis), and only depth, the axis
    whose neighbours are 4 ranks apart, crosses nodes. On [2,2,4] nodes of 8 hold whole width rows."""
    placed = domain.placed_halo(128, 4, [2, 2, 2], gpus_per_node=4)
    assert all(4 * (inside + between) == domain.busiest_halo(128, 4, [2, 2, 2]) for inside, between in placed)
    # Depth is exchanged first: its faces on [2,2,2] are a quarter of [2,1,1]'s (height and width halved).
    assert all(4 * between == domain.busiest_halo(128, 4, [2, 1, 1]) // 4 for _, between in placed)
    _, across = zip(*domain.placed_halo(1024, 64, [2, 2, 4], gpus_per_node=8))
    _, deep = zip(*domain.placed_halo(1024, 64, [4, 2, 2], gpus_per_node=8))
    assert 0 < max(across) < max(deep) and deep.count(0) == 8  # depth 0 and 3 have no neighbour off their node


# What PyTorch's DTensor does with a Conv3d(kernel 4, stride 2, padding 1) on an input sharded along a
# spatial axis over two gloo ranks, as run by tests/domain_worker.py dtensor (2026-11-25): torch 2.4.1
# refuses every axis with this error; torch 2.13.0 returns, without an error, half the outputs along
# the sharded axis (shape [1,5,4,8,8] for [1,5,8,8,8] when depth is sharded).
DTENSOR_REFUSES = "RuntimeError: Stride must be 1 when there is padding for tensor parallel convolution"


def dtensor_behaviour(outcome, dim):
    """'raises' (the 2.4 error), 'half' (half the outputs along ``dim``, no error) or what it is."""
    if outcome.get("raised", "").startswith(DTENSOR_REFUSES):
        return "raises"
    half = list(outcome.get("expected", []))
    if half:
        half[dim] //= 2
    if "raised" not in outcome and outcome.get("shape") == half:
        return "half"
    return repr(outcome)


def test_pytorch_dtensor_convolution_is_not_the_halo_exchange(tmp_path):
    """Why utils/halo.py exists: DTensor has no halo exchange. Exactly what the installed torch does:
    torch 2.4 raises DTENSOR_REFUSES on every axis; torch 2.13 silently returns half the outputs along
    the sharded axis; the releases between, not run here, must do one or the other on all three axes.
    A torch that does something else (a correct result, say) fails this test: then DTensor is worth
    another look."""
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    seen = {dim: dtensor_behaviour(outcome, int(dim)) for dim, outcome in
            run_ranks("dtensor", [1, 1, 1], tmp_path)[0].items()}
    assert sorted(seen) == ["2", "3", "4"]
    if version == (2, 4):
        expected = {"raises"}
    elif version >= (2, 13):
        expected = {"half"}
    else:
        expected = {"raises", "half"}
    assert len(set(seen.values())) == 1 and set(seen.values()) <= expected, (torch.__version__, seen)


def test_no_mesh_leaves_the_model_untouched():
    model = UNet(4, 5, base_channels=4, full_scale=False)
    assert halo.split_domain(model, DomainMesh()) is model
    assert not any(isinstance(module, halo.HaloConv) for module in model.modules())


@pytest.mark.parametrize("layer", [nn.BatchNorm3d(4), nn.InstanceNorm3d(4), nn.GroupNorm(2, 4), nn.MaxPool3d(2),
                                   nn.Upsample(scale_factor=2)], ids=lambda layer: type(layer).__name__)
def test_a_model_with_a_layer_that_reaches_past_the_block_is_refused(layer):
    """On a block, a normalisation would use the block's statistics: the split is refused, not computed wrong."""
    model = nn.Sequential(nn.Conv3d(4, 4, kernel_size=4, stride=2, padding=1), layer)
    with pytest.raises(ValueError, match=f"cannot split 1 \\({type(layer).__name__}\\)"):
        halo.split_domain(model, DomainMesh(shape=(2, 1, 1)))
    assert isinstance(model[0], nn.Conv3d)  # refused before anything is swapped


def test_halo_conv_refuses_other_convolutions():
    mesh = DomainMesh(shape=(2, 1, 1))
    with pytest.raises(ValueError, match="kernel 4, stride 2, padding 1"):
        halo.HaloConv(nn.Conv3d(4, 4, kernel_size=3, padding=1), mesh)


# ----------------------------------------------------------------------------- the mesh and its checks

class Params(dict):
    __getattr__ = dict.__getitem__


def params(**overrides):
    return Params({"domain_mesh": [2, 1, 1], "crop_size": 128, "noddp": False, "channels_last": False,
                   "jit_mode": "none", "data_loader_config": "lowmem", **overrides})


def test_blocks_tile_the_crop_in_rank_order():
    shape, crop = (2, 2, 1), 128
    blocks = []
    for index in range(4):
        coords = (index // 2, index % 2, 0)
        blocks.append(DomainMesh(shape=shape, coords=coords).block_in(crop))
    assert blocks == [((0, 64), (0, 64), (0, 128)), ((0, 64), (64, 128), (0, 128)),
                      ((64, 128), (0, 64), (0, 128)), ((64, 128), (64, 128), (0, 128))]


@pytest.mark.parametrize("mesh, crop, smallest", [([2, 1, 1], 64, 128), ([1, 4, 1], 128, 256), ([2, 2, 1], 96, 128)])
def test_a_crop_too_small_for_the_mesh_is_refused_with_the_smallest_valid_crop(mesh, crop, smallest):
    with pytest.raises(UserError, match=f"The smallest crop for this mesh is --crop_size={smallest}"):
        distributed.check_domain_crop(mesh, crop, UNet.size_multiple(True))
    distributed.check_domain_crop(mesh, smallest, UNet.size_multiple(True))  # and that one is accepted


@pytest.mark.parametrize("mesh", [[2, 1], [0, 1, 1], "2,1,1", [2.0, 1, 1], [True, 1, 1]])
def test_a_malformed_mesh_is_refused(mesh):
    with pytest.raises(UserError, match="three positive integers"):
        distributed.check_domain_crop(mesh, 128, 64)


@pytest.mark.parametrize("overrides, graph, match", [
    ({}, False, "needs a multiple of 2 ranks"),
    ({"noddp": True}, False, "--noddp"),
    ({"channels_last": True}, False, "--channels_last"),
    ({"jit_mode": "compile"}, False, "--jit_mode=compile"),
    ({}, True, "train_graph.py"),
])
def test_combinations_that_cannot_work_are_refused(overrides, graph, match):
    world = World(size=3 if not overrides and not graph else 2)
    with pytest.raises(UserError, match=match):
        distributed.check_domain_options(params(**overrides), world, graph)


def test_the_default_mesh_refuses_nothing():
    distributed.check_domain_options(params(domain_mesh=[1, 1, 1], noddp=True, channels_last=True), World(3), True)


def test_whole_assembles_the_blocks_in_rank_order(monkeypatch):
    """DomainMesh.whole's arrangement, with the all-gather replaced by the blocks of a known volume."""
    volume = torch.arange(2 * 3 * 8 * 8 * 8, dtype=torch.float32).view(2, 3, 8, 8, 8)
    shape = (2, 2, 1)
    meshes = [DomainMesh(shape=shape, coords=(i // 2, i % 2, 0)) for i in range(4)]
    parts = [volume[(slice(None), slice(None), *(slice(a, b) for a, b in mesh.block_in(8)))] for mesh in meshes]

    def all_gather(outputs, tensor, group=None):
        for output, part in zip(outputs, parts):
            output.copy_(part)

    monkeypatch.setattr(distributed.dist, "all_gather", all_gather)
    assert torch.equal(meshes[0].whole(parts[0]), volume)


# ----------------------------------------------------------------------------- the chapter's numbers

DOMAIN_RESULTS = os.path.join(ROOT, "benchmarks", "results", "domain", "cpu-vm-2-cores-avx2-2026-11-29")


def test_docs_06_quotes_the_committed_counts_and_the_computed_costs():
    """docs/06's table and sentences against benchmarks/results/domain/: the counts per rank, and the cost
    of a step that benchmarks/domain.py computes today (which the committed domain.md must show too)."""
    chapter = "docs/06-domain-parallelism.md"
    with open(os.path.join(DOMAIN_RESULTS, "domain.json")) as f:
        report = json.load(f)
    rows = {(row["crop"], row["ranks"]): row for row in report["rows"]}
    assert all(row["saved_bytes"] == row["predicted_saved_bytes"] for row in rows.values())
    saves = quotes.section(chapter, "What it saves")
    for row in rows.values():
        quotes.assert_quoted(saves, f"{row['saved_bytes'] / domain.MIB:.1f}", f"{row['ratio_to_one_rank']:.3f}",
                             f"{row['halo_bytes'] / domain.MIB:.1f}", f"{row['halo_bytes_busiest'] / domain.MIB:.1f}")
    two = {f"{rows[crop, 2]['ratio_to_one_rank']:.2f}" for crop in (128, 256)}
    assert len(two) == 1  # "two ranks hold 0.51": both crops round alike
    quotes.assert_quoted(quotes.prose(saves), *two, f"{rows[256, 4]['ratio_to_one_rank']:.2f}",
                         f"{rows[256, 2]['halo_bytes_busiest'] / domain.MIB:.1f}",
                         f"{rows[256, 4]['halo_bytes_busiest'] / domain.MIB:.1f}")
    parameters = sum(p.numel() for p in UNet(4, 5, 64, True).parameters())
    predicted = {row["crop"]: row for row in report["predicted"]}
    assert list(predicted.values()) == domain.extension_rows(64, parameters)
    assert predicted[512]["mesh_fp32"] == [2, 1, 1] and predicted[1024]["mesh_fp32"] == [2, 2, 4]
    assert "`[2,1,1]`" in saves and "`[2,2,4]`" in saves  # the meshes the extension asks for
    quotes.assert_quoted(quotes.prose(saves), f"{predicted[512]['activations_bytes'] / domain.GIB:.1f}",
                         f"{parameters * domain.ADAM_BYTES_PER_PARAMETER / domain.GIB:.1f}")

    costs, rate, machine = domain.costs(64)
    assert report["costs"]["rows"] == costs and report["costs"]["h100_fp32_samples_per_s_at_64"] == rate
    committed = open(os.path.join(DOMAIN_RESULTS, "domain.md")).read()
    assert all(line in committed for line in domain.cost_table(64, costs, rate, machine) if line.startswith("| "))
    cost = {(row["crop"], str(row["mesh"])): row for row in report["costs"]["rows"]}
    slab, deep, wide = cost[1024, "[16, 1, 1]"], cost[1024, "[4, 2, 2]"], cost[1024, "[2, 2, 4]"]
    two = cost[256, "[2, 1, 1]"]
    text = quotes.prose(quotes.section(chapter, "What a step costs"))
    quotes.assert_quoted(text, f"{two['compute_s'] * 1e3:.1f}", f"{two['halo_bytes_busiest'] / domain.MIB:.1f}",
                         f"{two['halo_s'] * 1e3:.2f}", f"{two['copy_s'] * 1e3:.2f}", f"{100 * two['share']:.1f}",
                         f"{slab['halo_bytes_busiest'] / domain.MIB:.0f}", f"{100 * slab['share']:.1f}",
                         f"{wide['halo_bytes_busiest'] / domain.MIB:.0f}",
                         f"{wide['halo_bytes_between_nodes'] / domain.MIB:.0f}", f"{100 * wide['share']:.1f}",
                         f"{deep['halo_bytes_between_nodes'] / domain.MIB:.0f}", f"{rate:.1f}")
    assert slab["halo_bytes_between_nodes"] * 2 == slab["halo_bytes_busiest"]  # "half of it between nodes"
