"""Run directories: which runs of a config hold a checkpoint, and config.yaml as the record of what ran.

A run directory's ``config.yaml`` is written when the run starts: its resolved options and the
number of ranks. Each ``--resume`` that trains appends an entry to its ``resumed`` list (the step it
continued from and the options that changed, old and new value), so the file always says what ran,
in order, and the options in force are the first ones with each entry's changes applied.
"""
import glob
import math
import os
import types

from utils.YParams import read_yaml, write_yaml
from utils.errors import UserError
from utils.files import atomic_path

CONFIG_NAME = "config.yaml"
# Options that say how a run is continued or where it writes, not how it trains.
NOT_RECORDED_AS_CHANGES = ("resume",)


def run_num_given(argv):
    """Whether the command line names the run (``--run_num=NAME`` or ``--run_num NAME``)."""
    return any(arg == "--run_num" or arg.startswith("--run_num=") for arg in argv)


def numbered_runs(runs_dir):
    """The run numbers (00, 01, ...) under ``runs_dir`` (``<expdir>/<config>/<N>CPU|GPU``) that hold a run."""
    names = os.listdir(runs_dir) if os.path.isdir(runs_dir) else []
    return sorted((name for name in names if name.isdigit() and os.listdir(os.path.join(runs_dir, name))), key=int)


def default_run_num(runs_dir, resume):
    """The run when --run_num is not given: the first free number (00, 01, ...) for a new run, so that
    runs of the same config never collide; for --resume, the highest-numbered run (00 if none)."""
    taken = numbered_runs(runs_dir)
    if resume:
        return taken[-1] if taken else "00"
    number = 0
    while f"{number:02d}" in taken:
        number += 1
    return f"{number:02d}"


def runs_with_checkpoints(expdir, config, checkpoint_name):
    """The run directories ``<expdir>/<config>/<N>CPU|GPU/<run_num>/`` that hold a checkpoint, sorted."""
    pattern = os.path.join(glob.escape(expdir), glob.escape(config), "*", "*", checkpoint_name)
    return sorted(os.path.dirname(path) for path in glob.glob(pattern))


def refuse_resume_without_checkpoint(run_dir, params, checkpoint_name):
    """--resume of a run directory with no run in it: a mistyped --run_num, a forgotten --config or
    another number of ranks. Refused, naming the run directories of this config that can be resumed."""
    found = runs_with_checkpoints(params.expdir, params.config, checkpoint_name)
    where = (f"Run directories of --config={params.config} that hold one: {', '.join(found)} (resume one "
             "with its --run_num and as many ranks as its <N>CPU|GPU folder says)." if found else
             f"No run directory under {os.path.join(params.expdir, params.config)} holds one.")
    raise UserError(f"--resume: there is no run to continue in {run_dir} (no {checkpoint_name}). {where} "
                    "Check --config and --run_num, or leave out --resume to start a new run.")


def recorded_options(path):
    """The options in force after the last run or resume recorded in ``path``: the first ones with
    every resume's changes applied."""
    with open(path) as f:
        record = read_yaml(f) or {}
    options = {key: value for key, value in record.items() if key != "resumed"}
    for entry in record.get("resumed") or []:
        options.update({key: change[1] for key, change in (entry.get("changed") or {}).items()})
    return options


def changed_options(path, options):
    """``{key: [recorded value, new value]}`` for the options that differ from those recorded in ``path``."""
    recorded = recorded_options(path)
    return {key: [recorded.get(key), value] for key, value in options.items()
            if key not in NOT_RECORDED_AS_CHANGES and recorded.get(key) != value}


def record_config(run_dir, options, step):
    """Write ``config.yaml`` for a new run, or append this resume (from ``step``) and its changes to it."""
    path = os.path.join(run_dir, CONFIG_NAME)
    if not os.path.exists(path):
        record = dict(options)
    else:
        with open(path) as f:
            record = read_yaml(f) or {}
        changed = changed_options(path, options)
        record["resumed"] = [*(record.get("resumed") or []), {"at_step": step, "changed": changed}]
    with atomic_path(path) as temporary, open(temporary, "w") as f:
        write_yaml(record, f)


def schedule_change(changed, recorded, options, step, steps_per_epoch, schedule):
    """One paragraph on what the changed options do to the learning-rate ``schedule`` at ``step``
    (``schedule(step, total_steps, params)``), or None when the rate and the schedule's end stay."""
    old, new = types.SimpleNamespace(**{**options, **recorded}), types.SimpleNamespace(**options)
    old_total, new_total = old.num_epochs * steps_per_epoch, new.num_epochs * steps_per_epoch
    try:
        before, after = schedule(step, old_total, old), schedule(step, new_total, new)
    except (AttributeError, KeyError, TypeError, ZeroDivisionError):  # a record from an older version
        return None
    if old_total == new_total and math.isclose(before, after, rel_tol=1e-12):
        return None
    names = ", ".join(f"--{key}" for key in changed)
    return (f"Resuming with changed options ({names}): the learning-rate schedule is recomputed for the new "
            f"options, not continued. Its cosine now ends at step {new_total} instead of {old_total}, and the "
            f"rate at step {step} is {after:.4g} instead of {before:.4g}, so the curve changes here. "
            "config.yaml records the change.")
