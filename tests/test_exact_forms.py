"""utils/exact_forms.py: each exact form equals the layer it replaces, alone, in the U-Net, inside the halo
exchange and across checkpoints; and the --exact_forms switch."""
import logging
import os
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
import yaml

import train
from conftest import ROOT, needs_cuda, run_with_estimate, timeout_for
from networks.UNet import UNet
from test_halo import run_ranks
from test_train import data_args
from utils import exact_forms
from utils.checkpoint import load_checkpoint, save_checkpoint
from utils.compiler import compile_problem
from utils.errors import UserError
from utils.losses import build_loss
from utils.exact_forms import (ExactConv, SpaceToDepthConv, SubPixelTransposedConv, exact_form, from_parities,
                               plain_form, to_parities, use_exact_forms)
from utils.optim import Precision, build_optimizer
from utils.YParams import load_params


def assert_same(got, expected):
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, rtol=1e-10, atol=1e-12), (got - expected).abs().max().item()


def gradients(output, tensors, weights):
    """The gradients of ``sum(output * weights)``: every output voxel weighted differently."""
    return torch.autograd.grad((output * weights).sum(), tensors)


def compare_layer(kind, in_channels, out_channels, sides, padding=(1, 1, 1), batch=2,
                  memory_format=torch.contiguous_format):
    """The layer alone, plain and in its exact form (autograd through the form's forward, and the form's own
    backward as the halo exchange calls it), in float64: output, input, weight and bias gradients; the sub-pixel
    form's output in the layer's layout."""
    torch.manual_seed(0)
    layer = kind(in_channels, out_channels, kernel_size=4, stride=2, padding=1).double().to(memory_format=memory_format)
    form = SubPixelTransposedConv if kind is nn.ConvTranspose3d else SpaceToDepthConv  # exact at any width
    x = torch.randn(batch, in_channels, *sides, dtype=torch.float64).to(memory_format=memory_format).requires_grad_()
    expected = plain_form(layer).forward(x, layer.weight, layer.bias, padding)
    weights = torch.randn_like(expected)
    expected_grads = gradients(expected, (x, layer.weight, layer.bias), weights)

    output = form.forward(x, layer.weight, layer.bias, padding)
    assert_same(output, expected)
    got_grads = gradients(output, (x, layer.weight, layer.bias), weights)
    for got, want in zip(got_grads, expected_grads):
        assert_same(got, want)
    explicit = form.backward(weights, x.detach(), layer.weight.detach(), padding, [True, True, True])
    for got, want in zip(explicit, expected_grads):
        assert_same(got, want)
    if form is SubPixelTransposedConv:  # its output is the reshuffle's, not the convolution's
        assert output.is_contiguous(memory_format=memory_format)


# (in, out channels, input sides): the last layer's 5 outputs (32 -> 5 in the demo, 128 -> 5 at full width),
# a decoder layer's, odd channel counts, odd and unequal sides, and the deepest layers' 1^3 and 2^3.
TRANSPOSED = [(32, 5, (8, 8, 8)), (12, 5, (5, 3, 7)), (16, 8, (4, 4, 4)), (7, 3, (1, 1, 1)), (6, 6, (2, 3, 2)),
              (3, 1, (9, 6, 5))]


@pytest.mark.parametrize("in_channels, out_channels, sides", TRANSPOSED)
def test_sub_pixel_form_equals_the_transposed_convolution(in_channels, out_channels, sides):
    compare_layer(nn.ConvTranspose3d, in_channels, out_channels, sides)


@pytest.mark.parametrize("kind, in_channels, out_channels, sides, padding", [
    (nn.ConvTranspose3d, 32, 5, (8, 8, 8), (1, 1, 1)), (nn.ConvTranspose3d, 12, 5, (5, 3, 7), (1, 1, 1)),
    (nn.Conv3d, 4, 16, (8, 8, 8), (1, 1, 1)), (nn.Conv3d, 8, 5, (10, 8, 6), (0, 1, 1)),
    (nn.Conv3d, 4, 5, (7, 5, 9), (1, 1, 1))])
def test_the_forms_are_exact_in_channels_last_and_keep_it(kind, in_channels, out_channels, sides, padding):
    compare_layer(kind, in_channels, out_channels, sides, padding, memory_format=torch.channels_last_3d)


# The first layer's 4 input channels (16 and 64 outputs, as in the demo and at full width), other narrow
# inputs, odd sides (the stride-2 convolution ignores the last voxel; so must the form) and the padding
# 0 that a split axis of the halo exchange uses.
FIRST = [(4, 16, (8, 8, 8), (1, 1, 1)), (4, 64, (4, 6, 8), (1, 1, 1)), (4, 5, (7, 5, 9), (1, 1, 1)),
         (1, 3, (2, 2, 2), (1, 1, 1)), (8, 5, (10, 8, 6), (0, 1, 1)), (3, 5, (6, 7, 8), (1, 0, 0))]


@pytest.mark.parametrize("in_channels, out_channels, sides, padding", FIRST)
def test_space_to_depth_form_equals_the_first_convolution(in_channels, out_channels, sides, padding):
    compare_layer(nn.Conv3d, in_channels, out_channels, sides, padding)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last_3d])
def test_the_parities_and_back(memory_format):
    """Voxel q = 2m + r (per axis) of channel c is parity a = r at t = m + shift r, channel (4 a_d + 2 a_h + a_w) C + c;
    what falls outside is zero (the padding), and the way back leaves it out (the crop)."""
    x = torch.randn(2, 3, 4, 6, 8).to(memory_format=memory_format)
    parities = to_parities(x, (1, 0, 1), (3, 3, 5), memory_format)
    assert parities.shape == (2, 24, 3, 3, 5) and parities.is_contiguous(memory_format=memory_format)
    # q = (2*1 + 1, 2*2 + 0, 2*3 + 1): parities (1, 0, 1) at t = (1 + 1, 2, 3 + 1), channel (4 + 1) * 3 + 2
    assert parities[1, 5 * 3 + 2, 2, 2, 4] == x[1, 2, 3, 4, 7]
    assert parities[1, 4 * 3 + 2, 0].abs().sum() == 0 and parities[1, 2, 2].abs().sum() == 0  # the padding
    assert parities[1, 2, 1].abs().sum() > 0 and parities[1, 4 * 3 + 2, 1].abs().sum() > 0
    assert (parities != 0).sum() == (x != 0).sum()  # each voxel once
    back = from_parities(parities, (1, 0, 1), memory_format)
    assert torch.equal(back, x) and back.is_contiguous(memory_format=memory_format)


def test_the_first_and_the_transposed_layers_have_a_form():
    """The transposed convolutions, and the convolutions whose input channels are not a multiple of 8: the
    first layer's 4 (and, at base_channels 4 as here, the second layer's)."""
    model = UNet(4, 5, base_channels=4, full_scale=False)
    forms = {name: exact_form(module) for name, module in model.named_modules()
             if isinstance(module, (nn.Conv3d, nn.ConvTranspose3d))}
    assert forms == {"down.0.0": SpaceToDepthConv, "down.1.0": SpaceToDepthConv, "down.2.0": None, "down.3.0": None,
                     "down.4.0": None, "up.0.0": SubPixelTransposedConv, "up.1.0": SubPixelTransposedConv,
                     "up.2.0": SubPixelTransposedConv, "up.3.0": SubPixelTransposedConv,
                     "last": SubPixelTransposedConv}
    assert exact_form(nn.Conv3d(4, 8, kernel_size=3, padding=1)) is None
    with pytest.raises(ValueError, match="padding 1"):
        SubPixelTransposedConv.forward(torch.zeros(1, 2, 2, 2, 2), torch.zeros(2, 2, 4, 4, 4), None, (0, 1, 1))


def forms_switch(mode):
    return types.SimpleNamespace(exact_forms=mode)


def test_the_unet_with_the_forms_on_equals_it_with_them_off():
    """The whole U-Net in float64: outputs and every parameter's gradient; the same parameters by name."""
    torch.manual_seed(0)
    plain = UNet(4, 5, base_channels=4, full_scale=False).double()
    exact = UNet(4, 5, base_channels=4, full_scale=False).double()
    exact.load_state_dict(plain.state_dict())
    use_exact_forms(exact, forms_switch("on"), torch.device("cpu"))
    assert sum(isinstance(module, ExactConv) for module in exact.modules()) == 7  # 2 down, 4 up, last
    assert [(name, p.shape) for name, p in exact.named_parameters()] == \
           [(name, p.shape) for name, p in plain.named_parameters()]

    x = torch.randn(2, 4, 32, 32, 32, dtype=torch.float64)
    expected, output = plain(x), exact(x)
    assert_same(output, expected)
    weights = torch.randn_like(expected)
    for got, want in zip(gradients(output, list(exact.parameters()), weights),
                         gradients(expected, list(plain.parameters()), weights)):
        assert_same(got, want)


def built(mode, **options):
    params = load_params(["--config=test", f"--exact_forms={mode}", *[f"--{k}={v}" for k, v in options.items()]])
    torch.manual_seed(0)
    return train.build_model(params, torch.device("cpu")), params


@pytest.mark.parametrize("saved, loaded", [("on", "off"), ("off", "on")])
def test_a_checkpoint_made_with_the_forms_loads_without_them_and_the_other_way_round(saved, loaded, tmp_path):
    model, params = built(saved)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, model, build_optimizer(params, model), Precision("none", torch.device("cpu")).scaler,
                    {"epoch": 1, "step": 4, "batch_in_epoch": 0}, params)
    other, other_params = built(loaded, seed=1)  # other initial weights, which the checkpoint replaces
    assert {k: v.shape for k, v in other.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    assert load_checkpoint(path, other, build_optimizer(other_params, other),
                           Precision("none", torch.device("cpu")).scaler)["step"] == 4
    x = torch.randn(2, 4, 32, 32, 32)
    with torch.no_grad():
        assert torch.allclose(other(x), model(x), rtol=1e-5, atol=1e-6)


def test_the_switch_on_off_auto_and_a_list_on_a_cpu(caplog):
    with caplog.at_level(logging.INFO):
        on, _ = built("on")
        off, _ = built("off")
        auto, auto_params = built("auto")
        listed, _ = built("[down.0.0,last]")
        none, _ = built("[]")
    forms = {mode: [m.form.name for m in model.modules() if isinstance(m, ExactConv)]
             for mode, model in (("on", on), ("off", off), ("auto", auto), ("list", listed), ("none", none))}
    assert forms == {"on": ["space-to-depth"] * 2 + ["sub-pixel"] * 5, "off": [], "auto": [],
                     "list": ["space-to-depth", "sub-pixel"], "none": []}
    assert auto_params.exact_forms == []  # auto's decision, as the run's options record it
    lines = [record.getMessage() for record in caplog.records if record.getMessage().startswith("Exact forms")]
    assert lines == ["Exact forms: down.0.0 space-to-depth, down.1.0 space-to-depth, up.0.0 sub-pixel, "
                     "up.1.0 sub-pixel, up.2.0 sub-pixel, up.3.0 sub-pixel, last sub-pixel (--exact_forms=on).",
                     "Exact forms: down.0.0 plain, down.1.0 plain, up.0.0 plain, up.1.0 plain, up.2.0 plain, "
                     "up.3.0 plain, last plain (auto: the plain layers on a CPU; recorded as --exact_forms=[]).",
                     "Exact forms: down.0.0 space-to-depth, down.1.0 plain, up.0.0 plain, up.1.0 plain, up.2.0 plain, "
                     "up.3.0 plain, last sub-pixel (--exact_forms=[down.0.0,last]).",
                     "Exact forms: down.0.0 plain, down.1.0 plain, up.0.0 plain, up.1.0 plain, up.2.0 plain, "
                     "up.3.0 plain, last plain (--exact_forms=[])."]
    assert load_params(["--config=demo"]).exact_forms == "auto"  # the default, inherited from base
    assert load_params(["--config=test"]).exact_forms == "off"  # the test suite's runs compare like with like


@pytest.mark.parametrize("setting, problem", [("fast", "is not a valid choice"),
                                              ("[down.0.0,lst]", "names lst, which is not a layer with an exact form")])
def test_an_invalid_switch_is_refused_with_one_paragraph(setting, problem):
    with pytest.raises(UserError) as refused:
        built(setting)
    message = str(refused.value)
    assert message.startswith(f"--exact_forms={setting} {problem}: use auto")
    assert "on (every layer" in message and "off (the layers as networks/UNet.py defines them)" in message
    assert "e.g. --exact_forms=[down.0.0,last] ([] for none), of down.0.0, down.1.0, up.0.0" in message
    assert "\n" not in message


def test_auto_on_a_gpu_keeps_the_faster_form_of_each_layer(monkeypatch):
    """The decision, with the timings injected (no GPU here): the exact form where it took less time."""
    model = UNet(4, 5, base_channels=4, full_scale=False)
    layers = exact_forms.candidates(model)
    seconds = {"down.0.0": (2.0, 1.0), "last": (3.0, 1.5), "down.1.0": (1.0, 1.0)}
    names = {id(module): name for name, *_, module, _ in layers}
    monkeypatch.setattr(exact_forms, "convolution_inputs", lambda *args: (None, {name: None for name, *_ in layers}))
    monkeypatch.setattr(exact_forms, "time_forms",
                        lambda layer, forms, *args: seconds.get(names[id(layer)], (1.0, 2.0)))
    params = load_params(["--config=test"])
    chosen, why = exact_forms.choose_forms(model, layers, params, torch.device("cuda"), None)
    assert chosen == ["down.0.0", "last"]  # down.1.0's tie keeps the plain layer
    assert why == ("auto: the faster of each, timed eager, forward + backward, on rank 0; median ms plain / exact: "
                   "down.0.0 2000.00 / 1000.00, down.1.0 1000.00 / 1000.00, up.0.0 1000.00 / 2000.00, "
                   "up.1.0 1000.00 / 2000.00, up.2.0 1000.00 / 2000.00, up.3.0 1000.00 / 2000.00, "
                   "last 3000.00 / 1500.00")


class Recorded(SubPixelTransposedConv):
    """The sub-pixel form, its calls and the gradients they leave on the weight recorded."""
    calls = []

    @classmethod
    def forward(cls, x, weight, bias, padding):
        cls.calls.append((cls.name, weight.grad))
        return super().forward(x, weight, bias, padding)


class RecordedPlain(Recorded):
    name = "plain"

    @classmethod
    def forward(cls, x, weight, bias, padding):
        cls.calls.append((cls.name, weight.grad))
        return plain_form(nn.ConvTranspose3d(1, 1, 4)).forward(x, weight, bias, padding)


def test_the_timing_auto_uses_runs_at_the_run_shapes_in_turn_and_leaves_no_gradients():
    """convolution_inputs finds the shapes on the meta device; time_forms, the piece auto uses on a GPU, runs on
    any device: both forms, two untimed calls each, then ABBA..., no gradient accumulated anywhere."""
    params = load_params(["--config=test", "--global_batch_size=4", "--grad_accum_steps=2"])
    meta, shapes = exact_forms.convolution_inputs(params, 2, [32, 32, 32])
    assert all(p.is_meta for p in meta.parameters())
    assert shapes["down.0.0"] == (2, 4, 32, 32, 32) and shapes["last"] == (2, 8, 16, 16, 16)
    assert shapes["up.1.0"] == (2, 64, 2, 2, 2)  # up.0.0 doubled the deepest 1^3, the skip doubled its channels
    model = UNet(4, 5, base_channels=4, full_scale=False)
    before = [p.clone() for p in model.parameters()]
    Recorded.calls.clear()
    seconds = exact_forms.time_forms(model.last, (RecordedPlain, Recorded), shapes["last"], False, params,
                                     torch.device("cpu"), rounds=3)
    assert len(seconds) == 2 and all(s > 0 for s in seconds)
    assert [name for name, _ in Recorded.calls] == ["plain", "sub-pixel"] * 2 + \
        ["plain", "sub-pixel", "sub-pixel", "plain", "plain", "sub-pixel"]
    assert all(grad is None for _, grad in Recorded.calls)  # each call's gradients are returned, not accumulated
    assert all(p.grad is None for p in model.parameters())  # the model's gradients stay untouched
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@needs_cuda()
def test_auto_on_the_gpu_decides_and_says_so(caplog):
    params = load_params(["--config=demo", "--device=cuda", "--amp_mode=bf16"])
    with caplog.at_level(logging.INFO):
        model = train.build_model(params, torch.device("cuda"))
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Exact forms")]
    assert "timed eager, forward + backward" in line and isinstance(params.exact_forms, list)
    assert line.endswith(f"recorded as --exact_forms={exact_forms.option_text(params.exact_forms)}).")
    x = torch.randn(2, 4, 32, 32, 32, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        model(x).float().sum().backward()


@pytest.mark.parametrize("mesh", [[2, 1, 1], [1, 1, 2]], ids=["depth", "width"])
def test_the_forms_inside_the_halo_exchange_equal_the_undivided_layers_in_float64(mesh, tmp_path):
    for result in run_ranks("forms", mesh, tmp_path):
        assert result["Conv3d form"] == "space-to-depth" and result["ConvTranspose3d form"] == "sub-pixel"
        for layer in ("Conv3d", "ConvTranspose3d"):
            for quantity, difference in result[layer].items():
                assert difference < 1e-12, (mesh, layer, quantity, difference)


@pytest.mark.slow
def test_the_unet_with_the_forms_on_blocks_equals_the_undivided_plain_one(tmp_path):
    """As tests/test_halo.py's U-Net test, with --exact_forms=on, in float64: outputs and summed weight gradients."""
    for result in run_ranks("unet_forms", [2, 1, 1], tmp_path):
        assert result["forms"] == ["space-to-depth"] * 2 + ["plain"] * 4 + ["sub-pixel"] * 6
        assert result["output"] < 1e-12
        assert max(result["grads"].values()) < 1e-10, result["grads"]
        assert result["forward"]["exchanges"] == 12 and result["backward"]["exchanges"] == 11


def test_every_rank_computes_with_rank_0_s_choice(tmp_path):
    """Under DDP each rank times the forms itself, and the timings differ: rank 0's decide for all."""
    results = run_ranks("auto_choice", [1, 1, 1], tmp_path)
    assert [result["chosen"] for result in results] == [results[0]["candidates"]] * 2


class LayoutCopies(TorchDispatchMode):
    """The operators that write a tensor of at least ``size`` elements by moving data (copies, pads, clones,
    casts), in the order they run: a reshuffle's cost, apart from the convolutions."""
    MOVES = {"copy_", "clone", "_to_copy", "constant_pad_nd", "_unsafe_view", "cat", "flip", "as_strided_scatter"}

    def __init__(self, size):
        super().__init__()
        self.size, self.ops = size, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in self.MOVES and isinstance(output, torch.Tensor) and output.numel() >= self.size:
            self.ops.append(name)
        return output


def layer_copies(kind, memory_format, dtype):
    """The data-sized copies of a layer's forward and of its backward, plain and in its exact form, under
    autocast to ``dtype`` (None: none)."""
    torch.manual_seed(0)
    if kind is nn.ConvTranspose3d:
        layer, x = kind(16, 5, 4, stride=2, padding=1), torch.randn(2, 16, 16, 16, 16, requires_grad=True)
    else:
        layer, x = kind(4, 16, 4, stride=2, padding=1), torch.randn(2, 4, 32, 32, 32)
    layer, x = layer.to(memory_format=memory_format), x.detach().to(memory_format=memory_format)
    x.requires_grad_(kind is nn.ConvTranspose3d)
    size = min(x.numel(), 2 * 5 * 32 ** 3) // 2  # half the smaller of input and output: weights are far smaller
    found = {}
    for form in (plain_form(layer), exact_form(layer)):
        autocast = torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None)
        with autocast, LayoutCopies(size) as forward:
            output = form.forward(x, layer.weight, layer.bias, (1, 1, 1))
        with LayoutCopies(size) as backward:
            torch.autograd.grad(output, [t for t in (x, layer.weight, layer.bias) if t.requires_grad],
                                torch.randn_like(output))
        found[form.name] = (forward.ops, backward.ops)
    return found


def keeps_layout(memory_format, dtype):
    """Whether this CPU's kernel for the sub-pixel form's convolution in :func:`layer_copies` returns its output
    in the layout of its input (under autocast to ``dtype``). oneDNN's does there; PyTorch's reference code, which
    computes 16-bit convolutions on a CPU without native 16-bit arithmetic (AVX2 only), returns contiguous
    tensors whatever it is given."""
    x, weight = (torch.randn(*shape).to(memory_format=memory_format) for shape in ((2, 16, 16, 16, 16), (40, 16, 2, 2, 2)))
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        return F.conv3d(x, weight, padding=1).is_contiguous(memory_format=memory_format)


@pytest.mark.cpu16
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last_3d],
                         ids=["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_each_reshuffle_is_one_copy_in_either_layout(memory_format, dtype):
    """Depth to space with the crop, and space to depth with the padding, each ONE copy in the run's layout;
    under autocast the first layer's input is cast before its reshuffle, once, as the plain layer casts it.
    What the CPU's convolution kernels do is theirs: where one returns another layout than it was given, the
    sub-pixel form's depth to space first puts its parities back into the run's layout (a clone)."""
    cast = ["_to_copy"] if dtype else []
    first = layer_copies(nn.Conv3d, memory_format, dtype)
    assert first == {"plain": (cast, []), "space-to-depth": (cast + ["copy_"], [])}  # the data needs no gradient
    last = layer_copies(nn.ConvTranspose3d, memory_format, dtype)
    relayout = [] if keeps_layout(memory_format, dtype) else ["clone"]
    assert last == {"plain": (cast, cast), "sub-pixel": (cast + relayout + ["copy_"], ["copy_"] + cast)}


@pytest.mark.slow
@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last"])
def test_the_compiled_training_step_with_the_forms_equals_the_eager_plain_one(channels_last):
    """train.py's compiled step (model and loss as one function, forward and backward) with every form on, in
    float64 on the CPU (Inductor's C++ kernels): one graph, and the loss and every gradient of the eager
    plain U-Net."""
    problem = compile_problem()
    if problem:
        pytest.skip(problem)
    import torch._dynamo

    options = [f"--channels_last={str(channels_last).lower()}", "--jit_mode=compile"]
    forms, params = built("on", **dict(option[2:].split("=") for option in options))
    plain, _ = built("off", **dict(option[2:].split("=") for option in options))
    assert sum(isinstance(m, ExactConv) for m in forms.modules()) == 7
    layout = train.memory_format(params)
    x, y = (torch.randn(2, c, 32, 32, 32, dtype=torch.float64).to(memory_format=layout) for c in (4, 5))
    torch._dynamo.reset()
    counts = torch._dynamo.utils.counters
    counts.clear()
    compiled = train.training_loss(forms.double(), build_loss(params), params)
    loss = compiled(x, y)
    grads = torch.autograd.grad(loss, list(forms.parameters()))
    expected = build_loss(params)(plain.double()(x), y)
    assert counts["stats"]["unique_graphs"] == 1 and not counts["graph_break"]
    assert torch.allclose(loss, expected, rtol=1e-10, atol=0)
    for got, want in zip(grads, torch.autograd.grad(expected, list(plain.parameters()))):
        assert_same(got, want)


# train.py with auto's decision injected (this CPU keeps the layers plain without timing): the last layer in
# its form; with CHOICE=none the decision must not be made again.
AUTO_DECIDES_LAST = """
import os, sys
import train
from utils import exact_forms

def injected(model, layers, params, device, mesh):
    assert os.environ["CHOICE"] == "last", "auto timed the forms again"
    return ["last"], "auto: injected"

exact_forms.choose_forms = injected
train.main(sys.argv[1:])
"""


@pytest.mark.slow
def test_auto_s_choice_is_recorded_and_a_resume_computes_with_it_without_deciding_again(data_files, tmp_path):
    """The first run asks for auto (the test config's layers are plain); its resume names no --exact_forms."""
    args = data_args(data_files, tmp_path, "--run_num=auto", "--val_metrics=false")
    for choice, extra in (("last", ["--exact_forms=auto", "--num_epochs=1"]),
                          ("none", ["--resume", "--num_epochs=2", "--allow_changes=num_epochs"])):
        result = run_with_estimate([sys.executable, "-c", AUTO_DECIDES_LAST, *args, *extra], timeout_for(300),
                                   cwd=ROOT, env={**os.environ, "CHOICE": choice})
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = tmp_path / "test" / "1CPU" / "auto"
    with open(run_dir / "config.yaml") as f:
        record = yaml.safe_load(f)
    assert record["exact_forms"] == ["last"] and record["resumed"][0]["changed"] == {"num_epochs": [1, 2]}
    lines = [line.split(" - ")[-1] for line in (run_dir / "out.log").read_text().splitlines() if "Exact forms:" in line]
    plain = "down.0.0 plain, down.1.0 plain, up.0.0 plain, up.1.0 plain, up.2.0 plain, up.3.0 plain"
    assert lines == [f"Exact forms: {plain}, last sub-pixel (auto: injected; recorded as --exact_forms=[last]).",
                     f"Exact forms: {plain}, last sub-pixel (--exact_forms=[last])."]
