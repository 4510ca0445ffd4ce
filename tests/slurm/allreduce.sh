#!/bin/bash
#SBATCH -J unet-allreduce
#SBATCH -o %x-%j.out
# gloo all-reduce times between the tasks of the allocation (benchmarks/allreduce.py), submitted from
# the top-level folder of the repository; one task per node measures the network between the nodes:
#
#   sbatch -N 2 --ntasks-per-node=1 --cpus-per-task=1 tests/slurm/allreduce.sh [--repeats 5 --warmup 2]
#   python -m benchmarks.allreduce --parse unet-allreduce-<jobid>.out --name <name> --where "<where>"
#
# The ranks find each other as train.py's do under submit_pm.sh: MASTER_ADDR is the first node,
# export_DDP_vars.sh maps Slurm's task variables. PYTHON defaults to the repository's .venv.
set -euo pipefail
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR MASTER_PORT=${MASTER_PORT:-29500} OMP_NUM_THREADS=1
PYTHON=${PYTHON:-$PWD/.venv/bin/python}
srun -u bash -c 'source export_DDP_vars.sh && exec "$0" -m benchmarks.allreduce "$@"' "$PYTHON" "$@"
