"""The training loss: mean L1, plus an optional L1 on the physical gas density.

Hydro channel 0 is a log-density whose physical value is ``exp(14 x)``; ``lambda_rho > 0`` adds
``lambda_rho`` times the L1 error of that physical density, which weighs dense regions more.
"""
import functools

import torch
import torch.nn.functional as F


def l1_loss(prediction, target, lambda_rho=0.0):
    loss = F.l1_loss(prediction, target)
    if lambda_rho > 0:
        loss = loss + lambda_rho * F.l1_loss(torch.exp(14.0 * prediction[:, 0]), torch.exp(14.0 * target[:, 0]))
    return loss


def build_loss(params):
    return functools.partial(l1_loss, lambda_rho=params.lambda_rho)
