"""benchmarks/precision.py: the precision rungs trained side by side from the same weights and batches."""
import json
import os

import pytest

from benchmarks import precision
from conftest import ROOT
from utils.conv3d import emulated_on_cpu

TINY = ["--Nsamples=16", "--Nsamples_val=8", "--base_channels=4", "--global_batch_size=4", "--base_batch_size=4"]


@pytest.mark.slow
@pytest.mark.cpu16
def test_cpu_preset_trains_each_precision_and_refuses_to_overwrite(tmp_path, capsys):
    out_dir = tmp_path / "out"
    argv = ["--preset", "cpu", "--num_epochs", "1", "--data_dir", str(tmp_path / "data"), "--out_dir", str(out_dir),
            *TINY]
    precision.main(argv)
    [path] = out_dir.glob("*.json")
    report = json.loads(path.read_text())
    rungs = {rung["name"]: rung for rung in report["rungs"]}
    assert list(rungs) == ["fp32", "bf16", "fp16"]
    assert all(rung["steps"] == 4 and 0 < rung["val_loss"] < 1 for rung in rungs.values())
    # Same weights and batches: 16-bit autocast moves the loss by rounding, not by a different run.
    for name in ("bf16", "fp16"):
        assert rungs[name]["val_loss"] == pytest.approx(rungs["fp32"]["val_loss"], rel=0.05)
        assert rungs[name]["val_loss"] != rungs["fp32"]["val_loss"]
    assert rungs["fp16"]["final_scale"] > 0 and isinstance(rungs["fp16"]["skipped_steps"], int)
    assert rungs["fp32"]["final_scale"] is None
    output = capsys.readouterr().out
    assert "| fp32 |" in output and "+0.00%" in output
    # A line per epoch of each rung while it trains, the P ratio explained above the table, and the README's
    # number beside the committed run's.
    assert [line.split(":")[0] for line in output.splitlines() if " epoch 1/1" in line] == \
        ["fp32 epoch 1/1", "bf16 epoch 1/1", "fp16 epoch 1/1"]
    assert output.index("'P ratio at top k': P_pred(k) / P_true(k)") < output.index("| precision |")
    difference = rungs["bf16"]["val_loss"] / rungs["fp32"]["val_loss"] - 1
    path = precision.REFERENCE[emulated_on_cpu("bf16")]  # the committed run of this kind of CPU
    reference = precision.bf16_difference(committed(path))
    assert (f"The number to compare (README): bf16's validation loss against fp32's: {difference:+.2%}; the "
            f"README's: {reference:+.2%} ({path}).") in output
    with pytest.raises(SystemExit):  # exit_on_user_error: the first run's results are kept
        precision.main(argv)
    assert "already holds" in " ".join(capsys.readouterr().err.split())


def committed(path):
    with open(os.path.join(ROOT, path)) as f:
        return json.load(f)


def test_the_two_kinds_of_cpu_differ_in_bf16_only():
    """The committed CPU runs, one whose bf16 convolutions ran in oneDNN and one that emulated bf16 (AVX2 only):
    the same fp16 rung (emulated on both) to the last bit, fp32 rungs a few parts in a million apart (oneDNN's
    AVX-512 and AVX2 kernels sum in another order), and bf16 rungs a hundred times further apart."""
    native, emulated = ({rung["name"]: rung["val_loss"] for rung in committed(precision.REFERENCE[kind])["rungs"]}
                        for kind in (False, True))
    assert "AVX2" in committed(precision.REFERENCE[True])["device"]
    assert native["fp16"] == emulated["fp16"]
    assert native["fp32"] == pytest.approx(emulated["fp32"], rel=1e-5)
    assert abs(native["bf16"] / emulated["bf16"] - 1) > 100 * abs(native["fp32"] / emulated["fp32"] - 1)
