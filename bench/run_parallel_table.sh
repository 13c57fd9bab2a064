#!/usr/bin/env bash
# Every parallel strategy of the CPU runtime on gpt-tiny (and gpt-small-ish with CONFIGS) on 2 and 4
# ranks: median step time (slowest rank, after warm-up), comm/comp ratio and overlap % (orrery run
# --json), pipeline bubble % and the largest per-rank peak memory (orrery report --json on the
# run's trace). Prints one table and writes JSON lines to $OUT/parallel_table.jsonl.
#
# Usage: bench/run_parallel_table.sh [BUILD_DIR]     (default: build)
# Environment: STEPS (6), CONFIGS ("gpt-tiny"), OUT (bench/out), THREADS (compute threads per rank, 1),
# LAYOUTS (override the list: "name:dp:tp:pp:zero:schedule ...").
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ORRERY=$BUILD/bin/orrery
STEPS=${STEPS:-6}
CONFIGS=${CONFIGS:-gpt-tiny}
THREADS=${THREADS:-1}
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
RESULTS=$OUT/parallel_table.jsonl
: > "$RESULTS"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x "$ORRERY" ] || { echo "no $ORRERY: build first"; exit 1; }

# name:dp:tp:pp:zero:schedule; global batch 16 sequences, micro-batch 8 / dp (pipelines: 8 micro-batches
# of 16/(dp*8))
LAYOUTS=${LAYOUTS:-"dp2:2:1:1:0:gpipe dp2-zero1:2:1:1:1:gpipe dp2-zero2:2:1:1:2:gpipe tp2:1:2:1:0:gpipe \
pp2-gpipe:1:1:2:0:gpipe pp2-1f1b:1:1:2:0:1f1b dp4:4:1:1:0:gpipe dp4-zero1:4:1:1:1:gpipe tp4:1:4:1:0:gpipe \
pp4-1f1b:1:1:4:0:1f1b pp4-gpipe:1:1:4:0:gpipe dp2-tp2:2:2:1:0:gpipe tp2-pp2:1:2:2:0:1f1b dp2-pp2:2:1:2:0:1f1b"}

printf "%-14s %-12s %5s %12s %10s %9s %9s %14s\n" config layout ranks "step (ms)" comm/comp "overlap%" "bubble%" "peak mem/rank"
for cfg in $CONFIGS; do
  for L in $LAYOUTS; do
    IFS=: read -r name dp tp pp zero sched <<<"$L"
    n=$((dp * tp * pp))
    gb=16
    if [ "$pp" -gt 1 ]; then micro=$((gb / (dp * 8))); [ "$micro" -ge 1 ] || micro=1; else micro=$((gb / dp)); fi
    trace=$OUT/par_${cfg}_${name}.db
    rm -f "$trace"
    json=$("$ORRERY" run "scenarios/$cfg.yaml" --nproc "$n" --json --out "$trace" \
      --set parallel.dp="$dp" --set parallel.tp="$tp" --set parallel.pp="$pp" --set parallel.zero="$zero" \
      --set parallel.schedule="$sched" --set training.global_batch=$gb --set training.micro_batch="$micro" \
      --set training.steps="$STEPS" --set runtime.threads="$THREADS" 2>/dev/null | tail -1) || { echo "$name: run failed"; continue; }
    rep=$("$ORRERY" report "$trace" --json 2>/dev/null)
    python3 - "$cfg" "$name" "$n" "$json" "$rep" "$RESULTS" <<'PY'
import json, sys
cfg, name, n, run, rep, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]), json.loads(sys.argv[5]), sys.argv[6]
s = rep["summary"]
peak = max((r.get("peak_memory_total_bytes", 0) for r in rep["ranks"]), default=0)
row = dict(config=cfg, layout=name, ranks=n, step_ms=run["median_step_ms"], comm_comp=run["comm_comp_ratio"],
           overlap_pct=run["overlap_pct"], bubble_pct=s["bubble_pct"] if s["pipeline"] else None,
           peak_mem_mib=peak / 2**20, final_loss=run["final_loss"])
open(out, "a").write(json.dumps(row) + "\n")
f = lambda v, p: "-" if v is None else format(v, p)
print("%-14s %-12s %5d %12s %10s %9s %9s %11s MiB" % (cfg, name, n, f(row["step_ms"], ".1f"), f(row["comm_comp"], ".3f"),
      f(row["overlap_pct"], ".1f"), f(row["bubble_pct"], ".1f"), f(row["peak_mem_mib"], ".1f")))
PY
  done
done
echo "JSON lines: $RESULTS"
