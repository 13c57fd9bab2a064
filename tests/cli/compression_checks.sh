#!/usr/bin/env bash
# parallel.grad_compression and compression.* from the command line (issue 18 items 1 and 6):
#  - bad input exits 2 naming the key: an unknown scheme, a rank or ratio out of range, a negative
#    start step, compression with ZeRO 2/3;
#  - a valid scheme runs on `orrery run --device cpu` (2 ranks, 2 steps, its compressed collective
#    in the trace), in `orrery sim` (its collective in the simulated trace) and in
#    `orrery sweep --search` (ZeRO 0/1 layouts only); on the cuda device it is no longer refused:
#    without a GPU the run gets as far as the device check (exit 2 naming runtime.device, not
#    the compression key), with one it runs (exit 0); with tp, pp or MoE blocks device cuda
#    refuses it (exit 2 naming the key) on either machine;
#  - grad_compression: none still runs.
# Usage: compression_checks.sh ORRERY SOURCE_DIR
set -u
ORRERY=$1
SRC=$2
TMP=$(mktemp -d /tmp/comp_cli.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
EXPECT_DIR="$SRC"
# shellcheck source=expect.sh
source "$(dirname "$0")/expect.sh"

G=scenarios/gpt-tiny.yaml
DP2="--set parallel.dp=2 --set parallel.tp=1 --set parallel.pp=1"
for cmd in run sim; do
  # shellcheck disable=SC2086
  expect 2 "key 'parallel.grad_compression': expected none, int8, powersgd or topk, got 'fp8'" \
    $cmd $G $DP2 --set parallel.grad_compression=fp8
  # shellcheck disable=SC2086
  expect 2 "key 'compression.powersgd_rank': must be >= 1" $cmd $G $DP2 \
    --set parallel.grad_compression=powersgd --set compression.powersgd_rank=0
  # shellcheck disable=SC2086
  expect 2 "key 'compression.topk_ratio': must be in (0, 1]" $cmd $G $DP2 \
    --set parallel.grad_compression=topk --set compression.topk_ratio=1.01
  # shellcheck disable=SC2086
  expect 2 "key 'compression.start_step': must be >= 0" $cmd $G $DP2 --set compression.start_step=-3
  for z in 2 3; do
    # shellcheck disable=SC2086
    expect 2 "key 'parallel.grad_compression': 'topk' compresses the dp all-reduce, which ZeRO stage $z replaces with a reduce-scatter" \
      $cmd $G $DP2 --set parallel.zero=$z --set parallel.grad_compression=topk
    # shellcheck disable=SC2086
    expect 2 "key 'parallel.grad_compression': 'int8' compresses the dp all-reduce, which ZeRO stage $z replaces with a reduce-scatter" \
      $cmd $G $DP2 --set parallel.zero=$z --set parallel.grad_compression=int8 --set runtime.device=cuda
  done
done
# Device cuda: exit 2 at the device check naming runtime.device (no GPU here), or 0 (a GPU); never
# a refusal of the compression key.
cuda_device_check() {
  (cd "$EXPECT_DIR" && timeout 120 "$ORRERY" "$@") >"$TMP/out" 2>&1
  local rc=$?
  if { [ $rc -eq 2 ] && grep -qF "key 'runtime.device' is cuda, but" "$TMP/out"; } ||
     { [ $rc -eq 0 ] && ! grep -q "grad_compression" "$TMP/out"; }; then
    echo "ok: orrery $* -> exit $rc (the device check, or run on a GPU)"
  else
    fail "orrery $* -> exit $rc (want 2 at the device check, or 0):"
    tail -n 20 "$TMP/out"
  fi
}
# shellcheck disable=SC2086
expect 2 "key 'parallel.grad_compression': 'int8' on runtime.device cuda runs with data parallelism only (parallel.tp 1, parallel.pp 1, no model.moe), got tp 2, pp 1, moe.experts 0" \
  run $G --nproc 4 --set parallel.dp=2 --set parallel.tp=2 --set parallel.pp=1 \
  --set parallel.grad_compression=int8 --device cuda --out "$TMP/x.db"
for scheme in int8 powersgd topk; do
  # shellcheck disable=SC2086
  cuda_device_check run $G --nproc 2 $DP2 --set training.steps=2 \
    --set parallel.grad_compression=$scheme --device cuda --out "$TMP/x.db"
  # shellcheck disable=SC2086
  expect 0 "" run $G --nproc 2 $DP2 --set training.steps=2 --set parallel.grad_compression=$scheme \
    --device cpu --out "$TMP/$scheme.db"
  case $scheme in
    int8) coll=ddp.int8_all_gather ;;
    topk) coll=ddp.topk_all_gather ;;
    powersgd) coll=ddp.powersgd_p ;;
  esac
  if "$ORRERY" report "$TMP/$scheme.db" | grep -q "$coll"; then
    echo "ok: $scheme run's report names $coll"
  else
    fail "$scheme run's report does not name $coll"
  fi
  # shellcheck disable=SC2086
  expect 0 "" sim $G $DP2 --set parallel.grad_compression=$scheme --out "$TMP/sim_$scheme.db"
  if "$ORRERY" report "$TMP/sim_$scheme.db" | grep -q "$coll"; then
    echo "ok: simulated $scheme trace's report names $coll"
  else
    fail "simulated $scheme trace's report does not name $coll"
  fi
  # shellcheck disable=SC2086
  expect 0 "" sweep $G --cluster scenarios/clusters/h100-8.yaml --gpus 2,4 --search \
    --set parallel.grad_compression=$scheme --csv "$TMP/sweep_$scheme.csv"
  # The search never picks ZeRO 2/3 with compression (column 5 of the CSV: zero).
  if [ -s "$TMP/sweep_$scheme.csv" ] && tail -n +2 "$TMP/sweep_$scheme.csv" | cut -d, -f5 | grep -qv '^[01]$'; then
    fail "sweep --search with $scheme chose ZeRO 2/3"
  else
    echo "ok: sweep --search with $scheme: ZeRO 0/1 only"
  fi
done
# Checkpoints hold the hooks' state (tests/runtime/mpi/compression_checkpoint_checks.sh resumes
# them bit for bit).
# shellcheck disable=SC2086
expect 0 "" run $G --nproc 1 --set parallel.dp=1 --set training.steps=1 \
  --set parallel.grad_compression=none --out "$TMP/none.db"

if [ $fails -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all checks passed"
