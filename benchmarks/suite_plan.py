"""The commands that run ``benchmarks/gpu_suite.sh`` on a lent GPU machine, in order, each with its budget.

    benchmarks/gpu_suite.sh --plan          # = python -m benchmarks.suite_plan --limit 540

Runs anywhere, no GPU needed. It prints one ready-to-paste command per stage, the preflight first
(which also installs the small wheels the machine lacks) and DALI's install in commands of its own
before the stages that use it, each with the ignored folders it must carry, its budget and what it
should take. The budgets are the ones gpu_suite.sh
enforces (its ``BUDGET`` table; a test keeps the two equal), derived here from the estimates:
half as much again plus a minute of start-up, and never more than 530 s of a command's 540.

The estimates read the rungs, trial sizes and batches from the benchmark tools themselves and
price them with the throughputs in :data:`ASSUMED_IO` and :data:`ASSUMED_COMPUTE`: the original
tutorial's A100 figures (README of the SC22 tutorial), which an H100 or H200 exceeds, so they are
upper bounds for such a GPU. Set-up costs and the GPU tests' costs are estimates (no GPU run of
this code has measured them yet), marked as such; the CPU tests' cost was measured.
"""
import argparse
import math
import os

import yaml

from benchmarks import ladder, profiles, scaling
from benchmarks.common import ROOT
from benchmarks.layers import PRESETS as LAYER_PRESETS

# Samples per second assumed for a rung (batch 64): what its loader delivers (IO) and what its step
# computes (SYNTHETIC); FULL is the slower of the two. The original tutorial's A100 figures where it
# has them; the GPU-resident loader's IO, which it lacks, put below its DALI IO (944) to be safe.
ASSUMED_IO = {"lowmem, 2 workers": 85, "lowmem, 8 workers": 199, "dali": 944, "gpu-inmem": 900}
ASSUMED_COMPUTE = {"fp32": 482, "amp": 820, "batch 8": 400}  # TF32 baseline, fp16 AMP, batch 8 (launch-bound)
# Seconds of set-up, estimated; the data set's measured: 19 s for 256^3 on the project's 2-core CPU machine.
SETUP_S = {"rung": 10, "compile": 90, "graph": 10, "dali": 15, "data": 20, "process": 20}
LADDER = {"nbatches": 15, "ntrials": 3, "nwarmup": 1}  # what gpu_suite.sh passes to the ladder
with open(os.path.join(ROOT, "config", "UNet.yaml")) as config:
    # train_graph.py's eager steps before its capture: the ladder runs them, and the capture, before the trials.
    GRAPH_WARMUP_STEPS = yaml.safe_load(config)["base"]["graph_warmup_steps"]
CPU_TESTS_MEASURED = "85 s for 356 tests on the project's 2-core CPU machine, 2026-11-24"
# The GPU-only tests, estimated: runs of train.py on the tiny test config, 20-30 s each with start-up
# (CUDA's, cuDNN's autotuning and deterministic algorithms included).
GPU_TESTS = [("tests/test_train_graph.py: 3 precisions x (eager + graph) runs", 180),
             ("tests/test_gpu_paths.py but compile: the profiling window, a resume (3 runs)", 60),
             ("the loaders, metrics and symmetry on the GPU (no train.py runs)", 30),
             ("pytest's start and collection", 10)]
COMPILE_TESTS = [("tests/test_gpu_paths.py compile: two epochs, reduce-overhead, training and validation "
                  "compiled", 150), ("pytest's start and collection", 10)]
DALI_PARTS = 5        # DALI for CUDA 13 and what it imports, about 250 MB, carried in parts of 55 MiB
SITE = "/root/site"   # where the carried wheels are installed on the lent machine; every stage imports from it
# requirements.txt's packages that the lent machine lacks (it has torch, numpy, h5py, pyyaml,
# tensorboard, matplotlib, tqdm): small wheels, carried whole with the preflight's command.
SMALL_WHEELS = ["ruamel.yaml"]
WHEELS = ".carry/wheels"
MAX_BUDGET = 530      # of the 540 s a lent machine's command may run: 10 s for the reply


def budget(estimate, limit=540):
    """A stage's budget: its estimate and half as much again, plus a minute, within the command limit."""
    return min(math.ceil((1.5 * estimate + 60) / 10) * 10, MAX_BUDGET, limit)


def rung_rates(options):
    """(IO, SYNTHETIC) samples/s assumed for a rung with these train.py options."""
    text = " ".join(options)
    loader = ("lowmem, 8 workers" if "--num_data_workers=8" in text else "lowmem, 2 workers") \
        if "=lowmem" in text else "dali" if "dali" in text else "gpu-inmem"
    compute = "batch 8" if "--global_batch_size=8" in text else "amp" if "--amp_mode" in text else "fp32"
    return ASSUMED_IO[loader], ASSUMED_COMPUTE[compute]


def trial_seconds(options, samples_per_trial):
    """IO, SYNTHETIC and FULL trials (warm-ups included) of ``samples_per_trial`` samples each."""
    io, compute = rung_rates(options)
    return samples_per_trial * (1 / io + 1 / compute + 1 / min(io, compute))


def rung_setup(options, script="train.py", batch=64):
    """Building a rung, and what runs before its trials: the compilation, or the graph's warm-up and capture."""
    text = " ".join(options)
    seconds = SETUP_S["rung"] + SETUP_S["compile"] * ("--jit_mode=compile" in text) + SETUP_S["dali"] * ("dali" in text)
    if script == "train_graph.py":
        seconds += SETUP_S["graph"] + (GRAPH_WARMUP_STEPS + 2) * batch / rung_rates(options)[1]
    return seconds


def ladder_rows(nbatches=LADDER["nbatches"], ntrials=LADDER["ntrials"], nwarmup=LADDER["nwarmup"], batch=64):
    rows = []
    for rung in ladder.rungs_for("gpu", dali=True):
        size = 8 if "--global_batch_size=8" in " ".join(rung.options) else batch
        batches = min(nbatches, rung.nbatches or nbatches)
        seconds = rung_setup(rung.options, rung.script, size) + trial_seconds(rung.options,
                                                                               (nwarmup + ntrials) * batches * size)
        rows.append((rung.name, seconds))
    return [("make the 256^3 data set and its .npy copies (once per machine)", SETUP_S["data"])] + rows


def profiles_rows(steps=4, batch=64):
    rows = [("nsys probe (when the preflight saw nsys write a report)", 30)]
    for slug, _, script, options in profiles.GPU_RUNGS:
        # two epochs of steps + 4 batches (one validation batch each), in a fresh process
        _, compute = rung_rates(options)
        seconds = SETUP_S["process"] + rung_setup(options, script) + 2 * (steps + 4) * batch / compute
        rows.append((f"profile {slug}", seconds))
    return rows


def layers_rows(batch=64):
    # The layers one by one cost about one step together; then the whole step: two steps per timed call.
    calls = LAYER_PRESETS["gpu"]["repeats"] + 2
    return [(f"python -m benchmarks.layers (the layers and a step, {calls} calls each)",
             SETUP_S["rung"] + 2 * calls * batch / ASSUMED_COMPUTE["amp"])]


def scaling_rows(gpus=1, nbatches=20, ntrials=3, nwarmup=1, batch=64):
    rows = []
    options = scaling.PRESETS["gpu"]["options"] + ["--amp_mode=fp16"]  # bs64_opt's precision
    for ranks in [2 ** i for i in range(gpus.bit_length()) if 2 ** i <= gpus]:
        for mode in ("ddp", "noddp"):
            seconds = SETUP_S["process"] + trial_seconds(options, (nwarmup + ntrials) * nbatches * batch)
            rows.append((f"{mode} on {ranks} GPU(s)", seconds))
    return rows


def steps(gpus=1):
    """Each stage's steps, as gpu_suite.sh runs them: {stage: [(step, rows)]}, rows (what, seconds)."""
    return {
        "preflight": [("preflight", [("versions, memory, /dev/shm, compiler, a bf16 Conv3d, a profiler trace", 25),
                                     ("nsys: a report of a short CUDA program (ended at 60 s)", 20)])],
        "tests-gpu": [("tests-gpu", GPU_TESTS)],
        "tests-compile": [("tests-compile", COMPILE_TESTS)],
        "tests-cpu": [("tests-cpu", [(f"the fast CPU tests (measured: {CPU_TESTS_MEASURED})", 85),
                                     ("a newer torch, more tests since: estimated", 35)])],
        "ladder": [("ladder", ladder_rows())],
        "profiles": [("profiles", profiles_rows()), ("layers", layers_rows())],
        "scaling": [("scaling", scaling_rows(gpus))],
    }


def step_seconds(rows):
    return math.ceil(sum(seconds for _, seconds in rows) / 10) * 10


def stage_estimate(stage_steps):
    return sum(step_seconds(rows) for _, rows in stage_steps)


def dali_commands(parts=DALI_PARTS, site=SITE):
    """DALI's install, one command per carried part: (what, command, carry, estimate)."""
    commands = [(f"DALI wheels, part {k} of {parts}", f"mkdir -p /root/carry && cp .carry/{k}/part.* /root/carry/ "
                 "&& ls -la /root/carry", f".carry/{k}", 10) for k in range(1, parts)]
    commands.append((f"DALI wheels, part {parts} of {parts}, and their install",
                     f"cp .carry/{parts}/* /root/carry/ && cd /root/carry && cat part.* | tar xf - && sha256sum -c "
                     f"manifest && python3 -m pip install -q --no-index --no-deps --no-compile --target {site} "
                     f"./*.whl && cd - && PYTHONPATH={site} python3 -c 'import nvidia.dali as d; "
                     "print(\"DALI\", d.__version__)'", f".carry/{parts}", 40))
    return commands


ORDER = ["preflight", "dali", "tests-gpu", "tests-compile", "tests-cpu", "ladder", "profiles", "scaling"]
USES_DALI = {"tests-gpu", "ladder"}  # the DALI rung and DALI's GPU tests: its install comes before them


def plan(limit=540, gpus=1, stages=None, dali=True):
    """The commands in order: dicts of what, command, carry, estimate and budget (and the stage's steps)."""
    stages = stages or [stage for stage in ORDER if stage != "dali"]
    priced = steps(gpus)
    commands = []
    for stage in ORDER:
        if stage == "dali":
            if dali and USES_DALI & set(stages):
                commands += [{"what": what, "command": command, "carry": carry, "estimate": seconds,
                              "budget": budget(seconds, limit), "steps": []}
                             for what, command, carry, seconds in dali_commands()]
            continue
        if stage not in stages:
            continue
        estimate = stage_estimate(priced[stage])
        command = f"PYTHONPATH={SITE} benchmarks/gpu_suite.sh {stage}"
        carry = None
        if not commands:  # the first command also installs the small wheels (if any were carried)
            command = (f"(ls {WHEELS}/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps "
                       f"--no-compile --target {SITE} {WHEELS}/*.whl); {command}")
            carry = WHEELS
        commands.append({"what": f"stage {stage}", "stage": stage, "command": command, "carry": carry,
                         "estimate": estimate, "budget": budget(estimate, limit), "steps": priced[stage]})
    return commands


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=540, help="STAGE_LIMIT: seconds a command may run")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs of the node (the scaling stage's sizes)")
    parser.add_argument("--no_dali", action="store_true", help="leave DALI's install out (its rung and tests skip)")
    parser.add_argument("stages", nargs="*", default=None, help="default: all, in order")
    args = parser.parse_args(argv)
    commands = plan(args.limit, args.gpus, args.stages, dali=not args.no_dali)
    print(f"GPU suite plan: {len(commands)} commands (a stage, or a part of DALI's install, each), sent back to back to one lent machine "
          "(each within 30 s of the last, or the machine and what it holds are gone); each command's results "
          "come back from $OUT. Estimates: the original tutorial's A100 throughputs (an H100 or H200 is faster), "
          "set-up and GPU tests estimated; budgets: what gpu_suite.sh enforces.")
    print(f"\nBefore the first command, in the ignored folder .carry/: the wheels of {', '.join(SMALL_WHEELS)} for "
          f"the machine's Python 3.12 in {WHEELS}/ (python -m pip download --no-deps --only-binary=:all: "
          f"--python-version 3.12 --platform manylinux2014_x86_64 -d {WHEELS} {' '.join(SMALL_WHEELS)})"
          + (f"; DALI's wheels (requirements-dali.txt and what they import, with a sha256 manifest), cut into "
             f"{DALI_PARTS} parts in .carry/1 .. .carry/{DALI_PARTS}, the manifest in the last; check them here "
             "with: cat .carry/*/part.* | tar tf -" if any(c["what"].startswith("DALI") for c in commands) else ""))
    fits = True
    for number, command in enumerate(commands, start=1):
        fits &= command["estimate"] <= command["budget"] <= args.limit
        carry = f"; carry {command['carry']}" if command["carry"] else ""
        print(f"\n{number:2d}. {command['what']}: budget {command['budget']} s, about {command['estimate']} s{carry} "
              f"({'fits' if command['estimate'] <= command['budget'] <= args.limit else 'DOES NOT FIT'})")
        print(f"    $ {command['command']}")
        for step, rows in command["steps"]:
            print(f"      step {step}: about {step_seconds(rows)} s")
            for what, seconds in rows:
                print(f"        {seconds:6.0f} s  {what}")
    estimate = sum(command["estimate"] for command in commands)
    budgets = sum(command["budget"] for command in commands)
    print(f"\nall commands: about {estimate / 60:.1f} min of GPU time (at most {budgets / 60:.1f} min if every "
          "command used its whole budget), plus about 2 min to start the machine.")
    return 0 if fits else 1


if __name__ == "__main__":
    raise SystemExit(main())
