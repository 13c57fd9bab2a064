#!/usr/bin/env bash
# gpu_bundle_bare_check.sh [BUNDLE_DIR] [ROOTFS]: runs `scripts/gpu-check --bundle` as the bare GPU
# machine would, inside a minimal Debian root file system (debootstrap --variant=minbase bookworm:
# no development packages, no CUDA, no Python, no xz), and checks that
#   - it runs its probe and stops with the "no GPU" reason (exit 3), writing exactly summary.txt and
#     one archive into $OUT;
#   - the bundle's own library closure resolves there: every library the loader cannot find is one
#     the GPU machine provides (needs-on-machine.txt: CUDA, cuBLAS, NCCL, CUPTI), none of the
#     bundle's (SQLite, yaml-cpp, OpenBLAS, Open MPI, ...).
# Not a CTest test: it needs root (chroot), a built bundle (scripts/gpu-bundle) and, the first time,
# debootstrap and the Debian archive. BUNDLE_DIR: gpu-bundle; ROOTFS: /var/tmp/bare (made if absent).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUNDLE=${1:-$ROOT/gpu-bundle}
RFS=${2:-/var/tmp/bare}
die() { echo "gpu_bundle_bare_check: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (chroot)"
[ -f "$BUNDLE/bundle.tar.xz" ] || die "no $BUNDLE/bundle.tar.xz: run scripts/gpu-bundle first"
if [ ! -x "$RFS/bin/bash" ]; then
  command -v debootstrap >/dev/null 2>&1 || die "no root file system at $RFS and no debootstrap to make one"
  debootstrap --variant=minbase bookworm "$RFS" http://deb.debian.org/debian >"$RFS.debootstrap.log" 2>&1 ||
    die "debootstrap failed (log: $RFS.debootstrap.log)"
fi
W=$RFS/orrery
rm -rf "$W"
mkdir -p "$W/gpu-bundle" "$W/tmp"
# The files of the working tree the runner uses, and the bundle unpacked here (the minimal base has
# neither xz nor python3 to unpack it; a real GPU machine has python3).
(cd "$ROOT" && git ls-files -z scripts scenarios tests/runtime/cuda | tar --null -T - -cf -) | tar -C "$W" -xf -
tar -C "$W/gpu-bundle" -xJf "$BUNDLE/bundle.tar.xz"
chroot "$RFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/orrery/tmp \
  OUT=/orrery/out /bin/bash -c 'cd /orrery && scripts/gpu-check --bundle gpu-bundle' >"$W/run.log" 2>&1
RC=$?
FAILS=0
check() { if [ "$2" = "$3" ]; then echo "ok   $1: $3"; else echo "FAIL $1: expected '$2', got '$3'"; FAILS=$((FAILS + 1)); fi; }
O=$W/out
check "exit status (3: no GPU)" 3 "$RC"
check "files in OUT" "gpu-check.tar.gz summary.txt" "$(ls "$O" | sort | tr '\n' ' ' | sed 's/ $//')"
check "the reason" "probe: failed - no GPU: nvidia-smi not found (no NVIDIA driver on this machine)" \
  "$(grep '^probe: failed' "$O/summary.txt" | sed 's/ ([0-9]* s)$//')"
mkdir -p "$W/archive"
tar -C "$W/archive" -xzf "$O/gpu-check.tar.gz"
U=$W/archive/logs/unresolved.txt
[ -f "$U" ] || die "no logs/unresolved.txt in the archive"
NEEDS=$W/gpu-bundle/needs-on-machine.txt
OWN=$(awk '{print $1}' "$U" | sort -u | grep -vxF -f "$NEEDS" | tr '\n' ' ')
check "libraries of the bundle's own that do not resolve" "" "$OWN"
check "libraries left to the GPU machine, not found here" "$(sort -u "$NEEDS" | tr '\n' ' ')" \
  "$(awk '{print $1}' "$U" | sort -u | tr '\n' ' ')"
FROM_BUNDLE=$(chroot "$RFS" /usr/bin/env -i LD_LIBRARY_PATH=/orrery/gpu-bundle/lib /usr/bin/ldd /orrery/gpu-bundle/bin/orrery |
  grep -c '=> /orrery/gpu-bundle/lib/')
echo "     orrery: $FROM_BUNDLE libraries resolved from the bundle's lib/ in the bare root"
[ "$FROM_BUNDLE" -gt 0 ] || { echo "FAIL no library resolved from the bundle"; FAILS=$((FAILS + 1)); }
echo "--- summary.txt"
cat "$O/summary.txt"
if [ $FAILS -gt 0 ]; then echo "gpu_bundle_bare_check: $FAILS FAILED"; exit 1; fi
echo "gpu_bundle_bare_check: all passed"
