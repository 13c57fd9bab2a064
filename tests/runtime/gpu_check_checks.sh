#!/usr/bin/env bash
# gpu_check_checks.sh ROOT: checks what `scripts/gpu-check --bundle` does that needs no GPU
# (scripts/lib/gpu-check-bundle.sh), with real files and commands:
#   1. the deadline arithmetic (stage deadlines, time left, limits) against hand-worked numbers;
#   2. medians, ratios and version comparison;
#   3. the library search: copies of a real system library placed in a fake wheel tree
#      (site-packages/nvidia/X/lib, found through python3's site and through the glob fallback) and
#      on LD_LIBRARY_PATH, a non-ELF file of the same name passed over, a missing name failing;
#   4. the tests stage: a tests.json of real commands (pass, fail, the skip code, GoogleTest's SKIPPED,
#      one reading its standard input,
#      a time-out, an MPI test without MPI, a test whose TIMEOUT does not fit the time left, the
#      @BIN@/@ROOT@ placeholders and the environment): exact counts; an empty tests.json fails;
#   5. the contract when the probe fails (PATH without nvidia-smi): exit 3, exactly summary.txt and
#      one archive in $OUT, the "no GPU" reason, later stages "not reached"; from an unpacked and a
#      packed bundle; a folder that is no bundle exits 2.
# shellcheck disable=SC2034  # the GC_* variables set here are read by the sourced library
set -u
ROOT=${1:?usage: gpu_check_checks.sh ROOT}
T=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_checks.XXXXXX")
trap 'rm -rf "$T"' EXIT
FAILS=0
check() {  # check WHAT EXPECTED ACTUAL
  if [ "$2" = "$3" ]; then echo "ok   $1: $3"; else echo "FAIL $1: expected '$2', got '$3'"; FAILS=$((FAILS + 1)); fi
}
contains() {  # contains WHAT FILE PATTERN (grep -E)
  if grep -qE -- "$3" "$2"; then echo "ok   $1"; else echo "FAIL $1: no /$3/ in $2:"; sed 's/^/     | /' "$2"; FAILS=$((FAILS + 1)); fi
}
. "$ROOT/scripts/lib/gpu-check-bundle.sh"

# 1. Deadlines: shares 45 345 70 20 of 480 s from t0 = 1000.
gc_plan 1000 480
check "deadlines of 480 s from 1000" "1045 1390 1460 1480" "${GC_DEADLINE[*]}"
check "tests left at 1100" 290 "$(gc_left tests 1100)"
check "probe left at 1100 (past)" 0 "$(gc_left probe 1100)"
check "limit of 120 s at 1300 (90 s left)" 90 "$(gc_limit 120 tests 1300)"
check "limit of 60 s at 1100" 60 "$(gc_limit 60 tests 1100)"
check "limit at the pack deadline" 0 "$(gc_limit 30 pack 1480)"
gc_plan 0 240   # 45*240/480 = 22.5 -> 22; 390/2 = 195; 460/2 = 230; 240
check "deadlines of 240 s from 0" "22 195 230 240" "${GC_DEADLINE[*]}"

# 2. Figures
check "median of 3 1 2" 2 "$(gc_median 3 1 2)"
check "median of 4 1 3 2" 2.5 "$(gc_median 4 1 3 2)"
check "median of 12.5" 12.5 "$(gc_median 12.5)"
check "ratio 103/100" 1.030 "$(gc_ratio 103 100)"
check "milliseconds shown" "1983.680 2.000" "$(gc_ms 1983.6802309999998 2)"
gc_version_ge 2.39 2.36 && r=yes || r=no; check "2.39 >= 2.36" yes $r
gc_version_ge 2.9 2.36 && r=yes || r=no; check "2.9 >= 2.36" no $r
gc_version_ge 3.4.30 3.4.30 && r=yes || r=no; check "3.4.30 >= 3.4.30" yes $r

# 3. Library search. A real shared library of this system (the C library the shell uses).
REAL=$(ldd "$(command -v bash)" | awk '/libc\.so/ {print $3; exit}')
[ -f "$REAL" ] || { echo "FAIL no C library found through ldd"; exit 1; }
export HOME=$T/home
export GC_CUDA_ROOTS=$T/no-cuda
PYV=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")' 2>/dev/null || echo 3.0)
WHEEL_GLOB=$HOME/.local/lib/python3.99/site-packages/nvidia/nccl/lib     # glob fallback only
WHEEL_SITE=$T/userbase/lib/python$PYV/site-packages/nvidia/cu13/lib      # python3's site only
mkdir -p "$WHEEL_GLOB" "$WHEEL_SITE" "$T/ldpath1" "$T/ldpath2"
cp "$REAL" "$WHEEL_GLOB/libgcfake_nccl.so.2"
cp "$REAL" "$WHEEL_SITE/libgcfake_cupti.so.13"
cp "$REAL" "$WHEEL_SITE/libgcfake_cudart.so.13"
echo "not a library" >"$T/ldpath1/libgcfake_cudart.so.13"
cp "$REAL" "$T/ldpath2/libgcfake_cudart.so.13"
gc_is_elf64 "$REAL" && r=yes || r=no; check "a real library is a 64-bit ELF" yes $r
gc_is_elf64 "$T/ldpath1/libgcfake_cudart.so.13" && r=yes || r=no; check "a text file is not" no $r
check "wheel lib through the glob (no python3)" "$WHEEL_GLOB/libgcfake_nccl.so.2" \
  "$(GC_PYTHON=/nonexistent gc_find_lib libgcfake_nccl.so.2)"
if command -v python3 >/dev/null 2>&1; then
  check "wheel lib through python3's site (PYTHONUSERBASE)" "$WHEEL_SITE/libgcfake_cupti.so.13" \
    "$(PYTHONUSERBASE=$T/userbase gc_find_lib libgcfake_cupti.so.13)"
else
  echo "note: no python3 here: the site-packages search through python3 is not checked"
fi
r=$(GC_PYTHON=/nonexistent gc_find_lib libgcfake_cupti.so.13) || r=none
check "without python3 the site-only wheel is not found" none "$r"
check "LD_LIBRARY_PATH first, the non-ELF file passed over" "$T/ldpath2/libgcfake_cudart.so.13" \
  "$(LD_LIBRARY_PATH=$T/ldpath1:$T/ldpath2 PYTHONUSERBASE=$T/userbase gc_find_lib libgcfake_cudart.so.13)"
r=$(gc_find_lib libgcfake_absent.so.9) || r=none
check "a missing library is not found" none "$r"
export GC_FIND_ROOTS="$T/findroot $T/no-such-root"
mkdir -p "$T/findroot/venv/lib/python3.11/site-packages/nvidia/odd/lib64"
cp "$REAL" "$T/findroot/venv/lib/python3.11/site-packages/nvidia/odd/lib64/libgcfake_findme.so.1"
check "the find fallback (GC_FIND_ROOTS)" "$T/findroot/venv/lib/python3.11/site-packages/nvidia/odd/lib64/libgcfake_findme.so.1" \
  "$(gc_find_lib_anywhere libgcfake_findme.so.1)"
r=$(gc_find_lib_anywhere libgcfake_absent.so.9) || r=none
check "the find fallback: a missing library" none "$r"
check "glibcxx of a file" 3.4.7 "$(printf 'x GLIBCXX_3.4.2 GLIBCXX_3.4.10x GLIBCXX_3.4.7' | sed 's/10x/1/' >"$T/fake-stdcxx"; gc_glibcxx_of "$T/fake-stdcxx")"
check "nothing unresolved for bash" "" "$(gc_unresolved "" "$(command -v bash)")"

# 4. The tests stage, on real commands.
GC_WORK=$T/work
GC_SUMMARY=$T/summary-tests.txt
mkdir -p "$GC_WORK/logs" "$T/bin" "$T/root"
: >"$GC_SUMMARY"
GC_ENV=(PATH="$PATH")
printf '#!/usr/bin/env bash\necho "hello from the bundle"\n' >"$T/bin/hello"
chmod +x "$T/bin/hello"
printf 'test "$1" = arg\n' >"$T/root/check_arg.sh"
cat >"$T/tests.json" <<'EOF'
{"tests": [
 {"name": "reads-stdin", "command": ["bash", "-c", "cat >/dev/null"], "labels": ["gpu"], "timeout_s": 0, "skip_return_code": null, "environment": {}},
 {"name": "pass", "command": ["bash", "-c", "echo ok"], "labels": ["gpu"], "timeout_s": 0, "skip_return_code": null, "environment": {}},
 {"name": "fail", "command": ["bash", "-c", "exit 3"], "labels": ["gpu"], "timeout_s": 0, "skip_return_code": null, "environment": {}},
 {"name": "skip-code", "command": ["bash", "-c", "exit 77"], "labels": ["gpu"], "timeout_s": 0, "skip_return_code": "77", "environment": {}},
 {"name": "gtest-skipped", "command": ["bash", "-c", "echo '[  SKIPPED ] Gpu.T (0 ms)'"], "labels": ["gpu"], "timeout_s": 0, "skip_return_code": null, "environment": {}},
 {"name": "times-out", "command": ["sleep", "30"], "labels": ["gpu"], "timeout_s": 1, "skip_return_code": null, "environment": {}},
 {"name": "mpi", "command": ["bash", "-c", "echo mpi"], "labels": ["gpu", "mpi"], "timeout_s": 0, "skip_return_code": null, "environment": {}},
 {"name": "long", "command": ["bash", "-c", "echo long"], "labels": ["gpu"], "timeout_s": 330, "skip_return_code": null, "environment": {}},
 {"name": "placeholders", "command": ["@BIN@/hello"], "labels": ["gpu"], "timeout_s": 0, "skip_return_code": null, "environment": {}},
 {"name": "root-and-env", "command": ["bash", "-c", "bash \"$0\" \"$GC_T_ARG\"", "@ROOT@/check_arg.sh"], "labels": ["gpu"], "timeout_s": 0, "skip_return_code": null, "environment": {"GC_T_ARG": "arg"}}
]}
EOF
gc_plan "$(date +%s)" 480
GC_DEADLINE[1]=$(($(date +%s) + 200))   # 200 s left in the tests stage: "long" (330 s) must not start
GC_NO_MPI="no MPI in this check"
gc_run_tests "$T/tests.json" "$T/bin" "$T/root" 0
# (reads-stdin: a test reading its input, as mpirun does, must not eat the list of tests.)
check "counts: passed failed skipped timed-out not-run listed" "5 1 2 1 1 10" "$GC_COUNTS"
R=$GC_WORK/logs/tests/results.tsv
check "the longest TIMEOUT first" long "$(head -n 1 "$R" | cut -f2)"
check "long (TIMEOUT 330 s, 200 s left): run, capped" passed "$(awk -F'\t' '$2 == "long" {print $3}' "$R")"
contains "long: the cap named" "$R" "long.*limit (19[0-9]|200) s \(its TIMEOUT 330 s capped by the stage's deadline\)"
check "times-out: timed out" "timed out" "$(awk -F'\t' '$2 == "times-out" {print $3}' "$R")"
contains "times-out ran under its own TIMEOUT (1 s)" "$R" "times-out.*limit 1 s$"
contains "a test without TIMEOUT runs under 120 s" "$R" "pass.*passed.*limit 120 s$"
check "skip code: skipped" skipped "$(awk -F'\t' '$2 == "skip-code" {print $3}' "$R")"
check "SKIPPED in the output: skipped" skipped "$(awk -F'\t' '$2 == "gtest-skipped" {print $3}' "$R")"
check "placeholders: passed" passed "$(awk -F'\t' '$2 == "placeholders" {print $3}' "$R")"
check "root and environment: passed" passed "$(awk -F'\t' '$2 == "root-and-env" {print $3}' "$R")"
check "mpi without MPI: not run" "not run" "$(awk -F'\t' '$2 == "mpi" {print $3}' "$R")"
# A stage nearly out of time: the first test's limit capped to what is left (it times out there),
# the next one not reached.
cat >"$T/tests-late.json" <<'EOF2'
{"tests": [
 {"name": "np2-like", "command": ["sleep", "60"], "labels": ["gpu"], "timeout_s": 330, "skip_return_code": null, "environment": {}},
 {"name": "after", "command": ["bash", "-c", "echo after"], "labels": ["gpu"], "timeout_s": 0, "skip_return_code": null, "environment": {}}
]}
EOF2
rm -rf "$GC_WORK/logs/tests"
GC_DEADLINE[1]=$(($(date +%s) + 8))
gc_run_tests "$T/tests-late.json" "$T/bin" "$T/root" 0
R=$GC_WORK/logs/tests/results.tsv
check "late: counts" "0 0 0 1 1 2" "$GC_COUNTS"
contains "late: np2-like timed out under the cap" "$R" "np2-like	timed out	exit 124 after [0-9]+ s, limit [78] s \(its TIMEOUT 330 s capped"
check "late: the next test not reached" "not reached" "$(awk -F'\t' '$2 == "after" {print $3}' "$R")"
# A tests.json that cannot be read fails the stage with the reason.
echo '{"tests": [' >"$T/tests-bad.json"
rm -rf "$GC_WORK/logs/tests"
gc_plan "$(date +%s)" 480
gc_run_tests "$T/tests-bad.json" "$T/bin" "$T/root" 0 && r=ok || r=failed
check "unreadable tests.json: fails" failed "$r"
contains "unreadable tests.json: the reason kept" <(echo "$GC_TESTS_ERROR") "cannot read .*tests-bad.json: .*(Error|error)"

# An empty tests.json is a failure of the stage.
GC_B=$T/empty-bundle
mkdir -p "$GC_B/bin"
echo '{"tests": []}' >"$GC_B/tests.json"
GC_ROOT=$T/root
rm -rf "$GC_WORK/logs/tests"
gc_stage_tests 1 >/dev/null
check "no test listed: the stage fails" failed "${GC_STATE[gpu tests]}"
contains "no test listed: said so" "$GC_SUMMARY" "gpu tests: failed - tests.json lists no test"
check "no test listed: nothing run" "0 0 0 0 0 0" "$GC_COUNTS"

# 5. The runner when there is no GPU: PATH without nvidia-smi (every other command kept).
# path-bare: neither xz nor python3 either (a minimal Debian root: the packed bundle cannot be
# unpacked there, and the runner must still stop at "no GPU", writing logs.tar.gz).
mkdir -p "$T/path" "$T/path-bare"
IFS=: read -ra dirs <<<"$PATH"
for d in "${dirs[@]}"; do
  for f in "$d"/*; do
    b=${f##*/}
    [ "$b" = nvidia-smi ] || [ -e "$T/path/$b" ] || ln -s "$f" "$T/path/$b" 2>/dev/null
    case $b in nvidia-smi|xz|unxz|xzcat|lzma|python3*) ;; *) [ -e "$T/path-bare/$b" ] || ln -s "$f" "$T/path-bare/$b" 2>/dev/null ;; esac
  done
done
B=$T/bundle/unpacked
mkdir -p "$B/bin" "$B/lib/compat"
printf 'commit=test\nbuilt=now\nglibc_needed=2.17\nglibcxx_needed=3.4.19\n' >"$B/bundle.env"
printf 'libgcfake_nccl.so.2\nlibgcfake_absent.so.9\nlibgcfake_findme.so.1\n' >"$B/needs-on-machine.txt"
cp "$T/tests.json" "$B/tests.json"
run_runner() {  # run_runner BUNDLE_DIR OUT [PATH]: exit status in RC
  (cd "$T" && env PATH="${3:-$T/path}" OUT="$2" GC_PYTHON=/nonexistent "$ROOT/scripts/gpu-check" --bundle "$1" >"$2.log" 2>&1)
  RC=$?
}
for form in unpacked packed; do
  if [ $form = packed ]; then
    mkdir -p "$T/bundle/packed"
    tar -C "$B" -cJf "$T/bundle/packed/bundle.tar.xz" .
  fi
  run_runner "$T/bundle/$form" "$T/out-$form"
  O=$T/out-$form
  check "$form: exit 3 (no GPU)" 3 "$RC"
  check "$form: exactly two files in OUT" "logs.tar.xz summary.txt" "$(ls "$O" | sort | tr '\n' ' ' | sed 's/ $//')"
  contains "$form: the reason" "$O/summary.txt" "^probe: failed - no GPU: nvidia-smi not found"
  contains "$form: the wheel library found" "$O/summary.txt" "libgcfake_nccl.so.2: $WHEEL_GLOB/libgcfake_nccl.so.2"
  contains "$form: the missing library named" "$O/summary.txt" "libgcfake_absent.so.9: NOT FOUND"
  contains "$form: a library found by the find fallback" "$O/summary.txt" "libgcfake_findme.so.1: $T/findroot/.*/libgcfake_findme.so.1"
  contains "$form: tests not reached" "$O/summary.txt" "^gpu tests: not reached"
  contains "$form: runs not reached" "$O/summary.txt" "^gpt-tiny runs: not reached"
  contains "$form: the archive written" "$O/summary.txt" "^archive: passed - logs.tar.xz"
  check "$form: the last line" "RESULT: FAILED (probe: failed; gpu tests: not reached; gpt-tiny runs: not reached); stopped: no GPU: nvidia-smi not found (no NVIDIA driver on this machine)" \
    "$(tail -n 1 "$O/summary.txt" | sed 's/; the probe: .*//')"
  tar -tJf "$O/logs.tar.xz" >"$T/list-$form.txt"
  contains "$form: the archive holds the logs" "$T/list-$form.txt" "^\./logs/library-search-dirs\.txt$"
  contains "$form: the archive holds the summary" "$T/list-$form.txt" "^\./summary\.txt$"
done
# The packed bundle where neither xz nor python3 is: still "no GPU" (the driver is probed first),
# the missing tools named, the archive gzip-compressed.
run_runner "$T/bundle/packed" "$T/out-bare" "$T/path-bare"
O=$T/out-bare
check "no xz, no python3: exit 3 (no GPU)" 3 "$RC"
check "no xz, no python3: exactly two files in OUT" "logs.tar.gz summary.txt" "$(ls "$O" | sort | tr '\n' ' ' | sed 's/ $//')"
contains "no xz, no python3: the no-GPU reason" "$O/summary.txt" "^probe: failed - no GPU: nvidia-smi not found .*could not be unpacked here: neither xz nor python3 found"
contains "no xz, no python3: the archive written" "$O/summary.txt" "^archive: passed - logs.tar.gz"
# --out DIR is OUT.
(cd "$T" && env PATH="$T/path" GC_PYTHON=/nonexistent "$ROOT/scripts/gpu-check" --bundle "$T/bundle/packed" --out "$T/out-flag" >"$T/out-flag.log" 2>&1)
check "--out DIR: exit 3, the two files there" "3 logs.tar.xz summary.txt" "$? $(ls "$T/out-flag" | sort | tr '\n' ' ' | sed 's/ $//')"
# No --bundle: usage, exit 2.
"$ROOT/scripts/gpu-check" >"$T/usage.log" 2>&1
check "no --bundle: exit 2" 2 "$?"
mkdir -p "$T/not-a-bundle"
run_runner "$T/not-a-bundle" "$T/out-bad"
check "not a bundle: exit 2" 2 "$RC"
contains "not a bundle: said so" "$T/out-bad/summary.txt" "neither bundle.tar.xz nor an unpacked bundle"

if [ $FAILS -gt 0 ]; then echo "gpu_check_checks: $FAILS FAILED"; exit 1; fi
echo "gpu_check_checks: all passed"
