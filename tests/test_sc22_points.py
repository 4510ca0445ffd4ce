"""benchmarks/sc22_scaling_points.json, on which every check of the scaling model rests, is what
benchmarks/read_scaling_plots.py reads off the original's two plots today.

The plots are the original's, not in this repository: the reader finds them in $SC22_PLOTS or in a
shared/sc22 folder beside the clone (CI has one). Without them the test skips, and fails under CI.
"""
import json
import os

import pytest

from benchmarks import read_scaling_plots as reader
from conftest import ROOT, unavailable


def test_the_committed_points_are_the_readers_output_of_the_original_plots():
    eff, comm = reader.default_plots()
    if not (os.path.exists(eff) and os.path.exists(comm)):
        unavailable(f"the original's scaling plots are not at {eff} and {comm} (set SC22_PLOTS to their folder)")
    with open(os.path.join(ROOT, "benchmarks", "sc22_scaling_points.json")) as f:
        committed = json.load(f)
    fresh = json.loads(json.dumps(reader.rounded(reader.read(eff, comm))))
    assert fresh == committed
    assert committed["reading_error_px"] < 2
    assert committed["comm"]["synthetic_noddp"]["32"] == pytest.approx(104545, abs=300)
