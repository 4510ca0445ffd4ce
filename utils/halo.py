"""Domain parallelism's one idea: exchange a one-voxel halo with the neighbours before every convolution.

Under ``--domain_mesh=[d,h,w]`` the ranks of a domain group share one sample: each holds one block
of its volume (the crop split d ways along depth, h along height, w along width) and computes the
U-Net on that block alone. Every convolution of the U-Net (kernel 4, stride 2, padding 1) reads one
voxel beyond each face of an output's input window: at a face between two blocks that voxel lives
on the neighbour. So before each convolution a rank sends its first and last slice along every
split axis to the neighbours there and receives theirs (the halo), pads its block with them, and
convolves with no padding along that axis. Where the block touches the crop's face there is no
neighbour: the padded copy gets one slice of zeros there, the undivided convolution's own padding,
and nothing is sent, received or saved for it. The outputs are then the undivided model's, block by
block, up to the rounding of sums taken in another order.

The backward pass is the same exchange in reverse: the gradient that arrives for a halo voxel
belongs to the neighbour who sent it, so it is sent back and added to that neighbour's face.
:class:`HaloConvFunction` is that pair around the convolution, an autograd function on
``torch.distributed`` point-to-point messages (NCCL between GPUs, gloo between CPU processes), up to
two sends and two receives per split axis in one batch (:func:`swap_faces`), waited for before the
convolution runs: nothing overlaps the messages with compute. Exchanging along depth
first, then height (with the depth halo included), then width fills the edges and corners too, so a
2 x 2 mesh needs no diagonal messages.

:func:`split_domain` swaps each convolution of a model for a :class:`HaloConv` holding the same
parameters under the same names (checkpoints do not change), computing in the layer's form (the
plain convolution, or the exact form utils/exact_forms.py swapped in); with a mesh of one rank it
returns the model untouched, so nothing here costs anything unless a mesh is set.
``networks/UNet.py`` stays the plain model.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from utils.exact_forms import ExactConv, plain_form

HALO = 1  # voxels beyond each face that a kernel-4, stride-2, padding-1 convolution reads

# What the exchanges did since the last reset_counters(): how many, and the bytes this rank sent.
COUNTERS = {"exchanges": 0, "bytes_sent": 0}


def reset_counters():
    COUNTERS.update(exchanges=0, bytes_sent=0)


def swap_faces(to_lower, to_upper, lower, upper, group):
    """Send ``to_lower`` to rank ``lower`` and ``to_upper`` to rank ``upper``; receive what they send
    back: ``(from_lower, from_upper)``, None where there is no neighbour (at the crop's faces). One batch
    of point-to-point messages, so the two directions travel at the same time. Blocking: it returns
    when the messages have arrived, and nothing computes while they travel."""
    received, operations = [], []
    for peer, outgoing in ((lower, to_lower), (upper, to_upper)):
        incoming = None
        if peer is not None:
            incoming = torch.empty_like(outgoing, memory_format=torch.contiguous_format)
            operations += [dist.P2POp(dist.isend, outgoing.contiguous(), peer, group),
                           dist.P2POp(dist.irecv, incoming, peer, group)]
            COUNTERS["bytes_sent"] += outgoing.numel() * outgoing.element_size()
        received.append(incoming)
    COUNTERS["exchanges"] += 1
    if operations:  # every rank of the group calls this in the same layer, as NCCL's first call needs
        for request in dist.batch_isend_irecv(operations):
            request.wait()  # NCCL: the compute stream waits for the messages, the host does not
    return tuple(received)


def padded_block(x, layer):
    """``x`` in the middle of a tensor one slice longer at each end of every split axis, in one copy: the
    slices at the crop's faces zeros (the undivided convolution's padding, no tensor of zeros made), the
    others left for the neighbours' faces."""
    shape = list(x.shape)
    for axis in layer.split_axes:
        shape[2 + axis] += 2 * HALO
    block = x.new_empty(shape)
    interior(block, layer).copy_(x)
    for axis in layer.split_axes:
        for peer, start in zip(layer.mesh.neighbours[axis], (0, shape[2 + axis] - HALO)):
            if peer is None:
                block.narrow(2 + axis, start, HALO).zero_()
    return block


def interior(block, layer):
    """The block's own voxels in a padded block (a view)."""
    for axis in layer.split_axes:
        block = block.narrow(2 + axis, HALO, block.size(2 + axis) - 2 * HALO)
    return block


def exchanged_part(block, layer, index):
    """The part of a padded block that the exchange along the ``index``-th split axis reads and writes (a
    view): the halos of the axes exchanged before it included, so that the corners travel on; the
    interior only along the axes exchanged after it, whose halos are not there yet."""
    for axis in layer.split_axes[index + 1:]:
        block = block.narrow(2 + axis, HALO, block.size(2 + axis) - 2 * HALO)
    return block


def fill_halo(part, dim, from_lower, from_upper):
    """Write the neighbours' faces into the first and last slice of ``part`` along ``dim`` (None: none there)."""
    for face, start in ((from_lower, 0), (from_upper, part.size(dim) - HALO)):
        if face is not None:
            part.narrow(dim, start, HALO).copy_(face)


def add_halos(x, layer):
    """``x`` padded with its neighbours' faces along each split axis, depth then height then width:
    ``(padded, [from_lower, from_upper per axis])``, a face None where it is the crop's."""
    block, halos = padded_block(x, layer), []
    for index, axis in enumerate(layer.split_axes):
        part, dim = exchanged_part(block, layer, index), 2 + axis
        side = part.size(dim)
        lower, upper = layer.mesh.neighbours[axis]
        from_lower, from_upper = swap_faces(part.narrow(dim, HALO, HALO), part.narrow(dim, side - 2 * HALO, HALO), lower,
                                            upper, layer.mesh.group)
        fill_halo(part, dim, from_lower, from_upper)
        halos += [from_lower, from_upper]
    return block, halos


def return_halo_gradients(grad, layer):
    """The backward of :func:`add_halos` on the padded block's gradient ``grad`` (summed into in place):
    the halos' gradients go back to the faces they came from, axes in reverse order, and the neighbours'
    are added to ours; at the crop's faces the padding's gradient is dropped. Returns the block's own part."""
    for index in reversed(range(len(layer.split_axes))):
        axis = layer.split_axes[index]
        part, dim = exchanged_part(grad, layer, index), 2 + axis
        side = part.size(dim)
        lower, upper = layer.mesh.neighbours[axis]
        from_lower, from_upper = swap_faces(part.narrow(dim, 0, HALO), part.narrow(dim, side - HALO, HALO), lower,
                                            upper, layer.mesh.group)
        if from_lower is not None:
            part.narrow(dim, HALO, HALO).add_(from_lower)
        if from_upper is not None:
            part.narrow(dim, side - 2 * HALO, HALO).add_(from_upper)
    return interior(grad, layer).contiguous()


class HaloConvFunction(torch.autograd.Function):
    """Halo exchange and convolution of one block, forward and backward, as one autograd function.

    Forward: pad the block with the neighbours' faces along each split axis (depth, then height, then
    width), convolve. It saves the block and the thin halos received (none at the crop's faces), not the
    padded copy: the block is the tensor the previous layer's activation saves anyway, so a rank holds
    about 1/N of the undivided activations (a padded copy kept for backward would double them). The
    padded copy is made once whatever the number of split axes; it is transient, but counts towards
    the peak memory. Backward: rebuild the padded block, the convolution's gradients, then the halo
    gradients sent back to the neighbours, axes in reverse order, and the block's part cut out once.
    Under autocast the convolution runs in the autocast dtype, in both directions. The backward pass
    is the form's own (``form.backward``: the plain layer's is ``aten.convolution_backward``, an exact
    form's rearranges the gradients around its own convolution's), so the halo stays exact in either form.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        block, halos = add_halos(x, layer)
        output = layer.convolve(block, weight, bias)
        ctx.layer, ctx.dtype, ctx.has_bias = layer, output.dtype, bias is not None
        ctx.save_for_backward(x, weight, *halos)  # None for the faces that are the crop's
        return output

    @staticmethod
    def backward(ctx, grad_output):
        layer = ctx.layer
        x, weight, *halos = ctx.saved_tensors
        block = padded_block(x, layer)
        for index, axis in enumerate(layer.split_axes):
            fill_halo(exchanged_part(block, layer, index), 2 + axis, halos[2 * index], halos[2 * index + 1])
        grad_padded, grad_weight, grad_bias = layer.form.backward(
            layer.uncropped(grad_output).to(ctx.dtype), block.to(ctx.dtype), weight.to(ctx.dtype), layer.padding,
            [ctx.needs_input_grad[0], True, ctx.has_bias])
        grad_x = None
        if ctx.needs_input_grad[0]:  # the U-Net's input needs none: its halos need not travel back
            grad_x = return_halo_gradients(grad_padded.to(x.dtype), layer)  # the convolution's own tensor
        grad_bias = grad_bias.to(weight.dtype) if ctx.has_bias else None
        return grad_x, grad_weight.to(weight.dtype), grad_bias, None


class HaloConv(nn.Module):
    """A U-Net ``Conv3d`` or ``ConvTranspose3d`` (kernel 4, stride 2, padding 1) on one block of the volume.

    Along a split axis the halo replaces the padding: the convolution runs with padding 0 there. The
    transposed convolution keeps its padding 1 and its output drops two voxels at each end along a split
    axis, the ones the halo voxels alone produce: ``(n + 2 - 1) * 2 - 2 + 4 - 2 * 2 = 2n``. (Padding 3,
    which would crop them in the layer, makes the CPU's oneDNN transposed-convolution backward corrupt
    the heap in torch 2.13.) The parameters are the original layer's, under its names.
    """

    def __init__(self, conv, mesh):
        super().__init__()
        shape = None if isinstance(conv, ExactConv) else (conv.kernel_size, conv.stride, conv.padding)
        if shape not in (None, ((4, 4, 4), (2, 2, 2), (1, 1, 1))):  # an ExactConv exists for such layers only
            raise ValueError(f"HaloConv supports kernel 4, stride 2, padding 1, not {conv}")
        self.weight, self.bias = conv.weight, conv.bias
        self.transposed = conv.transposed if isinstance(conv, ExactConv) else isinstance(conv, nn.ConvTranspose3d)
        self.form = conv.form if isinstance(conv, ExactConv) else plain_form(conv)  # how the block is convolved
        self.mesh = mesh
        self.split_axes = tuple(axis for axis, parts in enumerate(mesh.shape) if parts > 1)
        self.padding = (1, 1, 1) if self.transposed else tuple(0 if parts > 1 else 1 for parts in mesh.shape)

    def forward(self, x):
        return HaloConvFunction.apply(x, self.weight, self.bias, self)

    def convolve(self, padded, weight, bias):
        """The layer's convolution of a block padded with its halos."""
        output = self.form.forward(padded, weight, bias, self.padding)
        if not self.transposed:
            return output
        for axis in self.split_axes:
            output = output.narrow(2 + axis, 2 * HALO, output.size(2 + axis) - 4 * HALO)
        # A copy, not a view: the ReLU after it works in place, and the uncropped output can be freed.
        return output.clone()

    def uncropped(self, grad_output):
        """The gradient of the transposed convolution's whole output: zeros where :meth:`convolve` cropped."""
        if not self.transposed:
            return grad_output
        pad = [0] * 6
        for axis in self.split_axes:  # F.pad lists the last dimension first
            pad[2 * (2 - axis)] = pad[2 * (2 - axis) + 1] = 2 * HALO
        return F.pad(grad_output, pad)

    def extra_repr(self):
        kind = "ConvTranspose3d" if self.transposed else "Conv3d"
        return (f"{kind}, weight {tuple(self.weight.shape)}, {self.form.name} form, halo along mesh "
                f"{list(self.mesh.shape)}")


# Layers that reach beyond one voxel's neighbourhood: on a block, a normalisation would use the block's
# statistics instead of the sample's (they need an all-reduce over the domain group), and a pooling or
# resampling layer would need halos of its own width. The U-Net has none of them.
NOT_SPLIT = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.modules.pooling._MaxPoolNd,
             nn.modules.pooling._AvgPoolNd, nn.modules.pooling._AdaptiveAvgPoolNd,
             nn.modules.pooling._AdaptiveMaxPoolNd, nn.Upsample)


def split_domain(model, mesh):
    """``model`` with every 3-D convolution computing on this rank's block; ``model`` itself when the
    mesh has one rank. Changes the model in place (call before DDP/FSDP wrap it). A model with a
    normalisation, pooling or resampling layer is refused: on a block it would compute something else."""
    if mesh.size == 1:
        return model
    for name, module in model.named_modules():
        if isinstance(module, NOT_SPLIT):
            raise ValueError(f"split_domain cannot split {name} ({type(module).__name__}) over blocks: it "
                             "reaches beyond a voxel's neighbours (a normalisation needs the whole sample's "
                             "statistics, an all-reduce over the domain group), and utils/halo.py exchanges "
                             "the halos of kernel-4, stride-2 convolutions only.")
    for module in list(model.modules()):
        for name, child in module.named_children():
            if isinstance(child, (nn.Conv3d, nn.ConvTranspose3d, ExactConv)):
                setattr(module, name, HaloConv(child, mesh))
    return model
