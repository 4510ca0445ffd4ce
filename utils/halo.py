"""Domain parallelism's one idea: exchange a one-voxel halo with the neighbours before every convolution.

Under ``--domain_mesh=[d,h,w]`` the ranks of a domain group share one sample: each holds one block
of its volume (the crop split d ways along depth, h along height, w along width) and computes the
U-Net on that block alone. Every convolution of the U-Net (kernel 4, stride 2, padding 1) reads one
voxel beyond each face of an output's input window: at a face between two blocks that voxel lives
on the neighbour. So before each convolution a rank sends its first and last slice along every
split axis to the neighbours there and receives theirs (the halo), pads its block with them, and
convolves with no padding along that axis (where the block touches the crop's face there is no
neighbour and the halo is zeros, the convolution's own padding). The outputs are then exactly the
undivided model's, block by block.

The backward pass is the same exchange in reverse: the gradient that arrives for a halo voxel
belongs to the neighbour who sent it, so it is sent back and added to that neighbour's face.
:class:`HaloExchange` is that pair, an autograd function on ``torch.distributed`` point-to-point
messages (NCCL between GPUs, gloo between CPU processes), two sends and two receives per split axis
in one batch. Exchanging along depth first, then height (with the depth halo included), then width
fills the edges and corners too, so a 2 x 2 mesh needs no diagonal messages.

:func:`split_domain` swaps each convolution of a model for a :class:`HaloConv` holding the same
parameters under the same names (checkpoints do not change); with a mesh of one rank it returns the
model untouched, so nothing here costs anything unless a mesh is set. ``networks/UNet.py`` stays
the plain model.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

HALO = 1  # voxels beyond each face that a kernel-4, stride-2, padding-1 convolution reads

# What the exchanges did since the last reset_counters(): how many, and the bytes this rank sent.
COUNTERS = {"exchanges": 0, "bytes_sent": 0}


def reset_counters():
    COUNTERS.update(exchanges=0, bytes_sent=0)


def swap_faces(to_lower, to_upper, lower, upper, group):
    """Send ``to_lower`` to rank ``lower`` and ``to_upper`` to rank ``upper``; receive what they send
    back (zeros where there is no neighbour, at the crop's faces). One batch of point-to-point
    messages, so the two directions travel at the same time."""
    from_lower, from_upper = torch.zeros_like(to_lower), torch.zeros_like(to_upper)
    operations = []
    for peer, outgoing, incoming in ((lower, to_lower, from_lower), (upper, to_upper, from_upper)):
        if peer is not None:
            operations += [dist.P2POp(dist.isend, outgoing.contiguous(), peer, group),
                           dist.P2POp(dist.irecv, incoming, peer, group)]
            COUNTERS["bytes_sent"] += outgoing.numel() * outgoing.element_size()
    COUNTERS["exchanges"] += 1
    if operations:
        for request in dist.batch_isend_irecv(operations):
            request.wait()
    return from_lower, from_upper


class HaloExchange(torch.autograd.Function):
    """``x`` padded with its neighbours' faces along ``dim``: one halo voxel on each side."""

    @staticmethod
    def forward(ctx, x, dim, lower, upper, group):
        ctx.dim, ctx.lower, ctx.upper, ctx.group = dim, lower, upper, group
        side = x.size(dim)
        from_lower, from_upper = swap_faces(x.narrow(dim, 0, HALO), x.narrow(dim, side - HALO, HALO),
                                            lower, upper, group)
        return torch.cat([from_lower, x, from_upper], dim)

    @staticmethod
    def backward(ctx, grad):
        dim = ctx.dim
        side = grad.size(dim) - 2 * HALO
        # The halo's gradients go back to the faces they came from; ours come back from the neighbours.
        from_lower, from_upper = swap_faces(grad.narrow(dim, 0, HALO), grad.narrow(dim, side + HALO, HALO),
                                            ctx.lower, ctx.upper, ctx.group)
        grad_x = grad.narrow(dim, HALO, side).clone()
        grad_x.narrow(dim, 0, HALO).add_(from_lower)
        grad_x.narrow(dim, side - HALO, HALO).add_(from_upper)
        return grad_x, None, None, None, None


def exchange_halos(x, mesh):
    """``x`` (B, C, D, H, W), this rank's block, with a halo along every axis the mesh splits."""
    for axis, (lower, upper) in enumerate(mesh.neighbours):
        if mesh.shape[axis] > 1:
            x = HaloExchange.apply(x, 2 + axis, lower, upper, mesh.group)
    return x


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
        if conv.kernel_size != (4, 4, 4) or conv.stride != (2, 2, 2) or conv.padding != (1, 1, 1):
            raise ValueError(f"HaloConv supports kernel 4, stride 2, padding 1, not {conv}")
        self.weight, self.bias = conv.weight, conv.bias
        self.transposed = isinstance(conv, nn.ConvTranspose3d)
        self.mesh = mesh
        self.split_axes = tuple(axis for axis, parts in enumerate(mesh.shape) if parts > 1)
        self.padding = (1, 1, 1) if self.transposed else tuple(0 if parts > 1 else 1 for parts in mesh.shape)

    def forward(self, x):
        x = exchange_halos(x, self.mesh)
        if not self.transposed:
            return F.conv3d(x, self.weight, self.bias, stride=2, padding=self.padding)
        x = F.conv_transpose3d(x, self.weight, self.bias, stride=2, padding=self.padding)
        for axis in self.split_axes:
            x = x.narrow(2 + axis, 2 * HALO, x.size(2 + axis) - 4 * HALO)
        return x

    def extra_repr(self):
        kind = "ConvTranspose3d" if self.transposed else "Conv3d"
        return f"{kind}, weight {tuple(self.weight.shape)}, halo along mesh {list(self.mesh.shape)}"


def split_domain(model, mesh):
    """``model`` with every 3-D convolution computing on this rank's block; ``model`` itself when the
    mesh has one rank. Changes the model in place (call before DDP/FSDP wrap it)."""
    if mesh.size == 1:
        return model
    for module in list(model.modules()):
        for name, child in module.named_children():
            if isinstance(child, (nn.Conv3d, nn.ConvTranspose3d)):
                setattr(module, name, HaloConv(child, mesh))
    return model
