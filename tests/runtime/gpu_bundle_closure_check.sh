#!/usr/bin/env bash
# gpu_bundle_closure_check.sh [BUNDLE]: asserts that a bundle made by scripts/gpu-bundle carries its
# own library closure, i.e. that on a bare GPU machine (CUDA, cuBLAS, NCCL, CUPTI and the driver
# there; none of SQLite, yaml-cpp, OpenBLAS, Open MPI, ...) every library its programs and plugins
# load resolves:
#   - each ELF file of the bundle (bin/*, lib/*, lib/compat/*, mpi/bin/orterun, every Open MPI and
#     PMIx plugin) is run through ldd with LD_LIBRARY_PATH=lib:lib/compat;
#   - a library found inside the bundle is fine; one not found, or found on this machine outside
#     the bundle, must be the C library (libc, libm, ld-linux, ...), the driver (libcuda,
#     libnvidia-*), or named in needs-on-machine.txt (what scripts/gpu-check looks for there, and
#     only CUDA's runtime, cuBLAS, NCCL, CUPTI and their kin may be): anything else would be missing
#     on the GPU machine, and is named;
#   - tests.json lists at least one test, and every program it runs is in bin/.
# BUNDLE: a folder holding bundle.tar.xz or an unpacked bundle (default: ROOT/gpu-bundle). Without
# a bundle it exits 77 (the CTest test bundle_closure is then skipped: making a bundle takes a CUDA
# build of ~8 minutes, which a test does not do; scripts/gpu-bundle runs this check on what it packs).
# A few seconds. The bare-root check (tests/runtime/gpu_bundle_bare_check.sh, root) does the same
# where the machine's libraries really are absent.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${1:-$ROOT/gpu-bundle}
if [ -f "$B/bundle.tar.xz" ]; then
  T=$(mktemp -d "${TMPDIR:-/tmp}/gpu_bundle_closure.XXXXXX")
  trap 'rm -rf "$T"' EXIT
  tar -C "$T" -xJf "$B/bundle.tar.xz" || { echo "FAIL cannot unpack $B/bundle.tar.xz"; exit 1; }
  B=$T
elif [ ! -d "$B/bin" ]; then
  echo "no bundle at $B (make one with scripts/gpu-bundle): skipped"
  exit 77
fi
FAILS=0
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }
[ -f "$B/needs-on-machine.txt" ] || fail "no needs-on-machine.txt in the bundle"
SYSTEM='^(ld-linux.*|libc|libm|libdl|libpthread|librt|libutil|libresolv|libanl|libnsl|libcrypt|linux-vdso|linux-gate)\.so'
DRIVER='^(libcuda|libnvidia-[a-z-]*)\.so'
MACHINE='^(libcudart|libcublas|libcublasLt|libnccl|libcupti|libnvrtc|libnvrtc-builtins|libnvJitLink|libnvperf_host|libnvperf_target|libcufft|libcurand|libcusparse|libcusolver)\.so'
# What the bundle says the machine must have: only CUDA's own libraries may be there.
while read -r name; do
  [ -n "$name" ] || continue
  [[ $name =~ $MACHINE ]] || fail "needs-on-machine.txt names $name, which the GPU machine is not known to have"
done <"$B/needs-on-machine.txt"

FILES=()
for f in "$B"/bin/* "$B"/lib/*.so* "$B"/lib/compat/*.so* "$B"/mpi/bin/orterun; do
  [ -f "$f" ] && [ ! -L "$f" ] && FILES+=("$f")
done
[ -d "$B/mpi" ] && mapfile -t -O "${#FILES[@]}" FILES < <(find "$B/mpi" -name '*.so' -type f)
LD=$B/lib:$B/lib/compat
INSIDE=0 OUTSIDE=0 MISSING=0
for f in "${FILES[@]}"; do
  [ "$(od -An -tx1 -N4 "$f" | tr -d ' \n')" = 7f454c46 ] || continue
  out=$(LD_LIBRARY_PATH=$LD ldd "$f" 2>&1) || { fail "ldd ${f#"$B"/}: $(echo "$out" | head -n 1)"; continue; }
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    case $path in
      "$B"/*) INSIDE=$((INSIDE + 1)); continue ;;
    esac
    allowed=0
    if [[ $name =~ $SYSTEM ]] || [[ $name =~ $DRIVER ]] || grep -qxF "$name" "$B/needs-on-machine.txt"; then allowed=1; fi
    if [ "$path" = not ]; then
      MISSING=$((MISSING + 1))
      [ $allowed = 1 ] || fail "${f#"$B"/} needs $name: in neither the bundle nor what the GPU machine has"
    else
      OUTSIDE=$((OUTSIDE + 1))
      [ $allowed = 1 ] || fail "${f#"$B"/} needs $name, found here at $path but not in the bundle: the GPU machine lacks it"
    fi
  done <<<"$out"
done

# The tests it runs there.
if command -v python3 >/dev/null 2>&1; then
  msg=$(python3 - "$B/tests.json" "$B/bin" <<'PY'
import json, os, sys
tests = json.load(open(sys.argv[1])).get("tests", [])
if not tests:
    sys.exit("tests.json lists no test")
for t in tests:
    for a in t["command"]:
        if a.startswith("@BIN@/") and not os.path.exists(os.path.join(sys.argv[2], a[6:])):
            sys.exit(f"{t['name']} runs {a[6:]}, which is not in bin/")
print(f"{len(tests)} tests listed, their programs in bin/")
PY
  ) && echo "ok   $msg" || fail "$msg"
fi
echo "     ${#FILES[@]} files checked: $INSIDE libraries resolved inside the bundle, $OUTSIDE from this machine's C library, driver or CUDA, $MISSING left to the GPU machine"
if [ $FAILS -gt 0 ]; then echo "gpu_bundle_closure_check: $FAILS FAILED"; exit 1; fi
echo "gpu_bundle_closure_check: the bundle's library closure resolves"
