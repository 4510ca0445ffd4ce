"""A health check of the 3-D convolutions, the U-Net's whole cost, at the start of every run.

Some PyTorch and cuDNN releases quietly take the fast path away from 3-D convolutions: a run in
such an environment trains correctly but several times slower, and nothing says why. The check
logs one line with the versions and the backend the configured precision's convolutions actually
use (PyTorch's own dispatch, asked for the U-Net's first layer and a transposed one), and warns,
with the fix, when the combination is a known bad one (:data:`KNOWN_ISSUES`) or when a GPU's
convolutions do not run on cuDNN.
"""
import logging
import re
from dataclasses import dataclass

import torch

from utils.flops import precision_of

# (first, last) version ranges are inclusive; None leaves a side open. cuDNN versions are
# torch.backends.cudnn.version()'s integers: 90800 is 9.8.0, 91002 is 9.10.2.
FIX_CUDNN = ("Use PyTorch 2.9.1 or newer with cuDNN 9.15 or newer (e.g. pip install 'nvidia-cudnn-cu13>=9.15' "
             "beside a cu130 wheel, or a container that ships them)")


@dataclass(frozen=True)
class KnownIssue:
    torch: tuple       # (first, last) PyTorch release as (major, minor, patch)
    cudnn: tuple       # (first, last) cuDNN version integer
    precisions: tuple  # the precisions whose 3-D convolutions it slows: bf16, fp16, tf32
    problem: str
    fix: str
    source: str


KNOWN_ISSUES = (
    KnownIssue(((2, 9, 0), (2, 9, 0)), (90800, None), ("bf16", "fp16"),
               "PyTorch 2.9.0 turns cuDNN off for fp16/bf16 3-D convolutions with kernels larger than 1 on "
               "cuDNN 9.8 or newer: they fall back to a generic kernel, about 4x slower under AMP",
               FIX_CUDNN, "https://github.com/pytorch/pytorch/issues/166122, pull 163581"),
    KnownIssue(((2, 9, 1), None), (90800, 91499), ("bf16", "fp16"),
               "PyTorch 2.9.1 and newer keep cuDNN off for fp16/bf16 3-D convolutions on cuDNN 9.8 to 9.14",
               FIX_CUDNN, "https://github.com/pytorch/pytorch/pull/166480"),
    KnownIssue(((2, 9, 1), None), (91002, 91599), ("tf32",),
               "PyTorch 2.9.1 and newer disable TF32 for 3-D convolutions on cuDNN 9.10.2 to 9.15 (a broken "
               "cuDNN kernel): float32 convolutions run at full fp32 precision and speed",
               "Train with --amp_mode=bf16 (unaffected on cuDNN 9.15), or use cuDNN 9.16 or newer",
               "https://github.com/pytorch/pytorch/pull/167024"),
)


def torch_release(version=None):
    """(major, minor, patch) of a PyTorch version string: "2.9.0+cu130" and NGC's "2.6.0a0+..." alike."""
    major, minor, patch = re.match(r"(\d+)\.(\d+)\.(\d+)", version or torch.__version__).groups()
    return int(major), int(minor), int(patch)


def cudnn_text(version):
    """torch.backends.cudnn.version()'s integer as "9.10.2" (None: "none")."""
    if not version:
        return "none"
    major, rest = divmod(version, 10000) if version >= 10000 else divmod(version, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def _within(value, bounds):
    first, last = bounds
    return (first is None or value >= first) and (last is None or value <= last)


def known_issues(torch_version, cudnn_version, precision):
    """The entries of :data:`KNOWN_ISSUES` that slow ``precision``'s 3-D convolutions with these versions."""
    if not cudnn_version:
        return []
    release = torch_release(torch_version)
    return [issue for issue in KNOWN_ISSUES if precision in issue.precisions
            and _within(release, issue.torch) and _within(cudnn_version, issue.cudnn)]


def conv_backends(device, dtype, memory_format=torch.contiguous_format):
    """PyTorch's choice of backend for the U-Net's convolutions: (Conv3d, ConvTranspose3d) names.

    Asked of the dispatcher (``torch._C._select_conv_backend``) for a first-layer-sized Conv3d
    (kernel 4, stride 2, padding 1) and its transposed twin, as autocast would pass them.
    """
    x = torch.empty(1, 4, 8, 8, 8, device=device, dtype=dtype).to(memory_format=memory_format)
    weight = torch.empty(8, 4, 4, 4, 4, device=device, dtype=dtype).to(memory_format=memory_format)
    names = []
    for transposed in (False, True):
        try:
            backend = torch._C._select_conv_backend(x if not transposed else x.new_empty(1, 8, 8, 8, 8),
                                                    weight, None, [2] * 3, [1] * 3, [1] * 3, transposed,
                                                    [0] * 3, 1, None)
            names.append(str(backend).rsplit(".", 1)[-1].replace("???", f"backend #{int(backend)}"))  # unbound names
        except (AttributeError, RuntimeError, TypeError):  # a private API: absent or changed
            names.append("unknown")
    return tuple(names)


AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_conv3d(device, amp_mode, tf32, channels_last=False):
    """Log the versions and the convolution backends; warn with the fix where they are known to be slow.

    Returns the warnings (empty when all is well), for the caller to keep (the ladder stores them).
    """
    precision = precision_of(amp_mode, tf32 and device.type == "cuda")  # TF32 exists on GPUs only
    cudnn = torch.backends.cudnn.version() if device.type == "cuda" else None
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    forward, transposed = conv_backends(device, AMP_DTYPES.get(amp_mode, torch.float32), memory_format)
    logging.info("3-D convolutions: torch %s, CUDA %s, cuDNN %s; %s convolutions run on %s (transposed: %s)",
                 torch.__version__, torch.version.cuda or "none", cudnn_text(cudnn), precision, forward, transposed)
    warnings = [f"{issue.problem}. {issue.fix}. ({issue.source})"
                for issue in known_issues(torch.__version__, cudnn, precision)]
    if device.type == "cuda" and not all(name.startswith("Cudnn") for name in (forward, transposed)) \
            and "unknown" not in (forward, transposed) and not warnings:
        warnings.append(f"{precision} 3-D convolutions run on {forward}/{transposed}, not on cuDNN: expect "
                        f"them to be several times slower. {FIX_CUDNN}, and check torch.backends.cudnn.enabled.")
    for text in warnings:
        logging.warning("3-D convolutions are slow here: %s", text)
    return warnings
