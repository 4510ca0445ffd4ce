#!/usr/bin/env bash
# DALI for a remote GPU machine (Python 3.12, x86-64, CUDA 13), in parts that its commands carry one at a
# time (benchmarks/suite/plan.py's DALI session): the wheels unzipped into one site folder, DALI's
# backend for Pythons other than 3.12 left out, the folder in one tar compressed with xz -9, cut into
# parts in .carry/1, .carry/2, ... (ignored by git), the tar's sha256 in the last part's folder. Run
# from the repository's top-level folder:
#
#   benchmarks/suite/pack_dali.sh                     DALI for CUDA 13 and what it imports, from PyPI
#   benchmarks/suite/pack_dali.sh NAME==VERSION ...   other wheels, from PyPI
#   benchmarks/suite/pack_dali.sh --wheels DIR        the wheels already in DIR (no download)
#   benchmarks/suite/pack_dali.sh --part-mb N         parts of at most N MiB (default 56)
#   benchmarks/suite/pack_dali.sh --parts N           N parts of equal size instead (at most 10)
#
# DALI's 254 MB of wheels make a tar.xz of 167 MB, 3 parts of 56 MiB, in about 3 minutes on 2 cores.
# On the GPU machine, the parts gathered in one folder: cat site.tar.xz.? > site.tar.xz && sha256sum -c
# site.sha256 && tar xJf site.tar.xz -C <site folder>, then PYTHONPATH=<site folder>.
set -euo pipefail
PYTHON=${PYTHON:-python3}
PY_TAG=312    # the GPU machine's Python: 3.12
part_mb=56 parts= wheels_dir=
while [ $# -gt 0 ]; do
    case "$1" in
        --wheels) wheels_dir=$(cd "$2" && pwd); shift 2 ;;
        --part-mb) part_mb=$2; shift 2 ;;
        --parts) parts=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "pack_dali.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) break ;;
    esac
done
wheels=("$@")
if [ -n "$wheels_dir" ] && [ ${#wheels[@]} -gt 0 ]; then
    echo "pack_dali.sh: --wheels DIR or wheel names, not both" >&2; exit 2
fi
[ ${#wheels[@]} -gt 0 ] || wheels=(nvidia-dali-cuda130==2.4.0 nvidia-nvimgcodec-cu13==0.9.0.20
    nvidia-libnvcomp-cu13==5.3.0.16 astunparse==1.6.3 gast==0.7.0 optree makefun libcst nvtx)
if [ -d .git/info ]; then grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >> .git/info/exclude; fi
# Remove only what an earlier run of this script (or of ../shared/gpu/pack-wheels.sh) made: other folders
# in .carry/ (such as .carry/wheels, the small wheels that travel whole) stay.
rm -rf .carry/[0-9]* .carry/pack && mkdir -p .carry/pack/site
if [ -z "$wheels_dir" ]; then
    wheels_dir=.carry/pack/wheels
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$wheels_dir" "${wheels[@]}"
fi
shopt -s nullglob
found=("$wheels_dir"/*.whl)
[ ${#found[@]} -gt 0 ] || { echo "pack_dali.sh: no wheels in $wheels_dir" >&2; exit 1; }
for wheel in "${found[@]}"; do unzip -q -o "$wheel" -d .carry/pack/site; done
for backend in .carry/pack/site/nvidia/dali/backend_impl.cpython-*; do
    [[ "$backend" == */backend_impl.cpython-$PY_TAG-* ]] || rm "$backend"
done
tar cf - -C .carry/pack/site . | xz -9 -T0 > .carry/pack/site.tar.xz
(cd .carry/pack && sha256sum site.tar.xz > site.sha256)
if [ -n "$parts" ]; then
    split -n "$parts" -d -a 1 .carry/pack/site.tar.xz .carry/pack/site.tar.xz.
else
    split -b "${part_mb}M" -d -a 1 .carry/pack/site.tar.xz .carry/pack/site.tar.xz.
fi
k=0
for part in .carry/pack/site.tar.xz.[0-9]; do k=$((k + 1)); mkdir ".carry/$k"; mv "$part" ".carry/$k/"; done
mv .carry/pack/site.sha256 ".carry/$k/"
echo "${#found[@]} wheels, $(du -sm .carry/pack/site | cut -f1) MiB unzipped: site.tar.xz of" \
     "$(du -m .carry/pack/site.tar.xz | cut -f1) MiB in $k parts, .carry/1 .. .carry/$k" \
     "(the last also holds site.sha256):"
rm -rf .carry/pack
du -sh .carry/[0-9]*
planned=$(sed -n 's/^DALI_PARTS = \([0-9]*\).*/\1/p' "$(dirname "$0")/plan.py")
[ "$planned" = "$k" ] ||
    echo "pack_dali.sh: benchmarks/suite/plan.py carries DALI_PARTS = $planned parts, not $k: change one" >&2
