#!/usr/bin/env bash
# The tutorial's GPU measurements and checks, in stages of at most STAGE_LIMIT seconds each:
#
#   benchmarks/gpu_suite.sh tests      the test suite on the GPU machine (GPU-only tests run; CPU ones too)
#   benchmarks/gpu_suite.sh ladder     python -m benchmarks.ladder: the single-GPU ladder at batch 64, crop 64
#   benchmarks/gpu_suite.sh profiles   python -m benchmarks.profiles --nsys: traces of five rungs
#   benchmarks/gpu_suite.sh scaling    python -m benchmarks.scaling: weak scaling over this node's GPUs
#   benchmarks/gpu_suite.sh ladder profiles     several stages, in order (no stage: all four)
#
# Run it from the repository's top-level folder with the Python that has torch (PYTHON=..., default
# python3; COMMIT=... names the commit in the logs where the copy has no .git). Results land where
# the tutorial reads them: benchmarks/results/ (ladder, scaling, this suite's logs) and
# sample_nsys_profiles/. With OUT set (a folder), each stage also packs what it wrote into
# $OUT/gpu_suite_<stage>.tgz, to carry the results off a machine that is given back afterwards.
# Each stage stops itself after STAGE_LIMIT seconds (default 540): give two stages in one command
# under a ten-minute limit STAGE_LIMIT=280. A stage that fails does not stop the next one; the exit
# status says whether all passed.
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
    # from a lent machine whole); rejoin with: cat gpu_suite_<stage>.tgz.part* > gpu_suite_<stage>.tgz
    local archive="$OUT/gpu_suite_$1.tgz"
    shift
    tar czf "$archive" "$@" || return 1
    if [ "$(stat -c %s "$archive")" -gt $((15 * 1024 * 1024)) ]; then
        split -b 15M -d "$archive" "$archive.part" && rm "$archive" && note "packed in parts: $archive.part*"
    fi
}

# The ladder, the profiles and the scaling points keep their files up to date after every run, so
# that a stage stopped at STAGE_LIMIT still packs what it measured.
STAGE_LIMIT=${STAGE_LIMIT:-540}

stage_tests() {
    # The whole suite: on a GPU machine the CUDA-only tests run (graph capture, no host syncs in the
    # GPU loader and metrics, CUDA profiler windows). Tests whose tools are missing there are skipped.
    timeout "$STAGE_LIMIT" "$PYTHON" -m pytest -q -ra -p no:cacheprovider
}

stage_ladder() {
    timeout "$STAGE_LIMIT" "$PYTHON" -m benchmarks.ladder --data_dir "$DATA_DIR" --overwrite
}

stage_profiles() {
    timeout "$STAGE_LIMIT" "$PYTHON" -m benchmarks.profiles --data_dir "$DATA_DIR" --nsys --timeout 240 --overwrite
}

stage_scaling() {
    # The weak-scaling points this node can give (README, "Multi-GPU performance"): benchy trials at 1,
    # 2, 4, ... ranks up to its GPUs, with DDP and with --noddp. On one GPU train.py does not wrap the
    # model in DDP, so the two differ by run-to-run noise only: the baseline multi-GPU overheads are
    # read against.
    timeout "$STAGE_LIMIT" "$PYTHON" -m benchmarks.scaling --data_dir "$DATA_DIR" --timeout $((STAGE_LIMIT / 2)) \
        --overwrite
}

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
        pack "$stage" "${outputs[@]}" || failed+=("pack-$stage")
    fi
done
[ ${#failed[@]} -eq 0 ] || { note "failed stages: ${failed[*]}"; exit 1; }
note "all stages passed: ${stages[*]}"
