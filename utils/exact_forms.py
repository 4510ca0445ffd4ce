"""Exact, faster forms of the U-Net's slow layers: the same arithmetic, arranged for fast kernels.

The U-Net's transposed convolutions (kernel 4, stride 2, padding 1) run, on a GPU, as strided
backward-data kernels, slow above all for the last layer's 5 output channels; its first convolution
reads 4 channels. Each is computed here by a stride-1, kernel-2 convolution with the same weights,
rearranged, and a reshuffle of voxels (one index per axis; the three axes are alike):

- Sub-pixel transposed convolution. ``y[o] = sum over o = 2i + k - 1 of x[i] w[k]``, so
  ``y[2m] = x[m] w[1] + x[m-1] w[3]`` and ``y[2m+1] = x[m] w[2] + x[m+1] w[0]``. A kernel-2,
  padding-1 convolution ``z_s[j] = x[j-1] v_s[0] + x[j] v_s[1]`` with ``v_s[t] = w[2(1-t) + s]``
  gives ``z_0[j] = y[2j-1]`` and ``z_1[j] = y[2j]``, j = 0..n: interleaved (depth to space: ``z_s[j]``
  to voxel ``2j + s``) they are ``y`` shifted by one voxel, so ``y`` is the interleave without its
  first and last voxel. 8 parities in 3-D: 8 times the output channels (128 -> 40 for the last layer).
- Space-to-depth first convolution. ``y[o] = sum_k xp[2o + k] w[k]`` over the padded input ``xp``;
  with ``k = 2t + s`` that is ``sum_(t,s) xp[2(o+t) + s] w[2t + s]``: a kernel-2, stride-1 convolution of
  ``xp`` folded into 2 x 2 x 2 blocks (4 channels become 32) with ``v_s[t] = w[2t + s]``.

The forms' weights are rearranged from the layer's own parameters inside the forward pass, so
autograd returns the layer's own gradients and the state_dict, checkpoints and ``networks/UNet.py``
do not change. :func:`use_exact_forms` applies the forms ``--exact_forms`` asks for when the model
is built: ``off``, ``on`` (every layer that has one), or ``auto``, whatever is faster on the
device (see :func:`choose_forms`), said in one log line. Under a domain mesh ``utils/halo.py``'s
HaloConv computes its block's convolution with the layer's form, forward and backward.
"""
import contextlib
import logging
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from utils.errors import UserError

MODES = ("auto", "on", "off")


def space_to_depth(x):
    """(N, C, 2D, 2H, 2W) -> (N, 8C, D, H, W): voxel (2i + a, 2j + b, 2k + c) of channel m moves to voxel
    (i, j, k) of channel 8m + 4a + 2b + c."""
    n, c, d, h, w = x.shape
    blocks = x.reshape(n, c, d // 2, 2, h // 2, 2, w // 2, 2)
    return blocks.permute(0, 1, 3, 5, 7, 2, 4, 6).reshape(n, 8 * c, d // 2, h // 2, w // 2)


def depth_to_space(x):
    """The inverse of :func:`space_to_depth`: (N, 8C, D, H, W) -> (N, C, 2D, 2H, 2W)."""
    n, c8, d, h, w = x.shape
    parities = x.reshape(n, c8 // 8, 2, 2, 2, d, h, w)
    return parities.permute(0, 1, 5, 2, 6, 3, 7, 4).reshape(n, c8 // 8, 2 * d, 2 * h, 2 * w)


def layout(x):
    """The memory format ``x`` is stored in, so that a form's tensors keep the run's layout (--channels_last)."""
    channels_last = x.is_contiguous(memory_format=torch.channels_last_3d) and not x.is_contiguous()
    return torch.channels_last_3d if channels_last else torch.contiguous_format


def pad_each_axis(x, before, after):
    """``x`` padded with zeros along D, H, W by ``before[axis]`` and ``after[axis]`` (negative: cropped)."""
    return F.pad(x, [side for axis in (2, 1, 0) for side in (before[axis], after[axis])])  # last axis first


def convolution_backward(grad_output, x, weight, stride, padding, transposed, output_mask):
    """``(grad_input, grad_weight, grad_bias)`` of one convolution (None where ``output_mask`` says so)."""
    out_channels = weight.shape[1 if transposed else 0]
    return torch.ops.aten.convolution_backward(grad_output, x, weight, [out_channels], [stride] * 3, list(padding),
                                               [1, 1, 1], transposed, [0, 0, 0], 1, output_mask)


class PlainConv:
    """The layer's own Conv3d (kernel 4, stride 2): the form a layer has when no other is chosen."""
    name = "plain"
    transposed = False

    @classmethod
    def forward(cls, x, weight, bias, padding):
        convolution = F.conv_transpose3d if cls.transposed else F.conv3d
        return convolution(x, weight, bias, stride=2, padding=padding)

    @classmethod
    def backward(cls, grad_output, x, weight, padding, output_mask):
        return convolution_backward(grad_output, x, weight, 2, padding, cls.transposed, output_mask)


class PlainTransposedConv(PlainConv):
    """The layer's own ConvTranspose3d (kernel 4, stride 2)."""
    transposed = True


class SpaceToDepthConv:
    """A Conv3d (kernel 4, stride 2, padding 0 or 1 per axis) as a kernel-2, stride-1 convolution of the
    padded input folded into 2 x 2 x 2 blocks. An odd padded side loses its last voxel, which the
    stride-2 convolution never reads either."""
    name = "space-to-depth"

    @staticmethod
    def weight(weight):
        """(out, in, 4, 4, 4) -> (out, 8 in, 2, 2, 2): ``v[o, 8i + s][t] = w[o, i][2t + s]`` per axis."""
        return space_to_depth(weight).contiguous(memory_format=layout(weight))

    @staticmethod
    def trimmed(x, padding):
        """Padding after each axis: the layer's, less one voxel where the padded side would be odd."""
        return [p - (side + 2 * p) % 2 for side, p in zip(x.shape[2:], padding)]

    @classmethod
    def blocks(cls, x, padding):
        """The convolution's input: ``x`` padded and folded, in ``x``'s layout."""
        return space_to_depth(pad_each_axis(x, padding, cls.trimmed(x, padding))).contiguous(memory_format=layout(x))

    @classmethod
    def forward(cls, x, weight, bias, padding):
        return F.conv3d(cls.blocks(x, padding), cls.weight(weight), bias)

    @classmethod
    def backward(cls, grad_output, x, weight, padding, output_mask):
        grad_blocks, grad_v, grad_bias = convolution_backward(grad_output, cls.blocks(x, padding), cls.weight(weight),
                                                              1, (0, 0, 0), False, output_mask)
        grad_x = None if grad_blocks is None else pad_each_axis(
            depth_to_space(grad_blocks), [-p for p in padding], [-p for p in cls.trimmed(x, padding)])
        grad_weight = None if grad_v is None else depth_to_space(grad_v).contiguous(memory_format=layout(weight))
        return grad_x, grad_weight, grad_bias


class SubPixelTransposedConv:
    """A ConvTranspose3d (kernel 4, stride 2, padding 1) as a kernel-2, stride-1, padding-1 Conv3d with
    8 times the output channels, interleaved depth to space, less the first and last voxel per axis."""
    name = "sub-pixel"

    @staticmethod
    def weight(weight):
        """(in, out, 4, 4, 4) -> (8 out, in, 2, 2, 2): ``v[8o + s, i][t] = w[i, o][2(1 - t) + s]`` per axis."""
        return space_to_depth(weight).flip(2, 3, 4).transpose(0, 1).contiguous(memory_format=layout(weight))

    @staticmethod
    def weight_gradient(grad_v, weight):
        """The gradient of :meth:`weight`'s input from that of its output (the rearrangement undone)."""
        return depth_to_space(grad_v.transpose(0, 1).flip(2, 3, 4)).contiguous(memory_format=layout(weight))

    @staticmethod
    def check(padding):
        if tuple(padding) != (1, 1, 1):
            raise ValueError(f"the sub-pixel form computes a transposed convolution of padding 1, not {padding}")

    @classmethod
    def forward(cls, x, weight, bias, padding):
        cls.check(padding)
        bias = None if bias is None else bias.repeat_interleave(8)  # one per parity of each output channel
        parities = F.conv3d(x, cls.weight(weight), bias, padding=1)
        return pad_each_axis(depth_to_space(parities), (-1,) * 3, (-1,) * 3).contiguous(memory_format=layout(x))

    @classmethod
    def backward(cls, grad_output, x, weight, padding, output_mask):
        cls.check(padding)
        grad_parities = space_to_depth(pad_each_axis(grad_output, (1,) * 3, (1,) * 3)).contiguous(
            memory_format=layout(x))
        grad_x, grad_v, grad_bias = convolution_backward(grad_parities, x, cls.weight(weight), 1, (1, 1, 1), False,
                                                         output_mask)
        grad_weight = None if grad_v is None else cls.weight_gradient(grad_v, weight)
        grad_bias = None if grad_bias is None else grad_bias.view(-1, 8).sum(1)
        return grad_x, grad_weight, grad_bias


def plain_form(conv):
    return PlainTransposedConv if isinstance(conv, nn.ConvTranspose3d) else PlainConv


def exact_form(conv):
    """The exact faster form of a U-Net layer (kernel 4, stride 2, padding 1), or None where it has none:
    the sub-pixel form for a transposed convolution; the space-to-depth form for a convolution whose input
    channels are not a multiple of 8, the count fast GPU kernels read at once (the first layer's 4 become 32)."""
    if conv.kernel_size != (4, 4, 4) or conv.stride != (2, 2, 2) or conv.padding != (1, 1, 1):
        return None
    if isinstance(conv, nn.ConvTranspose3d):
        return SubPixelTransposedConv
    return SpaceToDepthConv if conv.in_channels % 8 else None


class ExactConv(nn.Module):
    """A U-Net layer computed in an exact form; its parameters are the layer's, under the layer's names."""

    def __init__(self, conv, form):
        super().__init__()
        self.weight, self.bias = conv.weight, conv.bias
        self.form = form
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.transposed = isinstance(conv, nn.ConvTranspose3d)

    def forward(self, x):
        return self.form.forward(x, self.weight, self.bias, (1, 1, 1))

    def extra_repr(self):
        kind = "ConvTranspose3d" if self.transposed else "Conv3d"
        return f"{kind} {self.in_channels} -> {self.out_channels} in the {self.form.name} form"


def check_exact_forms(mode):
    if mode not in MODES:
        raise UserError(f"--exact_forms={mode} is not a valid choice: use auto (the default: each slow layer "
                        "in its exact faster form where that is faster on this device), on (every layer that "
                        "has an exact form uses it) or off (the layers as networks/UNet.py defines them).")


def candidates(model):
    """``[(name, parent, attribute, layer, form)]`` of the layers that have an exact form, in the model's order."""
    modules = dict(model.named_modules())
    found = []
    for name, layer in modules.items():
        form = exact_form(layer) if isinstance(layer, (nn.Conv3d, nn.ConvTranspose3d)) else None
        if form is not None:
            parent, _, attribute = name.rpartition(".")
            found.append((name, modules[parent], attribute, layer, form))
    return found


def use_exact_forms(model, params, device, mesh=None):
    """``model`` with the layers that ``--exact_forms`` picks computed in their exact forms (in place; call
    after moving the model to ``device``, before the domain wrapper and DDP/FSDP)."""
    check_exact_forms(params.exact_forms)
    layers = candidates(model)
    if params.exact_forms == "off" or not layers:
        return model
    if params.exact_forms == "on":
        chosen, why = [name for name, *_ in layers], "--exact_forms=on"
    else:
        chosen, why = choose_forms(model, layers, params, device, mesh)
    for name, parent, attribute, layer, form in layers:
        if name in chosen:
            setattr(parent, attribute, ExactConv(layer, form))
    logging.info("Exact forms: %s (%s).", ", ".join(
        f"{name} {form.name if name in chosen else 'plain'}" for name, *_, form in layers), why)
    return model


def choose_forms(model, layers, params, device, mesh):
    """``--exact_forms=auto``: ``(names of the layers to compute in their exact form, why)``.

    On a GPU both forms of each layer are timed, forward and backward, at the run's shapes, precision
    and layout (as cuDNN's benchmark mode times its algorithms), and the faster kept. Rank 0's choice
    is broadcast, so that every rank computes the same arithmetic. On a CPU the layers stay plain, with
    no timing: the test suite builds many small models, whose arithmetic and saved memory must not
    depend on a timing. On the 2-core CPU measured, plain was the faster at crop 32, but not at crop 64,
    where the first and last layers ran 5 times faster in their forms (--exact_forms=on there;
    benchmarks/results/layers/cpu-vm-2-cores-2026-11-26-fp32*.md).
    """
    if device.type != "cuda":
        return [], "auto: the plain layers on a CPU"
    shapes = input_shapes(model, params, device, mesh)
    first = next(name for name, module in model.named_modules() if isinstance(module, nn.Conv3d))
    times = {name: tuple(time_form(layer, each, shapes[name], name != first, params, device)
                         for each in (plain_form(layer), form)) for name, _, _, layer, form in layers}
    if dist.is_available() and dist.is_initialized():  # every rank computes with rank 0's choice
        decision = [times]
        dist.broadcast_object_list(decision, src=0)
        times = decision[0]
    chosen = [name for name, (plain, exact) in times.items() if exact < plain]
    timings = ", ".join(f"{name} {1e3 * plain:.2f} / {1e3 * exact:.2f}" for name, (plain, exact) in times.items())
    return chosen, f"auto: the faster of each, timed forward + backward on rank 0 in ms plain / exact: {timings}"


def micro_batch(params, mesh):
    """The samples one forward pass of this rank sees."""
    ranks = mesh.data_size if mesh is not None else (dist.get_world_size() if dist.is_initialized() else 1)
    return max(1, params.global_batch_size // ranks // params.grad_accum_steps)


def input_shapes(model, params, device, mesh):
    """``{layer name: input shape}`` at the run's micro-batch and crop (this rank's block under a mesh)."""
    side = [params.crop_size // parts for parts in (mesh.shape if mesh is not None else (1, 1, 1))]
    names = {module: name for name, module in model.named_modules()}
    shapes = {}
    hooks = [module.register_forward_pre_hook(
        lambda module, args: shapes.__setitem__(names[module], (micro_batch(params, mesh), *args[0].shape[1:])))
        for module in model.modules() if isinstance(module, (nn.Conv3d, nn.ConvTranspose3d))]
    with torch.no_grad():
        model(torch.zeros(1, params.N_in_channels, *side, device=device))
    for hook in hooks:
        hook.remove()
    return shapes


def time_form(layer, form, shape, input_grad, params, device, repeats=5):
    """Seconds per forward + backward of ``layer`` computed in ``form`` (a copy of its weights: the model's
    gradients stay untouched), after two untimed calls (cuDNN picks its algorithms at the first).
    ``input_grad``: whether the backward pass computes the input's gradient (all but the first layer)."""
    memory_format = torch.channels_last_3d if params.channels_last else torch.contiguous_format
    generator = torch.Generator(device).manual_seed(0)  # the run's random streams stay as they are
    x = torch.randn(shape, device=device, generator=generator).to(memory_format=memory_format)
    x.requires_grad_(input_grad)
    weight = layer.weight.detach().clone().requires_grad_(True)
    bias = None if layer.bias is None else layer.bias.detach().clone().requires_grad_(True)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(params.amp_mode)  # the run's autocast, if any

    def forward_backward():
        with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
            output = form.forward(x, weight, bias, (1, 1, 1))
        output.backward(torch.ones_like(output))

    for _ in range(2):
        forward_backward()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        forward_backward()
    synchronize(device)  # the host waits for the layer's kernels: they are inside the timing
    return (time.perf_counter() - start) / repeats


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
