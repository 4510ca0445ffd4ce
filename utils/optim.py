"""Precision and optimiser choices, resolved once before the training loop.

The loop then reads the same whatever was chosen:

    with precision.autocast():
        loss = loss_fn(model(inputs), targets)
    precision.scaler.scale(loss).backward()
    precision.scaler.step(optimizer)
    precision.scaler.update()

With ``amp_mode=none`` autocast is a null context and the scaler is disabled (its calls pass
through); ``bf16`` autocasts without a scaler (bf16 has fp32's range); ``fp16`` needs the scaler to
keep small gradients from underflowing.
"""
import contextlib
import logging

import torch

AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    def __init__(self, amp_mode, device):
        self.device_type = device.type
        self.dtype = AMP_DTYPES[amp_mode]
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp_mode == "fp16")

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def build_optimizer(params, model):
    """Adam, or with ``enable_apex`` a fused Adam: NVIDIA apex's when importable, else torch's."""
    if params.enable_apex:
        try:
            from apex.optimizers import FusedAdam
        except ImportError:
            logging.info("NVIDIA apex is not importable: --enable_apex uses torch.optim.Adam(fused=True).")
        else:
            return FusedAdam(model.parameters(), lr=params.start_lr, adam_w_mode=False)
        return torch.optim.Adam(model.parameters(), lr=params.start_lr, fused=True)
    return torch.optim.Adam(model.parameters(), lr=params.start_lr)


def set_learning_rate(optimizer, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr
