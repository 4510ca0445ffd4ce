"""A health check of the 3-D convolutions, the U-Net's whole cost, at the start of every run.

Some PyTorch and cuDNN releases quietly take the fast path away from 3-D convolutions: a run in
such an environment trains correctly but several times slower, and nothing says why. The check
logs one line with the versions and the backend the configured precision's convolutions actually
use in the run's memory layout (PyTorch's own dispatch, asked for the U-Net's first layer and a
transposed one), and warns, with the fix, when a GPU's convolutions do not run on cuDNN: with the
reason from :data:`KNOWN_ISSUES` where the versions are a known bad pair. The dispatcher has the
last word: PyTorch 2.9's fallback applies to contiguous tensors only, so a run with
``--channels_last`` keeps cuDNN on such a pair, and then nothing is wrong.
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
    (kernel 4, stride 2, padding 1) and its transposed twin, as autocast would pass them: inputs
    and weights both in ``memory_format``, the layout the run trains in. Nothing is computed, so
    the probe takes microseconds whatever cuDNN's benchmarking would cost.
    """
    def tensor(*shape):
        return torch.empty(*shape, device=device, dtype=dtype).to(memory_format=memory_format)

    weight = tensor(8, 4, 4, 4, 4)  # (out, in) for Conv3d; (in, out) for ConvTranspose3d
    names = []
    for transposed in (False, True):
        x = tensor(1, 8, 8, 8, 8) if transposed else tensor(1, 4, 8, 8, 8)
        try:
            backend = torch._C._select_conv_backend(x, weight, None, [2] * 3, [1] * 3, [1] * 3, transposed,
                                                    [0] * 3, 1, None)
            names.append(str(backend).rsplit(".", 1)[-1].replace("???", f"backend #{int(backend)}"))  # unbound names
        except (AttributeError, RuntimeError, TypeError):  # a private API: absent or changed
            names.append("unknown")
    return tuple(names)


AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def library_versions():
    """(PyTorch's version, cuDNN's version integer or None): the pair :data:`KNOWN_ISSUES` is looked up by."""
    return torch.__version__, torch.backends.cudnn.version()


def running_precision(amp_mode, tf32, device):
    """The arithmetic the 3-D convolutions really run in, whose peak an MFU must be measured against (the
    ladder, benchmarks/layers.py and benchy's MFU all take it from here): :func:`~utils.flops.precision_of`'s,
    except fp32 where it would say TF32 and TF32 does not run: on a CPU (TF32 exists on GPUs only), or
    where this PyTorch and cuDNN turn it off for 3-D convolutions (:data:`KNOWN_ISSUES`)."""
    precision = precision_of(amp_mode, tf32 and device.type == "cuda")
    if precision == "tf32" and known_issues(*library_versions(), "tf32"):
        return "fp32"
    return precision


def cpu_capability():
    """The vector instructions PyTorch's own CPU kernels use here ("AVX2", "AVX512", "DEFAULT"...; the variable
    ATEN_CPU_CAPABILITY can lower it)."""
    ask = getattr(torch.backends.cpu, "get_cpu_capability", None)
    return ask() if ask else "unknown"


# The instructions oneDNN needs before it takes a 16-bit convolution (ideep's has_bf16_type_support and
# has_fp16_type_support: the effective oneDNN ISA, which the variable ONEDNN_MAX_CPU_ISA can lower).
ONEDNN_NEEDS = {"bf16": "AVX-512", "fp16": "AVX-512 FP16"}


def emulated_on_cpu(amp_mode):
    """Whether this CPU computes ``amp_mode``'s (bf16, fp16) 3-D convolutions in PyTorch's generic reference code
    (Slow3d) while fp32's run in oneDNN, the library behind PyTorch's fast CPU convolutions: what a CPU without
    native support for that dtype does, tens of times slower. Asked of the dispatcher, as the start-up line is;
    where it cannot be asked, oneDNN's own check answers."""
    dtype = AMP_DTYPES.get(amp_mode)
    if dtype is None:
        return False
    cpu = torch.device("cpu")
    sixteen, fp32 = conv_backends(cpu, dtype)[0], conv_backends(cpu, torch.float32)[0]
    if "unknown" not in (sixteen, fp32):
        return sixteen.startswith("Slow") and not fp32.startswith("Slow")
    try:
        supported = getattr(torch.ops.mkldnn, f"_is_mkldnn_{amp_mode}_supported")()
    except (AttributeError, RuntimeError):  # a private API: absent or changed
        return False
    return not supported


def on_cudnn(backends):
    """Whether the dispatcher put both kinds of convolution on cuDNN (None: it did not say)."""
    if "unknown" in backends:
        return None
    return all(name.startswith("Cudnn") for name in backends)


def check_conv3d(device, amp_mode, tf32, channels_last=False):
    """Log the versions and the convolution backends; warn with the fix where they are slow.

    The warning's reason comes from :data:`KNOWN_ISSUES` only when the dispatcher does not report
    cuDNN for the layout the run uses (or cannot be asked): a known bad pair whose fallback
    spares this layout costs nothing. A contiguous run that is off cuDNN where channels_last_3d
    is on it is told so: ``--channels_last`` is then the cheapest fix.
    Returns the warnings (empty when all is well), for the caller to keep (the ladder stores them).
    """
    precision = precision_of(amp_mode, tf32 and device.type == "cuda")  # TF32 exists on GPUs only
    cudnn = torch.backends.cudnn.version() if device.type == "cuda" else None
    dtype = AMP_DTYPES.get(amp_mode, torch.float32)
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    backends = conv_backends(device, dtype, memory_format)
    logging.info("3-D convolutions: torch %s, CUDA %s, cuDNN %s; %s convolutions run on %s (transposed: %s), "
                 "layout %s", torch.__version__, torch.version.cuda or "none", cudnn_text(cudnn), precision,
                 *backends, "channels_last_3d" if channels_last else "contiguous")
    if device.type != "cuda" or on_cudnn(backends):
        return []
    warnings = [f"{issue.problem}. {issue.fix}. ({issue.source})"
                for issue in known_issues(torch.__version__, cudnn, precision)]
    if on_cudnn(backends) is False and not warnings:
        warnings.append(f"{precision} 3-D convolutions run on {backends[0]}/{backends[1]}, not on cuDNN: expect "
                        f"them to be several times slower. {FIX_CUDNN}, and check torch.backends.cudnn.enabled.")
    if warnings and not channels_last and on_cudnn(conv_backends(device, dtype, torch.channels_last_3d)):
        warnings.append("In channels_last_3d they do run on cuDNN here: --channels_last is the cheapest fix.")
    for text in warnings:
        logging.warning("3-D convolutions are slow here: %s", text)
    return warnings
