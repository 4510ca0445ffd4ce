"""Checkpoints that survive interruption, and the signals that ask for one.

A checkpoint holds everything needed to continue exactly: the unwrapped model's weights, the
optimiser and gradient-scaler states, the position (epoch, step, batches done in the epoch), the
random-number-generator states and the resolved config. It is written to a temporary file in
the same directory and renamed over the old one, so a run killed at any moment leaves either
the previous checkpoint or the new one, never half of one. It is read back with
``weights_only=True``: only tensors and plain containers, no arbitrary code.
"""
import logging
import os
import signal

import torch

CHECKPOINT_NAME = "checkpoint.pt"


def unwrap(model):
    """The bare model inside DDP (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def save_checkpoint(path, model, optimizer, scaler, position, params):
    payload = {
        "model": unwrap(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "position": dict(position),
        "rng": {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        },
        "params": params.to_dict(),
    }
    temporary = f"{path}.tmp.{os.getpid()}"
    try:
        with open(temporary, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it the checkpoint
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def load_checkpoint(path, model, optimizer, scaler):
    """Restore the states saved by :func:`save_checkpoint`; return the saved position."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    unwrap(model).load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    scaler.load_state_dict(payload["scaler"])
    torch.set_rng_state(payload["rng"]["torch"])
    if payload["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(payload["rng"]["cuda"])
    return payload["position"]


class StopSignals:
    """Remembers a SIGTERM or SIGUSR1 (a batch system's warning before the time limit).

    The handler only records the signal; the training loop checks :attr:`received` between steps,
    saves a checkpoint and stops, so no step is left half done.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.received = None
        for signum in self.SIGNALS:
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame):
        if self.received is None:
            logging.info("Received %s: stopping after this step with a checkpoint.", signal.Signals(signum).name)
        self.received = signum
