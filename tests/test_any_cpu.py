"""The CPU's 16-bit arithmetic: the tests that compute in bf16 or fp16 on the CPU (marked cpu16) hold where the
CPU emulates it, too. Most laptops and many servers have no native bf16 (AVX2 only: AMD before Zen 4, Intel's
consumer chips): there PyTorch computes 16-bit convolutions in its generic reference code, tens of times slower,
returning other layouts. A machine with AVX-512 is made to compute as one of those by capping PyTorch's and
oneDNN's kernels at AVX2 (conftest.AS_AVX2), and runs those tests again so."""
import json
import os
import subprocess
import sys

import pytest

from conftest import AS_AVX2, ROOT, timeout_for, x86_only
from utils.conv3d import emulated_on_cpu

pytestmark = x86_only

ASK = """
import json, torch
from utils.conv3d import conv_backends, cpu_capability, emulated_on_cpu
cpu = torch.device("cpu")
print(json.dumps({"capability": cpu_capability(), "onednn_bf16": torch.ops.mkldnn._is_mkldnn_bf16_supported(),
                  "emulated": {mode: emulated_on_cpu(mode) for mode in ("bf16", "fp16")},
                  "backends": {str(dtype): conv_backends(cpu, dtype)[0]
                               for dtype in (torch.float32, torch.bfloat16, torch.float16)}}))
"""


def test_the_avx2_cap_takes_onednn_s_16_bit_convolutions_away():
    """On any x86-64 CPU: oneDNN then refuses bf16, the dispatcher sends 16-bit convolutions to the reference code
    (Slow3d) and fp32 ones still to oneDNN, and the run's check says so."""
    result = subprocess.run([sys.executable, "-c", ASK], capture_output=True, text=True, check=True, cwd=ROOT,
                            env={**os.environ, **AS_AVX2})
    found = json.loads(result.stdout)
    assert found["capability"] == "AVX2" and found["onednn_bf16"] is False, found
    assert found["backends"] == {"torch.float32": "Mkldnn", "torch.bfloat16": "Slow3d", "torch.float16": "Slow3d"}
    assert found["emulated"] == {"bf16": True, "fp16": True}


@pytest.mark.slow
def test_the_16_bit_cpu_tests_pass_where_the_cpu_emulates_16_bit():
    if emulated_on_cpu("bf16"):
        pytest.skip("this CPU emulates bf16 itself: the suite has run its cpu16 tests on it as they are")
    result = subprocess.run([sys.executable, "-m", "pytest", "-m", "cpu16", "-p", "no:cacheprovider", "-q"],
                            capture_output=True, text=True, cwd=ROOT, env={**os.environ, **AS_AVX2},
                            timeout=timeout_for(600))
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    assert " passed" in result.stdout.splitlines()[-1] and " skipped" not in result.stdout.splitlines()[-1], \
        result.stdout[-2000:]
