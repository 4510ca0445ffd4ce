"""benchmarks/scaling.py and benchmarks/plot_scaling.py on benchmark files that real CPU runs (1 and 2 gloo ranks,
with and without --noddp) write, and on files with known throughputs."""
import argparse
import datetime
import glob
import json
import os
import subprocess
import sys

import pytest

from benchmarks import scaling
from conftest import ROOT, timeout_for
from benchmarks import plot_scaling
from figures import tutorial_images as figures

pytestmark = pytest.mark.slow


def test_scaling_benchmark_runs_one_and_two_ranks_and_plots_them(synthetic_data_dir, tmp_path, capsys):
    """benchmarks.scaling on CPU: real torchrun runs of 1 and 2 gloo ranks, with DDP and with --noddp."""
    out = tmp_path / "scaling" / "cpu-test"
    index = scaling.main(["--preset", "cpu", "--ranks", "1", "2", "--nbatches", "2", "--ntrials", "1",
                          "--nwarmup", "1", "--data_dir", str(synthetic_data_dir), "--out_dir", str(out),
                          "--work_dir", str(tmp_path / "work"), "--extra=--base_channels=4"])
    assert [(p["mode"], p["ranks"]) for p in index["points"]] == [("ddp", 1), ("noddp", 1), ("ddp", 2), ("noddp", 2)]
    assert all("error" not in p for p in index["points"]), (out / "ddp_2.log").read_text()[-3000:]
    assert json.loads((out / "ddp_2.json").read_text())["nranks"] == 2
    assert "OMP_NUM_THREADS=1" in index["points"][0]["command"] and "--nproc_per_node=2" in index["points"][2]["command"]
    table = (out / "README.md").read_text()
    rows = [line.split("|")[1:-1] for line in table.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert [row[0].strip() for row in rows] == ["1", "2"] and rows[0][2].strip() == "100.0%"  # its own baseline
    assert "ddp_2.json" in table and index["device"] in table

    # make figures draws the folder; the plotting tool reads the same files.
    assert figures.scaling_figures(str(tmp_path), str(tmp_path)) == [("scaling_cpu-test.png", str(out))]
    assert (tmp_path / "scaling_cpu-test.png").read_bytes()[:4] == b"\x89PNG"
    plot_scaling.main(["--ddp", *map(str, out.glob("ddp_*.json")), "--out", str(tmp_path / "ddp_only.png")])
    assert "| 2 |" in capsys.readouterr().out and (tmp_path / "ddp_only.png").exists()
    # Run again into the same folder with --overwrite: the scratch run directories of the last run do not
    # stop it, and the last run's two-rank points, which this one does not measure, are gone.
    again = scaling.main(["--preset", "cpu", "--ranks", "1", "--nbatches", "2", "--ntrials", "1", "--nwarmup", "1",
                          "--data_dir", str(synthetic_data_dir), "--out_dir", str(out), "--work_dir",
                          str(tmp_path / "work"), "--extra=--base_channels=4", "--overwrite"])
    assert all("error" not in p for p in again["points"])
    assert not (out / "ddp_2.json").exists() and (out / "ddp_1.json").exists()


def test_a_failed_point_is_recorded_and_the_others_kept(synthetic_data_dir, tmp_path):
    """A run that fails (here train.py refuses a crop the U-Net cannot halve) leaves its log and an error
    in the index; the table says so, and a folder without two finished sizes draws no plot."""
    out = tmp_path / "scaling" / "broken"
    index = scaling.main(["--preset", "cpu", "--ranks", "1", "--data_dir", str(synthetic_data_dir),
                          "--out_dir", str(out), "--work_dir", str(tmp_path / "work"), "--extra=--crop_size=31"])
    # torchrun ends with status 1 when a rank fails (train.py itself exits with 2).
    assert [p["error"] for p in index["points"]] == ["the run failed (exit status 1)"] * 2
    assert "crop_size=31 does not fit the U-Net" in (out / "ddp_1.log").read_text()
    assert "- no result, the run failed (exit status 1), log `noddp_1.log` (noddp, 1 rank)" in \
        (out / "README.md").read_text()
    assert json.loads((out / "scaling.json").read_text())["points"] == index["points"]
    assert figures.scaling_figures(str(tmp_path), str(tmp_path)) == []


def test_mode_runs_only_the_ddp_or_only_the_noddp_points(synthetic_data_dir, tmp_path, capsys):
    """--mode ddp or noddp: one run per size, of that mode alone (here runs that train.py refuses at once: the
    points are what counts); --ddp_options with --mode noddp tunes nothing and is refused before anything runs."""
    for mode in ("ddp", "noddp"):
        out = tmp_path / mode
        index = scaling.main(["--preset", "cpu", "--ranks", "1", "--mode", mode, "--data_dir", str(synthetic_data_dir),
                              "--out_dir", str(out), "--work_dir", str(tmp_path / "work"), "--extra=--crop_size=31"])
        assert [(point["mode"], point["ranks"]) for point in index["points"]] == [(mode, 1)]
        assert sorted(path.name for path in out.glob("*.log")) == [f"{mode}_1.log"]
    with pytest.raises(SystemExit) as refused:
        scaling.main(["--preset", "cpu", "--ranks", "1", "--mode", "noddp", "--ddp_options=--bucket_cap_mb=100",
                      "--data_dir", str(synthetic_data_dir), "--out_dir", str(tmp_path / "refused")])
    assert refused.value.code == 2 and "--mode noddp runs no DDP" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()


def test_ddp_options_reach_the_ddp_runs_only_and_name_the_folder():
    """--noddp runs send no gradients, and train.py refuses DDP's knobs with --noddp."""
    args = argparse.Namespace(nbatches=2, ntrials=1, nwarmup=1, work_dir="scratch", extra="--amp_mode=bf16",
                              ddp_options="--bucket_cap_mb=100 --ddp_comm_hook=bf16", local_batch_size=None,
                              global_batch_size=None)
    ddp = scaling.point_command(scaling.PRESETS["cpu"], args, 2, "ddp", "t.h5", "v.h5")
    noddp = scaling.point_command(scaling.PRESETS["cpu"], args, 2, "noddp", "t.h5", "v.h5")
    assert {"--bucket_cap_mb=100", "--ddp_comm_hook=bf16"} <= set(ddp) and "--noddp" not in ddp
    assert "--noddp" in noddp and not {"--bucket_cap_mb=100", "--ddp_comm_hook=bf16"} & set(noddp)
    stamp = datetime.datetime(2026, 11, 23)
    assert scaling.folder_name("NVIDIA H100 80GB HBM3", stamp, args) == \
        "nvidia-h100-80gb-hbm3-2026-11-23-amp-mode-bf16-bucket-cap-mb-100-ddp-comm-hook-bf16"
    plain = argparse.Namespace(extra="", ddp_options="", local_batch_size=None, global_batch_size=None)
    assert scaling.folder_name("CPU (vm, 2 cores)", stamp, plain) == "cpu-vm-2-cores-2026-11-23"
    strong = argparse.Namespace(**{**vars(plain), "global_batch_size": 16})
    assert scaling.folder_name("CPU (vm, 2 cores)", stamp, strong) == "cpu-vm-2-cores-2026-11-23-strong-16"
    strong_args = argparse.Namespace(**{**vars(args), "global_batch_size": 16})
    local = [[arg for arg in scaling.point_command(scaling.PRESETS["cpu"], strong_args, n, "ddp", "t.h5", "v.h5")
              if arg.startswith("--local_batch_size=")] for n in (1, 2)]
    assert local == [["--local_batch_size=16"], ["--local_batch_size=8"]]  # one global batch, split


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
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()[2:4]]
    assert [[cell.strip() for cell in row] for row in rows] == [["1", "100.0", "100.0%", "100.0", "within noise (trials vary 2%)"],
                                                               ["2", "180.0", "90.0%", "200.0", "10.0%"]]
    assert (tmp_path / "scaling.png").read_bytes()[:4] == b"\x89PNG"


def test_missing_files_are_refused_with_one_paragraph_and_cpu_ranks_are_named_so(tmp_path):
    """As the README's command runs before any sbatch loop wrote its files: the glob stays unexpanded."""
    command = [sys.executable, "-m", "benchmarks.plot_scaling", "--ddp", "scaling/ddp_*.json", "--out",
               str(tmp_path / "scaling.png")]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(120))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("error: scaling/ddp_*.json does not exist.")
    assert not (tmp_path / "scaling.png").exists()

    path = tmp_path / "ddp_1.json"
    path.write_text(json.dumps({"nranks": 1, "device": "cpu", "FULL": {"trial_throughput": [10.0]}}))
    result = subprocess.run(command[:4] + [str(path), *command[5:]], cwd=ROOT, capture_output=True, text=True,
                            timeout=timeout_for(120))
    assert result.returncode == 0, result.stderr
    assert "| CPU ranks |" in result.stdout and "GPU" not in result.stdout, result.stdout


def test_the_plot_labels_each_overhead_as_the_table_does_and_goes_where_asked(tmp_path, monkeypatch, capsys):
    """The committed CPU run's one-rank overhead is within noise in the table: the plot draws it as zero
    and says so, rather than a percentage of noise. An --out path is honoured as given; without one the plot
    goes to runs/benchmarks/."""
    import matplotlib.figure

    folder = os.path.join(ROOT, "benchmarks", "results", "scaling", "cpu-vm-2-cores-2026-11-25")
    labels = []

    def savefig(figure, path, *args, **kwargs):
        labels.extend(text.get_text() for text in figure.axes[1].texts)
        with open(path, "wb") as f:
            f.write(b"\x89PNG")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    monkeypatch.chdir(tmp_path)
    ddp, noddp = (sorted(glob.glob(os.path.join(folder, f"{mode}_*.json"))) for mode in ("ddp", "noddp"))
    plot_scaling.main(["--ddp", *ddp, "--noddp", *noddp, "--out", "myscaling.png"])
    assert labels == ["within noise\n(trials vary 3%)", "15.7%"]
    assert "| 1 | 84.1 | 100.0% | 84.1 | within noise (trials vary 3%) |" in capsys.readouterr().out
    assert (tmp_path / "myscaling.png").exists()
    (tmp_path / "runs" / "benchmarks").mkdir(parents=True)
    monkeypatch.setattr(plot_scaling, "user_file", lambda name: str(tmp_path / "runs" / "benchmarks" / name))
    plot_scaling.main(["--ddp", *ddp])
    assert (tmp_path / "runs" / "benchmarks" / "scaling.png").exists()


def test_the_scaling_tool_prints_a_plot_command_that_runs_and_the_readmes_efficiency(tmp_path, capsys):
    folder = os.path.join(ROOT, "benchmarks", "results", "scaling", "cpu-vm-2-cores-2026-11-25")
    command = scaling.plot_command(folder).replace("benchmarks/results/scaling/cpu-vm-2-cores-2026-11-25/scaling.png",
                                                   str(tmp_path / "scaling.png"))
    result = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(120),
                            env={**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "scaling.png").exists()
    assert scaling.compare_efficiency(folder) == (
        "The number to compare (README): 2 ranks with DDP: 79.6% weak-scaling efficiency, 15.7% lost to "
        "communication; the README's: 79.6%, 15.7% (benchmarks/results/scaling/cpu-vm-2-cores-2026-11-25).")
