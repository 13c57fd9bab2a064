#!/usr/bin/env bash
# Orrery's CPU runtime against the PyTorch baseline (shared/reference/pytorch_gpt_ddp_cpu.py) on the
# same machine, same model, micro-batch and threads: median step time (slowest rank per step, after
# warm-up) single-process and DDP on 2 ranks, for gpt-tiny and gpt-small-ish; and the profiler's
# overhead (orrery with profiling on vs --no-profile). Prints one table and writes JSON lines.
#
# Usage: bench/run_ddp_vs_pytorch.sh [BUILD_DIR]      (default: build)
# Environment: STEPS (10), WARMUP (2), THREADS_SINGLE (threads of the single process, default all
# cores), THREADS_DDP (threads per rank, default cores/2), CONFIGS ("gpt-tiny gpt-small-ish"),
# REPEATS (runs of each measurement, the median kept; default 1), OUT (bench/out), PYTORCH_REF.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ORRERY=$BUILD/bin/orrery
REF=${PYTORCH_REF:-../shared/reference/pytorch_gpt_ddp_cpu.py}
[ -f "$REF" ] || REF=/work/shared/reference/pytorch_gpt_ddp_cpu.py
PY=/usr/bin/python3
STEPS=${STEPS:-10}
WARMUP=${WARMUP:-2}
CORES=$(nproc)
THREADS_SINGLE=${THREADS_SINGLE:-$CORES}
THREADS_DDP=${THREADS_DDP:-$(( CORES / 2 > 0 ? CORES / 2 : 1 ))}
CONFIGS=${CONFIGS:-"gpt-tiny gpt-small-ish"}
REPEATS=${REPEATS:-1}
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
RESULTS=$OUT/ddp_vs_pytorch.jsonl
: > "$RESULTS"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

[ -x "$ORRERY" ] || { echo "no $ORRERY: build first (scripts/build)"; exit 1; }
HAVE_TORCH=1
$PY -c "import torch" 2>/dev/null || { HAVE_TORCH=0; echo "(no python3-torch: PyTorch columns empty)"; }

model_args() {  # CONFIG -> "layers d_model heads vocab seq micro"
  case $1 in
    gpt-tiny) echo "4 256 4 8192 128 8" ;;
    gpt-small-ish) echo "6 384 6 8192 256 4" ;;
    *) echo "unknown config $1" >&2; exit 1 ;;
  esac
}

median_of() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print ""; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# orrery: CONFIG RANKS THREADS PROFILE(0/1) -> median step ms (median over REPEATS runs)
orrery_ms() {
  local cfg=$1 ranks=$2 threads=$3 profile=$4
  read -r L C H V T MB <<< "$(model_args "$cfg")"
  local flags=(--set parallel.dp="$ranks" --set training.global_batch=$((MB * ranks))
               --set training.micro_batch="$MB" --set runtime.threads="$threads"
               --set training.steps=$((STEPS + WARMUP)) --set training.warmup_steps="$WARMUP" --json)
  [ "$profile" = 1 ] || flags+=(--no-profile)
  for _ in $(seq "$REPEATS"); do
    local line
    line=$("$ORRERY" run "scenarios/$cfg.yaml" --nproc "$ranks" --out "$OUT/$cfg-$ranks-$profile.db" \
           "${flags[@]}" 2>/dev/null | tail -1)
    echo "{\"impl\":\"orrery\",\"config\":\"$cfg\",\"ranks\":$ranks,\"threads\":$threads,\"profile\":$profile,\"result\":$line}" >> "$RESULTS"
    echo "$line" | $PY -c "import json,sys; print(json.load(sys.stdin)['median_step_ms'])"
  done | median_of
  rm -f "$OUT/$cfg-$ranks-$profile.db"
}

# pytorch: CONFIG RANKS THREADS -> median step ms
torch_ms() {
  [ $HAVE_TORCH = 1 ] || { echo ""; return; }
  local cfg=$1 ranks=$2 threads=$3 mode=single
  read -r L C H V T MB <<< "$(model_args "$cfg")"
  [ "$ranks" -gt 1 ] && mode=ddp
  for _ in $(seq "$REPEATS"); do
    local line
    line=$($PY "$REF" --layers "$L" --d-model "$C" --heads "$H" --vocab "$V" --seq "$T" \
           --micro-batch "$MB" --steps "$STEPS" --warmup "$WARMUP" --threads "$threads" \
           --mode $mode --world "$ranks" 2>/dev/null | tail -1)
    echo "{\"impl\":\"pytorch\",\"config\":\"$cfg\",\"ranks\":$ranks,\"threads\":$threads,\"result\":$line}" >> "$RESULTS"
    echo "$line" | $PY -c "import json,sys; print(json.load(sys.stdin)['step_ms_median'])"
  done | median_of
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%.2f", a / b }'; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%+.1f %%", 100 * (a - b) / b }'; }

echo "machine: $CORES cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "steps $STEPS after $WARMUP warm-up, medians; threads: single $THREADS_SINGLE, DDP $THREADS_DDP per rank"
printf '%-14s %-10s %12s %12s %8s %14s %10s\n' config run "pytorch ms" "orrery ms" ratio "orrery prof ms" overhead
for cfg in $CONFIGS; do
  for ranks in 1 2; do
    threads=$THREADS_SINGLE
    [ "$ranks" -gt 1 ] && threads=$THREADS_DDP
    t=$(torch_ms "$cfg" "$ranks" "$threads")
    o=$(orrery_ms "$cfg" "$ranks" "$threads" 0)
    p=$(orrery_ms "$cfg" "$ranks" "$threads" 1)
    run=single
    [ "$ranks" -gt 1 ] && run="ddp x$ranks"
    printf '%-14s %-10s %12.1f %12.1f %8s %14.1f %10s\n' "$cfg" "$run" "${t:-0}" "$o" "$(ratio "$o" "$t")" "$p" "$(pct "$p" "$o")"
  done
done
echo "ratio = orrery / pytorch step time (goal <= 0.8); overhead = profiled vs --no-profile"
echo "raw results: $RESULTS"
