"""The 3D U-Net that maps N-body fields (4 channels) to hydrodynamic fields (5 channels).

Encoder: blocks of Conv3d(kernel 4, stride 2, padding 1) + LeakyReLU (PyTorch's default negative
slope, 0.01, as in the original), each halving the cube side.
Decoder: blocks of ConvTranspose3d(kernel 4, stride 2, padding 1) + ReLU, each doubling it and
followed by concatenation with the encoder output of the same scale (the skip connection).
A final ConvTranspose3d to the output channels and a tanh, because the targets are scaled to (-1, 1).

With ``base_channels=64`` the widths are the original's: 64, 128, 256, 512, 512 (and one more
512 block when ``full_scale``, so that a 64^3 crop reaches 1^3), about 117 M parameters.
Smaller ``base_channels`` scale every width, so the same network fits a laptop CPU.
"""
import torch
from torch import nn


def down_block(in_channels, out_channels):
    return nn.Sequential(
        nn.Conv3d(in_channels, out_channels, kernel_size=4, stride=2, padding=1),
        nn.LeakyReLU(inplace=True),  # negative slope 0.01, the original's
    )


def up_block(in_channels, out_channels):
    return nn.Sequential(
        nn.ConvTranspose3d(in_channels, out_channels, kernel_size=4, stride=2, padding=1),
        nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    def __init__(self, in_channels=4, out_channels=5, base_channels=64, full_scale=True):
        super().__init__()
        c = base_channels
        widths = [c, 2 * c, 4 * c, 8 * c, 8 * c] + ([8 * c] if full_scale else [])

        # Encoder: in -> w0 -> w1 -> ... ; every block halves the side.
        self.down = nn.ModuleList()
        previous = in_channels
        for width in widths:
            self.down.append(down_block(previous, width))
            previous = width

        # Decoder, deepest first. Each block upsamples to the scale of the next shallower encoder
        # output, with that output's width, and the concatenation doubles the width the next block sees.
        self.up = nn.ModuleList()
        previous = widths[-1]
        for skip_width in reversed(widths[:-1]):
            self.up.append(up_block(previous, skip_width))
            previous = 2 * skip_width
        self.last = nn.ConvTranspose3d(previous, out_channels, kernel_size=4, stride=2, padding=1)

        self.apply(init_weights)

    @staticmethod
    def size_multiple(full_scale):
        """Crop sides must be a multiple of this, so that every level halves an even side."""
        return 2 ** 6 if full_scale else 2 ** 5

    def forward(self, x):
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
        skips.pop()  # the deepest output is the decoder's input, not a skip
        for block in self.up:
            x = torch.cat([block(x), skips.pop()], dim=1)
        return torch.tanh(self.last(x))


def init_weights(module):
    """Normal(0, 0.02) weights and zero biases, as in the original tutorial."""
    if isinstance(module, (nn.Conv3d, nn.ConvTranspose3d)):
        nn.init.normal_(module.weight, 0.0, 0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
