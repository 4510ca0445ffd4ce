"""The loss: eager and TorchScript (--enable_jit) agree, gradients too. With --jit_mode=compile the loss is
compiled together with the model, as one function (train.training_loss, tested in test_train.py)."""
import pytest
import torch

from utils.YParams import load_params
from utils.losses import build_loss, l1_loss


def loss_and_grad(loss_fn, prediction, target):
    prediction = prediction.clone().requires_grad_(True)
    loss = loss_fn(prediction, target)
    loss.backward()
    return loss.detach(), prediction.grad


@pytest.mark.parametrize("lambda_rho", [0.0, 0.5])
def test_eager_and_script_losses_agree(lambda_rho):
    torch.manual_seed(0)
    prediction = torch.rand(2, 5, 8, 8, 8) * 2 - 1
    target = torch.rand(2, 5, 8, 8, 8) * 2 - 1
    results = {}
    for mode in ("none", "script"):
        params = load_params(["--config=test", f"--jit_mode={mode}", f"--lambda_rho={lambda_rho}"])
        results[mode] = loss_and_grad(build_loss(params), prediction, target)
    for mode in ("script",):
        torch.testing.assert_close(results[mode][0], results["none"][0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(results[mode][1], results["none"][1], rtol=1e-5, atol=1e-8)


def test_the_density_term_weighs_the_physical_density():
    prediction = torch.zeros(1, 5, 2, 2, 2)
    target = torch.zeros(1, 5, 2, 2, 2)
    target[:, 0] = 0.1  # log-density: physical value exp(1.4)
    expected_l1 = 0.1 / 5
    expected_rho = torch.exp(torch.tensor(1.4)) - 1
    assert l1_loss(prediction, target) == pytest.approx(expected_l1)
    assert l1_loss(prediction, target, 2.0) == pytest.approx(expected_l1 + 2.0 * expected_rho.item(), rel=1e-6)


def test_enable_jit_means_a_torchscript_loss():
    params = load_params(["--config=test", "--enable_jit"])
    assert params.jit_mode == "script"
    assert isinstance(build_loss(params).func, torch.jit.ScriptFunction)


@pytest.mark.parametrize("lambda_rho", [0.5, 2.0])
def test_the_density_term_is_channel_0s_and_build_loss_weighs_it_as_configured(lambda_rho):
    """The density term compares channel 0 (the log-density) of prediction and target, with any positive
    lambda_rho, and build_loss uses the configured one: a prediction wrong in channel 1 alone has no
    density error; one wrong in channel 0 has exp(1.4) - 1 of it."""
    target = torch.zeros(1, 5, 2, 2, 2)
    wrong_velocity, wrong_density = target.clone(), target.clone()
    wrong_velocity[:, 1] = 0.1
    wrong_density[:, 0] = 0.1
    loss = build_loss(load_params(["--config=test", f"--lambda_rho={lambda_rho}"]))
    assert loss(wrong_velocity, target) == pytest.approx(0.1 / 5)
    density_error = torch.exp(torch.tensor(1.4)).item() - 1
    assert loss(wrong_density, target) == pytest.approx(0.1 / 5 + lambda_rho * density_error, rel=1e-6)
