"""The original tutorial's commands in this README: the same flags, or a difference listed with its reason.

Users arrive with the original SC22 tutorial's README (NERSC/sc22-dl-tutorial) in hand. Every command
of it is below, verbatim. Each must appear in this README with the same launcher and the same
train.py flags (compared as flags: `--key value` equals `--key=value`, `-n1` equals `-n 1`, order
does not matter), or be listed in DIFFERENT with the README command that stands for it and the
reason for each differing flag, or in ABSENT with the reason it is not shown. The README says that
`sbatch -n 1 ./submit_pm.sh` and `python train.py` run the same single-GPU command, so those two
launchers compare equal.
"""
import os
import re
import shlex

import pytest

import quotes
from conftest import ROOT
from readme_commands import readme_commands, tutorial_text

README_COMMANDS = readme_commands(tutorial_text(ROOT))  # the hub's and the chapters' (docs/)

# Every command of the original tutorial's README: its training and batch commands in its order, then its
# set-up commands (appended, so that the indices below stay).
ORIGINAL = [
    "sbatch -n 1 ./submit_pm.sh --config=short --num_epochs 4",
    "python train.py --config=short --num_epochs 4",
    "ENABLE_PROFILING=1 PROFILE_OUTPUT=baseline sbatch -n1 submit_pm.sh --config=short --num_epochs 4 "
    "--enable_manual_profiling",
    "nsys profile -o baseline --trace=cuda,nvtx -c cudaProfilerApi --kill none -f true python train.py "
    "--config=short --num_epochs 4 --enable_manual_profiling",
    "sbatch -n1 submit_pm.sh --config=short --num_epochs 15 --enable_benchy",
    "python train.py --config=short ---num_epochs 15 -enable_benchy",
    "sbatch -n 1 ./submit_pm.sh --config=short --num_epochs 4 --num_data_workers <value of your choice>",
    "python train.py --config=short --num_epochs 4 --num_data_workers <value of your choice>",
    "sbatch -n 1 ./submit_pm.sh --config=short --num_epochs 4 --num_data_workers 8 --data_loader_config=dali-lowmem",
    "python train.py --config=short --num_epochs 4 --num_data_workers 8 --data_loader_config=dali-lowmem",
    "NVIDIA_TF32_OVERRIDE=0 sbatch -n 1 ./submit_pm.sh --config=short --num_epochs 4 --num_data_workers 8 "
    "--data_loader_config=dali-lowmem",
    "sbatch -n 1 ./submit_pm.sh --config=short --num_epochs 4 --num_data_workers 8 --data_loader_config=dali-lowmem "
    "--amp_mode=fp16",
    "python train.py --config=short --num_epochs 4 --num_data_workers 8 --data_loader_config=dali-lowmem "
    "--amp_mode=fp16",
    "sbatch -n 1 ./submit_pm.sh --config=short --num_epochs 4 --num_data_workers 8 --data_loader_config=dali-lowmem "
    "--amp_mode=fp16 --enable_apex",
    "python train.py --config=short --num_epochs 4 --num_data_workers 8 --data_loader_config=dali-lowmem "
    "--amp_mode=fp16 --enable_apex",
    "sbatch -n 1 ./submit_pm.sh --config=short --num_epochs 4 --num_data_workers 8 --data_loader_config=dali-lowmem "
    "--amp_mode=fp16 --enable_apex --enable_jit",
    "python train.py --config=short --num_epochs 4 --num_data_workers 8 --data_loader_config=dali-lowmem "
    "--amp_mode=fp16 --enable_apex --enable_jit",
    "sbatch -n 1 -t 40 ./submit_pm.sh --config=bs64_opt",
    "sbatch -n NUM_GPU submit_pm.sh [OPTIONS]",
    "sbatch -t 10 -n 8 submit_pm.sh --config=bs512_test",
    "sbatch -t 20 -n 8 submit_pm.sh --config=bs512_opt",
    "BENCHY_OUTPUT=weak_scale sbatch -N 8 ./submit_pm.sh --num_data_workers 4 --local_batch_size 64 "
    "--config=bs64_opt --enable_benchy --num_epochs 15",
    "BENCHY_OUTPUT=weak_scale_noddp sbatch -N 8 ./submit_pm.sh --num_data_workers 4 --local_batch_size 64 "
    "--config=bs64_opt --enable_benchy --noddp --num_epochs 15",
    "ENABLE_PROFILING=1 PROFILE_OUTPUT=4gpu_baseline sbatch -n 4 ./submit_pm.sh --config=bs64_opt --num_epochs 4 "
    "--num_data_workers 8 --local_batch_size 16 --enable_apex --enable_jit --enable_manual_profiling",
    "ENABLE_PROFILING=1 PROFILE_OUTPUT=4gpu_nobroadcast sbatch -n 4 ./submit_pm.sh --config=bs64_opt --num_epochs 4 "
    "--num_data_workers 8 --local_batch_size 16 --enable_apex --enable_jit --enable_manual_profiling "
    "--disable_broadcast_buffers",
    "ENABLE_PROFILING=1 PROFILE_OUTPUT=4gpu_bucket100mb sbatch -n 4 ./submit_pm.sh --config=bs64_opt --num_epochs 4 "
    "--num_data_workers 8 --local_batch_size 16 --enable_apex --enable_jit --enable_manual_profiling "
    "--disable_broadcast_buffers --bucket_cap_mb 100",
    "ENABLE_PROFILING=1 PROFILE_OUTPUT=8gpu_baseline sbatch -N 2 ./submit_pm.sh --config=bs64_opt --num_epochs 4 "
    "--num_data_workers 8 --local_batch_size 16 --enable_apex --enable_jit --enable_manual_profiling",
    "ENABLE_PROFILING=1 PROFILE_OUTPUT=8gpu_bucket100mb sbatch -N 2 ./submit_pm.sh --config=bs64_opt --num_epochs 4 "
    "--num_data_workers 8 --local_batch_size 16 --enable_apex --enable_jit --enable_manual_profiling "
    "--disable_broadcast_buffers --bucket_cap_mb 100",
    "git clone https://github.com/NERSC/sc22-dl-tutorial.git",
    "cd sc22-dl-tutorial",
    "mkdir -p $SCRATCH/sc22-dl-tutorial/logs",
    "cp -r ./example_logs/base $SCRATCH/sc22-dl-tutorial/logs",
]

# The precision and fused-optimiser steps of this README use the GPU-resident loader (no DALI needed, no
# per-step copy) and bf16 with torch's fused Adam, so that each step changes one thing against the same loader.
GPU_INMEM = "this README's precision steps run on the gpu-inmem loader (no DALI threads), to isolate compute"
# original command -> (the README command that stands for it, {flag: why it differs})
DIFFERENT = {
    ORIGINAL[6]: ("python train.py --config=short --num_epochs 4 --num_data_workers 8",
                  {"num_data_workers": "the original's placeholder <value of your choice>; the README picks 8"}),
    ORIGINAL[7]: ("python train.py --config=short --num_epochs 4 --num_data_workers 8",
                  {"num_data_workers": "the original's placeholder <value of your choice>; the README picks 8"}),
    ORIGINAL[10]: ("NVIDIA_TF32_OVERRIDE=0 python train.py --config=short --num_epochs 4 --data_loader_config=gpu-inmem",
                   {"num_data_workers": GPU_INMEM, "data_loader_config": GPU_INMEM}),
    ORIGINAL[11]: ("python train.py --config=short --num_epochs 4 --data_loader_config=gpu-inmem --amp_mode=fp16",
                   {"num_data_workers": GPU_INMEM, "data_loader_config": GPU_INMEM}),
    ORIGINAL[12]: ("python train.py --config=short --num_epochs 4 --data_loader_config=gpu-inmem --amp_mode=fp16",
                   {"num_data_workers": GPU_INMEM, "data_loader_config": GPU_INMEM}),
}
FUSED_AND_JIT = ("python train.py --config=short --num_epochs 4 --data_loader_config=gpu-inmem --amp_mode=bf16 "
                 "--enable_fused --enable_jit")
FUSED_REASONS = {"num_data_workers": GPU_INMEM, "data_loader_config": GPU_INMEM,
                 "amp_mode": "bf16 needs no gradient scaler; fp16 is the rung before it",
                 "enable_apex": "--enable_fused is torch's fused Adam, which --enable_apex also uses without apex",
                 "enable_fused": "see enable_apex"}
DIFFERENT.update({
    ORIGINAL[13]: (FUSED_AND_JIT, {**FUSED_REASONS, "enable_jit": "fused Adam and JIT are one rung here"}),
    ORIGINAL[14]: (FUSED_AND_JIT, {**FUSED_REASONS, "enable_jit": "fused Adam and JIT are one rung here"}),
    ORIGINAL[15]: (FUSED_AND_JIT, FUSED_REASONS),
    ORIGINAL[16]: (FUSED_AND_JIT, FUSED_REASONS),
})
ABSENT = {
    ORIGINAL[5]: "a typo in the original (---num_epochs, -enable_benchy) of the command above it; the README has "
                 "`python train.py --config=short --num_epochs 15 --enable_benchy`",
    ORIGINAL[18]: "a template, not a command",
    ORIGINAL[28]: "this repository's address is not the original's; the README says to clone it and work from its "
                  "top-level folder",
    ORIGINAL[29]: "see the clone above",
    ORIGINAL[30]: "submit_pm.sh makes its log directory itself",
    ORIGINAL[31]: "the example logs here are the demo's (example_logs/demo), compared with the README's "
                  "`tensorboard --logdir_spec=...` command instead of copied",
    ORIGINAL[24]: "--disable_broadcast_buffers changes nothing for this model (no buffers); the README profiles "
                  "the default and the 100 MB buckets",
}


# The original README's section headings, in its order ("Profiling with Nsight Systems" is there twice: the
# single-GPU one and the multi-GPU one), spelt as there, so that a reader with it in hand can search for them.
ORIGINAL_SECTIONS = [
    "Links", "Installation and Setup", "Software environment", "Installing Nsight Systems",
    "Model, data, and training code overview", "Single GPU training",
    "Single GPU performance profiling and optimization", "Profiling with Nsight Systems",
    "Adding NVTX ranges and profiler controls", "Using the benchy profiling tool", "Data loading optimizations",
    "Improving the native PyTorch dataloader performance", "Using NVIDIA DALI", "Enabling Mixed Precision Training",
    "Just-in-time (JIT) compiliation and APEX fused optimizers", "Using CUDA Graphs (optional)",
    "Full training with optimizations", "Distributed GPU training", "Code basics", "Large batch convergence",
    "Multi-GPU performance profiling and optimization", "Weak and Strong Throughput Scaling",
    "Profiling with Nsight Systems", "Adjusting DistributedDataParallel options", "Putting it all together",
]


def test_every_section_of_the_original_is_found_from_the_hub():
    """README.md's table "For readers of the original tutorial" names each of the original's sections (as
    often as the original has it) in its first column and links, in the same row, the chapter section that
    stands for it (tests/test_readme.py checks that the link's file and heading exist)."""
    table = quotes.section("README.md", "For readers of the original tutorial")
    rows = [line.strip("|").split("|") for line in table.splitlines() if line.startswith("| ")][1:]
    named = []
    for first, here in rows:
        assert re.search(r"\]\(docs/\d\d-[\w-]+\.md#[\w-]+\)", here), here
        named += [re.sub(r" \(multi-GPU\)$", "", name.strip()) for name in first.split(";")]
    assert sorted(named) == sorted(ORIGINAL_SECTIONS)


def parse(command):
    """``(environment, launcher, flags)`` of a command: flags as {key: value}, a bare flag as 'true'."""
    words = shlex.split(command.replace("<value of your choice>", "CHOICE"))
    environment = {}
    while words and re.fullmatch(r"\w+=.*", words[0]):
        key, value = words.pop(0).split("=", 1)
        environment[key] = value
    script = next((i for i, word in enumerate(words) if word.endswith(("submit_pm.sh", "train.py"))), len(words))
    launcher = [re.sub(r"^-n(\d)", r"-n \1", word) for word in words[:script]]
    launcher = " ".join(launcher).split() + ["./" + os.path.basename(words[script])] if script < len(words) else words
    if launcher[:3] == ["sbatch", "-n", "1"] and launcher[-1] == "./submit_pm.sh" and len(launcher) == 4:
        launcher = ["python", "./train.py"]  # the README: `sbatch -n 1 ./submit_pm.sh` in place of `python train.py`
    flags, rest = {}, words[script + 1:]
    while rest:
        word = rest.pop(0)
        key, _, value = (word[2:] if word.startswith("--") else word).partition("=")
        if not value:
            value = rest.pop(0) if rest and not rest[0].startswith("-") else "true"
        flags[key] = value
    return environment, launcher, flags


def differing_flags(a, b):
    flags_a, flags_b = a[2], b[2]
    return {key for key in set(flags_a) | set(flags_b) if flags_a.get(key) != flags_b.get(key)}


def same_command(a, b):
    return a[:2] == b[:2] and a[2] == b[2]


def test_the_parser_compares_flags_not_spelling():
    assert same_command(parse("sbatch -n1 submit_pm.sh --bucket_cap_mb 100 --noddp"),
                        parse("sbatch -n 1 ./submit_pm.sh --noddp --bucket_cap_mb=100"))
    assert same_command(parse("sbatch -n 1 ./submit_pm.sh --config=short"), parse("python train.py --config=short"))
    assert not same_command(parse("sbatch -n 4 ./submit_pm.sh --config=short"), parse("python train.py --config=short"))
    assert not same_command(parse("X=1 python train.py --config=short"), parse("python train.py --config=short"))
    assert differing_flags(parse("python train.py --a 1 --b"), parse("python train.py --a=2 --c")) == {"a", "b", "c"}


@pytest.mark.parametrize("original", ORIGINAL, ids=range(len(ORIGINAL)))
def test_every_command_of_the_original_is_here_or_its_difference_listed(original):
    mine = [parse(command) for command in README_COMMANDS]
    if original in ABSENT:
        assert not any(same_command(parse(original), command) for command in mine), \
            f"listed as absent, but the README has it: {original}"
        return
    if original in DIFFERENT:
        counterpart, reasons = DIFFERENT[original]
        assert counterpart in README_COMMANDS, f"the README no longer has {counterpart!r}, listed for {original!r}"
        assert all(reasons.values())
        assert differing_flags(parse(original), parse(counterpart)) == set(reasons), \
            f"the README's {counterpart!r} differs from the original's {original!r} in other flags than those listed"
        assert parse(original)[:2] == parse(counterpart)[:2], "same environment and launcher"
        return
    assert any(same_command(parse(original), command) for command in mine), \
        f"the original's command is not in the README with the same flags, nor listed with a reason: {original}"


def test_the_weak_scaling_commands_keep_the_local_batch():
    """On 8 nodes (32 ranks) bs64_opt's global batch of 64 would be 2 per rank: not weak scaling."""
    weak = [command for command in README_COMMANDS if "BENCHY_OUTPUT=weak_scale" in command
            or "BENCHY_OUTPUT=scaling/" in command]
    assert len(weak) >= 3
    for command in weak:
        flags = parse(command.split("; ")[1] if command.startswith("for ") else command)[2]
        assert (flags.get("local_batch_size"), flags.get("num_data_workers")) == ("64", "4"), command
    with open(os.path.join(ROOT, "submit_pm.sh")) as f:
        header = f.read().split("\n\n", 1)[0].replace("\\\n#", "")
    assert re.search(r"BENCHY_OUTPUT=weak_scale sbatch -N 8 ./submit_pm.sh --num_data_workers 4 "
                     r"--local_batch_size 64\s+--config=bs64_opt", header)
