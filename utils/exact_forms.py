"""Exact, faster forms of the U-Net's slow layers: the same arithmetic, arranged for fast kernels.

The U-Net's transposed convolutions (kernel 4, stride 2, padding 1) run, on a GPU, as strided
backward-data kernels, slow above all for the last layer's 5 output channels; its first convolution
reads 4 channels. Each is computed here by a stride-1, kernel-2 convolution with the same weights,
rearranged, and a reshuffle of voxels (one index per axis; the three axes are alike):

- Sub-pixel transposed convolution. ``y[o] = sum over o = 2i + k - 1 of x[i] w[k]``, so
  ``y[2m] = x[m] w[1] + x[m-1] w[3]`` and ``y[2m+1] = x[m] w[2] + x[m+1] w[0]``. A kernel-2,
  padding-1 convolution ``z_a[t] = x[t-1] v_a[0] + x[t] v_a[1]`` with ``v_a[t] = w[3 - 2t - a]``
  gives ``z_1[t] = y[2t - 1]`` and ``z_0[t] = y[2t]``, t = 0..n: voxel ``q = 2m + r`` of ``y`` is
  parity ``a = r`` at ``t = m + r``. 8 parities in 3-D: 8 times the output channels (128 -> 40 for
  the last layer).
- Space-to-depth first convolution. ``y[o] = sum_k xp[2o + k] w[k]`` over the input ``xp`` padded by
  ``p``; with ``k = 2t + s`` that is a kernel-2, stride-1 convolution of ``xp`` folded into 2 x 2 x 2
  blocks (4 channels become 32): block ``t``, parity ``a = s xor p``, holds ``x[2t + s - p]``, so again
  voxel ``q = 2m + r`` of ``x`` is parity ``a = r`` at ``t = m + p r``, and ``v_a[t] = w[2t + (a xor p)]``.

Both reshuffles are therefore one strided view between a spatial tensor and its parities, stored
parity-major (channel ``8 a + c`` would interleave; ``a C + c`` keeps each voxel's C channels together),
and :func:`to_parities` / :func:`from_parities` move the voxels in ONE copy, in either layout (the
channels-last one of ``--channels_last`` included), the padding and the crop folded into that copy.
The first layer's input is cast to the autocast dtype before its reshuffle: half the bytes.

The forms' weights are rearranged from the layer's own parameters inside the forward pass, so
autograd returns the layer's own gradients and the state_dict, checkpoints and ``networks/UNet.py``
do not change. :func:`use_exact_forms` applies the forms ``--exact_forms`` asks for when the model
is built: ``off``, ``on`` (every layer that has one), a list of layer names (``[down.0.0, last]``;
``[]``: none), or ``auto``, whatever is faster on the device (see :func:`choose_forms`), said in one
log line and recorded as that list in the run's options (config.yaml): a resumed run computes the same
arithmetic without timing again. Under a domain mesh ``utils/halo.py``'s HaloConv computes its block's
convolution with the layer's form, forward and backward.
"""
import contextlib
import logging
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from networks.UNet import UNet
from utils.errors import UserError

MODES = ("auto", "on", "off")


def layout(*tensors):
    """The memory format a form's tensors keep (--channels_last): channels_last_3d where one of ``tensors``
    is stored so (and not also contiguous, as a tensor of one channel or one voxel is), else contiguous."""
    channels_last = any(tensor.is_contiguous(memory_format=torch.channels_last_3d) and not tensor.is_contiguous()
                        for tensor in tensors)
    return torch.channels_last_3d if channels_last else torch.contiguous_format


def strides_of(shape, memory_format):
    """The strides of a 5-d tensor of ``shape`` stored in ``memory_format`` (contiguous or channels_last_3d),
    as ``torch.empty`` makes them: computed, not read, because torch 2.4's compiler refuses ``.stride()``
    inside an autograd.Function."""
    fastest_first = (1, 4, 3, 2, 0) if memory_format == torch.channels_last_3d else (4, 3, 2, 1, 0)
    strides, step = [0] * 5, 1
    for axis in fastest_first:
        strides[axis], step = step, step * shape[axis]
    return strides


def parity_grid(parities, shifts, memory_format):
    """``parities`` (N, 8C, T_d, T_h, T_w), stored in ``memory_format``, channel ``(4 a_d + 2 a_h + a_w) C + c``,
    viewed as the spatial tensor's voxels (N, C, M_d, 2, M_h, 2, M_w, 2), voxel ``q = 2m + r`` per axis: parity
    ``a = r`` at ``t = m + shift r``, ``M = T - shift``. One strided view of either layout, no copy (per axis the
    offset ``r S_a + (m + shift r) S_t`` is linear in m and r)."""
    n, channels, *sides = parities.shape
    stride_n, stride_c, *stride_t = strides_of(parities.shape, memory_format)
    per_parity = channels // 8 * stride_c  # parity a_w's stride; a_h's is twice it, a_d's four times
    size, stride = [n, channels // 8], [stride_n, stride_c]
    for axis, shift in enumerate(shifts):
        size += [sides[axis] - shift, 2]
        stride += [stride_t[axis], (4 >> axis) * per_parity + shift * stride_t[axis]]
    return parities.as_strided(size, stride)  # from the storage offset of parities


def voxel_pairs(x):
    """(N, C, 2M_d, 2M_h, 2M_w) viewed as (N, C, M_d, 2, M_h, 2, M_w, 2): voxel ``2m + r`` at (m, r)."""
    n, channels, *sides = x.shape
    return x.view(n, channels, *[size for side in sides for size in (side // 2, 2)])


def from_parities(parities, shifts, memory_format):
    """The spatial tensor (N, C, 2M_d, 2M_h, 2M_w) of :func:`parity_grid`, in ``memory_format``: one copy
    (depth to space; parities that fall outside, the sub-pixel form's crop, are never read)."""
    grid = parity_grid(parities.contiguous(memory_format=memory_format), shifts, memory_format)  # no copy if so
    n, channels, *sizes = grid.shape
    output = torch.empty(n, channels, *[2 * side for side in sizes[::2]], dtype=parities.dtype,
                         device=parities.device, memory_format=memory_format)
    voxel_pairs(output).copy_(grid)
    return output


def to_parities(x, shifts, sides, memory_format):
    """The parities (N, 8C, *sides) of :func:`parity_grid` of the spatial tensor ``x`` (even sides), in
    ``memory_format``: one copy (space to depth), and zeros where a parity falls outside ``x`` (the
    padding: with a shift, parity 1 at t = 0 and parity 0 at the last t)."""
    n, channels = x.shape[:2]
    parities = torch.empty(n, 8 * channels, *sides, dtype=x.dtype, device=x.device, memory_format=memory_format)
    blocks = parities.view(n, 2, 2, 2, channels, *sides)
    for axis, shift in enumerate(shifts):
        if shift:
            blocks.select(1 + axis, 1).narrow(4 + axis, 0, 1).zero_()
            blocks.select(1 + axis, 0).narrow(4 + axis, sides[axis] - 1, 1).zero_()
    parity_grid(parities, shifts, memory_format).copy_(voxel_pairs(x))
    return parities


class ToParities(torch.autograd.Function):
    """:func:`to_parities` with :func:`from_parities` as its backward (each is the other's adjoint)."""

    @staticmethod
    def forward(ctx, x, shifts, sides, memory_format):
        ctx.shifts, ctx.memory_format = shifts, memory_format
        return to_parities(x, shifts, sides, memory_format)

    @staticmethod
    def backward(ctx, grad):
        return from_parities(grad, ctx.shifts, ctx.memory_format), None, None, None


class FromParities(torch.autograd.Function):
    """:func:`from_parities` with :func:`to_parities` as its backward."""

    @staticmethod
    def forward(ctx, parities, shifts, memory_format):
        ctx.shifts, ctx.sides, ctx.memory_format = shifts, parities.shape[2:], memory_format
        return from_parities(parities, shifts, memory_format)

    @staticmethod
    def backward(ctx, grad):
        return to_parities(grad, ctx.shifts, ctx.sides, ctx.memory_format), None, None


def pad_each_axis(x, before, after):
    """``x`` padded with zeros along D, H, W by ``before[axis]`` and ``after[axis]`` (negative: cropped)."""
    return F.pad(x, [side for axis in (2, 1, 0) for side in (before[axis], after[axis])])  # last axis first


def in_autocast_dtype(x):
    """``x`` cast as autocast would cast it for a convolution (where autocast is on): the first layer's
    input is then reshuffled in half the bytes, and cast once."""
    kind = x.device.type  # autocast exists on the devices a run uses, not on the meta device
    eligible = x.is_floating_point() and x.dtype != torch.float64  # as autocast's own casts
    if eligible and kind in ("cpu", "cuda") and torch.is_autocast_enabled(kind):
        return x.to(torch.get_autocast_dtype(kind))
    return x


def convolution_backward(grad_output, x, weight, stride, padding, transposed, output_mask):
    """``(grad_input, grad_weight, grad_bias)`` of one convolution (None where ``output_mask`` says so)."""
    out_channels = weight.shape[1 if transposed else 0]
    return torch.ops.aten.convolution_backward(grad_output, x, weight, [out_channels], [stride] * 3, list(padding),
                                               [1, 1, 1], transposed, [0, 0, 0], 1, output_mask)


def weight_gradient(rearrange, weight, grad_v):
    """The gradient of ``weight`` from that of ``rearrange(weight)``: the rearrangement undone (a permutation)."""
    with torch.enable_grad():
        leaf = weight.detach().requires_grad_(True)
        return torch.autograd.grad(rearrange(leaf), leaf, grad_v)[0]


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
    padded input folded into 2 x 2 x 2 blocks, parity-major (:func:`to_parities`: one copy, the padding
    in it). An odd side is padded first (one copy more), and the padded side folded without a shift; an
    odd padded side loses its last voxel, which the stride-2 convolution never reads either."""
    name = "space-to-depth"

    @staticmethod
    def weight(weight, shifts):
        """(out, in, 4, 4, 4) -> (out, 8 in, 2, 2, 2): ``v[o, a in + i][t] = w[o, i][2t + (a xor shift)]`` per axis."""
        out_channels, in_channels = weight.shape[:2]
        blocks = weight.reshape(out_channels, in_channels, 2, 2, 2, 2, 2, 2)  # (o, i, t_d, s_d, t_h, s_h, t_w, s_w)
        flipped = [3 + 2 * axis for axis, shift in enumerate(shifts) if shift]
        blocks = blocks.flip(flipped) if flipped else blocks
        v = blocks.permute(0, 3, 5, 7, 1, 2, 4, 6).reshape(out_channels, 8 * in_channels, 2, 2, 2)
        return v.contiguous(memory_format=layout(weight))

    @staticmethod
    def trimmed(x, padding):
        """Padding after each axis: the layer's, less one voxel where the padded side would be odd."""
        return [p - (side + 2 * p) % 2 for side, p in zip(x.shape[2:], padding)]

    @classmethod
    def folding(cls, x, padding):
        """``(tensor folded, its shifts, parity sides)``: ``x`` itself with the layer's padding as shifts
        where every side is even, else ``x`` padded (a copy) and folded without shifts."""
        if all(side % 2 == 0 for side in x.shape[2:]):
            return x, tuple(padding), [side // 2 + p for side, p in zip(x.shape[2:], padding)]
        padded = pad_each_axis(x, padding, cls.trimmed(x, padding))
        return padded, (0, 0, 0), [side // 2 for side in padded.shape[2:]]

    @classmethod
    def forward(cls, x, weight, bias, padding):
        folded, shifts, sides = cls.folding(in_autocast_dtype(x), padding)
        blocks = ToParities.apply(folded, shifts, sides, layout(x, weight))
        return F.conv3d(blocks, cls.weight(weight, shifts), bias)

    @classmethod
    def backward(cls, grad_output, x, weight, padding, output_mask):
        folded, shifts, sides = cls.folding(x, padding)
        memory_format = layout(x, weight)
        grad_blocks, grad_v, grad_bias = convolution_backward(
            grad_output, to_parities(folded, shifts, sides, memory_format), cls.weight(weight, shifts), 1, (0, 0, 0),
            False, output_mask)
        grad_x = None if grad_blocks is None else from_parities(grad_blocks, shifts, memory_format)
        if grad_x is not None and folded is not x:  # the padding added, cropped again
            grad_x = pad_each_axis(grad_x, [-p for p in padding], [-p for p in cls.trimmed(x, padding)])
        grad_weight = None if grad_v is None else weight_gradient(lambda w: cls.weight(w, shifts), weight, grad_v)
        return grad_x, grad_weight, grad_bias


class SubPixelTransposedConv:
    """A ConvTranspose3d (kernel 4, stride 2, padding 1) as a kernel-2, stride-1, padding-1 Conv3d with
    8 times the output channels, parity-major, moved to space in one copy that leaves out the first and
    last voxel per axis (:func:`from_parities`)."""
    name = "sub-pixel"
    shifts = (1, 1, 1)

    @staticmethod
    def weight(weight):
        """(in, out, 4, 4, 4) -> (8 out, in, 2, 2, 2): ``v[a out + o, i][t] = w[i, o][3 - 2t - a]`` per axis."""
        in_channels, out_channels = weight.shape[:2]
        # Flipping a side of 4, k -> 3 - k with k = 2t + a, flips both t and a: done after the reshape, as one flip
        # (torch 2.4's compiler computes a wrong gradient for a flip, then a reshape and a permute).
        blocks = weight.reshape(in_channels, out_channels, 2, 2, 2, 2, 2, 2).flip(2, 3, 4, 5, 6, 7)  # (i, o, t_d, a_d, ...)
        v = blocks.permute(3, 5, 7, 1, 0, 2, 4, 6).reshape(8 * out_channels, in_channels, 2, 2, 2)
        return v.contiguous(memory_format=layout(weight))

    @staticmethod
    def check(padding):
        if tuple(padding) != (1, 1, 1):
            raise ValueError(f"the sub-pixel form computes a transposed convolution of padding 1, not {padding}")

    @classmethod
    def forward(cls, x, weight, bias, padding):
        cls.check(padding)
        bias = None if bias is None else bias.repeat(8)  # one per parity of each output channel
        parities = F.conv3d(x, cls.weight(weight), bias, padding=1)
        return FromParities.apply(parities, cls.shifts, layout(x, weight))

    @classmethod
    def backward(cls, grad_output, x, weight, padding, output_mask):
        cls.check(padding)
        memory_format = layout(x, weight)
        grad_parities = to_parities(grad_output, cls.shifts, [side + 1 for side in x.shape[2:]], memory_format)
        grad_x, grad_v, grad_bias = convolution_backward(grad_parities, x, cls.weight(weight), 1, (1, 1, 1), False,
                                                         output_mask)
        grad_weight = None if grad_v is None else weight_gradient(cls.weight, weight, grad_v)
        grad_bias = None if grad_bias is None else grad_bias.view(8, -1).sum(0)
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


def option_text(setting):
    """``--exact_forms``'s value as the command line writes it: ``auto``, ``on``, ``off`` or ``[down.0.0,last]``."""
    return f"[{','.join(map(str, setting))}]" if isinstance(setting, list) else str(setting)


def check_exact_forms(setting, names):
    """Refuse an ``--exact_forms`` that is neither a mode nor a list of the layers (``names``) that have a form."""
    if isinstance(setting, list):
        unknown = [str(name) for name in setting if name not in names]
        if not unknown:
            return
        problem = f"names {', '.join(unknown)}, which {'is not a layer' if len(unknown) == 1 else 'are not layers'} " \
                  "with an exact form"
    elif setting in MODES:
        return
    else:
        problem = "is not a valid choice"
    raise UserError(f"--exact_forms={option_text(setting)} {problem}: use auto (the default: each slow layer in its "
                    "exact faster form where that is faster on this device), on (every layer that has an exact form "
                    "uses it), off (the layers as networks/UNet.py defines them), or a list of the layers to compute "
                    f"in their forms, e.g. --exact_forms=[{names[0]},{names[-1]}] ([] for none), of "
                    f"{', '.join(names)}.")


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
    after moving the model to ``device``, before the domain wrapper and DDP/FSDP). ``auto`` decides here,
    once, and ``params.exact_forms`` becomes the list of layers it chose: the run's options (config.yaml)
    record it, and a ``--resume`` computes with the same forms, without timing again."""
    layers = candidates(model)
    setting = params.exact_forms
    check_exact_forms(setting, [name for name, *_ in layers])
    if setting == "off" or not layers:
        return model
    if setting == "on":
        chosen, why = [name for name, *_ in layers], "--exact_forms=on"
    elif setting == "auto":
        chosen, why = choose_forms(model, layers, params, device, mesh)
        params["exact_forms"] = chosen
        why += f"; recorded as --exact_forms={option_text(chosen)}"
    else:
        chosen, why = setting, f"--exact_forms={option_text(setting)}"
    for name, parent, attribute, layer, form in layers:
        if name in chosen:
            setattr(parent, attribute, ExactConv(layer, form))
    logging.info("Exact forms: %s (%s).", ", ".join(
        f"{name} {form.name if name in chosen else 'plain'}" for name, *_, form in layers), why)
    return model


def choose_forms(model, layers, params, device, mesh):
    """``--exact_forms=auto``: ``(names of the layers to compute in their exact form, why)``.

    On a GPU both forms of each layer are timed, forward and backward, at the run's shapes (found on the
    meta device: nothing runs but the candidates), precision and layout, as cuDNN's benchmark mode times
    its algorithms, and the faster kept (:func:`time_forms`). Rank 0's choice is broadcast, so that every
    rank computes the same arithmetic. The timing is eager: under ``--jit_mode=compile`` the compiler fuses
    the reshuffles into the kernels beside them, so the timing overstates a form's cost there and may keep
    a layer plain that would pay compiled (compiling each candidate would cost more than the timing saves).
    On a CPU the layers stay plain, with no timing: the test suite builds many small models, whose
    arithmetic and saved memory must not depend on a timing. On an idle 2-core CPU, every form on made the
    step slower at crop 32 (84 against 61 ms) and no faster at crop 64, where the first and last layers
    alone (``--exact_forms=[down.0.0,last]``) gave the fastest step
    (benchmarks/results/layers/cpu-vm-2-cores-2026-11-27-fp32-4.md to -7.md).
    """
    if device.type != "cuda":
        return [], "auto: the plain layers on a CPU"
    sides = [params.crop_size // parts for parts in (mesh.shape if mesh is not None else (1, 1, 1))]
    _, shapes = convolution_inputs(params, micro_batch(params, mesh), sides)
    first = next(name for name, module in model.named_modules() if isinstance(module, nn.Conv3d))
    times = {name: time_forms(layer, (plain_form(layer), form), shapes[name], name == first, params, device)
             for name, _, _, layer, form in layers}
    if dist.is_available() and dist.is_initialized():  # every rank computes with rank 0's choice
        decision = [times]
        dist.broadcast_object_list(decision, src=0)
        times = decision[0]
    chosen = [name for name, (plain, exact) in times.items() if exact < plain]
    timings = ", ".join(f"{name} {1e3 * plain:.2f} / {1e3 * exact:.2f}" for name, (plain, exact) in times.items())
    return chosen, ("auto: the faster of each, timed eager, forward + backward, on rank 0; median ms plain / exact: "
                    + timings)


def micro_batch(params, mesh):
    """The samples one forward pass of this rank sees."""
    ranks = mesh.data_size if mesh is not None else (dist.get_world_size() if dist.is_initialized() else 1)
    return max(1, params.global_batch_size // ranks // params.grad_accum_steps)


def convolution_inputs(params, batch, sides):
    """``(model, {name: input shape})``: the U-Net ``params`` configure, built on the meta device (shapes only:
    no memory, nothing computed), and the input shape of each of its convolutions for ``batch`` samples of
    ``sides`` (D, H, W)."""
    with torch.device("meta"):
        model = UNet(params.N_in_channels, params.N_out_channels, params.base_channels, params.full_scale)
        names = {module: name for name, module in model.named_modules()}
        shapes = {}
        hooks = [module.register_forward_pre_hook(
            lambda module, args: shapes.__setitem__(names[module], tuple(args[0].shape)))
            for module in model.modules() if isinstance(module, (nn.Conv3d, nn.ConvTranspose3d))]
        model(torch.empty(batch, params.N_in_channels, *sides))
    for hook in hooks:
        hook.remove()
    return model, shapes


def time_forms(layer, forms, shape, first, params, device, rounds=7):
    """Median seconds per forward + backward of ``layer`` in each of ``forms`` (on copies of its weights: the
    model's gradients stay untouched), the forms called in turn, in the order ABBA..., each call timed
    alone, after two untimed calls of each (cuDNN picks its algorithms at the first). The input is the
    run's: in its layout, and in the autocast dtype but for the ``first`` layer's (the data), which needs
    no gradient; gradients are returned, never accumulated."""
    memory_format = torch.channels_last_3d if params.channels_last else torch.contiguous_format
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(params.amp_mode)  # the run's autocast, if any
    generator = torch.Generator(device).manual_seed(0)  # the run's random streams stay as they are
    x = torch.randn(shape, device=device, generator=generator).to(
        dtype=torch.float32 if first or dtype is None else dtype, memory_format=memory_format)
    weight = layer.weight.detach().clone().requires_grad_(True)
    bias = None if layer.bias is None else layer.bias.detach().clone().requires_grad_(True)
    inputs = [tensor for tensor in (x.requires_grad_(not first), weight, bias)
              if tensor is not None and tensor.requires_grad]
    grads = {}

    def forward_backward(form):
        with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
            output = form.forward(x, weight, bias, (1, 1, 1))
        torch.autograd.grad(output, inputs, grads.setdefault(form, torch.ones_like(output)))

    for form in [*forms, *forms]:
        forward_backward(form)
    seconds = {form: [] for form in forms}
    for round in range(rounds):
        for form in forms if round % 2 == 0 else forms[::-1]:
            synchronize(device)
            start = time.perf_counter()
            forward_backward(form)
            synchronize(device)  # the host waits for the layer's kernels: they are inside the timing
            seconds[form].append(time.perf_counter() - start)
    return tuple(statistics.median(seconds[form]) for form in forms)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
