"""The U-Net computes the original tutorial's function: its widths, activations, layer order and init.

The reference forward below is written from the documented architecture with torch.nn.functional
alone (it never calls the project's blocks), so a changed slope, order, padding or concatenation
fails the comparison.
"""
import pytest
import torch
import torch.nn.functional as F

from networks.UNet import UNet

ENCODER = [64, 128, 256, 512, 512, 512]  # the original's widths; the 6th level only with full_scale


def reference_layers(full_scale, in_channels=4, out_channels=5):
    """(kind, in, out) of every convolution of the original U-Net, in the order of its definition."""
    widths = ENCODER if full_scale else ENCODER[:-1]
    encoder = [("conv", a, b) for a, b in zip([in_channels] + widths[:-1], widths)]
    decoder, previous = [], widths[-1]
    for skip in reversed(widths[:-1]):  # each up-convolution's output is concatenated with a skip
        decoder.append(("up", previous, skip))
        previous = 2 * skip
    return encoder + decoder + [("last", previous, out_channels)]


def reference_forward(x, layers, weights, negative_slope=0.01):
    """The original's forward pass: LeakyReLU(0.01) encoder, ReLU decoder, cat([up, skip]), tanh."""
    n_down = sum(kind == "conv" for kind, _, _ in layers)
    skips = []
    for (weight, bias) in weights[:n_down]:
        x = F.leaky_relu(F.conv3d(x, weight, bias, stride=2, padding=1), negative_slope=negative_slope)
        skips.append(x)
    skips.pop()
    for (weight, bias) in weights[n_down:-1]:
        x = F.relu(F.conv_transpose3d(x, weight, bias, stride=2, padding=1))
        x = torch.cat([x, skips.pop()], dim=1)
    weight, bias = weights[-1]
    return torch.tanh(F.conv_transpose3d(x, weight, bias, stride=2, padding=1))


def random_weights(layers, generator, scale):
    """Weights in PyTorch's layouts: Conv3d (out, in, k, k, k), ConvTranspose3d (in, out, k, k, k)."""
    weights = []
    for kind, c_in, c_out in layers:
        shape = (c_out, c_in, 4, 4, 4) if kind == "conv" else (c_in, c_out, 4, 4, 4)
        fan_in = c_in * 64
        weights.append((torch.randn(shape, generator=generator, dtype=torch.float64) * scale / fan_in**0.5,
                        torch.randn(c_out, generator=generator, dtype=torch.float64) * 0.1))
    return weights


@pytest.mark.slow
@pytest.mark.parametrize("full_scale, crop", [(True, 64), (False, 32)])
def test_full_width_model_computes_the_original_function(full_scale, crop):
    layers = reference_layers(full_scale)
    generator = torch.Generator().manual_seed(1)
    # He-like scales keep activations of order one at every depth, so that both signs reach every
    # activation and the output is not saturated by the tanh: a wrong slope changes it visibly.
    weights = random_weights(layers, generator, scale=2.0)
    model = UNet(4, 5, base_channels=64, full_scale=full_scale).double()
    state = model.state_dict()
    assert len(state) == 2 * len(layers)  # a weight and a bias per convolution, nothing else
    flat = [tensor for pair in weights for tensor in pair]
    for (name, current), tensor in zip(state.items(), flat):
        assert current.shape == tensor.shape, name
    model.load_state_dict(dict(zip(state.keys(), flat)))

    x = torch.randn(1, 4, crop, crop, crop, generator=generator, dtype=torch.float64)
    expected = reference_forward(x, layers, weights)
    with torch.no_grad():
        actual = model(x)
    # The input exercises the network: outputs spread over the tanh's range, and the slope of 0.2
    # (an earlier version's) would change them by far more than the tolerance.
    assert expected.abs().median() < 0.9 and expected.std() > 0.1
    assert (reference_forward(x, layers, weights, negative_slope=0.2) - expected).abs().max() > 0.01
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-10)


def test_full_width_full_scale_has_the_original_parameter_count():
    model = UNet(base_channels=64, full_scale=True)
    assert sum(p.numel() for p in model.parameters()) == 116_977_029


def test_widths_follow_the_original():
    model = UNet(base_channels=64, full_scale=True)
    assert [block[0].out_channels for block in model.down] == ENCODER
    assert [block[0].out_channels for block in model.up] == [512, 512, 256, 128, 64]
    assert model.last.out_channels == 5


def test_activations_are_the_originals():
    model = UNet(base_channels=4, full_scale=False)
    assert {block[1].negative_slope for block in model.down} == {0.01}  # nn.LeakyReLU's default
    assert all(isinstance(block[1], torch.nn.ReLU) for block in model.up)


@pytest.mark.parametrize("full_scale, crop", [(False, 32), (True, 64)])
def test_output_shape_and_tanh_range(full_scale, crop):
    model = UNet(base_channels=4, full_scale=full_scale)
    x = torch.randn(2, 4, crop, crop, crop)
    y = model(x)
    assert y.shape == (2, 5, crop, crop, crop)
    assert y.abs().max() < 1


def test_initialisation_is_the_originals_normal_002_with_zero_bias():
    """The original's weights_init: every Conv* module (Conv3d and ConvTranspose3d) ~ N(0, 0.02), bias 0."""
    torch.manual_seed(0)
    model = UNet(base_channels=64, full_scale=True)
    convolutions = [m for m in model.modules() if isinstance(m, (torch.nn.Conv3d, torch.nn.ConvTranspose3d))]
    assert len(convolutions) == 12
    for module in convolutions:
        weight = module.weight.detach()
        assert abs(weight.std().item() - 0.02) < 0.002 and abs(weight.mean().item()) < 0.002
        assert torch.all(module.bias == 0)


def test_size_multiple():
    assert UNet.size_multiple(True) == 64 and UNet.size_multiple(False) == 32
