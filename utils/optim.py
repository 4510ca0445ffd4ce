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

from utils.errors import UserError

AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """An autocast context and a gradient scaler for ``amp_mode``.

    ``cache=False`` turns off autocast's cache of down-cast weights, as CUDA graph capture needs.
    """

    def __init__(self, amp_mode, device, cache=True):
        self.device_type = device.type
        self.dtype = AMP_DTYPES[amp_mode]
        self.cache = cache
        if self.dtype is not None:
            check_autocast(device, self.dtype, amp_mode)
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp_mode == "fp16")

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype, cache_enabled=self.cache)


def check_autocast(device, dtype, amp_mode):
    """Refuse a precision that this device and torch build cannot autocast to, before training."""
    # Not torch.cuda.is_bf16_supported(): by default it counts emulation and says True on V100 and T4,
    # where bf16 convolutions run emulated, far slower than fp16. Tensor cores for bf16 start at sm_80.
    if device.type == "cuda" and dtype == torch.bfloat16 and torch.cuda.get_device_capability(device) < (8, 0):
        raise UserError(f"--amp_mode=bf16 needs a GPU with bfloat16 tensor cores (compute capability 8.0, "
                        f"Ampere, or newer); {torch.cuda.get_device_name(device)} has "
                        f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))}. Use --amp_mode=fp16 or none.")
    try:
        with torch.autocast(device.type, dtype=dtype):
            probe = torch.nn.functional.conv3d(torch.ones(1, 1, 2, 2, 2, device=device),
                                               torch.ones(1, 1, 1, 1, 1, device=device))
        ok = probe.dtype == dtype
    except (RuntimeError, TypeError, ValueError):
        ok = False
    if not ok:
        raise UserError(f"--amp_mode={amp_mode}: this PyTorch ({torch.__version__}) cannot autocast to "
                        f"{dtype} on {device.type}. Use --amp_mode=bf16 or none, or a newer PyTorch.")


def configure_tf32(enabled):
    """TensorFloat-32 for float32 matmuls and convolutions on Ampere and newer GPUs.

    TF32 keeps fp32's range with a 10-bit mantissa: several times the fp32 throughput for this
    model at no visible loss in accuracy. ``NVIDIA_TF32_OVERRIDE=0`` in the environment disables it
    below PyTorch, whatever this says.
    """
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def build_optimizer(params, model, capturable=False):
    """Adam; fused with ``enable_fused`` or ``enable_apex`` (NVIDIA apex's FusedAdam when importable).

    ``capturable`` (for CUDA graphs) keeps the learning rate and step counts in device tensors, so
    that a captured optimiser step reads the current values on every replay.

    Every optimiser built here sets gradients to None in ``zero_grad()`` (torch's default since 2.0,
    apex's ``set_grad_none``), so the training step calls it without arguments: apex's takes none.
    """
    optimizer = None
    if params.enable_apex and capturable:
        logging.info("--enable_apex: the captured step uses torch.optim.Adam(fused=True, capturable=True), "
                     "whose learning-rate tensor the schedule updates in place; apex's FusedAdam is not "
                     "used by train.py's CUDA-graph variant.")
    elif params.enable_apex:
        optimizer = build_apex_adam(params, model)
    if optimizer is None and capturable:
        lr = torch.tensor(params.start_lr, device=next(model.parameters()).device)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr, capturable=True, fused=True)
    elif optimizer is None:
        fused = {"fused": True} if params.enable_apex or params.enable_fused else {}
        optimizer = torch.optim.Adam(model.parameters(), lr=params.start_lr, **fused)
    if params.amp_mode == "fp16" and not getattr(optimizer, "_step_supports_amp_scaling", False):
        logging.info("--amp_mode=fp16 with %s: the gradient scaler reads its inf/NaN check on the host before "
                     "every update (one host sync per step); --enable_fused avoids it.", type(optimizer).__name__)
    return optimizer


def build_apex_adam(params, model):
    """NVIDIA apex's FusedAdam as the original builds it (Adam, not AdamW), or None without apex.

    With fp16 it is made ``capturable``: only then does apex take the gradient scaler's inf check
    as a device tensor. Otherwise ``GradScaler.step`` reads the check on the host (``.item()``)
    before every update, a host synchronisation per step that torch's ``Adam(fused=True)`` avoids.
    """
    try:
        from apex.optimizers import FusedAdam
    except ImportError:
        logging.info("NVIDIA apex is not importable: --enable_apex uses torch.optim.Adam(fused=True).")
        return None
    capturable = params.amp_mode == "fp16"
    if capturable:
        logging.info("--enable_apex with --amp_mode=fp16: apex's FusedAdam(capturable=True), so that the "
                     "gradient scaler's inf check stays on the device (no host sync per step).")
    return FusedAdam(model.parameters(), lr=params.start_lr, adam_w_mode=False, capturable=capturable)


def set_learning_rate(optimizer, lr):
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)  # in place: a captured graph keeps reading this tensor
        else:
            group["lr"] = lr
