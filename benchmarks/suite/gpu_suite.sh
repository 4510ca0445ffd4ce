#!/usr/bin/env bash
# The tutorial's GPU measurements and checks, in stages, on the GPU this runs on:
#
#   benchmarks/suite/gpu_suite.sh                   every stage, one after the other, on this machine's GPU(s);
#                                                   it prints what each stage measures, where its results go and
#                                                   how long it took on an H100 (from the committed logs), then
#                                                   each stage's status, time and results
#   benchmarks/suite/gpu_suite.sh ladder profiles   the stages named, in that order
#   benchmarks/suite/gpu_suite.sh --help            this text
#
# In a Slurm job (submit_pm.sh runs train.py on every rank, so the suite is its own one-task job; use your
# account, and the partition or constraint of a GPU node):
#
#   sbatch -A your_account_g -C gpu -N 1 -n 1 --gpus-per-node=4 --cpus-per-task=32 --time=01:00:00 \
#          -J gpu_suite -o gpu_suite-%j.out --wrap "PYTHON=.venv/bin/python benchmarks/suite/gpu_suite.sh"
#
# The stages:
#   headline          the numbers that decide, most valuable first, each step packed as it ends: the layers plain
#                     against their exact forms and the step layer by layer (benchmarks.layers, channels_last,
#                     --exact_forms=auto); the best rung compiled with the forms auto and off (SYNTHETIC and FULL);
#                     the original's train.py for two epochs; Nsight Compute on the first and last layers
#                     (benchmarks.ncu_layers); the committed best rung again, as this machine's anchor; summary.txt
#   preflight         python -m benchmarks.suite.preflight: what the later stages rely on
#   ladder            python -m benchmarks.ladder --group ladder: the GPU-resident rungs, each adding one thing
#   ladder-alone      python -m benchmarks.ladder --group alone: the GPU-resident rungs measured alone
#   batch-sweep       the ladder's top rung at local batch 64, 128 and 256, with peak memory
#   profiles          python -m benchmarks.profiles (five rungs), benchmarks.layers and,
#                     where the tree has it, benchmarks.cudnn_autotune
#   tests-gpu         the GPU-only tests (-m gpu) but torch.compile's, DALI's and the distributed ones
#   tests-compile     the GPU-only tests of torch.compile (CUDA graphs included)
#   tests-distributed the distributed code on CUDA tensors: two ranks on one GPU over gloo
#                     (tests/test_cuda_distributed.py)
#   scaling           python -m benchmarks.scaling: weak scaling over this node's GPUs
#   dali              DALI's GPU tests, its profile, the ladder's DALI and host-loader rungs
#                     (LOADERS_ONLY=DALI: its rung alone)
#   multi-gpu         DDP, FSDP, domain [2,1,1] and the CUDA-graph step under DDP, over NCCL (two GPUs
#                     or more; with one it says so and passes)
#   graph-lesson      python -m benchmarks.graph_lesson: eager against the CUDA graph where launches set the
#                     pace (the demo's width, crop 32, local batch 1 to 8)
#   original          python -m benchmarks.original: the original tutorial's train.py beside this project's
#                     rungs on the same data (ORIGINAL=<its checkout>, default .carry/sc22-original)
#   nsys-probe        whether Debian's Nsight Systems 2022.4 CLI (its .deb in .carry/nsys/) writes a report of
#                     train.py's profiling window here; its log, report or raw .qdstrm capture under nsys-probe/
#
# Run it from the repository's top-level folder with the Python that has torch (PYTHON=..., default
# python3; COMMIT=... names the commit in the logs where the copy has no .git). Results land under
# RESULTS (default runs/benchmarks/gpu_suite/, not tracked by git, as every benchmark tool's;
# RESULTS=benchmarks/results remakes the committed ones): preflight.json, the ladder's files, profiles/,
# layers/, scaling/, loaders/ (the DALI stage's ladder), multi-gpu/, the test reports and this suite's
# logs (gpu_suite-<stage>-<date>.log). A stage that fails does not stop the next one; the exit status
# says whether all passed. Each stage's steps end at STAGE_LIMIT seconds (default 1800 s), a guard
# against a hung step.
#
# Every stage stands on its own: nothing is read that an earlier stage left, so any stage can run
# alone. What a stage decides it re-derives in seconds (the compiler, DALI, where the 3-D convolutions
# run), but for Nsight Systems: the profiles stage uses it where the preflight saw it write a report
# (this command's preflight.json, or .carry/preflight/preflight.json), probes it itself, capped, where
# neither says, and leaves it out where one says no.
#
# On a remote GPU machine with a time limit per command and per session:
#
#   benchmarks/suite/gpu_suite.sh --plan            the commands to send, in order, in sessions of 15 minutes
#                                                   of GPU time, with budgets (no GPU needed)
#   benchmarks/suite/gpu_suite.sh --plan --gpus 4   the plan for a machine with 4 GPUs
#
# There each stage has a budget (BUDGET below, at most STAGE_LIMIT, then 540 s: such a machine's
# commands end at 600 s): its steps check the time left before they start (a step that cannot finish is
# not started, and says so) and end at the budget. With OUT set (a folder, what the machine returns),
# what the stage wrote is packed into $OUT/gpu_suite_<stage>.tgz after every step, again whenever a
# running step writes a result, and on SIGTERM or SIGINT: a stage cut short still returns what it
# finished. What comes back is at most 8 files of 16 MiB, 64 MiB together: archives are cut in parts of
# 15 MiB (rejoin: cat gpu_suite_<stage>.tgz.part* > x.tgz), and where all of this command's archives
# would pass 60 MiB or 8 files, the largest files are left out, Nsight Systems reports first, each named
# in gpu_suite-left-out.txt.
#
# Without a CUDA GPU the suite refuses, except with CPU_CHECK=1: then every stage runs its set-up and
# its tools at tiny sizes on the CPU presets, the GPU-only steps skipped by their own checks (what
# tests/test_gpu_plan.py does to prove each command of the plan on a bare machine).
# The tools write where RESULTS says (--out_dir, with --overwrite: a stage redoes that day's
# measurement); run alone, without --out_dir, they write under runs/benchmarks/.
set -uo pipefail
cd "$(dirname "$0")/../.."  # the repository's top-level folder

PYTHON=${PYTHON:-python3}
RESULTS=${RESULTS:-runs/benchmarks/gpu_suite}  # where results go (benchmarks/suite/plan.py's SUITE_RESULTS)
DATA_DIR=${DATA_DIR:-data/benchmark}  # the benchmarks' synthetic data set, made where missing
PREFLIGHT=$RESULTS/preflight.json
CARRIED_PREFLIGHT=.carry/preflight/preflight.json
# A remote machine's commands (OUT set) end at 600 s: there a stage has its BUDGET, at most 540 s.
if [ -n "${OUT:-}" ]; then STAGE_LIMIT=${STAGE_LIMIT:-540}; else STAGE_LIMIT=${STAGE_LIMIT:-1800}; fi
CPU_CHECK=${CPU_CHECK:-}
PACK_RESERVE=15           # seconds kept at the end of a budget to pack
OUT_FILES=8 OUT_MIB=60 PART_MIB=15  # what a remote machine returns: 8 files of 16 MiB, 64 MiB together
export PYTHONUNBUFFERED=1

# Seconds per stage and per step: priced by benchmarks/suite/plan.py (--plan shows both; a test keeps
# these equal to its figures).
declare -A BUDGET=([headline]=530 [preflight]=40 [ladder]=530 [ladder-alone]=390 [batch-sweep]=410 [original]=530
                   [profiles]=530 [tests-gpu]=280 [tests-compile]=170 [tests-distributed]=470 [graph-lesson]=200
                   [nsys-probe]=180 [scaling]=110 [dali]=390 [multi-gpu]=210)
STAGES="headline preflight ladder ladder-alone batch-sweep profiles tests-gpu tests-compile tests-distributed scaling"
STAGES+=" dali graph-lesson multi-gpu nsys-probe original"
NSYS_LIMIT=120  # seconds for one Nsight Systems route: its start, the run, the report (its importer included)

# The tools' sizes: the GPU's, or, with CPU_CHECK=1, the CPU presets' at their smallest (the same code path).
if [ -n "$CPU_CHECK" ]; then
    PRESET=cpu
    LADDER_SIZES=(--nbatches 2 --ntrials 1 --nwarmup 0)
    PROFILE_ONLY=(--only gpu_inmem --steps 1) LAYERS_SIZES=(--repeats 1 --in_step_steps 1)
    SCALING_SIZES=(--ranks 1 --nbatches 2 --ntrials 1 --nwarmup 0)
    LOADER_ONLY=(--only "48 symmetries")
    HEADLINE_SIZES=(--nbatches 2 --ntrials 1 --nwarmup 0)
    HEADLINE_LAYERS=(--global_batch_size=2 --repeats 1 --in_step_steps 1) NCU_OPTIONS=(--global_batch_size=2 --dry_run)
    BOX=128 COMMON=(--config=demo --global_batch_size=2 --device=cpu) PRECISION=()
else
    PRESET=gpu
    LADDER_SIZES=(--nbatches 6 --ntrials 2 --nwarmup 1)
    PROFILE_ONLY=() LAYERS_SIZES=() SCALING_SIZES=() LOADER_ONLY=()
    HEADLINE_SIZES=(--nbatches 12 --ntrials 3 --nwarmup 1)
    HEADLINE_LAYERS=(--repeats 10 --in_step_steps 3) NCU_OPTIONS=(--timeout 55 --export_timeout 15)
    BOX=256 COMMON=(--config=base --device=cuda) PRECISION=(--amp_mode=bf16)
fi
# The headline's rungs (benchmarks/ladder.py's + channels_last and + torch.compile, the exact forms named):
# the ladder's options for the preset (its data set, its size), bf16 on a GPU.
COMMON+=(--train_path="$DATA_DIR/synthetic_train.h5" --val_path="$DATA_DIR/synthetic_valid.h5" --checkpoint=false)
BEST=(--data_loader_config=gpu-inmem "${PRECISION[@]}" --enable_fused --channels_last)
# The loaders' rungs whose names hold this text (the ladder's --only), e.g. DALI where the host loaders'
# rungs were measured by an earlier command.
[ -n "${LOADERS_ONLY:-}" ] && LOADER_ONLY=(--only "$LOADERS_ONLY")

note() { echo "gpu_suite.sh: $*"; }

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

cuda_gpus() { "$PYTHON" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)'; }

nsys_decided() {
    # "true" or "false": whether the preflight saw nsys write a report (this command's, else the carried
    # one; never one an earlier command left on the machine); "unknown" where neither has tried.
    local own=
    [ "$PREFLIGHT" -nt "$RUN_STAMP" ] && own=$PREFLIGHT
    "$PYTHON" - $own "$CARRIED_PREFLIGHT" <<'EOF' 2>/dev/null || echo unknown
import json, sys
for path in sys.argv[1:]:
    try:
        nsys = json.load(open(path))["nsys"]
    except (OSError, ValueError, KeyError):
        continue
    if not nsys.get("path"):
        print("false"); break
    if "report" in nsys:
        print(str(nsys["report"]).lower()); break
else:
    print("unknown")
EOF
}

# --------------------------------------------------------------------------- packing and steps

stage_files() {
    # What this stage wrote: the files under the result folder newer than its start, but the suite's
    # files of the other stages (a log the last stage ended a second ago).
    find "$RESULTS" -type f -newer "$STAMP" ! -name '*.tmp' ! -name 'gpu_suite-left-out.txt' 2>/dev/null |
        grep -v -e '/gpu_suite-[a-z-]*-[0-9-]*\.log$' -e '/gpu_suite-[a-z-]*\.xml$'
    find "$RESULTS" -maxdepth 1 -type f -newer "$STAMP" \( -name "gpu_suite-$STAGE-*.log" -o \
        -name "gpu_suite-$STAGE.xml" \) 2>/dev/null
}

stage_results() {
    # What this stage wrote under the result folder, by top-level entry (a folder once), its logs aside.
    local entries
    entries=$(stage_files | grep -v "/gpu_suite-$STAGE-[0-9-]*\.log$" | sed "s|^$RESULTS/||" |
              awk -F/ '{print (NF > 1 ? $1 "/" : $1)}' | sort -u | sed "s|^|$RESULTS/|" | paste -sd' ' -)
    echo "${entries:-none}"
}

out_usage() {
    # "FILES BYTES" in $OUT that are not this stage's archive.
    find "$OUT" -maxdepth 1 -type f ! -name "gpu_suite_$STAGE.tgz*" -printf '%s\n' 2>/dev/null |
        awk '{n++; b+=$1} END {print n+0, b+0}'
}

pack() {
    # $OUT/gpu_suite_<stage>.tgz, remade from scratch, inside what a remote machine returns.
    [ -n "${OUT:-}" ] || return 0
    local archive="$OUT/gpu_suite_$STAGE.tgz" files others_n others_b room parts size left_out=()
    mapfile -t files < <(stage_files)
    [ ${#files[@]} -gt 0 ] || return 0
    read -r others_n others_b < <(out_usage)
    parts=$((OUT_FILES - others_n))
    room=$((OUT_MIB * 1024 * 1024 - others_b))
    [ $((parts * PART_MIB * 1024 * 1024)) -lt "$room" ] && room=$((parts * PART_MIB * 1024 * 1024))
    rm -f "$RESULTS/gpu_suite-left-out.txt"  # the last archive stays until the new one replaces it
    while :; do
        tar czf "$archive.tmp" "${files[@]}" 2>/dev/null || { rm -f "$archive.tmp"; return 1; }
        size=$(stat -c %s "$archive.tmp")
        [ "$size" -le "$room" ] && break
        if [ ${#files[@]} -le 1 ] && [ "${files[0]}" = "$RESULTS/gpu_suite-left-out.txt" ]; then
            break  # nothing of the stage fits: the list of what was left out is what comes back
        fi
        # Too large: leave out the largest file, Nsight Systems reports first.
        local drop
        drop=$( { ls -S "${files[@]}" | grep '\.nsys-rep$'; ls -S "${files[@]}" | grep -v 'gpu_suite-left-out'; } |
                head -n 1)
        left_out+=("$drop ($(stat -c %s "$drop") bytes)")
        mapfile -t files < <(printf '%s\n' "${files[@]}" | grep -vxF "$drop")
        printf '%s\n' "left out of the archive (what a remote machine returns: $OUT_FILES files, 64 MiB):" \
            "${left_out[@]}" > "$RESULTS/gpu_suite-left-out.txt"
        files+=("$RESULTS/gpu_suite-left-out.txt")
        mapfile -t files < <(printf '%s\n' "${files[@]}" | sort -u)
    done
    [ ${#left_out[@]} -gt 0 ] && note "left out of the archive, too large: ${left_out[*]}"
    rm -f "$archive".part*
    mv "$archive.tmp" "$archive"  # at once: a command cut off at any moment returns a whole archive
    if [ "$size" -gt $((PART_MIB * 1024 * 1024)) ]; then
        split -b "${PART_MIB}M" -d "$archive" "$archive.part" && rm "$archive"
    fi
    touch "$PACKED"
}

repack_if_changed() {
    # While a step runs: pack again when it has written a result since the last pack.
    [ -n "${OUT:-}" ] && [ -n "$(find "$RESULTS" -type f -newer "$PACKED" ! -name 'gpu_suite-*.log' \
        ! -name '*.tmp' 2>/dev/null | head -n 1)" ] && pack
    return 0
}

step() {
    # step NAME SECONDS COMMAND...: run COMMAND if about SECONDS are left of the stage's budget, under a
    # limit at the budget's end, or at STEP_CAP seconds where that comes first (STEP_CAP=150 step ...; not
    # with CPU_CHECK, whose times are a CPU's); pack after it (and while it runs, as it writes results).
    # With SUMMARY set (a file), each step's outcome is added to it.
    local name=$1 need=$2 left limit began=$SECONDS why="the stage's budget"
    shift 2
    left=$((DEADLINE - SECONDS - PACK_RESERVE))
    if [ "$left" -lt "$need" ]; then
        note "step $name not run: $left s left of the stage's budget, and it needs about $need s"
        summarize "$name: not run ($left s left of the budget, it needs about $need s)"
        return 1
    fi
    limit=$left
    if [ -z "$CPU_CHECK" ] && [ -n "${STEP_CAP:-}" ] && [ "$STEP_CAP" -lt "$left" ]; then
        limit=$STEP_CAP why="its cap"
    fi
    note "step $name: about $need s, at most $limit s"
    timeout -s INT -k 15 "$limit" "$@" &
    STEP_PID=$!
    while kill -0 "$STEP_PID" 2>/dev/null; do
        sleep 2 & wait $!  # interruptible: SIGTERM is handled at once
        repack_if_changed
    done
    wait "$STEP_PID"
    local status=$?
    STEP_PID=
    [ "$status" -eq 124 ] && note "step $name stopped at $why ($limit s)"
    note "step $name ended with status $status after $((SECONDS - START)) s of the stage"
    summarize "$name: status $status$([ "$status" -eq 124 ] && echo " (stopped at $why)") in $((SECONDS - began)) s"
    pack
    return $status
}

summarize() {
    [ -n "${SUMMARY:-}" ] && echo "step $*" >> "$SUMMARY"
    return 0
}

on_signal() {
    note "stage $STAGE: $1 received after $((SECONDS - START)) s; packing what is done"
    [ -n "${STEP_PID:-}" ] && kill -INT "$STEP_PID" 2>/dev/null && wait "$STEP_PID" 2>/dev/null
    [ -n "${BACKGROUND_PID:-}" ] && kill "$BACKGROUND_PID" 2>/dev/null
    summarize "stage: $1 received after $((SECONDS - START)) s"
    pack
    exit "$2"
}

# --------------------------------------------------------------------------- the stages

PYTEST=(-m pytest -q -ra -p no:cacheprovider --durations=15)

headline_header() {
    # What the headline's numbers depend on: the commit, the date, the device and its software.
    echo "# benchmarks/suite/gpu_suite.sh headline, $(date -u +%FT%TZ), commit" \
         "${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}${CPU_CHECK:+, CPU_CHECK=1}"
    "$PYTHON" -m benchmarks.suite.summary software
}

rung_spec() {
    # The JSON of one rung for benchmarks/ladder.py's --measure_rung child: the preset's options and these.
    "$PYTHON" -c 'import json, sys; print(json.dumps({"options": sys.argv[1:], "script": "train.py"}))' \
        "${COMMON[@]}" "$@"
}

headline_rung() {
    # headline_rung NAME SECONDS CAP OPTIONS...: one rung timed as the ladder times it (IO, SYNTHETIC and FULL
    # trials, in a process of its own, its log in the stage's), its summary in headline/NAME.json. A compiled
    # rung holds Inductor's layout optimisation on, as the ladder's compiled rungs do: the last layer's sub-pixel
    # form would otherwise turn it off for the whole graph, and the forms auto and off would differ in more.
    # The variable is benchmarks/ladder.py's COMPILED_ENVIRONMENT (tests/test_gpu_suite.py keeps the two equal).
    local name=$1 need=$2 cap=$3 environment=()
    shift 3
    [[ " $* " == *" --jit_mode=compile "* ]] && environment=(env TORCHINDUCTOR_FORCE_LAYOUT_OPT=1)
    STEP_CAP=$cap step "$name" "$need" "${environment[@]}" "$PYTHON" -m benchmarks.ladder \
        --measure_rung "$(rung_spec "$@")" --result "$RESULTS/headline/$name.json" "${HEADLINE_SIZES[@]}" || return 1
    rung_numbers "$name" "$RESULTS/headline/$name.json"
}

committed_anchor() {
    # The committed ladder's rung that the anchor repeats (the same options), on this device, in summary.txt: after
    # the last step, as the lookup imports the ladder's tools.
    "$PYTHON" -m benchmarks.suite.summary anchor | while read -r line; do summarize "$line"; done
    return 0
}

rung_numbers() {
    # rung_numbers NAME FILE: the rung's numbers in summary.txt (its header has the committed run's, where there is one).
    "$PYTHON" -m benchmarks.suite.summary rung "$@" | while read -r line; do summarize "$line"; done
}

data_made() {
    # Whether the data set the headline started in the background is there (waits for it).
    if [ -n "${BACKGROUND_PID:-}" ]; then
        wait "$BACKGROUND_PID"
        DATA_STATUS=$?
        BACKGROUND_PID=
    fi
    [ "${DATA_STATUS:-1}" -eq 0 ] && [ -f "$DATA_DIR/synthetic_train.h5" ]
}

original_checkout() {
    # A checkout of the original tutorial: ORIGINAL=<folder>, else .carry/sc22-original or ../shared/sc22/original.
    local checkout=${ORIGINAL:-}
    [ -z "$checkout" ] && for checkout in .carry/sc22-original ../shared/sc22/original ""; do
        [ -f "$checkout/train.py" ] && break
    done
    echo "$checkout"
}

original_numbers() {
    # original_numbers DIR: each of the original's runs in summary.txt, its samples/s (the epochs after the first)
    # or its error, from benchmarks/original.py's JSON in DIR.
    "$PYTHON" -m benchmarks.suite.summary original "$1"/*.json | while read -r line; do summarize "$line"; done
    return 0
}

layers_warnings() {
    # layers_warnings DIR: where the profiler traced no kernel here, the step layer by layer measured nothing (the
    # layers step passed): its tables' warning, in summary.txt.
    "$PYTHON" -m benchmarks.suite.summary layers "$1"/*.json | while read -r line; do summarize "$line"; done
    return 0
}

ncu_reason() {
    # ncu_reason DIR: where ncu cannot run here (no ncu, an H200), the ncu step passes with no report: why, from
    # its log, in summary.txt.
    grep -s -m 1 '^ncu_layers: not run: ' "$1/ncu_layers.log" | sed 's/^ncu_layers: not run: /ncu: no report: /' |
        while read -r line; do summarize "$line"; done
    return 0
}

stage_headline() {
    # The numbers that decide, in one command, most valuable first (benchmarks/README.md, the headline): each step is not
    # started where its price no longer fits the budget, is ended at its cap, and is packed as it ends;
    # headline/summary.txt says what ran, with its status and seconds. Every rung names --exact_forms.
    local status=0 dir="$RESULTS/headline" checkout help=() data=1
    mkdir -p "$dir"
    SUMMARY="$dir/summary.txt"
    headline_header > "$SUMMARY"
    # 1. The data set, made on the CPU while the GPU times the layers (which need none).
    "$PYTHON" -c "from benchmarks.common import make_data; make_data('$DATA_DIR', $BOX)" > "$dir/data.log" 2>&1 &
    BACKGROUND_PID=$!
    summarize "set-up: versions written; the data set is being made in the background (data.log)"
    # 2. Each layer plain and in its exact form at the run's shapes, the whole step with the forms auto picks,
    #    the step layer by layer (plain, and in the forms), in the best rung's layout.
    STEP_CAP=150 step layers 110 "$PYTHON" -m benchmarks.layers --preset "$PRESET" "${PRECISION[@]}" --enable_fused \
        --channels_last --exact_forms=auto "${HEADLINE_LAYERS[@]}" --out_dir "$dir/layers" --overwrite || status=1
    layers_warnings "$dir/layers"
    if ! data_made; then
        data= status=1
        note "steps compile-auto, compile-off, original and anchor not run: the data set was not made ($dir/data.log)"
        summarize "compile-auto, compile-off, original, anchor: not run (no data set: data.log)"
    fi
    # 3-4. The best rung compiled (gpu-inmem, bf16, fused Adam, channels_last, torch.compile), the forms auto, then off.
    if [ -n "$data" ]; then
        headline_rung compile-auto 110 150 "${BEST[@]}" --jit_mode=compile --exact_forms=auto || status=1
        headline_rung compile-off 80 120 "${BEST[@]}" --jit_mode=compile --exact_forms=off || status=1
    fi
    # 5. The original's train.py on the same data, two epochs of each run this machine can do (none of this
    #    project's rungs: the others are this stage's). Its train.py needs CUDA: with CPU_CHECK, its --help.
    checkout=$(original_checkout)
    [ -n "$CPU_CHECK" ] && help=(--help)
    if [ -z "$checkout" ] && [ -z "$CPU_CHECK" ]; then
        note "step original not run: no checkout of the original tutorial (ORIGINAL=<folder>, .carry/sc22-original)"
        summarize "original: not run (no checkout of the original: .carry/sc22-original)"
    elif [ -n "$data" ]; then
        STEP_CAP=130 step original 100 "$PYTHON" -m benchmarks.original --original="$checkout" --data_dir "$DATA_DIR" \
            --epochs 2 --rungs none --out_dir "$dir/original" --overwrite "${help[@]}" || status=1
        original_numbers "$dir/original"
    fi
    # 6. Nsight Compute on the first and last layers, plain and in their forms (it says why where it cannot run;
    #    with CPU_CHECK it prints its ncu command and runs the layers without it).
    STEP_CAP=75 step ncu 50 "$PYTHON" -m benchmarks.ncu_layers --preset "$PRESET" "${PRECISION[@]}" --enable_fused \
        --channels_last --exact_forms=off --out_dir "$dir/ncu" --overwrite "${NCU_OPTIONS[@]}" || status=1
    ncu_reason "$dir/ncu"
    # 7. The committed best rung again (eager, channels_last, forms off): this machine against the committed H100.
    if [ -n "$data" ]; then
        headline_rung anchor 70 90 "${BEST[@]}" --jit_mode=none --exact_forms=off || status=1
        committed_anchor
    fi
    echo "stage: $((SECONDS - START)) s of its budget of $((DEADLINE - START)) s" >> "$SUMMARY"
    return $status
}

stage_preflight() {
    step preflight 20 "$PYTHON" -m benchmarks.suite.preflight --out_dir "$RESULTS" --nsys_timeout 30  # writes $PREFLIGHT
}

stage_ladder() {
    # The cumulative ladder's GPU-resident rungs, each in a process of its own; the compile rungs skip
    # themselves, with the reason, where torch.compile cannot build; DALI's and the host loaders' are the
    # dali stage's, the rungs alone the ladder-alone stage's.
    step ladder 500 "$PYTHON" -m benchmarks.ladder --preset "$PRESET" --group ladder --data_dir "$DATA_DIR" \
        --out_dir "$RESULTS" --overwrite --batch_sweep "${LADDER_SIZES[@]}"  # the sweep is the batch-sweep stage's
}

stage_batch-sweep() {
    # The ladder's top rung (everything together) at the base config's local batch of 64, then at 128 and 256,
    # with peak memory (64 is the top rung's own measurement: not measured twice).
    step batch-sweep 360 "$PYTHON" -m benchmarks.ladder --preset "$PRESET" --group ladder --only "compile's CUDA graphs" \
        --data_dir "$DATA_DIR" --out_dir "$RESULTS/batch-sweep" --overwrite --batch_sweep 128 256 "${LADDER_SIZES[@]}"
}

stage_ladder-alone() {
    # Each GPU-resident rung alone on bf16 + fused Adam, in a folder of its own (the ladder's files keep their names).
    step ladder-alone 340 "$PYTHON" -m benchmarks.ladder --preset "$PRESET" --group alone --data_dir "$DATA_DIR" \
        --out_dir "$RESULTS/ladder-alone" --overwrite "${LADDER_SIZES[@]}"
}

stage_profiles() {
    local nsys=(--nsys) status=0 decided
    decided=$(nsys_decided)
    case $decided in
        false) nsys=(); note "profiles without nsys: the preflight saw it write no report" ;;
        unknown) note "profiles: no preflight says whether nsys writes reports; the profiles tool probes it (at most 45 s)" ;;
    esac
    step profiles 340 "$PYTHON" -m benchmarks.profiles --preset "$PRESET" --data_dir "$DATA_DIR" "${nsys[@]}" \
        --timeout 120 --out_dir "$RESULTS/profiles" --overwrite "${PROFILE_ONLY[@]}" || status=1
    # In the best rung's layout (bf16 with the preset, fused Adam, channels_last): the step layer by layer too.
    step layers 100 "$PYTHON" -m benchmarks.layers --preset "$PRESET" --out_dir "$RESULTS/layers" --overwrite \
        --enable_fused --channels_last "${LAYERS_SIZES[@]}" || status=1
    # The first step's cost of cuDNN's autotuning, where this tree has the tool (its output is in this
    # stage's log; with CPU_CHECK its --help: the GPU measures it).
    local tune=()
    [ -n "$CPU_CHECK" ] && tune=(--help)
    if [ -f benchmarks/cudnn_autotune.py ]; then
        step cudnn-autotune 60 "$PYTHON" -m benchmarks.cudnn_autotune "${tune[@]}" || status=1
    else
        note "step cudnn-autotune not run: benchmarks/cudnn_autotune.py is not in this tree"
    fi
    return $status
}

# The GPU-only tests of each stage (pytest -k): the out-of-memory tests go with the distributed ones, whose
# stage has the room.
GPU_TESTS="not compile and not dali and not cuda_distributed and not out_of_memory"
DISTRIBUTED_TESTS="cuda_distributed or out_of_memory"

stage_tests-gpu() {
    # The GPU-only tests (marked gpu: CUDA graphs, no host syncs, the profiling window and its kernels, a
    # capturable resume, device prefetch and gradient accumulation) but torch.compile's, DALI's, the
    # distributed ones and the out-of-memory ones. SIGINT at the limit: pytest stops and still prints its summary.
    step tests-gpu 240 "$PYTHON" "${PYTEST[@]}" -m gpu -k "$GPU_TESTS" --junitxml="$RESULTS/gpu_suite-tests-gpu.xml"
}

stage_tests-compile() {
    # torch.compile's GPU tests (reduce-overhead's CUDA graphs through training and validation); they skip
    # themselves, with the reason, where torch.compile cannot build.
    step tests-compile 140 "$PYTHON" "${PYTEST[@]}" -m gpu -k compile --junitxml="$RESULTS/gpu_suite-tests-compile.xml"
}

stage_tests-distributed() {
    # DDP (buckets, comm hooks), FSDP, gradient accumulation, the device prefetcher under DDP and --resume
    # on CUDA tensors, each against one rank: two ranks share this GPU over gloo (DIST_BACKEND=gloo), which
    # NCCL refuses. gloo sends no CUDA tensor point to point, so the domain mesh's halo exchange is the
    # multi-gpu stage's (tests/test_cuda_distributed.py says what stays untested without NCCL). Then the
    # out-of-memory tests: a real CUDA out-of-memory error, and an absurd local batch.
    step tests-distributed 410 "$PYTHON" "${PYTEST[@]}" -m gpu -k "$DISTRIBUTED_TESTS" \
        --junitxml="$RESULTS/gpu_suite-tests-distributed.xml"
}

stage_scaling() {
    # The weak-scaling points this node can give (docs/04-distributed.md, "Multi-GPU performance"): benchy trials at 1,
    # 2, 4, ... ranks up to its GPUs, with DDP and with --noddp. On one GPU train.py does not wrap the
    # model in DDP, so the two differ by run-to-run noise only: the baseline multi-GPU overheads are
    # read against.
    step scaling 90 "$PYTHON" -m benchmarks.scaling --preset "$PRESET" --data_dir "$DATA_DIR" --timeout 120 \
        --out_dir "$RESULTS/scaling" --overwrite "${SCALING_SIZES[@]}"
}

stage_graph-lesson() {
    # The CUDA-graph lesson where the host's launches set the pace: eager against train_graph.py's graph at the
    # demo's width, crop 32, local batch 1, 2, 4 and 8 (benchmarks/graph_lesson.py; its production point is
    # the ladder's). A CUDA graph needs a GPU: with CPU_CHECK, its --help.
    local help=()
    [ -n "$CPU_CHECK" ] && help=(--help)
    step graph-lesson 170 "$PYTHON" -m benchmarks.graph_lesson --no_production --extra=--exact_forms=off \
        --out_dir "$RESULTS/graph-lesson" --overwrite "${help[@]}"
}

stage_dali() {
    # Run in the command that installs DALI (benchmarks/suite/pack_dali.sh's parts, gathered on the machine over
    # the DALI session's commands, the last extracted into the site folder on PYTHONPATH):
    # DALI's GPU tests first (30 s; on one H100 the host loaders' rungs alone took 234 s of the budget),
    # then its profile (the profiles stage has no DALI), then the ladder's DALI rung (where DALI imports)
    # and the host loaders' rungs.
    local status=0 dali=1
    "$PYTHON" -c 'import nvidia.dali' 2>/dev/null || { dali=; note "DALI does not import here: its rung, profile and tests skip"; }
    step tests-dali 30 "$PYTHON" "${PYTEST[@]}" -m gpu -k dali --junitxml="$RESULTS/gpu_suite-dali.xml" \
        || status=1
    if [ -n "$dali" ]; then
        step profile-dali 50 "$PYTHON" -m benchmarks.profiles --preset "$PRESET" --data_dir "$DATA_DIR" --only dali \
            --timeout 120 --out_dir "$RESULTS/profiles-dali" --overwrite || status=1
    fi
    step loaders 260 "$PYTHON" -m benchmarks.ladder --preset "$PRESET" --group loaders --data_dir "$DATA_DIR" \
        --out_dir "$RESULTS/loaders" --overwrite "${LADDER_SIZES[@]}" "${LOADER_ONLY[@]}" || status=1
    return $status
}

multi_gpu_run() {
    # multi_gpu_run NAME SECONDS SCRIPT OPTIONS...: one torchrun of 2 ranks over NCCL, its log kept.
    local name=$1 need=$2 script=$3
    shift 3
    step "$name" "$need" bash -c '"$@" > "'"$RESULTS/multi-gpu/$name.log"'" 2>&1' _ \
        "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node=2 "$script" "$@" \
        --train_path="$DATA_DIR/synthetic_train.h5" --val_path="$DATA_DIR/synthetic_valid.h5" --device=cuda \
        --expdir="$RESULTS/multi-gpu/runs" --run_num="$name" --checkpoint=false
}

stage_multi-gpu() {
    # What one GPU cannot cover (world size 1 makes no process group; NCCL refuses two ranks on one GPU):
    # two-rank runs of DDP, FSDP, domain parallelism [2,1,1] (halo exchange over NCCL) and the CUDA-graph
    # step under DDP. The weak-scaling points up to this node's GPUs are the scaling stage's.
    local status=0 gpus
    gpus=$(cuda_gpus)
    if [ "$gpus" -lt 2 ]; then
        note "steps ddp, fsdp, domain and graph-ddp not run: they need 2 CUDA GPUs over NCCL, and this machine has $gpus"
        return 0
    fi
    mkdir -p "$RESULTS/multi-gpu"
    step data 20 "$PYTHON" -c "from benchmarks.common import make_data; make_data('$DATA_DIR', 256)" || return 1
    multi_gpu_run ddp 40 train.py --config=test --Nsamples=64 || status=1
    multi_gpu_run fsdp 40 train.py --config=test --Nsamples=64 --parallel=fsdp || status=1
    multi_gpu_run domain 40 train.py --config=domain_demo || status=1
    multi_gpu_run graph-ddp 40 train_graph.py --config=test --Nsamples=64 --graph_warmup_steps=3 --enable_fused || status=1
    return $status
}

nsys_route() {
    # nsys_route NAME NSYS: train.py's profiling window (the test config on the GPU, two steps of epoch 2)
    # under NSYS, as submit_pm.sh's ENABLE_PROFILING does and with the sampling and CPU context switches
    # off; its log says which nsys, its version, the command, and what it wrote (a report, or a .qdstrm
    # capture to import with QdstrmImporter of the same version elsewhere).
    local name=$1 nsys=$2 dir="$RESULTS/nsys-probe" start=$SECONDS status scope environment
    # A report keeps the environment of each process nsys sees: the run's own processes alone (a PID
    # namespace, where the machine allows one) in the environment it needs (benchmarks/nsight.py).
    mapfile -t scope < <("$PYTHON" -c 'from benchmarks.nsight import own_processes; print(*own_processes(), sep="\n")')
    mapfile -t environment < <("$PYTHON" -c 'from benchmarks.nsight import profile_environment
print(*(f"{key}={value}" for key, value in profile_environment().items()), sep="\n")')
    local profile=("$nsys" profile --trace=cuda,nvtx --sample=none --cpuctxsw=none -c cudaProfilerApi --kill none
                   -f true -o "$dir/$name" "$PYTHON" train.py --config=test --device=cuda
                   --train_path="$DATA_DIR/synthetic_train.h5" --val_path="$DATA_DIR/synthetic_valid.h5"
                   --expdir="$dir/runs" --run_num="$name" --enable_manual_profiling --profile_start_epoch=2
                   --profile_steps=2 --checkpoint=false --preview_image=false)
    {
        echo "# nsys route $name: $nsys"
        timeout 20 "$nsys" --version 2>&1
        echo "# scope: ${scope[*]:-every process of the machine (no PID namespace here)}; environment:" \
             "${environment[*]%%=*}"
        echo "\$ ${profile[*]}"
        timeout -s INT -k 10 "$NSYS_LIMIT" env -i "${environment[@]}" "${scope[@]}" "${profile[@]}" 2>&1
        status=$?
        echo "# exit status $status after $((SECONDS - start)) s (limit $NSYS_LIMIT s); wrote:"
        ls -la "$dir/$name".* 2>&1 | grep -v '\.log$'
    } > "$dir/$name.log" 2>&1
    note "nsys route $name: $(tail -n +2 "$dir/$name.log" | grep -m1 -i 'version' || echo 'no version');" \
         "$(grep -o 'exit status [0-9]*' "$dir/$name.log"); log $dir/$name.log"
    [ -f "$dir/$name.nsys-rep" ] || [ -f "$dir/$name.qdstrm" ]
}

stage_original() {
    # The original tutorial's train.py beside this project's rungs on the same data (benchmarks/original.py),
    # from a checkout of the original: ORIGINAL=<folder>, by default .carry/sc22-original (the plan carries a
    # copy there) or ../shared/sc22/original.
    local checkout help=()
    checkout=$(original_checkout)
    if [ -n "$CPU_CHECK" ]; then
        help=(--help)  # the original's train.py needs CUDA: the GPU measures it
    elif [ -z "$checkout" ]; then
        note "step original not run: no checkout of the original tutorial (ORIGINAL=<folder>, .carry/sc22-original)"
        return 1
    fi
    step original 510 "$PYTHON" -m benchmarks.original --original="$checkout" --data_dir "$DATA_DIR" \
        --out_dir "$RESULTS/original" --overwrite "${help[@]}"
}

stage_nsys-probe() {
    # Whether Debian's nsight-systems-target 2022.4 CLI, carried as its .deb in .carry/nsys/ (contrib non-free in
    # the Debian source, apt-get update, apt-get download nsight-systems-target: python -m benchmarks.nsight
    # fetch) and unpacked here, writes a report of train.py's profiling window on this GPU (given NSYS_LIMIT s).
    # The machine's own nsys is not tried: a target-only copy (inside Nsight Compute's folder) writes a .qdstrm
    # capture that only the QdstrmImporter of its own version can turn into a report.
    local status=0 nsys deb gpus unpacked
    mkdir -p "$RESULTS/nsys-probe"
    gpus=$(cuda_gpus)
    deb=$(ls .carry/nsys/nsight-systems-target_*.deb 2>/dev/null | head -n 1)
    if [ -z "$deb" ]; then
        note "step nsys-debian not run: no .carry/nsys/nsight-systems-target_*.deb carried" |
            tee "$RESULTS/nsys-probe/debian.log"
        return 0
    elif [ "$gpus" = 0 ]; then
        note "step nsys-debian not run: no CUDA GPU to profile" | tee "$RESULTS/nsys-probe/debian.log"
        return 0
    fi
    step data 20 "$PYTHON" -c "from benchmarks.common import make_data; make_data('$DATA_DIR', 256)" || return 1
    export -f nsys_route note  # run by step (under timeout), in a shell of their own
    export RESULTS PYTHON DATA_DIR NSYS_LIMIT
    unpacked=$(mktemp -d)
    { dpkg-deb -x "$deb" "$unpacked" 2>/dev/null || (cd "$unpacked" && ar p "$OLDPWD/$deb" 'data.tar.*' | tar xJ); }
    nsys=$(find "$unpacked" -type f -name nsys -perm -u+x | head -n 1)
    if [ -z "$nsys" ]; then
        note "step nsys-debian not run: $deb holds no nsys executable" | tee "$RESULTS/nsys-probe/debian.log"
        status=1
    else
        step nsys-debian 130 bash -c 'nsys_route "$@"' _ debian "$nsys" || status=1
    fi
    rm -rf "$unpacked"
    return $status
}

# --------------------------------------------------------------------------- the command line

case "${1:-}" in
    --help|-h) usage; exit 0 ;;
    --plan) shift; exec "$PYTHON" -m benchmarks.suite.plan --limit "$STAGE_LIMIT" "$@" ;;
    "") set -- $STAGES ;;  # every stage, on this machine's GPU(s)
    -*) echo "gpu_suite.sh: unknown option '$1' (--plan, --help; or name stages: $STAGES)" >&2; exit 2 ;;
esac
for stage in "$@"; do
    [[ " $STAGES " == *" $stage "* ]] || { echo "gpu_suite.sh: unknown stage '$stage' ($STAGES; or --plan, --help)" >&2; exit 2; }
    if [ "$stage" != preflight ] && [ -z "$CPU_CHECK" ] && [ "$(cuda_gpus)" = 0 ]; then
        echo "gpu_suite.sh: error: PyTorch ($PYTHON) sees no CUDA GPU, and stage $stage measures one. On a CPU" \
             "run 'benchmarks/suite/gpu_suite.sh preflight', 'python -m benchmarks.ladder --preset cpu' and" \
             "'python -m benchmarks.profiles --preset cpu' (or CPU_CHECK=1 to check the stages' set-up)." >&2
        exit 2
    fi
done

note "stages: $*; results under $RESULTS/. What each measures, where it writes, and its time in the committed logs:"
"$PYTHON" -m benchmarks.suite.plan --overview "$@" --results "$RESULTS" 2>/dev/null ||
    note "(no overview: $PYTHON cannot import benchmarks.suite.plan)"
mkdir -p "$RESULTS"
[ -n "${OUT:-}" ] && mkdir -p "$OUT"
RUN_STAMP=$(mktemp)  # what this invocation writes is newer
failed=() summary=()
for STAGE in "$@"; do
    START=$SECONDS
    budget=${BUDGET[$STAGE]}
    # A CPU check's times are a CPU's, not the GPU's budgets; on this machine's own GPU (no OUT) only the
    # limit guards against a hung step.
    [ -n "$CPU_CHECK" ] || [ -z "${OUT:-}" ] && budget=$STAGE_LIMIT
    [ "$budget" -gt "$STAGE_LIMIT" ] && budget=$STAGE_LIMIT
    DEADLINE=$((START + budget))
    STAMP=$(mktemp) PACKED=$(mktemp) SUMMARY=
    touch -d '-2 seconds' "$STAMP"  # files written in this second count as the stage's
    log="$RESULTS/gpu_suite-$STAGE-$(date -u +%Y-%m-%d).log"
    trap 'on_signal SIGTERM 143' TERM
    trap 'on_signal SIGINT 130' INT
    {
        echo "# benchmarks/suite/gpu_suite.sh $STAGE, $(date -u +%FT%TZ), budget $budget s, commit" \
             "${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}${CPU_CHECK:+, CPU_CHECK=1}"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
    } > "$log"
    note "stage $STAGE started $(date -u +%FT%TZ), budget $budget s; log: $log" | tee -a "$log"
    "stage_$STAGE" > >(tee -a "$log") 2>&1
    status=$?
    note "stage $STAGE ended with status $status after $((SECONDS - START)) s" | tee -a "$log"
    trap - TERM INT
    [ "$status" -eq 0 ] || failed+=("$STAGE")
    pack || failed+=("pack-$STAGE")
    verdict=passed
    [ "$status" -eq 0 ] || verdict="FAILED (status $status)"
    summary+=("  $STAGE: $verdict in $((SECONDS - START)) s; log $log; results: $(stage_results)")
    rm -f "$STAMP" "$PACKED"
done
rm -f "$RUN_STAMP"
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd, -)
note "what ran, on ${gpus:-this machine (nvidia-smi lists no GPU)}:"
printf '%s\n' "${summary[@]}"
[ ${#failed[@]} -eq 0 ] || { note "failed stages: ${failed[*]}"; exit 1; }
note "all stages passed: $*"
