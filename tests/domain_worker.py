"""One rank of the domain-parallel tests, started by tests/test_halo.py as a real process over gloo.

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=... python tests/domain_worker.py SCENARIO MESH OUT_DIR

MESH is the domain mesh as ``2,1,1``. Every rank builds the same whole input and the same layer or
U-Net (seeded), runs its block through the domain-parallel version and writes, as JSON, the largest
difference from the undivided computation (done on every rank, in the same process):

  layers  a Conv3d and a ConvTranspose3d of the U-Net's shape (kernel 4, stride 2, padding 1) in
          float64: outputs, input gradients and weight gradients (summed over the domain group)
  unet    the small U-Net (base_channels 4) at 128^3 in float32: output and weight gradients,
          the number of halo exchanges and bytes of one forward and of one backward pass, and the
          bytes autograd saves for backward
  forms   as ``layers``, each layer in its exact form (utils/exact_forms.py) inside the halo exchange
  unet_forms  as ``unet`` in float64, with every layer that has an exact form in it (--exact_forms=on)
  auto_choice  which layers --exact_forms=auto computes in their forms when the ranks' timings disagree
"""
import json
import os
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from networks.UNet import UNet  # noqa: E402
from utils import distributed, exact_forms, halo  # noqa: E402
from utils.YParams import YParams  # noqa: E402


WHOLE_VOLUME_COLLECTIVES = ("all_gather", "all_gather_into_tensor", "all_to_all", "all_to_all_single", "broadcast",
                            "all_reduce", "gather", "scatter", "reduce_scatter_tensor")


def block_of(tensor, mesh, side):
    """This rank's block of a (B, C, S, S, S) tensor."""
    return tensor[(slice(None), slice(None), *(slice(start, stop) for start, stop in mesh.block_in(side)))]


def summed(gradient, mesh):
    """A weight gradient added up over the domain group: the whole sample's gradient."""
    gradient = gradient.clone()
    dist.all_reduce(gradient, group=mesh.group)
    return gradient


def error(a, b):
    """The largest difference, relative to the largest value of the reference ``b``."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def layers(mesh, exact=False):
    torch.manual_seed(0)
    # 16 splits into even blocks two and four ways; a three-way split needs 12 (blocks of 4).
    side, results = 12 if 3 in mesh.shape else 16, {}
    for transposed in (False, True):
        kind = nn.ConvTranspose3d if transposed else nn.Conv3d
        layer = kind(3, 5, kernel_size=4, stride=2, padding=1).double()
        whole = torch.randn(2, 3, side, side, side, dtype=torch.float64, requires_grad=True)
        output = layer(whole)
        weights = torch.randn_like(output)  # a loss that weighs every output differently
        (output * weights).sum().backward()
        reference = {"output": output.detach(), "input_grad": whole.grad,
                     "weight_grad": layer.weight.grad.clone(), "bias_grad": layer.bias.grad.clone()}
        layer.zero_grad()

        split = halo.HaloConv(exact_forms.ExactConv(layer, exact_forms.exact_form(layer)) if exact else layer, mesh)
        part = block_of(whole.detach(), mesh, side).clone().requires_grad_(True)
        out = split(part)
        (out * block_of(weights, mesh, output.shape[-1])).sum().backward()
        name = "ConvTranspose3d" if transposed else "Conv3d"
        results[f"{name} form"] = split.form.name
        results[name] = {
            "output": error(out, block_of(reference["output"], mesh, output.shape[-1])),
            "input_grad": error(part.grad, block_of(reference["input_grad"], mesh, side)),
            "weight_grad": error(summed(layer.weight.grad, mesh), reference["weight_grad"]),
            "bias_grad": error(summed(layer.bias.grad, mesh), reference["bias_grad"]),
        }
    return results


def autocast_layers(mesh):
    """The layers in float32 under bf16 autocast, as train.py runs them with --amp_mode=bf16: the block's
    outputs and gradients against the undivided layer's under the same autocast."""
    torch.manual_seed(0)
    side, results = 16, {}
    for kind in (nn.Conv3d, nn.ConvTranspose3d):
        layer = kind(8, 8, kernel_size=4, stride=2, padding=1)
        whole = torch.randn(2, 8, side, side, side, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = layer(whole)
        weights = torch.randn(output.shape)
        (output.float() * weights).sum().backward()
        reference = {"output": output.detach(), "input_grad": whole.grad, "weight_grad": layer.weight.grad.clone()}
        layer.zero_grad()
        split = halo.HaloConv(layer, mesh)
        part = block_of(whole.detach(), mesh, side).clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = split(part)
        (out.float() * block_of(weights, mesh, output.shape[-1])).sum().backward()
        results[kind.__name__] = {
            "dtypes": [str(out.dtype), str(part.grad.dtype), str(layer.weight.grad.dtype)],
            "output": error(out.float(), block_of(reference["output"], mesh, output.shape[-1]).float()),
            "input_grad": error(part.grad, block_of(reference["input_grad"], mesh, side)),
            "weight_grad": error(summed(layer.weight.grad, mesh), reference["weight_grad"]),
        }
    return results


def unet(mesh, exact=False):
    torch.manual_seed(0)
    side = 128
    dtype = torch.float64 if exact else torch.float32  # the forms' sums in another order: exact in float64
    model = UNet(4, 5, base_channels=4, full_scale=True).to(dtype)
    whole = torch.randn(1, 4, side, side, side, dtype=dtype)
    output = model(whole)
    weights = torch.randn_like(output)
    (output * weights).sum().backward()
    reference = {name: p.grad.clone() for name, p in model.named_parameters()}
    reference_output = output.detach()
    del output
    model.zero_grad()

    if exact:
        exact_forms.use_exact_forms(model, types.SimpleNamespace(exact_forms="on"), torch.device("cpu"), mesh)
    halo.split_domain(model, mesh)
    # Collectives that could move whole volumes are counted while the block trains: there must be none.
    gathers = []
    originals = {name: getattr(dist, name) for name in WHOLE_VOLUME_COLLECTIVES}
    for name, original in originals.items():
        setattr(dist, name, lambda *args, _name=name, _original=original, **kwargs: (
            gathers.append(_name), _original(*args, **kwargs))[1])
    halo.reset_counters()
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(tensor):  # what autograd keeps for backward, each storage once, as benchmarks/domain.py counts it
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = model(block_of(whole, mesh, side).clone())  # the block alone, as a rank's loader gives it
    forward = dict(halo.COUNTERS)
    halo.reset_counters()
    (out * block_of(weights, mesh, side)).sum().backward()
    backward = dict(halo.COUNTERS)
    for name, original in originals.items():
        setattr(dist, name, original)
    return {
        "output": error(out, block_of(reference_output, mesh, side)),
        "grads": {name: error(summed(p.grad, mesh), reference[name]) for name, p in model.named_parameters()},
        "names": sorted(name for name, _ in model.named_parameters()) == sorted(reference),
        "forward": forward,
        "backward": backward,
        "saved_bytes": sum(saved.values()),
        "halo_convs": sum(isinstance(m, halo.HaloConv) for m in model.modules()),
        "forms": [m.form.name for m in model.modules() if isinstance(m, halo.HaloConv)],
        "gathers": gathers,
    }


def auto_choice(mesh):
    """--exact_forms=auto on ranks whose own timings disagree (injected: rank 0 times the exact forms
    faster, the others the plain layers): the layers each rank computes in their exact forms."""
    model = UNet(4, 5, base_channels=4, full_scale=False)
    layers = exact_forms.candidates(model)
    exact_faster = dist.get_rank() == 0
    exact_forms.convolution_inputs = lambda *args: (None, {name: None for name, *_ in layers})
    exact_forms.time_forms = lambda layer, forms, *args: (2.0, 1.0) if exact_faster else (1.0, 2.0)
    params = types.SimpleNamespace(crop_size=32, global_batch_size=4, grad_accum_steps=1)
    chosen, _ = exact_forms.choose_forms(model, layers, params, torch.device("cuda"), mesh)  # no GPU is touched
    return {"chosen": chosen, "candidates": [name for name, *_ in layers]}


def dtensor(mesh):
    """PyTorch's own sharded convolution (DTensor, input sharded along each spatial axis in turn): the
    difference of its result from the undivided convolution's, or the error it raises."""
    try:
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    except ImportError:  # torch 2.4 keeps DTensor private
        from torch.distributed._tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.device_mesh import init_device_mesh

    device_mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    layer = nn.Conv3d(3, 5, kernel_size=4, stride=2, padding=1).double()
    whole = torch.randn(1, 3, 16, 16, 16, dtype=torch.float64)
    reference = layer(whole).detach()
    results = {}
    for dim in (2, 3, 4):
        try:
            sharded = distribute_tensor(whole, device_mesh, [Shard(dim)])
            weight = distribute_tensor(layer.weight.detach(), device_mesh, [Replicate()])
            bias = distribute_tensor(layer.bias.detach(), device_mesh, [Replicate()])
            output = torch.nn.functional.conv3d(sharded, weight, bias, stride=2, padding=1).full_tensor()
            results[dim] = {"shape": list(output.shape), "expected": list(reference.shape),
                            "error": error(output, reference) if output.shape == reference.shape else None}
        except Exception as exception:  # noqa: BLE001 - the test reports what PyTorch did
            results[dim] = {"raised": f"{type(exception).__name__}: {str(exception)[:200]}"}
    return results


def main():
    scenario, mesh_text, out_dir = sys.argv[1:]
    world = distributed.read_world()
    params = YParams(os.path.join(ROOT, "config", "UNet.yaml"), "test")
    params["domain_mesh"] = [int(n) for n in mesh_text.split(",")]
    mesh = distributed.init_process_group(world, torch.device("cpu"), params)
    result = {"layers": layers, "autocast": autocast_layers, "unet": unet, "dtensor": dtensor,
              "forms": lambda mesh: layers(mesh, exact=True),
              "unet_forms": lambda mesh: unet(mesh, exact=True), "auto_choice": auto_choice}[scenario](mesh)
    with open(os.path.join(out_dir, f"{scenario}-{mesh_text}.rank{world.rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    distributed.shutdown(world)


if __name__ == "__main__":
    main()
