"""DDP with every loader kind: two gloo ranks train to the end with native, GPU-resident and DALI loaders."""
import os
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import ROOT, needs_dali, timeout_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_with_npy(tmp_path_factory):
    """A small data set with the channel-last .npy copies that the DALI loader reads."""
    directory = tmp_path_factory.mktemp("ddp_data")
    subprocess.run([sys.executable, "-m", "utils.generate_data", "--out_dir", str(directory), "--train_size", "48",
                    "--val_size", "32"], cwd=ROOT, check=True, capture_output=True)
    return directory


@pytest.mark.parametrize("loader", ["lowmem", "gpu-inmem", pytest.param("dali-lowmem", marks=needs_dali)])
def test_two_ranks_train_with_each_loader(data_with_npy, tmp_path, loader):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               os.path.join(ROOT, "train.py"), "--config=test", f"--data_loader_config={loader}",
               f"--train_path={data_with_npy / 'synthetic_train.h5'}", f"--val_path={data_with_npy / 'synthetic_valid.h5'}",
               f"--expdir={tmp_path}", "--num_data_workers=1" if loader == "lowmem" else "--num_data_workers=0"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(300),
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    events = EventAccumulator(str(tmp_path / "test" / "2CPU" / "00" / "logs"))
    events.Reload()
    # 16 samples: 8 per rank, at a local batch of 2 (global 4 over 2 ranks) 4 steps per epoch.
    assert [e.step for e in events.Scalars("Loss/valid")] == [0, 4, 8]
