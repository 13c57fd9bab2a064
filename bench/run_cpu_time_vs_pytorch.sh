#!/usr/bin/env bash
# Single-process step cost of Orrery versus the PyTorch baseline, in CPU time per step, so that the
# figure holds on a machine shared with other work (wall-clock medians need a quiet machine: see
# run_ddp_vs_pytorch.sh). Each side runs twice, with S1 and S2 steps (+ the same warm-up); the
# difference of the processes' user+system CPU time divided by S2 - S1 is the cost of one step,
# start-up (Python import, model creation) cancelled out. One compute thread on both sides.
# Usage: bench/run_cpu_time_vs_pytorch.sh [BUILD_DIR]   Environment: S1 (2), S2 (8), CONFIGS.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ORRERY=$BUILD/bin/orrery
REF=${PYTORCH_REF:-../shared/reference/pytorch_gpt_ddp_cpu.py}
[ -f "$REF" ] || REF=/work/shared/reference/pytorch_gpt_ddp_cpu.py
S1=${S1:-2}
S2=${S2:-8}
CONFIGS=${CONFIGS:-"gpt-tiny gpt-small-ish"}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

model_args() {
  case $1 in
    gpt-tiny) echo "4 256 4 8192 128 8" ;;
    gpt-small-ish) echo "6 384 6 8192 256 4" ;;
  esac
}
cpu_s() { /usr/bin/time -f "%U %S" "$@" 2>&1 >/dev/null | tail -1 | awk '{print $1 + $2}'; }

printf '%-14s %16s %16s %8s\n' config "pytorch CPU ms" "orrery CPU ms" ratio
for cfg in $CONFIGS; do
  read -r L C H V T MB <<< "$(model_args "$cfg")"
  o() { cpu_s "$ORRERY" run "scenarios/$cfg.yaml" --nproc 1 --set parallel.dp=1 \
          --set training.global_batch="$MB" --set runtime.threads=1 --set training.steps=$(( $1 + 1 )) \
          --no-profile --json; }
  p() { cpu_s /usr/bin/python3 "$REF" --layers "$L" --d-model "$C" --heads "$H" --vocab "$V" \
          --seq "$T" --micro-batch "$MB" --steps "$1" --warmup 1 --threads 1 --mode single; }
  o1=$(o "$S1"); o2=$(o "$S2"); p1=$(p "$S1"); p2=$(p "$S2")
  awk -v cfg="$cfg" -v o1="$o1" -v o2="$o2" -v p1="$p1" -v p2="$p2" -v n=$(( S2 - S1 )) 'BEGIN {
    o = 1000 * (o2 - o1) / n; p = 1000 * (p2 - p1) / n;
    printf "%-14s %16.1f %16.1f %8.2f\n", cfg, p, o, o / p }'
done
echo "ratio = orrery / pytorch CPU time per training step (goal <= 0.8)"
