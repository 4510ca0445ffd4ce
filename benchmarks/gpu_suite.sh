#!/usr/bin/env bash
# The tutorial's GPU measurements and checks, in stages of at most STAGE_LIMIT seconds each:
#
#   benchmarks/gpu_suite.sh --plan     what each stage runs and how long it should take (no GPU needed)
#   benchmarks/gpu_suite.sh tests      the GPU-only tests (DALI's on the GPU included), then the fast CPU ones
#   benchmarks/gpu_suite.sh ladder     python -m benchmarks.ladder: the single-GPU ladder at batch 64, crop 64
#   benchmarks/gpu_suite.sh profiles   python -m benchmarks.profiles --nsys (five rungs) and benchmarks.layers
#   benchmarks/gpu_suite.sh scaling    python -m benchmarks.scaling: weak scaling over this node's GPUs
#   benchmarks/gpu_suite.sh ladder profiles     several stages, in order (no stage: all four)
#
# Run it from the repository's top-level folder with the Python that has torch (PYTHON=..., default
# python3; COMMIT=... names the commit in the logs where the copy has no .git). Results land where
# the tutorial reads them: benchmarks/results/ (ladder, layers, scaling, this suite's logs) and
# sample_nsys_profiles/. With OUT set (a folder), each stage also packs what it wrote into
# $OUT/gpu_suite_<stage>.tgz (in 15 MiB parts when larger, at most 8), to carry the results off a
# machine that is given back afterwards. Each stage stops itself after STAGE_LIMIT seconds (default
# 540) and still packs what it measured; --plan shows that each fits. A stage that fails does not
# stop the next one; the exit status says whether all passed.
#
# The stages pass --overwrite (the tools alone refuse to write over results): the profiles stage
# regenerates sample_nsys_profiles/, which holds the committed profiles once there are any, so it
# would be refused on every machine after the first without it; the ladder and scaling stages write
# <device>-<date> files that only a rerun of the stage on the same GPU the same day finds, and such a
# rerun redoes that day's measurement (its stage log is rewritten too). To keep an earlier run's
# results, pack them (OUT) before running its stage again.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
RESULTS=benchmarks/results
DATA_DIR=data/benchmark
export PYTHONUNBUFFERED=1

note() { echo "gpu_suite.sh: $*"; }

pack() {
    # $OUT/gpu_suite_<stage>.tgz, cut into 15 MiB parts when larger (files that big may not come back
    # from a lent machine whole, and at most 8 do); rejoin with: cat gpu_suite_<stage>.tgz.part* > x.tgz
    local archive="$OUT/gpu_suite_$1.tgz"
    shift
    tar czf "$archive" "$@" || return 1
    if [ "$(stat -c %s "$archive")" -gt $((15 * 1024 * 1024)) ]; then
        split -b 15M -d "$archive" "$archive.part" && rm "$archive" && note "packed in parts: $archive.part*"
    fi
    local files
    files=$(find "$OUT" -maxdepth 1 -type f | wc -l)
    [ "$files" -le 8 ] || { note "error: $OUT holds $files files; at most 8 come back from a lent machine"; return 1; }
}

# The ladder, the profiles and the scaling points keep their files up to date after every run, so
# that a stage stopped at STAGE_LIMIT still packs what it measured.
STAGE_LIMIT=${STAGE_LIMIT:-540}
TESTS_GPU_LIMIT=$((STAGE_LIMIT * 4 / 9))  # 240 s of the default 540
TESTS_CPU_LIMIT=$((STAGE_LIMIT / 3))      # 180 s

stage_tests() {
    # The GPU-only tests (marked gpu: CUDA graphs, no host syncs, DALI on the GPU, the profiling window,
    # compile's CUDA graphs, a capturable resume), then the fast CPU ones. The Slurm and browser modules
    # have their own CI. SIGINT at the limit: pytest stops and still prints its summary.
    local status=0
    timeout -s INT -k 30 "$TESTS_GPU_LIMIT" "$PYTHON" -m pytest -q -ra -p no:cacheprovider -m gpu \
        --junitxml="$RESULTS/gpu_suite-tests-gpu.xml" || status=1
    timeout -s INT -k 30 "$TESTS_CPU_LIMIT" "$PYTHON" -m pytest -q -ra -p no:cacheprovider -m "not slow and not gpu" \
        --ignore=tests/test_slurm.py --ignore=tests/test_notebook.py --junitxml="$RESULTS/gpu_suite-tests-cpu.xml" \
        || status=1
    return $status
}

stage_ladder() {
    timeout "$STAGE_LIMIT" "$PYTHON" -m benchmarks.ladder --data_dir "$DATA_DIR" --overwrite \
        --nbatches 15 --ntrials 3 --nwarmup 1
}

stage_profiles() {
    local status=0
    timeout "$((STAGE_LIMIT - 60))" "$PYTHON" -m benchmarks.profiles --data_dir "$DATA_DIR" --nsys --timeout 240 \
        --overwrite || status=1
    timeout 60 "$PYTHON" -m benchmarks.layers --overwrite || status=1
    return $status
}

stage_scaling() {
    # The weak-scaling points this node can give (README, "Multi-GPU performance"): benchy trials at 1,
    # 2, 4, ... ranks up to its GPUs, with DDP and with --noddp. On one GPU train.py does not wrap the
    # model in DDP, so the two differ by run-to-run noise only: the baseline multi-GPU overheads are
    # read against.
    timeout "$STAGE_LIMIT" "$PYTHON" -m benchmarks.scaling --data_dir "$DATA_DIR" --timeout $((STAGE_LIMIT / 2)) \
        --overwrite
}

if [ "${1:-}" = --plan ]; then
    shift
    exec "$PYTHON" -m benchmarks.suite_plan --limit "$STAGE_LIMIT" "$@"
fi
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(tests ladder profiles scaling)
for stage in "${stages[@]}"; do
    case "$stage" in
        tests|ladder|profiles|scaling) ;;
        *) echo "gpu_suite.sh: unknown stage '$stage' (tests, ladder, profiles, scaling)" >&2; exit 2 ;;
    esac
done
if ! "$PYTHON" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    echo "gpu_suite.sh: error: PyTorch ($PYTHON) sees no CUDA GPU. This suite measures GPUs; on a CPU run" \
         "'python -m benchmarks.ladder --preset cpu' and 'python -m benchmarks.profiles --preset cpu'." >&2
    exit 2
fi

mkdir -p "$RESULTS"
failed=()
for stage in "${stages[@]}"; do
    log="$RESULTS/gpu_suite-$stage-$(date -u +%Y-%m-%d).log"
    note "stage $stage started $(date -u +%FT%TZ); log: $log"
    {
        echo "# benchmarks/gpu_suite.sh $stage, $(date -u +%FT%TZ), commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
        "$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())'
    } > "$log"
    start=$SECONDS
    "stage_$stage" 2>&1 | tee -a "$log"
    status=${PIPESTATUS[0]}
    note "stage $stage ended with status $status after $((SECONDS - start)) s" | tee -a "$log"
    [ "$status" -eq 0 ] || failed+=("$stage")
    if [ -n "${OUT:-}" ]; then
        outputs=("$RESULTS")
        [ "$stage" = profiles ] && [ -d sample_nsys_profiles ] && outputs+=(sample_nsys_profiles)
        [ "$stage" = tests ] && outputs=("$RESULTS"/gpu_suite-tests-*)
        pack "$stage" "${outputs[@]}" || failed+=("pack-$stage")
    fi
done
[ ${#failed[@]} -eq 0 ] || { note "failed stages: ${failed[*]}"; exit 1; }
note "all stages passed: ${stages[*]}"
