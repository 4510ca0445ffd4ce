"""benchmarks/original.py on a CPU: the data in the original's layout, read back by the original's own loader;
the commands it builds, accepted by the original's train.py up to its first CUDA call; its log lines read;
the refusals. The measurement itself needs a GPU (benchmarks/original.py says why).

The tests that run the original's code need a checkout of it (NERSC/sc22-dl-tutorial): SC22_ORIGINAL, or
../shared/sc22/original beside the repository; without one they are skipped."""
import json
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
import yaml

from benchmarks import ladder, original
from conftest import ROOT, shared_folder, timeout_for
from utils.convert_h5_to_npy import convert

CHECKOUT = os.environ.get("SC22_ORIGINAL", shared_folder("sc22", "original"))
needs_checkout = pytest.mark.skipif(not os.path.isfile(os.path.join(CHECKOUT, "train.py")),
                                    reason=f"needs a checkout of the original tutorial (SC22_ORIGINAL; {CHECKOUT} "
                                           "has none)")


@pytest.fixture
def original_data(tmp_path, data_files):
    """The test's small data set (train side 48, validation 32) with its .npy copies, and the original's config
    on it: crops of 16 (the original's 64 needs a larger box), absolute paths (its runs start in the checkout)."""
    paths = {}
    for name in ("train", "valid"):
        paths[name] = str(tmp_path / f"synthetic_{name}.h5")
        shutil.copy(data_files[name], paths[name])
        convert(paths[name])
    config = original.original_config(CHECKOUT, paths["train"], paths["valid"], epochs=2, samples_per_epoch=8,
                                      val_samples=4, expdir=str(tmp_path / "runs"))
    config["data_size"] = 16
    config_path = tmp_path / "original_config.yaml"
    original.write_config(config_path, config)
    return paths, config, config_path


@needs_checkout
def test_the_config_is_the_originals_base_with_the_data_and_the_runs_length_only(original_data):
    paths, config, _ = original_data
    with open(os.path.join(CHECKOUT, "config", "UNet.yaml")) as f:
        base = yaml.safe_load(f)["base"]
    changed = {"train_path", "val_path", "train_path_npy_data", "train_path_npy_label", "val_path_npy_data",
               "val_path_npy_label", "box_size", "data_size", "Nsamples", "Nsamples_val", "num_epochs", "expdir",
               "use_cache"}
    assert set(config) == set(base)  # no key of its own
    assert {key: value for key, value in config.items() if key not in changed} == \
        {key: value for key, value in base.items() if key not in changed}
    assert config["box_size"] == [48, 32] and config["Nsamples"] == 8 and config["use_cache"] is None
    # The DALI loader's files: the original's converter's names and channel-last layout (D, H, W, C).
    with h5py.File(paths["train"], "r") as f:
        for key, dataset in (("train_path_npy_data", "Nbody"), ("train_path_npy_label", "Hydro")):
            assert config[key] == paths["train"][:-3] + ("_data.npy" if dataset == "Nbody" else "_label.npy")
            assert np.array_equal(np.load(config[key]), np.transpose(f[dataset][...], (1, 2, 3, 0)))


# Run in the checkout (its utils package, not this project's): its loaders on the test's data, and one crop of its
# dataset class against the window it was cut from (a right-angle rotation only reorders each channel's voxels).
READ_BACK = """
import json, sys
import h5py, numpy as np
from utils.YParams import YParams
from utils import get_data_loader_distributed
from utils.data_loader import RandomCropDataset

params = YParams(sys.argv[1], "benchmark")
params.update({"distributed": False, "local_batch_size": 4, "enable_benchy": False, "num_data_workers": 1,
               "data_loader_config": sys.argv[2]})
train, valid = get_data_loader_distributed(params, 0)
inputs, targets = next(iter(train))
report = {"train": [list(inputs.shape), list(targets.shape), str(inputs.dtype)], "batches": len(train),
          "valid": [list(tensor.shape) for tensor in next(iter(valid))]}
dataset, side, crop = RandomCropDataset(params), params.box_size[0], params.data_size
np.random.seed(3)
x, y, z = (np.random.randint(low=0, high=side - crop) for _ in range(3))  # the draws the dataset makes first
np.random.seed(3)
inputs, targets = dataset[0]
with h5py.File(params.train_path, "r") as f:
    windows = [f[name][:, x:x + crop, y:y + crop, z:z + crop] for name in ("Nbody", "Hydro")]
report["same_voxels"] = all(np.array_equal(np.sort(crop_.numpy()[c].ravel()), np.sort(window[c].ravel()))
                            for crop_, window in zip((inputs, targets), windows) for c in range(len(window)))
print(json.dumps(report))
"""


@needs_checkout
@pytest.mark.parametrize("kind", ["lowmem", "inmem"])
def test_the_data_is_read_back_by_the_originals_own_loader(original_data, kind):
    _, _, config_path = original_data
    result = subprocess.run([sys.executable, "-c", READ_BACK, str(config_path), kind], cwd=CHECKOUT,
                            env=original.original_env(), capture_output=True, text=True, timeout=timeout_for(120))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["train"] == [[4, 4, 16, 16, 16], [4, 5, 16, 16, 16], "torch.float32"]
    assert report["batches"] == 2 and report["valid"] == [[4, 4, 16, 16, 16], [4, 5, 16, 16, 16]]
    assert report["same_voxels"]


@needs_checkout
def test_every_flag_of_the_runs_is_one_of_the_originals(tmp_path):
    result = subprocess.run([sys.executable, os.path.join(CHECKOUT, "train.py"), "--help"], cwd=ROOT,
                            env=original.original_env(), capture_output=True, text=True, timeout=timeout_for(120))
    assert result.returncode == 0, result.stderr[-3000:]
    for entry in original.ORIGINAL_RUNS:
        command = original.original_command(CHECKOUT, tmp_path / "c.yaml", entry["flags"], "00", 3)
        for argument in command[2:]:
            flag, _, value = argument.partition("=")
            assert f"  {flag}" in result.stdout, flag
            if flag in ("--data_loader_config", "--amp_mode"):
                assert value in result.stdout.split(f"{flag} {{")[1].split("}")[0].split(","), argument


def test_the_runs_environment_has_the_apex_stand_in_and_nothing_of_this_project():
    env = original.original_env({"PATH": "/bin", "PYTHONPATH": f"{ROOT}:/site", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert env == {"PATH": "/bin", "PYTHONPATH": f"{original.STANDINS}:/site"}  # /site: ruamel.yaml, DALI
    assert original.original_env({})["PYTHONPATH"] == original.STANDINS
    assert os.path.isfile(os.path.join(original.STANDINS, "apex", "optimizers", "__init__.py"))
    assert "stand-in" in original.APEX_NOTE


def test_the_command_and_the_runs_without_dali():
    command = original.original_command("/o", "c.yaml", ["--enable_jit"], "07", 3)
    assert command == [sys.executable, "/o/train.py", f"--yaml_config={os.path.abspath('c.yaml')}",
                       "--config=benchmark", "--run_num=07", "--num_epochs=3", "--enable_jit"]
    names = [entry["name"] for entry in original.original_runs(dali=False)]
    assert len(names) == 2 and not any("DALI" in name for name in names)
    assert [entry["name"] for entry in original.original_runs(dali=True)][2].startswith("DALI")
    assert [entry for entry in original.ORIGINAL_RUNS if entry.get("baseline")] == [original.ORIGINAL_RUNS[0]]


def test_the_originals_epoch_lines_are_read_and_the_first_epoch_left_out():
    # Its format: 'Time taken for epoch {} is {} sec, avg {} samples/sec', behind its logger's prefix.
    log = "\n".join("2026-11-26 10:00:00,000 - root - INFO - " +
                    "Time taken for epoch {} is {} sec, avg {} samples/sec".format(epoch, 1280 / rate, rate)
                    for epoch, rate in ((1, 40.0), (2, 100.5), (3, 99.5))) + "\n  Avg train loss=0.1\n"
    epochs = original.epoch_rates(log)
    assert [(epoch, rate) for epoch, _, rate in epochs] == [(1, 40.0), (2, 100.5), (3, 99.5)]
    assert epochs[0][1] == pytest.approx(32.0)
    assert original.steady_rate(epochs) == pytest.approx(100.0)
    assert original.steady_rate(epochs[:1]) is None and original.epoch_rates("no such line") == []


def test_this_projects_rungs_are_found_in_the_ladder():
    picked = original.pick_rungs(original.DEFAULT_RUNGS, ladder.rungs_for("gpu", dali=True))
    assert all(rung is not None for _, rung in picked), [fragment for fragment, rung in picked if rung is None]
    assert picked[0][1].name.startswith("baseline")
    [(_, missing)] = original.pick_rungs(["no rung is named so"], ladder.rungs_for("gpu", dali=True))
    assert missing is None
    assert original.measure_ours("no rung is named so", None, [], None, None) == \
        {"name": "no rung is named so", "error": "benchmarks/ladder.py has no rung of this name"}
    # --rungs none (the headline stage's): the original's runs alone, no row of a rung that does not exist.
    assert original.rung_fragments("none") == original.rung_fragments("") == []
    assert original.rung_fragments("baseline|+ fused Adam") == ["baseline", "+ fused Adam"]


def test_the_ratios_and_the_table():
    theirs = [{"name": "baseline", "baseline": True, "samples_per_s": 50.0, "epochs": [(1, 1.0, 40.0)]},
              {"name": "best", "samples_per_s": 400.0, "epochs": []},
              {"name": "broken", "samples_per_s": None, "epochs": [], "error": "exit status 1"}]
    ours = [{"name": "baseline: lowmem", "baseline": True, "full": 60.0, "synthetic": 70.0, "io": 65.0},
            {"name": "+ fused", "baseline": False, "full": 800.0, "synthetic": 900.0, "io": None},
            {"name": "missing", "error": "benchmarks/ladder.py has no rung of this name"}]
    assert original.ratios(theirs, ours) == {"baseline": pytest.approx(1.2), "fastest": pytest.approx(2.0)}
    assert original.ratios(theirs[2:], ours) == {"baseline": None, "fastest": None}
    report = {"command": "python -m benchmarks.original --original=o", "device": "GPU", "torch": "2.13.0",
              "cuda": "13.0", "date": "2026-11-26", "data": "d", "apex": original.APEX_NOTE,
              "original": {"what": "its train.py", "epochs": 3, "samples_per_epoch": 1280},
              "original_runs": theirs, "runs": ours, "ratios": original.ratios(theirs, ours)}
    table = original.markdown_table(report)
    assert "| baseline | 50.0 | 40.0 |" in table and "| broken | not measured (exit status 1) |  |" in table
    assert "| + fused | 800.0 | 900.0 | not measured |" in table and "| fastest | 2.00 |" in table
    assert "stand-in" in table and "| missing | benchmarks/ladder.py has no rung of this name | | |" in table


def test_a_folder_that_is_not_a_checkout_is_refused_and_nothing_is_written(tmp_path):
    (tmp_path / "train.py").write_text("print('some other train.py')\n")
    for folder in (tmp_path, tmp_path / "missing"):
        result = subprocess.run([sys.executable, "-m", "benchmarks.original", f"--original={folder}",
                                 f"--out_dir={tmp_path / 'out'}"], cwd=ROOT, capture_output=True, text=True,
                                timeout=timeout_for(120))
        assert result.returncode == 2, result.stderr
        message = " ".join(result.stderr.split())
        assert message.startswith(f"error: --original={folder} is not a checkout of the original SC22 tutorial")
        assert "Nothing was run or written" in message and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_refuses_in_one_paragraph_and_writes_nothing(tmp_path):
    checkout = tmp_path / "checkout"  # what the check reads of a checkout: its files and train.py's epoch line
    for name in original.CHECKOUT_FILES:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text("")
    (checkout / "train.py").write_text("logging.info('Time taken for epoch {} is {} sec, avg {} samples/sec')\n")
    result = subprocess.run([sys.executable, "-m", "benchmarks.original", f"--original={checkout}",
                             f"--out_dir={tmp_path / 'out'}", f"--data_dir={tmp_path / 'data'}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=timeout_for(120))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    message = " ".join(result.stderr.split())
    assert message.startswith("error: benchmarks.original needs a CUDA GPU, and PyTorch sees none")
    assert "Nothing was run or written" in message and len(result.stderr.strip().split("\n\n")) == 1
    assert not (tmp_path / "out").exists() and not (tmp_path / "data").exists()


@needs_checkout
@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs it for real")
def test_main_runs_both_sides_and_writes_what_it_measured(tmp_path, monkeypatch, capsys):
    """The whole run on a CPU, its two GPU-only parts replaced: the check for a GPU passes, and this project's rungs
    return a fixed summary instead of being measured. The original's run (one: AMP, the apex stand-in, JIT) is
    real: it reads the config, makes its run directory and logs the config, then stops at its first CUDA call (it
    has no CPU path); it is reported as failed, with no number, and no ratio is made from it."""
    monkeypatch.setattr(original, "check_gpu", lambda: None)
    monkeypatch.setattr(original, "ORIGINAL_RUNS", original.ORIGINAL_RUNS[1:2])
    monkeypatch.setattr(original, "device_name", lambda gpu: "Test GPU")
    monkeypatch.setattr(original, "GPU_BOX", 32)
    monkeypatch.setattr(ladder, "slow_convolutions", lambda options, device: None)
    measured = []

    def measure_in_process(rung, common, args, sizes, log_path):
        measured.append((rung.name, common, sizes))
        assert "--exact_forms=off" in rung.options  # as the ladder runs them: no rung below the forms' times them
        return {"full": 10.0, "synthetic": 12.0, "io": 30.0, "precision": "bf16"}
    monkeypatch.setattr(ladder, "measure_in_process", measure_in_process)
    original.main([f"--original={CHECKOUT}", f"--out_dir={tmp_path / 'out'}", f"--data_dir={tmp_path / 'data'}",
                   f"--work_dir={tmp_path / 'work'}", "--rungs=baseline|+ fused Adam|no such rung",
                   "--rung_timeout=300"])
    [base] = [str(path)[:-5] for path in (tmp_path / "out").glob("test-gpu-*.json")]
    with open(base + ".json") as f:
        report = json.load(f)
    [run] = report["original_runs"]
    assert run["name"] == original.ORIGINAL_RUNS[0]["name"] and run["samples_per_s"] is None
    assert run["error"].startswith("exit status 1")
    assert [run["name"] for run in report["runs"]] == ["baseline: lowmem, 2 workers", "+ fused Adam",
                                                        "no such rung"]
    assert report["runs"][0]["baseline"] and "error" in report["runs"][2]
    assert report["runs"][1]["options"] == [*ladder.BF16_FUSED, "--exact_forms=off"]
    assert [name for name, _, _ in measured] == ["baseline: lowmem, 2 workers", "+ fused Adam"]
    # The baseline: a host loader's rung, at least the ladder's HOST_LOADER_BATCHES a trial
    assert measured[0][2] == (ladder.HOST_LOADER_BATCHES, 2, 1) and "--device=cuda" in measured[0][1]
    assert report["ratios"] == {"baseline": None, "fastest": None} and "stand-in" in report["apex"]
    with open(base + ".yaml") as f:
        config = yaml.safe_load(f)["benchmark"]
    assert config["box_size"] == [32, 16] and config["expdir"] == str(tmp_path / "work")
    with open(base + ".log") as f:
        log = f.read()
    assert log.count("$ ") == 1 and "Configuration name: benchmark" in log
    assert f"train_path {config['train_path']}" in log
    # The traceback ends in torch.cuda.set_device, the first thing its train() does.
    assert re.search(r"torch/cuda/__init__\.py\", line \d+, in set_device\n", log), log[-3000:]
    # The original's own argument parsing: each of the run's flags is in the configuration it logged.
    logged = dict(re.findall(r" - root - INFO - (\w+) (.+)", log))
    assert {flag: logged.get(flag) for flag in ("data_loader_config", "num_data_workers", "amp_mode", "enable_apex",
                                                "enable_jit", "amp_dtype")} == {
        "data_loader_config": "lowmem", "num_data_workers": "8", "amp_mode": "fp16", "enable_apex": "True",
        "enable_jit": "True", "amp_dtype": "torch.float16"}, run["flags"]
    [run_dir] = (tmp_path / "work" / "benchmark" / "1GPU").iterdir()  # the original's, not in the repository
    with open(run_dir / "out.log") as f:  # its logger's file, in the run directory it made
        assert "amp_dtype torch.float16" in f.read()
    printed = capsys.readouterr().out
    assert "| fastest | not measured |" in printed
