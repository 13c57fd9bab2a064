#!/usr/bin/env bash
# The one-model-description checks on real runs (CTest model_reference_spans, label mpi):
#  1. the reference layouts (dp2, tp2, pp2 1F1B, dp2 ZeRO 3, dp2·tp2·pp2; dp2 ZeRO 1 and 2, pp2
#     GPipe) record exactly the span
#     names, kinds and counts per rank of tests/data/reference_spans/<layout>.tsv, written by
#     `--record` from the tree before the runtime and simulator shared model/ (commit 0f81bc0);
#     the three recomputation layouts (tp2 full, pp2 selective, dp2 ZeRO 3 full) were recorded when
#     training.recompute was added, the two sequence-parallel ones (tp2, dp2·tp2·pp2 with full
#     recomputation) when parallel.sequence_parallel was; their recomputation and sequence-parallel
#     spans are also counted in closed form (3 below); pp2-uneven (parallel.pp_layers=1,3: stage 0
#     one block, stage 1 three) was recorded when parallel.pp_layers was added, by this script's
#     --record with that change (ONLY=pp2-uneven), and its blocks per rank are also counted in
#     closed form (4 below);
#  2. the simulator's ops for each layout (orrery sim --all-ranks) equal the real run's spans, rank by
#     rank, each on a stream of the same name (one stream naming, model/names.hpp): compute ops in order (with their FLOPs), each communicator's collectives in sequence order and
#     its transfers as a set (name, step, micro-batch, layer, bytes) (span_tool compare);
#  3. recomputation spans per rank: 2 steps x 4 micro-batches x the rank's blocks x pieces (full: 2
#     pieces under tp, else 1; selective: 1), and under tp 2 x 4 x 4 more tp all-reduces than tp2;
#     sequence parallelism (tp2, 4 blocks, 4 micro-batches, 2 steps): per block and micro-batch 4
#     all-gathers and 4 reduce-scatters in place of tp2's 4 all-reduces, plus the head's all-gather
#     and the embedding's, and one tp.grad_all_reduce per block and one for the head.
#  4. pp2-uneven: fwd.block and bwd.block spans per rank = 2 steps x 4 micro-batches x its blocks.
#  5. Llama-style blocks (llama-*: recorded when model.kv_heads ... bias were added): no tied-embedding
#     sum on the untied head's pipeline, the replicated-gradient all-reduce per block and head.
#  6. Fewer kv heads than tp ranks (llama-mqa-*, llama-kv2-tp4-sp: recorded when replicated kv heads
#     were added): one tp.kv_grad_all_reduce per block a step (ZeRO 0), per block and micro-batch
#     (ZeRO 2 and 3); none where the kv heads divide over tp.
#  7. MoE (moe-*: recorded when the runtime's MoE blocks were added, issue 19): the MoE spans and
#     all-to-alls per rank in closed form, and the simulator's MoE ops against them as for the others;
#     moe-dp4-ep2-zero3 (recorded when ZeRO 3 took MoE blocks) its gathers and scatters (7b below).
#  9. dp2-zero1-overlap, dp2-zero2-overlap, dp2-pp2-zero1-overlap (zero.overlap_grad_reduce and
#     zero.overlap_param_gather: recorded when they were added, issue 17 item 3): one
#     zero.reduce_scatter and one zero.all_gather per bucket (6 buckets at bucket_mb 0.01 on one
#     stage: final LayerNorm, each block, the embedding; on pp2 stage 0 its 2 blocks and the
#     embedding, stage 1 the final LayerNorm, 2 blocks and the tied wte's copy: 3 and 4), ZeRO 2's
#     scatters every micro-batch; compared with the
#     simulator as every layout.
#  8. dp2-pp4-zero2 (tied embeddings, 4 micro-batches: recorded when the simulator stopped
#     deadlocking on it): the tied wte's sum and the reduce-scatter after every backward, in the
#     runtime's order.
# Usage: reference_spans.sh ORRERY SPAN_TOOL SOURCE_DIR WORK_DIR [--record]
# (ONLY=<layout> in the environment runs, or records, that layout alone.)
set -uo pipefail
ORRERY=$1
SPAN_TOOL=$2
SRC=$3
WORK=$4
RECORD=${5:-}
GOLDEN=$SRC/tests/data/reference_spans
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

cat > ref.yaml <<'YAML'
name: reference-spans
model: {layers: 4, d_model: 32, heads: 2, vocab: 64, seq: 16}
training: {steps: 2, global_batch: 8, micro_batch: 2, seed: 7, warmup_steps: 1}
parallel: {dp: 2, tp: 1, pp: 1, bucket_mb: 0.01, schedule: 1f1b}
runtime: {threads: 1}
YAML

# Llama-style blocks on the same model: 4 heads over 2 key/value heads, SwiGLU of width 88,
# RMSNorm, RoPE, an untied LM head, no biases.
LLAMA="model.heads=4 model.kv_heads=2 model.ffn_hidden=88 model.activation=swiglu model.norm=rmsnorm"
LLAMA="$LLAMA model.position=rope model.tied_embeddings=false model.bias=false"
# Mixture of experts (issue 19, model/moe.hpp): 4 experts, top 2, in blocks 0 and 2, a capacity
# factor, expert parallelism 2. Recorded when the runtime's MoE blocks were added; compared with the
# simulator's MoE ops (2) like every layout; their all-to-alls are counted in closed form (7 below).
MOE="model.moe.experts=4 model.moe.top_k=2 model.moe.every=2 model.moe.capacity_factor=1.25 parallel.ep=2"
# Megatron's distributed optimizer (issue 17 item 3): ZeRO's reduce-scatter and all-gather per
# bucket, overlapped with the backward and with the next step's forward.
ZOVERLAP="zero.overlap_grad_reduce=true zero.overlap_param_gather=true"
# layout name, ranks, overrides
layouts=(
  "dp2 2 parallel.dp=2"
  "tp2 2 parallel.dp=1 parallel.tp=2"
  "pp2-1f1b 2 parallel.dp=1 parallel.pp=2"
  "dp2-zero3 2 parallel.dp=2 parallel.zero=3"
  "dp2-tp2-pp2 8 parallel.dp=2 parallel.tp=2 parallel.pp=2"
  "dp2-zero1 2 parallel.dp=2 parallel.zero=1"
  "dp2-zero2 2 parallel.dp=2 parallel.zero=2"
  "pp2-gpipe 2 parallel.dp=1 parallel.pp=2 parallel.schedule=gpipe"
  "tp2-recompute-full 2 parallel.dp=1 parallel.tp=2 training.recompute=full"
  "pp2-recompute-selective 2 parallel.dp=1 parallel.pp=2 training.recompute=selective"
  "dp2-zero3-recompute-full 2 parallel.dp=2 parallel.zero=3 training.recompute=full"
  "tp2-sp 2 parallel.dp=1 parallel.tp=2 parallel.sequence_parallel=true"
  "dp2-tp2-pp2-sp-full 8 parallel.dp=2 parallel.tp=2 parallel.pp=2 parallel.sequence_parallel=true training.recompute=full"
  "pp2-uneven 2 parallel.dp=1 parallel.pp=2 parallel.pp_layers=1,3"
  "llama-tp2-pp2 4 parallel.dp=1 parallel.tp=2 parallel.pp=2 $LLAMA"
  "llama-dp2-zero3 2 parallel.dp=2 parallel.zero=3 $LLAMA"
  "llama-tp2-sp-full 2 parallel.dp=1 parallel.tp=2 parallel.sequence_parallel=true training.recompute=full $LLAMA"
  "llama-mqa-tp2 2 parallel.dp=1 parallel.tp=2 $LLAMA model.kv_heads=1"
  "llama-kv2-tp4-sp 4 parallel.dp=1 parallel.tp=4 parallel.sequence_parallel=true $LLAMA"
  "llama-mqa-dp2-tp2-zero2 4 parallel.dp=2 parallel.tp=2 parallel.zero=2 $LLAMA model.kv_heads=1"
  "llama-mqa-dp2-tp2-zero3 4 parallel.dp=2 parallel.tp=2 parallel.zero=3 $LLAMA model.kv_heads=1"
  "moe-dp2-ep2 2 parallel.dp=2 $MOE"
  "moe-dp2-ep2-tp2 4 parallel.dp=2 parallel.tp=2 $MOE"
  "moe-dp4-ep2-zero3 4 parallel.dp=4 parallel.zero=3 $MOE"
  "dp2-pp4-zero2 8 parallel.dp=2 parallel.pp=4 parallel.zero=2 training.global_batch=16"
  "dp2-zero1-overlap 2 parallel.dp=2 parallel.zero=1 $ZOVERLAP"
  "dp2-zero2-overlap 2 parallel.dp=2 parallel.zero=2 $ZOVERLAP"
  "dp2-pp2-zero1-overlap 4 parallel.dp=2 parallel.pp=2 parallel.zero=1 $ZOVERLAP"
)
for entry in "${layouts[@]}"; do
  read -r name ranks rest <<< "$entry"
  if [ -n "${ONLY:-}" ] && [ "$ONLY" != "$name" ]; then continue; fi
  sets=()
  for kv in $rest; do sets+=(--set "$kv"); done
  if ! timeout 300 "$ORRERY" run ref.yaml --nproc "$ranks" "${sets[@]}" --out "$name.db" > "$name.run.out" 2>&1; then
    fail "$name: orrery run exited non-zero"; tail -20 "$name.run.out"; continue
  fi
  "$SPAN_TOOL" counts "$name.db" > "$name.tsv" || { fail "$name: span_tool counts"; continue; }
  if [ "$RECORD" = "--record" ]; then
    mkdir -p "$GOLDEN" && cp "$name.tsv" "$GOLDEN/$name.tsv"
    echo "recorded $GOLDEN/$name.tsv ($(wc -l < "$name.tsv") lines)"
    continue
  fi
  if diff -u "$GOLDEN/$name.tsv" "$name.tsv" > "$name.diff"; then
    echo "ok: $name: $(awk -F'\t' '{n += $4} END {print n}' "$name.tsv") spans, names, kinds and counts per rank as recorded"
  else
    fail "$name: span counts differ from $GOLDEN/$name.tsv"; head -40 "$name.diff"
  fi
  if ! "$ORRERY" sim ref.yaml "${sets[@]}" --precision fp32 --steps 2 --all-ranks --out "$name.sim.db" \
      > "$name.sim.out" 2>&1; then
    fail "$name: orrery sim exited non-zero"; tail -20 "$name.sim.out"; continue
  fi
  if "$SPAN_TOOL" compare "$name.db" "$name.sim.db" > "$name.cmp" 2> "$name.cmp.err"; then
    echo "ok: $name: simulated ops equal the real run's: $(cat "$name.cmp")"
  else
    fail "$name: simulated ops differ from the real run's"; cat "$name.cmp" "$name.cmp.err"
  fi
done

# 3. Recomputation spans in closed form (span_tool counts: rank, name, kind, count).
count_of() {  # FILE RANK NAME -> the count (0 when absent)
  awk -F'\t' -v r="$2" -v n="$3" '$1 == r && $3 == n {c += $4} END {print c + 0}' "$1"
}
check_count() {  # LABEL GOT WANT
  if [ "$2" -eq "$3" ]; then echo "ok: $1 = $2"; else fail "$1 = $2, expected $3"; fi
}
if [ "$RECORD" != "--record" ] && [ -f tp2-recompute-full.tsv ] && [ -f tp2.tsv ]; then
  for r in 0 1; do
    check_count "tp2 full rank $r recompute.block" "$(count_of tp2-recompute-full.tsv $r recompute.block)" $((2 * 4 * 4 * 2))
    check_count "tp2 full rank $r extra tp.all_reduce" \
      $(( $(count_of tp2-recompute-full.tsv $r tp.all_reduce) - $(count_of tp2.tsv $r tp.all_reduce) )) $((2 * 4 * 4))
  done
fi
if [ "$RECORD" != "--record" ] && [ -f pp2-recompute-selective.tsv ]; then
  for r in 0 1; do
    check_count "pp2 selective rank $r recompute.attention" "$(count_of pp2-recompute-selective.tsv $r recompute.attention)" $((2 * 4 * 2))
  done
fi
if [ "$RECORD" != "--record" ] && [ -f dp2-zero3-recompute-full.tsv ]; then
  for r in 0 1; do
    check_count "dp2 zero3 full rank $r recompute.block" "$(count_of dp2-zero3-recompute-full.tsv $r recompute.block)" $((2 * 2 * 4))
  done
fi

if [ "$RECORD" != "--record" ] && [ -f tp2-sp.tsv ]; then
  for r in 0 1; do
    check_count "tp2 sp rank $r tp.all_reduce" "$(count_of tp2-sp.tsv $r tp.all_reduce)" 0
    check_count "tp2 sp rank $r tp.reduce_scatter" "$(count_of tp2-sp.tsv $r tp.reduce_scatter)" $((2 * 4 * 4 * 4))
    check_count "tp2 sp rank $r tp.all_gather" "$(count_of tp2-sp.tsv $r tp.all_gather)" $((2 * 4 * (4 * 4 + 2)))
    check_count "tp2 sp rank $r tp.grad_all_reduce" "$(count_of tp2-sp.tsv $r tp.grad_all_reduce)" $((2 * 4 * (4 + 1)))
    check_count "tp2 sp rank $r fwd.block" "$(count_of tp2-sp.tsv $r fwd.block)" $((2 * 4 * 4 * 5))
  done
fi
if [ "$RECORD" != "--record" ] && [ -f pp2-uneven.tsv ]; then
  for rb in "0 1" "1 3"; do
    read -r r blocks <<< "$rb"
    for op in fwd.block bwd.block; do
      check_count "pp2-uneven rank $r $op" "$(count_of pp2-uneven.tsv $r $op)" $((2 * 4 * blocks))
    done
  done
fi

# 5. Llama-style blocks: the untied head's stage sums no embedding with stage 0 (GPT's pp2 does),
#    and sequence parallelism's replicated-gradient all-reduce still runs once per block and head.
if [ "$RECORD" != "--record" ] && [ -f llama-tp2-pp2.tsv ] && [ -f llama-tp2-sp-full.tsv ]; then
  for r in 0 1 2 3; do
    check_count "llama tp2 pp2 rank $r pp.embed_all_reduce" "$(count_of llama-tp2-pp2.tsv $r pp.embed_all_reduce)" 0
  done
  if [ -f pp2-1f1b.tsv ] && [ "$(count_of pp2-1f1b.tsv 0 pp.embed_all_reduce)" -eq 0 ]; then
    fail "pp2-1f1b (tied) records no pp.embed_all_reduce: the check above proves nothing"
  fi
  for r in 0 1; do
    check_count "llama tp2 sp rank $r tp.grad_all_reduce" "$(count_of llama-tp2-sp-full.tsv $r tp.grad_all_reduce)" $((2 * 4 * (4 + 1)))
  done
fi

# 6. Replicated kv heads: 2 steps x 4 blocks (ZeRO 0; 4 micro-batches), x 2 micro-batches more
#    under ZeRO 2 and 3 (dp 2); none on the layouts whose kv heads divide over tp.
if [ "$RECORD" != "--record" ]; then
  for lw in "llama-mqa-tp2 2 8" "llama-kv2-tp4-sp 4 8" "llama-mqa-dp2-tp2-zero2 4 16" \
            "llama-mqa-dp2-tp2-zero3 4 16" "llama-tp2-pp2 4 0" "llama-tp2-sp-full 2 0"; do
    read -r name ranks want <<< "$lw"
    [ -f "$name.tsv" ] || continue
    for ((r = 0; r < ranks; r++)); do
      check_count "$name rank $r tp.kv_grad_all_reduce" "$(count_of "$name.tsv" $r tp.kv_grad_all_reduce)" "$want"
    done
  done
fi

# 7. MoE: per rank 2 steps x 2 micro-batches x 2 MoE blocks of each all-to-all, router and
#    experts span; the tp gate-gradient sum per MoE block and micro-batch under tp only; no
#    edp.all_reduce with dp = ep (each edp group is one rank).
if [ "$RECORD" != "--record" ]; then
  for lw in "moe-dp2-ep2 2 0" "moe-dp2-ep2-tp2 4 8"; do
    read -r name ranks gate <<< "$lw"
    [ -f "$name.tsv" ] || continue
    for ((r = 0; r < ranks; r++)); do
      for op in moe.router moe.dispatch moe.experts moe.combine moe.gated_sum moe.gated_sum.bwd \
                moe.combine.bwd moe.experts.bwd moe.dispatch.bwd moe.router.bwd; do
        check_count "$name rank $r $op" "$(count_of "$name.tsv" $r $op)" $((2 * 2 * 2))
      done
      check_count "$name rank $r tp.moe_gate_all_reduce" "$(count_of "$name.tsv" $r tp.moe_gate_all_reduce)" "$gate"
      check_count "$name rank $r edp.all_reduce" "$(count_of "$name.tsv" $r edp.all_reduce)" 0
    done
  done
fi

# 7b. MoE under ZeRO 3 (moe-dp4-ep2-zero3: recorded when ZeRO 3 took MoE blocks): per rank and step
#    (1 micro-batch) the embedding's and final LayerNorm's gathers, each block's twice (forward and
#    backward) and the 2 MoE blocks' experts twice over edp: 2 + 8 + 4 = 14 zero.fetch_layer; the
#    6 segments' reduce-scatters and the 2 experts' over edp: 8 zero.reduce_scatter; no
#    edp.all_reduce (the experts' gradients go by those reduce-scatters).
if [ "$RECORD" != "--record" ] && [ -f moe-dp4-ep2-zero3.tsv ]; then
  for r in 0 1 2 3; do
    check_count "moe-dp4-ep2-zero3 rank $r zero.fetch_layer" "$(count_of moe-dp4-ep2-zero3.tsv $r zero.fetch_layer)" $((2 * 14))
    check_count "moe-dp4-ep2-zero3 rank $r zero.reduce_scatter" "$(count_of moe-dp4-ep2-zero3.tsv $r zero.reduce_scatter)" $((2 * 8))
    check_count "moe-dp4-ep2-zero3 rank $r edp.all_reduce" "$(count_of moe-dp4-ep2-zero3.tsv $r edp.all_reduce)" 0
  done
fi

# 9. ZeRO per bucket: per rank 2 steps x buckets all-gathers, and as many reduce-scatters (ZeRO 1)
#    or x 2 micro-batches (ZeRO 2).
if [ "$RECORD" != "--record" ]; then
  for lw in "dp2-zero1-overlap 1 6 6" "dp2-zero2-overlap 2 6 6" "dp2-pp2-zero1-overlap 1 3 3 4 4"; do
    read -r name per_step rank_buckets <<< "$lw"
    [ -f "$name.tsv" ] || continue
    r=0
    for buckets in $rank_buckets; do
      check_count "$name rank $r zero.reduce_scatter" "$(count_of "$name.tsv" $r zero.reduce_scatter)" $((2 * buckets * per_step))
      check_count "$name rank $r zero.all_gather" "$(count_of "$name.tsv" $r zero.all_gather)" $((2 * buckets))
      r=$((r + 1))
    done
  done
fi

if [ "$failures" -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all reference span checks passed"
