"""Run directories: which runs of a config hold a checkpoint, and config.yaml as the record of what ran.

A run directory's ``config.yaml`` is written when the run starts: its resolved options and the
number of ranks. Each ``--resume`` that trains appends an entry to its ``resumed`` list (the step it
continued from and the options that changed, old and new value), so the file always says what ran,
in order, and the options in force are the first ones with each entry's changes applied.

A ``--resume`` continues the same experiment: its options are those in force in the run's
``config.yaml``, overridden only by what the command line gives again (:func:`load_run_params`),
and a change that alters the learning-rate schedule is refused unless ``--allow_changes`` names it.
"""
import glob
import math
import os
import types

from utils.YParams import closest, load_params, read_yaml, write_yaml
from utils.errors import UserError
from utils.files import atomic_path

CONFIG_NAME = "config.yaml"
# Options that say how a run is continued or where it writes, not how it trains.
NOT_RECORDED_AS_CHANGES = ("resume", "allow_changes")
# Options that alter the learning-rate schedule of a resumed run (utils.lr_schedule), or the number of
# its steps: a resume that changes one is a different experiment, refused unless --allow_changes names it.
SCHEDULE_OPTIONS = ("num_epochs", "Nsamples", "global_batch_size", "local_batch_size", "base_batch_size",
                    "start_lr", "end_lr", "lr_scaling", "warmup_steps")


def run_num_given(argv):
    """Whether the command line names the run (``--run_num=NAME`` or ``--run_num NAME``)."""
    return option_given(argv, "run_num")


def option_given(argv, name):
    return any(arg == f"--{name}" or arg.startswith(f"--{name}=") for arg in argv)


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
    return differences(recorded_options(path), options)


def differences(recorded, options):
    return {key: [recorded.get(key), value] for key, value in options.items()
            if key not in NOT_RECORDED_AS_CHANGES and recorded.get(key) != value}


def load_run_params(argv, world_size, null_defaults, device_kind):
    """The run's options (utils.YParams.load_params); with ``--resume``, those of the run it continues.

    The run is found as train.py's claim_run_dir will find it: ``<expdir>/<config>/<N><kind>/<run_num>``
    with the ``--config`` (and ``--expdir``) of the command line, ``device_kind(params)`` ('GPU' or
    'CPU') tried first and the other kind after it (a run made with --device=cpu on a GPU machine),
    and without ``--run_num`` the highest-numbered run. Its ``config.yaml`` gives the options in
    force, and the command line overrides them again: so ``--resume`` alone continues the same
    experiment. A run directory with no ``config.yaml`` leaves the options as the command line says
    (train.py's resume refuses a run that is not there, naming those that are).
    """
    params = load_params(argv, world_size, null_defaults)
    if not params.resume:
        return params
    config_path = saved_config(params, argv, world_size, device_kind(params))
    if config_path is None:
        return params
    recorded = recorded_options(config_path)
    params = load_params(argv, world_size, null_defaults, saved=recorded)
    if not option_given(argv, "local_batch_size"):  # its global_batch_size is the recorded one
        params["local_batch_size"] = recorded.get("local_batch_size")
    refuse_schedule_changes(differences(recorded, {**params.to_dict(), "world_size": world_size}),
                            params.allow_changes, config_path)
    return params


def saved_config(params, argv, world_size, kind):
    """The ``config.yaml`` of the run that ``--resume`` continues, or None."""
    for each in (kind, "CPU" if kind == "GPU" else "GPU"):
        runs_dir = os.path.join(params.expdir, params.config, f"{world_size}{each}")
        run_num = params.run_num if run_num_given(argv) else default_run_num(runs_dir, resume=True)
        path = os.path.join(runs_dir, run_num, CONFIG_NAME)
        if os.path.exists(path):
            return path
    return None


def allowed_changes(allow_changes):
    """The option names ``--allow_changes`` lets change: all (True), none (False), or those named
    (``num_epochs``, ``num_epochs,start_lr`` or ``[num_epochs, start_lr]``)."""
    if allow_changes is True or allow_changes is False:
        return set(SCHEDULE_OPTIONS) if allow_changes else set()
    names = allow_changes if isinstance(allow_changes, list) else str(allow_changes).split(",")
    names = {str(name).strip().lstrip("-") for name in names if str(name).strip()}
    for name in names - set(SCHEDULE_OPTIONS):
        raise UserError(f"--allow_changes={allow_changes}: '{name}' is not an option that alters the "
                        f"schedule.{closest(name, list(SCHEDULE_OPTIONS))} Name some of "
                        f"{', '.join(SCHEDULE_OPTIONS)}, or give --allow_changes alone to allow them all.")
    return names


def refuse_schedule_changes(changed, allow_changes, config_path):
    """Refuse a resume whose command line changes an option of the schedule that --allow_changes
    does not name: the resumed run would be another experiment under the same name."""
    refused = {key: change for key, change in changed.items()
               if key in SCHEDULE_OPTIONS and key not in allowed_changes(allow_changes)}
    if not refused:
        return
    listed = ", ".join(f"{key} {old} -> {new}" for key, (old, new) in refused.items())
    names = ",".join(refused)
    raise UserError(f"--resume continues the run with its own options (from {config_path}), but the command "
                    f"line changes what its learning-rate schedule or its length would be: {listed}. To "
                    f"continue the same experiment, leave {'these options' if len(refused) > 1 else 'this option'} "
                    f"out of the command line. To change {'them' if len(refused) > 1 else 'it'} anyway (the "
                    f"schedule is then recomputed from this step on, and config.yaml records the change), add "
                    f"--allow_changes={names}; or start a new run with another --run_num.")


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
