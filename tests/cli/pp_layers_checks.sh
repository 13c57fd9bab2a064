#!/usr/bin/env bash
# parallel.pp_layers (layers per pipeline stage) from the command line:
#  - `orrery sim` of a 4-layer model on pp 2 cut 1 + 3 prints each stage's layers and compute, and
#    its --json `stages` carry the block FLOPs: the 3-block stage exactly 3 times the 1-block
#    stage's; the memory per stage names each stage's layers;
#  - bad input exits 2 naming the key and the numbers, from sim and from run, before any rank
#    starts: the wrong number of entries, the wrong sum, a zero entry, a non-integer, the
#    interleaved schedule; and the other refusals of issue 16 item 5 that exist (an unknown
#    recompute mode, sequence parallelism without tp) on `orrery run`;
#  - `orrery run` trains pp 2 cut 1 + 3 with checkpoints, and resuming its checkpoint with the
#    stages cut 2 + 2 is refused naming parallel.pp_layers (with 1 + 3 it resumes); a manifest
#    without the key (older) reads as the even split.
# Usage: pp_layers_checks.sh ORRERY SOURCE_DIR
set -u
ORRERY=$1
SRC=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
EXPECT_DIR="$TMP"
# shellcheck source=expect.sh
source "$(dirname "$0")/expect.sh"

cat > "$TMP/four.yaml" <<'EOF'
name: four-layers
model: {layers: 4, d_model: 32, heads: 2, vocab: 64, seq: 16}
training: {steps: 4, global_batch: 8, micro_batch: 2, seed: 7, warmup_steps: 0}
parallel: {dp: 1, tp: 1, pp: 2, bucket_mb: 0.01, schedule: 1f1b}
runtime: {threads: 1}
EOF


# The report: each stage's layers and compute, the memory per stage with its layers.
expect 0 "  stage 0: 1 layer, " sim four.yaml --set parallel.pp_layers=1,3
grep -qF "  stage 1: 3 layers, " "$TMP/out" || fail "sim report lacks 'stage 1: 3 layers'"
grep -qF "compute per stage (one rank, one step; slowest / fastest" "$TMP/out" || fail "no compute per stage"
grep -qF "  stage 1 (3 layers): " "$TMP/out" || fail "memory line lacks the stage's layers"
(cd "$TMP" && "$ORRERY" sim four.yaml --set 'parallel.pp_layers=[1, 3]' --json) > "$TMP/sim.json" 2>&1 \
  || { fail "sim --json"; cat "$TMP/sim.json"; }
if python3 - "$TMP/sim.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
st = j["stages"]
assert [s["layers"] for s in st] == [1, 3], st
assert st[1]["block_flops"] == 3 * st[0]["block_flops"], st
assert st[0]["block_flops"] > 0 and st[1]["compute_ns"] > st[0]["compute_ns"], st
assert [m["layers"] for m in j["memory"]] == [1, 3], j["memory"]
print("stage block FLOPs", st[0]["block_flops"], st[1]["block_flops"])
EOF
then echo "ok: sim --json stages: 3-block stage = 3 x the 1-block stage's block FLOPs"; else fail "sim --json stages"; fi

# Bad input: exit 2 naming the key, from sim and from run.
for cmd in sim run; do
  extra=()
  [ "$cmd" = run ] && extra=(--nproc 2 --no-profile)
  expect 2 "key 'parallel.pp_layers': [1, 1, 2]: 3 entries, but dp=1 tp=1 pp=2 has 2 pipeline stages" \
    $cmd four.yaml "${extra[@]}" --set parallel.pp_layers=1,1,2
  expect 2 "key 'parallel.pp_layers': [1, 2]: the stages hold 3 layers in all, but model.layers is 4" \
    $cmd four.yaml "${extra[@]}" --set parallel.pp_layers=1,2
  expect 2 "key 'parallel.pp_layers': [0, 4]: stage 0 has 0 layers; every stage needs at least 1" \
    $cmd four.yaml "${extra[@]}" --set parallel.pp_layers=0,4
  expect 2 "key 'parallel.pp_layers': expected a list of integers" \
    $cmd four.yaml "${extra[@]}" --set parallel.pp_layers=1,three
  expect 2 "key 'parallel.pp_layers': [2, 2]: the interleaved schedule cuts the layers" \
    $cmd four.yaml "${extra[@]}" --set parallel.pp_layers=2,2 --set parallel.schedule=interleaved
done

# Issue 16 item 5's other refusals on `orrery run`, before any rank starts (no step printed).
expect 2 "key 'training.recompute': expected none, selective or full, got 'often'" \
  run four.yaml --nproc 2 --no-profile --set training.recompute=often
if grep -q "^step " "$TMP/out"; then fail "the refused recompute run printed a step"; fi
expect 2 "key 'parallel.sequence_parallel': dp=1 tp=1 pp=2: sequence parallelism shards" \
  run four.yaml --nproc 2 --no-profile --set parallel.sequence_parallel=true
if grep -q "^step " "$TMP/out"; then fail "the refused sequence-parallel run printed a step"; fi

# A real run cut 1 + 3, checkpointed; resumed with another cut: refused; with the same: resumes.
expect 0 "" run four.yaml --nproc 2 --no-profile --set parallel.pp_layers=1,3 \
  --set checkpoint.every=2 --set checkpoint.dir=ckpt --set training.steps=2
grep -q '"pp_layers": \[' "$TMP/ckpt/step-2/manifest.json" 2>/dev/null \
  && python3 -c "import json,sys; l=json.load(open(sys.argv[1]))['layout']; assert l['pp_layers']==[1,3], l" \
    "$TMP/ckpt/step-2/manifest.json" \
  && echo "ok: the manifest records pp_layers [1, 3]" || fail "manifest lacks pp_layers [1, 3]"
expect 2 "key 'parallel.pp_layers': the checkpoint was written with pp_layers=1,3 (layers per pipeline stage), the scenario has 2,2" \
  run four.yaml --nproc 2 --no-profile --resume ckpt
expect 2 "key 'parallel.pp_layers': the checkpoint was written with pp_layers=1,3 (layers per pipeline stage), the scenario has 3,1" \
  run four.yaml --nproc 2 --no-profile --resume ckpt --set parallel.pp_layers=3,1
expect 0 "resuming from ckpt/step-2" run four.yaml --nproc 2 --no-profile --resume ckpt \
  --set parallel.pp_layers=1,3 --set checkpoint.every=0
# A manifest from before pp_layers was recorded (the key removed) is the even split: it resumes as
# pp_layers=2,2 and is refused as 1,3.
expect 0 "" run four.yaml --nproc 2 --no-profile --set checkpoint.every=2 --set checkpoint.dir=even \
  --set training.steps=2
python3 - "$TMP/even/step-2/manifest.json" <<'EOF' || fail "could not strip pp_layers from the manifest"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["layout"].pop("pp_layers") == [2, 2], m["layout"]
open(sys.argv[1], "w").write(json.dumps(m, indent=1) + "\n")
EOF
expect 0 "resuming from even/step-2" run four.yaml --nproc 2 --no-profile --resume even \
  --set parallel.pp_layers=2,2 --set checkpoint.every=0
expect 2 "key 'parallel.pp_layers': the checkpoint was written with pp_layers=2,2" \
  run four.yaml --nproc 2 --no-profile --resume even --set parallel.pp_layers=1,3

if [ $fails -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all checks passed"
