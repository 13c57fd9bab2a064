#!/usr/bin/env bash
# The prediction-accuracy loop of "measure here, predict there" on this machine:
#   1. real runs of gpt-tiny: the calibration set (serial, dp2), a block of CALIB_EVERY layouts to
#      predict (dp4, dp8, tp, pp, ZeRO, 3-D, recomputation, sequence parallelism, uneven stages, Llama-style blocks,
#      and issue 18's dp2 int8 / PowerSGD rank 4 (and ranks 1 and 16, predicted from the rank-4 calibration run) / top-k 1 % / bf16 / fp16 and dp2 ZeRO 1 with NVMe
#      offload; issue 19's MoE dp2 ep2, dp4 ep2, dp2 ep2 pp2; the calibration set has a serial
#      NVMe-offload run for the disk and, when a layout to predict needs them, a dp2 run without
#      overlap of each compression scheme and of each 16-bit precision: calib_for),
#      the calibration set again, the next block, ..., the
#      calibration set: the machine is shared and its load swings, so each prediction uses
#      calibration runs measured just before and just after the runs it predicts;
#   2. per block, `orrery calibrate` on those two calibration sets only -> a profile of this machine;
#   3. `orrery sim --hw PROFILE` (no --cluster: the profile describes this machine) for every layout
#      of the block (and the calibration runs themselves, as a check of the fit);
#   4. the table: layout, 1-min load average when it ran, measured median step time (steps after the
#      first), predicted, error %; the mean absolute error over the predicted layouts.
# Timings, not a test: the machine's 2 cores are shared, so the figures are as noisy as the machine.
#
#   bench/calibrate_loop.sh [BUILD_DIR] [STEPS]      (default build/ and 5 steps; run from the repo root)
# Environment: OUT_DIR (default /tmp/orrery-calibrate-loop), LAYOUTS (space-separated names to predict,
# default all), CALIB_EVERY (layouts per calibration block, default 2), SCENARIO (default
# scenarios/gpt-tiny.yaml), ORRERY_RUN (the binary for the real runs, default the build's), ORRERY_CAL
# (the binary for `orrery calibrate`: one that reads ORRERY_RUN's trace schema; default the build's),
# SKIP_RUNS=1 (reuse the runs already in OUT_DIR: refit and predict only), RUNS_ONLY=1 (stop after them),
# CALIB_SET (the calibration runs by name; default serial dp2 serial-nvme and what calib_for adds),
# COMMBENCH (the rank counts of the `orrery commbench` collective sweeps in each calibration set,
# default "2 4 8"; empty: none, collectives fitted from the dp2 run alone).
set -u
BUILD=${1:-build}
STEPS=${2:-5}
ORRERY=$BUILD/bin/orrery
ORRERY_RUN=${ORRERY_RUN:-$ORRERY}
ORRERY_CAL=${ORRERY_CAL:-$ORRERY}
SCEN=${SCENARIO:-scenarios/gpt-tiny.yaml}
OUT=${OUT_DIR:-/tmp/orrery-calibrate-loop}
EVERY=${CALIB_EVERY:-2}
COMMBENCH=${COMMBENCH-2 4 8}
mkdir -p "$OUT"
[ -x "$ORRERY" ] || [ "${RUNS_ONLY:-0}" = 1 ] || { echo "no $ORRERY: build the orrery target first" >&2; exit 2; }

# gpt-tiny's shape with Llama-style blocks: 2 key/value heads, SwiGLU of width 704, RMSNorm, RoPE,
# an untied head, no biases (predicted from the GPT calibration runs).
LLAMA="model.kv_heads=2 model.ffn_hidden=704 model.activation=swiglu model.norm=rmsnorm model.position=rope model.tied_embeddings=false model.bias=false"
# NVMe offload of the optimizer state into a directory of the run's disk (issue 18): the calibration
# set's serial-nvme run gives the disk's bandwidth (orrery calibrate fits it from its offload spans).
NVME_DIR=${NVME_DIR:-$OUT/nvme}
mkdir -p "$NVME_DIR"
NVME="zero.offload_optimizer=nvme zero.nvme_path=$NVME_DIR"
# The calibration set: serial, dp2 and a serial NVMe-offload run always; and, when a layout to
# predict uses gradient compression or a 16-bit precision, a run of that scheme or precision in a
# layout of its own (calib_for): the scheme or precision at dp2 without overlap (2 ranks, as the
# layouts predicted: the emulated rounding slows more than the GEMMs when 2 ranks share the cores,
# fp16's by 2.9x against the law's 1.9x in one loop here; serial-bf16 / serial-fp16 remain for
# CALIB_SET).
# Those fit the scheme's compression compute and the precision's rounding (orrery calibrate), so
# the held-out layouts are never their own calibration.
CALIB_SET=${CALIB_SET:-}
# Mixture of experts (issue 19): 4 experts, top 2, in every other block, a capacity factor; the
# expert-parallel layouts are predicted from the dense calibration set.
MOE="model.moe.experts=4 model.moe.top_k=2 model.moe.every=2 model.moe.capacity_factor=1.25"
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
zero2-dp2|2|parallel.dp=2 parallel.zero=2 training.micro_batch=4|16|predict
zero3-dp2|2|parallel.dp=2 parallel.zero=3 training.micro_batch=4|16|predict
dp2tp2pp2|8|parallel.dp=2 parallel.tp=2 parallel.pp=2 training.micro_batch=4|16|predict
recompute-full|1|parallel.dp=1 training.recompute=full|8|predict
recompute-selective|1|parallel.dp=1 training.recompute=selective|8|predict
tp2-sp|2|parallel.dp=1 parallel.tp=2 parallel.sequence_parallel=true|8|predict
tp2-sp-full|2|parallel.dp=1 parallel.tp=2 parallel.sequence_parallel=true training.recompute=full|8|predict
pp2-uneven|2|parallel.dp=1 parallel.pp=2 parallel.pp_layers=1,3 training.micro_batch=4|8|predict
llama|1|parallel.dp=1 $LLAMA|8|predict
llama-tp2|2|parallel.dp=1 parallel.tp=2 $LLAMA|8|predict
llama-dp2-full|2|parallel.dp=2 training.recompute=full $LLAMA|16|predict
serial-nvme|1|parallel.dp=1 $NVME|8|calib
serial-bf16|1|parallel.dp=1 runtime.precision=bf16|8|calib
serial-fp16|1|parallel.dp=1 runtime.precision=fp16|8|calib
dp2-bf16-no-overlap|2|parallel.dp=2 parallel.overlap=false runtime.precision=bf16|16|calib
dp2-fp16-no-overlap|2|parallel.dp=2 parallel.overlap=false runtime.precision=fp16|16|calib
dp2-int8-no-overlap|2|parallel.dp=2 parallel.overlap=false parallel.grad_compression=int8|16|calib
dp2-powersgd4-no-overlap|2|parallel.dp=2 parallel.overlap=false parallel.grad_compression=powersgd compression.powersgd_rank=4|16|calib
dp2-topk1-no-overlap|2|parallel.dp=2 parallel.overlap=false parallel.grad_compression=topk compression.topk_ratio=0.01|16|calib
dp2-int8|2|parallel.dp=2 parallel.grad_compression=int8|16|predict
dp2-powersgd4|2|parallel.dp=2 parallel.grad_compression=powersgd compression.powersgd_rank=4|16|predict
dp2-powersgd1|2|parallel.dp=2 parallel.grad_compression=powersgd compression.powersgd_rank=1|16|predict
dp2-powersgd16|2|parallel.dp=2 parallel.grad_compression=powersgd compression.powersgd_rank=16|16|predict
dp2-topk1|2|parallel.dp=2 parallel.grad_compression=topk compression.topk_ratio=0.01|16|predict
dp2-bf16|2|parallel.dp=2 runtime.precision=bf16|16|predict
dp2-fp16|2|parallel.dp=2 runtime.precision=fp16|16|predict
dp2-zero1|2|parallel.dp=2 parallel.zero=1|16|predict
dp2-zero1-nvme|2|parallel.dp=2 parallel.zero=1 $NVME|16|predict
dp2-ep2|2|parallel.dp=2 parallel.ep=2 $MOE|16|predict
dp4-ep2|4|parallel.dp=4 parallel.ep=2 $MOE|32|predict
dp2-ep2-pp2|4|parallel.dp=2 parallel.ep=2 parallel.pp=2 training.micro_batch=4 $MOE|16|predict
"

row_of() { grep "^$1|" <<<"$LAYOUT_TABLE"; }
sets_of() {  # the --set arguments of a layout
  local sets=$1 gb=$2 a=""
  for kv in $sets; do a="$a --set $kv"; done
  echo "$a --set training.steps=$STEPS --set training.global_batch=$gb"
}
want() { [ -z "${LAYOUTS:-}" ] && return 0; for l in $LAYOUTS; do [ "$l" = "$1" ] && return 0; done; return 1; }
median_ms() {  # median step time of a run, steps after the first (warm-up)
  python3 -c "import json,sys,statistics as s; d=json.load(open(sys.argv[1])); print(round(s.median(d['step_ms'][1:] or d['step_ms']), 1))" "$1"
}

# run NAME DIR: one real run into DIR/NAME.db (+ .run.json, .load); returns non-zero if it failed
run() {
  local name=$1 dir=$2 ranks sets gb role args
  IFS='|' read -r _ ranks sets gb role <<<"$(row_of "$name")"
  args=$(sets_of "$sets" "$gb")
  if [ "${SKIP_RUNS:-0}" = 1 ]; then [ -f "$dir/$name.run.json" ]; return; fi
  cut -d' ' -f1 /proc/loadavg >"$dir/$name.load"
  rm -f "$dir/$name.db"
  # shellcheck disable=SC2086
  if "$ORRERY_RUN" run "$SCEN" --nproc "$ranks" $args --out "$dir/$name.db" --json </dev/null \
      >"$dir/$name.run.json" 2>"$dir/$name.run.err"; then
    echo "  $name: median step $(median_ms "$dir/$name.run.json") ms (load $(cat "$dir/$name.load"))"
  else
    echo "  $name: not run ($(grep -v '^$' "$dir/$name.run.err" | head -1 | cut -c1-120))"
    rm -f "$dir/$name.run.json"
    return 1
  fi
}

# bench_comm N DIR: the collective sweep on N ranks into DIR/cbN.db
bench_comm() {
  local n=$1 dir=$2
  if [ "${SKIP_RUNS:-0}" = 1 ]; then return; fi
  rm -f "$dir/cb$n.db"
  if "$ORRERY_RUN" commbench --nproc "$n" --max-bytes 32M --out "$dir/cb$n.db" </dev/null >"$dir/cb$n.txt" 2>&1; then
    echo "  commbench $n ranks: $(grep -c '^ ' "$dir/cb$n.txt") sizes x ops measured"
  else
    echo "  commbench $n ranks: failed ($(tail -1 "$dir/cb$n.txt" | cut -c1-120))"
    rm -f "$dir/cb$n.db"
  fi
}

# predict NAME DIR ROLE BLOCK: orrery sim with DIR/profile.yaml, one row into $OUT/rows.tsv
predict() {
  local name=$1 dir=$2 role=$3 block=$4 ranks sets gb args
  [ -f "$dir/$name.run.json" ] || return
  IFS='|' read -r _ ranks sets gb _ <<<"$(row_of "$name")"
  args=$(sets_of "$sets" "$gb")
  # shellcheck disable=SC2086
  if "$ORRERY" sim "$SCEN" --hw "$dir/profile.yaml" $args --steps 3 --json --out "$dir/$name.sim.db" \
      </dev/null >"$dir/$name.sim.json" 2>"$dir/$name.sim.err"; then
    python3 - "$name" "$role" "$block" "$(cat "$dir/$name.load")" "$(median_ms "$dir/$name.run.json")" \
        "$dir/$name.sim.json" >>"$OUT/rows.tsv" <<'PY'
import json, sys
name, role, block, load, m, sim = sys.argv[1:7]
m = float(m)
p = json.load(open(sim))["step_time_ns"] / 1e6
print(f"{name}\t{role}\t{block}\t{load}\t{m:.1f}\t{p:.1f}\t{100 * (p - m) / m:+.1f}")
PY
  else
    echo "  $name: sim failed: $(head -c 200 "$dir/$name.sim.err")"
  fi
}

# The calibration runs a predicted layout needs beyond serial, dp2 and serial-nvme: its gradient
# compression scheme's and its precision's (dp2 without overlap).
calib_for() {
  local sets=$1 kv
  for kv in $sets; do
    case $kv in
      parallel.grad_compression=int8) echo dp2-int8-no-overlap ;;
      parallel.grad_compression=powersgd) echo dp2-powersgd4-no-overlap ;;
      parallel.grad_compression=topk) echo dp2-topk1-no-overlap ;;
      runtime.precision=bf16) echo dp2-bf16-no-overlap ;;
      runtime.precision=fp16) echo dp2-fp16-no-overlap ;;
    esac
  done
}

PRED=()
EXTRA=""
while IFS='|' read -r name _ sets _ role; do
  if [ -n "$name" ] && [ "$role" = predict ] && want "$name"; then
    PRED+=("$name")
    EXTRA="$EXTRA $(calib_for "$sets")"
  fi
done <<<"$LAYOUT_TABLE"
if [ -z "$CALIB_SET" ]; then
  CALIB_SET="serial dp2 serial-nvme"
  for c in $(tr ' ' '\n' <<<"$EXTRA" | grep . | sort -u); do CALIB_SET="$CALIB_SET $c"; done
fi

echo "== calibration set: $CALIB_SET"
echo "== $STEPS steps per run, $(nproc) cores, load at start $(cut -d' ' -f1-3 /proc/loadavg); blocks of $EVERY layouts"
nblocks=$(( (${#PRED[@]} + EVERY - 1) / EVERY ))
# Runs: calibration set, block 0, calibration set, block 1, ..., calibration set.
for ((k = 0; k <= nblocks; k++)); do
  dir="$OUT/block$k"
  mkdir -p "$dir"
  block=("${PRED[@]:k*EVERY:EVERY}")
  echo "-- calibration set $k${block[*]:+, then ${block[*]}}"
  for c in $CALIB_SET; do run "$c" "$dir"; done
  for n in $COMMBENCH; do bench_comm "$n" "$dir"; done
  for name in "${block[@]}"; do run "$name" "$dir"; done
done
[ "${RUNS_ONLY:-0}" = 1 ] && exit 0

# Block k is predicted from the calibration sets measured just before and just after it.
: >"$OUT/rows.tsv"
for ((k = 0; k < nblocks; k++)); do
  dir="$OUT/block$k"
  cal=()
  for d in "$dir" "$OUT/block$((k + 1))"; do
    for c in $CALIB_SET; do [ -f "$d/$c.run.json" ] && cal+=("$d/$c.db"); done
    for n in $COMMBENCH; do [ -f "$d/cb$n.db" ] && cal+=("$d/cb$n.db"); done
  done
  if "$ORRERY_CAL" calibrate "${cal[@]}" --out "$dir/profile.yaml" >"$dir/calibrate.txt" 2>&1; then
    echo "-- block $k: $(grep -E "^# sharing: 2 ranks" "$dir/profile.yaml" | head -1 | cut -c3-)"
    for c in $CALIB_SET; do predict "$c" "$dir" calib "$k"; done
    for name in "${PRED[@]:k*EVERY:EVERY}"; do predict "$name" "$dir" predict "$k"; done
  else
    echo "  block $k: no calibration ($(tail -1 "$dir/calibrate.txt"))"
  fi
done

python3 - "$OUT/rows.tsv" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
print(f"\n{'layout':<16} {'role':<12} {'block':>5} {'load':>6} {'measured ms':>12} {'predicted ms':>13} {'error':>8}")
for n, role, blk, load, m, p, e in rows:
    print(f"{n:<16} {'calibration' if role == 'calib' else 'prediction':<12} {blk:>5} {load:>6} {m:>12} {p:>13} {e:>7}%")
pred = [abs(float(r[6])) for r in rows if r[1] == "predict"]
if pred:
    print(f"\npredicted layouts: {len(pred)}, mean absolute error {sum(pred) / len(pred):.1f} %, "
          f"max {max(pred):.1f} %, within 10 %: {sum(e <= 10 for e in pred)}/{len(pred)}")
PY
echo "load at end $(cut -d' ' -f1-3 /proc/loadavg); files in $OUT (span level: $ORRERY report $OUT/block0/dp4.db --compare $OUT/block0/dp4.sim.db)"
