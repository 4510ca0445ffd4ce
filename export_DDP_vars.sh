# shellcheck shell=bash
# Map Slurm's task variables to the ones torch.distributed reads. Source it inside each srun task:
#     srun bash -c 'source export_DDP_vars.sh && exec python train.py ...'
# MASTER_ADDR (the first node of the allocation) is set by submit_pm.sh before srun; MASTER_PORT is
# 29500 unless already set. Outside a Slurm task only MASTER_PORT is set.
if [ -n "${SLURM_PROCID:-}" ]; then
    export RANK=$SLURM_PROCID
    export LOCAL_RANK=${SLURM_LOCALID:-0}
    export WORLD_SIZE=${SLURM_NTASKS:-${SLURM_NPROCS:-1}}
fi
export MASTER_PORT=${MASTER_PORT:-29500}
