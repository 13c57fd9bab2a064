#!/usr/bin/env bash
# `orrery sweep` spread over MPI ranks (mpirun -n R orrery sweep ...): rank 0 prints the table and
# writes the CSV a single process does, byte for byte, at 2 ranks and at more ranks than there are
# simulations (3 ranks, 2 sizes without --search); a layout search of the Llama 3 405B scenario
# (sequence parallelism) at 2 ranks; the other ranks print nothing on stdout.
# Usage: sweep_mpi_checks.sh ORRERY SOURCE_DIR
set -u
ORRERY=$1
SRC=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cd "$SRC" || exit 1
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# same NAME RANKS sweep-args...: the R-rank table and CSV equal the one-process ones.
same() {
  local name=$1 ranks=$2
  shift 2
  if ! timeout 300 "$ORRERY" sweep "$@" --quiet --csv "$TMP/$name.1.csv" > "$TMP/$name.1.txt" 2> "$TMP/$name.1.err"; then
    fail "$name: one process exited non-zero"; cat "$TMP/$name.1.err"; return
  fi
  if ! timeout 300 mpirun -n "$ranks" "$ORRERY" sweep "$@" --quiet --csv "$TMP/$name.n.csv" > "$TMP/$name.n.txt" 2> "$TMP/$name.n.err"; then
    fail "$name: mpirun -n $ranks exited non-zero"; tail -20 "$TMP/$name.n.err"; return
  fi
  # The last line names the CSV file, which differs by design.
  if ! diff <(grep -v "^CSV written" "$TMP/$name.1.txt") <(grep -v "^CSV written" "$TMP/$name.n.txt") > "$TMP/$name.diff"; then
    fail "$name: the $ranks-rank table differs"; cat "$TMP/$name.diff"; return
  fi
  if ! cmp -s "$TMP/$name.1.csv" "$TMP/$name.n.csv"; then fail "$name: the $ranks-rank CSV differs"; return; fi
  local rows
  rows=$(($(wc -l < "$TMP/$name.1.csv") - 1))
  [ "$rows" -ge 1 ] || { fail "$name: no rows"; return; }
  echo "ok: $name: $ranks ranks print the one-process table and CSV ($rows rows)"
}

same gpt3-search 2 scenarios/gpt3-175b.yaml --cluster scenarios/clusters/h100-16384.yaml \
  --gpus 512,1024,4096 --search
same gpt3-more-ranks-than-jobs 3 scenarios/gpt3-175b.yaml --cluster scenarios/clusters/h100-16384.yaml \
  --gpus 1024,4096
same llama3-405b-search 2 scenarios/llama/llama3-405b.yaml --cluster scenarios/clusters/h100-16384.yaml \
  --gpus 8192,16384 --search --top 3
# An error is every rank's: a size the scenario's tp·pp does not divide is a row's note, the same.
same gpt3-bad-size 2 scenarios/gpt3-175b.yaml --cluster scenarios/clusters/h100-16384.yaml --gpus 100,1024

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "all distributed sweep checks passed"
