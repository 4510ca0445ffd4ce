"""What the benchmark tools share: the data set they measure on, the device's name, an output folder
that an earlier run's results are not silently lost in, and running a real command with its output
kept and a time limit.

Where results go, the same for every tool: a user's run writes under ``runs/benchmarks/<tool>/``
(ignored by git), never into the committed results the README quotes (``benchmarks/results/``,
``example_logs/``) unless asked with ``--committed``. Without ``--out_dir`` a tool that finds
today's name taken by an earlier run writes beside it, ``<name>-2``, ``-3``, ...; a folder named with
``--out_dir`` that holds results is refused unless ``--overwrite``, which replaces them."""
import argparse
import contextlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess

import torch

from utils.conv3d import cpu_capability
from utils.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_RESULTS = os.path.join(ROOT, "runs", "benchmarks")  # a user's results: runs/ is ignored by git


def argument_parser(doc, presets, scratch=None):
    """The options all the benchmark tools have: --preset, --data_dir and --overwrite; with ``scratch``
    (a folder under runs/benchmarks/scratch/), also those of the tools that run train.py as separate commands: --work_dir,
    --timeout."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(presets), default="gpu")
    parser.add_argument("--data_dir", default=os.path.join(ROOT, "data", "benchmark"),
                        help="the synthetic data set, made there first if missing")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results an earlier run left where this one writes (refused without it)")
    if scratch:
        # Under runs/benchmarks/, so that `tensorboard --logdir runs` shows the benchmarks' runs in one folder
        # of their own, beside the user's training runs rather than among them.
        parser.add_argument("--work_dir", default=os.path.join(USER_RESULTS, "scratch", scratch),
                            help="scratch space for the runs' directories (default: runs/benchmarks/scratch/"
                            f"{scratch}; not kept)")
        parser.add_argument("--timeout", type=int, default=300, help="seconds per run")
    return parser


def add_output_options(parser, committed, user, out_dir_help=""):
    """--out_dir and, for a tool whose results the README quotes, --committed: ``committed`` is the tool's
    folder of committed results (relative to the repository; None for a tool without any), ``user`` its
    folder under runs/benchmarks/."""
    parser.add_argument("--out_dir", default=None, help=out_dir_help or (
        f"where the results go (default: runs/benchmarks/{user}/, not tracked by git)"))
    if committed:
        parser.add_argument("--committed", action="store_true", help=f"write where the results the README quotes "
                            f"are ({committed}), instead of runs/benchmarks/: to remake them")


def user_folder(user):
    """A tool's folder of a user's results: runs/benchmarks/<user>/ (ignored by git)."""
    return os.path.join(USER_RESULTS, user)


def results_folder(args, committed, user):
    """The folder a tool's results go in: --out_dir; else runs/benchmarks/<user>, or with --committed the
    committed folder."""
    if args.out_dir:
        return args.out_dir
    return os.path.join(ROOT, committed) if getattr(args, "committed", False) else user_folder(user)


def user_file(path):
    """Where a file named on the command line goes: a bare name (``--out model.png``) under runs/benchmarks/,
    made if missing, so that a plot does not land in the repository's top level; a path as given."""
    if os.path.dirname(path):
        return path
    os.makedirs(USER_RESULTS, exist_ok=True)
    return os.path.join(USER_RESULTS, path)


def free_name(path, args, taken):
    """``path``, or where the tool chose the folder (no --out_dir) and no --overwrite asks to replace an
    earlier run's results, the first of ``path-2``, ``path-3``, ... that ``taken(name)`` says is free."""
    return path if args.out_dir or args.overwrite else next_free(path, taken)


def check_preset(preset):
    """The gpu preset measures a GPU: refused where PyTorch sees none."""
    if preset == "gpu" and not torch.cuda.is_available():
        raise UserError("The gpu preset needs a CUDA GPU, and PyTorch sees none. Use --preset cpu on this machine.")


# How each refusal of an output folder that holds results ends.
KEEP_OR_REPLACE = ("Nothing was run or written. Pass --out_dir=<another folder> to keep them, or --overwrite to "
                   "replace them.")


def next_free(base, taken):
    """``base``, or else ``base-2``, ``base-3``, ...: the first name that ``taken(name)`` says is free.

    Where a tool writes by default (no ``--out_dir``, no ``--overwrite``), the documented command
    writes its results under a new name beside the committed ones, or beside an earlier run's of
    the same day, instead of refusing; a folder the user names is refused as :func:`claim_folder` says.
    """
    name, number = base, 1
    while taken(name):
        number += 1
        name = f"{base}-{number}"
    return name


def holds_files(folder):
    return os.path.isdir(folder) and bool(os.listdir(folder)) or os.path.isfile(folder)


def claim_folder(out_dir, overwrite, written_here):
    """Check the output folder before anything is measured or written: one that holds files is
    refused unless --overwrite. With it, the files there that ``written_here(name)`` says this tool
    writes are removed first, so that none of an earlier run's can pass for this run's (other files
    stay). An empty or missing folder is fine; nothing is created here."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"--out_dir={relative(out_dir)} is a file, not a folder. Pass --out_dir=<a folder> "
                        "(a new one, or an empty one).")
    held = sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []
    if held and not overwrite:
        raise UserError(f"The output folder {relative(out_dir)} already holds files ({listing(held)}): the "
                        f"results of an earlier run. {KEEP_OR_REPLACE}")
    remove([os.path.join(out_dir, name) for name in held if written_here(name)])


def claim_files(paths, overwrite, earlier="an earlier run"):
    """Check the output files before anything is measured or written: those that exist are refused
    unless --overwrite, and removed with it (a log must not go on from the earlier run's)."""
    held = [path for path in paths if os.path.exists(path)]
    if held and not overwrite:
        folder = relative(os.path.dirname(os.path.abspath(held[0])))
        raise UserError(f"The output folder {folder} already holds {listing([os.path.basename(p) for p in held])}: "
                        f"the results of {earlier}. {KEEP_OR_REPLACE}")
    remove(held)


def listing(names, shown=3):
    """The files a message names: "a, b and c", or "a, b, c and 4 more"."""
    if len(names) > shown:
        return ", ".join(names[:shown]) + f" and {len(names) - shown} more"
    return " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else names[0]


def remove(paths):
    """Remove the files (or links) among ``paths``; a folder of the same name is left alone."""
    for path in paths:
        if os.path.isfile(path) or os.path.islink(path):
            os.remove(path)


def make_data(data_dir, box):
    """The synthetic data set (with the .npy copies DALI reads), made once, and said so: it is a second
    data set beside the tutorial's data/ (boxes of the preset's size), kept for the next run."""
    from utils import generate_data

    train_path = os.path.join(data_dir, "synthetic_train.h5")
    if not os.path.exists(train_path):
        print(f"Making the benchmarks' own synthetic data set in {relative(data_dir)}/ ({box}^3 training and "
              f"{box // 2}^3 validation box, about {2 * 9 * 4 * (box ** 3 + (box // 2) ** 3) / 1e6:.0f} MB with "
              "the .npy copies); kept for the next run, `make clean` or deleting the folder removes it.", flush=True)
        generate_data.main(["--out_dir", data_dir, "--train_size", str(box), "--val_size", str(box // 2)])
    else:
        print(f"Data: the benchmarks' synthetic data set in {relative(data_dir)}/ (made by an earlier run).",
              flush=True)
    return train_path, os.path.join(data_dir, "synthetic_valid.h5")


def nvidia_driver():
    """The NVIDIA driver's version ("580.159.04"), from nvidia-smi; None where there is none."""
    try:
        result = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = result.stdout.split()
    return lines[0] if result.returncode == 0 and lines else None


def software():
    """What a result depends on besides the device: torch, CUDA, cuDNN (its integer) and the NVIDIA
    driver; None where this machine has none of them (a CPU build has no CUDA or cuDNN)."""
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "driver": nvidia_driver()}


def software_text(report):
    """A result's :func:`software` in words: "torch 2.11.0+cu130, CUDA 13.0, cuDNN 9.19.0, driver
    580.159.04", leaving out what the machine has not (results written before the driver and cuDNN were
    recorded have only torch and CUDA)."""
    from utils.conv3d import cudnn_text

    parts = [f"torch {report['torch']}", f"CUDA {report.get('cuda') or 'none'}"]
    if report.get("cudnn"):
        parts.append(f"cuDNN {cudnn_text(report['cudnn'])}")
    if report.get("driver"):
        parts.append(f"driver {report['driver']}")
    return ", ".join(parts)


def dali_importable():
    """Whether ``nvidia.dali`` can be found here, without importing it (the ladder's DALI rung, the
    profiles' DALI rung)."""
    return importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None


def device_name(gpu):
    """The GPU's name (device 0), or the CPU machine's: "CPU (<host>, <N> cores, <the vector instructions PyTorch's
    kernels use>)", e.g. "CPU (vm, 2 cores, AVX2)": a CPU with AVX-512 computes bf16 natively, one with AVX2 only
    emulates it, tens of times slower."""
    if gpu:
        return torch.cuda.get_device_name(0)
    return f"CPU ({socket.gethostname()}, {os.cpu_count()} cores, {cpu_capability()})"


def device_slug(name):
    """A file-name form of a device's name: "NVIDIA H100 80GB HBM3" -> nvidia-h100-80gb-hbm3."""
    return re.sub(r"[^0-9a-z]+", "-", name.lower()).strip("-")


def relative(path):
    """A path as a reader in the repository's top-level folder would type it."""
    path = os.path.abspath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def relative_args(command):
    """The command as typed in the repository's top-level folder (paths inside it made relative)."""
    shown = []
    for arg in command:
        key, _, value = arg.partition("=")
        shown.append(f"{key}={relative(value)}" if key in ("--train_path", "--val_path", "--expdir") else arg)
    return shown


def run(argv, log_path, timeout, mode="w", env=None):
    """Run ``argv`` in the repository, its output to ``log_path``; the exit status, or a text saying
    that it timed out (one stuck run must not cost the others their results). The command runs in a
    process group of its own, all of which is ended at the limit: a profiler's or a launcher's
    children too, which would otherwise outlive it and hold the GPU."""
    with open(log_path, mode) as log:
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            end_group(process)
            return f"timed out after {timeout} s"
        except BaseException:  # Ctrl-C (or the suite's SIGINT at its budget): the run ends with the tool
            end_group(process)
            raise


def end_group(process):
    """End a process started in a session of its own, and every process of its group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def outcome(code):
    """How a :func:`run` ended, in words."""
    return code if isinstance(code, str) else f"exit status {code}"


def write_report(base, report, table):
    """``<base>.json`` (the report) and ``<base>.md`` (its table), the table printed with both names."""
    os.makedirs(os.path.dirname(base), exist_ok=True)
    with open(base + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(table)
    print(table)
    print(f"Results: {base}.json, {base}.md")


# What a tool prints for the README's figure where its tree lacks the committed run it quotes (a copy of the
# code without benchmarks/results/, say).
NOT_IN_TREE = "not in this tree"


def committed_json(path):
    """The committed result at ``path`` (relative to the repository), parsed; None where this tree lacks it."""
    full = os.path.join(ROOT, path)
    if not os.path.exists(full):
        return None
    with open(full) as f:
        return json.load(f)
