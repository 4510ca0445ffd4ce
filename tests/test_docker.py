"""docker/Dockerfile: lint-clean, and consistent with the requirements (it cannot be built here)."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

DOCKERFILE = os.path.join(ROOT, "docker", "Dockerfile")


def hadolint():
    beside_python = os.path.join(os.path.dirname(sys.executable), "hadolint")
    return beside_python if os.path.exists(beside_python) else shutil.which("hadolint")


@pytest.mark.skipif(hadolint() is None and not os.environ.get("CI"), reason="hadolint is not installed")
def test_dockerfile_passes_hadolint():
    result = subprocess.run([hadolint(), DOCKERFILE], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_installs_the_requirements_and_the_real_apex_and_benchy():
    text = open(DOCKERFILE).read()
    assert text.startswith("#") and "FROM ${BASE}" in text and "nvcr.io/nvidia/pytorch:" in text
    assert "requirements.txt" in text and "requirements-dali.txt" in text
    assert "github.com/romerojosh/benchy" in text and "github.com/NVIDIA/apex" in text
    for line in text.splitlines():  # never the unrelated PyPI projects of those names
        assert not line.strip().startswith("RUN pip install apex") and "pip install benchy" not in line
