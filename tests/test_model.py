"""The U-Net: the original's size at full width, the right shapes and range, the original's initialisation."""
import pytest
import torch

from networks.UNet import UNet


def test_full_width_full_scale_has_about_117M_parameters():
    model = UNet(base_channels=64, full_scale=True)
    n_params = sum(p.numel() for p in model.parameters())
    assert 116.5e6 < n_params < 117.5e6


def test_widths_follow_the_original():
    model = UNet(base_channels=64, full_scale=True)
    assert [block[0].out_channels for block in model.down] == [64, 128, 256, 512, 512, 512]
    assert [block[0].out_channels for block in model.up] == [512, 512, 256, 128, 64]
    assert model.last.out_channels == 5


@pytest.mark.parametrize("full_scale, crop", [(False, 32), (True, 64)])
def test_output_shape_and_tanh_range(full_scale, crop):
    model = UNet(base_channels=4, full_scale=full_scale)
    x = torch.randn(2, 4, crop, crop, crop)
    y = model(x)
    assert y.shape == (2, 5, crop, crop, crop)
    assert y.abs().max() < 1


def test_initialisation_is_normal_002_with_zero_bias():
    torch.manual_seed(0)
    model = UNet(base_channels=16, full_scale=False)
    weights = torch.cat([m.weight.flatten() for m in model.modules() if isinstance(m, torch.nn.Conv3d)])
    biases = torch.cat([m.bias.flatten() for m in model.modules() if isinstance(m, torch.nn.Conv3d)])
    assert abs(weights.std().item() - 0.02) < 0.001 and abs(weights.mean().item()) < 0.001
    assert torch.all(biases == 0)


def test_size_multiple():
    assert UNet.size_multiple(True) == 64 and UNet.size_multiple(False) == 32
