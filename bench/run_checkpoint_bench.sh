#!/usr/bin/env bash
# Checkpoint cost on gpt-tiny (dp2, 2 ranks, no profiling): the same run without checkpoints, with
# a checkpoint after every step written in the foreground, and written from a background thread.
# Prints per mode: the size of one checkpoint (all files), the time the training loop was held per
# checkpoint (blocking), rank 0's file write time per checkpoint, the median step time (the step
# itself: a background write competes with it) and the loop time per step (steps plus checkpoints).
# Figures, not a test: they depend on the machine, its disk and whatever else runs.
#
# Usage: bench/run_checkpoint_bench.sh [BUILD_DIR]     (default: build)
# Environment: STEPS (10), OUT (bench/out), SCENARIO (scenarios/gpt-tiny.yaml), EXTRA (more --set)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ORRERY=$BUILD/bin/orrery
STEPS=${STEPS:-10}
OUT=${OUT:-bench/out}
SCENARIO=${SCENARIO:-scenarios/gpt-tiny.yaml}
EXTRA=${EXTRA:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x "$ORRERY" ] || { echo "no $ORRERY: build first"; exit 1; }
mkdir -p "$OUT"
CK=$OUT/checkpoint_bench
rm -rf "$CK"

run() {  # MODE SETS...
  local mode=$1
  shift
  # shellcheck disable=SC2086
  "$ORRERY" run "$SCENARIO" --no-profile --json --set training.steps="$STEPS" --set training.warmup_steps=1 \
    --set checkpoint.dir="$CK/$mode" "$@" $EXTRA 2> "$OUT/checkpoint_bench_$mode.err" | tail -1 > "$OUT/checkpoint_bench_$mode.json"
}
run none --set checkpoint.every=0
run foreground --set checkpoint.every=1
run background --set checkpoint.every=1 --set checkpoint.background=true

python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
print(f"{'mode':<11} {'ckpt MB':>8} {'blocking ms':>12} {'write ms':>9} {'median step ms':>15} {'loop ms/step':>13}")
for mode in ("none", "foreground", "background"):
    j = json.load(open(f"{out}/checkpoint_bench_{mode}.json"))
    c = j.get("checkpoint")
    steps = j["steps"]
    if c:
        n = max(1, c["saves"])
        print(f"{mode:<11} {c['bytes'] / n / 1e6:8.1f} {c['blocking_ms'] / n:12.1f} {c['rank0_write_ms'] / n:9.1f} "
              f"{j['median_step_ms']:15.1f} {j['loop_ms'] / steps:13.1f}")
    else:
        print(f"{mode:<11} {'-':>8} {'-':>12} {'-':>9} {j['median_step_ms']:15.1f} {j['loop_ms'] / steps:13.1f}")
EOF
