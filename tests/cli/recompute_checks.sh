#!/usr/bin/env bash
# training.recompute and parallel.sequence_parallel from the command line:
#  - the layouts Megatron-LM trains GPT-3 175B, MT-NLG 530B and a 1T model with on A100-80GB
#    (scenarios/megatron/, Korthikanti et al. 2022 Table 3) simulate without --allow-oom with full
#    recomputation, on the GPU counts of the paper (--gpus), and are refused as not fitting without it;
#  - bad input exits 2 naming the key before anything runs: an unknown recompute mode, sequence
#    parallelism without tp or with tokens that tp does not divide, --gpus 0;
#  - `orrery run` with full recomputation trains and records its recompute.block spans.
# Usage: recompute_checks.sh ORRERY SOURCE_DIR
set -u
ORRERY=$1
SRC=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
EXPECT_DIR="$SRC"
# shellcheck source=expect.sh
source "$(dirname "$0")/expect.sh"

for entry in "gpt3-175b 64" "mt-nlg-530b 280" "gpt-1t 512"; do
  read -r model gpus <<< "$entry"
  expect 0 "step time" sim "scenarios/megatron/$model.yaml" --cluster selene-a100 --gpus "$gpus"
  expect 2 "does not fit device memory" sim "scenarios/megatron/$model.yaml" --cluster selene-a100 \
    --gpus "$gpus" --set training.recompute=none
done
expect 2 "key 'training.recompute': expected none, selective or full, got 'sometimes'" \
  sim scenarios/gpt-tiny.yaml --set training.recompute=sometimes
expect 2 "key 'training.recompute': expected none, selective or full, got 'sometimes'" \
  run scenarios/gpt-tiny.yaml --nproc 1 --set training.recompute=sometimes
expect 2 "key 'parallel.sequence_parallel'" sim scenarios/gpt-tiny.yaml --set parallel.sequence_parallel=true
expect 2 "sequence parallelism shards the tensor-parallel group's LayerNorm and dropout regions along the sequence and needs tp > 1" \
  run scenarios/gpt-tiny.yaml --nproc 2 --set parallel.dp=2 --set parallel.sequence_parallel=true
expect 2 "tokens of a micro-batch (training.micro_batch x model.seq) must be divisible by tp" \
  sim scenarios/gpt-tiny.yaml --set parallel.dp=1 --set parallel.tp=2 --set parallel.sequence_parallel=true \
  --set training.micro_batch=1 --set model.seq=15 --set training.global_batch=8
expect 2 "--gpus must be >= 1, got 0" sim scenarios/gpt-tiny.yaml --gpus 0
# A 64-GPU layout on the 4480 GPUs of Selene: orrery sim runs the scenario's own 64 GPUs of it (issue
# 17 item 4), as --gpus 64 does. With --fill dp would grow to 70, which the global batch of 64 does not
# divide; the error says that without --fill the scenario's own 64 are simulated.
expect 0 "64 of the 4480 GPUs of selene-a100 (the scenario's dp 1; --fill grows dp to fill the cluster)" \
  sim scenarios/megatron/gpt3-175b.yaml --cluster selene-a100
expect 2 "(the cluster selene-a100 has 4480 GPUs and --fill grows dp to fill them; without --fill orrery sim simulates the scenario's own 64)" \
  sim scenarios/megatron/gpt3-175b.yaml --cluster selene-a100 --fill
expect 2 "--gpus and --fill: give one of them" sim scenarios/megatron/gpt3-175b.yaml --cluster selene-a100 --fill --gpus 64

# Replicas contend on an oversubscribed fabric: orrery sim simulates every rank by default there
# (issue 17 item 3), --representative keeps one per stage; Selene itself is non-blocking.
sed 's/^  oversubscription: 1$/  oversubscription: 2/; s/^name: selene-a100$/name: selene-oversubscribed/' \
  "$SRC/scenarios/clusters/selene-a100.yaml" > "$TMP/oversub.yaml"
expect 0 "every rank simulated: replicas contend on the fabric of selene-oversubscribed" \
  sim scenarios/megatron/gpt3-175b.yaml --cluster "$TMP/oversub.yaml"
# Every rank through tp rank 0 of each group (the rails are copies: sim/README.md, "Rail symmetry");
# --no-rail-symmetry simulates each rank literally.
expect 0 "simulated 8 of 64 ranks (tp rank 0 of each group: its tp peers on the other rails run copies" \
  sim scenarios/megatron/gpt3-175b.yaml --cluster "$TMP/oversub.yaml"
expect 0 "simulated 64 of 64 ranks" sim scenarios/megatron/gpt3-175b.yaml --cluster "$TMP/oversub.yaml" \
  --no-rail-symmetry
expect 0 "simulated 8 of 64 ranks" sim scenarios/megatron/gpt3-175b.yaml --cluster "$TMP/oversub.yaml" --representative
expect 0 "simulated 8 of 64 ranks" sim scenarios/megatron/gpt3-175b.yaml --cluster selene-a100
expect 2 "--all-ranks and --representative: give one of them" \
  sim scenarios/megatron/gpt3-175b.yaml --cluster selene-a100 --all-ranks --representative

# parallel.vocab_parallel (Megatron's vocabulary-parallel head) is simulated only: orrery run refuses
# it naming the key; a vocabulary tp does not divide is bad input; the Megatron scenarios set it.
expect 2 "key 'parallel.vocab_parallel': orrery run keeps the embedding and LM head whole on every tp rank" \
  run scenarios/gpt-tiny.yaml --nproc 2 --set parallel.dp=1 --set parallel.tp=2 --set parallel.vocab_parallel=true
expect 2 "key 'parallel.vocab_parallel': dp=1 tp=8 pp=8: the vocabulary of 51201 (model.vocab) must be divisible by tp" \
  sim scenarios/megatron/gpt3-175b.yaml --cluster selene-a100 --set model.vocab=51201
expect 0 "step time" sim scenarios/megatron/gpt-1t-selective-sp.yaml --cluster selene-a100

expect 0 "" run scenarios/gpt-tiny.yaml --nproc 1 --set parallel.dp=1 --set training.steps=2 \
  --set training.recompute=full --out "$TMP/full.db"
if [ -f "$TMP/full.db" ] && (cd "$SRC" && "$ORRERY" report "$TMP/full.db") > "$TMP/report" 2>&1; then
  echo "ok: orrery report of the full-recomputation run"
else
  fail "orrery report of the full-recomputation run"; tail -n 20 "$TMP/report"
fi

if [ $fails -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all checks passed"
