#!/bin/bash
# A real Slurm cluster on this machine, for trying and testing submit_pm.sh (run as root): slurmctld and
# one slurmd per node, each node in a network namespace of its own, with its own hostname and address.
#
#   tests/slurm/cluster.sh install          apt-get install Debian's slurm-wlm, munge and iproute2 (if missing)
#   tests/slurm/cluster.sh start DIR [N]    write DIR/slurm.conf, start munged (if not running), slurmctld and
#                                           N (default 2) nodes; wait until they are idle; print the SLURM_CONF
#   tests/slurm/cluster.sh stop DIR         cancel DIR's jobs, stop the daemons that `start DIR` started (by
#                                           the process ids it recorded), munged only if it started it, and
#                                           remove the nodes' namespaces, links and /etc/netns files
#
# The nodes are node1 .. nodeN at 10.213.0.2 .. (SUBNET=10.213.0 by default), each a network namespace
# (ip netns) joined to a bridge in this machine's namespace, where slurmctld listens on 10.213.0.1. Each
# slurmd runs in its node's namespace under a hostname of its own (a UTS namespace), and sees
# /etc/netns/<namespace>/hosts as /etc/hosts (bind-mounted, as ip netns exec does), which names every
# node: the jobs' tasks resolve node1 as torch.distributed's ranks do on a real cluster. Traffic goes only between
# these addresses and to loopback. DIR holds everything else the cluster writes (config, state, spool,
# logs, pid files); use a fresh one each time. Environment: SLURMCTLD_PORT and SLURMD_PORT (default 6817
# and 6818; the tests pick free ones), SLURM_CLUSTER_NAME (default "test"; at most 6 letters and digits:
# it names the namespaces and links, so that two clusters do not collide), SUBNET. Then, for example:
#
#   tests/slurm/cluster.sh start /tmp/slurm-test
#   export SLURM_CONF=/tmp/slurm-test/slurm.conf
#   CONTAINER=none DATA_DIR=$PWD/data TRAIN_FILE=synthetic_train.h5 VAL_FILE=synthetic_valid.h5 LOG_DIR=$PWD/runs \
#       sbatch -N 2 --ntasks-per-node=1 --cpus-per-task=1 --gpus-per-node=0 --constraint= \
#           ./submit_pm.sh --config=test --device=cpu
#   tests/slurm/cluster.sh stop /tmp/slurm-test
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MUNGE_SOCKET=/run/munge/munge.socket.2
CLUSTER=${SLURM_CLUSTER_NAME:-test}
SUBNET=${SUBNET:-10.213.0}
BRIDGE=slbr-$CLUSTER

die() { echo "cluster.sh: $*" >&2; exit 1; }

need_root() {
    [ "$(id -u)" -eq 0 ] || die "$1 needs root (the daemons run as root; munged as the munge user)."
}

[[ "$CLUSTER" =~ ^[a-z0-9]{1,6}$ ]] || die "SLURM_CLUSTER_NAME=$CLUSTER: use 1 to 6 lower-case letters and digits."

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

namespace() { echo "slurm-$CLUSTER-node$1"; }

cmd_install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
            && command -v ip >/dev/null && command -v unshare >/dev/null; then
        echo "slurm-wlm, munge and iproute2 are installed."
        return 0
    fi
    need_root "Installing slurm-wlm, munge and iproute2"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurm-wlm munge iproute2 util-linux >/dev/null
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

# The bridge with the controller's address, and per node a namespace joined to it by a veth pair.
start_network() {
    local nodes=$1 host=$2 i ns
    ip link show "$BRIDGE" >/dev/null 2>&1 && die "the link $BRIDGE exists: another cluster named $CLUSTER runs" \
        "(stop it, or set SLURM_CLUSTER_NAME)."
    ip link add "$BRIDGE" type bridge
    ip addr add "$SUBNET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for ((i = 1; i <= nodes; i++)); do
        ns=$(namespace "$i")
        ip netns add "$ns"
        ip link add "sl-$CLUSTER-$i" type veth peer name eth0 netns "$ns"
        ip link set "sl-$CLUSTER-$i" master "$BRIDGE" up
        ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        mkdir -p "/etc/netns/$ns"
        {
            echo "127.0.0.1 localhost"
            echo "$SUBNET.1 $host"
            for ((j = 1; j <= nodes; j++)); do echo "$SUBNET.$((j + 1)) node$j"; done
        } >"/etc/netns/$ns/hosts"
    done
}

stop_network() {
    local ns
    for ns in $(ip netns list 2>/dev/null | awk -v prefix="slurm-$CLUSTER-node" 'index($1, prefix) == 1 { print $1 }'); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true  # what the daemons left behind
        ip netns del "$ns" 2>/dev/null || true  # deletes the veth pair with it
        rm -rf "/etc/netns/$ns"
    done
    ip link del "$BRIDGE" 2>/dev/null || true
}

cmd_start() {
    local dir=${1:?usage: cluster.sh start DIR [NODES]} nodes=${2:-2} host cpus i
    need_root "Starting the test cluster"
    command -v slurmctld >/dev/null || die "slurmctld is not installed: run 'tests/slurm/cluster.sh install'."
    [[ "$nodes" =~ ^[1-9]$ ]] || die "NODES=$nodes: give 1 to 9 nodes."
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [ ! -e "$dir/slurmctld.pid" ] || die "$dir already holds a cluster; stop it first or use a fresh directory."
    mkdir -p "$dir/state"
    : >"$dir/plugstack.conf"

    host=$(hostname -s)
    cpus=$(nproc)
    {
        sed -e "s|@CLUSTER@|$CLUSTER|g" -e "s|@HOST@|$host|g" -e "s|@CTLD_ADDR@|$SUBNET.1|g" \
            -e "s|@DIR@|$dir|g" -e "s|@CTLD_PORT@|${SLURMCTLD_PORT:-6817}|g" \
            -e "s|@SLURMD_PORT@|${SLURMD_PORT:-6818}|g" "$HERE/slurm.conf.in"
        # Every node has the machine's cores (they share them: this is a functional test, not a benchmark).
        for ((i = 1; i <= nodes; i++)); do
            echo "NodeName=node$i NodeAddr=$SUBNET.$((i + 1)) NodeHostname=node$i CPUs=$((2 * cpus)) State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=node[1-$nodes] Default=YES MaxTime=INFINITE State=UP"
    } >"$dir/slurm.conf"
    export SLURM_CONF=$dir/slurm.conf
    echo "$nodes" >"$dir/nodes"

    start_munge "$dir"
    start_network "$nodes" "$host"
    # -i: ignore state from an earlier run (there is none in a fresh DIR). Both daemonise and write pid files.
    slurmctld -f "$SLURM_CONF" -i
    wait_for 20 test -s "$dir/slurmctld.pid" || die "slurmctld did not start: $(tail -n 5 "$dir/slurmctld.log" 2>/dev/null)"
    wait_for 30 scontrol ping || die "slurmctld does not answer: $(tail -n 5 "$dir/slurmctld.log" 2>/dev/null)"
    for ((i = 1; i <= nodes; i++)); do
        mkdir -p "$dir/spool/node$i"
        # In the node's network namespace, under its own hostname, with its own /etc/hosts: what its
        # tasks see as their machine. (nsenter rather than ip netns exec, which mounts a new /sys and
        # so hides the cgroup file systems that slurmd looks for.)
        nsenter --net="/run/netns/$(namespace "$i")" unshare --uts --mount --propagation private sh -c \
            "mount --bind /etc/netns/$(namespace "$i")/hosts /etc/hosts && hostname node$i \
             && exec slurmd -f '$SLURM_CONF' -N node$i"
        wait_for 20 test -s "$dir/slurmd-node$i.pid" \
            || die "slurmd of node$i did not start: $(tail -n 5 "$dir/slurmd-node$i.log" 2>/dev/null)"
    done
    if ! wait_for 60 bash -c "[ \$(sinfo -h -N -o %t | grep -cx idle) -eq $nodes ]"; then
        die "the nodes are not idle after 60 s: $(sinfo -N 2>&1); $(tail -n 5 "$dir"/slurmd-node*.log 2>/dev/null)"
    fi
    echo "SLURM_CONF=$SLURM_CONF"
}

cmd_stop() {
    local dir=${1:?usage: cluster.sh stop DIR}
    [ -d "$dir" ] || return 0
    dir=$(cd "$dir" && pwd)
    export SLURM_CONF=$dir/slurm.conf
    local ctld_pid file
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
    for file in "$dir"/slurmd-node*.pid; do
        [ -e "$file" ] && stop_pid_file "$file"
    done
    stop_pid_file "$dir/slurmctld.pid"
    stop_network
    stop_pid_file "$dir/munged.pid"  # present only if this cluster started munged
}

case "${1:-}" in
    install) cmd_install ;;
    start) shift; cmd_start "$@" ;;
    stop) shift; cmd_stop "$@" ;;
    *) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 2 ;;
esac
