# shellcheck shell=bash
# gpu-check-bundle.sh: `scripts/gpu-check --bundle DIR`, the runner of a bundle made by
# scripts/gpu-bundle on a bare GPU machine (no build there). Sourced by scripts/gpu-check; its pure
# parts (deadline arithmetic, library search, medians, the tests stage) are sourced and checked by
# tests/runtime/gpu_check_checks.sh. Every function is prefixed gc_.
#
# Stages, each under `timeout`, each with its own share of one global deadline (GPU_CHECK_DEADLINE_S,
# 480 s): the probe, the GPU tests, the profiled gpt-tiny runs, the archive. A stage's deadline is the
# start plus the shares of the stages up to it, so time a stage leaves goes to the next; a stage
# that cannot start is "not reached". $OUT (default out/gpu-check) gets exactly summary.txt and one
# archive, logs.tar.xz (or logs.tar.gz where xz is missing), with the logs, reports and traces.

GC_STAGES=(probe tests runs pack)
GC_SHARES=(45 345 70 20)       # seconds of the 480; tests: the largest TIMEOUT (330 s) plus room
GC_TEST_DEFAULT_TIMEOUT=120    # seconds, for a test without a TIMEOUT of its own
GC_ARCHIVE_LIMIT=$((16 * 1024 * 1024))
declare -gA GC_STATE=()        # stage name -> passed, failed, not reached

# ---------------------------------------------------------------- deadline arithmetic (pure)

# gc_plan T0 TOTAL_S: GC_DEADLINE[i] = T0 + (share_0 + ... + share_i) * TOTAL_S / sum of shares
# (integer seconds; the last deadline is T0 + TOTAL_S exactly).
gc_plan() {
  local t0=$1 total=$2 sum=0 acc=0 i
  for i in "${!GC_SHARES[@]}"; do sum=$((sum + GC_SHARES[i])); done
  GC_DEADLINE=()
  for i in "${!GC_SHARES[@]}"; do
    acc=$((acc + GC_SHARES[i]))
    GC_DEADLINE[i]=$((t0 + acc * total / sum))
  done
}

# gc_stage_index NAME: the index of a stage in GC_STAGES.
gc_stage_index() {
  local i
  for i in "${!GC_STAGES[@]}"; do
    if [ "${GC_STAGES[i]}" = "$1" ]; then echo "$i"; return 0; fi
  done
  return 1
}

# gc_left STAGE [NOW]: seconds left before STAGE's deadline (0 when past it).
gc_left() {
  local now=${2:-$(date +%s)} d
  d=${GC_DEADLINE[$(gc_stage_index "$1")]}
  if [ "$now" -ge "$d" ]; then echo 0; else echo $((d - now)); fi
}

# gc_limit WANT STAGE [NOW]: the time limit for a command that wants WANT s: WANT, or less when the
# stage's deadline is nearer.
gc_limit() {
  local left
  left=$(gc_left "$2" "${3:-}")
  if [ "$1" -lt "$left" ]; then echo "$1"; else echo "$left"; fi
}

# gc_version_ge A B: true when dotted version A >= B.
gc_version_ge() {
  [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" = "$2" ]
}

# gc_median V...: the median of the numbers (mean of the two middle ones for an even count).
gc_median() {
  printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1}
    END { if (NR == 0) exit 1; if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# gc_ms V...: each number with 3 decimals (milliseconds shown in the summary).
gc_ms() { printf '%s\n' "$@" | awk '{printf "%s%.3f", (NR > 1 ? " " : ""), $1} END {print ""}'; }

# gc_ratio A B: A / B with 3 decimals.
gc_ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) exit 1; printf "%.3f\n", a / b }'; }

# ---------------------------------------------------------------- library search

# gc_is_elf64 FILE: true for a 64-bit ELF file (through symbolic links).
gc_is_elf64() {
  [ -f "$1" ] && [ "$(od -An -tx1 -N5 "$1" 2>/dev/null | tr -d ' \n')" = "7f454c4602" ]
}

# gc_site_packages: Python site-packages folders, from python3 (GC_PYTHON) when there is one, then
# by glob where Debian, pip and virtual environments put them.
gc_site_packages() {
  local d py=${GC_PYTHON:-python3}
  if command -v "$py" >/dev/null 2>&1; then
    # Where the nvidia namespace package is (the wheels' own folders), then every site folder.
    "$py" -c 'import nvidia, os; print("\n".join(os.path.dirname(p) for p in nvidia.__path__))' 2>/dev/null
    "$py" -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null
  fi
  for d in /usr/lib/python3*/site-packages /usr/lib/python3*/dist-packages \
    /usr/local/lib/python3*/site-packages /usr/local/lib/python3*/dist-packages \
    "${HOME:-/root}"/.local/lib/python3*/site-packages /opt/*/.venv/lib/python3*/site-packages \
    /opt/*/lib/python3*/site-packages; do
    [ -d "$d" ] && echo "$d"
  done
}

# gc_search_dirs: where the machine's libraries are looked for, in order, each once: LD_LIBRARY_PATH,
# the CUDA toolkit (GC_CUDA_ROOTS: /usr/local/cuda*), the driver's folder, `ldconfig -p`, and the
# Python wheels' nvidia/*/lib (nvidia-nccl-cu13, nvidia-cuda-cupti, ...).
gc_search_dirs() {
  local d root sp parts=()
  {
    IFS=: read -ra parts <<<"${LD_LIBRARY_PATH:-}"
    for d in "${parts[@]}"; do [ -n "$d" ] && echo "$d"; done
    for root in ${GC_CUDA_ROOTS:-/usr/local/cuda*}; do
      for d in "$root"/lib64 "$root"/lib "$root"/targets/*/lib "$root"/extras/CUPTI/lib64; do echo "$d"; done
    done
    echo /usr/local/nvidia/lib64
    { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null; } |
      sed -n 's|.* => \(/.*\)/[^/]*$|\1|p'
    gc_site_packages | while read -r sp; do
      for d in "$sp"/nvidia/*/lib; do echo "$d"; done
    done
  } | awk '!seen[$0]++' | while read -r d; do [ -d "$d" ] && echo "$d"; done
}

# gc_find_lib SONAME [DIR...]: the first DIR (default: gc_search_dirs) holding SONAME as a 64-bit
# ELF file; prints its path, or fails.
gc_find_lib() {
  local name=$1 d
  shift
  if [ $# -eq 0 ]; then mapfile -t GC_DIRS_CACHE < <(gc_search_dirs); set -- "${GC_DIRS_CACHE[@]}"; fi
  for d in "$@"; do
    if gc_is_elf64 "$d/$name"; then echo "$d/$name"; return 0; fi
  done
  return 1
}

# gc_find_lib_anywhere SONAME: the last resort, `find` under GC_FIND_ROOTS (/usr /opt /root /home
# /srv /workspace /venv, those that exist; 20 s at most): the first 64-bit ELF file of that name.
gc_find_lib_anywhere() {
  local d roots=() f
  for d in ${GC_FIND_ROOTS:-/usr /opt /root /home /srv /workspace /venv}; do [ -d "$d" ] && roots+=("$d"); done
  [ ${#roots[@]} -gt 0 ] || return 1
  while read -r f; do
    if gc_is_elf64 "$f"; then echo "$f"; return 0; fi
  done < <(timeout -k 2 20 find "${roots[@]}" -xdev -name "$1" \( -type f -o -type l \) 2>/dev/null)
  return 1
}

# gc_glibcxx_of FILE: the newest GLIBCXX_3.4.N version a libstdc++ file provides.
gc_glibcxx_of() { grep -ao 'GLIBCXX_3\.4\.[0-9]*' "$1" 2>/dev/null | sort -uV | tail -n 1 | sed 's/GLIBCXX_//'; }

# gc_machine_glibc: the C library's version (e.g. 2.39).
gc_machine_glibc() {
  local v
  v=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  [ -n "$v" ] || v=$(ldd --version 2>/dev/null | head -n 1 | grep -oE '[0-9]+\.[0-9]+$')
  echo "$v"
}

# gc_unresolved LD_PATH FILE...: "lib (needed by prog)" for each library or version the loader
# cannot resolve with LD_LIBRARY_PATH=LD_PATH.
gc_unresolved() {
  local ld=$1 f
  shift
  for f in "$@"; do
    gc_is_elf64 "$f" || continue
    LD_LIBRARY_PATH=$ld ldd "$f" 2>&1 | grep -E 'not found' | sed 's/^[[:space:]]*//' |
      sed "s|\$| (needed by ${f##*/})|"
  done | sort -u
}

# ---------------------------------------------------------------- output

gc_say() { echo "$*" | tee -a "$GC_SUMMARY"; }
gc_indent() { sed 's/^/    /' | tee -a "$GC_SUMMARY"; }

# gc_result STAGE STATE DETAIL: a stage's line in the summary (STATE: passed, failed, not reached).
gc_result() {
  GC_STATE[$1]=$2
  gc_say "$1: $2${3:+ - $3}"
}

# gc_run LIMIT LOG CMD...: CMD under `timeout` with the bundle's environment, output in LOG;
# returns its status (124: timed out). Stdin is /dev/null (mpirun would read the caller's).
gc_run() {
  local limit=$1 log=$2
  shift 2
  if [ "$limit" -le 0 ]; then echo "not started: no time left" >"$log"; return 124; fi
  timeout --kill-after=5 "$limit" env "${GC_ENV[@]}" "$@" </dev/null >"$log" 2>&1
}

# ---------------------------------------------------------------- the bundle

# gc_bundle_form DIR: "packed" (DIR/bundle.tar.xz), "unpacked" (DIR/bin and DIR/tests.json), or
# fails with the reason (exit 2 of the runner). Needs no tool: checked before anything else.
gc_bundle_form() {
  local dir=$1
  if [ -f "$dir/bundle.tar.xz" ]; then echo packed
  elif [ -d "$dir/bin" ] && [ -f "$dir/tests.json" ]; then echo unpacked
  else
    echo "$dir holds neither bundle.tar.xz nor an unpacked bundle (bin/, tests.json): make one with scripts/gpu-bundle" >&2
    return 2
  fi
}

# gc_unpack DIR DEST: DEST/bundle is the bundle, unpacked from DIR/bundle.tar.xz (through xz, else
# python3's lzma), or DIR itself when DIR is unpacked already; prints its path. Fails with the
# reason (naming the tool missing) when it cannot.
gc_unpack() {
  local dir=$1 dest=$2 form
  form=$(gc_bundle_form "$dir") || return 2
  if [ "$form" = unpacked ]; then (cd "$dir" && pwd); return 0; fi
  mkdir -p "$dest/bundle"
  if command -v xz >/dev/null 2>&1; then
    tar -C "$dest/bundle" -xJf "$dir/bundle.tar.xz" || { echo "cannot unpack $dir/bundle.tar.xz (tar -xJ failed)" >&2; return 2; }
  elif command -v python3 >/dev/null 2>&1; then  # no xz: Python's lzma
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
      "$dir/bundle.tar.xz" "$dest/bundle" || { echo "cannot unpack $dir/bundle.tar.xz (python3's tarfile failed)" >&2; return 2; }
  else
    echo "neither xz nor python3 found: cannot unpack $dir/bundle.tar.xz (unpack it elsewhere and pass the folder)" >&2
    return 2
  fi
  echo "$dest/bundle"
}

# gc_bundle_value KEY: a value of the bundle's bundle.env.
gc_bundle_value() { sed -n "s/^$1=//p" "$GC_B/bundle.env" 2>/dev/null | head -n 1; }

# gc_needed_sonames: the libraries the bundle needs from the machine (needs-on-machine.txt).
gc_needed_sonames() {
  if [ -s "$GC_B/needs-on-machine.txt" ]; then
    grep -v '^$' "$GC_B/needs-on-machine.txt"
  else
    printf '%s\n' libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libcupti.so.13
  fi
}

# gc_find_machine_libs: finds each needed library; GC_LIB_DIRS gets their folders, GC_MISSING the
# names not found. The lines go to the summary.
gc_find_machine_libs() {
  local name path
  GC_LIB_DIRS=()
  GC_MISSING=()
  mapfile -t GC_DIRS_CACHE < <(gc_search_dirs)
  printf '%s\n' "${GC_DIRS_CACHE[@]}" >"$GC_WORK/logs/library-search-dirs.txt"
  while read -r name; do
    if path=$(gc_find_lib "$name" "${GC_DIRS_CACHE[@]}") || path=$(gc_find_lib_anywhere "$name"); then
      gc_say "  $name: $path"
      GC_LIB_DIRS+=("${path%/*}")
    else
      gc_say "  $name: NOT FOUND (searched ${#GC_DIRS_CACHE[@]} folders, logs/library-search-dirs.txt, and find under ${GC_FIND_ROOTS:-/usr /opt /root /home /srv /workspace /venv})"
      GC_MISSING+=("$name")
    fi
  done < <(gc_needed_sonames)
  if path=$(gc_find_lib libcuda.so.1 "${GC_DIRS_CACHE[@]}"); then
    gc_say "  libcuda.so.1 (driver): $path"
  else
    gc_say "  libcuda.so.1 (driver): not found"
  fi
}

# gc_setup_env: GC_LD (the bundle's libraries, lib/compat when the machine's libstdc++ is older than
# the bundle needs, then the machine's folders found) and GC_ENV, the environment of every bundle
# program (relocated Open MPI, root allowed, one host).
gc_setup_env() {
  local ld=$GC_B/lib need have stdcxx d
  need=$(gc_bundle_value glibcxx_needed)
  stdcxx=$(gc_find_lib libstdc++.so.6 "${GC_DIRS_CACHE[@]}") || stdcxx=
  have=$([ -n "$stdcxx" ] && gc_glibcxx_of "$stdcxx")
  if [ -z "$have" ] || { [ -n "$need" ] && ! gc_version_ge "$have" "$need"; }; then
    ld=$ld:$GC_B/lib/compat
    gc_say "  libstdc++: the machine's (${stdcxx:-none} ${have:-}) is older than $need: using the bundle's (lib/compat)"
  else
    gc_say "  libstdc++: $stdcxx (GLIBCXX $have, bundle needs ${need:-?})"
  fi
  for d in "${GC_LIB_DIRS[@]}"; do
    case ":$ld:" in *":$d:"*) ;; *) ld=$ld:$d ;; esac
  done
  GC_LD=$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local path=$GC_B/bin:$PATH
  GC_ENV=(LD_LIBRARY_PATH="$GC_LD" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
          OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_plm=isolated
          OMPI_MCA_btl_vader_single_copy_mechanism=none)
  if [ -d "$GC_B/mpi" ]; then
    path=$GC_B/mpi/bin:$path
    GC_ENV+=(OPAL_PREFIX="$GC_B/mpi")
    # PMIx's prefix: two folders above its plugins (PREFIX/lib/pmix/pmix_mca_*.so), wherever the
    # bundle keeps them below mpi/pmix. Debian's PMIx has absolute library and data folders, which
    # PMIX_PREFIX does not move: they are named too (else no plugin, and help files not found).
    d=$(find "$GC_B/mpi/pmix" -name 'pmix_mca_*.so' 2>/dev/null | head -n 1)
    if [ -n "$d" ]; then
      d=${d%/*/*/*}
      GC_ENV+=(PMIX_PREFIX="$d" PMIX_LIBDIR="$d/lib" PMIX_PKGLIBDIR="$d/lib/pmix"
               PMIX_DATADIR="$d/share" PMIX_PKGDATADIR="$d/share/pmix")
    fi
  fi
  GC_ENV+=(PATH="$path")
}

# ---------------------------------------------------------------- a. the probe

# gc_probe_driver: nvidia-smi's view (name, driver, compute mode, memory; the CUDA version the driver
# supports) and nvcc's. Sets GC_NO_GPU to the reason when there is no usable driver or device, and
# GC_MODE to the compute mode.
gc_probe_driver() {
  local log=$GC_WORK/logs/nvidia-smi.log rc
  GC_NO_GPU='' GC_MODE=''
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    GC_NO_GPU="nvidia-smi not found (no NVIDIA driver on this machine)"
    gc_say "  nvidia-smi: not found"
  else
    timeout -k 5 30 nvidia-smi >"$log" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
      GC_NO_GPU="nvidia-smi failed (exit $rc): $(grep -m 1 . "$log")"
      gc_say "  nvidia-smi: exit $rc: $(grep -m 1 . "$log")"
    else
      gc_say "  $(grep -oE 'Driver Version: [0-9.]+ +CUDA Version: [0-9.]+' "$log" | tr -s ' ')"
      timeout -k 5 20 nvidia-smi --query-gpu=index,name,driver_version,compute_mode,memory.total \
        --format=csv,noheader >"$GC_WORK/logs/nvidia-smi-query.log" 2>&1
      sed 's/^/  device: /' "$GC_WORK/logs/nvidia-smi-query.log" | tee -a "$GC_SUMMARY"
      GC_MODE=$(awk -F', ' 'NR == 1 {print $4}' "$GC_WORK/logs/nvidia-smi-query.log")
      [ -s "$GC_WORK/logs/nvidia-smi-query.log" ] || GC_NO_GPU="nvidia-smi lists no GPU"
      [ "$GC_MODE" = Prohibited ] && GC_NO_GPU="GPU 0 is in Prohibited compute mode"
    fi
  fi
  if command -v nvcc >/dev/null 2>&1; then
    gc_say "  nvcc: $(nvcc --version 2>/dev/null | grep -oE 'release [0-9.]+' | head -n 1)"
  elif [ -x /usr/local/cuda/bin/nvcc ]; then
    gc_say "  nvcc: $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | grep -oE 'release [0-9.]+' | head -n 1)"
  fi
}

# gc_probe_bundle: the C library, the machine's CUDA libraries and the bundle's closure. Sets
# GC_BROKEN to why the bundle cannot run here (empty when it can).
gc_probe_bundle() {
  local need have bad
  GC_BROKEN=
  need=$(gc_bundle_value glibc_needed)
  have=$(gc_machine_glibc)
  gc_say "  C library: ${have:-unknown} (bundle needs ${need:-?}); bundle commit $(gc_bundle_value commit), built $(gc_bundle_value built)"
  if [ -n "$need" ] && [ -n "$have" ] && ! gc_version_ge "$have" "$need"; then
    GC_BROKEN="this machine's C library is $have, the bundle needs $need"
  fi
  gc_find_machine_libs
  gc_setup_env
  if [ ${#GC_MISSING[@]} -gt 0 ]; then
    GC_BROKEN="${GC_BROKEN:+$GC_BROKEN; }not found on this machine: ${GC_MISSING[*]}"
  fi
  local files=() f
  for f in "$GC_B"/bin/* "$GC_B"/lib/*.so* "$GC_B"/mpi/bin/orterun; do [ -f "$f" ] && files+=("$f"); done
  [ -d "$GC_B/mpi" ] && mapfile -t -O "${#files[@]}" files < <(find "$GC_B/mpi" -name '*.so' -type f)
  gc_unresolved "$GC_LD" "${files[@]}" >"$GC_WORK/logs/unresolved.txt"
  if [ -s "$GC_WORK/logs/unresolved.txt" ]; then
    gc_say "  the loader cannot resolve $(wc -l <"$GC_WORK/logs/unresolved.txt") libraries of the bundle:"
    head -n 8 "$GC_WORK/logs/unresolved.txt" | gc_indent
    bad=$(grep -vE "^($(gc_needed_sonames | sed 's/[.+]/\\&/g' | paste -sd '|'))( |$)" \
      "$GC_WORK/logs/unresolved.txt" | head -n 3 | paste -sd ';')
    [ -n "$bad" ] && GC_BROKEN="${GC_BROKEN:+$GC_BROKEN; }the bundle's own library closure is broken: $bad"
  else
    gc_say "  bundle's library closure: every library of its ${#files[@]} programs and libraries resolves"
  fi
}

# gc_stage_probe DIR: stage a: the driver first (it needs nothing from the bundle), then the bundle
# unpacked from DIR (GC_B), its libraries and runtime_cuda_gpu_probe. Returns 0 (all checks can run),
# 5 (one process per GPU only: the compute mode is not Default), 3 (no usable GPU: stop; the bundle
# is still unpacked and its closure checked when the tools allow), 1 (the bundle cannot run or be
# unpacked here: stop).
gc_stage_probe() {
  local t0 rc=0 probe log=$GC_WORK/logs/gpu-probe.log unpack_err
  t0=$(date +%s)
  gc_say "probe:"
  gc_probe_driver
  if ! GC_B=$(gc_unpack "$1" "$GC_TMP" 2>"$GC_WORK/logs/unpack.log"); then
    unpack_err=$(head -n 2 "$GC_WORK/logs/unpack.log")
    gc_say "  bundle: $unpack_err"
    if [ -n "$GC_NO_GPU" ]; then
      GC_STOP="no GPU: $GC_NO_GPU (and the bundle could not be unpacked here: $unpack_err)"
      gc_result probe failed "$GC_STOP ($(($(date +%s) - t0)) s)"
      return 3
    fi
    GC_STOP="the bundle cannot be unpacked here: $unpack_err"
    gc_result probe failed "$GC_STOP ($(($(date +%s) - t0)) s)"
    return 1
  fi
  gc_say "  bundle: $GC_B ($(gc_bundle_form "$1"))"
  probe=$GC_B/bin/runtime_cuda_gpu_probe
  gc_probe_bundle
  if [ -z "$GC_BROKEN" ] && [ -x "$probe" ]; then
    local limit
    limit=$(gc_limit 60 probe)
    [ "$limit" -lt 20 ] && limit=20   # the probe runs even when unpacking took the stage's share
    gc_run "$limit" "$log" "$probe"
    rc=$?
    grep -vE '^probe:' "$log" | sed 's/^/  /' | tee -a "$GC_SUMMARY" >/dev/null
    gc_say "  runtime_cuda_gpu_probe: exit $rc: $(grep -E '^probe:' "$log" | tail -n 1)"
  elif [ -z "$GC_BROKEN" ]; then
    GC_BROKEN="the bundle has no runtime_cuda_gpu_probe"
  fi
  local why dt=$(($(date +%s) - t0))
  why=$(grep -E '^probe: FAILED - ' "$log" 2>/dev/null | tail -n 1 | sed 's/^probe: FAILED - //')
  if [ -n "$GC_NO_GPU" ] || [ $rc -eq 3 ]; then
    GC_STOP="no GPU: ${GC_NO_GPU:-${why#no GPU: }}${GC_NO_GPU:+${why:+; the probe: $why}}"
    gc_result probe failed "$GC_STOP (${dt} s)"
    return 3
  fi
  if [ -n "$GC_BROKEN" ]; then
    GC_STOP="the bundle cannot run here: $GC_BROKEN"
    gc_result probe failed "$GC_STOP (${dt} s)"
    return 1
  fi
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    GC_STOP="runtime_cuda_gpu_probe timed out"
    gc_result probe failed "$GC_STOP (${dt} s)"
    return 1
  fi
  if [ $rc -eq 5 ] || [[ $GC_MODE == Exclusive* ]]; then
    gc_result probe failed "compute mode ${GC_MODE:-not Default}: ranks cannot share the GPU; one-process checks only (${dt} s)"
    return 5
  fi
  if [ $rc -ne 0 ]; then
    gc_result probe failed "${why:-exit $rc} (${dt} s); the tests go on"
    return 0
  fi
  gc_result probe passed "${dt} s"
  return 0
}

# ---------------------------------------------------------------- b. the GPU tests

# gc_mpi_works: true when the bundle's mpirun starts a process (`mpirun -n 1 true`); the reason
# goes to the summary otherwise.
gc_mpi_works() {
  local log=$GC_WORK/logs/mpirun-check.log
  if [ ! -x "$GC_B/mpi/bin/mpirun" ]; then
    GC_NO_MPI="the bundle has no Open MPI (built without MPI)"
    gc_say "  mpirun: not in the bundle (built without MPI): one-process checks only"
    return 1
  fi
  if gc_run "$(gc_limit 30 tests)" "$log" "$GC_B/mpi/bin/mpirun" -n 1 true; then
    gc_say "  mpirun -n 1 true: ok (the bundle's Open MPI, relocated)"
    return 0
  fi
  gc_say "  mpirun -n 1 true: FAILED (exit $?): the bundle's Open MPI cannot start here; one-process checks only"
  tail -n 5 "$log" | gc_indent
  return 1
}

# gc_expand_tests JSON BIN ROOT DIR: one file DIR/NNN.argv per test of tests.json (its command, NUL
# separated, @BIN@/@ROOT@ replaced, preceded by its environment as K=V for `env`) and DIR/index.tsv:
# NNN, name, timeout (s; GC_TEST_DEFAULT_TIMEOUT when it has none), skip code (or -), 1 for an
# MPI test. Sorted by timeout, largest first (a long test must start while its whole limit fits).
gc_expand_tests() {
  python3 - "$@" "$GC_TEST_DEFAULT_TIMEOUT" <<'PY'
import json, os, sys
src, bindir, root, out, default = sys.argv[1:6]
tests = json.load(open(src)).get("tests", [])
rows = []
for t in tests:
    cmd = [a.replace("@BIN@", bindir).replace("@ROOT@", root) for a in t["command"]]
    env = [f"{k}={v}" for k, v in sorted(t.get("environment", {}).items())]
    limit = int(float(t.get("timeout_s") or 0) + 0.999) or int(default)
    skip = t.get("skip_return_code")
    mpi = 1 if "mpi" in t.get("labels", []) else 0
    rows.append((limit, t["name"], env + cmd, "-" if skip in (None, "") else str(skip), mpi))
rows.sort(key=lambda r: -r[0])
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "index.tsv"), "w") as idx:
    for i, (limit, name, argv, skip, mpi) in enumerate(rows):
        with open(os.path.join(out, f"{i:03d}.argv"), "wb") as f:
            f.write(b"".join(a.encode() + b"\0" for a in argv))
        idx.write(f"{i:03d}\t{name}\t{limit}\t{skip}\t{mpi}\n")
print(len(rows))
PY
}

# gc_test_outcome RC SKIP LOG: passed, skipped (the skip code, or GoogleTest's SKIPPED: a failure
# here), timed out, or failed.
gc_test_outcome() {
  local rc=$1 skip=$2 log=$3
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo "timed out"
  elif [ "$skip" != - ] && [ "$rc" -eq "$skip" ]; then echo skipped
  elif grep -qE '^\[  SKIPPED \]|every test skipped' "$log"; then echo skipped
  elif [ "$rc" -eq 0 ]; then echo passed
  else echo failed; fi
}

# gc_run_tests JSON BIN ROOT MPI_OK: runs every test (the longest TIMEOUT first, so that
# runtime_cuda_parallel_np2's 330 s fits), each under its own limit, its TIMEOUT (or
# GC_TEST_DEFAULT_TIMEOUT) capped by the time left before the stage's deadline; a test that times
# out under a capped limit is "timed out" with the cap named; one reached with under GC_TEST_MIN_S
# left is "not reached". Results in logs/tests/results.tsv (id, name, outcome, detail); sets
# GC_COUNTS (passed failed skipped timed_out not_run listed; not_run: not reached or no MPI).
GC_TEST_MIN_S=5
gc_run_tests() {
  local json=$1 bin=$2 root=$3 mpi_ok=$4 dir=$GC_WORK/logs/tests n id name want skip mpi
  local -A count=([passed]=0 [failed]=0 [skipped]=0 ["timed out"]=0 ["not run"]=0 ["not reached"]=0)
  mkdir -p "$dir" "${GC_TMP:-$GC_WORK}/test-cwd"
  : >"$dir/results.tsv"
  GC_COUNTS="0 0 0 0 0 0"
  n=$(gc_expand_tests "$json" "$bin" "$root" "$dir" 2>"$dir/expand.log") || {
    GC_TESTS_ERROR="cannot read $json: $(tail -n 1 "$dir/expand.log")"
    return 1
  }
  GC_TESTS_ERROR=
  while IFS=$'\t' read -r id name want skip mpi; do
    local outcome detail rc t0 left limit argv=()
    left=$(gc_left tests)
    if [ "$mpi" = 1 ] && [ "$mpi_ok" != 1 ]; then
      outcome="not run"; detail=$GC_NO_MPI; echo "not run: $GC_NO_MPI" >"$dir/$id.log"
    elif [ "$left" -lt "$GC_TEST_MIN_S" ]; then
      outcome="not reached"; detail="$left s left of the stage"; echo "not reached: $left s left" >"$dir/$id.log"
    else
      limit=$want
      [ "$limit" -gt "$left" ] && limit=$left
      mapfile -d '' -t argv <"$dir/$id.argv"
      t0=$(date +%s)
      (cd "${GC_TMP:-$GC_WORK}/test-cwd" && gc_run "$limit" "$dir/$id.log" env "${argv[@]}")
      rc=$?
      outcome=$(gc_test_outcome "$rc" "$skip" "$dir/$id.log")
      detail="exit $rc after $(($(date +%s) - t0)) s, limit $limit s"
      [ "$limit" -lt "$want" ] && detail="$detail (its TIMEOUT $want s capped by the stage's deadline)"
    fi
    count[$outcome]=$((count[$outcome] + 1))
    printf '%s\t%s\t%s\t%s\n' "$id" "$name" "$outcome" "$detail" >>"$dir/results.tsv"
  done <"$dir/index.tsv"
  local unrun=$((${count["not run"]} + ${count["not reached"]}))
  GC_COUNTS="${count[passed]} ${count[failed]} ${count[skipped]} ${count["timed out"]} $unrun $n"
}

# gc_stage_tests SHARED_OK: stage b; SHARED_OK 1 when ranks may share the GPU.
gc_stage_tests() {
  local t0 mpi_ok=0 p f s to nr n
  t0=$(date +%s)
  gc_say "gpu tests:"
  GC_NO_MPI="mpirun cannot start"
  if [ "$1" != 1 ]; then
    GC_NO_MPI="the compute mode keeps ranks from sharing the GPU"
  elif gc_mpi_works; then
    mpi_ok=1
  fi
  GC_MPI_OK=$mpi_ok
  if [ ! -f "$GC_B/tests.json" ]; then
    gc_result "gpu tests" failed "the bundle has no tests.json"
    return
  fi
  gc_run_tests "$GC_B/tests.json" "$GC_B/bin" "$GC_ROOT" "$mpi_ok"
  read -r p f s to nr n <<<"$GC_COUNTS"
  # Every test, one line each (a skip is a failure here: the GPU is there, nothing may skip).
  awk -F'\t' '{o = $3; if (o == "skipped") o = "SKIPPED (counts as a failure)"
                else if (o != "passed" && o != "not reached" && o != "not run") o = toupper(o)
                printf "  %s: %s (%s)\n", $2, o, $4}' "$GC_WORK/logs/tests/results.tsv" |
    tee -a "$GC_SUMMARY"
  awk -F'\t' '$3 == "failed" || $3 == "timed out" || $3 == "skipped" {print $1 "\t" $2}' "$GC_WORK/logs/tests/results.tsv" |
    head -n 4 | while IFS=$'\t' read -r id name; do
      gc_say "  end of $name's log (logs/tests/$id.log):"
      grep -E '^\[  (FAILED|SKIPPED) +\]|Failure|error' "$GC_WORK/logs/tests/$id.log" | head -n 4 | gc_indent
      tail -n 6 "$GC_WORK/logs/tests/$id.log" | gc_indent
    done
  local figures="$p passed, $f failed, $s skipped (a skip counts as a failure), $to timed out, $nr not run or not reached, of $n listed ($(($(date +%s) - t0)) s)"
  if [ -n "${GC_TESTS_ERROR:-}" ]; then
    gc_result "gpu tests" failed "$GC_TESTS_ERROR"
  elif [ "$n" -eq 0 ]; then
    gc_result "gpu tests" failed "tests.json lists no test (ctest -L gpu found none when the bundle was made)"
  elif [ "$p" -eq "$n" ]; then
    gc_result "gpu tests" passed "$figures"
  else
    gc_result "gpu tests" failed "$figures"
  fi
}

# ---------------------------------------------------------------- c. the profiled gpt-tiny runs

# gc_json_field FILE KEY: a top-level value of the last JSON object in FILE (`orrery run --json`).
gc_json_field() {
  python3 - "$1" "$2" <<'PY' 2>/dev/null
import json, sys
obj = None
for line in open(sys.argv[1]).read().splitlines()[::-1]:
    line = line.strip()
    if line.startswith("{"):
        try:
            obj = json.loads(line); break
        except Exception:
            pass
v = None if obj is None else obj.get(sys.argv[2])
print("" if v is None else v)
PY
}

# gc_loss_vs LOG_A LOG_B: compares the "loss" arrays of two `orrery run --json` logs step by step
# (exit 1 beyond a relative 1e-3).
gc_loss_vs() {
  python3 - "$1" "$2" <<'PY' 2>&1
import json, sys
def losses(path):
    for line in open(path).read().splitlines()[::-1]:
        line = line.strip()
        if line.startswith("{"):
            try:
                return [float(x) for x in json.loads(line)["loss"]]
            except Exception:
                pass
    raise SystemExit("no loss curve in " + path)
a, b = losses(sys.argv[1]), losses(sys.argv[2])
n = min(len(a), len(b))
if n == 0 or len(a) != len(b):
    raise SystemExit(f"loss curves of {len(a)} and {len(b)} steps")
rel = [abs(x - y) / abs(x) for x, y in zip(a, b)]
print(f"{n} steps, max relative difference {max(rel):.2e} (bound 1e-3)")
sys.exit(0 if max(rel) < 1e-3 else 1)
PY
}

# gc_orrery_run NAME WANT_S ARGS...: one `orrery run` of gpt-tiny (--json; --device cuda, or
# GPU_CHECK_DEVICE: cpu checks this stage on a machine without a GPU; GPU_CHECK_STEPS steps, 12),
# log logs/run-NAME.log;
# returns its status (125: not reached, the stage's time is spent).
gc_orrery_run() {
  local name=$1 want=$2 limit rc
  shift 2
  limit=$(gc_limit "$want" runs)
  if [ "$limit" -lt 15 ]; then
    echo "not reached: $limit s left" >"$GC_WORK/logs/run-$name.log"
    gc_say "  $name: not reached ($limit s left of the stage)"
    GC_RUNS_FAILED+=("$name (not reached)")
    return 125
  fi
  (cd "$GC_WORK" && gc_run "$limit" "$GC_WORK/logs/run-$name.log" "$GC_B/bin/orrery" run \
    "$GC_ROOT/scenarios/gpt-tiny.yaml" --device "${GPU_CHECK_DEVICE:-cuda}" --json "$@")
  rc=$?
  if [ $rc -ne 0 ]; then
    GC_RUNS_FAILED+=("$name (exit $rc)")
    gc_say "  $name: FAILED (exit $rc$([ $rc -eq 124 ] && echo ", timed out after $limit s"))"
    tail -n 6 "$GC_WORK/logs/run-$name.log" | gc_indent
  fi
  return $rc
}

# gc_overhead_runs N: one GPU, profiled and unprofiled runs alternated (P U, U P, P U, ...) after
# one unprofiled warm-up; the median step time of each kind and their ratio.
gc_overhead_runs() {
  local n=$1 i kind order prof=() plain=() v
  local one=(--nproc 1 --set parallel.dp=1 --set training.global_batch=8 --set training.steps="${GPU_CHECK_STEPS:-12}")
  gc_orrery_run 1rank-warmup 90 "${one[@]}" --no-profile || return 1
  for ((i = 1; i <= n; i++)); do
    if [ $((i % 2)) -eq 1 ]; then order="p u"; else order="u p"; fi
    for kind in $order; do
      if [ "$kind" = p ]; then
        gc_orrery_run "1rank-profiled-$i" 90 "${one[@]}" --out "$GC_WORK/traces/gpt-tiny-cuda-1rank-$i.db" || return 1
        v=$(gc_json_field "$GC_WORK/logs/run-1rank-profiled-$i.log" median_step_ms); prof+=("$v")
      else
        gc_orrery_run "1rank-unprofiled-$i" 90 "${one[@]}" --no-profile || return 1
        v=$(gc_json_field "$GC_WORK/logs/run-1rank-unprofiled-$i.log" median_step_ms); plain+=("$v")
      fi
    done
  done
  local mp mu
  mp=$(gc_median "${prof[@]}") && mu=$(gc_median "${plain[@]}") || return 1
  gc_say "  1 GPU, profiled:   median step $(gc_ms "$mp") ms (median of $n runs: $(gc_ms "${prof[@]}")); $(gc_json_field "$GC_WORK/logs/run-1rank-profiled-1.log" spans) spans"
  gc_say "  1 GPU, unprofiled: median step $(gc_ms "$mu") ms (median of $n runs: $(gc_ms "${plain[@]}"))"
  gc_say "  profiler overhead: ratio $(gc_ratio "$mp" "$mu") (profiled / unprofiled, runs alternated; target < 1.030)"
  # One profiled trace is enough for the archive.
  for ((i = 2; i <= n; i++)); do rm -f "$GC_WORK/traces/gpt-tiny-cuda-1rank-$i.db"; done
}

# gc_shared_runs: 2 ranks sharing the GPU (the staged MPI communicator): DDP, ZeRO 2, tp=2, pp=2
# 1F1B, ZeRO 3, and 4 ranks for ZeRO 3 over a pipeline; each loss curve against DDP's.
gc_shared_runs() {
  local t=$GC_WORK/traces name v
  gc_orrery_run 2ranks-dp2 120 --nproc 2 --set training.steps="${GPU_CHECK_STEPS:-12}" --out "$t/gpt-tiny-cuda-2ranks-dp2.db" || return 1
  gc_say "  2ranks-dp2 (DDP, sharing the GPU): median step $(gc_ms "$(gc_json_field "$GC_WORK/logs/run-2ranks-dp2.log" median_step_ms)") ms"
  local -a runs=(
    "2ranks-zero2|--nproc 2 --set parallel.dp=2 --set parallel.zero=2"
    "2ranks-tp2|--nproc 2 --set parallel.dp=1 --set parallel.tp=2"
    "2ranks-pp2|--nproc 2 --set parallel.dp=1 --set parallel.pp=2 --set parallel.schedule=1f1b"
    "2ranks-zero3|--nproc 2 --set parallel.dp=2 --set parallel.zero=3"
    "4ranks-dp2pp2-zero3|--nproc 4 --set parallel.dp=2 --set parallel.pp=2 --set parallel.zero=3 --set parallel.schedule=1f1b --set training.micro_batch=4")
  local spec args
  for spec in "${runs[@]}"; do
    name=${spec%%|*}
    read -ra args <<<"${spec#*|}"
    gc_orrery_run "$name" 150 "${args[@]}" --set training.steps="${GPU_CHECK_STEPS:-12}" --out "$t/gpt-tiny-cuda-$name.db" || continue
    if v=$(gc_loss_vs "$GC_WORK/logs/run-2ranks-dp2.log" "$GC_WORK/logs/run-$name.log"); then
      gc_say "  $name: median step $(gc_ms "$(gc_json_field "$GC_WORK/logs/run-$name.log" median_step_ms)") ms; loss vs DDP: $v"
    else
      gc_say "  $name: loss vs DDP: FAILED - $v"
      GC_RUNS_FAILED+=("$name (loss)")
    fi
  done
}

# gc_stage_runs SHARED_OK: stage c, then `orrery report` of each trace.
gc_stage_runs() {
  local t0 f name
  t0=$(date +%s)
  GC_RUNS_FAILED=()
  gc_say "gpt-tiny runs:"
  mkdir -p "$GC_WORK/traces" "$GC_WORK/reports"
  if [ ! -x "$GC_B/bin/orrery" ]; then
    gc_result "gpt-tiny runs" failed "the bundle has no orrery"
    return
  fi
  gc_overhead_runs "${GPU_CHECK_REPEATS:-3}"
  # What profiling costs per kernel launch (tiny kernels: the worst case), one JSON line.
  if [ -x "$GC_B/bin/runtime_cuda_cupti_overhead" ] && [ "${GPU_CHECK_DEVICE:-cuda}" = cuda ]; then
    if gc_run "$(gc_limit 60 runs)" "$GC_WORK/logs/cupti-overhead.log" "$GC_B/bin/runtime_cuda_cupti_overhead" 20000 10; then
      gc_say "  per kernel launch (runtime_cuda_cupti_overhead 20000 10): $(tail -n 1 "$GC_WORK/logs/cupti-overhead.log")"
    else
      GC_RUNS_FAILED+=("cupti-overhead")
      gc_say "  runtime_cuda_cupti_overhead: FAILED"
      tail -n 4 "$GC_WORK/logs/cupti-overhead.log" | gc_indent
    fi
  fi
  if [ "$1" = 1 ] && [ "$GC_MPI_OK" = 1 ]; then
    gc_shared_runs
  else
    gc_say "  runs of ranks sharing the GPU: not run (${GC_NO_MPI})"
    GC_RUNS_FAILED+=("shared-GPU runs (not run)")
  fi
  for f in "$GC_WORK"/traces/*.db; do
    [ -f "$f" ] || continue
    name=$(basename "$f" .db)
    if ! gc_run "$(gc_limit 60 runs)" "$GC_WORK/reports/report-$name.txt" "$GC_B/bin/orrery" report "$f"; then
      GC_RUNS_FAILED+=("report-$name")
      gc_say "  orrery report $name.db: FAILED"
    fi
  done
  local figures
  figures="$(find "$GC_WORK/traces" -name '*.db' | wc -l) traces, $(($(date +%s) - t0)) s"
  if [ ${#GC_RUNS_FAILED[@]} -eq 0 ]; then
    gc_result "gpt-tiny runs" passed "$figures"
  else
    gc_result "gpt-tiny runs" failed "${GC_RUNS_FAILED[*]}; $figures"
  fi
}

# ---------------------------------------------------------------- d. the archive and the summary

# gc_pack: the one archive in $OUT (logs, reports, traces; the traces dropped, then the largest
# logs, when it would be over 16 MiB: the summary says so).
gc_pack() {
  local t0 ext=xz flag=-J archive size tier
  t0=$(date +%s)
  command -v xz >/dev/null 2>&1 || { ext=gz; flag=-z; }
  archive=$GC_OUT/logs.tar.$ext
  cp "$GC_SUMMARY" "$GC_WORK/summary.txt"
  [ -f "$GC_B/bundle.env" ] && cp "$GC_B/bundle.env" "$GC_WORK/bundle.env"
  for tier in all no-traces small; do
    local excl=()
    [ $tier != all ] && excl+=(--exclude=./traces)
    if [ $tier = small ]; then
      while read -r f; do excl+=("--exclude=$f"); done < <(cd "$GC_WORK" && find . -type f -size +256k)
    fi
    rm -f "$archive"
    timeout -k 5 60 tar -C "$GC_WORK" "${excl[@]}" $flag -cf "$archive" . 2>"$GC_TMP/tar.err"
    size=$(stat -c %s "$archive" 2>/dev/null || echo 0)
    [ "$size" -gt 0 ] && [ "$size" -le "$GC_ARCHIVE_LIMIT" ] && break
  done
  local what="logs, reports, traces"
  [ $tier = no-traces ] && what="logs and reports; traces left out: the archive was over 16 MiB with them"
  [ $tier = small ] && what="logs under 256 KiB and reports; traces and larger logs left out: over 16 MiB"
  if [ "$size" -gt 0 ] && [ "$size" -le "$GC_ARCHIVE_LIMIT" ]; then
    gc_result archive passed "$(basename "$archive"), $(awk -v s="$size" 'BEGIN{printf "%.2f MiB", s/1048576}') ($what; $(($(date +%s) - t0)) s)"
  else
    rm -f "$archive"
    gc_result archive failed "could not write an archive under 16 MiB: $(head -n 2 "$GC_TMP/tar.err")"
  fi
}

GC_STAGE_NAMES=(probe "gpu tests" "gpt-tiny runs" archive)

# gc_unreached: "not reached" for each stage without a result; gc_unreached_but_archive: the same
# but for the archive (written next).
gc_unreached() {
  local s
  for s in "${GC_STAGE_NAMES[@]}"; do
    [ -n "${GC_STATE[$s]:-}" ] || gc_result "$s" "not reached"
  done
}
gc_unreached_but_archive() {
  local s
  for s in "${GC_STAGE_NAMES[@]:0:3}"; do
    [ -n "${GC_STATE[$s]:-}" ] || gc_result "$s" "not reached"
  done
}

# gc_finish CODE: the result line; exits with CODE (0 when every stage passed).
gc_finish() {
  local s failed=()
  gc_unreached
  for s in "${GC_STAGE_NAMES[@]}"; do
    [ "${GC_STATE[$s]}" = passed ] || failed+=("$s: ${GC_STATE[$s]}")
  done
  gc_say "total $(($(date +%s) - GC_T0)) s of ${GPU_CHECK_DEADLINE_S:-480}"
  if [ ${#failed[@]} -eq 0 ]; then
    gc_say "RESULT: ok"
    exit 0
  fi
  local joined
  joined=$(printf '%s; ' "${failed[@]}")
  gc_say "RESULT: FAILED (${joined%; })${GC_STOP:+; stopped: $GC_STOP}"
  [ "$1" -eq 0 ] && exit 1
  exit "$1"
}

# gc_main DIR: the whole run. Exit status: 0 every stage passed; 1 a stage failed; 2 bad usage or
# DIR is no bundle; 3 stopped at the probe: no usable GPU (the reason is summary.txt's last line).
gc_main() {
  local dir=${1:?} rc
  GC_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  GC_OUT=${OUT:-$GC_ROOT/out/gpu-check}
  mkdir -p "$GC_OUT" || { echo "gpu-check: cannot create $GC_OUT" >&2; exit 2; }
  GC_OUT=$(cd "$GC_OUT" && pwd)
  rm -f "$GC_OUT/summary.txt" "$GC_OUT"/logs.tar.*
  GC_TMP=$(mktemp -d "${TMPDIR:-/tmp}/orrery-gpu-check.XXXXXX") || { echo "gpu-check: no temporary folder" >&2; exit 2; }
  if [ "${GPU_CHECK_KEEP:-0}" = 1 ]; then
    trap 'echo "gpu-check: kept $GC_TMP" >&2' EXIT
  else
    trap 'rm -rf "$GC_TMP"' EXIT
  fi
  GC_WORK=$GC_TMP/work
  GC_SUMMARY=$GC_OUT/summary.txt
  GC_STOP=
  GC_B=
  declare -gA GC_STATE=()
  mkdir -p "$GC_WORK/logs"
  GC_T0=$(date +%s)
  gc_plan "$GC_T0" "${GPU_CHECK_DEADLINE_S:-480}"
  gc_say "Orrery gpu-check --bundle $dir, $(date -u +%FT%TZ) on $(hostname 2>/dev/null || cat /etc/hostname); deadline ${GPU_CHECK_DEADLINE_S:-480} s (shares: probe ${GC_SHARES[0]}, tests ${GC_SHARES[1]}, runs ${GC_SHARES[2]}, archive ${GC_SHARES[3]} of 480)"
  if ! gc_bundle_form "$dir" >/dev/null 2>"$GC_WORK/logs/unpack.log"; then
    GC_STOP=$(cat "$GC_WORK/logs/unpack.log")
    gc_result probe failed "$GC_STOP"
    gc_unreached_but_archive
    gc_pack
    gc_finish 2
  fi
  trap 'GC_STOP="interrupted"; gc_unreached_but_archive; gc_pack; gc_finish 1' INT TERM
  gc_stage_probe "$dir"
  rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 5 ]; then
    local shared=0
    [ $rc -eq 0 ] && shared=1
    gc_stage_tests "$shared"
    gc_stage_runs "$shared"
  fi
  gc_unreached_but_archive
  gc_pack
  gc_finish "$([ $rc -eq 3 ] && echo 3 || echo 1)"
}
