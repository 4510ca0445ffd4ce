#!/bin/bash
#SBATCH -J unet-allreduce
#SBATCH -o %x-%j.out
# The all-reduce sweep of benchmarks/allreduce.py between the tasks of the allocation, submitted from the
# top-level folder of the repository. One task per GPU (NCCL) or, on CPU nodes, one per node (gloo):
#
#   sbatch -N 4 --ntasks-per-node=4 --gpus-per-node=4 tests/slurm/allreduce.sh --out network-4-nodes.json
#   sbatch -N 2 --ntasks-per-node=1 --cpus-per-task=1 tests/slurm/allreduce.sh --max_bytes 64M --out two-nodes.json
#   for n in 1 2 4 8; do sbatch -N $n ... tests/slurm/allreduce.sh --out network-$n-nodes.json; done
#
# The arguments go to benchmarks.allreduce; rank 0 writes the profile (--out) and prints one line a size to
# the job's output. The ranks find each other as train.py's do under submit_pm.sh: MASTER_ADDR is the first
# node, export_DDP_vars.sh maps Slurm's task variables. PYTHON defaults to the repository's .venv. Set
# NCCL_DEBUG=INFO to see the transport, algorithm and protocol NCCL chose (docs/ explains the lines).
set -euo pipefail
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR MASTER_PORT=${MASTER_PORT:-29500} OMP_NUM_THREADS=1
PYTHON=${PYTHON:-$PWD/.venv/bin/python}
srun -u bash -c 'source export_DDP_vars.sh && exec "$0" -m benchmarks.allreduce "$@"' "$PYTHON" "$@"
