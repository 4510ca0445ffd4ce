"""benchmarks/notes.py: the measurement notes (benchmarks/results/README.md) are what the committed results
make, each result listed with its own provenance line, device and date."""
import os
import subprocess
import sys

from benchmarks import notes
from conftest import ROOT, timeout_for


def test_the_committed_notes_are_what_the_results_make():
    result = subprocess.run([sys.executable, "-m", "benchmarks.notes", "--check"], cwd=ROOT, capture_output=True,
                            text=True, timeout=timeout_for(60))
    assert result.returncode == 0, result.stdout[-3000:]


def write(root, path, text):
    os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
    with open(os.path.join(root, path), "w") as file:
        file.write(text)


def test_a_new_result_enters_the_notes_with_its_provenance_device_and_date(tmp_path):
    root = str(tmp_path)
    write(root, "benchmarks/results/layers/nvidia-h200-2026-12-01-bf16.md",
          "Measured by `python -m benchmarks.layers --preset gpu` on NVIDIA H200 (torch 2.11.0+cu130), "
          "2026-12-01T10:00:00+00:00: batch 64.\n\n| layer | ms |\n|---|---|\n| last | 17.0 |\n")
    write(root, "benchmarks/results/scaling_model/h100.md",
          "# Predicted\n\nMade by `python -m benchmarks.scaling_model --report`: a computation from published "
          "numbers, for one H100.\n")
    write(root, "example_logs/demo/README.md", "# The demo\n\nMade by `make demo` on the 2-core CPU machine, 2026-11-25.\n")
    assert notes.main(["--root", root, "--check"]) == 1  # nothing written yet
    assert notes.main(["--root", root]) == 0 and notes.main(["--root", root, "--check"]) == 0
    text = open(os.path.join(root, notes.NOTES)).read()
    assert ("- [nvidia-h200-2026-12-01-bf16](layers/nvidia-h200-2026-12-01-bf16.md) (H200, 2026-12-01): Measured by "
            "`python -m benchmarks.layers --preset gpu`") in text
    # A prediction for an H100 is a computation, not a measurement on one.
    assert "| results | CPU (2 cores) | H200 | none (a computation) |\n" in text
    assert "| scaling_model |  |  | - |\n" in text and "| layers |  | 2026-12-01 |  |\n" in text
    assert "(none (a computation), -): Made by `python -m benchmarks.scaling_model --report`" in text
    assert "[The demo](../../example_logs/demo/README.md) (CPU (2 cores), 2026-11-25)" in text
    write(root, "benchmarks/results/precision/cpu-vm-2-cores-2026-12-02.md", "Measured by `x` on CPU, 2026-12-02.\n")
    assert notes.main(["--root", root, "--check"]) == 1  # a result committed without its notes
