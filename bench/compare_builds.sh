#!/usr/bin/env bash
# Speed of one build against another, alternated (farm-bench: A B A B ..., ratios pair by pair):
# bench_model (gpt-tiny, one thread), bench_sim_step (GPT-3 175B on 1,024 GPUs, every rank) and
# bench_report (metrics over 2 M spans). For refactors that must not change speed: build the
# commit before into another tree, then
#   bench/compare_builds.sh BEFORE_SOURCE BEFORE_BUILD [AFTER_SOURCE] [AFTER_BUILD] [RUNS]
# e.g. git worktree add /work/base <rev>; build it; bench/compare_builds.sh /work/base /work/base/build
# Prints farm-bench's tables; ratios are A (after) / B (before). Reports figures, asserts nothing.
set -euo pipefail
BS=${1:?before source dir}
BB=${2:?before build dir}
AS=${3:-$(cd "$(dirname "$0")/.." && pwd)}
AB=${4:-$AS/build}
RUNS=${5:-5}
export OPENBLAS_NUM_THREADS=1  # both sides single-threaded BLAS, so they do not fight for cores
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/a" "$tmp/b"
bench() {
  echo "== $1"
  farm-bench -n "$RUNS" --timeout 1800 --vs "$3" -- $2
}
bench "bench_model gpt-tiny, 1 thread, 8 steps" \
  "$AB/bin/bench_model --config tiny --threads 1 --steps 8 --warmup 2" \
  "$BB/bin/bench_model --config tiny --threads 1 --steps 8 --warmup 2"
bench "bench_sim_step GPT-3 175B, 1,024 GPUs, all ranks" \
  "$AB/bin/bench_sim_step --gpus 1024 --all-ranks --source $AS" \
  "$BB/bin/bench_sim_step --gpus 1024 --all-ranks --source $BS"
bench "bench_report 2 M spans" \
  "$AB/bin/bench_report 2000000 8 48 $tmp/a" \
  "$BB/bin/bench_report 2000000 8 48 $tmp/b"
