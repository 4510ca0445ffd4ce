#!/usr/bin/env bash
# The tutorial's GPU measurements and checks, one stage per command, each inside its own budget:
#
#   benchmarks/gpu_suite.sh --plan            the commands to send, in order, with budgets (no GPU needed)
#   benchmarks/gpu_suite.sh --help            this text
#   benchmarks/gpu_suite.sh preflight         python -m benchmarks.preflight: what the later stages rely on
#                                             (on a CPU its CPU half, naming what it skipped)
#   benchmarks/gpu_suite.sh tests-gpu         the GPU-only tests (-m gpu) but torch.compile's
#   benchmarks/gpu_suite.sh tests-compile     the GPU-only tests of torch.compile (CUDA graphs included)
#   benchmarks/gpu_suite.sh tests-cpu         the fast CPU tests, under this machine's torch
#   benchmarks/gpu_suite.sh ladder            python -m benchmarks.ladder: the single-GPU ladder, batch 64, crop 64
#   benchmarks/gpu_suite.sh profiles          python -m benchmarks.profiles (five rungs) and benchmarks.layers
#   benchmarks/gpu_suite.sh scaling           python -m benchmarks.scaling: weak scaling over this node's GPUs
#   benchmarks/gpu_suite.sh ladder profiles   several stages, one after the other
#
# Run it from the repository's top-level folder with the Python that has torch (PYTHON=..., default
# python3; COMMIT=... names the commit in the logs where the copy has no .git). The preflight comes
# first: its benchmarks/results/preflight.json decides what the later stages do (Nsight Systems only
# where it wrote a report; the compile rungs and tests are skipped, with the reason, where no C
# compiler or Python.h is found). Results land where the tutorial reads them: benchmarks/results/
# (preflight, ladder, layers, scaling, test reports, this suite's logs) and sample_nsys_profiles/.
#
# Each stage has a budget (BUDGET below, at most STAGE_LIMIT, default 540 s: a lent machine's commands
# end at 540-600 s). Its steps check the time left before they start (a step that cannot finish is
# not started, and says so) and end at the budget. With OUT set (a folder), what the stage wrote is
# packed into $OUT/gpu_suite_<stage>.tgz after every step, again whenever a running step writes a
# result, and on SIGTERM or SIGINT: a stage cut short still returns what it finished. Archives over
# 15 MiB are cut in parts (rejoin: cat gpu_suite_<stage>.tgz.part* > x.tgz). A stage that fails does
# not stop the next one; the exit status says whether all passed.
#
# The stages pass --committed (the tools alone write under runs/benchmarks/) and --overwrite (they
# alone never write over results): the profiles stage
# regenerates sample_nsys_profiles/; the ladder and scaling stages write <device>-<date> files that
# only a rerun on the same GPU the same day finds, and such a rerun redoes that day's measurement.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
RESULTS=${RESULTS:-benchmarks/results}  # where results go (tests point it elsewhere)
DATA_DIR=data/benchmark
PREFLIGHT=$RESULTS/preflight.json
STAGE_LIMIT=${STAGE_LIMIT:-540}
PACK_RESERVE=15  # seconds kept at the end of a budget to pack
export PYTHONUNBUFFERED=1

# Seconds per stage: estimated costs plus start-up, priced by benchmarks/suite_plan.py (--plan shows
# both); every one under the 540 s a lent machine's command may run.
declare -A BUDGET=([preflight]=140 [tests-gpu]=480 [tests-compile]=300 [tests-cpu]=240 [ladder]=530
                   [profiles]=390 [scaling]=180)
STAGES="preflight tests-gpu tests-compile tests-cpu ladder profiles scaling"

note() { echo "gpu_suite.sh: $*"; }

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

preflight_says() {
    # A value of the preflight's facts (preflight.json): "true", "false", or "unknown" before it ran here.
    "$PYTHON" - "$PREFLIGHT" "$1" <<'EOF' 2>/dev/null || echo unknown
import json, sys
facts = json.load(open(sys.argv[1]))
print({"nsys_report": lambda: facts["nsys"].get("report", False),
       "compile": lambda: facts["compile_problem"] is None}[sys.argv[2]]() and "true" or "false")
EOF
}

# --------------------------------------------------------------------------- packing and steps

stage_files() {
    # What this stage wrote: the files under the result folders newer than its start.
    find "$RESULTS" sample_nsys_profiles -type f -newer "$STAMP" 2>/dev/null
}

pack() {
    # $OUT/gpu_suite_<stage>.tgz, remade from scratch. At most 8 files of 16 MiB come back from a lent
    # machine: past 8 parts of 15 MiB, the Nsight Systems reports (the largest files) are left out.
    [ -n "${OUT:-}" ] || return 0
    local archive="$OUT/gpu_suite_$STAGE.tgz" files
    mapfile -t files < <(stage_files)
    [ ${#files[@]} -gt 0 ] || return 0
    rm -f "$archive" "$archive".part*
    tar czf "$archive.tmp" "${files[@]}" 2>/dev/null && mv "$archive.tmp" "$archive" || return 1
    if [ "$(stat -c %s "$archive")" -gt $((8 * 15 * 1024 * 1024)) ]; then
        mapfile -t files < <(printf '%s\n' "${files[@]}" | grep -v '\.nsys-rep$')
        note "packed without the .nsys-rep reports: all together they pass 8 parts of 15 MiB"
        tar czf "$archive" "${files[@]}" 2>/dev/null || return 1
    fi
    if [ "$(stat -c %s "$archive")" -gt $((15 * 1024 * 1024)) ]; then
        split -b 15M -d "$archive" "$archive.part" && rm "$archive"
    fi
    touch "$PACKED"
}

repack_if_changed() {
    # While a step runs: pack again when it has written a result since the last pack.
    [ -n "${OUT:-}" ] && [ -n "$(find "$RESULTS" sample_nsys_profiles -type f -newer "$PACKED" \
        ! -name 'gpu_suite-*.log' 2>/dev/null | head -n 1)" ] && pack
    return 0
}

step() {
    # step NAME SECONDS COMMAND...: run COMMAND if about SECONDS are left of the stage's budget, under a
    # limit at the budget's end; pack after it (and while it runs, as it writes results).
    local name=$1 need=$2 left
    shift 2
    left=$((DEADLINE - SECONDS - PACK_RESERVE))
    if [ "$left" -lt "$need" ]; then
        note "step $name not run: $left s left of the stage's budget, and it needs about $need s"
        return 1
    fi
    note "step $name: about $need s, at most $left s"
    timeout -s INT -k 15 "$left" "$@" &
    STEP_PID=$!
    while kill -0 "$STEP_PID" 2>/dev/null; do
        sleep 2 & wait $!  # interruptible: SIGTERM is handled at once
        repack_if_changed
    done
    wait "$STEP_PID"
    local status=$?
    STEP_PID=
    [ "$status" -eq 124 ] && note "step $name stopped at the stage's budget"
    pack
    return $status
}

on_signal() {
    note "stage $STAGE: $1 received after $((SECONDS - START)) s; packing what is done"
    [ -n "${STEP_PID:-}" ] && kill -INT "$STEP_PID" 2>/dev/null && wait "$STEP_PID" 2>/dev/null
    pack
    exit "$2"
}

# --------------------------------------------------------------------------- the stages

PYTEST=(-m pytest -q -ra -p no:cacheprovider --durations=15)

stage_preflight() {
    step preflight 50 "$PYTHON" -m benchmarks.preflight --out "$PREFLIGHT" --nsys_timeout 60
}

stage_tests-gpu() {
    # The GPU-only tests (marked gpu: CUDA graphs, no host syncs, DALI on the GPU, the profiling window
    # and its kernels, a capturable resume) but torch.compile's. SIGINT at the limit: pytest stops and
    # still prints its summary.
    step tests-gpu 280 "$PYTHON" "${PYTEST[@]}" -m gpu -k "not compile" --junitxml="$RESULTS/gpu_suite-tests-gpu.xml"
}

stage_tests-compile() {
    # torch.compile's GPU tests (reduce-overhead's CUDA graphs through training and validation).
    if [ "$(preflight_says compile)" = false ]; then
        note "tests-compile not run: the preflight found no C compiler or no Python.h (see $PREFLIGHT)"
        return 1
    fi
    step tests-compile 160 "$PYTHON" "${PYTEST[@]}" -m gpu -k compile --junitxml="$RESULTS/gpu_suite-tests-compile.xml"
}

stage_tests-cpu() {
    # The fast CPU tests under this machine's torch; the Slurm and browser modules have their own CI.
    step tests-cpu 120 "$PYTHON" "${PYTEST[@]}" -m "not slow and not gpu" --ignore=tests/test_slurm.py \
        --ignore=tests/test_notebook.py --junitxml="$RESULTS/gpu_suite-tests-cpu.xml"
}

stage_ladder() {
    # The compile rung skips itself, with the reason, where the preflight's compiler check fails.
    step ladder 470 "$PYTHON" -m benchmarks.ladder --data_dir "$DATA_DIR" --committed --overwrite --nbatches 15 --ntrials 3 \
        --nwarmup 1
}

stage_profiles() {
    local nsys=(--nsys)  # the profiles tool probes nsys itself when the preflight has not run here
    [ "$(preflight_says nsys_report)" = false ] && nsys=() && note "profiles without nsys: the preflight saw no report"
    local status=0
    step profiles 200 "$PYTHON" -m benchmarks.profiles --data_dir "$DATA_DIR" "${nsys[@]}" --timeout 120 --committed \
        --overwrite || status=1
    step layers 20 "$PYTHON" -m benchmarks.layers --committed --overwrite || status=1
    return $status
}

stage_scaling() {
    # The weak-scaling points this node can give (README, "Multi-GPU performance"): benchy trials at 1,
    # 2, 4, ... ranks up to its GPUs, with DDP and with --noddp. On one GPU train.py does not wrap the
    # model in DDP, so the two differ by run-to-run noise only: the baseline multi-GPU overheads are
    # read against.
    step scaling 80 "$PYTHON" -m benchmarks.scaling --data_dir "$DATA_DIR" --timeout 120 --committed --overwrite
}

# --------------------------------------------------------------------------- the command line

case "${1:-}" in
    --help|-h) usage; exit 0 ;;
    --plan) shift; exec "$PYTHON" -m benchmarks.suite_plan --limit "$STAGE_LIMIT" "$@" ;;
    "") echo "gpu_suite.sh: name the stages to run ($STAGES), or --plan for the commands in order," \
             "or --help." >&2; exit 2 ;;
esac
for stage in "$@"; do
    [[ " $STAGES " == *" $stage "* ]] || { echo "gpu_suite.sh: unknown stage '$stage' ($STAGES; or --plan, --help)" >&2; exit 2; }
    if [ "$stage" != preflight ] && [ "$stage" != tests-cpu ] && \
        ! "$PYTHON" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
        echo "gpu_suite.sh: error: PyTorch ($PYTHON) sees no CUDA GPU, and stage $stage measures one. On a CPU" \
             "run 'benchmarks/gpu_suite.sh preflight', 'python -m benchmarks.ladder --preset cpu' and" \
             "'python -m benchmarks.profiles --preset cpu'." >&2
        exit 2
    fi
done

mkdir -p "$RESULTS"
[ -n "${OUT:-}" ] && mkdir -p "$OUT"
failed=()
for STAGE in "$@"; do
    START=$SECONDS
    budget=${BUDGET[$STAGE]}
    [ "$budget" -gt "$STAGE_LIMIT" ] && budget=$STAGE_LIMIT
    DEADLINE=$((START + budget))
    STAMP=$(mktemp) PACKED=$(mktemp)
    touch -d '-2 seconds' "$STAMP"  # files written in this second count as the stage's
    log="$RESULTS/gpu_suite-$STAGE-$(date -u +%Y-%m-%d).log"
    trap 'on_signal SIGTERM 143' TERM
    trap 'on_signal SIGINT 130' INT
    {
        echo "# benchmarks/gpu_suite.sh $STAGE, $(date -u +%FT%TZ), budget $budget s, commit" \
             "${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
    } > "$log"
    note "stage $STAGE started $(date -u +%FT%TZ), budget $budget s; log: $log" | tee -a "$log"
    "stage_$STAGE" > >(tee -a "$log") 2>&1
    status=$?
    note "stage $STAGE ended with status $status after $((SECONDS - START)) s" | tee -a "$log"
    trap - TERM INT
    [ "$status" -eq 0 ] || failed+=("$STAGE")
    pack || failed+=("pack-$STAGE")
    rm -f "$STAMP" "$PACKED"
done
[ ${#failed[@]} -eq 0 ] || { note "failed stages: ${failed[*]}"; exit 1; }
note "all stages passed: $*"
