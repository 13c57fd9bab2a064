#!/usr/bin/env bash
# gpu_bundle_bare_check.sh [BUNDLE_DIR] [ROOTFS]: runs `scripts/gpu-check --bundle` as the bare GPU
# machine would, inside a minimal Debian root file system (debootstrap --variant=minbase bookworm:
# no development packages, no CUDA, no Python, no xz), and checks that
#   - given the packed bundle (bundle.tar.xz) where neither xz nor python3 is (the minimal base has
#     neither), it probes the driver first and stops with the "no GPU" reason (exit 3), naming the
#     missing tools, writing exactly summary.txt and logs.tar.gz into $OUT;
#   - given the bundle unpacked, it runs its probe and stops with the "no GPU" reason (exit 3),
#     writing exactly summary.txt and one archive into $OUT;
#   - gpu_bundle_closure_check.sh, run inside the bare root, passes;
#   - the bundle's own library closure resolves there: every library the loader cannot find is one
#     the GPU machine provides (needs-on-machine.txt: CUDA, cuBLAS, NCCL, CUPTI), none of the
#     bundle's (SQLite, yaml-cpp, OpenBLAS, Open MPI, ...);
#   - with this machine's CUDA, cuBLAS, CUPTI and NCCL copied where the pip wheels put them
#     (site-packages/nvidia/cu13/lib, nvidia/nccl/lib; no python3 there: the glob finds them), the
#     runner finds them, the closure resolves, the probe runs and stops with the driver's reason;
#     and with the runner's environment, the bundle's relocated Open MPI starts (`mpirun -n 1
#     true`) and runs `orrery run --device cpu` on 2 ranks (the bare root has no Open MPI).
# Not a CTest test: it needs root (chroot), a built bundle (scripts/gpu-bundle) and, the first time,
# debootstrap and the Debian archive. BUNDLE_DIR: gpu-bundle; ROOTFS: /var/tmp/bare (made if absent; e.g. /tmp/bare).
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
# /proc, as on any machine (bash's process substitution and /proc/self/exe need it).
if [ ! -e "$RFS/proc/self" ]; then
  mount -t proc proc "$RFS/proc" || die "cannot mount /proc in $RFS"
  trap 'umount "$RFS/proc"' EXIT
fi
W=$RFS/orrery
rm -rf "$W" "$RFS/usr/local/lib/python3.12"
mkdir -p "$W/gpu-bundle" "$W/gpu-bundle-packed" "$W/tmp"
cp "$BUNDLE/bundle.tar.xz" "$W/gpu-bundle-packed/"
# The files of the working tree the runner uses, and the bundle unpacked here (the minimal base has
# neither xz nor python3 to unpack it; a real GPU machine has python3).
(cd "$ROOT" && git ls-files -z scripts scenarios tests/runtime/cuda tests/runtime/gpu_bundle_closure_check.sh | tar --null -T - -cf -) | tar -C "$W" -xf -
tar -C "$W/gpu-bundle" -xJf "$BUNDLE/bundle.tar.xz"
FAILS=0
check() { if [ "$2" = "$3" ]; then echo "ok   $1: $3"; else echo "FAIL $1: expected '$2', got '$3'"; FAILS=$((FAILS + 1)); fi; }
tools=$(for t in xz python3 tar gzip ldd timeout od find awk; do chroot "$RFS" /bin/bash -c "command -v $t >/dev/null" && echo "$t"; done | tr '\n' ' ')
echo "     tools in the bare root: $tools"
# 0. The packed bundle as it travels, where nothing can unpack it.
chroot "$RFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/orrery/tmp \
  OUT=/orrery/out-packed /bin/bash -c 'cd /orrery && scripts/gpu-check --bundle gpu-bundle-packed' >"$W/run0.log" 2>&1
RC=$?
O=$W/out-packed
check "packed: exit status (3: no GPU)" 3 "$RC"
check "packed: files in OUT" "logs.tar.gz summary.txt" "$(ls "$O" | sort | tr '\n' ' ' | sed 's/ $//')"
if chroot "$RFS" /bin/bash -c 'command -v xz || command -v python3' >/dev/null; then
  check "packed: the reason" "probe: failed - no GPU: nvidia-smi not found (no NVIDIA driver on this machine)" \
    "$(grep '^probe: failed' "$O/summary.txt" | sed 's/ ([0-9]* s)$//')"
else
  check "packed: the reason, the missing tools named" "probe: failed - no GPU: nvidia-smi not found (no NVIDIA driver on this machine) (and the bundle could not be unpacked here: neither xz nor python3 found: cannot unpack gpu-bundle-packed/bundle.tar.xz (unpack it elsewhere and pass the folder))" \
    "$(grep '^probe: failed' "$O/summary.txt" | sed 's/ ([0-9]* s)$//; s|/orrery/gpu-bundle-packed|gpu-bundle-packed|')"
fi
echo "--- summary.txt (packed, no CUDA)"
cat "$O/summary.txt"
# 1. The bundle unpacked.
chroot "$RFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/orrery/tmp \
  OUT=/orrery/out /bin/bash -c 'cd /orrery && scripts/gpu-check --bundle gpu-bundle' >"$W/run.log" 2>&1
RC=$?
O=$W/out
check "exit status (3: no GPU)" 3 "$RC"
check "files in OUT" "logs.tar.gz summary.txt" "$(ls "$O" | sort | tr '\n' ' ' | sed 's/ $//')"
check "the reason" "probe: failed - no GPU: nvidia-smi not found (no NVIDIA driver on this machine)" \
  "$(grep '^probe: failed' "$O/summary.txt" | sed 's/ ([0-9]* s)$//')"
mkdir -p "$W/archive"
tar -C "$W/archive" -xzf "$O/logs.tar.gz"
U=$W/archive/logs/unresolved.txt
[ -f "$U" ] || die "no logs/unresolved.txt in the archive"
NEEDS=$W/gpu-bundle/needs-on-machine.txt
OWN=$(awk '{print $1}' "$U" | sort -u | grep -vxF -f "$NEEDS" | tr '\n' ' ')
check "libraries of the bundle's own that do not resolve" "" "$OWN"
echo "     left to the GPU machine, not found in the bare root: $(awk '{print $1}' "$U" | sort -u | tr '\n' ' ')"
[ -s "$U" ] || { echo "FAIL the bare root has no CUDA, yet nothing was unresolved"; FAILS=$((FAILS + 1)); }
FROM_BUNDLE=$(chroot "$RFS" /usr/bin/env -i LD_LIBRARY_PATH=/orrery/gpu-bundle/lib /usr/bin/ldd /orrery/gpu-bundle/bin/orrery |
  grep -c '=> /orrery/gpu-bundle/lib/')
echo "     orrery: $FROM_BUNDLE libraries resolved from the bundle's lib/ in the bare root"
[ "$FROM_BUNDLE" -gt 0 ] || { echo "FAIL no library resolved from the bundle"; FAILS=$((FAILS + 1)); }
chroot "$RFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  /bin/bash /orrery/tests/runtime/gpu_bundle_closure_check.sh /orrery/gpu-bundle >"$W/closure.log" 2>&1
check "gpu_bundle_closure_check.sh in the bare root" 0 "$?"
sed 's/^/     | /' "$W/closure.log"
echo "--- summary.txt (no CUDA)"
cat "$O/summary.txt"

# 2. The machine's CUDA libraries where the wheels put them.
SP=$RFS/usr/local/lib/python3.12/site-packages/nvidia
mkdir -p "$SP/cu13/lib" "$SP/nccl/lib"
for name in $(grep -v nccl "$NEEDS"); do
  src=$(ldconfig -p | awk -v n="$name" '$1 == n {print $NF; exit}')
  [ -n "$src" ] || die "$name is not on this machine (ldconfig -p): cannot lay out the wheels"
  cp -L "$src" "$SP/cu13/lib/$name"
done
src=$(ldconfig -p | awk '$1 == "libnccl.so.2" {print $NF; exit}')
[ -n "$src" ] && cp -L "$src" "$SP/nccl/lib/libnccl.so.2"
rm -rf "$O"
chroot "$RFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/orrery/tmp \
  OUT=/orrery/out /bin/bash -c 'cd /orrery && scripts/gpu-check --bundle gpu-bundle' >"$W/run2.log" 2>&1
RC=$?
check "wheels: exit status (3: no GPU)" 3 "$RC"
check "wheels: libnccl found in the wheel's folder" "  libnccl.so.2: /usr/local/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2" \
  "$(grep '^  libnccl.so.2:' "$O/summary.txt")"
check "wheels: the closure resolves" 1 "$(grep -c "bundle's library closure: every library" "$O/summary.txt")"
check "wheels: the probe ran, no driver" 1 "$(grep -c '^  runtime_cuda_gpu_probe: exit 3: probe: FAILED - no GPU' "$O/summary.txt")"
# The runner's environment (gc_setup_env) for the relocated Open MPI and a 2-rank run.
cat >"$W/mpi-check.sh" <<'EOS'
cd /orrery
. scripts/lib/gpu-check-bundle.sh
GC_B=/orrery/gpu-bundle GC_WORK=/orrery/tmp/mpi-check GC_SUMMARY=/dev/null
mkdir -p "$GC_WORK/logs"
gc_find_machine_libs >/dev/null
gc_setup_env >/dev/null
env "${GC_ENV[@]}" mpirun -n 1 true </dev/null && echo "mpirun -n 1 true: ok"
env "${GC_ENV[@]}" timeout 300 orrery run scenarios/gpt-tiny.yaml --device cpu --nproc 2 \
  --set training.steps=2 --no-profile --json </dev/null 2>&1 | tail -n 1 | cut -c1-60
EOS
chroot "$RFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root /bin/bash /orrery/mpi-check.sh >"$W/mpi.log" 2>&1
cat "$W/mpi.log" | tail -n 5
check "relocated Open MPI starts in the bare root" 1 "$(grep -c '^mpirun -n 1 true: ok' "$W/mpi.log")"
check "2 ranks of orrery run through it" 1 "$(grep -c '"dp":2,' "$W/mpi.log")"
check "no help file or plugin of Open MPI / PMIx missing" 0 "$(grep -c "couldn't open the help file\|unavailable" "$W/mpi.log")"
echo "--- summary.txt (CUDA libraries as wheels)"
cat "$O/summary.txt"
if [ $FAILS -gt 0 ]; then echo "gpu_bundle_bare_check: $FAILS FAILED"; exit 1; fi
echo "gpu_bundle_bare_check: all passed"
