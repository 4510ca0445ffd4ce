#!/bin/bash
# Stand-ins for podman-hpc and shifter (tests/container/bin/ puts them on the PATH). Each records the
# command line that submit_pm.sh built and runs its command with `buildah run` in a working container
# made from the image, with the volumes, working directory and environment the real runtime gives it:
#
#   podman-hpc run [--rm] [--net X] [--ipc X] [--gpu] [-v SRC:DST]... [-w DIR] [-e NAME]... IMAGE CMD...
#       -e NAME copies NAME from the caller's environment where it is set; nothing else passes in.
#   shifter --image=IMAGE [--module=LIST] [-V SRC:DST]... CMD...
#       runs in the caller's working directory (shifter sees the cluster's file systems at their own
#       paths; here that directory is mounted) with the caller's environment; PATH, LD_LIBRARY_PATH and
#       HOME stay the image's. Modules are recorded, not loaded.
#
# Environment: STANDIN_LOG (a file; one line per call: the runtime and its arguments, shell-quoted),
# STANDIN_CONTAINER (the working container, `buildah from IMAGE`; made from another image, the call
# fails), and buildah's CONTAINERS_STORAGE_CONF and BUILDAH_ISOLATION (`tests/container/image.sh env`).
set -euo pipefail

runtime=$(basename "$0")
die() { echo "$runtime (stand-in): error: $*" >&2; exit 125; }
[ -z "${STANDIN_LOG:-}" ] || printf '%s%s\n' "$runtime" "$(printf ' %q' "$@")" >>"$STANDIN_LOG"

volumes=() environment=() workdir= image=
case "$runtime" in
    podman-hpc)
        [ "${1:-}" = run ] || die "only 'podman-hpc run' is stood in for, not '${1:-}'."
        shift
        while [ $# -gt 0 ]; do
            case "$1" in
                --rm | --gpu) shift ;;
                --net | --ipc) shift 2 ;;
                -v) volumes+=(--volume "$2"); shift 2 ;;
                -w) workdir=$2; shift 2 ;;
                -e) [ -z "${!2+set}" ] || environment+=(--env "$2=${!2}"); shift 2 ;;
                -*) die "unknown option $1." ;;
                *) image=$1; shift; break ;;
            esac
        done ;;
    shifter)
        while [ $# -gt 0 ]; do
            case "$1" in
                --image=*) image=${1#--image=}; shift ;;
                --module=*) shift ;;
                -V) volumes+=(--volume "$2"); shift 2 ;;
                -*) die "unknown option $1." ;;
                *) break ;;
            esac
        done
        workdir=$PWD
        volumes+=(--volume "$PWD:$PWD")
        while IFS= read -r -d '' entry; do
            name=${entry%%=*}
            case "$name" in
                PATH | LD_LIBRARY_PATH | HOME | STANDIN_* | CONTAINERS_* | BUILDAH_*) ;;
                *) [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] && environment+=(--env "$entry") ;;
            esac
        done < <(env -0) ;;
    *) die "call me as podman-hpc or shifter." ;;
esac
[ -n "$image" ] || die "no image given."
[ $# -gt 0 ] || die "no command given."

container=${STANDIN_CONTAINER:?set STANDIN_CONTAINER to a working container made from the image}
wanted=$(buildah inspect --type image --format '{{.FromImageID}}' "$image") || die "no image $image."
found=$(buildah inspect --type container --format '{{.FromImageID}}' "$container") || die "no container $container."
[ "$wanted" = "$found" ] || die "the container $container is not made from $image."
echo "$runtime (stand-in): buildah run in $container, made from $image" >&2
# --uts host: the ranks see the node's hostname, as under shifter and podman's --net host.
exec buildah run --uts host "${volumes[@]}" ${workdir:+--workingdir "$workdir"} "${environment[@]}" "$container" -- "$@"
