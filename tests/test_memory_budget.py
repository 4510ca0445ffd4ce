"""benchmarks/memory_budget.py: the calculated budget against the bytes autograd really saves.

The saved activations are measured in a real forward pass of train.py's model, precision and loss on
the CPU, with ``torch.autograd.graph.saved_tensors_hooks`` recording every tensor autograd keeps for
the backward pass (each storage once). The batch's own input and target, the parameters, and
autocast's 16-bit weight copies are told apart, as the budget counts them in rows of their own.
"""
import os

import pytest
import torch

import train
from benchmarks import memory_budget
from conftest import ROOT
from readme_commands import tutorial_text
from utils import halo
from utils.YParams import YParams, load_params
from utils.distributed import DomainMesh
from utils.losses import build_loss
from utils.optim import Precision

BATCH = 3  # no channel count of the U-Net is 3, so a saved tensor's first dimension tells activations apart


def measured_saved_bytes(params, mesh=None):
    """``(activation bytes per sample, weight-copy bytes)`` that autograd saves in one forward pass; with a
    DomainMesh, on that rank's block (its convolutions exchanging halos)."""
    torch.manual_seed(0)
    model = train.build_model(params, torch.device("cpu"), mesh)
    precision = Precision(params.amp_mode, torch.device("cpu"))
    loss_fn = build_loss(params)
    block = [params.crop_size // parts for parts in (mesh.shape if mesh else (1, 1, 1))]
    inputs = torch.randn(BATCH, params.N_in_channels, *block)
    targets = torch.rand(BATCH, params.N_out_channels, *block) * 2 - 1
    own = {p.untyped_storage().data_ptr() for p in model.parameters()}
    own |= {inputs.untyped_storage().data_ptr(), targets.untyped_storage().data_ptr()}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in own:
            saved[storage.data_ptr()] = (storage.nbytes(), tensor.shape[0])
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with precision.autocast():
            loss = loss_fn(model(inputs), targets)
    loss.backward()  # the graph the hooks saw is the one training differentiates
    activations = sum(nbytes for nbytes, first in saved.values() if first == BATCH)
    weight_copies = sum(nbytes for nbytes, first in saved.values() if first != BATCH)
    return activations / BATCH, weight_copies


@pytest.mark.parametrize("amp_mode", ["none", "bf16", "fp16"])
@pytest.mark.parametrize("shape", [{"crop_size": 32, "base_channels": 4, "full_scale": False},
                                   {"crop_size": 64, "base_channels": 2, "full_scale": True}])
def test_saved_activations_are_what_autograd_saves(amp_mode, shape):
    params = load_params(["--config=test", f"--amp_mode={amp_mode}"] + [f"--{k}={v}" for k, v in shape.items()])
    activations, weight_copies = measured_saved_bytes(params)
    assert activations == sum(memory_budget.saved_activation_bytes(params).values())
    # The convolutions save their 16-bit weights (not the biases: the backward pass needs no bias);
    # the budget counts autocast's cache, which holds both, at 2 bytes per parameter.
    weights = sum(p.numel() for name, p in train.UNet(4, 5, params.base_channels, params.full_scale).named_parameters()
                  if name.endswith("weight"))
    assert weight_copies == (2 * weights if amp_mode != "none" else 0)
    assert weights == pytest.approx(memory_budget.parameter_count(params), rel=1e-3)


def faces_from_nobody(to_lower, to_upper, lower, upper, group):
    """utils/halo.py's swap_faces in one process: the faces a neighbour would send, as zeros. What autograd
    saves does not depend on their values."""
    return tuple(None if peer is None else torch.zeros_like(face, memory_format=torch.contiguous_format)
                 for peer, face in ((lower, to_lower), (upper, to_upper)))


@pytest.mark.parametrize("amp_mode", ["none", "bf16"])
@pytest.mark.parametrize("shape, mesh, coords", [
    ({"crop_size": 128, "base_channels": 4, "full_scale": False}, [4, 1, 1], (1, 0, 0)),
    ({"crop_size": 128, "base_channels": 2, "full_scale": True}, [2, 2, 1], (0, 1, 0))])
def test_under_a_domain_mesh_a_rank_saves_its_block_and_its_halos(amp_mode, shape, mesh, coords, monkeypatch):
    """The busiest rank of a mesh (a middle block of [4,1,1]; any block of [2,2,1]) in one process, its
    neighbours' messages replaced by zeros: it saves what the budget says, its block's share of a sample
    and the halos."""
    options = ["--config=test", f"--amp_mode={amp_mode}", f"--domain_mesh={mesh}".replace(" ", "")]
    params = load_params(options + [f"--{k}={v}" for k, v in shape.items()], world_size=mesh[0] * mesh[1] * mesh[2])
    neighbours = tuple((0 if c > 0 else None, 0 if c < n - 1 else None) for c, n in zip(coords, mesh))
    domain_mesh = DomainMesh(shape=tuple(mesh), coords=coords, neighbours=neighbours)
    monkeypatch.setattr(halo, "swap_faces", faces_from_nobody)
    activations, _ = measured_saved_bytes(params, domain_mesh)
    rows = memory_budget.saved_activation_bytes(params)
    assert activations == sum(rows.values())
    # The block's share of the undivided sample's tensors, and the halos on top. Under autocast the first
    # convolution keeps the fp32 block, the batch's own, in place of its 16-bit copy of the whole input.
    whole = memory_budget.saved_activation_bytes(load_params(options[:2] + [f"--{k}={v}" for k, v in shape.items()]))
    whole.pop("16-bit copy of the input crop", None)
    halos = rows["halo slabs kept for backward"]
    assert activations - halos == sum(whole.values()) // (mesh[0] * mesh[1] * mesh[2])
    assert 0 < halos < 0.1 * activations


def test_the_budget_of_docs_06s_mesh_is_per_rank(capsys):
    """docs/06's 256^3 on [4,1,1]: a rank holds its quarter of a sample and its halos, 888.8 MiB (3364.1
    undivided), and its quarter of the batch; a --ranks the mesh does not divide is refused."""
    command = ["--config=base", "--crop_size=256", "--local_batch_size=1", "--domain_mesh=[4,1,1]"]
    memory_budget.main(command)
    output = capsys.readouterr().out
    assert "4 rank(s), domain mesh [4, 1, 1] (each sample split over 4 ranks), local batch 1," in output
    assert "| activations saved for backward | 0.87 | 888.8 MiB per sample (its block: 1/4, and halos) x 1 |" in output
    params = load_params(command, world_size=4)
    whole = load_params(command[:3])
    rows = memory_budget.saved_activation_bytes(params)
    assert sum(rows.values()) - rows["halo slabs kept for backward"] == sum(
        memory_budget.saved_activation_bytes(whole).values()) // 4
    with pytest.raises(SystemExit):
        memory_budget.main(command + ["--ranks=6"])
    assert "--ranks=6 cannot hold --domain_mesh=[4, 1, 1]" in " ".join(capsys.readouterr().err.split())


def test_the_count_is_not_blind():
    """A budget that forgot the concatenations, or counted 16-bit activations as fp32, would fail above."""
    params = load_params(["--config=test", "--amp_mode=bf16"])
    activations, _ = measured_saved_bytes(params)
    rows = memory_budget.saved_activation_bytes(params)
    assert activations != sum(rows.values()) - rows["concatenations (decoder + skip)"]
    assert activations != sum(memory_budget.saved_activation_bytes(params, amp_mode="none").values())


def test_full_scale_unet_at_64_cubed():
    """The numbers the README quotes: 117 M parameters, 16 bytes each; 52.6 MiB of saved activations per
    sample in fp32, 30.8 MiB under 16-bit autocast; 9.4 MB of input and target per sample."""
    params = YParams(os.path.join(ROOT, "config", "UNet.yaml"), "base")
    n_params = memory_budget.parameter_count(params)
    assert n_params == sum(p.numel() for p in train.UNet(4, 5, 64, True).parameters())
    assert round(n_params / 1e6, 1) == 117.0
    fp32 = sum(memory_budget.saved_activation_bytes(params, "none").values())
    half = sum(memory_budget.saved_activation_bytes(params, "bf16").values())
    assert (round(fp32 / 2 ** 20, 1), round(half / 2 ** 20, 1)) == (52.6, 30.8)
    rows = {what: value for what, value, _ in memory_budget.budget(params, ranks=1)}
    assert rows["the batch: input + target (fp32)"] == 64 * 9 * 64 ** 3 * 4


def test_crop_128_has_8_times_the_activations():
    """The README's large-crop figure: 246.3 MiB per sample under 16-bit autocast, 15.4 GiB for 64."""
    params = load_params(["--config=bs64_opt", "--crop_size=128"])
    per_sample = sum(memory_budget.saved_activation_bytes(params).values())
    assert round(per_sample / 2 ** 20, 1) == 246.3 and round(64 * per_sample / 2 ** 30, 1) == 15.4
    small = sum(memory_budget.saved_activation_bytes(load_params(["--config=bs64_opt"])).values())
    assert per_sample == pytest.approx(8 * small, rel=0.001)


def test_ddp_fsdp_and_bucket_views_change_the_right_rows():
    params = load_params(["--config=bs256_opt"], world_size=4)
    n_params = memory_budget.parameter_count(params)
    ddp = {what: value for what, value, _ in memory_budget.budget(params, ranks=4)}
    assert ddp["DDP gradient buckets (fp32)"] == ddp["gradients (fp32)"] == 4 * n_params
    params["gradient_as_bucket_view"] = True
    view = {what: value for what, value, _ in memory_budget.budget(params, ranks=4)}
    assert view["gradients (fp32)"] == 0 and view["DDP gradient buckets (fp32)"] == 4 * n_params
    params["parallel"] = "fsdp"
    fsdp = {what: value for what, value, _ in memory_budget.budget(params, ranks=4)}
    assert "DDP gradient buckets (fp32)" not in fsdp
    assert fsdp["weights (fp32)"] + fsdp["gradients (fp32)"] + fsdp["Adam's two moments (fp32)"] == 4 * n_params


def test_gpu_inmem_volumes_of_the_real_data():
    """Training 1024^3 and validation 512^3, 9 channels: 43.5 GB in fp32, 21.7 GB in 16 bits."""
    params = load_params(["--config=base", "--data_loader_config=gpu-inmem"])
    assert round(memory_budget.inmem_bytes(params, 1024, 512, 4) / 1e9, 1) == 43.5
    assert round(memory_budget.inmem_bytes(params, 1024, 512, 2) / 1e9, 1) == 21.7


def test_readme_quotes_the_tools_output(capsys):
    """The README's budget is the output of the command it shows, line for line."""
    readme = tutorial_text(ROOT)  # README.md and its chapters in docs/
    command = "python -m benchmarks.memory_budget --config=bs64_opt --gpu_memory_gib=40"
    assert command in readme
    memory_budget.main(command.split()[3:])
    output = capsys.readouterr().out
    table = [line for line in output.splitlines() if line.startswith("| ")]
    assert len(table) >= 7 and all(line in readme for line in table)
    assert "Per-GPU memory budget: config bs64_opt, 1 rank(s), local batch 64" in output
