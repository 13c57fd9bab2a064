#!/usr/bin/env bash
# run_mpi_gpu_tests.sh MPIEXEC NPROC BINARY: runs a GoogleTest binary of GPU tests under mpirun
# (main: tests/runtime/mpi/mpi_main.cpp, rank 0 reports) with a time limit, and exits 77 (ctest's
# skip, SKIP_RETURN_CODE) when it passed with no test run, i.e. every test skipped (no usable
# device: the reason is in the output). A failure stays a failure; a hang ends after 300 s.
set -u
mpiexec=$1 nproc=$2 bin=$3
out=$(timeout --kill-after=10 300 "$mpiexec" -n "$nproc" --oversubscribe --bind-to none "$bin" --gtest_color=no 2>&1)
rc=$?
printf '%s\n' "$out"
if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -qF '[  PASSED  ] 0 tests'; then
  echo "run_mpi_gpu_tests: every test skipped"
  exit 77
fi
exit $rc
