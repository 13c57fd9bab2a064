#!/usr/bin/env bash
# Llama-style blocks from the command line (model.kv_heads, ffn_hidden, activation, norm, position,
# rope_theta, tied_embeddings, bias):
#  - scenarios/llama/ (Llama 2 7B and 70B, Llama 3 8B, 70B and 405B, the papers' configurations) simulate
#    and fit in 80 GB on their clusters; Llama 3 405B's stage 0 does not fit without recomputation;
#  - fewer kv heads than tp ranks simulate with the replicated heads' gradient all-reduce;
#  - bad input exits 2 naming the key: kv heads that do not divide the heads, or that tp neither
#    divides nor is a multiple of, an MLP width tp does not divide, an unknown activation, norm or position, RoPE with an
#    odd head size, a non-positive RoPE base;
#  - `orrery run scenarios/llama-tiny.yaml` trains on 2 ranks and resumes from its checkpoint; the
#    report's model FLOPs equal its spans' (the meta's model FLOPs count the Llama block).
# Usage: llama_checks.sh ORRERY SOURCE_DIR
set -u
ORRERY=$1
SRC=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
EXPECT_DIR="$SRC"
# shellcheck source=expect.sh
source "$(dirname "$0")/expect.sh"

expect 0 "fits" sim scenarios/llama/llama2-7b.yaml --cluster selene-a100 --gpus 64
expect 0 "fits" sim scenarios/llama/llama3-8b.yaml --cluster scenarios/clusters/h100-1024.yaml --gpus 64
expect 0 "fits" sim scenarios/llama/llama3-70b.yaml --cluster scenarios/clusters/h100-1024.yaml
# A memory check: one rank per stage (every rank, the default on 16,384 GPUs of this fabric since
# its rails span several leaves, takes about 30 s here).
expect 0 "fits" sim scenarios/llama/llama3-405b.yaml --cluster scenarios/clusters/h100-16384.yaml --representative
expect 2 "does not fit device memory" sim scenarios/llama/llama3-405b.yaml \
  --cluster scenarios/clusters/h100-16384.yaml --set training.recompute=none

T=scenarios/llama-tiny.yaml
expect 2 "key 'model.kv_heads'" sim $T --set model.kv_heads=3
expect 2 "must be divisible by model.kv_heads (3)" run $T --nproc 1 --set parallel.dp=1 --set model.kv_heads=3
expect 2 "the key/value heads (model.kv_heads 4) must be divisible by tp (6)" \
  sim $T --set parallel.dp=1 --set parallel.tp=6 --set model.heads=12 --set model.d_model=96 --set model.kv_heads=4
# Fewer kv heads than tp ranks: each head replicated (2 over 4 ranks), simulated and trained.
# llama-tiny at tp 4: 2 micro-batches x 4 blocks x 4 tp all-reduces, and one kv-gradient sum per
# block: 36 calls on the tp communicator (32 with 4 kv heads, one per rank), 4 of them by name.
expect 0 "fits" sim $T --set parallel.dp=1 --set parallel.tp=4 --out "$TMP/kv.db"
expect 0 "all_reduce      tp[dp=0,pp=0]       4       36" report "$TMP/kv.db"
expect 0 "" export "$TMP/kv.db" --format chrome --out "$TMP/kv.json"
got=$(grep -o '"tp.kv_grad_all_reduce"' "$TMP/kv.json" 2>/dev/null | wc -l)
if [ "$got" -eq 4 ]; then echo "ok: 4 tp.kv_grad_all_reduce ops"; else fail "$got tp.kv_grad_all_reduce ops, want 4"; fi
expect 0 "fits" sim $T --set parallel.dp=1 --set parallel.tp=4 \
  --set model.kv_heads=4 --out "$TMP/kv4.db"
expect 0 "all_reduce      tp[dp=0,pp=0]       4       32" report "$TMP/kv4.db"
expect 0 "fits" sim scenarios/llama/llama2-70b.yaml --cluster selene-a100 --gpus 1024
expect 0 "fits" sim scenarios/llama/llama2-70b.yaml --cluster selene-a100 --gpus 1024 \
  --set parallel.tp=16 --set parallel.dp=16
expect 2 "the MLP width model.ffn_hidden (350) must be divisible by tp" \
  sim $T --set parallel.dp=1 --set parallel.tp=4 --set model.kv_heads=4 --set model.ffn_hidden=350
expect 2 "key 'model.activation': expected gelu or swiglu, got 'relu'" sim $T --set model.activation=relu
expect 2 "key 'model.norm': expected layernorm or rmsnorm, got 'batchnorm'" sim $T --set model.norm=batchnorm
expect 2 "key 'model.position': expected learned or rope, got 'alibi'" sim $T --set model.position=alibi
expect 2 "the head size d_model / heads (33) must be even" sim $T --set model.d_model=132
expect 2 "key 'model.rope_theta': must be > 0" sim $T --set model.rope_theta=0

expect 0 "" run $T --nproc 2 --set training.steps=4 --set checkpoint.every=2 \
  --set checkpoint.dir="$TMP/ckpt" --out "$TMP/llama.db"
expect 0 "resuming from $TMP/ckpt/step-4 (step 4 of 6" run $T --nproc 2 --set training.steps=6 --resume "$TMP/ckpt" \
  --set checkpoint.dir="$TMP/ckpt" --out "$TMP/resumed.db"
if [ -f "$TMP/llama.db" ] && (cd "$SRC" && "$ORRERY" report "$TMP/llama.db" --json) > "$TMP/report.json" 2>&1; then
  # Span FLOPs (the runtime's per op) against the meta's model FLOPs (per step, from the scenario).
  if /usr/bin/python3 - "$TMP/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
def find(d, key):
    if isinstance(d, dict):
        for k, v in d.items():
            if k == key: return v
            got = find(v, key)
            if got is not None: return got
    elif isinstance(d, list):
        for v in d:
            got = find(v, key)
            if got is not None: return got
    return None
a, m = find(r, "achieved_flops"), find(r, "model_flops_per_s")
print(f"achieved {a} model {m}")
sys.exit(0 if a is not None and m is not None and abs(a - m) <= 1e-3 * max(abs(m), 1e-12) else 1)
PY
  then echo "ok: llama-tiny: the report's span FLOPs equal the model FLOPs"
  else fail "llama-tiny: span FLOPs and model FLOPs differ (or the report lacks them)"; head -c 600 "$TMP/report.json"
  fi
else
  fail "llama-tiny: no trace or report"
fi

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "all Llama checks passed"
