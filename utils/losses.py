"""The training loss: mean L1, plus an optional L1 on the physical gas density.

Hydro channel 0 is a log-density whose physical value is ``exp(14 x)``; ``lambda_rho > 0`` adds
``lambda_rho`` times the L1 error of that physical density, which weighs dense regions more.

``jit_mode`` picks how the loss runs: eagerly (``none``), as a TorchScript function whose
element-wise operations the fuser combines into fewer kernels (``script``: the original tutorial's
``--enable_jit``), or compiled by ``torch.compile`` together with the model (``compile``: the
modern path; train.training_loss compiles the two as one function, so the loss is returned
uncompiled here).
"""
import functools
import warnings

import torch
import torch.nn.functional as F


def l1_loss(prediction: torch.Tensor, target: torch.Tensor, lambda_rho: float = 0.0) -> torch.Tensor:
    loss = F.l1_loss(prediction, target)
    if lambda_rho > 0:
        loss = loss + lambda_rho * F.l1_loss(torch.exp(14.0 * prediction[:, 0]), torch.exp(14.0 * target[:, 0]))
    return loss


def build_loss(params):
    """The loss function ``loss(prediction, target)`` for ``params.jit_mode``."""
    loss = l1_loss
    if params.jit_mode == "script":
        with warnings.catch_warnings():
            # TorchScript is deprecated in recent torch but still works; it is kept as the original's rung.
            warnings.simplefilter("ignore", DeprecationWarning)
            loss = torch.jit.script(l1_loss)
    return functools.partial(loss, lambda_rho=float(params.lambda_rho))
