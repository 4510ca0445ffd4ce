"""Committed results come from the code as it is: every run record in example_logs/ and
benchmarks/results/ (a run's config.yaml, or the configuration block its log starts with) must be
what the current code resolves from the command that made it.

A record names a key the code no longer has, or a value that the named config and the command
would no longer give (a config's default that has since changed), when the code moved on after
the run: then the result no longer describes this code and must be made again (or the key's
change undone). Each record's command comes from the README beside it (the benchmark tools write
one command per run) or, for the hand-made example runs, from EXAMPLE_COMMANDS below, copied from
example_logs/README.md.
"""
import glob
import math
import os
import re
import shlex

import pytest

from conftest import ROOT
from utils.YParams import load_params, read_yaml
from utils.profiling import DEFAULT_WINDOWS

# Where a run was and what it was called: not part of what it computed.
RUN_SPECIFIC = {"yaml_config", "run_num", "resume", "expdir", "world_size", "train_path", "val_path"}

EXAMPLE_COMMANDS = {
    "example_logs/demo/config.yaml": "train.py --config=demo --run_num=example",
    "example_logs/demo/out.log": "train.py --config=demo --run_num=example",
    "example_logs/demo_avx2/out.log": "train.py --config=demo --run_num=20261129-035438",
    "example_logs/large_batch/demo_bs32_test/config.yaml": "train.py --config=demo_bs32_test",
    "example_logs/large_batch/demo_bs32_test/out.log": "train.py --config=demo_bs32_test",
    "example_logs/large_batch/demo_bs32_opt/config.yaml": "train.py --config=demo_bs32_opt",
    "example_logs/large_batch/demo_bs32_opt/out.log": "train.py --config=demo_bs32_opt",
    "example_logs/short_h100/config.yaml": "train.py --config=short --run_num=h100",
    "example_logs/short_h100/out.log": "train.py --config=short --run_num=h100",
    "example_logs/ddp_fsdp_memory/ddp.out.log":
        "torchrun --standalone --nproc_per_node=2 train.py --config=demo --parallel=ddp --Nsamples=16 --num_epochs=1",
    "example_logs/ddp_fsdp_memory/fsdp.out.log":
        "torchrun --standalone --nproc_per_node=2 train.py --config=demo --parallel=fsdp --Nsamples=16 --num_epochs=1",
}

CONFIG_BLOCK = re.compile(r"- -{18} Configuration -{18}\n(.*?)- -{51}\n", re.S)


def records():
    """Every committed run record, relative to the repository's top level."""
    paths = glob.glob(os.path.join(ROOT, "example_logs", "**", "config.yaml"), recursive=True)
    for pattern in ("example_logs/**/*.log", "benchmarks/results/**/*.log"):
        paths += [path for path in glob.glob(os.path.join(ROOT, pattern), recursive=True)
                  if "------------------ Configuration" in open(path, errors="replace").read()]
    return sorted(os.path.relpath(path, ROOT) for path in paths)


def recorded_config(path):
    """{key: value} of a record: a config.yaml, or the configuration block of a log."""
    text = open(os.path.join(ROOT, path)).read()
    if path.endswith(".yaml"):
        return read_yaml(text)
    block = CONFIG_BLOCK.search(text)
    assert block and "INFO - Configuration name: " in block.group(1), \
        f"{path}: its configuration block is not in the current log format: it predates the current code"
    values = {}
    for line in block.group(1).splitlines()[:-1]:  # the last is the closing line's time stamp
        key, _, value = line.split(" - INFO - ", 1)[1].partition(" ")
        if key == "Configuration" and value.startswith("name: "):
            values["config"] = value[len("name: "):]
        elif key != "Configuration":
            values[key] = read_yaml(value) if value else ""
    return values


def command_of(path):
    """The script, the arguments of the train.py command that made the record, and its number of ranks."""
    if path in EXAMPLE_COMMANDS:
        command = EXAMPLE_COMMANDS[path]
    else:  # the benchmark tools' README beside the results: one command per run, named by its run_num
        readme = open(os.path.join(ROOT, os.path.dirname(path), "README.md")).read()
        run_num = os.path.splitext(os.path.basename(path))[0]
        found = [line for line in re.findall(r"`([^`]*train(?:_graph)?\.py [^`]*)`", readme)
                 if f"--run_num={run_num} " in line + " "]
        assert len(found) == 1, f"{path}: its README names no single command for run {run_num}"
        command = found[0]
    arguments = shlex.split(command)
    script = next(word for word in arguments if word.endswith(".py"))
    ranks = re.search(r"--nproc_per_node[= ](\d+)", command)  # torchrun's ranks; one process otherwise
    return os.path.basename(script), arguments[arguments.index(script) + 1:], int(ranks.group(1)) if ranks else 1


def same(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-9)
    return a == b


def differences(recorded, script, arguments, ranks=1):
    """What the code no longer has of a record: (keys it lacks, {key: (recorded, resolved now)})."""
    resolved = load_params(arguments, recorded.get("world_size", ranks), DEFAULT_WINDOWS[script]).to_dict()
    gone = sorted(set(recorded) - set(resolved) - RUN_SPECIFIC)
    changed = {key: (value, resolved[key]) for key, value in recorded.items()
               if key in resolved and key not in RUN_SPECIFIC and not same(value, resolved[key])}
    return gone, changed


@pytest.mark.parametrize("path", records())
def test_a_committed_record_is_what_the_code_makes_of_its_command(path):
    gone, changed = differences(recorded_config(path), *command_of(path))
    assert not gone, f"{path} names keys the code no longer has: {gone}; make the result again"
    assert not changed, f"{path}: recorded vs what the code resolves now: {changed}; make the result again"


def test_the_check_sees_a_changed_default_and_a_renamed_key():
    arguments = ["--config=demo", "--num_epochs=2"]
    current = load_params(arguments, 1, DEFAULT_WINDOWS["train.py"]).to_dict()
    assert differences(current, "train.py", arguments) == ([], {})
    assert differences({**current, "lr_scaling": "none"}, "train.py", arguments) == ([], {"lr_scaling": ("none", "sqrt")})
    assert differences({**current, "num_epochs": 4}, "train.py", arguments)[1] == {"num_epochs": (4, 2)}
    assert differences({**current, "data_size": 64}, "train.py", arguments)[0] == ["data_size"]


def test_every_record_is_found():
    found = records()
    assert {"example_logs/demo/config.yaml", "example_logs/demo/out.log"} <= set(found)
    assert any(path.startswith("benchmarks/results/scaling/") for path in found)
