"""utils/plot_scaling.py on benchmark files that real CPU runs (1 and 2 gloo ranks, with and without --noddp) write."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from utils import plot_scaling

pytestmark = pytest.mark.slow
TRIALS = "IO: {nbatches: 2, ntrials: 1, nwarmup: 1}\nsynthetic: {nbatches: 2, ntrials: 1, nwarmup: 1}\n" \
         "full: {nbatches: 2, ntrials: 1, nwarmup: 1}\n"


def benchmark_run(data_files, tmp_path, ranks, *extra):
    name = f"{'noddp' if extra else 'ddp'}_{ranks}"
    env = {**os.environ, "BENCHY_CONFIG_FILE": str(tmp_path / "benchy.yaml"), "BENCHY_OUTPUT": str(tmp_path / name),
           "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--standalone",
               os.path.join(ROOT, "train.py"), "--config=test", f"--train_path={data_files['train']}",
               f"--val_path={data_files['valid']}", f"--expdir={tmp_path / 'runs'}", f"--run_num={name}",
               "--local_batch_size=2", "--Nsamples=32", "--enable_benchy", "--num_epochs=4", *extra]
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    return str(tmp_path / f"{name}.json")


def test_weak_scaling_plot_from_real_runs(data_files, tmp_path, capsys):
    (tmp_path / "benchy.yaml").write_text(TRIALS)
    ddp = [benchmark_run(data_files, tmp_path, n) for n in (1, 2)]
    noddp = [benchmark_run(data_files, tmp_path, n, "--noddp") for n in (1, 2)]
    plot_scaling.main(["--ddp", *ddp, "--noddp", *noddp, "--out", str(tmp_path / "scaling.png")])
    table = capsys.readouterr().out
    assert (tmp_path / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    rows = [line.split() for line in table.splitlines()[1:3]]
    assert [row[0] for row in rows] == ["1", "2"] and rows[0][2] == "100.0%"  # one rank is its own baseline
    assert plot_scaling.read_series(ddp, "FULL").keys() == {1, 2}


def test_efficiency_and_overhead_from_known_throughputs(tmp_path, capsys):
    # One GPU: 100 samples/s either way; two: 180 with DDP, 200 without communication.
    def result(name, nranks, throughputs):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"nranks": nranks, "FULL": {"trial_throughput": throughputs}}))
        return str(path)

    ddp = [result("ddp_1", 1, [99.0, 101.0]), result("ddp_2", 2, [180.0])]
    noddp = [result("noddp_1", 1, [100.0]), result("noddp_2", 2, [190.0, 210.0])]
    assert plot_scaling.efficiency(plot_scaling.read_series(ddp, "FULL")) == {1: 1.0, 2: 0.9}
    plot_scaling.main(["--ddp", *ddp, "--noddp", *noddp, "--out", str(tmp_path / "scaling.png")])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:3]]
    assert rows == [["1", "100.0", "100.0%", "100.0", "0.0%"], ["2", "180.0", "90.0%", "200.0", "10.0%"]]
    assert (tmp_path / "scaling.png").read_bytes()[:4] == b"\x89PNG"
