"""The stages of ``benchmarks/suite/gpu_suite.sh``: their steps and prices, an overview of each (what it measures,
where it writes, its time in the committed logs), and the commands that run them on a remote GPU machine
with a time limit, in sessions, each command with its budget.

    benchmarks/suite/gpu_suite.sh --plan             # = python -m benchmarks.suite.plan --limit 540
    benchmarks/suite/gpu_suite.sh --plan --gpus 4    # the multi-GPU checks, for a machine with 4 GPUs
    python -m benchmarks.suite.plan --overview ladder profiles   # what gpu_suite.sh prints before it runs

Runs anywhere, no GPU needed. On your own GPU, ``benchmarks/suite/gpu_suite.sh`` runs the stages without a
plan. The plan is for a remote machine where a session has 15 minutes of GPU time in all
(:data:`SESSION_S`): the machine's start (1-2 minutes), every command (10 minutes at most), the
transfers, and the 30 s of idle after the last command, when the machine is released. So the plan is
sessions, each on a machine that starts bare, the most valuable first (:data:`SINGLE_GPU`): (1) the
headline, the numbers that decide in one command; (2) the preflight and the GPU-only tests; (3) the
distributed code on CUDA tensors (two ranks on the one GPU over gloo) and the out-of-memory tests;
(4) DALI; (5) the CUDA-graph lesson and the batch sweep; (6) Debian's Nsight Systems and the rungs
alone; then the ladder, the scaling point and the profiles, the original's stage, which the committed
runs already measured on an H100 and an H200. A session's commands are sent back to
back (a machine goes back 30 seconds after a command ends, and may be replaced by a bare one between
two commands), and each command stands on its own: it starts by installing the small wheels it
carries (ruamel.yaml, which every script imports) into a fresh folder, reads nothing an earlier
command left on the machine, and returns its results from ``$OUT``. DALI, too large for one command,
travels as ``benchmarks/suite/pack_dali.sh`` packs it: its wheels unzipped into one site folder, in one
tar compressed with xz, cut into :data:`DALI_PARTS` parts. The parts gather on the machine over the
DALI session's commands, one part each; the last command checks the tar's sha256, extracts it and
runs the dali stage (DALI's tests, its profile, its rung). Each command is priced: its stages'
estimates, their budgets (what gpu_suite.sh enforces: its ``BUDGET`` table, which a test keeps equal
to these), the transfers; each session, with the machine's start, must fit its 15 minutes with a
margin (:data:`MARGIN_S`) if every command used its whole budget.

The estimates read the rungs, trial sizes and batches from the benchmark tools themselves. What a
process costs before its trials comes from the committed measurements: cuDNN's autotuning, paid again by
every process (benchmarks/results/cudnn_autotune/: 41.2 s on an H100 in channels_last, 12.4 s
contiguous on an H200), torch.compile's set-up and whole rung processes (the committed ladder logs,
benchmarks/results/gpu_suite/). Trials are priced with the throughputs in :data:`ASSUMED_IO` and
:data:`ASSUMED_COMPUTE`: the original tutorial's A100 figures (README of the SC22 tutorial), which an
H100 or H200 exceeds, so they are upper bounds for such a GPU. The exact forms' own autotuning,
transfers and the GPU tests' costs are estimates, marked as such, but for DALI's extraction and a
part's transfer, measured on an H200 (2026-11-26). Where a stage's rungs cannot all fit its budget, the
plan names the ones its budget cuts.

One GPU runs the distributed code with two ranks over gloo (NCCL refuses two ranks on one GPU): the
``tests-distributed`` stage. NCCL itself, the halo exchange of domain parallelism on CUDA tensors (gloo
sends no CUDA tensor point to point) and the CUDA-graph step under DDP are the ``multi-gpu`` stage of
the plan for a machine with several GPUs (``--gpus N``), with the weak-scaling points over its GPUs; the
single-GPU plan runs the one-GPU point.
"""
import argparse
import datetime
import glob
import json
import math
import os
import re

import yaml

from benchmarks import ladder, profiles, scaling
from benchmarks.common import ROOT
from benchmarks.layers import IN_STEP_FORMS as LAYER_IN_STEP_FORMS, PRESETS as LAYER_PRESETS
from benchmarks.trials import warmup_trials

# Samples per second assumed for a rung (batch 64): what its loader delivers (IO) and what its step
# computes (SYNTHETIC); FULL is the slower of the two. The original tutorial's A100 figures where it
# has them; the GPU-resident loader's IO, which it lacks, put below its DALI IO (944) to be safe.
ASSUMED_IO = {"lowmem, 2 workers": 85, "lowmem, 8 workers": 199, "dali": 944, "gpu-inmem": 900}
ASSUMED_COMPUTE = {"fp32": 482, "amp": 820, "batch 8": 400}  # TF32 baseline, fp16 AMP, batch 8 (launch-bound)
# Seconds, estimated: a rung's build (model, optimiser, loader), a process's start (Python, torch, CUDA), the
# data set (measured: 19 s for 256^3 on the project's 2-core CPU machine), a train.py run of the tiny test
# config on a GPU; --exact_forms=on: the forms' own convolutions autotuned (about 20 more problems), and =auto
# on top of that its batch-1 shape probe. What a process pays for cuDNN's autotuning and torch.compile's
# set-up is read from the committed measurements: autotune_seconds(), compile_seconds().
SETUP_S = {"rung": 10, "graph": 10, "dali": 15, "data": 20, "process": 6, "test run": 20, "forms": 20, "auto": 30}
RESULTS = os.path.join(ROOT, "benchmarks", "results")
LADDER_LOGS = os.path.join(RESULTS, "gpu_suite", "gpu_suite-ladder-*.log")


def autotune_seconds():
    """``{"channels_last": s, "contiguous": s, "new batch": s}``: the first step's extra seconds, cuDNN's autotuning
    at batch 64 in bf16, the most any committed GPU measured (benchmarks/results/cudnn_autotune/: the
    ``channels_last`` phase; the ``on`` phase, the first autotuned step of a process; the ``partial batch``
    phase, a new batch shape in a process already tuned). Every process pays it again: PyTorch keeps no cuDNN
    plan across processes."""
    phases = {"channels_last": "channels_last", "on": "contiguous", "partial batch": "new batch"}
    found = dict.fromkeys(phases.values(), 0.0)
    for path in sorted(glob.glob(os.path.join(RESULTS, "cudnn_autotune", "*.md"))):
        for line in open(path):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if len(cells) == 7 and cells[0] in phases:
                found[phases[cells[0]]] = max(found[phases[cells[0]]], float(cells[5]))
    return found


def rung_processes(gpu="H100"):
    """``{rung name: seconds}``: each rung's process in the committed ladder logs of a ``gpu`` (its name in the log's
    nvidia-smi line), from its ``=== name:`` line to its result line: start, build, autotuning, compilation and
    trials together."""
    seconds = {}
    for path in sorted(glob.glob(LADDER_LOGS)):
        lines = open(path).read().splitlines()
        if len(lines) < 2 or gpu not in lines[1]:
            continue
        started = {}
        for line in lines:
            found = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ - (?:=== (.+?): |(\{.*\})$)", line)
            if not found:
                continue
            stamp = datetime.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S")
            if found.group(2):
                started[found.group(2)] = stamp
            else:
                name = json.loads(found.group(3)).get("name")
                if name in started:
                    seconds[name] = (stamp - started[name]).total_seconds()
    return seconds


# The committed H100 ladder's rungs (gpu_suite-ladder-2026-11-25.log) that price the others.
EAGER_CONTIGUOUS, COMPILED_CONTIGUOUS = "+ fused Adam (bf16)", "+ torch.compile (bf16, fused)"
EAGER_CHANNELS_LAST = "+ channels_last (bf16, fused)"


def compile_seconds():
    """torch.compile's set-up in a process: the compiled contiguous rung's process less the eager one's (H100)."""
    measured = rung_processes("H100")
    return measured[COMPILED_CONTIGUOUS] - measured[EAGER_CONTIGUOUS]
# The ladder's trial sizes on a GPU (gpu_suite.sh passes them; a test keeps the two equal).
LADDER = {"nbatches": 6, "ntrials": 2, "nwarmup": 1}
PREFETCH_FACTOR = 2   # a DataLoader's batches in flight per worker (utils/data_loader.py)
with open(os.path.join(ROOT, "config", "UNet.yaml")) as config:
    # train_graph.py's eager steps before its capture: the ladder runs them, and the capture, before the trials.
    GRAPH_WARMUP_STEPS = yaml.safe_load(config)["base"]["graph_warmup_steps"]
TEST_RUN = SETUP_S["test run"]
# The GPU-only tests, estimated: runs of train.py on the tiny test config, with start-up (CUDA's, cuDNN's
# autotuning and deterministic algorithms included).
GPU_TESTS = [("tests/test_train_graph.py: 3 precisions x (eager + graph) runs", 6 * TEST_RUN),
             ("tests/test_gpu_paths.py but compile: the profiling window, a resume (2 runs)", 2 * TEST_RUN),
             ("tests/test_gpu_prefetch.py: device prefetch and gradient accumulation (reserved: 3 runs)",
              3 * TEST_RUN),
             ("the loaders, metrics and symmetry on the GPU (no train.py runs)", 10),
             ("pytest's start and collection", 10)]
COMPILE_TESTS = [("tests/test_gpu_paths.py compile: two epochs, reduce-overhead, training and validation "
                  "compiled", 130), ("pytest's start and collection", 10)]
# The distributed code on CUDA tensors: two ranks sharing the GPU over gloo (tests/test_cuda_distributed.py),
# estimated: torchrun's start adds about 10 s to a train.py run.
TORCHRUN_RUN = TEST_RUN + 10
DISTRIBUTED_TESTS = [("tests/dist_worker.py's variants (DDP and its knobs, comm hooks, FSDP) on 2 ranks, float64, "
                      "and the one-rank reference", 60),
                     ("tests/dist_worker.py's accumulation variants on 2 ranks, and the one-rank reference", 40),
                     ("train.py under torchrun: one rank, DDP, DDP + device prefetch, FSDP, 2 micro-batches (5 runs)",
                      5 * TORCHRUN_RUN),
                     ("--resume: a 2-rank run stopped by SIGUSR1, and its resumption (2 runs)", 2 * TORCHRUN_RUN),
                     ("gloo's point-to-point messages on CUDA tensors, and the domain mesh's refusal", 30),
                     ("tests/test_out_of_memory.py: a real out-of-memory error in epoch 2, and an absurd local batch "
                      "(2 runs)", 2 * TEST_RUN + 20),
                     ("pytest's start and collection", 10)]
DALI_TESTS = [("tests/test_data_loader_dali.py on the GPU: two loaders compared (no train.py runs)", 20),
              ("pytest's start and collection", 10)]
# DALI for CUDA 13 and what it imports: 254 MB of wheels, unzipped and packed by benchmarks/suite/pack_dali.sh into a
# tar.xz of 167 MB, carried in parts of 56 MiB.
DALI_PARTS = 3
DALI_INSTALL_S = 20   # joining the parts, their sha256 and tar xJf: the extraction took 7.9 s on an H200 (2026-11-26)
# Seconds for one Nsight Systems route of the nsys-probe stage (gpu_suite.sh's NSYS_LIMIT): issue 41 asks for
# at least 120 s, where a 30 s probe of the machine's own nsys wrote no report.
NSYS_LIMIT_S = 120
NSYS_CARRY = ".carry/nsys"  # Debian's nsight-systems-target .deb, for the nsys-probe stage
ORIGINAL_CARRY = ".carry/sc22-original"  # a copy of the original tutorial's checkout, for the original stage
# The original stage's runs of the original's train.py (benchmarks/original.py): epochs of its samples each,
# the first included; its baseline's rate, and its optimised runs' (fp16, FusedAdam, JIT, 8 workers or DALI).
ORIGINAL_EPOCHS, ORIGINAL_SAMPLES = 3, 1280
COPY_BUDGET = 10      # a part's command: a copy of 56 MiB on the machine
CUDNN_AUTOTUNE_S = 60  # python -m benchmarks.cudnn_autotune: the first step with and without autotuning
# Where each command installs what it carries (DALI's site too), and gathers DALI's parts: under $HOME (/root on
# a remote GPU machine, where commands run as root), which a bare machine has empty.
SITE = "${HOME:-/root}/site"
GATHER = "${HOME:-/root}/carry"
# requirements.txt's packages that the remote machine lacks (it has torch, numpy, h5py, pyyaml,
# tensorboard, matplotlib, tqdm): small wheels, carried whole by every command.
SMALL_WHEELS = ["ruamel.yaml"]
WHEELS = ".carry/wheels"
CARRIED_PREFLIGHT = ".carry/preflight"  # the preflight's answer, for the commands after it
SUITE_RESULTS = "runs/benchmarks/gpu_suite"  # gpu_suite.sh's RESULTS: the archives hold its files under it
INSTALL = (f"python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target \"{SITE}\" {WHEELS}/*.whl "
           f"&& export PYTHONPATH=\"{SITE}${{PYTHONPATH:+:$PYTHONPATH}}\"")
# A session: 15 minutes of device time a session, for its start (1-2 minutes), every command, the transfers
# and the idle 30 s after the last command, when it goes back; the working tree (3-4 MiB) and the results travel
# with every command, a DALI part's 56 MiB with some (10-20 s a call, measured on an H200, 2026-11-26).
SESSION_S = 900
START_S = 120
IDLE_S = 30
TRANSFER_S = 5
DALI_PART_TRANSFER_S = 20
MARGIN_S = 60          # left over in a session when every command used its whole budget (the gaps between commands)
MAX_BUDGET = 530       # of the 540 s a stage may run (STAGE_LIMIT): 10 s for packing's last pass


def budget(estimate, limit=540):
    """A stage's budget: its estimate, a tenth more and 10 s, within the command limit. The estimates
    price compute at an A100's speed, which an H100 exceeds, so the margin goes mostly to set-up."""
    return min(math.ceil((estimate * 1.1 + 10) / 10) * 10, MAX_BUDGET, limit)


def rung_rates(options):
    """(IO, SYNTHETIC) samples/s assumed for a rung with these train.py options."""
    text = " ".join(options)
    loader = ("lowmem, 8 workers" if "--num_data_workers=8" in text else "lowmem, 2 workers") \
        if "=lowmem" in text else "dali" if "dali" in text else "gpu-inmem"
    compute = "batch 8" if "--global_batch_size=8" in text else "amp" if "--amp_mode" in text else "fp32"
    return ASSUMED_IO[loader], ASSUMED_COMPUTE[compute]


def workers_of(options):
    text = " ".join(options)
    if "=lowmem" not in text:
        return 0
    return next(int(option.split("=")[1]) for option in options if option.startswith("--num_data_workers="))


def trial_seconds(options, nbatches, ntrials, nwarmup, batch):
    """IO, SYNTHETIC and FULL trials of ``nbatches`` batches; the loader's warm-up trials cover twice its
    batches in flight (benchmarks/trials.py)."""
    io, compute = rung_rates(options)
    warm = warmup_trials(nwarmup, nbatches, workers_of(options) * PREFETCH_FACTOR)
    timed = ntrials * nbatches * batch
    loader_warm = warm * nbatches * batch
    return ((timed + loader_warm) / io + (timed + nwarmup * nbatches * batch) / compute
            + (timed + loader_warm) / min(io, compute))


def rung_setup(options, script="train.py", batch=64):
    """A rung's process and build, and what runs before its trials: cuDNN's autotuning (channels_last or
    contiguous), the exact forms' own, the compilation, or the graph's warm-up and capture."""
    text = " ".join(options)
    layout = "channels_last" if "--channels_last" in options else "contiguous"
    forms = next((option.split("=")[1] for option in options if option.startswith("--exact_forms=")), "auto")
    seconds = (SETUP_S["process"] + SETUP_S["rung"] + autotune_seconds()[layout]
               + compile_seconds() * ("--jit_mode=compile" in text) + SETUP_S["dali"] * ("dali" in text)
               + {"on": SETUP_S["forms"], "auto": SETUP_S["auto"]}.get(forms, 0))
    if script == "train_graph.py":
        seconds += SETUP_S["graph"] + (GRAPH_WARMUP_STEPS + 2) * batch / rung_rates(options)[1]
    return seconds


# Rungs the plan keeps room for before the ladder has them (priced like the rung they extend).
RESERVED_RUNGS = [ladder.Rung("lowmem, 8 workers + device prefetch (room kept for it)",
                              ["--data_loader_config=lowmem", "--num_data_workers=8", "--device_prefetch=true"],
                              nbatches=5)]


# How the plan prices the ladder's rungs after the first with --exact_forms=auto: that rung decides (its shape probe
# and the timing of both forms), and benchmarks/ladder.py passes its list of layers to the later rungs and the batch
# sweep (ladder_options). The list is unknown before the run: priced as every layer's form, --exact_forms=on's own
# autotuning without the decision.
DECIDED_FORMS = "on"


# The batch-sweep stage's rung (the ladder's --only): the ladder's top rung, everything together.
SWEEP_RUNG = "compile's CUDA graphs"


# The batch sweep's local batches past the top rung's own 64 (gpu_suite.sh's batch-sweep stage passes them).
SWEEP_BATCHES = (128, 256)


def ladder_rows(group, nbatches=LADDER["nbatches"], ntrials=LADDER["ntrials"], nwarmup=LADDER["nwarmup"], batch=64,
                only="", sweep=(), room=None):
    """A ladder stage's rows: the data set, then each rung's process as the ladder runs it (its options as
    ladder_options completes them: the first rung with ``--exact_forms=auto`` decides, the later ones take its
    layers, :data:`DECIDED_FORMS`), then the sweep's batches. With ``room`` (seconds), the rungs past it are not
    priced but named in one row: the ladder measures from the top down, so a budget cuts its last rungs."""
    rows = [("make the 256^3 data set and its .npy copies", SETUP_S["data"])]
    rungs, _ = ladder.select_rungs(ladder.rungs_for("gpu", dali=True, group=group), [only] if only else [],
                                   f"--preset gpu --group {group}")
    if group == "loaders" and not any("--device_prefetch=true" in rung.options for rung in rungs):
        rungs = rungs + RESERVED_RUNGS
    processes, decided = [], None
    for rung in rungs:
        options = ladder.ladder_options(rung, True, decided)
        deciding = decided is None and "--exact_forms=auto" in options
        decided = DECIDED_FORMS if deciding else decided
        size = 8 if "--global_batch_size=8" in " ".join(options) else batch
        batches = min(nbatches, rung.nbatches or nbatches)
        what = f"{rung.name} (a process of its own{'; --exact_forms=auto decides for the rungs after it' * deciding})"
        processes.append((rung.name, what, rung_setup(options, rung.script, size)
                          + trial_seconds(options, batches, ntrials, nwarmup, size)))
    rows = within(rows, processes, room, "measured last, from the top down")
    top = ladder.LADDER_RUNGS[-1]
    options = ladder.ladder_options(top, True, decided)
    for size in sweep:  # the local-batch sweep at the best rung measured, priced as the top rung
        rows.append((f"the batch sweep: the best rung at local batch {size} (a process of its own)",
                     rung_setup(options, top.script, size) + trial_seconds(options, nbatches, ntrials, nwarmup, size)))
    return rows


def original_rows(dali=False, batch=64, room=None):
    """benchmarks/original.py on a GPU: the original's runs (its epochs, at the original's published rates,
    with a process's start and one validation), then this project's rungs as the ladder measures them. Its
    session has no DALI (DALI travels in the dali session's parts): the DALI runs of both sides are not run."""
    from benchmarks import original  # imports torch's CUDA checks only when called
    rows = [("make the 256^3 data set and its .npy copies", SETUP_S["data"])]
    for entry in original.ORIGINAL_RUNS:
        if entry.get("dali") and not dali:
            continue
        rate = ASSUMED_IO["lowmem, 2 workers"] if entry.get("baseline") else min(
            ASSUMED_IO["dali" if entry.get("dali") else "lowmem, 8 workers"], ASSUMED_COMPUTE["amp"])
        rows.append((f"the original: {entry['name']}", 2 * SETUP_S["process"] + SETUP_S["rung"]
                     + ORIGINAL_EPOCHS * ORIGINAL_SAMPLES / rate))
    rungs = ladder.rungs_for("gpu", dali=dali)
    processes = []
    for fragment, rung in original.pick_rungs(list(original.DEFAULT_RUNGS), rungs):
        if rung is None:
            continue
        nbatches = max(10, rung.nbatches or 0)  # benchmarks/original.py's --nbatches, or a host loader's floor
        processes.append((rung.name, f"this project: {rung.name} (a process of its own)",
                          rung_setup(rung.options, rung.script, batch) + trial_seconds(rung.options, nbatches, 2, 1,
                                                                                       batch)))
    return within(rows, processes, room, "this project's rungs run in this order")


def within(rows, processes, room, order):
    """``rows`` and the ``(name, what, seconds)`` of ``processes`` that fit ``room`` seconds in all (None: all);
    the rest, which a stage's budget cuts, named in one row."""
    cut = []
    for name, what, seconds in processes:
        if cut or (room is not None and step_seconds(rows + [(what, seconds)]) > room):
            cut.append(name)
        else:
            rows = rows + [(what, seconds)]
    if cut:
        rows = rows + [(f"not reached within the budget ({order}): {', '.join(cut)}", 0)]
    return rows


def profiles_rows(steps=4, batch=64):
    rows = [("make the 256^3 data set", SETUP_S["data"]),
            ("nsys probe, where no carried preflight answers (at most 45 s; nsys runs then double each rung's)", 0)]
    for slug, _, script, options in profiles.GPU_RUNGS:
        # two epochs of steps + 4 batches (one validation batch each), in a fresh process
        _, compute = rung_rates(options)
        seconds = rung_setup(options, script) + 2 * (steps + 4) * batch / compute
        rows.append((f"profile {slug}", seconds))
    return rows


def layers_rows(batch=64, repeats=LAYER_PRESETS["gpu"]["repeats"], in_step_steps=3, forms="auto"):
    """benchmarks.layers in channels_last: its process, cuDNN's autotuning of the layers in both forms, the
    whole step's forms (``--exact_forms``), the timed calls, and the step profiled layer by layer, plain and in
    the exact forms, as auto picks them (benchmarks.layers' IN_STEP_FORMS)."""
    # The layers plain and in their forms cost about two steps together; then the whole step; each timed
    # call after 2 untimed; the profiled steps after 2 warm-up steps each, their tables built on the host.
    calls = repeats + 2
    return [("a process's start", SETUP_S["process"]),
            ("cuDNN's autotuning in channels_last (benchmarks/results/cudnn_autotune/)",
             autotune_seconds()["channels_last"]),
            ("the exact forms' own convolutions autotuned (estimated)", SETUP_S["forms"]),
            (f"the whole step with --exact_forms={forms}: its choice (estimated)",
             {"on": 0, "auto": SETUP_S["auto"] - SETUP_S["forms"]}.get(forms, 0)),
            (f"each layer plain and in its form, then the step: {calls} calls each",
             3 * calls * batch / ASSUMED_COMPUTE["amp"]),
            (f"the step profiled layer by layer, --exact_forms={'/'.join(LAYER_IN_STEP_FORMS)} ({in_step_steps} steps "
             "each, estimated)", len(LAYER_IN_STEP_FORMS) * (5 + (2 + in_step_steps) * batch / ASSUMED_COMPUTE["amp"]))]


# The headline's trial sizes (gpu_suite.sh's HEADLINE_SIZES; a test keeps the two equal), and the rungs it measures:
# the ladder's + torch.compile (the exact forms auto, then off) and + channels_last (forms off: the committed best rung).
HEADLINE = {"nbatches": 12, "ntrials": 3, "nwarmup": 1}
HEADLINE_RUNGS = {"compile-auto": [*ladder.COMPILED, "--exact_forms=auto"],
                  "compile-off": [*ladder.COMPILED, "--exact_forms=off"],
                  "anchor": [*ladder.CHANNELS_LAST, "--jit_mode=none", "--exact_forms=off"]}
NCU_S = 45  # python -m benchmarks.ncu_layers, estimated: the layers' autotuning, ncu's replays of about 40 kernels


def run_date(path):
    """The date a results file is named for (its name ends -YYYY-MM-DD.json)."""
    return os.path.basename(path)[-len("YYYY-MM-DD.json"):]


def measured_full(name, folder="", gpu="nvidia-h100"):
    """FULL samples/s of the rung ``name`` in the newest committed ladder results of a ``gpu`` that ran it
    (benchmarks/results/<folder>/<gpu>...-<date>.json)."""
    for path in sorted(glob.glob(os.path.join(RESULTS, folder, f"{gpu}*.json")), key=run_date, reverse=True):
        with open(path) as f:
            for run in json.load(f)["runs"]:
                if run["name"] == name and run.get("full"):
                    return run["full"]
    raise LookupError(f"no committed {gpu} run of {name!r} in benchmarks/results/{folder}")


def headline_rung_rows(name):
    """One of the headline's rungs, priced from the committed H100 run of the eager channels_last rung's process
    (gpu_suite-ladder-2026-11-25.log: start, autotuning and its 6 x 2 trials), with what the rung adds to it."""
    options = HEADLINE_RUNGS[name]
    committed = 6 * 2  # the committed rung's batches per kind of trial
    batches = HEADLINE["nbatches"] * HEADLINE["ntrials"] - committed
    rows = [(f"{name}: {' '.join(options)}; a process like the committed + channels_last rung's on an H100 "
             "(start, autotuning, 6 x 2 trials)", rung_processes("H100")[EAGER_CHANNELS_LAST])]
    if "--jit_mode=compile" in options:
        rows.append(("torch.compile's set-up (the committed compiled rung's process less the eager one's)",
                     compile_seconds()))
    if "--exact_forms=auto" in options:
        rows.append(("--exact_forms=auto: its shape probe and the forms' own autotuning (estimated)", SETUP_S["auto"]))
    rows.append((f"{batches} more batches of SYNTHETIC and FULL trials ({HEADLINE['nbatches']} x {HEADLINE['ntrials']}), "
                 "at the committed rung's FULL rate", 2 * batches * 64 / measured_full(EAGER_CHANNELS_LAST)))
    return rows


def headline_steps():
    """The headline stage's steps, most valuable first: [(step, rows)]."""
    from benchmarks.original import ORIGINAL_RUNS  # imports torch's CUDA checks only when called

    epochs = 2  # at the FULL rate of this project's rung with the same loader (the committed H100 run)
    original = [(f"the original: {entry['name']}, {epochs} epochs", 2 * SETUP_S["process"] + SETUP_S["rung"]
                 + autotune_seconds()["contiguous"] + epochs * ORIGINAL_SAMPLES / measured_full(rung, "loaders"))
                for entry, rung in ((ORIGINAL_RUNS[0], "baseline: lowmem, 2 workers"),
                                    (ORIGINAL_RUNS[1], "lowmem, 8 workers"))]
    return [("layers", [("set-up: the versions, the data set started in the background (on the CPU)", 5)]
             + layers_rows(repeats=10, in_step_steps=3)),
            ("compile-auto", headline_rung_rows("compile-auto")), ("compile-off", headline_rung_rows("compile-off")),
            ("original", original), ("ncu", [("python -m benchmarks.ncu_layers: the first and last layers, plain and "
                                              "in their forms, under ncu (estimated; not run on an H200)", NCU_S)]),
            ("anchor", headline_rung_rows("anchor") + [("the last pack and summary.txt", 5)])]


def scaling_rows(gpus=1, nbatches=20, ntrials=3, nwarmup=1, batch=64):
    rows = [("make the 256^3 data set", SETUP_S["data"])]
    options = scaling.PRESETS["gpu"]["options"] + ["--amp_mode=fp16"]  # bs64_opt's precision
    for ranks in [2 ** i for i in range(gpus.bit_length()) if 2 ** i <= gpus]:
        for mode in ("ddp", "noddp"):
            seconds = 2 * SETUP_S["process"] + trial_seconds(options, nbatches, ntrials, nwarmup, batch)
            rows.append((f"{mode} on {ranks} GPU(s)", seconds))
    return rows


MULTI_GPU_RUNS = [("ddp", "DDP: train.py, 2 ranks over NCCL"), ("fsdp", "FSDP: train.py --parallel=fsdp, 2 ranks"),
                  ("domain", "domain parallelism [2,1,1]: train.py --config=domain_demo, halos over NCCL"),
                  ("graph-ddp", "the CUDA-graph step under DDP: train_graph.py, 2 ranks")]


def steps():
    """Each stage's steps, as gpu_suite.sh runs them: {stage: [(step, rows)]}, rows (what, seconds)."""
    return {
        "headline": headline_steps(),
        "preflight": [("preflight", [("versions, memory, /dev/shm, compiler, a bf16 Conv3d, where the 3-D "
                                      "convolutions run, a profiler trace, DALI; nsys where one can write a report "
                                      "(none on the machines measured so far)", 20)])],
        "ladder": [("ladder", ladder_rows("ladder", room=MAX_BUDGET - 20))],
        "ladder-alone": [("ladder-alone", ladder_rows("alone"))],
        "batch-sweep": [("batch-sweep", ladder_rows("ladder", only=SWEEP_RUNG, sweep=SWEEP_BATCHES))],
        "original": [("original", original_rows(room=MAX_BUDGET - 20))],
        "profiles": [("profiles", profiles_rows()), ("layers", layers_rows(forms=layers_forms())),
                     ("cudnn-autotune", [("python -m benchmarks.cudnn_autotune: cuDNN autotuning's first-step "
                                          "cost (where the tree has it)", CUDNN_AUTOTUNE_S)])],
        "tests-gpu": [("tests-gpu", GPU_TESTS)],
        "tests-compile": [("tests-compile", COMPILE_TESTS)],
        "tests-distributed": [("tests-distributed", DISTRIBUTED_TESTS)],
        "graph-lesson": [("graph-lesson", graph_lesson_rows())],
        "nsys-probe": [("data", [("the 256^3 data set", SETUP_S["data"])]),
                       ("nsys-debian", [(f"Debian's 2022.4 CLI, unpacked from .carry/nsys/: train.py's profiling "
                                         f"window under nsys profile (at most {NSYS_LIMIT_S} s)", NSYS_LIMIT_S + 10)])],
        "scaling": [("scaling", scaling_rows(1))],
        # DALI's tests first: 30 s of correctness, where the loaders' rungs can run into the budget.
        "dali": [("tests-dali", DALI_TESTS), ("profile-dali", [("profile dali_bf16_fused (where DALI imports)", 45)]),
                 ("loaders", ladder_rows("loaders"))],
        "multi-gpu": [("data", [("the 256^3 data set", SETUP_S["data"])])]
        + [(name, [(what, 2 * TEST_RUN)]) for name, what in MULTI_GPU_RUNS],
    }


def layers_forms():
    """The exact forms the profiles stage's benchmarks.layers run takes for its whole step: the config's default."""
    with open(os.path.join(ROOT, "config", "UNet.yaml")) as config:
        return yaml.safe_load(config)["base"].get("exact_forms", "off")


def graph_lesson_rows():
    """benchmarks.graph_lesson's launch-bound points: per local batch one process-internal build autotuned once
    (a new batch shape: autotune_seconds()), both sides' warm-up and
    trials at the batch-8 step's rate (the committed ladder's batch-8 rung, an upper bound here)."""
    from benchmarks import graph_lesson

    steps = 20 + 5 * 100  # graph_lesson's defaults: --warmup 20, --trials 5 x --steps 100
    rows = [("a process's start", SETUP_S["process"])]
    for batch in graph_lesson.SETTINGS["launch-bound"]["batches"]:
        rows.append((f"local batch {batch}: eager and graph, {steps} steps each", SETUP_S["rung"]
                     + autotune_seconds()["new batch"]
                     + 2 * steps * 8 / ASSUMED_COMPUTE["batch 8"]))
    return rows


def step_seconds(rows):
    return math.ceil(sum(seconds for _, seconds in rows) / 10) * 10


def stage_estimate(stage_steps):
    return sum(step_seconds(rows) for _, rows in stage_steps)


def suite(stages):
    """The command that runs these stages of gpu_suite.sh, the small wheels installed first."""
    return f"{INSTALL} && benchmarks/suite/gpu_suite.sh {' '.join(stages)}"


def dali_commands(parts=DALI_PARTS):
    """DALI's install, one command per carried part, the last one running the dali stage:
    (what, command, carry, estimate, transfer)."""
    commands = [(f"DALI, part {k} of {parts}: gathered on the machine", f"mkdir -p \"{GATHER}\" && cp "
                 f".carry/{k}/site.tar.xz.* \"{GATHER}/\" && ls -la \"{GATHER}\"", [f".carry/{k}"], 5,
                 DALI_PART_TRANSFER_S) for k in range(1, parts)]
    install = (f"mkdir -p \"{GATHER}\" && cp .carry/{parts}/* \"{GATHER}/\" && (cd \"{GATHER}\" && cat site.tar.xz.? > "
               f"site.tar.xz && sha256sum -c --quiet site.sha256 && mkdir -p \"{SITE}\" && tar xJf site.tar.xz -C "
               f"\"{SITE}\") || echo 'DALI not installed: a part is missing (a new machine?) or broken; the dali stage "
               "runs without it'")
    commands.append((f"DALI, part {parts} of {parts}, its install, and the dali stage",
                     f"{INSTALL} && {{ {install}; }} && benchmarks/suite/gpu_suite.sh dali",
                     [WHEELS, CARRIED_PREFLIGHT, f".carry/{parts}"], DALI_INSTALL_S, DALI_PART_TRANSFER_S))
    return commands


# The single-GPU plan: sessions, each on a bare machine, the most valuable first; in each, commands of stages.
# ["dali"] is DALI's session: its parts, one a command, the last with the dali stage (dali_commands).
# The headline first: the numbers that decide, in one command; then the GPU-only tests (the preflight first, whose
# answer later commands carry), the distributed code on CUDA tensors, DALI, the CUDA-graph lesson, the batch sweep,
# Debian's Nsight Systems; last what the committed runs already measured on an H100 and an H200.
SINGLE_GPU = [[["headline"]], [["preflight"], ["tests-gpu", "tests-compile"]], [["tests-distributed"]], [["dali"]],
              [["graph-lesson"], ["batch-sweep"]], [["nsys-probe"], ["ladder-alone"]], [["ladder"]],
              [["scaling"], ["profiles"]], [["original"]]]
MULTI_GPU = [[["preflight"], ["multi-gpu"], ["scaling"]]]


def stage_command(stages, priced, limit):
    """The command that runs these stages: a dict of what, command, carry, estimate, budget, transfer, stages
    and steps."""
    carry = [WHEELS] if stages[0] in ("preflight", "headline") else [WHEELS, CARRIED_PREFLIGHT]
    if "nsys-probe" in stages:
        carry.append(NSYS_CARRY)
    if "original" in stages or "headline" in stages:
        carry.append(ORIGINAL_CARRY)
    return {"what": "stage " + " and ".join(stages), "stages": stages, "command": suite(stages), "carry": carry,
            "estimate": sum(stage_estimate(priced[stage]) for stage in stages),
            "transfer": DALI_PART_TRANSFER_S if NSYS_CARRY in carry else TRANSFER_S,  # the .deb: as a DALI part
            "budget": sum(budget(stage_estimate(priced[stage]), limit) for stage in stages),
            "steps": [step for stage in stages for step in priced[stage]]}


def dali_session(priced, limit):
    """DALI's commands, priced like stage_command's."""
    commands = []
    for what, command, carry, seconds, transfer in dali_commands():
        stage = "dali" if command.endswith("gpu_suite.sh dali") else None
        commands.append({"what": what, "stages": [stage] if stage else [], "command": command, "carry": carry,
                         "estimate": seconds + (stage_estimate(priced[stage]) if stage else 0), "transfer": transfer,
                         "budget": budget(seconds, limit) + budget(stage_estimate(priced[stage]), limit)
                         if stage else COPY_BUDGET,
                         "steps": priced[stage] if stage else []})
    return commands


def plan(limit=540, gpus=1, dali=True):
    """The sessions in order, each a list of its commands (stage_command's dicts)."""
    priced = steps()
    if gpus > 1:
        priced["scaling"] = [("scaling", scaling_rows(gpus))]
    sessions = []
    for session in (MULTI_GPU if gpus > 1 else SINGLE_GPU):
        commands = []
        for stages in session:
            if stages != ["dali"]:
                commands.append(stage_command(stages, priced, limit))
            elif dali:
                commands += dali_session(priced, limit)
        if commands:
            sessions.append(commands)
    return sessions


def session_seconds(commands):
    """(estimated, budgeted) device time of a session: the machine's start, every command and its transfers,
    and the idle 30 s after the last."""
    overhead = START_S + IDLE_S + sum(command["transfer"] for command in commands)
    return (overhead + sum(command["estimate"] for command in commands),
            overhead + sum(command["budget"] for command in commands))


def stage_budgets(limit=540):
    """{stage: budget}: gpu_suite.sh's BUDGET table."""
    return {stage: budget(stage_estimate(stage_steps), limit) for stage, stage_steps in steps().items()}


# What each stage of gpu_suite.sh measures or checks, and where under RESULTS it writes, for its overview.
STAGE_INFO = {
    "headline": ("the numbers that decide, most valuable first: the layers plain against their exact forms and the "
                 "step layer by layer, the best rung compiled with the forms auto and off, the original's train.py, "
                 "Nsight Compute on the first and last layers, the committed best rung again",
                 ["headline/summary.txt", "headline/layers/", "headline/<rung>.json", "headline/original/",
                  "headline/ncu/"]),
    "preflight": ("what the later stages rely on: versions, memory, the compiler, bf16 convolutions, nsys, DALI",
                  ["preflight.json"]),
    "ladder": ("the optimisation ladder's GPU-resident rungs, each adding one thing: IO, SYNTHETIC and FULL "
               "samples/s, MFU", ["<device>-<date>.md", "<device>-<date>.json"]),
    "ladder-alone": ("the GPU-resident rungs measured alone on bf16 + fused Adam (fp16, TorchScript, compile, the "
                     "exact forms, the CUDA graph, batch 8)", ["ladder-alone/"]),
    "batch-sweep": ("the ladder's top rung at local batch 64, then 128 and 256: samples/s and peak memory",
                    ["batch-sweep/"]),
    "profiles": ("per-phase step times and traces of five rungs, the layers one by one, cuDNN autotuning's first step",
                 ["profiles/", "layers/"]),
    "tests-gpu": ("the GPU-only tests: CUDA graphs, no host syncs, profiling, device prefetch, out-of-memory",
                  ["gpu_suite-tests-gpu.xml"]),
    "tests-compile": ("torch.compile's GPU tests (CUDA graphs through training and validation)",
                      ["gpu_suite-tests-compile.xml"]),
    "tests-distributed": ("DDP, FSDP, accumulation, prefetch and --resume on CUDA tensors: 2 ranks on this GPU "
                          "over gloo", ["gpu_suite-tests-distributed.xml"]),
    "scaling": ("weak scaling over this node's GPUs, DDP and --noddp", ["scaling/"]),
    "dali": ("DALI's GPU tests and profile, the ladder's DALI and host-loader rungs", ["loaders/", "profiles-dali/"]),
    "multi-gpu": ("DDP, FSDP, domain [2,1,1] and the CUDA-graph step under DDP over NCCL (2 GPUs or more)",
                  ["multi-gpu/"]),
    "graph-lesson": ("eager against the CUDA graph where the host's launches set the pace (demo width, crop 32, "
                     "local batch 1 to 8)", ["graph-lesson/"]),
    "original": ("the original tutorial's train.py (baseline, its optimisations) beside this project's rungs, on the "
                 "same data: samples/s and ratios", ["original/"]),
    "nsys-probe": ("whether Debian's Nsight Systems 2022.4 CLI writes a report of train.py's profiling window",
                   ["nsys-probe/"]),
}
COMMITTED_LOGS = os.path.join(ROOT, "benchmarks", "results", "gpu_suite")


def committed_time(stage, gpu="H100"):
    """(seconds, status, log) of the latest committed run of ``stage`` on a ``gpu`` (its name in the log's
    nvidia-smi line), or None: read from benchmarks/results/gpu_suite/gpu_suite-<stage>-<date>.log."""
    found = None
    for log in sorted(glob.glob(os.path.join(COMMITTED_LOGS, f"gpu_suite-{stage}-*.log"))):
        text = open(log).read()
        lines = text.splitlines()
        ended = re.search(rf"stage {re.escape(stage)} ended with status (\d+) after (\d+) s", text)
        if len(lines) > 1 and gpu in lines[1] and ended:
            found = int(ended.group(2)), int(ended.group(1)), os.path.relpath(log, ROOT)
    return found


def stage_overview(stages, results=SUITE_RESULTS):
    """One paragraph per stage: what it measures, where it writes, and how long it took on an H100 in the
    committed logs (or on an H200 where no H100 ran it)."""
    lines = []
    for stage in stages:
        what, where = STAGE_INFO[stage]
        times = []
        for gpu in ("H100", "H200"):
            measured = committed_time(stage, gpu)
            if measured:
                seconds, status, log = measured
                failed = f" (ended with status {status}: see its log)" if status else ""
                times.append(f"on an {gpu}: {seconds} s{failed}, {log}")
            elif gpu == "H100":
                times.append("on an H100: not measured")
        lines.append(f"  {stage}: {what}.\n      results: {', '.join(os.path.join(results, path) for path in where)}"
                     f"\n      time {'; '.join(times)}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=540, help="STAGE_LIMIT: seconds a stage may run")
    parser.add_argument("--gpus", type=int, default=1, help="the machine's GPUs: 2 or more for the multi-GPU plan")
    parser.add_argument("--no_dali", action="store_true", help="leave DALI's install out (its rung and tests skip)")
    parser.add_argument("--overview", nargs="+", metavar="STAGE", help="print what these stages measure, where "
                        "they write (under --results) and their time in the committed logs, and stop")
    parser.add_argument("--results", default=SUITE_RESULTS, help="gpu_suite.sh's RESULTS, for --overview")
    args = parser.parse_args(argv)
    if args.overview:
        print(stage_overview(args.overview, args.results))
        return 0
    sessions = plan(args.limit, args.gpus, dali=not args.no_dali)
    commands = [command for session in sessions for command in session]
    dali = any(command["what"].startswith("DALI") for command in commands)
    print(f"GPU suite plan for a machine with {args.gpus} GPU(s): {len(commands)} commands in {len(sessions)} "
          f"session(s), the most valuable first, for a remote GPU machine with a time limit. A session is one use "
          f"of a machine that starts bare, with {SESSION_S // 60} min of device time for the machine's start, "
          f"its commands, their transfers and the idle {IDLE_S} s after its last command; sessions may be days "
          "apart. A session's commands are sent back to back (each within 30 s of the last, or the machine and what "
          "it holds are gone). Each command stands on its own: it installs the small wheels it "
          "carries, reads nothing an earlier command left on the machine" + " but DALI's gathered parts" * dali
          + ", and its results come back from $OUT (the archives gpu_suite_<stage>.tgz). Estimates: the original "
          "tutorial's A100 throughputs (an H100 or H200 is faster), set-up, transfers and GPU tests estimated; "
          "budgets: what gpu_suite.sh enforces; timeout_s: the budget and 30 s.")
    if args.gpus == 1:
        print("\nOne GPU runs DDP, FSDP and accumulation with two ranks over gloo (stage tests-distributed; NCCL "
              "refuses two ranks on one GPU). NCCL itself, domain [2,1,1] with its halo exchange on CUDA tensors, "
              "the CUDA-graph step under DDP and the weak-scaling points past one GPU are the plan for a machine "
              "with several GPUs: benchmarks/suite/gpu_suite.sh --plan --gpus 4.")
    last = f".carry/{DALI_PARTS}"
    print(f"\nBefore the first session, in the ignored folder .carry/: the wheels of {', '.join(SMALL_WHEELS)} for "
          f"the machine's Python 3.12 in {WHEELS}/ (python -m pip download --no-deps --only-binary=:all: "
          f"--python-version 3.12 --platform manylinux2014_x86_64 -d {WHEELS} {' '.join(SMALL_WHEELS)})"
          + (f"; before DALI's session, DALI: benchmarks/suite/pack_dali.sh (its wheels from PyPI, unzipped into one "
             f"site folder, a tar.xz of it cut into {DALI_PARTS} parts in .carry/1 .. {last}, the tar's sha256 in "
             f"{last}/site.sha256; xz -9 takes about 3 min on 2 cores); check them here with: cat .carry/[0-9]*/"
             f"site.tar.xz.? | sha256sum (the sum in {last}/site.sha256)"
             if dali else "") + ".")
    if any("nsys-probe" in command["stages"] for command in commands):
        print(f"Before the nsys-probe session, Debian's Nsight Systems 2022.4 CLI in {NSYS_CARRY}/ (34 MB; not "
              f"tracked): python -m benchmarks.nsight fetch --dir {NSYS_CARRY} nsight-systems-target (from Debian's "
              "contrib non-free, with an apt configuration of its own); without it that route says so and the "
              "stage goes on. A .qdstrm capture a route brings back becomes a report here: python -m "
              "benchmarks.nsight install, then python -m benchmarks.nsight import <capture>.qdstrm.")
    if any(ORIGINAL_CARRY in command["carry"] for command in commands):
        print(f"Before the first session, a copy of the original tutorial's checkout in {ORIGINAL_CARRY}/ (not "
              f"tracked; about 200 KB): cp -r ../shared/sc22/original {ORIGINAL_CARRY}, or a clone of "
              "NERSC/sc22-dl-tutorial; without it the headline's and the original stage's runs of it say so and "
              "are not run.")
    if any(command["stages"] == ["headline"] for command in commands):
        print("The headline command: call give_back as soon as it returns (what comes back is $OUT's archive, "
              "gpu_suite_headline.tgz; headline/summary.txt in it says what ran).")
    preflight = next(number for number, command in enumerate(commands, start=1) if "preflight" in command["stages"])
    print(f"After command {preflight} (the preflight), within the 30 s: mkdir -p {CARRIED_PREFLIGHT} && tar xzf <its files>/gpu_suite_"
          f"preflight.tgz -O {SUITE_RESULTS}/preflight.json > {CARRIED_PREFLIGHT}/preflight.json (the "
          "preflight's nsys answer, carried by the commands after it, in later sessions too; without it the "
          "profiles stage probes nsys again, at most 45 s).")
    fits = True
    number = 0
    for index, session in enumerate(sessions, start=1):
        stages = [stage for command in session for stage in command["stages"]]
        parts = [command for command in session if command["what"].startswith("DALI")]
        print(f"\nSession {index} of {len(sessions)}: " + (f"DALI's {len(parts)} parts, one a command, the last "
              "with " if parts else "") + f"stage{'s' * (len(stages) > 1)} {', '.join(stages)}")
        for command in session:
            number += 1
            ok = command["estimate"] <= command["budget"] <= args.limit
            fits &= ok
            print(f"\n{number:2d}. {command['what']}: budget {command['budget']} s, about {command['estimate']} s"
                  f"; carry {', '.join(command['carry'])}; timeout_s {min(600, command['budget'] + 30)} "
                  f"({'fits' if ok else 'DOES NOT FIT'})")
            print(f"    $ {command['command']}")
            for step, rows in command["steps"]:
                print(f"      step {step}: about {step_seconds(rows)} s")
                for what, seconds in rows:
                    print(f"        {seconds:6.0f} s  {what}")
        estimated, budgeted = session_seconds(session)
        transfers = sum(command["transfer"] for command in session)
        holds = budgeted <= SESSION_S - MARGIN_S
        fits &= holds
        print(f"\nsession {index}: about {(estimated - START_S - IDLE_S) / 60:.1f} min of commands and transfers "
              f"({transfers} s of transfers, estimated); with the machine's start ({START_S} s) and the idle "
              f"{IDLE_S} s after its last command: about {estimated / 60:.1f} min, at most {budgeted / 60:.1f} min "
              f"if every command used its whole budget, of the {SESSION_S // 60} min of device time a session has "
              f"({'fits, with ' + str(SESSION_S - budgeted) + ' s to spare' if holds else 'DOES NOT FIT'}).")
    total = sum(session_seconds(session)[1] for session in sessions)
    print(f"\nall sessions: {len(sessions)}, at most {total / 60:.1f} min of device time together "
          f"({'each fits its ' + str(SESSION_S // 60) + ' min' if fits else 'DOES NOT FIT'}).")
    return 0 if fits else 1


if __name__ == "__main__":
    raise SystemExit(main())
