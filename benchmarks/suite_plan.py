"""The commands that run ``benchmarks/gpu_suite.sh`` on a lent GPU machine, in order, each with its budget.

    benchmarks/gpu_suite.sh --plan             # = python -m benchmarks.suite_plan --limit 540
    benchmarks/gpu_suite.sh --plan --gpus 4    # the multi-GPU checks, for a machine with 4 GPUs

Runs anywhere, no GPU needed. A lent machine is held 30 minutes at most, whatever runs, gives
a command 10 minutes, goes back 30 seconds after a command ends, and may be replaced by a bare
one between two commands. So the plan is commands that each stand on their own, sent back to back,
the most valuable first: each starts by installing the small wheels it carries (ruamel.yaml, which
every script imports) into a fresh folder, reads nothing an earlier command left on the machine,
and returns its results from ``$OUT``. DALI's wheels, too large for one command, gather on the
machine over several commands after every stage that does not need them; the command that
completes their install runs the DALI rung and DALI's tests. Each command is priced: its stages'
estimates, their budgets (what gpu_suite.sh enforces: its ``BUDGET`` table, which a test keeps
equal to these), the transfers, and the machine's start; the whole plan must fit one hold with
a margin (:data:`HOLD_S`, :data:`MARGIN_S`).

The estimates read the rungs, trial sizes and batches from the benchmark tools themselves and
price them with the throughputs in :data:`ASSUMED_IO` and :data:`ASSUMED_COMPUTE`: the original
tutorial's A100 figures (README of the SC22 tutorial), which an H100 or H200 exceeds, so they are
upper bounds for such a GPU. Set-up costs, transfers and the GPU tests' costs are estimates (no
GPU run of this code has measured them yet), marked as such.

One GPU gives the multi-GPU code no coverage: at world size 1 no process group is made, and NCCL
refuses two ranks on one GPU. DDP, FSDP, domain parallelism over NCCL and the CUDA-graph step
under DDP are the ``multi-gpu`` stage of the plan for a machine with several GPUs (``--gpus N``),
with the weak-scaling points, which on one GPU measure nothing the ladder does not.
"""
import argparse
import math
import os

import yaml

from benchmarks import ladder, profiles, scaling
from benchmarks.common import ROOT
from benchmarks.layers import PRESETS as LAYER_PRESETS
from benchmarks.trials import warmup_trials

# Samples per second assumed for a rung (batch 64): what its loader delivers (IO) and what its step
# computes (SYNTHETIC); FULL is the slower of the two. The original tutorial's A100 figures where it
# has them; the GPU-resident loader's IO, which it lacks, put below its DALI IO (944) to be safe.
ASSUMED_IO = {"lowmem, 2 workers": 85, "lowmem, 8 workers": 199, "dali": 944, "gpu-inmem": 900}
ASSUMED_COMPUTE = {"fp32": 482, "amp": 820, "batch 8": 400}  # TF32 baseline, fp16 AMP, batch 8 (launch-bound)
# Seconds, estimated: a rung's build (model, optimiser, loader; cuDNN's autotuning lands in its warm-up
# trial), a process's start (Python, torch, CUDA), the data set (measured: 19 s for 256^3 on the
# project's 2-core CPU machine), a train.py run of the tiny test config on a GPU.
SETUP_S = {"rung": 10, "compile": 90, "graph": 10, "dali": 15, "data": 20, "process": 6, "test run": 20}
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
DALI_TESTS = [("tests/test_data_loader_dali.py on the GPU: two loaders compared (no train.py runs)", 20),
              ("pytest's start and collection", 10)]
DALI_PARTS = 5        # DALI for CUDA 13 and what it imports, about 250 MB, carried in parts of 55 MiB
DALI_INSTALL_S = 40   # joining the parts, their checksums and pip's install: estimated
COPY_BUDGET = 10      # a part's command: a copy of 55 MiB on the machine
CUDNN_AUTOTUNE_S = 60  # python -m benchmarks.cudnn_autotune: the first step with and without autotuning
# Where each command installs what it carries, and gathers DALI's parts: under $HOME (/root on a lent
# machine, where commands run as root), which a bare machine has empty.
SITE = "${HOME:-/root}/site"
GATHER = "${HOME:-/root}/carry"
# requirements.txt's packages that the lent machine lacks (it has torch, numpy, h5py, pyyaml,
# tensorboard, matplotlib, tqdm): small wheels, carried whole by every command.
SMALL_WHEELS = ["ruamel.yaml"]
WHEELS = ".carry/wheels"
CARRIED_PREFLIGHT = ".carry/preflight"  # the preflight's answer, for the commands after it
SUITE_RESULTS = "runs/benchmarks/gpu_suite"  # gpu_suite.sh's RESULTS: the archives hold its files under it
INSTALL = (f"python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target \"{SITE}\" {WHEELS}/*.whl "
           f"&& export PYTHONPATH=\"{SITE}${{PYTHONPATH:+:$PYTHONPATH}}\"")
# The lent machine: 30 minutes held at most; 1-2 minutes to start; given back 30 s after a command; the
# working tree (3-4 MiB) and the results travel with every command, a DALI part's 55 MiB with some.
HOLD_S = 1800
START_S = 120
IDLE_S = 30
TRANSFER_S = 5
DALI_PART_TRANSFER_S = 15
MARGIN_S = 60          # left over when every command used its whole budget
COMMANDS_S = 25 * 60   # what the estimates may take together, starts and transfers included
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
    """A rung's process and build, and what runs before its trials: the compilation, or the graph's
    warm-up and capture."""
    text = " ".join(options)
    seconds = (SETUP_S["process"] + SETUP_S["rung"] + SETUP_S["compile"] * ("--jit_mode=compile" in text)
               + SETUP_S["dali"] * ("dali" in text))
    if script == "train_graph.py":
        seconds += SETUP_S["graph"] + (GRAPH_WARMUP_STEPS + 2) * batch / rung_rates(options)[1]
    return seconds


# Rungs the plan keeps room for before the ladder has them (priced like the rung they extend).
RESERVED_RUNGS = [ladder.Rung("lowmem, 8 workers + device prefetch (room kept for it)",
                              ["--data_loader_config=lowmem", "--num_data_workers=8", "--device_prefetch=true"],
                              nbatches=5)]


def ladder_rows(group, nbatches=LADDER["nbatches"], ntrials=LADDER["ntrials"], nwarmup=LADDER["nwarmup"], batch=64):
    rows = [("make the 256^3 data set and its .npy copies", SETUP_S["data"])]
    rungs = ladder.rungs_for("gpu", dali=True, group=group)
    if group == "loaders" and not any("--device_prefetch=true" in rung.options for rung in rungs):
        rungs = rungs + RESERVED_RUNGS
    for rung in rungs:
        size = 8 if "--global_batch_size=8" in " ".join(rung.options) else batch
        batches = min(nbatches, rung.nbatches or nbatches)
        rows.append((f"{rung.name} (a process of its own)", rung_setup(rung.options, rung.script, size)
                     + trial_seconds(rung.options, batches, ntrials, nwarmup, size)))
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


def layers_rows(batch=64):
    # The layers one by one cost about one step together; then the whole step: two steps per timed call.
    calls = LAYER_PRESETS["gpu"]["repeats"] + 2
    return [(f"python -m benchmarks.layers (the layers and a step, {calls} calls each)",
             SETUP_S["process"] + 2 * calls * batch / ASSUMED_COMPUTE["amp"])]


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
        "preflight": [("preflight", [("versions, memory, /dev/shm, compiler, a bf16 Conv3d, where the 3-D "
                                      "convolutions run, a profiler trace, DALI", 20),
                                     ("nsys: a report of a short CUDA program (ended at 30 s)", 20)])],
        "ladder": [("ladder", ladder_rows("gpu"))],
        "profiles": [("profiles", profiles_rows()), ("layers", layers_rows()),
                     ("cudnn-autotune", [("python -m benchmarks.cudnn_autotune: cuDNN autotuning's first-step "
                                          "cost (where the tree has it)", CUDNN_AUTOTUNE_S)])],
        "tests-gpu": [("tests-gpu", GPU_TESTS)],
        "tests-compile": [("tests-compile", COMPILE_TESTS)],
        "scaling": [("scaling", scaling_rows(1))],
        # DALI's tests first: 30 s of correctness, where the loaders' rungs can run into the budget.
        "dali": [("tests-dali", DALI_TESTS), ("profile-dali", [("profile dali_bf16_fused (where DALI imports)", 45)]),
                 ("loaders", ladder_rows("loaders"))],
        "multi-gpu": [("data", [("the 256^3 data set", SETUP_S["data"])])]
        + [(name, [(what, 2 * TEST_RUN)]) for name, what in MULTI_GPU_RUNS],
    }


def step_seconds(rows):
    return math.ceil(sum(seconds for _, seconds in rows) / 10) * 10


def stage_estimate(stage_steps):
    return sum(step_seconds(rows) for _, rows in stage_steps)


def suite(stages):
    """The command that runs these stages of gpu_suite.sh, the small wheels installed first."""
    return f"{INSTALL} && benchmarks/gpu_suite.sh {' '.join(stages)}"


def dali_commands(parts=DALI_PARTS):
    """DALI's install, one command per carried part, the last one running the dali stage:
    (what, command, carry, estimate, transfer)."""
    commands = [(f"DALI wheels, part {k} of {parts}: gathered on the machine", f"mkdir -p \"{GATHER}\" && cp "
                 f".carry/{k}/part.* \"{GATHER}/\" && ls -la \"{GATHER}\"", [f".carry/{k}"], 5, DALI_PART_TRANSFER_S)
                for k in range(1, parts)]
    install = (f"mkdir -p \"{GATHER}\" && cp .carry/{parts}/* \"{GATHER}/\" && (cd \"{GATHER}\" && cat part.* | tar xf - "
               f"&& sha256sum -c --quiet manifest && python3 -m pip install -q --no-index --no-deps --no-compile "
               f"--upgrade --target \"{SITE}\" ./*.whl) || echo 'DALI not installed: a part is missing (a new machine?) or "
               "broken; the dali stage runs without it'")
    commands.append((f"DALI wheels, part {parts} of {parts}, their install, and the dali stage",
                     f"{INSTALL} && {{ {install}; }} && benchmarks/gpu_suite.sh dali",
                     [WHEELS, CARRIED_PREFLIGHT, f".carry/{parts}"], DALI_INSTALL_S, DALI_PART_TRANSFER_S))
    return commands


# The single-GPU plan: commands of stages, most valuable first; DALI's parts after the rest.
# The weak-scaling stage is the multi-GPU plan's: on one GPU its DDP and --noddp runs are the same run.
SINGLE_GPU = [["preflight"], ["ladder"], ["profiles"], ["tests-gpu", "tests-compile"]]
MULTI_GPU = [["preflight"], ["multi-gpu"], ["scaling"]]


def plan(limit=540, gpus=1, dali=True):
    """The commands in order: dicts of what, command, carry, estimate, budget, transfer and stages."""
    priced = steps()
    if gpus > 1:
        priced["scaling"] = [("scaling", scaling_rows(gpus))]
    commands = []
    for stages in (MULTI_GPU if gpus > 1 else SINGLE_GPU):
        estimate = sum(stage_estimate(priced[stage]) for stage in stages)
        carry = [WHEELS] if stages == ["preflight"] else [WHEELS, CARRIED_PREFLIGHT]
        commands.append({"what": "stage " + " and ".join(stages), "stages": stages, "command": suite(stages),
                         "carry": carry, "estimate": estimate, "transfer": TRANSFER_S,
                         "budget": sum(budget(stage_estimate(priced[stage]), limit) for stage in stages),
                         "steps": [step for stage in stages for step in priced[stage]]})
    if dali and gpus == 1:
        for what, command, carry, seconds, transfer in dali_commands():
            stage = "dali" if command.endswith("gpu_suite.sh dali") else None
            estimate = seconds + (stage_estimate(priced[stage]) if stage else 0)
            commands.append({"what": what, "stages": [stage] if stage else [], "command": command, "carry": carry,
                             "estimate": estimate, "transfer": transfer,
                             "budget": budget(seconds, limit) + budget(stage_estimate(priced[stage]), limit)
                             if stage else COPY_BUDGET,
                             "steps": priced[stage] if stage else []})
    return commands


def hold(commands):
    """(estimated, budgeted) seconds of the hold: the machine's start, every command and its transfers,
    and the idle 30 s after the last."""
    overhead = START_S + IDLE_S + sum(command["transfer"] for command in commands)
    return (overhead + sum(command["estimate"] for command in commands),
            overhead + sum(command["budget"] for command in commands))


def stage_budgets(limit=540):
    """{stage: budget}: gpu_suite.sh's BUDGET table."""
    return {stage: budget(stage_estimate(stage_steps), limit) for stage, stage_steps in steps().items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=540, help="STAGE_LIMIT: seconds a stage may run")
    parser.add_argument("--gpus", type=int, default=1, help="the machine's GPUs: 2 or more for the multi-GPU plan")
    parser.add_argument("--no_dali", action="store_true", help="leave DALI's install out (its rung and tests skip)")
    args = parser.parse_args(argv)
    commands = plan(args.limit, args.gpus, dali=not args.no_dali)
    print(f"GPU suite plan for a machine with {args.gpus} GPU(s): {len(commands)} commands, sent back to back to "
          "one lent machine (each within 30 s of the last, or the machine and what it holds are gone). Each "
          "command stands on its own: it installs the small wheels it carries, reads nothing an earlier command "
          "left on the machine, and its results come back from $OUT (the archives gpu_suite_<stage>.tgz). "
          "Estimates: the original tutorial's A100 throughputs (an H100 or H200 is faster), set-up, transfers "
          "and GPU tests estimated; budgets: what gpu_suite.sh enforces; timeout_s: the budget and 30 s.")
    if args.gpus == 1:
        print("\nOne GPU gives the multi-GPU code no coverage (world size 1 makes no process group; NCCL refuses "
              "two ranks on one GPU): DDP, FSDP, domain [2,1,1] over NCCL, the CUDA-graph step under DDP and "
              "the weak-scaling points are the plan for a machine with several GPUs: "
              "benchmarks/gpu_suite.sh --plan --gpus 4.")
    print(f"\nBefore the first command, in the ignored folder .carry/: the wheels of {', '.join(SMALL_WHEELS)} for "
          f"the machine's Python 3.12 in {WHEELS}/ (python -m pip download --no-deps --only-binary=:all: "
          f"--python-version 3.12 --platform manylinux2014_x86_64 -d {WHEELS} {' '.join(SMALL_WHEELS)})"
          + (f"; DALI's wheels, cut into {DALI_PARTS} parts in .carry/1 .. .carry/{DALI_PARTS} with a sha256 "
             "manifest in the last (../shared/gpu/pack-wheels.sh); check them here with: cat .carry/*/part.* | "
             "tar tf -" if any(command["what"].startswith("DALI") for command in commands) else "") + ".")
    print(f"After command 1, within the 30 s: mkdir -p {CARRIED_PREFLIGHT} && tar xzf <its files>/gpu_suite_"
          f"preflight.tgz -O {SUITE_RESULTS}/preflight.json > {CARRIED_PREFLIGHT}/preflight.json (the "
          "preflight's nsys answer, carried by the commands after it; without it the profiles stage probes nsys "
          "again, at most 45 s).")
    fits = True
    for number, command in enumerate(commands, start=1):
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
    estimated, budgeted = hold(commands)
    transfers = sum(command["transfer"] for command in commands)
    holds = budgeted <= HOLD_S - MARGIN_S and estimated <= START_S + COMMANDS_S
    fits &= holds
    print(f"\nall commands: about {(estimated - START_S - IDLE_S) / 60:.1f} min of commands and transfers "
          f"({transfers} s of transfers, estimated); the hold, with the machine's start ({START_S} s) and the "
          f"idle {IDLE_S} s after the last command: about {estimated / 60:.1f} min, at most {budgeted / 60:.1f} min "
          f"if every command used its whole budget, of the {HOLD_S // 60} min a machine is held "
          f"({'fits, with ' + str(HOLD_S - budgeted) + ' s to spare' if holds else 'DOES NOT FIT'}).")
    return 0 if fits else 1


if __name__ == "__main__":
    raise SystemExit(main())
