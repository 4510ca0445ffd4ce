"""Every mistake a user can make ends with one clear paragraph, exit status 2 and nothing overwritten."""
import os
import re
import subprocess
import sys

import h5py
import numpy as np
import pytest

import train
from conftest import ROOT, run_train, timeout_for

pytestmark = pytest.mark.slow


def run_main(argv, capsys, **main_options):
    """train.main(argv) in this process; returns (exit code, stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv, **main_options)
    return exit_info.value.code, capsys.readouterr().err


def assert_refused(argv, capsys, expdir, *fragments, **main_options):
    code, message = run_main(argv, capsys, **main_options)
    assert code == 2
    assert message.startswith("error: ") and "Traceback" not in message
    for fragment in fragments:
        assert fragment in " ".join(message.split()), (fragment, message)
    assert not os.path.exists(expdir), "a refused run must not write anything"


def args(data_files, expdir, *extra, train_path=None):
    return ["--config=test", f"--train_path={train_path or data_files['train']}",
            f"--val_path={data_files['valid']}", f"--expdir={expdir}", *extra]


def write_h5(path, **datasets):
    with h5py.File(path, "w") as f:
        for name, shape in datasets.items():
            f[name] = np.zeros(shape, np.float32)
    return str(path)


def test_missing_data_file(data_files, tmp_path, capsys):
    missing = str(tmp_path / "nowhere.h5")
    assert_refused(args(data_files, tmp_path / "runs", train_path=missing), capsys, tmp_path / "runs",
                   missing, "python -m utils.generate_data")


@pytest.mark.parametrize("content", [b"not an hdf5 file at all", "truncated"])
def test_unreadable_or_corrupt_file(data_files, tmp_path, capsys, content):
    path = tmp_path / "broken.h5"
    if content == "truncated":
        whole = open(data_files["train"], "rb").read()
        content = whole[: len(whole) // 3]
    path.write_bytes(content)
    assert_refused(args(data_files, tmp_path / "runs", train_path=str(path)), capsys, tmp_path / "runs",
                   str(path), "cannot be read as HDF5")


def test_wrong_datasets(data_files, tmp_path, capsys):
    path = write_h5(tmp_path / "other.h5", Nbody=(4, 32, 32, 32), density=(1, 32, 32, 32))
    assert_refused(args(data_files, tmp_path / "runs", train_path=path), capsys, tmp_path / "runs",
                   path, "no dataset Hydro", "density")


def test_wrong_shapes(data_files, tmp_path, capsys):
    path = write_h5(tmp_path / "shapes.h5", Nbody=(32, 32, 32, 4), Hydro=(32, 32, 32, 5))  # channel last
    assert_refused(args(data_files, tmp_path / "runs", train_path=path), capsys, tmp_path / "runs",
                   path, "wrong shape", "channel first")


def test_crop_larger_than_the_box(data_files, tmp_path, capsys):
    assert_refused(args(data_files, tmp_path / "runs", "--crop_size=64"), capsys, tmp_path / "runs",
                   "crop_size=64 is larger than the box side 48", data_files["train"],
                   f"(and {data_files['valid']} has side 32)", "Use --crop_size=32 or less")  # fits both files


def test_crop_that_the_unet_cannot_halve(data_files, tmp_path, capsys):
    assert_refused(args(data_files, tmp_path / "runs", "--crop_size=40"), capsys, tmp_path / "runs",
                   "multiple of 32")


def test_unknown_config(data_files, tmp_path, capsys):
    assert_refused(["--config=bs64opt"], capsys, tmp_path / "runs", "Did you mean 'bs64_opt'")


def test_unknown_key(data_files, tmp_path, capsys):
    assert_refused(args(data_files, tmp_path / "runs", "--learning_rate=1e-3"), capsys, tmp_path / "runs",
                   "Unknown option --learning_rate")


def test_invalid_value(data_files, tmp_path, capsys):
    assert_refused(args(data_files, tmp_path / "runs", "--global_batch_size=-4"), capsys, tmp_path / "runs",
                   "global_batch_size=-4", "positive integer")


def test_global_batch_not_divisible_by_ranks(data_files, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert_refused(args(data_files, tmp_path / "runs"), capsys, tmp_path / "runs",
                   "global_batch_size=4 does not divide over 3 ranks")


def test_existing_run_is_not_overwritten(data_files, tmp_path, capsys):
    run_dir = tmp_path / "runs" / "test" / "1CPU" / "00"
    run_dir.mkdir(parents=True)
    (run_dir / "out.log").write_text("an earlier run\n")
    code, message = run_main(args(data_files, tmp_path / "runs", "--run_num=00"), capsys)
    assert code == 2 and "--resume" in message and "--run_num" in message
    assert os.listdir(run_dir) == ["out.log"] and (run_dir / "out.log").read_text() == "an earlier run\n"


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(data_files, tmp_path):
    run_train(args(data_files, tmp_path, "--num_epochs=1"))
    checkpoint = tmp_path / "test" / "1CPU" / "00" / "checkpoint.pt"
    good = checkpoint.read_bytes()

    poisoned = tmp_path / "nan.h5"
    with h5py.File(data_files["train"]) as source, h5py.File(poisoned, "w") as f:
        f["Nbody"] = np.full(source["Nbody"].shape, np.nan, np.float32)
        f["Hydro"] = source["Hydro"][...]
    result = run_train(args(data_files, tmp_path, "--num_epochs=2", "--resume", "--allow_changes",
                            train_path=str(poisoned)),
                       check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "non-finite at step 4" in result.stderr  # the first step after the resumed epoch 1
    assert checkpoint.read_bytes() == good


def test_refused_at_the_last_set_up_step_writes_nothing(data_files, tmp_path, capsys):
    # The step is the last thing built: train_graph.py's, refused on a CPU (--device=cpu on a GPU
    # machine ends the same way). The run directory must not exist, so the fixed command can run.
    import train_graph

    expdir = tmp_path / "runs"
    assert_refused(args(data_files, expdir, "--device=cpu"), capsys, expdir, "needs a CUDA device",
                   make_step=train_graph.make_graph_step, graph_capture=True)
    train.main(args(data_files, expdir, "--device=cpu", "--num_epochs=1"))  # the same run directory, now free
    assert (expdir / "test" / "1CPU" / "00" / "checkpoint.pt").exists()
    assert "Configuration" in (expdir / "test" / "1CPU" / "00" / "out.log").read_text()  # the early lines too


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_train_graph_refuses_compile_modes_that_record_their_own_graphs(data_files, tmp_path, capsys, mode):
    import train_graph

    expdir = tmp_path / "runs"
    assert_refused(args(data_files, expdir, "--jit_mode=compile", f"--compile_mode={mode}"), capsys, expdir,
                   f"--compile_mode={mode} makes torch.compile record CUDA graphs", "Use --compile_mode=default",
                   make_step=train_graph.make_graph_step, graph_capture=True)


def test_compile_without_a_c_compiler(data_files, tmp_path, capsys, monkeypatch):
    """torch.compile builds C wrappers at its first call: without a compiler the run is refused at
    set-up, not minutes later inside PyTorch."""
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no cc, gcc or clang
    monkeypatch.delenv("CC", raising=False)
    expdir = tmp_path / "runs"
    assert_refused(args(data_files, expdir, "--jit_mode=compile"), capsys, expdir,
                   "--jit_mode=compile cannot run here: torch.compile needs a C compiler",
                   "install gcc and the Python headers (python3-dev), or run without --jit_mode=compile")


@pytest.mark.parametrize("loader", ["inmem", "gpu-inmem"])
def test_volume_larger_than_memory(data_files, tmp_path, capsys, monkeypatch, loader):
    # The real training file is 1024^3 x 9 channels (38.7 GB): on a machine with less free memory the
    # in-memory loaders refuse it up front instead of being killed. Here the machine "has" 1 MB.
    import utils.data_loader

    monkeypatch.setattr(utils.data_loader, "available_host_memory", lambda: 10**6)
    assert_refused(args(data_files, tmp_path / "runs", f"--data_loader_config={loader}"), capsys, tmp_path / "runs",
                   f"--data_loader_config={loader} reads the whole volume of {data_files['train']}",
                   "only 0.0 GB is available", "--data_loader_config=lowmem")


def test_resume_with_a_checkpoint_that_does_not_fit(data_files, tmp_path, capsys):
    expdir = tmp_path / "runs"
    train.main(args(data_files, expdir, "--num_epochs=1"))
    run_dir = expdir / "test" / "1CPU" / "00"
    before = {name: (run_dir / name).read_bytes() for name in ("config.yaml", "out.log", "checkpoint.pt")}
    code, message = run_main(args(data_files, expdir, "--resume", "--base_channels=8"), capsys)
    message = " ".join(message.split())
    assert code == 2 and "does not fit this run" in message and "config.yaml beside it" in message
    # The config.yaml the message points to is still the run's own: nothing was overwritten.
    assert {name: (run_dir / name).read_bytes() for name in before} == before


def test_under_torchrun_the_paragraph_is_printed_once_and_every_rank_exits_with_2(tmp_path):
    """Every rank refuses the same option; rank 0 alone prints the paragraph, the other exits quietly."""
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             os.path.join(ROOT, "train.py"), "--config=test", "--crop_size=33",
                             f"--expdir={tmp_path / 'runs'}"], cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(180))
    output = result.stdout + result.stderr
    assert output.count("error: crop_size=33 does not fit the U-Net") == 1, output[-5000:]
    assert result.returncode == 1  # torchrun's own status when a rank fails
    # torchrun's report names each rank that failed, with the rank's status: 2. Rank 1 refuses first (rank 0
    # logs the configuration before it checks); torchrun may then end rank 0 with SIGTERM (-15) before it
    # exits by itself, on a loaded machine, once it has printed the paragraph.
    statuses = sorted(re.findall(r"exitcode  : (\S+)", output))
    assert statuses in (["2", "2"], ["2"], ["-15", "2"]), output[-5000:]
    assert not os.path.exists(tmp_path / "runs")
