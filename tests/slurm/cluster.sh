#!/bin/bash
# A real one-node Slurm cluster on this machine, for trying and testing submit_pm.sh (run as root).
#
#   tests/slurm/cluster.sh install        apt-get install Debian's slurm-wlm and munge (if slurmctld is missing)
#   tests/slurm/cluster.sh start DIR      write DIR/slurm.conf, start munged (if not running), slurmctld
#                                         and slurmd; wait until the node is idle; print the SLURM_CONF to use
#   tests/slurm/cluster.sh stop DIR       cancel DIR's jobs, stop the daemons that `start DIR` started
#                                         (by the process ids it recorded), munged only if it started it
#
# DIR holds everything the cluster writes (config, state, spool, logs, pid files); use a fresh one
# each time. Environment: SLURMCTLD_PORT and SLURMD_PORT (default 6817 and 6818; the tests pick free
# ones), SLURM_CLUSTER_NAME (default "test"). Then, for example:
#
#   tests/slurm/cluster.sh start /tmp/slurm-test
#   export SLURM_CONF=/tmp/slurm-test/slurm.conf
#   CONTAINER=none DATA_DIR=$PWD/data TRAIN_FILE=synthetic_train.h5 VAL_FILE=synthetic_valid.h5 LOG_DIR=$PWD/runs \
#       sbatch -n 2 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 --constraint= \
#           ./submit_pm.sh --config=test --device=cpu
#   tests/slurm/cluster.sh stop /tmp/slurm-test
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MUNGE_SOCKET=/run/munge/munge.socket.2

die() { echo "cluster.sh: $*" >&2; exit 1; }

need_root() {
    [ "$(id -u)" -eq 0 ] || die "$1 needs root (the daemons run as root; munged as the munge user)."
}

# Wait up to $1 seconds for the command "${@:2}" to succeed.
wait_for() {
    local seconds=$1; shift
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.2
    done
}

munge_works() { munge -n -S "$MUNGE_SOCKET" </dev/null 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1; }

pid_alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }

# Stop the process whose id is in file $1 (if any, and alive): SIGTERM, then SIGKILL after 20 s.
stop_pid_file() {
    local file=$1 pid
    [ -s "$file" ] || return 0
    pid=$(tr -dc '0-9' <"$file")
    if pid_alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        if ! wait_for 20 bash -c "! kill -0 $pid"; then
            kill -KILL "$pid" 2>/dev/null || true
            wait_for 5 bash -c "! kill -0 $pid" || echo "cluster.sh: process $pid ($file) did not stop" >&2
        fi
    fi
    rm -f "$file"
}

cmd_install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
        echo "slurm-wlm and munge are installed."
        return 0
    fi
    need_root "Installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
    command -v slurmctld >/dev/null || die "apt-get install slurm-wlm did not provide slurmctld."
}

start_munge() {
    local dir=$1
    if munge_works; then
        return 0  # already running (the system's, or one started earlier): leave it alone
    fi
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        # 1024 random bits, as `mungekey` makes; readable by the munge user only.
        dd if=/dev/urandom of=/etc/munge/munge.key bs=128 count=1 status=none
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    mkdir -p /run/munge
    chown munge:munge /run/munge
    chmod 0755 /run/munge
    rm -f /run/munge/munged.pid
    runuser -u munge -- munged
    wait_for 10 test -s /run/munge/munged.pid || die "munged did not start (see /var/log/munge/munged.log)."
    # Remember that this cluster started munged, so that `stop` stops it (and only then).
    cp /run/munge/munged.pid "$dir/munged.pid"
    wait_for 10 munge_works || die "munged started but munge/unmunge fail (see /var/log/munge/munged.log)."
}

cmd_start() {
    local dir=${1:?usage: cluster.sh start DIR}
    need_root "Starting the test cluster"
    command -v slurmctld >/dev/null || die "slurmctld is not installed: run 'tests/slurm/cluster.sh install'."
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [ ! -e "$dir/slurmctld.pid" ] || die "$dir already holds a cluster; stop it first or use a fresh directory."
    mkdir -p "$dir/state" "$dir/spool"
    : >"$dir/plugstack.conf"

    local host cpus
    host=$(hostname -s)
    cpus=$(nproc)
    sed -e "s|@CLUSTER@|${SLURM_CLUSTER_NAME:-test}|g" -e "s|@HOST@|$host|g" -e "s|@CPUS@|$cpus|g" \
        -e "s|@DIR@|$dir|g" -e "s|@CTLD_PORT@|${SLURMCTLD_PORT:-6817}|g" \
        -e "s|@SLURMD_PORT@|${SLURMD_PORT:-6818}|g" "$HERE/slurm.conf.in" >"$dir/slurm.conf"
    export SLURM_CONF=$dir/slurm.conf

    start_munge "$dir"
    # -i: ignore state from an earlier run (there is none in a fresh DIR). Both daemonise and write pid files.
    slurmctld -f "$SLURM_CONF" -i
    wait_for 20 test -s "$dir/slurmctld.pid" || die "slurmctld did not start: $(tail -n 5 "$dir/slurmctld.log" 2>/dev/null)"
    wait_for 30 scontrol ping || die "slurmctld does not answer: $(tail -n 5 "$dir/slurmctld.log" 2>/dev/null)"
    slurmd -f "$SLURM_CONF"
    wait_for 20 test -s "$dir/slurmd.pid" || die "slurmd did not start: $(tail -n 5 "$dir/slurmd.log" 2>/dev/null)"
    if ! wait_for 60 bash -c "sinfo -h -N -n '$host' -o %t | grep -qx idle"; then
        die "node $host is not idle after 60 s: $(sinfo -N 2>&1); $(tail -n 5 "$dir/slurmd.log" 2>/dev/null)"
    fi
    echo "SLURM_CONF=$SLURM_CONF"
}

cmd_stop() {
    local dir=${1:?usage: cluster.sh stop DIR}
    [ -d "$dir" ] || return 0
    dir=$(cd "$dir" && pwd)
    export SLURM_CONF=$dir/slurm.conf
    local ctld_pid
    ctld_pid=$(tr -dc '0-9' <"$dir/slurmctld.pid" 2>/dev/null || true)
    # Cancel this cluster's jobs first (pending ones too), so that no job step outlives its slurmd.
    if pid_alive "$ctld_pid" && [ -f "$SLURM_CONF" ]; then
        local ids deadline=$((SECONDS + 30))
        while ids=$(squeue -h -o %i 2>/dev/null) && [ -n "$ids" ]; do
            if [ "$SECONDS" -ge "$deadline" ]; then
                echo "cluster.sh: jobs still listed after 30 s: $(squeue -h 2>&1)" >&2
                break
            fi
            # shellcheck disable=SC2086  # one word per job id
            scancel --quiet $ids 2>/dev/null || true
            # shellcheck disable=SC2086
            scancel --quiet --full --signal=KILL $ids 2>/dev/null || true
            sleep 1
        done
    fi
    stop_pid_file "$dir/slurmd.pid"
    stop_pid_file "$dir/slurmctld.pid"
    stop_pid_file "$dir/munged.pid"  # present only if this cluster started munged
}

case "${1:-}" in
    install) cmd_install ;;
    start) shift; cmd_start "$@" ;;
    stop) shift; cmd_stop "$@" ;;
    *) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 2 ;;
esac
