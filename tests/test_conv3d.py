"""utils/conv3d.py: the 3-D convolution health check, fed the version combinations it must recognise (CPU)."""
import logging

import pytest
import torch

from utils import conv3d
from utils.conv3d import check_conv3d, cudnn_text, known_issues


@pytest.mark.parametrize("torch_version, cudnn, precision, expected", [
    ("2.9.0+cu130", 90800, "bf16", "torch 2.9.0"),      # cuDNN off for AMP 3-D convolutions
    ("2.9.0a0+ngc", 91300, "fp16", "torch 2.9.0"),      # NGC's pre-release names count as the release
    ("2.9.0+cu128", 90701, "bf16", None),               # before cuDNN 9.8: unaffected
    ("2.9.1+cu130", 91300, "fp16", "9.8 to 9.14"),      # re-enabled only from cuDNN 9.15
    ("2.11.0+cu130", 91400, "bf16", "9.8 to 9.14"),
    ("2.9.1+cu130", 91500, "bf16", None),
    ("2.11.0+cu130", 91002, "tf32", "TF32"),            # TF32 off for 3-D convolutions on 9.10.2 to 9.15
    ("2.11.0+cu130", 91600, "tf32", None),
    ("2.11.0+cu130", 91300, "fp32", None),              # TF32 switched off by the user: nothing to lose
    ("2.8.0+cu128", 91002, "bf16", None),
    ("2.13.0+cpu", None, "bf16", None),                 # no cuDNN at all
])
def test_known_bad_combinations_are_recognised(torch_version, cudnn, precision, expected):
    issues = known_issues(torch_version, cudnn, precision)
    if expected is None:
        assert issues == []
    else:
        assert len(issues) == 1 and issues[0].source.startswith("https://github.com/pytorch/pytorch/")
        text = issues[0].problem
        assert {"torch 2.9.0": "PyTorch 2.9.0", "9.8 to 9.14": "9.8 to 9.14", "TF32": "TF32"}[expected] in text


def test_cudnn_versions_read_as_people_write_them():
    assert [cudnn_text(v) for v in (91002, 90800, 8902, None)] == ["9.10.2", "9.8.0", "8.9.2", "none"]


def test_a_cpu_run_logs_its_backend_and_no_warning(caplog):
    caplog.set_level(logging.INFO)
    assert check_conv3d(torch.device("cpu"), "none", True) == []
    line = next(r.message for r in caplog.records if r.message.startswith("3-D convolutions:"))
    assert f"torch {torch.__version__}" in line and "cuDNN none; fp32 convolutions run on " in line
    assert "unknown" not in line  # torch's dispatcher answered for both kinds of convolution


def fake_gpu(monkeypatch, torch_version, cudnn, backends):
    """The versions and dispatcher answers of a GPU machine, without one (nothing else touches CUDA)."""
    monkeypatch.setattr(torch, "__version__", torch_version)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: cudnn)
    monkeypatch.setattr(conv3d, "conv_backends", lambda *args: backends)


def test_a_known_bad_gpu_setup_warns_with_the_fix(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    fake_gpu(monkeypatch, "2.9.0+cu130", 91300, ("SlowDilated3d", "SlowTranspose3d"))
    warnings = check_conv3d(torch.device("cuda"), "bf16", True)
    assert len(warnings) == 1 and "PyTorch 2.9.1 or newer with cuDNN 9.15 or newer" in warnings[0]
    assert "cuDNN 9.13.0; bf16 convolutions run on SlowDilated3d" in caplog.text
    assert "3-D convolutions are slow here" in caplog.text


def test_gpu_convolutions_off_cudnn_warn_even_when_the_table_does_not_know_why(monkeypatch):
    fake_gpu(monkeypatch, "2.12.0+cu130", 91700, ("SlowDilated3d", "CudnnTranspose"))
    warnings = check_conv3d(torch.device("cuda"), "fp16", True)
    assert len(warnings) == 1 and "not on cuDNN" in warnings[0]


def test_a_healthy_gpu_setup_is_quiet(monkeypatch):
    fake_gpu(monkeypatch, "2.11.0+cu130", 91700, ("Cudnn", "CudnnTranspose"))
    assert check_conv3d(torch.device("cuda"), "bf16", True) == []


def layout_dependent_backends(monkeypatch, contiguous, channels_last):
    """A PyTorch 2.9-like dispatcher whose fallback applies to contiguous tensors only."""
    def backends(device, dtype, memory_format=torch.contiguous_format):
        return channels_last if memory_format == torch.channels_last_3d else contiguous
    monkeypatch.setattr(conv3d, "conv_backends", backends)


def test_a_known_bad_pair_is_quiet_when_the_runs_layout_stays_on_cudnn(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    fake_gpu(monkeypatch, "2.9.0+cu130", 91300, None)
    layout_dependent_backends(monkeypatch, ("SlowDilated3d", "SlowTranspose3d"), ("Cudnn", "CudnnTranspose"))
    assert check_conv3d(torch.device("cuda"), "bf16", True, channels_last=True) == []
    assert "run on Cudnn (transposed: CudnnTranspose), layout channels_last_3d" in caplog.text
    warnings = check_conv3d(torch.device("cuda"), "bf16", True, channels_last=False)
    assert len(warnings) == 2 and "PyTorch 2.9.0 turns cuDNN off" in warnings[0]
    assert "--channels_last is the cheapest fix" in warnings[1]


def test_the_transposed_probe_asks_in_the_runs_layout(monkeypatch):
    asked = []

    def select(x, weight, *args):
        asked.append((args[4], x.is_contiguous(memory_format=torch.channels_last_3d),
                      weight.is_contiguous(memory_format=torch.channels_last_3d)))
        return torch._C._ConvBackend.Cudnn
    monkeypatch.setattr(torch._C, "_select_conv_backend", select)
    conv3d.conv_backends(torch.device("cpu"), torch.float32, torch.channels_last_3d)
    assert asked == [(False, True, True), (True, True, True)]  # Conv3d, then ConvTranspose3d


def cpu_backends(monkeypatch, answers):
    """A CPU dispatcher that answers ``answers[dtype]`` (its Conv3d backend) for each precision."""
    monkeypatch.setattr(conv3d, "conv_backends", lambda device, dtype, *_: (answers[dtype], "whatever"))


@pytest.mark.parametrize("answers, emulated", [
    ({torch.float32: "Mkldnn", torch.bfloat16: "Slow3d"}, True),      # an AVX2-only x86 CPU
    ({torch.float32: "Mkldnn", torch.bfloat16: "Mkldnn"}, False),     # AVX-512 and newer
    ({torch.float32: "Slow3d", torch.bfloat16: "Slow3d"}, False),     # no oneDNN at all: bf16 no slower than fp32
])
def test_a_cpu_emulates_16_bit_where_the_dispatcher_leaves_onednn_for_the_reference_code(monkeypatch, answers,
                                                                                         emulated):
    cpu_backends(monkeypatch, answers)
    assert conv3d.emulated_on_cpu("bf16") is emulated
    assert conv3d.emulated_on_cpu("none") is False  # fp32 is never emulated


@pytest.mark.parametrize("supported", [True, False])
def test_where_the_dispatcher_cannot_be_asked_onednn_s_own_check_answers(monkeypatch, supported):
    cpu_backends(monkeypatch, {torch.float32: "unknown", torch.float16: "unknown"})
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", lambda: supported, raising=False)
    assert conv3d.emulated_on_cpu("fp16") is not supported
