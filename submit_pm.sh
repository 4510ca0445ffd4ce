#!/bin/bash
#SBATCH -C gpu
#SBATCH -A your_account_g
#SBATCH --ntasks-per-node 4
#SBATCH --cpus-per-task 32
#SBATCH --gpus-per-node 4
#SBATCH --time=01:00:00
#SBATCH -J unet
#SBATCH -o %x-%j.out
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@180
#SBATCH --requeue
##SBATCH --reservation=<reservation>
#
# Train the U-Net on Perlmutter (one rank per GPU), from the top-level folder of this repository:
#
#   sbatch -n 4 ./submit_pm.sh --config=bs64_opt --num_epochs 4       # one node, 4 GPUs
#   sbatch -N 2 ./submit_pm.sh --config=bs256_opt --local_batch_size=32  # two nodes, 8 GPUs
#   ENABLE_PROFILING=1 PROFILE_OUTPUT=4gpu_baseline sbatch -n 4 ./submit_pm.sh --config=bs64_opt --num_epochs 4 \
#       --num_data_workers 8 --local_batch_size 16 --enable_apex --enable_jit --enable_manual_profiling
#   BENCHY_OUTPUT=weak_scale sbatch -N 8 ./submit_pm.sh --num_data_workers 4 --local_batch_size 64 \
#       --config=bs64_opt --enable_benchy --num_epochs 15                # weak scaling: 64 per GPU
#
# Every argument goes to train.py unchanged (quoted: spaces and shell characters stay as typed).
# The output is <job name>-<job id>.out in the submit directory. Change "-A your_account_g" above
# to your project (or pass -A on the sbatch command line); ##SBATCH lines are switched off.
#
# The #SBATCH lines describe Perlmutter. Options given to sbatch on its command line override them,
# so the unchanged script runs on other clusters, e.g. a node without GPUs and with 2 CPUs
# (an empty --constraint removes "-C gpu"; -A is only checked where accounting is enforced):
#   sbatch -n 2 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 --constraint= \
#          ./submit_pm.sh --config=test --device=cpu
#
# Environment variables (set them on the sbatch command line: sbatch passes its environment on):
#   CONTAINER      shifter (default, as on Perlmutter) | podman-hpc | none (this machine's Python:
#                  the repository's .venv/bin/python if there is one, else python3; override with PYTHON)
#   IMAGE          the container image (default unet3d-dl-tutorial:latest, built from docker/Dockerfile;
#                  for shifter push it to a registry, `shifterimg pull` it and set IMAGE to that name).
#                  It is given to shifter at run time (shifter --image=...), not as "#SBATCH --image",
#                  because sbatch refuses that option on clusters without shifter's Slurm plug-in.
#                  SHIFTER_MODULES (default gpu,nccl-plugin) and PODMAN_FLAGS (default --gpu) add options.
#   DATA_DIR       folder with the data files (default: the tutorial's Perlmutter copy); it must exist.
#                  Containers see it as /data. TRAIN_FILE and VAL_FILE name the files in it (default
#                  downsamp_2048crop_train.h5 and downsamp_1024crop_valid.h5; synthetic_train.h5 and
#                  synthetic_valid.h5 for `python -m utils.generate_data`). A --train_path/--val_path
#                  argument wins over them.
#   LOG_DIR        where runs go (default $SCRATCH/sc22-dl-tutorial/logs, or ./runs without $SCRATCH);
#                  containers see it as /logs. Runs are <LOG_DIR>/<config>/<N>GPU/<run_num>/.
#   TRAIN_SCRIPT   train.py (default) or train_graph.py
#   ENABLE_PROFILING=1, PROFILE_OUTPUT=name   run every rank under
#                  nsys profile --trace=cuda,cudnn,nvtx --kill none -c cudaProfilerApi -f true -o name
#                  (ranks other than 0 write name_rank<N>); nsys must be on PATH where the ranks run.
#   BENCHY_OUTPUT, BENCHY_CONFIG_FILE   passed to the ranks for --enable_benchy: results go to
#                  $BENCHY_OUTPUT.json; the trials are set in benchy_config.yaml unless BENCHY_CONFIG_FILE.
#   MASTER_PORT    the rendezvous port on the first node (default 29500); MASTER_ADDR is that node.
#   REVERSE_GPUS   1 (default) reverses CUDA_VISIBLE_DEVICES to match Perlmutter's CPU affinity; 0 keeps it.
#
# Time limit and requeue: Slurm sends SIGUSR1 to this script 180 s before the time limit
# (--signal=B:USR1@180; change it with sbatch --signal=B:USR1@SECONDS). The script forwards it to the
# ranks, which finish the current step, write a checkpoint and exit; then it requeues the job
# (scontrol requeue). The requeued job keeps its job id and runs this script again with
# SLURM_RESTART_COUNT > 0, which adds --resume, so training continues from the checkpoint. The run
# directory stays the same because, unless you pass --run_num, the run is named after the job id
# (--run_num=$SLURM_JOB_ID). The output file is appended to, so it holds every attempt.
set -uo pipefail

say() { echo "$(date '+%Y-%m-%d %H:%M:%S') submit_pm.sh: $*"; }
fail() { echo "submit_pm.sh: error: $*" >&2; exit 2; }

usage() {  # the comment block at the top of this file
    awk 'NR == 1 || /^#+SBATCH/ { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0" 2>/dev/null
}

if [ -z "${SLURM_JOB_ID:-}" ]; then
    usage >&2
    echo >&2
    fail "not running under Slurm (SLURM_JOB_ID is not set). Submit it with sbatch from the top-level" \
         "folder of the repository, e.g.: sbatch -n 4 ./submit_pm.sh --config=bs64_opt"
fi

# ------------------------------------------------------------------ the time-limit signal
STOP_REQUESTED=0
SRUN_PID=
# shellcheck disable=SC2317  # runs from the trap
on_usr1() {
    STOP_REQUESTED=1
    say "received SIGUSR1 (the time limit is near): asking the ranks to checkpoint and stop."
    if [ -n "$SRUN_PID" ] && kill -0 "$SRUN_PID" 2>/dev/null; then
        kill -USR1 "$SRUN_PID"  # srun forwards it to every task
    fi
}
trap on_usr1 USR1

requeue() {
    say "requeueing job $SLURM_JOB_ID; it will continue from the last checkpoint (--resume)."
    if scontrol requeue "$SLURM_JOB_ID"; then
        exit 0  # Slurm ends this attempt and starts the job again later
    fi
    echo "submit_pm.sh: error: scontrol requeue $SLURM_JOB_ID failed (was the job submitted with" \
         "--no-requeue?). Resume by hand: submit again with the same arguments plus --resume$RUN_NUM_HINT." >&2
    exit "${1:-1}"
}

# ------------------------------------------------------------------ settings and checks
REPO_DIR=$PWD  # the job runs in the submit directory: the top-level folder of the repository
CONTAINER=${CONTAINER:-shifter}
IMAGE=${IMAGE:-unet3d-dl-tutorial:latest}
DATA_DIR=${DATA_DIR:-/pscratch/sd/j/joshr/nbody2hydro/datacopies}
TRAIN_FILE=${TRAIN_FILE:-downsamp_2048crop_train.h5}
VAL_FILE=${VAL_FILE:-downsamp_1024crop_valid.h5}
if [ -n "${SCRATCH:-}" ]; then
    LOG_DIR=${LOG_DIR:-$SCRATCH/sc22-dl-tutorial/logs}
else
    LOG_DIR=${LOG_DIR:-$REPO_DIR/runs}
fi
TRAIN_SCRIPT=${TRAIN_SCRIPT:-train.py}

case "$CONTAINER" in
    shifter | podman-hpc | none) ;;
    *) fail "unknown container runtime CONTAINER='$CONTAINER'. Use CONTAINER=shifter (Perlmutter's" \
            "default), CONTAINER=podman-hpc, or CONTAINER=none (this machine's Python environment)." ;;
esac
if [ ! -f "$REPO_DIR/$TRAIN_SCRIPT" ] || [ ! -f "$REPO_DIR/export_DDP_vars.sh" ]; then
    fail "$REPO_DIR has no $TRAIN_SCRIPT or no export_DDP_vars.sh. Submit from the top-level folder of" \
         "the repository (the job runs in the submit directory), and set TRAIN_SCRIPT to train.py or" \
         "train_graph.py."
fi
[ -d "$DATA_DIR" ] \
    || fail "the data directory DATA_DIR=$DATA_DIR does not exist. Set DATA_DIR to the folder holding the" \
            "data files, e.g. DATA_DIR=\$PWD/data TRAIN_FILE=synthetic_train.h5 VAL_FILE=synthetic_valid.h5" \
            "for the synthetic set (make it with: python -m utils.generate_data --out_dir data)."

# Was an option given by the user? (--key, --key=value; dashes or underscores, as train.py reads them)
has_option() {
    local key=$1 dashed=${1//_/-} arg
    for arg in "${USER_ARGS[@]}"; do
        case "$arg" in
            "--$key" | "--$key="* | "--$dashed" | "--$dashed="*) return 0 ;;
        esac
    done
    return 1
}
USER_ARGS=("$@")

if ! has_option train_path && [ ! -f "$DATA_DIR/$TRAIN_FILE" ]; then
    fail "DATA_DIR=$DATA_DIR holds no $TRAIN_FILE. Set TRAIN_FILE to the training file's name in DATA_DIR," \
         "or pass --train_path=PATH."
fi
if ! has_option val_path && [ ! -f "$DATA_DIR/$VAL_FILE" ]; then
    fail "DATA_DIR=$DATA_DIR holds no $VAL_FILE. Set VAL_FILE to the validation file's name in DATA_DIR," \
         "or pass --val_path=PATH."
fi
mkdir -p "$LOG_DIR" || fail "cannot create LOG_DIR=$LOG_DIR."
DATA_DIR=$(cd "$DATA_DIR" && pwd)  # absolute paths, for the container mounts and the log
LOG_DIR=$(cd "$LOG_DIR" && pwd)

if [ "$CONTAINER" = none ]; then
    DATA_MOUNT=$DATA_DIR
    LOG_MOUNT=$LOG_DIR
    if [ -z "${PYTHON:-}" ]; then
        if [ -x "$REPO_DIR/.venv/bin/python" ]; then
            PYTHON=$REPO_DIR/.venv/bin/python
        elif command -v python3 >/dev/null; then
            PYTHON=python3
        else
            PYTHON=python
        fi
    fi
    if [ "${ENABLE_PROFILING:-0}" = 1 ] && ! command -v nsys >/dev/null; then
        fail "ENABLE_PROFILING=1 but nsys (NVIDIA Nsight Systems) is not on PATH. Load it (module load" \
             "nsight-systems, or install it), or submit without ENABLE_PROFILING."
    fi
else
    DATA_MOUNT=/data
    LOG_MOUNT=/logs
    PYTHON=${PYTHON:-python}
fi

# The arguments for train.py: the data and log locations and a stable run name, then the user's own
# arguments (the last occurrence of an option wins in train.py, so the user's choice always stands).
ARGS=("--expdir=$LOG_MOUNT")
has_option train_path || ARGS+=("--train_path=$DATA_MOUNT/$TRAIN_FILE")
has_option val_path || ARGS+=("--val_path=$DATA_MOUNT/$VAL_FILE")
RUN_NUM_HINT=
if ! has_option run_num; then
    ARGS+=("--run_num=$SLURM_JOB_ID")
    RUN_NUM_HINT=" --run_num=$SLURM_JOB_ID"
fi
RESTARTS=${SLURM_RESTART_COUNT:-0}
if [ "$RESTARTS" -gt 0 ] && ! has_option resume; then
    say "restart $RESTARTS of job $SLURM_JOB_ID: continuing from the checkpoint (--resume)."
    ARGS+=("--resume")
fi
ARGS+=("${USER_ARGS[@]}")

# ------------------------------------------------------------------ environment of the ranks
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
[ -n "$MASTER_ADDR" ] || fail "could not read the first node of the allocation from SLURM_JOB_NODELIST."
export MASTER_ADDR
export MASTER_PORT=${MASTER_PORT:-29500}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
export NCCL_NET_GDR_LEVEL=${NCCL_NET_GDR_LEVEL:-PHB}
export FI_MR_CACHE_MONITOR=${FI_MR_CACHE_MONITOR:-userfaultfd}
export HDF5_USE_FILE_LOCKING=${HDF5_USE_FILE_LOCKING:-FALSE}
export ENABLE_PROFILING=${ENABLE_PROFILING:-0}
export PROFILE_OUTPUT=${PROFILE_OUTPUT:-profile_$SLURM_JOB_ID}
# Since Slurm 22.05 srun does not inherit --cpus-per-task from sbatch: pass it on, so that each rank
# (and its data-loader workers) gets its CPUs; one compute thread per CPU of the rank.
if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then
    export SRUN_CPUS_PER_TASK=${SRUN_CPUS_PER_TASK:-$SLURM_CPUS_PER_TASK}
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$SLURM_CPUS_PER_TASK}
fi
[ -z "${BENCHY_OUTPUT:-}" ] || export BENCHY_OUTPUT
[ -z "${BENCHY_CONFIG_FILE:-}" ] || export BENCHY_CONFIG_FILE
# Perlmutter's GPU 0 is closest to the last CPU cores: reverse the order to match Slurm's CPU affinity.
if [ "${REVERSE_GPUS:-1}" = 1 ] && [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    IFS=, read -r -a gpus <<<"$CUDA_VISIBLE_DEVICES"
    reversed=
    for ((i = ${#gpus[@]} - 1; i >= 0; i--)); do reversed+=${reversed:+,}${gpus[i]}; done
    export CUDA_VISIBLE_DEVICES=$reversed
fi

# What each task runs (inside the container, if any): the DDP variables from Slurm's, then train.py,
# under nsys when profiling. Its arguments arrive as "$@", one word each, never re-parsed by a shell.
# shellcheck disable=SC2016  # expanded by the task's shell, not here
TASK='
source ./export_DDP_vars.sh || exit 2
echo "$(date "+%Y-%m-%d %H:%M:%S") submit_pm.sh: rank $RANK (local rank $LOCAL_RANK) of $WORLD_SIZE on $(hostname)"
if [ "$ENABLE_PROFILING" = 1 ]; then
    if ! command -v nsys >/dev/null; then
        echo "submit_pm.sh: error: ENABLE_PROFILING=1 but nsys (Nsight Systems) is not on PATH where the ranks run (image or module)." >&2
        exit 2
    fi
    output=$PROFILE_OUTPUT
    [ "$RANK" = 0 ] || output=${PROFILE_OUTPUT}_rank$RANK
    set -- nsys profile --trace=cuda,cudnn,nvtx --kill none -c cudaProfilerApi -f true -o "$output" "$@"
fi
exec "$@"'

case "$CONTAINER" in
    shifter)
        RUNTIME=(shifter "--image=$IMAGE" "--module=${SHIFTER_MODULES:-gpu,nccl-plugin}"
                 -V "$DATA_DIR:$DATA_MOUNT" -V "$LOG_DIR:$LOG_MOUNT") ;;
    podman-hpc)
        # podman passes no environment by default: name what the ranks need (-e NAME copies it if set).
        read -r -a podman_flags <<<"${PODMAN_FLAGS---gpu}"  # words, split on spaces
        RUNTIME=(podman-hpc run --rm --net host --ipc host "${podman_flags[@]}"
                 -v "$DATA_DIR:$DATA_MOUNT" -v "$LOG_DIR:$LOG_MOUNT" -v "$REPO_DIR:$REPO_DIR" -w "$REPO_DIR")
        for name in SLURM_PROCID SLURM_LOCALID SLURM_NTASKS SLURM_NPROCS MASTER_ADDR MASTER_PORT \
                    PYTORCH_CUDA_ALLOC_CONF NCCL_NET_GDR_LEVEL FI_MR_CACHE_MONITOR HDF5_USE_FILE_LOCKING \
                    OMP_NUM_THREADS CUDA_VISIBLE_DEVICES ENABLE_PROFILING PROFILE_OUTPUT BENCHY_OUTPUT \
                    BENCHY_CONFIG_FILE; do
            RUNTIME+=(-e "$name")
        done
        RUNTIME+=("$IMAGE") ;;
    none)
        RUNTIME=() ;;
esac

COMMAND=(srun -u "${RUNTIME[@]}" bash -c "$TASK" submit_pm-task "$PYTHON" "$TRAIN_SCRIPT" "${ARGS[@]}")
say "job $SLURM_JOB_ID: ${SLURM_NTASKS:-?} rank(s) on $SLURM_JOB_NODELIST, MASTER_ADDR=$MASTER_ADDR:$MASTER_PORT," \
    "container $CONTAINER, data $DATA_DIR, logs $LOG_DIR${CUDA_VISIBLE_DEVICES:+, CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES}"
say "running: srun -u ${RUNTIME[*]}${RUNTIME[*]:+ }<task> $PYTHON $TRAIN_SCRIPT$(printf ' %q' "${ARGS[@]}")"

if [ "$STOP_REQUESTED" = 1 ]; then
    requeue 1  # the warning came before training started: nothing to save
fi

"${COMMAND[@]}" &
SRUN_PID=$!
# wait returns early whenever the USR1 trap runs; keep waiting until srun itself has ended.
while kill -0 "$SRUN_PID" 2>/dev/null; do
    wait "$SRUN_PID"
done
wait "$SRUN_PID"
status=$?
SRUN_PID=

if [ "$STOP_REQUESTED" = 1 ] && [ "$status" -ne 0 ]; then
    say "the ranks stopped with status $status after the time-limit warning."
    requeue "$status"
fi
say "training ended with status $status."
exit "$status"
