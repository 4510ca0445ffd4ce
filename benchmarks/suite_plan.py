"""What ``benchmarks/gpu_suite.sh`` will run, stage by stage, and how long each stage should take.

    benchmarks/gpu_suite.sh --plan          # = python -m benchmarks.suite_plan --limit 540

Runs anywhere, no GPU needed: it reads the rungs, trial sizes and batches from the benchmark tools
themselves and prices them with the throughputs in :data:`ASSUMED`. Those are the original
tutorial's A100 figures (README of the SC22 tutorial), which an H100 or H200 exceeds, so the plan
is an upper bound for such a GPU: a reader sees that every stage ends inside its limit before
spending GPU time. The setup costs are estimates, marked as such; the tests stage runs under its
own limits.
"""
import argparse

from benchmarks import ladder, profiles, scaling
from benchmarks.layers import PRESETS as LAYER_PRESETS

# Samples per second assumed for a rung (batch 64): what its loader delivers (IO) and what its step
# computes (SYNTHETIC); FULL is the slower of the two. The original tutorial's A100 figures where it
# has them; the GPU-resident loader's IO, which it lacks, put below its DALI IO (944) to be safe.
ASSUMED_IO = {"lowmem, 2 workers": 85, "lowmem, 8 workers": 199, "dali": 944, "gpu-inmem": 900}
ASSUMED_COMPUTE = {"fp32": 482, "amp": 820, "batch 8": 400}  # TF32 baseline, fp16 AMP, batch 8 (launch-bound)
# Seconds of set-up, estimated; the data set's measured: 19 s for 256^3 on the project's 2-core CPU machine.
SETUP_S = {"rung": 10, "compile": 90, "graph": 10, "dali": 15, "data": 20, "process": 20}


def tests_limits(limit):
    """The tests stage's two pytest runs, each under its own limit (as gpu_suite.sh computes them)."""
    return limit * 4 // 9, limit // 3
CPU_TESTS_MEASURED = "85 s for 356 tests on the project's 2-core CPU machine (2026-11-24)"
LADDER = {"nbatches": 15, "ntrials": 3, "nwarmup": 1}  # what gpu_suite.sh passes to the ladder


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


def rung_setup(options, script="train.py"):
    text = " ".join(options)
    return (SETUP_S["rung"] + SETUP_S["compile"] * ("--jit_mode=compile" in text)
            + SETUP_S["graph"] * (script == "train_graph.py") + SETUP_S["dali"] * ("dali" in text))


def ladder_stage(nbatches=LADDER["nbatches"], ntrials=LADDER["ntrials"], nwarmup=LADDER["nwarmup"], batch=64):
    rows = []
    for rung in ladder.rungs_for("gpu", dali=True):
        size = 8 if "--global_batch_size=8" in " ".join(rung.options) else batch
        batches = min(nbatches, rung.nbatches or nbatches)
        seconds = rung_setup(rung.options, rung.script) + trial_seconds(rung.options,
                                                                         (nwarmup + ntrials) * batches * size)
        rows.append((rung.name, seconds))
    return [("make the 256^3 data set (once)", SETUP_S["data"])] + rows


def profiles_stage(steps=4, batch=64, nsys=True):
    rows = [("nsys probe", 30)] if nsys else []
    for slug, _, script, options in profiles.GPU_RUNGS:
        # two epochs of steps + 4 batches (one validation batch each), in a fresh process
        _, compute = rung_rates(options)
        seconds = SETUP_S["process"] + rung_setup(options, script) + 2 * (steps + 4) * batch / compute
        rows.append((f"profile {slug}", seconds))
    # The layers one by one cost about one step together; then the whole step: two steps per timed call.
    calls = LAYER_PRESETS["gpu"]["repeats"] + 2
    rows.append((f"python -m benchmarks.layers (the layers and a step, {calls} calls each)",
                 SETUP_S["rung"] + 2 * calls * batch / ASSUMED_COMPUTE["amp"]))
    return rows


def scaling_stage(gpus=1, nbatches=20, ntrials=3, nwarmup=1, batch=64):
    rows = []
    options = scaling.PRESETS["gpu"]["options"] + ["--amp_mode=fp16"]  # bs64_opt's precision
    for ranks in [2 ** i for i in range(gpus.bit_length()) if 2 ** i <= gpus]:
        for mode in ("ddp", "noddp"):
            seconds = SETUP_S["process"] + trial_seconds(options, (nwarmup + ntrials) * nbatches * batch)
            rows.append((f"{mode} on {ranks} GPU(s)", seconds))
    return rows


def commands(stage, limit=540):
    gpu_limit, cpu_limit = tests_limits(limit)
    return {
        "tests": [f"timeout -s INT {gpu_limit} python -m pytest -m gpu (the GPU-only tests, DALI's included)",
                  f"timeout -s INT {cpu_limit} python -m pytest -m 'not slow and not gpu' "
                  "--ignore=tests/test_slurm.py --ignore=tests/test_notebook.py"],
        "ladder": ["python -m benchmarks.ladder --data_dir data/benchmark --overwrite "
                   + " ".join(f"--{key} {value}" for key, value in LADDER.items())],
        "profiles": ["python -m benchmarks.profiles --data_dir data/benchmark --nsys --timeout 240 --overwrite",
                     "python -m benchmarks.layers --overwrite"],
        "scaling": ["python -m benchmarks.scaling --data_dir data/benchmark --overwrite"],
    }[stage]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=540, help="STAGE_LIMIT: seconds each stage may take")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs of the node (the scaling stage's sizes)")
    parser.add_argument("stages", nargs="*", default=["tests", "ladder", "profiles", "scaling"])
    args = parser.parse_args(argv)
    gpu_limit, cpu_limit = tests_limits(args.limit)
    estimates = {
        "tests": [("GPU-only tests (at most)", gpu_limit),
                  (f"fast CPU tests (at most; measured {CPU_TESTS_MEASURED})", cpu_limit)],
        "ladder": ladder_stage(),
        "profiles": profiles_stage(),
        "scaling": scaling_stage(args.gpus),
    }
    print(f"GPU suite plan: each stage stops itself at STAGE_LIMIT={args.limit} s. Throughputs assumed: the "
          "original tutorial's A100 figures (an H100 or H200 is faster), setup costs estimated.")
    total, fits = 0, True
    for stage in args.stages:
        rows = estimates[stage]
        seconds = sum(s for _, s in rows)
        total += seconds
        fits &= seconds <= args.limit
        print(f"\nstage {stage}: about {seconds:.0f} s of {args.limit} s "
              f"({'fits' if seconds <= args.limit else 'DOES NOT FIT'})")
        for command in commands(stage, args.limit):
            print(f"  $ {command}")
        for what, s in rows:
            print(f"    {s:6.0f} s  {what}")
    print(f"\nall stages: about {total / 60:.1f} min of GPU time, plus about 2 min to start the machine.")
    return 0 if fits else 1


if __name__ == "__main__":
    raise SystemExit(main())
