#!/bin/bash
# Build docker/Dockerfile without Docker: buildah (no daemon) on a minimal Debian base made with
# debootstrap, as root. What tests/test_docker.py runs; usable by hand from the repository's top folder:
#
#   tests/container/image.sh install            apt-get install Debian's buildah and debootstrap (if missing)
#   tests/container/image.sh base               make the base image (Debian bookworm minbase with python3,
#                                               python3-venv and python3-pip) if the storage lacks it
#   tests/container/image.sh build TAG [ARG...] build docker/Dockerfile on that base with benchy and apex off
#                                               (BENCHY=0 APEX=0); ARGs go to buildah bud. Prints the build
#                                               time and the image's size
#   tests/container/image.sh run [OPTION...] CONTAINER -- CMD...
#                                               buildah run CMD in the working container CONTAINER, where pip
#                                               reaches the package index as it does in the build
#   eval "$(tests/container/image.sh env)"      then buildah run, buildah images ... see the same storage
#
# Then, for example:  buildah from --name demo unet3d-dl-tutorial:test
#                     buildah run demo -- python train.py --help
#
# Containers are stored in STORAGE (default /var/cache/unet3d-dl-tutorial/containers) with buildah's vfs
# driver, and RUN steps use chroot isolation: both work where overlay mounts and user namespaces do not.
# The debootstrap root file system is kept as a tar file in CACHE_DIR (default /var/cache/unet3d-dl-tutorial;
# delete it to make a fresh one) and imported from there. MIRROR (default http://deb.debian.org/debian)
# is the Debian mirror. Where this machine's pip has a CPU wheel of the Dockerfile's torch version for the
# base's Python (a local wheel directory, a configured index, or PyPI), the build installs that file
# instead of downloading from PyPI's CPU index (TORCH_INDEX_URL); PYTHON (default python3) runs that pip.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE_DIR=${CACHE_DIR:-/var/cache/unet3d-dl-tutorial}
STORAGE=${STORAGE:-$CACHE_DIR/containers}
SUITE=bookworm
BASE_IMAGE=localhost/unet3d-dl-tutorial-base:$SUITE
ROOTFS_TAR=$CACHE_DIR/debian-$SUITE-python.tar

die() { echo "image.sh: $*" >&2; exit 1; }

need_root() {
    [ "$(id -u)" -eq 0 ] || die "$1 needs root (debootstrap, and buildah's chroot isolation)."
}

# The storage of every buildah command here (and of whoever evals `image.sh env`).
storage_env() {
    mkdir -p "$STORAGE"
    STORAGE=$(cd "$STORAGE" && pwd)
    cat >"$STORAGE/storage.conf" <<EOF
[storage]
driver = "vfs"
graphroot = "$STORAGE/graph"
runroot = "$STORAGE/run"
EOF
    export CONTAINERS_STORAGE_CONF=$STORAGE/storage.conf BUILDAH_ISOLATION=chroot
}

cmd_install() {
    if command -v buildah >/dev/null && command -v debootstrap >/dev/null; then
        echo "buildah and debootstrap are installed."
        return 0
    fi
    need_root "Installing buildah and debootstrap"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends buildah debootstrap >/dev/null
    command -v buildah >/dev/null && command -v debootstrap >/dev/null \
        || die "apt-get install buildah debootstrap did not provide both commands."
}

cmd_base() {
    need_root "Making the base image"
    storage_env
    if buildah inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
        echo "$BASE_IMAGE"
        return 0
    fi
    if [ ! -s "$ROOTFS_TAR" ]; then
        local rootfs=$CACHE_DIR/rootfs.$$
        mkdir -p "$CACHE_DIR"
        rm -rf "$rootfs"
        echo "image.sh: debootstrap $SUITE (minbase with python3) into $rootfs ..." >&2
        debootstrap --variant=minbase --include=python3,python3-venv,python3-pip "$SUITE" "$rootfs" \
            "${MIRROR:-http://deb.debian.org/debian}" >"$CACHE_DIR/debootstrap.log" 2>&1 \
            || { rm -rf "$rootfs"; die "debootstrap failed: $(tail -n 5 "$CACHE_DIR/debootstrap.log")"; }
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb
        tar -C "$rootfs" -cf "$ROOTFS_TAR.tmp" . && mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
        rm -rf "$rootfs"
    fi
    local container
    container=$(buildah from scratch)
    buildah add --quiet "$container" "$ROOTFS_TAR" / >/dev/null
    buildah config --cmd /bin/bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        "$container"
    buildah commit --quiet --rm "$container" "$BASE_IMAGE" >/dev/null
    echo "$BASE_IMAGE"
}

# Where this machine's pip trusts a certificate authority of its own (a TLS-inspecting proxy), the pip in
# the build and in `image.sh run` trusts it too: the file and an /etc/pip.conf naming it, mounted.
pip_cert_mounts() {
    local cert
    cert=${PIP_CERT:-$("${PYTHON:-python3}" -m pip config list 2>/dev/null | sed -n "s/^[^=]*\.cert='\(.*\)'$/\1/p" | head -n 1)}
    [ -n "$cert" ] && [ -f "$cert" ] || return 0
    printf '[global]\ncert = /etc/ssl/host-pip-ca.crt\n' >"$STORAGE/pip.conf"
    printf '%s\n' --volume "$cert:/etc/ssl/host-pip-ca.crt:ro" --volume "$STORAGE/pip.conf:/etc/pip.conf:ro"
}

# The build arguments that give the build a local torch wheel (see the header), or nothing.
torch_from_local_wheel() {
    local version python_tag wheel_dir=$CACHE_DIR/wheels
    version=$(sed -n 's/^ARG TORCH=torch==//p' "$REPO/docker/Dockerfile")
    [ -n "$version" ] || return 0
    python_tag=$(buildah run "$1" -- python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    mkdir -p "$wheel_dir"
    if "${PYTHON:-python3}" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$python_tag" \
            --platform "manylinux_2_28_$(uname -m)" -d "$wheel_dir" "torch==$version+cpu" >/dev/null 2>&1; then
        local wheel
        wheel=$(cd "$wheel_dir" && ls -t "torch-$version+cpu-cp${python_tag/./}-"*.whl 2>/dev/null | head -n 1)
        if [ -n "$wheel" ]; then
            echo "image.sh: torch from $wheel_dir/$wheel" >&2
            printf '%s\n' --volume "$wheel_dir:/wheels:ro" --build-arg "TORCH=/wheels/$wheel" \
                --build-arg TORCH_INDEX_URL=
        fi
    fi
}

cmd_build() {
    local tag=${1:?usage: image.sh build TAG [BUILDAH BUD ARGUMENTS...]}
    shift
    need_root "Building the image"
    storage_env
    local base container torch_args cert_args start seconds
    base=$(cmd_base)
    container=$(buildah from --pull-never "$base")
    mapfile -t torch_args < <(torch_from_local_wheel "$container")
    buildah rm "$container" >/dev/null
    mapfile -t cert_args < <(pip_cert_mounts)
    start=$SECONDS
    (cd "$REPO" && buildah bud --isolation chroot --storage-driver vfs --format docker --pull-never -f docker/Dockerfile \
        --build-arg "BASE=$base" --build-arg BENCHY=0 --build-arg APEX=0 "${cert_args[@]}" "${torch_args[@]}" "$@" -t "$tag" .)
    seconds=$((SECONDS - start))
    echo "image.sh: built $tag from $base in $seconds s; size $(buildah images --format '{{.Size}}' "$tag" | head -n 1)"
}

cmd_run() {
    [ $# -ge 3 ] || die "usage: image.sh run [BUILDAH RUN OPTIONS...] CONTAINER -- COMMAND..."
    local cert_args
    storage_env
    mapfile -t cert_args < <(pip_cert_mounts)
    buildah run "${cert_args[@]}" "$@"
}

case "${1:-}" in
    install) cmd_install ;;
    base) cmd_base ;;
    build) shift; cmd_build "$@" ;;
    run) shift; cmd_run "$@" ;;
    env) storage_env; echo "export CONTAINERS_STORAGE_CONF=$CONTAINERS_STORAGE_CONF BUILDAH_ISOLATION=chroot" ;;
    *) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 2 ;;
esac
