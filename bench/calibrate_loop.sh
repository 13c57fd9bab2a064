#!/usr/bin/env bash
# The prediction-accuracy loop of "measure here, predict there" on this machine:
#   1. real runs of gpt-tiny (few steps): the calibration set (serial, dp2) and every other layout
#      the runtime accepts (dp4, dp8, dp2 without overlap, tp/pp/ZeRO layouts once the runtime runs them);
#   2. `orrery calibrate` on the calibration set only -> a profile of this machine;
#   3. `orrery sim --hw PROFILE` (no --cluster: the profile describes this machine) for every layout;
#   4. the table: layout, measured median step time, predicted, error %, and the mean absolute error.
# Timings, not a test: the machine's 2 cores are shared, so the figures are as noisy as the machine.
#
#   bench/calibrate_loop.sh [BUILD_DIR] [STEPS]      (default build/ and 4 steps; run from the repo root)
# Environment: OUT_DIR (default /tmp/orrery-calibrate-loop), LAYOUTS (space-separated names to run,
# default all), SCENARIO (default scenarios/gpt-tiny.yaml), ORRERY_RUN (the binary for the real runs,
# default the build's), SKIP_RUNS=1 (reuse the runs already in OUT_DIR), RUNS_ONLY=1 (stop after them).
set -u
BUILD=${1:-build}
STEPS=${2:-4}
ORRERY=$BUILD/bin/orrery
ORRERY_RUN=${ORRERY_RUN:-$ORRERY}
SCEN=${SCENARIO:-scenarios/gpt-tiny.yaml}
OUT=${OUT_DIR:-/tmp/orrery-calibrate-loop}
mkdir -p "$OUT"
[ -x "$ORRERY" ] || [ "${RUNS_ONLY:-0}" = 1 ] || { echo "no $ORRERY: build the orrery target first" >&2; exit 2; }
MB=8   # micro-batch per rank (gpt-tiny's); global batch = dp x MB unless a layout sets it

# name | ranks | --set options (beyond steps and global batch) | global batch | role
LAYOUT_TABLE="
serial|1|parallel.dp=1|8|calib
dp2|2|parallel.dp=2|16|calib
dp4|4|parallel.dp=4|32|predict
dp8|8|parallel.dp=8|64|predict
dp2-no-overlap|2|parallel.dp=2 parallel.overlap=false|16|predict
dp4-bucket1|4|parallel.dp=4 parallel.bucket_mb=1|32|predict
tp2|2|parallel.dp=1 parallel.tp=2|8|predict
tp4|4|parallel.dp=1 parallel.tp=4|8|predict
pp2-gpipe|2|parallel.dp=1 parallel.pp=2 parallel.schedule=gpipe training.micro_batch=4|8|predict
pp2-1f1b|2|parallel.dp=1 parallel.pp=2 parallel.schedule=1f1b training.micro_batch=4|8|predict
pp4-gpipe|4|parallel.dp=1 parallel.pp=4 parallel.schedule=gpipe training.micro_batch=2|8|predict
pp4-1f1b|4|parallel.dp=1 parallel.pp=4 parallel.schedule=1f1b training.micro_batch=2|8|predict
zero2-dp2|2|parallel.dp=2 parallel.zero=2|16|predict
zero3-dp2|2|parallel.dp=2 parallel.zero=3|16|predict
dp2tp2pp2|8|parallel.dp=2 parallel.tp=2 parallel.pp=2 training.micro_batch=4|16|predict
"

sets_of() {  # the --set arguments of a layout
  local sets=$1 gb=$2 a=""
  for kv in $sets; do a="$a --set $kv"; done
  echo "$a --set training.steps=$STEPS --set training.global_batch=$gb"
}

want() { [ -z "${LAYOUTS:-}" ] && return 0; for l in $LAYOUTS; do [ "$l" = "$1" ] && return 0; done; return 1; }

echo "== real runs ($STEPS steps each, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
CALIB=()
while IFS='|' read -r name ranks sets gb role; do
  [ -z "$name" ] && continue
  want "$name" || [ "$role" = calib ] || continue
  args=$(sets_of "$sets" "$gb")
  if [ "${SKIP_RUNS:-0}" = 1 ]; then
    if [ -f "$OUT/$name.run.json" ]; then
      [ "$role" = calib ] && CALIB+=("$OUT/$name.db")
      echo "  $name: reused, median step $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['median_step_ms'])" "$OUT/$name.run.json") ms"
    fi
    continue
  fi
  # shellcheck disable=SC2086
  if "$ORRERY_RUN" run "$SCEN" --nproc "$ranks" $args --out "$OUT/$name.db" --json </dev/null >"$OUT/$name.run.json" 2>"$OUT/$name.run.err"; then
    ms=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['median_step_ms'])" "$OUT/$name.run.json")
    echo "  $name: median step $ms ms"
    [ "$role" = calib ] && CALIB+=("$OUT/$name.db")
  else
    echo "  $name: not run ($(grep -m1 -o 'key .*' "$OUT/$name.run.err" | cut -c1-110))"
    rm -f "$OUT/$name.run.json"
  fi
done <<<"$LAYOUT_TABLE"

[ "${RUNS_ONLY:-0}" = 1 ] && exit 0
echo "== calibrate from: ${CALIB[*]}"
"$ORRERY" calibrate "${CALIB[@]}" --out "$OUT/profile.yaml" | sed 's/^/  /'

echo "== predictions (orrery sim --hw $OUT/profile.yaml, no --cluster)"
ROWS="$OUT/rows.tsv"
: >"$ROWS"
while IFS='|' read -r name ranks sets gb role; do
  [ -z "$name" ] && continue
  [ -f "$OUT/$name.run.json" ] || continue
  args=$(sets_of "$sets" "$gb")
  # shellcheck disable=SC2086
  if "$ORRERY" sim "$SCEN" --hw "$OUT/profile.yaml" $args --steps 2 --json --out "$OUT/$name.sim.db" \
      </dev/null >"$OUT/$name.sim.json" 2>"$OUT/$name.sim.err"; then
    python3 - "$name" "$role" "$OUT/$name.run.json" "$OUT/$name.sim.json" >>"$ROWS" <<'PY'
import json, sys
name, role, run, sim = sys.argv[1:5]
m = json.load(open(run))["median_step_ms"]
p = json.load(open(sim))["step_time_ns"] / 1e6
print(f"{name}\t{role}\t{m:.1f}\t{p:.1f}\t{100 * (p - m) / m:+.1f}")
PY
  else
    echo "  $name: sim failed: $(head -c 200 "$OUT/$name.sim.err")"
  fi
done <<<"$LAYOUT_TABLE"

python3 - "$ROWS" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
print(f"\n{'layout':<16} {'role':<12} {'measured ms':>12} {'predicted ms':>13} {'error':>8}")
for n, role, m, p, e in rows:
    print(f"{n:<16} {'calibration' if role == 'calib' else 'prediction':<12} {m:>12} {p:>13} {e:>7}%")
pred = [abs(float(r[4])) for r in rows if r[1] == "predict"]
if pred:
    print(f"\npredicted layouts: {len(pred)}, mean absolute error {sum(pred) / len(pred):.1f} %, "
          f"max {max(pred):.1f} %, within 10 %: {sum(e <= 10 for e in pred)}/{len(pred)}")
PY
echo "(files in $OUT; span-level: $ORRERY report $OUT/dp4.db --compare $OUT/dp4.sim.db)"
