#!/usr/bin/env bash
# runtime.precision bf16 | fp16 on device cpu, fp16 loss scaling and parallel.grad_dtype from the
# command line (issue 18 items 2 and 6):
#  - bad input exits 2 naming the key: tf32 on cpu, fp16 on cuda, an unknown grad_dtype, a 16-bit
#    grad_dtype with compression or with ZeRO 1, a loss scale of 0, a window of 0 (fp16 with
#    checkpoints runs: tests/runtime/mpi/compression_checkpoint_checks.sh);
#  - a forced fp16 overflow (training.loss_scale 2^40) on 2 ranks: every step skipped, `orrery
#    report` prints the skipped steps and the halving scale; the trace meta says fp16;
#  - bf16 with grad_dtype bf16 on 2 ranks: DDP's all-reduce bytes in the report are half those of
#    the fp32 run of the same scenario.
# Usage: mixed_precision_checks.sh ORRERY SOURCE_DIR
set -u
ORRERY=$1
SRC=$2
TMP=$(mktemp -d /tmp/mp18_cli.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
EXPECT_DIR="$SRC"
# shellcheck source=expect.sh
source "$(dirname "$0")/expect.sh"

G=scenarios/gpt-tiny.yaml
DP2="--set parallel.dp=2 --set parallel.tp=1 --set parallel.pp=1"
expect 2 "key 'runtime.precision': tf32 runs on device cuda only (device cpu: fp32, bf16 or fp16)" \
  run $G --device cpu --set runtime.precision=tf32 --out "$TMP/x.db"
expect 2 "key 'runtime.precision': fp16 runs on device cpu only (device cuda: fp32, tf32 or bf16)" \
  run $G --device cuda --set runtime.precision=fp16 --out "$TMP/x.db"
expect 2 "key 'parallel.grad_dtype': expected fp32, bf16 or fp16, got 'fp8'" \
  run $G --set parallel.grad_dtype=fp8 --out "$TMP/x.db"
# shellcheck disable=SC2086
expect 2 "key 'parallel.grad_dtype': 'fp16' needs parallel.grad_compression none (got 'int8')" \
  run $G --nproc 2 $DP2 --set parallel.grad_dtype=fp16 --set parallel.grad_compression=int8 \
  --out "$TMP/x.db"
# shellcheck disable=SC2086
expect 2 "key 'parallel.grad_dtype': 'bf16' sends DDP's all-reduce in 16 bits, which ZeRO stage 1 replaces" \
  run $G --nproc 2 $DP2 --set parallel.grad_dtype=bf16 --set parallel.zero=1 --out "$TMP/x.db"
expect 2 "key 'training.loss_scale': must be a finite number > 0" \
  run $G --set runtime.precision=fp16 --set training.loss_scale=0 --out "$TMP/x.db"
expect 2 "key 'training.loss_scale_window': must be >= 1" \
  run $G --set runtime.precision=fp16 --set training.loss_scale_window=0 --out "$TMP/x.db"

# shellcheck disable=SC2086
expect 0 "skipped (fp16 overflow)" run $G --nproc 2 $DP2 --device cpu --set training.steps=3 \
  --set runtime.precision=fp16 --set training.loss_scale=1099511627776 --out "$TMP/f16.db"
expect 0 "fp16 loss scaling: skipped steps 3 of 3" report "$TMP/f16.db"
expect 0 "loss scale 1.09951e+12 at the first step, 2.74878e+11 at the last" report "$TMP/f16.db"
if "$ORRERY" report --json "$TMP/f16.db" | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j["loss_scaling"]["skipped_steps"] == 3, j["loss_scaling"]
'; then
  echo "ok: report --json loss_scaling.skipped_steps 3"
else
  fail "report --json has no loss_scaling.skipped_steps 3"
fi
if "$ORRERY" report --json "$TMP/f16.db" | python3 -c '
import json, sys
assert json.load(sys.stdin)["layout"]["precision"] == "fp16"
'; then
  echo "ok: the trace meta layout records fp16"
else
  fail "the trace meta layout does not record fp16"
fi

for dt in fp32 bf16; do
  # shellcheck disable=SC2086
  expect 0 "" run $G --nproc 2 $DP2 --device cpu --set training.steps=2 \
    --set runtime.precision=bf16 --set parallel.grad_dtype=$dt --out "$TMP/b_$dt.db"
  "$ORRERY" report --json "$TMP/b_$dt.db" >"$TMP/b_$dt.json" || fail "report of b_$dt.db"
done
if python3 - "$TMP/b_fp32.json" "$TMP/b_bf16.json" <<'PY'
import json, sys
def ddp_bytes(p):
    # DDP's all-reduces are the only ones on the dp group at ZeRO 0 (tp = pp = 1).
    return sum(c["bytes"] for c in json.load(open(p))["collectives"]
               if c["op"] == "all_reduce" and c["comm_name"].startswith("dp["))
# Both also hold the end-of-run loss average on dp (report.loss: 2 steps x 4 bytes x 2 ranks).
a, b = ddp_bytes(sys.argv[1]) - 16, ddp_bytes(sys.argv[2]) - 16
print("ddp.all_reduce bytes (2 ranks, 2 steps): grad_dtype fp32 %d, bf16 %d" % (a, b))
assert a > 0 and 2 * b == a, (a, b)
PY
then
  echo "ok: grad_dtype bf16 halves DDP's all-reduce bytes"
else
  fail "grad_dtype bf16 does not halve DDP's all-reduce bytes"
fi

if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all mixed precision CLI checks passed"
