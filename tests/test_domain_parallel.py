"""train.py under --domain_mesh on real gloo ranks (torchrun): the same training as one undivided process.

Three steps of the small U-Net (base_channels 4) on 64^3 synthetic crops: one process; two ranks
sharing every sample ([2,1,1]), with DDP and with FSDP; four ranks on a 2 x 2 mesh ([2,2,1]); and
DDP over two domain groups of two ([2,1,1] on four ranks) against DDP over two ranks. Compared: every
TensorBoard scalar (losses, learning rate, validation metrics on the gathered fields) and the
checkpoint: the weights and Adam's first moments (the averaged gradients, so a gradient summed where
it should be averaged shows).
"""
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, timeout_for
from utils.distributed import torch_release

COMMON = ["--config=test", "--data_loader_config=synthetic", "--crop_size=64", "--num_epochs=1", "--Nsamples_val=2",
          "--val_metrics=true", "--preview_image=true"]


def torchrun(ranks, expdir, run_num, *args, timeout=timeout_for(400)):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
               os.path.join(ROOT, "train.py"), *COMMON, f"--expdir={expdir}", f"--run_num={run_num}", *args]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return os.path.join(expdir, "test", f"{ranks}CPU", run_num)


# name: (ranks, options); three steps each (Nsamples = 3 x the global batch)
RUNS = {
    "one": (1, ["--global_batch_size=2", "--Nsamples=6"]),
    "mesh_2x1x1": (2, ["--global_batch_size=2", "--Nsamples=6", "--domain_mesh=[2,1,1]"]),
    "mesh_2x2x1": (4, ["--global_batch_size=2", "--Nsamples=6", "--domain_mesh=[2,2,1]"]),
    "fsdp_mesh_2x1x1": (2, ["--global_batch_size=2", "--Nsamples=6", "--domain_mesh=[2,1,1]", "--parallel=fsdp"]),
    "ddp_2": (2, ["--global_batch_size=4", "--Nsamples=12"]),
    "ddp_2_x_mesh_2": (4, ["--global_batch_size=4", "--Nsamples=12", "--domain_mesh=[2,1,1]"]),
}


if torch_release() < (2, 9):  # FSDP on CPU ranks needs 2.9 (utils/distributed.py refuses it before)
    del RUNS["fsdp_mesh_2x1x1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    expdir = tmp_path_factory.mktemp("domain")
    return {name: torchrun(ranks, expdir, name, *options) for name, (ranks, options) in RUNS.items()}


def scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(os.path.join(run_dir, "logs"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)]
            for tag in events.Tags()["scalars"] if not tag.startswith(("Memory/", "Step spread/")) and tag != "Avg iters per sec"}


def checkpoint(run_dir):
    return torch.load(os.path.join(run_dir, "checkpoint.pt"), map_location="cpu", weights_only=True)


def assert_same_training(run, reference):
    ours, theirs = scalars(run), scalars(reference)
    assert ours.keys() == theirs.keys() and "Loss/train" in ours and "Metrics/L1_gas_density" in ours, ours.keys()
    for tag, values in theirs.items():
        assert [step for step, _ in ours[tag]] == [step for step, _ in values], tag
        # Correlations of random fields are near 0, so float32 rounding shows there as absolute differences
        # (measured: 4e-6 after three steps); the losses and the learning rate agree to 1e-6 and better.
        tolerance = 1e-4 if tag.startswith("Metrics/") else 1e-6
        for (_, a), (_, b) in zip(ours[tag], values):
            assert a == pytest.approx(b, rel=1e-4, abs=tolerance), (tag, ours[tag], values)
    a, b = checkpoint(run), checkpoint(reference)
    assert a["position"] == b["position"]
    # Adam moves a weight by about the learning rate (2e-3) whatever its gradient's size, so an element whose
    # gradient is near 0 turns float32 rounding into visible steps: measured, 1 of 263837 weights differed by
    # 1.1e-5 (DDP x mesh against DDP), all others by less than 1e-6. A wrong gradient moves most weights.
    differences = torch.cat([(a["model"][name] - weight).abs().flatten() for name, weight in b["model"].items()])
    assert differences.max() < 1e-4 and (differences > 1e-6).float().mean() < 0.005, float(differences.max())
    # Adam's first moments: the averaged gradients. Measured on the whole set: 4e-6 of the largest after one
    # step; after three, once Adam has moved a few weights apart as above, more in layers whose gradients are
    # near 0 (DDP x mesh against DDP). A gradient off by a factor shows as 1 or more.
    ours = torch.cat([state["exp_avg"].flatten() for _, state in sorted(a["optimizer"]["state"].items())])
    theirs = torch.cat([state["exp_avg"].flatten() for _, state in sorted(b["optimizer"]["state"].items())])
    assert (ours - theirs).abs().max() <= 1e-3 * theirs.abs().max(), float((ours - theirs).abs().max())


@pytest.mark.parametrize("name", ["mesh_2x1x1", "mesh_2x2x1", "fsdp_mesh_2x1x1"])
def test_a_domain_group_trains_as_one_undivided_process(runs, name):
    if name not in runs:
        pytest.skip("FSDP on CPU ranks needs PyTorch 2.9 or newer")
    assert_same_training(runs[name], runs["one"])
    log = open(os.path.join(runs[name], "out.log")).read()
    assert "Domain parallel: mesh" in log and "INFO - global_batch_size 2\n" in log


def test_ddp_over_domain_groups_trains_as_ddp(runs):
    assert_same_training(runs["ddp_2_x_mesh_2"], runs["ddp_2"])
    assert "2 data-parallel group(s) of 2 ranks" in open(os.path.join(runs["ddp_2_x_mesh_2"], "out.log")).read()


def test_the_preview_shows_the_whole_sample(runs):
    """The preview image is drawn from the gathered fields: the same picture as the undivided run's."""
    a = open(os.path.join(runs["mesh_2x2x1"], "preview.png"), "rb").read()
    b = open(os.path.join(runs["one"], "preview.png"), "rb").read()
    assert a == b


def test_a_checkpoint_resumes_into_another_mesh(runs, tmp_path):
    """The checkpoint of the [2,1,1] run holds the whole model once: one process continues it as it
    continues the one-process run's own checkpoint."""
    continued = {}
    for name in ("one", "mesh_2x1x1"):
        run_dir = tmp_path / "test" / "1CPU" / name
        run_dir.mkdir(parents=True)
        shutil.copy(os.path.join(runs[name], "checkpoint.pt"), run_dir / "checkpoint.pt")
        continued[name] = torchrun(1, tmp_path, name, "--global_batch_size=2", "--Nsamples=6", "--num_epochs=2",
                                   "--resume")
    a, b = checkpoint(continued["mesh_2x1x1"]), checkpoint(continued["one"])
    assert a["position"]["step"] == b["position"]["step"] == 6
    differences = torch.cat([(a["model"][name] - weight).abs().flatten() for name, weight in b["model"].items()])
    assert differences.max() < 1e-4 and (differences > 1e-6).float().mean() < 0.005, float(differences.max())
