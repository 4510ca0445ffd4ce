"""--resume continues the same experiment: the run's own options from its config.yaml, the command line
given again over them, and schedule changes refused unless --allow_changes names them. No training here:
the run directories are made by hand (tests/test_train.py resumes real runs)."""
import os

import pytest

from utils.YParams import load_params
from utils.errors import UserError
from utils.runs import load_run_params, record_config


def cpu(params):
    return "CPU"


def make_run(expdir, *argv, kind="CPU", run_num="00", world_size=1):
    """A run directory as train.py leaves it: config.yaml with the options the run started with."""
    params = load_params(["--config=test", f"--expdir={expdir}", f"--run_num={run_num}", *argv], world_size)
    run_dir = os.path.join(expdir, "test", f"{world_size}{kind}", run_num)
    os.makedirs(run_dir)
    record_config(run_dir, {**params.to_dict(), "world_size": world_size}, 0)
    return run_dir


def resume(expdir, *argv, world_size=1, kind=cpu):
    return load_run_params(["--config=test", f"--expdir={expdir}", "--resume", *argv], world_size, None, kind)


def test_a_resume_takes_the_runs_own_options(tmp_path):
    make_run(tmp_path, "--num_epochs=5", "--start_lr=1e-3", "--num_data_workers=2")
    params = resume(tmp_path, "--run_num=00")
    assert (params.num_epochs, params.start_lr, params.num_data_workers) == (5, 1e-3, 2)
    assert params.resume is True


def test_without_run_num_the_last_run_gives_the_options(tmp_path):
    make_run(tmp_path, "--num_epochs=5")
    make_run(tmp_path, "--num_epochs=6", run_num="01")
    assert resume(tmp_path).num_epochs == 6


def test_options_given_again_override_and_those_outside_the_schedule_pass(tmp_path):
    make_run(tmp_path, "--num_epochs=5", "--num_data_workers=2")
    params = resume(tmp_path, "--num_data_workers=0", "--num_epochs=5")
    assert (params.num_epochs, params.num_data_workers) == (5, 0)


@pytest.mark.parametrize("change, listed", [
    ("--num_epochs=8", "num_epochs 5 -> 8"),
    ("--start_lr=1e-2", "start_lr 0.002 -> 0.01"),
    ("--global_batch_size=8", "global_batch_size 4 -> 8"),
    ("--local_batch_size=8", "global_batch_size 4 -> 8"),
    ("--Nsamples=32", "Nsamples 16 -> 32"),
])
def test_a_schedule_change_is_refused_in_one_paragraph(tmp_path, change, listed):
    make_run(tmp_path, "--num_epochs=5")
    with pytest.raises(UserError) as refused:
        resume(tmp_path, change)
    message = str(refused.value)
    assert listed in message and os.path.join("test", "1CPU", "00", "config.yaml") in message
    assert "leave this option out of the command line" in message or "leave these options out" in message
    assert "--allow_changes=" in message and "--run_num" in message


@pytest.mark.parametrize("allow", ["--allow_changes", "--allow_changes=num_epochs",
                                   "--allow_changes=num_epochs,start_lr", "--allow_changes=[num_epochs]"])
def test_allow_changes_lets_the_named_options_change(tmp_path, allow):
    make_run(tmp_path, "--num_epochs=5")
    assert resume(tmp_path, "--num_epochs=8", allow).num_epochs == 8


def test_allow_changes_names_only_what_it_allows(tmp_path):
    make_run(tmp_path)
    with pytest.raises(UserError, match="start_lr 0.002 -> 0.01"):
        resume(tmp_path, "--num_epochs=8", "--start_lr=1e-2", "--allow_changes=num_epochs")
    with pytest.raises(UserError, match="'num_epoch' is not an option that alters the schedule. Did you mean 'num_epochs'"):
        resume(tmp_path, "--num_epochs=8", "--allow_changes=num_epoch")


def test_the_run_of_the_other_device_kind_is_found(tmp_path):
    """A run made with --device=cpu on a GPU machine: its 1CPU folder holds it, and its options say cpu."""
    make_run(tmp_path, "--num_epochs=5", kind="CPU")
    assert resume(tmp_path, kind=lambda params: "GPU").num_epochs == 5


def test_no_run_leaves_the_command_lines_options(tmp_path):
    """train.py's resume() then refuses it, naming the runs that can be resumed."""
    assert resume(tmp_path, "--num_epochs=3").num_epochs == 3


def test_a_resume_with_the_run_options_of_a_local_batch_keeps_its_batch(tmp_path):
    make_run(tmp_path, "--local_batch_size=2", world_size=2)
    params = resume(tmp_path, world_size=2)
    assert params.global_batch_size == 4 and params.local_batch_size == 2
