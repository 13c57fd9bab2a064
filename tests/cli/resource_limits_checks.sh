#!/usr/bin/env bash
# `orrery synth` and `orrery sim` refuse requests larger than this machine before allocating: each
# absurd request must fail at once with exit 2 and a message naming the option or key and its value,
# under a 500 MB data limit (ulimit -d: heap and anonymous mappings), so a regression that allocates
# first dies of std::bad_alloc (exit 1, "internal error") and fails here instead of being slow. The
# same limit leaves room for ordinary requests, checked too. (ulimit -v would have to cover the CUDA
# libraries' mappings, over 1 GB; OPENBLAS_NUM_THREADS=1 because OpenBLAS's thread buffers spin
# when an allocation fails.)
# Usage: resource_limits_checks.sh ORRERY SOURCE_DIR [synth|sim|all]
set -u
ORRERY=$1
SRC=$2
WHAT=${3:-all}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
LIMIT_KB=512000
fails=0

# expect_refusal "what must be in the message" orrery args...
expect_refusal() {
  local want=$1
  shift
  local rc
  (ulimit -d $LIMIT_KB; cd "$SRC" && timeout 60 "$ORRERY" "$@") >"$TMP/out" 2>&1
  rc=$?
  if [ $rc -ne 2 ] || ! grep -qF -- "$want" "$TMP/out" || grep -q "internal error" "$TMP/out"; then
    echo "FAIL: orrery $* -> exit $rc (want 2 and a message with '$want'):"
    cat "$TMP/out"
    fails=$((fails + 1))
  else
    echo "ok: orrery $* -> $(tail -n 1 "$TMP/out")"
  fi
}

expect_success() {
  local rc
  (ulimit -d $LIMIT_KB; cd "$SRC" && timeout 120 "$ORRERY" "$@") >"$TMP/out" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAIL: orrery $* -> exit $rc under the same limit:"
    cat "$TMP/out"
    fails=$((fails + 1))
  else
    echo "ok: orrery $* -> exit 0"
  fi
}

if [ "$WHAT" = synth ] || [ "$WHAT" = all ]; then
  expect_refusal "--layers 2147483647" synth --layers 2147483647 --out "$TMP/a.db"
  expect_refusal "--ranks 2147483647" synth --ranks 2147483647 --out "$TMP/a.db"
  expect_refusal "--steps 2147483647" synth --steps 2147483647 --out "$TMP/a.db"
  expect_refusal "--spans 10000000000" synth --spans 10000000000 --out "$TMP/a.db"
  expect_refusal "--micro-batches 100000000" synth --pp 4 --ranks 8 --layers 8 --micro-batches 100000000 \
    --out "$TMP/a.db"
  expect_success synth --ranks 4 --steps 20 --layers 24 --out "$TMP/ok.db"
fi

if [ "$WHAT" = sim ] || [ "$WHAT" = all ]; then
  expect_refusal "key 'model.layers': 10000000 layers" sim scenarios/gpt-tiny.yaml --set model.layers=10000000
  expect_refusal "'training.global_batch' 1600000000" sim scenarios/gpt-tiny.yaml \
    --set training.global_batch=1600000000
  expect_refusal "100000000 steps (--steps)" sim scenarios/gpt-tiny.yaml --steps 100000000
  expect_refusal "'parallel.dp' x 'parallel.tp' x 'parallel.pp' = 200000000 x 8 x 16" sim scenarios/gpt3-175b.yaml \
    --set parallel.dp=200000000 --set training.global_batch=200000000
  # dp x micro_batch = 2^32 wrapped to 0 in int: the divisibility check divided by zero (SIGFPE).
  expect_refusal "key 'training.global_batch': 16 sequences must be divisible by dp (65536)" sim \
    scenarios/gpt-tiny.yaml --set parallel.dp=65536 --set training.micro_batch=65536
  expect_success sim scenarios/gpt-tiny.yaml --steps 3
  # One rank per stage: by default every rank of the 1,024 is simulated there (h100-1024's rails span
  # four leaves), which holds 16 M op timings, about 470 MB, beyond this limit.
  expect_success sim scenarios/gpt3-175b.yaml --cluster h100-1024 --representative
fi

if [ $fails -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all checks passed"
