"""End-to-end runs of train.py on the tiny `test` config: logs, TensorBoard, checkpoints, resume."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import ROOT, SIGNAL_DURING_STEP, run_train, timeout_for

pytestmark = pytest.mark.slow
SCALARS = {"Loss/train", "Loss/valid", "Learning Rate", "Avg iters per sec"}


def data_args(data_files, expdir, *extra):
    return ["--config=test", f"--train_path={data_files['train']}", f"--val_path={data_files['valid']}",
            f"--expdir={expdir}", *extra]


def read_events(run_dir):
    events = EventAccumulator(os.path.join(run_dir, "logs"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    return events


def final_val_loss(run_dir):
    return read_events(run_dir).Scalars("Loss/valid")[-1].value


def test_a_run_logs_what_users_expect(data_files, tmp_path):
    result = run_train(data_args(data_files, tmp_path, "--run_num=a", "--preview_image"))
    run_dir = tmp_path / "test" / "1CPU" / "a"
    log = (run_dir / "out.log").read_text()
    for pattern in (r"Time taken for epoch 2 is [\d.]+ sec, avg [\d.]+ samples/sec", r"  Avg train loss=[\d.]+",
                    r"  Avg val loss=[\d.]+", r"  Total validation time: [\d.]+ sec",
                    r"  Validation metrics time: [\d.]+ sec \(not in the validation time\)",
                    r"Checkpoint written in [\d.]+ sec \([\d.]+ GiB\): \S+checkpoint\.pt\n",
                    r"INFO - Configuration name: test\n", r"INFO - crop_size 32\n",
                    r"profile_start_epoch 4\n.*profile_steps 60\n",  # the config's nulls, resolved
                    r"rank 0, begin data loader init\n.*rank 0, data loader initialized with config inmem\n",
                    r"Starting Training Loop...\n", r"DONE ---- rank 0\n$",  # the original tutorial's lines
                    r"3-D convolutions: torch \S+, CUDA \S+, cuDNN none; fp32 convolutions run on \w+ "
                    r"\(transposed: [^)]+\), layout contiguous\n"):  # the health check (utils/conv3d.py)
        assert re.search(pattern, log), pattern
    assert f"Configuration file: {ROOT}/config/UNet.yaml\n" in log
    assert "Preview image:" in result.stdout and "TensorBoard logs:" in result.stdout
    assert {"config.yaml", "checkpoint.pt", "preview.png", "logs"} <= set(os.listdir(run_dir))

    events = read_events(run_dir)
    assert SCALARS <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("Loss/valid")] == [0, 4, 8]  # step 0, then after each epoch
    assert [e.step for e in events.Scalars("Loss/train")] == [0, 4, 8]
    assert [e.step for e in events.Scalars("Learning Rate")] == [4, 8]  # the original writes none at step 0
    assert len(events.Images("Preview")) == 3
    assert {"Metrics/L1_gas_density", "Metrics/corr_temperature"} <= set(events.Tags()["scalars"])
    assert len(events.Images("Power spectrum")) == 3
    assert "Validation metrics after the last epoch:" in log and "Pearson r" in log
    assert (run_dir / "preview.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"Loss curves: {run_dir / 'loss_curves.png'}" in result.stdout
    assert (run_dir / "loss_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "The demo's expected final validation loss" not in result.stdout  # the test config


@pytest.mark.parametrize("interval_s, writes", [(0, 2), (3600, 1)])
def test_checkpoint_interval(data_files, tmp_path, interval_s, writes):
    """After every epoch with checkpoint_interval_s 0; with an hour, only at the end of the run."""
    run_train(data_args(data_files, tmp_path, "--run_num=i", f"--checkpoint_interval_s={interval_s}",
                        "--val_metrics=false", "--Nsamples=8", "--Nsamples_val=4"))
    run_dir = tmp_path / "test" / "1CPU" / "i"
    log = (run_dir / "out.log").read_text()
    assert log.count("Checkpoint written in") == writes
    assert "Validation metrics time" not in log  # no metrics, no line
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["position"]["epoch"] == 2


def test_checkpoint_holds_everything_to_resume(data_files, tmp_path):
    run_train(data_args(data_files, tmp_path, "--run_num=c", "--num_epochs=1"))
    checkpoint = torch.load(tmp_path / "test" / "1CPU" / "c" / "checkpoint.pt", weights_only=True)
    assert set(checkpoint) == {"model", "optimizer", "scaler", "position", "rng", "params"}
    assert checkpoint["position"] == {"epoch": 1, "step": 4, "batch_in_epoch": 0}
    assert not any(key.startswith(("module.", "_orig_mod.")) for key in checkpoint["model"])
    assert checkpoint["params"]["crop_size"] == 32


def start_and_interrupt(args, run_dir, signum):
    """Start train.py, wait for its first checkpoint, then send ``signum``; return the exit code."""
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not os.path.exists(run_dir / "checkpoint.pt"):
        assert process.poll() is None and time.time() < deadline, process.communicate()[0]
        time.sleep(0.05)
    process.send_signal(signum)
    output = process.communicate(timeout=timeout_for(120))[0]
    return process.returncode, output


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_interrupted_and_resumed_run_ends_like_an_uninterrupted_one(data_files, tmp_path, signum):
    longer = ["--Nsamples=96", "--num_epochs=3"]
    run_train(data_args(data_files, tmp_path, "--run_num=whole", *longer))

    run_dir = tmp_path / "test" / "1CPU" / "cut"
    code, output = start_and_interrupt(data_args(data_files, tmp_path, "--run_num=cut", *longer), run_dir, signum)
    if signum == signal.SIGTERM:
        assert code == 128 + signal.SIGTERM and "checkpoint" in output
    else:
        assert code == -signal.SIGKILL
    position = torch.load(run_dir / "checkpoint.pt", weights_only=True)["position"]
    assert position["step"] < 3 * 24  # it really stopped before the end

    resumed = run_train(data_args(data_files, tmp_path, "--run_num=cut", "--resume", *longer))
    assert "Resumed from" in resumed.stdout
    whole = final_val_loss(tmp_path / "test" / "1CPU" / "whole")
    assert final_val_loss(run_dir) == pytest.approx(whole, rel=1e-5, abs=1e-7)


# The same with the signal sent during validation batch SIGNAL_AT (counting the validation at step 0).
SIGNAL_DURING_VALIDATION = """
import os, signal, sys
import torch
import yaml
import train

build_loss = train.build_loss
def loss_that_signals(params):
    loss_fn, calls = build_loss(params), [0]
    def run(predictions, targets):
        if not torch.is_grad_enabled():  # validation
            calls[0] += 1
            if calls[0] == int(os.environ["SIGNAL_AT"]):
                os.kill(os.getpid(), signal.SIGUSR1)
        return loss_fn(predictions, targets)
    return run

train.build_loss = loss_that_signals
train.main(sys.argv[1:])
"""


@pytest.mark.parametrize("nsamples, script, signal_at, saved", [
    # The last step of epoch 1: the stop comes before its validation, which the resumed run does.
    (16, SIGNAL_DURING_STEP, 4, {"epoch": 0, "step": 4, "batch_in_epoch": 4}),
    (48, SIGNAL_DURING_STEP, 5, {"epoch": 0, "step": 5, "batch_in_epoch": 5}),    # the middle of epoch 1
    (48, SIGNAL_DURING_STEP, 10, {"epoch": 0, "step": 10, "batch_in_epoch": 10}),
    (40, SIGNAL_DURING_STEP, 10, {"epoch": 0, "step": 10, "batch_in_epoch": 10}),
    # The validation after epoch 1 (2 batches of 4): its training is saved, the validation repeated.
    (16, SIGNAL_DURING_VALIDATION, 3, {"epoch": 0, "step": 4, "batch_in_epoch": 4}),
    (16, SIGNAL_DURING_VALIDATION, 1, {"epoch": 0, "step": 0, "batch_in_epoch": 0}),  # at step 0
], ids=["epoch_end", "mid_epoch", "mid_epoch_10", "last_step", "validation", "validation_at_step_0"])
def test_a_signal_anywhere_in_an_epoch_resumes_cleanly(data_files, tmp_path, nsamples, script, signal_at, saved):
    # 4 samples a step: 4, 12 and 10 steps an epoch; on one rank the stop is asked before every step
    # and every validation batch.
    args = data_args(data_files, tmp_path, f"--Nsamples={nsamples}", "--Nsamples_val=8")
    run_train([*args, "--run_num=whole"])
    stopped = subprocess.run([sys.executable, "-c", script, *args, "--run_num=cut"], cwd=ROOT,
                             env={**os.environ, "SIGNAL_AT": str(signal_at)}, capture_output=True, text=True,
                             timeout=timeout_for(120))
    assert stopped.returncode == 128 + signal.SIGUSR1, stopped.stdout[-3000:] + stopped.stderr[-3000:]
    run_dir = tmp_path / "test" / "1CPU" / "cut"
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["position"] == saved

    resumed = run_train([*args, "--run_num=cut", "--resume"])
    assert "Time taken for epoch 2 is" in resumed.stdout
    whole = read_events(tmp_path / "test" / "1CPU" / "whole").Scalars("Loss/valid")
    cut = read_events(run_dir).Scalars("Loss/valid")
    # Every validation happened once, at the same steps, with the same losses as without the stop.
    assert [e.step for e in cut] == [e.step for e in whole]
    assert [e.value for e in cut] == pytest.approx([e.value for e in whole], rel=1e-5, abs=1e-7)


@pytest.mark.cpu16
def test_the_cpu_capable_speed_options_train_together(data_files, tmp_path):
    # bf16 autocast, channels_last_3d, torch's fused Adam and the TorchScript loss, in one real run.
    result = run_train(data_args(data_files, tmp_path, "--run_num=fast", "--amp_mode=bf16", "--channels_last",
                                 "--enable_fused", "--enable_jit", "--Nsamples=32"))
    log = (tmp_path / "test" / "1CPU" / "fast" / "out.log").read_text()
    for option in ("amp_mode bf16\n", "channels_last True\n", "enable_fused True\n", "enable_jit True\n"):
        assert option in log, option
    losses = [e.value for e in read_events(tmp_path / "test" / "1CPU" / "fast").Scalars("Loss/train")]
    assert all(0 < loss < 1 for loss in losses) and losses[-1] < losses[0], losses
    assert "Traceback" not in result.stderr


def test_demo_config_trains_on_any_pair_of_files(data_files, tmp_path):
    # The two files have different box sides (48 and 32); nothing in the config says so.
    run_train(["--config=demo", f"--train_path={data_files['train']}", f"--val_path={data_files['valid']}",
               f"--expdir={tmp_path}", "--Nsamples=16", "--Nsamples_val=8", "--num_epochs=1", "--device=cpu"])
    assert (tmp_path / "demo" / "1CPU" / "00" / "checkpoint.pt").exists()


def test_compile_makes_model_and_loss_one_function_and_validation_marks_each_batch(monkeypatch):
    """--jit_mode=compile: the step compiles model and loss as ONE function (two compiled apart lose the
    model's output to its next CUDA-graph replay, pytorch#160281), and validation starts a new
    CUDA-graph step before every batch. What torch.compile is given is recorded here; the compiled
    function then runs for real (Inductor on the CPU) and matches the eager loss and gradients."""
    import importlib

    import train
    from utils.YParams import load_params
    from utils.losses import build_loss, l1_loss
    from utils.optim import Precision

    compiled = []
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, mode: compiled.append((fn, mode)) or real_compile(fn, mode=mode))
    params = load_params(["--config=test", "--jit_mode=compile", "--compile_mode=reduce-overhead"])
    torch.manual_seed(0)
    model = torch.nn.Conv3d(4, 5, 3, padding=1)
    loss_fn = build_loss(params)
    assert loss_fn.func is l1_loss  # not compiled apart
    forward_loss = train.training_loss(model, loss_fn, params)
    [(function, mode)] = compiled
    assert mode == "reduce-overhead" and function.__name__ == "forward_loss"
    inputs, targets = torch.randn(2, 4, 8, 8, 8), torch.randn(2, 5, 8, 8, 8)
    loss = forward_loss(inputs, targets)
    loss.backward()
    compiled_grad = model.weight.grad.clone()
    model.weight.grad = None
    eager = loss_fn(model(inputs), targets)
    eager.backward()
    torch.testing.assert_close(loss, eager)
    torch.testing.assert_close(compiled_grad, model.weight.grad)

    # Validation: a mark before every batch's model call, once CUDA-graph trees are in use (their module
    # imported, as a compilation with CUDA graphs does on a GPU; on the CPU Inductor records none).
    importlib.import_module("torch._inductor.cudagraph_trees")
    events = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: events.append("new step"))
    model.register_forward_hook(lambda *args: events.append("model"))
    loader = [(inputs, targets)] * 3
    world = train.read_world()
    train.validate(model, loader, loss_fn, Precision("none", torch.device("cpu")), lambda x: x, world)
    assert events == ["new step", "model"] * 3


def test_resume_refuses_a_run_that_is_not_there_and_keeps_config_yaml_the_record(data_files, tmp_path):
    from conftest import snapshot

    run_train(data_args(data_files, tmp_path, "--run_num=a", "--num_epochs=1"))
    run_dir = tmp_path / "test" / "1CPU" / "a"

    # A mistyped --run_num: refused, naming the run that can be resumed; nothing written.
    typo = run_train(data_args(data_files, tmp_path, "--run_num=b", "--resume"), check=False)
    message = " ".join(typo.stderr.split())
    assert typo.returncode == 2 and "Traceback" not in typo.stderr, typo.stderr
    assert f"there is no run to continue in {tmp_path / 'test' / '1CPU' / 'b'}" in message, message
    assert f"that hold one: {run_dir} " in message and "leave out --resume" in message, message
    assert not (tmp_path / "test" / "1CPU" / "b").exists()

    # A longer run is another experiment: refused in one paragraph that says how to go on, nothing written.
    before = snapshot(run_dir)
    refused = run_train(data_args(data_files, tmp_path, "--run_num=a", "--resume", "--num_epochs=2"), check=False)
    message = " ".join(refused.stderr.split())
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "num_epochs 1 -> 2" in message and "--allow_changes=num_epochs" in message, message
    assert snapshot(run_dir) == before

    # Allowed: the change is said, with what it does to the schedule, and appended to config.yaml.
    longer = run_train(data_args(data_files, tmp_path, "--run_num=a", "--resume", "--num_epochs=2",
                                 "--allow_changes=num_epochs"))
    assert "Options changed since the run started or was last resumed: num_epochs 1 -> 2" in longer.stdout
    assert "Its cosine now ends at step 8 instead of 4, and the rate at step 4 is" in longer.stdout
    with open(run_dir / "config.yaml") as f:
        record = yaml.safe_load(f)
    assert record["num_epochs"] == 1 and record["resume"] is False  # the options the run started with
    assert record["resumed"] == [{"at_step": 4, "changed": {"num_epochs": [1, 2]}}]

    # A finished run: "already complete", status 0, no training and nothing written (its num_epochs is
    # now 2, config.yaml's last change: --resume alone says so).
    before = snapshot(run_dir)
    done = run_train(data_args(data_files, tmp_path, "--run_num=a", "--resume"))
    assert f"The run in {run_dir} is already complete: it trained 2 epochs (8 steps)" in done.stdout
    assert "Starting Training Loop" not in done.stdout and "Done." not in done.stdout
    assert snapshot(run_dir) == before


def test_an_unchanged_resume_continues_the_same_experiment(data_files, tmp_path):
    """A run of 2 epochs stopped in its second, resumed with --resume alone (and the data paths the
    test needs): it ends after its own 2 epochs, at the learning rates of an uninterrupted run, and
    records no change; the rank's warnings about the resume are none."""
    two = ["--num_epochs=2", "--val_metrics=false"]
    run_train(data_args(data_files, tmp_path, "--run_num=whole", *two))
    run_dir = tmp_path / "test" / "1CPU" / "cut"
    code, _ = start_and_interrupt(data_args(data_files, tmp_path, "--run_num=cut", *two), run_dir, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["position"]["step"] < 8

    resumed = run_train(data_args(data_files, tmp_path, "--run_num=cut", "--resume"))
    assert "Resumed from" in resumed.stdout and "WARNING" not in resumed.stdout, resumed.stdout
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["position"] == {
        "epoch": 2, "step": 8, "batch_in_epoch": 0}
    rates = [(e.step, e.value) for e in read_events(run_dir).Scalars("Learning Rate")]
    assert rates == [(e.step, e.value) for e in read_events(tmp_path / "test" / "1CPU" / "whole").Scalars("Learning Rate")]
    with open(run_dir / "config.yaml") as f:
        record = yaml.safe_load(f)
    assert record["num_epochs"] == 2 and [entry["changed"] for entry in record["resumed"]] == [{}]


def test_resume_of_a_run_stopped_before_its_first_checkpoint_starts_it_again(data_files, tmp_path):
    run_dir = tmp_path / "test" / "1CPU" / "00"
    run_dir.mkdir(parents=True)
    (run_dir / "out.log").write_text("a run killed before its first checkpoint\n")
    result = run_train(data_args(data_files, tmp_path, "--resume", "--num_epochs=1"))
    assert "holds a run but no checkpoint" in result.stdout and "starting it again from step 0" in result.stdout
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["position"]["step"] == 4


def test_without_run_num_runs_take_the_next_free_number_and_resume_takes_the_last(data_files, tmp_path):
    """README commands run in order never collide in run 00; --resume without --run_num continues the last run."""
    for expected in ("00", "01"):
        result = run_train(data_args(data_files, tmp_path, "--num_epochs=1"))
        assert f"run directory {tmp_path / 'test' / '1CPU' / expected}\n" in result.stdout
        # The closing hint names a tensorboard that runs from here, activated venv or not.
        command = re.search(r"\(view with: (\S+) --logdir ", result.stdout).group(1)
        assert shutil.which(command) or os.access(os.path.join(ROOT, command), os.X_OK), command
    resumed = run_train(data_args(data_files, tmp_path, "--num_epochs=2", "--resume", "--allow_changes"))
    assert f"Resumed from {tmp_path / 'test' / '1CPU' / '01' / 'checkpoint.pt'} at epoch 2" in resumed.stdout
    with open(tmp_path / "test" / "1CPU" / "01" / "config.yaml") as f:
        assert yaml.safe_load(f)["run_num"] == "01"
    assert sorted(os.listdir(tmp_path / "test" / "1CPU")) == ["00", "01"]


def test_a_two_rank_resume_says_its_warnings_once(data_files, tmp_path):
    """Every rank resumes alike, so the changed options and what they do to the schedule are said once,
    by rank 0, not once per rank."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               os.path.join(ROOT, "train.py"), *data_args(data_files, tmp_path, "--run_num=r", "--val_metrics=false")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.run([*command, "--num_epochs=1"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=timeout_for(600))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    resumed = subprocess.run([*command, "--resume", "--num_epochs=2", "--allow_changes=num_epochs"], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=timeout_for(600))
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0 and "Resumed from" in output, output[-3000:]
    warnings = re.findall(r" - WARNING - (.*)", output)
    assert sum("Options changed since the run started" in line for line in warnings) == 1, warnings
    assert sum("the learning-rate schedule is recomputed" in line for line in warnings) == 1, warnings
    assert len(warnings) == len(set(warnings)), warnings  # no warning said by both ranks
