"""The original SC22 tutorial's code, measured beside this one on the same GPU in the same run.

    python -m benchmarks.original --original=../sc22-dl-tutorial     # a clone of NERSC/sc22-dl-tutorial

``--original`` is the folder of a checkout of the original tutorial (NERSC/sc22-dl-tutorial); nothing
of it is copied here, it is run where it is. The run needs a CUDA GPU: the original's train.py sets
its CUDA device and synchronises it every epoch, with no CPU path.

What it runs, on one data set (the benchmarks' synthetic one, made first if missing: a 256^3
training and a 128^3 validation box, both as HDF5 files with datasets ``Nbody`` (4, L, L, L) and
``Hydro`` (5, L, L, L) and as the channel-last ``<name>_data.npy`` and ``<name>_label.npy`` copies,
the layout the original's loaders and its converter use):

1. The original's ``train.py`` with a config of its own ``config/UNet.yaml``'s ``base``, read from
   the checkout, where only the data's paths and box sides and the run's length change (written
   beside the results, ``<device>-<date>.yaml``): its baseline (``lowmem``, 2 workers, FP32); its
   optimisations that run here together (AMP fp16, apex's FusedAdam, ``--enable_jit``, ``lowmem``
   with 8 workers); and, where DALI is installed, its best settings (``short_opt``'s: the same with
   ``dali-lowmem``). Its ``--enable_jit`` scripts the model but trains the unscripted one: what it
   changes is the loss, a TorchScript function. Its throughput is its own log line, ``Time taken for epoch N is T sec, avg X
   samples/sec`` (steps x batch over the epoch's wall time, the loader included, validation not),
   averaged over the epochs after the first (which holds cuDNN's autotuning, TorchScript's
   compilation and the loader's start).
   Its train.py imports ``apex.optimizers`` at the top; NVIDIA apex needs CUDA extensions built from
   its sources, so the run puts ``tests/standins/apex`` on its ``PYTHONPATH``: apex's FusedAdam
   interface on ``torch.optim.Adam(fused=True)``. The results say so.
2. This project's rungs of ``benchmarks/ladder.py`` named by ``--rungs`` (by default its baseline,
   its best GPU rungs and its DALI rung), each in a process of its own, timed as the ladder times
   them: benchy's FULL trial (real loader and step, steady state), in samples/s.

It prints each side's samples/s and the ratios (this project over the original: baseline over
baseline, the fastest over the fastest), and writes ``<device>-<date>.json``, ``.md`` and ``.log``
under ``runs/benchmarks/original/`` (``--committed``: ``benchmarks/results/original/``). The two
sides time differently (an epoch's wall time against benchy's steady-state trials), which the
table says beside the numbers.
"""
import datetime
import json
import logging
import os
import re
import subprocess
import sys
import tempfile

import h5py
import torch
import yaml

from benchmarks import ladder
from benchmarks.common import (ROOT, add_output_options, argument_parser, claim_files, device_name, device_slug,
                               free_name, make_data, outcome, relative, results_folder, run, software,
                               software_text)
from utils.convert_h5_to_npy import output_paths as npy_paths
from utils.errors import UserError, exit_on_user_error

STANDINS = os.path.join(ROOT, "tests", "standins")
APEX_NOTE = ("NVIDIA apex is not installed: the original's `apex.optimizers.FusedAdam` is the stand-in "
             "tests/standins/apex (apex's FusedAdam interface on torch.optim.Adam(fused=True))")
# Files a checkout of the original has, with the line of its train.py whose numbers are read.
CHECKOUT_FILES = ("train.py", "config/UNet.yaml", "networks/UNet.py", "utils/__init__.py", "utils/data_loader.py",
                  "utils/YParams.py")
EPOCH_LINE = re.compile(r"Time taken for epoch (\d+) is ([0-9.eE+-]+) sec, avg ([0-9.eE+-]+) samples/sec")
CONFIG_NAME = "benchmark"  # the config the runs name in the config file written for them
GPU_BOX = 256               # the benchmarks' data set on a GPU (the ladder's): 256^3 training, 128^3 validation

# The original's runs: its baseline, its optimisations together, its best settings (short_opt's) with DALI.
ORIGINAL_FP16_APEX_JIT = ["--amp_mode=fp16", "--enable_apex", "--enable_jit"]
ORIGINAL_RUNS = [
    {"name": "baseline: lowmem, 2 workers, FP32", "flags": ["--data_loader_config=lowmem", "--num_data_workers=2"],
     "baseline": True},
    {"name": "lowmem, 8 workers, AMP fp16, FusedAdam (stand-in), JIT",
     "flags": ["--data_loader_config=lowmem", "--num_data_workers=8", *ORIGINAL_FP16_APEX_JIT]},
    {"name": "DALI, 8 workers, AMP fp16, FusedAdam (stand-in), JIT (short_opt's settings)",
     "flags": ["--data_loader_config=dali-lowmem", "--num_data_workers=8", *ORIGINAL_FP16_APEX_JIT], "dali": True},
]
# The original README's benchy FULL samples/s on one A100-40GB (batch 64, 64^3 crops), by its rung's name:
# what docs/03's ladder puts beside this project's nearest rungs.
PUBLISHED_A100_FULL = {"baseline, 2 workers": 83, "16 workers": 167, "DALI": 578, "DALI + AMP fp16": 666,
                       "DALI + AMP + apex + JIT": 684}
# This project's ladder rungs, by the text their names hold: the baseline first.
DEFAULT_RUNGS = ("baseline: lowmem, 2 workers", "+ fused Adam", "+ channels_last", "+ CUDA graph (train_graph.py)",
                 "+ compile's CUDA graphs", "DALI")


def check_checkout(path):
    """The checkout's absolute path; a clear refusal where ``path`` is not a checkout of the original."""
    missing = [name for name in CHECKOUT_FILES if not os.path.isfile(os.path.join(path, name))]
    if not missing:
        with open(os.path.join(path, "train.py")) as f:
            if "Time taken for epoch" not in f.read():
                missing = ["train.py's line 'Time taken for epoch N is T sec, avg X samples/sec'"]
    if missing:
        raise UserError(f"--original={path} is not a checkout of the original SC22 tutorial "
                        f"(NERSC/sc22-dl-tutorial): it has no {', '.join(missing)}. Nothing was run or written. "
                        "Pass --original=<the folder of a clone of it> (git clone "
                        "https://github.com/NERSC/sc22-dl-tutorial).")
    return os.path.abspath(path)


def check_gpu():
    """A clear refusal where PyTorch sees no CUDA GPU."""
    if not torch.cuda.is_available():
        raise UserError("benchmarks.original needs a CUDA GPU, and PyTorch sees none: the original's train.py "
                        "sets its CUDA device, moves the model there and synchronises it every epoch, with no CPU "
                        "path, and the comparison is only meaningful on one GPU for both sides. Nothing was run or "
                        "written. Run it on a machine with an NVIDIA GPU.")


def checkout_commit(path):
    """The checkout's commit (git rev-parse), or None where it is not a git clone."""
    try:
        result = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    # A copy without its own .git inside another repository answers with that repository's commit.
    top = subprocess.run(["git", "-C", path, "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                         timeout=30).stdout.strip()
    same = top and os.path.realpath(top) == os.path.realpath(path)
    return result.stdout.strip() if result.returncode == 0 and same else None


def box_side(path):
    """The box side of a data set file (a path relative to the repository, or absolute)."""
    with h5py.File(os.path.join(ROOT, path), "r") as f:
        return int(f["Nbody"].shape[1])


def original_config(checkout, train_path, val_path, epochs, samples_per_epoch, val_samples, expdir):
    """The original's ``base`` config (read from the checkout) on this data set: its paths, box sides and
    the run's length changed, nothing else. Paths relative to the repository, where its runs start."""
    with open(os.path.join(checkout, "config", "UNet.yaml")) as f:
        config = dict(yaml.safe_load(f)["base"])
    npy = {}
    for split, path in (("train", train_path), ("val", val_path)):  # the .npy copies' names, as its converter's
        npy[f"{split}_path_npy_data"], npy[f"{split}_path_npy_label"] = npy_paths(path)
    config.update(train_path=train_path, val_path=val_path, **npy, box_size=[box_side(train_path), box_side(val_path)],
                  Nsamples=samples_per_epoch, Nsamples_val=val_samples, num_epochs=epochs,
                  expdir=expdir, use_cache=None)
    return config


def write_config(path, config):
    """The config as the original's YParams reads it: ``{CONFIG_NAME: {...}}`` in a YAML file."""
    with open(path, "w") as f:
        yaml.safe_dump({CONFIG_NAME: config}, f, sort_keys=False)


def original_command(checkout, config_path, flags, run_num, epochs):
    """The original's train.py with ``flags``, on the benchmark's config."""
    return [sys.executable, os.path.join(checkout, "train.py"), f"--yaml_config={os.path.abspath(config_path)}",
            f"--config={CONFIG_NAME}", f"--run_num={run_num}", f"--num_epochs={epochs}", *flags]


def original_env(environ=None):
    """The environment of the original's runs: the apex stand-in first on PYTHONPATH, the folders already there
    kept (where ruamel.yaml or DALI may be installed) but this project's own, whose ``utils`` must not stand in
    for the original's; no launcher's rank variables (one process, one GPU)."""
    environ = os.environ if environ is None else environ
    ranks = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    kept = [folder for folder in environ.get("PYTHONPATH", "").split(os.pathsep)
            if folder and os.path.realpath(folder) != os.path.realpath(ROOT)]
    return {**{k: v for k, v in environ.items() if k not in ranks}, "PYTHONPATH": os.pathsep.join([STANDINS, *kept])}


def original_runs(dali):
    """The original's runs this machine can do: DALI's only where DALI is installed."""
    return [entry for entry in ORIGINAL_RUNS if dali or not entry.get("dali")]


def epoch_rates(log_text):
    """``[(epoch, seconds, samples/s)]`` from the original's epoch lines."""
    return [(int(epoch), float(seconds), float(rate)) for epoch, seconds, rate in EPOCH_LINE.findall(log_text)]


def steady_rate(epochs):
    """The mean samples/s of the epochs after the first; None with fewer than two epochs."""
    later = [rate for epoch, _, rate in epochs if epoch > 1]
    return sum(later) / len(later) if later else None


def rung_fragments(text):
    """``--rungs``: the fragments between its ``|``; ``none`` (or nothing): no rung of this project, the
    original's runs alone (the headline stage measures this project's rungs in steps of its own)."""
    return [] if text.strip() in ("", "none") else text.split("|")


def pick_rungs(fragments, rungs):
    """``[(fragment, rung or None)]``: the first of ``rungs`` whose name holds each fragment."""
    return [(fragment, next((rung for rung in rungs if fragment in rung.name), None)) for fragment in fragments]


def ratios(original, ours):
    """This project over the original: baseline over baseline, and the fastest over the fastest
    (None where a side has no number)."""
    def rate(entries, key, pick):
        values = [entry[key] for entry in entries if entry.get(key) and pick(entry)]
        return max(values) if values else None

    pairs = {"baseline": (rate(ours, "full", lambda e: e.get("baseline")),
                          rate(original, "samples_per_s", lambda e: e.get("baseline"))),
             "fastest": (rate(ours, "full", lambda e: True), rate(original, "samples_per_s", lambda e: True))}
    return {name: (a / b if a and b else None) for name, (a, b) in pairs.items()}


def measure_original(entry, command, env, log_path, timeout):
    """One run of the original's train.py, its output appended to ``log_path``: its epochs and steady rate,
    or an error."""
    with tempfile.TemporaryDirectory() as folder:
        own_log = os.path.join(folder, "run.log")
        code = run(command, own_log, timeout, env=env)
        with open(own_log) as f:
            text = f.read()
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(command)}\n{text}\n")
    epochs = epoch_rates(text)
    result = {"name": entry["name"], "flags": entry["flags"], "baseline": entry.get("baseline", False),
              "epochs": epochs, "samples_per_s": steady_rate(epochs)}
    if code != 0 or result["samples_per_s"] is None:
        result["error"] = f"{outcome(code)}, {len(epochs)} epoch lines; see the log"
    return result


def measure_ours(fragment, rung, common, args, log_path):
    """One of this project's ladder rungs, measured as the ladder measures it (a process of its own, with the
    ladder's options: the exact forms off below their rung)."""
    if rung is None:
        return {"name": fragment, "error": "benchmarks/ladder.py has no rung of this name"}
    rung = ladder.Rung(rung.name, ladder.ladder_options(rung, ladder.has_config_key("exact_forms")), rung.script,
                       rung.nbatches, rung.step, rung.table)
    entry = {"name": rung.name, "options": rung.options, "script": rung.script,
             "baseline": rung.name.startswith("baseline")}
    skip = ladder.skip_reason(rung)
    if skip:
        return {**entry, "error": f"skipped: {skip}"}
    slow = ladder.slow_convolutions(rung.options, torch.device("cuda"))
    # A host loader's rung: at least the ladder's batches a trial, so that its IO is not read below its FULL.
    sizes = ladder.trial_sizes(args, max(args.nbatches, rung.nbatches or 0), slow)
    summary = ladder.measure_in_process(rung, common, args, sizes, log_path)
    if "error" in summary:
        return {**entry, "error": summary["error"]}
    return {**entry, "nbatches": sizes[0], "ntrials": sizes[1], "slow": slow, "full": summary["full"],
            "synthetic": summary["synthetic"], "io": summary["io"], "precision": summary["precision"]}


def markdown_table(report):
    def number(value, digits=1):
        return "not measured" if value is None else f"{value:.{digits}f}"

    lines = [f"Measured by `{report['command']}` on {report['device']} ({software_text(report)}), "
             f"{report['date']}, on the benchmarks' synthetic data set ({report['data']}).", "",
             f"The original: {report['original']['what']}. {report['apex']}. Samples/s: its own epoch line "
             "(steps x batch over the epoch's wall time, the loader included), the mean of the epochs after "
             f"the first ({report['original']['epochs']} epochs of {report['original']['samples_per_epoch']} "
             "samples).", "",
             "| the original's run | samples/s | epochs (samples/s) |", "|---|---|---|"]
    for entry in report["original_runs"]:
        epochs = ", ".join(f"{rate:.1f}" for _, _, rate in entry["epochs"])
        rate = number(entry["samples_per_s"]) + (f" ({entry['error']})" if "error" in entry else "")
        lines.append(f"| {entry['name']} | {rate} | {epochs} |")
    lines += ["", "This project (benchmarks/ladder.py's rungs): benchy's FULL trial, samples/s.", "",
              "| rung | FULL | SYNTHETIC | IO |", "|---|---|---|---|"]
    for entry in report["runs"]:
        if "error" in entry:
            lines.append(f"| {entry['name']} | {entry['error']} | | |")
        else:
            lines.append(f"| {entry['name']} | {number(entry['full'])} | {number(entry['synthetic'])} "
                         f"| {number(entry['io'])} |")
    lines += ["", "| this project over the original | ratio |", "|---|---|"]
    lines += [f"| {name} | {number(value, 2)} |" for name, value in report["ratios"].items()]
    return "\n".join(lines) + "\n"


def write_report(base, report):
    with open(base + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(markdown_table(report))


@exit_on_user_error
def main(argv=None):
    parser = argument_parser(__doc__, {"gpu": None})
    add_output_options(parser, "benchmarks/results/original", "original")
    parser.add_argument("--original", required=True, help="the folder of a checkout of NERSC/sc22-dl-tutorial")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of each of the original's runs (the first "
                        "is not counted)")
    parser.add_argument("--samples_per_epoch", type=int, default=1280, help="the original's Nsamples: 20 steps of 64")
    parser.add_argument("--val_samples", type=int, default=64, help="the original's Nsamples_val")
    parser.add_argument("--rungs", default="|".join(DEFAULT_RUNGS),
                        help="this project's ladder rungs, by text their names hold, separated by |; none: "
                             "the original's runs alone")
    parser.add_argument("--nbatches", type=int, default=10, help="batches per trial of this project's rungs")
    parser.add_argument("--ntrials", type=int, default=2)
    parser.add_argument("--nwarmup", type=int, default=1)
    parser.add_argument("--rung_timeout", type=int, default=600, help="seconds per run, either side's")
    parser.add_argument("--work_dir", default=os.path.join(ROOT, "runs", "benchmarks", "scratch", "original"),
                        help="the original's run directories (its out.log and TensorBoard logs; not kept in git)")
    args = parser.parse_args(argv)

    checkout = check_checkout(args.original)
    check_gpu()
    name = device_name(True)
    stamp = datetime.datetime.now(datetime.timezone.utc)
    out_dir = results_folder(args, "benchmarks/results/original", "original")
    base = free_name(os.path.join(out_dir, f"{device_slug(name)}-{stamp:%Y-%m-%d}"), args,
                     lambda b: any(os.path.exists(b + suffix) for suffix in (".json", ".md", ".log", ".yaml")))
    claim_files([base + suffix for suffix in (".json", ".md", ".log", ".yaml")], args.overwrite,
                earlier="an earlier run on this device today")
    os.makedirs(out_dir, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(message)s",
                        handlers=[logging.StreamHandler(sys.stdout), logging.FileHandler(base + ".log")])

    train_path, val_path = make_data(args.data_dir, GPU_BOX)
    dali = ladder.dali_importable()
    config = original_config(checkout, relative(train_path), relative(val_path), args.epochs,
                             args.samples_per_epoch, args.val_samples, relative(args.work_dir))
    write_config(base + ".yaml", config)
    report = {"device": name, **software(), "date": stamp.isoformat(timespec="seconds"),
              "command": "python -m benchmarks.original " + " ".join(sys.argv[1:] if argv is None else argv),
              "data": f"{relative(train_path)}, {relative(val_path)}, and their .npy copies",
              "apex": APEX_NOTE, "dali": dali,
              "original": {"path": relative(checkout), "commit": checkout_commit(checkout),
                           "what": "its train.py, config/UNet.yaml's base with the data's paths and sizes "
                                   f"({os.path.basename(base)}.yaml)",
                           "epochs": args.epochs, "samples_per_epoch": args.samples_per_epoch},
              "original_runs": [], "runs": [], "ratios": {}}
    if not dali:
        logging.warning("DALI is not installed here: the original's best settings (dali-lowmem) are not run")
    for number, entry in enumerate(original_runs(dali)):
        command = original_command(checkout, base + ".yaml", entry["flags"], f"{stamp:%Y%m%d-%H%M%S}-{number}",
                                   args.epochs)
        logging.info("=== the original: %s", entry["name"])
        result = measure_original(entry, command, original_env(), base + ".log", args.rung_timeout)
        logging.info("%s", json.dumps(result))
        report["original_runs"].append(result)
        write_report(base, report)

    common = [*ladder.PRESETS["gpu"]["options"], f"--train_path={train_path}", f"--val_path={val_path}",
              "--device=cuda", "--checkpoint=false"]
    for fragment, rung in pick_rungs(rung_fragments(args.rungs), ladder.rungs_for("gpu", dali=dali)):
        logging.info("=== this project: %s", rung.name if rung else fragment)
        result = measure_ours(fragment, rung, common, args, base + ".log")
        logging.info("%s", json.dumps(result))
        report["runs"].append(result)
        report["ratios"] = ratios(report["original_runs"], report["runs"])
        write_report(base, report)

    print(markdown_table(report))
    print(f"Results: {base}.json, {base}.md, {base}.log, {base}.yaml")


if __name__ == "__main__":
    main()
