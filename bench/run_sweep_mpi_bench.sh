#!/usr/bin/env bash
# Speed of a distributed `orrery sweep` here: the Llama 3 405B layout search over 2,048-16,384 H100s
# (flow network model, 16 layouts simulated per size) in one process and under `mpirun -n 2`,
# alternated REPS times; prints each wall time, the medians and the speed-up. Figures, not a test:
# the machine's 2 cores are shared with whatever else runs.
#   bench/run_sweep_mpi_bench.sh [BUILD_DIR] [REPS]     (from the repo root; default build, 5)
set -eu
BUILD=${1:-build}
REPS=${2:-5}
ORRERY=$BUILD/bin/orrery
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ARGS=(sweep scenarios/llama/llama3-405b.yaml --cluster scenarios/clusters/h100-16384.yaml
      --gpus 2048,4096,8192,16384 --search --top 16 --model flow --quiet)
one=() two=()
t() { local s e; s=$(date +%s.%N); "$@" > /dev/null; e=$(date +%s.%N); echo "$e - $s" | bc; }
for i in $(seq "$REPS"); do
  one+=("$(t "$ORRERY" "${ARGS[@]}")")
  two+=("$(t mpirun -n 2 "$ORRERY" "${ARGS[@]}")")
  echo "rep $i: 1 rank ${one[-1]} s, 2 ranks ${two[-1]} s"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
m1=$(median "${one[@]}")
m2=$(median "${two[@]}")
echo "median: 1 rank $m1 s, 2 ranks $m2 s, speed-up $(echo "scale=2; $m1 / $m2" | bc)"
