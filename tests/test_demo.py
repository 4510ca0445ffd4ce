"""The Quick start's demo, as `make demo` runs it: it must really learn, and say where its results went."""
import os
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import ROOT, run_train, timeout_for

pytestmark = pytest.mark.slow


def test_demo_halves_the_validation_loss(tmp_path):
    # The generator's default data set (128^3 train, 64^3 validation), as `make demo` makes it.
    subprocess.run([sys.executable, "-m", "utils.generate_data", "--out_dir", str(tmp_path / "data"), "--no_npy"],
                   cwd=ROOT, check=True, capture_output=True)
    result = run_train(["--config=demo", f"--train_path={tmp_path / 'data' / 'synthetic_train.h5'}",
                        f"--val_path={tmp_path / 'data' / 'synthetic_valid.h5'}", f"--expdir={tmp_path / 'runs'}",
                        "--device=cpu"],  # the CPU demo, also on a machine with a GPU
                       env={**os.environ, "OMP_NUM_THREADS": "2"})  # the Makefile's DEMO_THREADS
    run_dir = tmp_path / "runs" / "demo" / "1CPU" / "00"
    assert f"TensorBoard logs: {run_dir / 'logs'}" in result.stdout
    assert f"Preview image: {run_dir / 'preview.png'}" in result.stdout

    events = EventAccumulator(str(run_dir / "logs"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    assert {"Loss/train", "Loss/valid", "Learning Rate", "Avg iters per sec"} <= set(events.Tags()["scalars"])
    assert events.Images("Preview")
    valid = events.Scalars("Loss/valid")
    assert valid[0].step == 0 and len(valid) == 5
    assert valid[-1].value <= 0.5 * valid[0].value, [v.value for v in valid]
    # The closing comparison with the README's loss, and the loss curves beside the preview.
    assert (f"The demo's expected final validation loss is 0.0174 (README, 2 CPU threads): yours is "
            f"{valid[-1].value:f} (2 CPU threads; ") in result.stdout
    assert (run_dir / "loss_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_domain_demo_learns_on_the_large_data_set(tmp_path):
    """torchrun --nproc_per_node=2 train.py --config=domain_demo, as the README runs it, on boxes of the
    sides it needs (the README's data_large/ has a 256^3 training box; 128^3 here, to be quicker). Its
    validation loss falls at every epoch; on the synthetic loader's noise it stayed flat."""
    data = tmp_path / "data_large"
    subprocess.run([sys.executable, "-m", "utils.generate_data", "--out_dir", str(data), "--no_npy",
                    "--train_size", "128", "--val_size", "128"], cwd=ROOT, check=True, capture_output=True)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "train.py", "--config=domain_demo", f"--train_path={data / 'synthetic_train.h5'}",
                             f"--val_path={data / 'synthetic_valid.h5'}", f"--expdir={tmp_path / 'runs'}",
                             "--device=cpu", "--val_metrics=false", "--preview_image=false", "--checkpoint=false"],
                            cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(900))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    events = EventAccumulator(str(tmp_path / "runs" / "domain_demo" / "2CPU" / "00" / "logs"))
    events.Reload()
    valid = [event.value for event in events.Scalars("Loss/valid")]
    assert len(valid) == 3 and valid[2] < valid[1] < valid[0] and valid[2] < 0.95 * valid[0], valid
