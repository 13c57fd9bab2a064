#!/usr/bin/env bash
# `orrery run` end to end (CTest runtime_mpi_orrery_run, label mpi): a profiled 2-rank run through
# the mpirun re-launch with --json, a run without profiling, and every bad input exiting 2 with a
# message naming the key, before any MPI work and without hanging.
# Usage: cli_run_checks.sh ORRERY_BINARY SOURCE_DIR WORK_DIR
set -uo pipefail
ORRERY=$1
SRC=$2
WORK=$3
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

cat > tiny.yaml <<'EOF'
name: tiny
model: {layers: 2, d_model: 32, heads: 2, vocab: 64, seq: 16}
training: {steps: 3, global_batch: 8, micro_batch: 2, seed: 7, warmup_steps: 1}
parallel: {dp: 2, bucket_mb: 0.01}
runtime: {threads: 1}
EOF

# 1. A profiled 2-rank run: mpirun re-launch, per-rank traces merged, one JSON object.
if ! timeout 120 "$ORRERY" run tiny.yaml --nproc 2 --out run.db --json > run.json 2> run.err; then
  fail "2-rank run exited non-zero"; cat run.err
fi
python3 - <<'EOF' || fail "2-rank run JSON"
import json, math, os
j = json.loads(open("run.json").read().strip().splitlines()[-1])
assert j["ranks"] == 2 and j["dp"] == 2 and j["steps"] == 3, j
assert math.isfinite(j["final_loss"]) and 0 < j["final_loss"] < 10, j
assert j["median_step_ms"] > 0 and j["tokens_per_s"] > 0, j
assert j["trace"] == "run.db" and os.path.exists("run.db"), j
assert j["comm_comp_ratio"] is not None and 0 <= j["overlap_pct"] <= 100, j
assert not [f for f in os.listdir(".") if ".rank" in f], os.listdir(".")
EOF
grep -q "step 3/3" run.err || fail "no progress lines on stderr"
if "$ORRERY" report run.db --help > /dev/null 2>&1; then
  "$ORRERY" report run.db > report.txt 2>&1 || fail "orrery report on the merged trace"
fi

# 2. Without profiling: no trace, the figures still there.
timeout 120 "$ORRERY" run tiny.yaml --set parallel.dp=1 --set training.global_batch=2 \
  --nproc 1 --no-profile --json --out noprof.db > noprof.json 2> noprof.err || fail "--no-profile run"
python3 -c "
import json, os
j = json.loads(open('noprof.json').read().strip().splitlines()[-1])
assert j['trace'] is None and j['ranks'] == 1 and not os.path.exists('noprof.db'), j
" || fail "--no-profile JSON"

# 2b. scenarios/moe-tiny.yaml (dp2 ep2, 8 experts in blocks 0 and 2, top 2), 2 steps: the aux
#     loss on the progress line; orrery report's MoE figures: the four all-to-alls with busbw =
#     algbw x (2-1)/2, and per block the assignments per expert summing to steps x ranks x
#     micro-batch tokens x top_k = 2 x 2 x (8 x 128) x 2 = 8192.
if ! timeout 300 "$ORRERY" run "$SRC/scenarios/moe-tiny.yaml" --set training.steps=2 --out moe.db \
    > moe.out 2> moe.err; then
  fail "moe-tiny run exited non-zero"; tail -20 moe.err
fi
grep -q "aux 0\.0" moe.err || fail "moe-tiny: no aux loss on the progress line"
"$ORRERY" report moe.db --json > moe_report.json 2> moe_report.err || fail "moe-tiny report"
python3 - <<'EOF' || fail "moe-tiny report JSON"
import json
m = json.load(open("moe_report.json"))["moe"]
names = sorted(a["name"] for a in m["all_to_alls"])
assert names == ["moe.combine", "moe.combine.bwd", "moe.dispatch", "moe.dispatch.bwd"], names
for a in m["all_to_alls"]:
    assert a["calls"] == 2 * 2 * 2 and a["group_size"] == 2, a  # steps x ranks x MoE blocks
    assert abs(a["busbw_gbps"] - a["algbw_gbps"] / 2) < 1e-9, a
assert 0 < m["exposed_all_to_all_ns"] <= m["all_to_all_ns"], m
assert [b["layer"] for b in m["blocks"]] == [0, 2], m["blocks"]
for b in m["blocks"]:
    assert len(b["tokens_per_expert"]) == 8 and sum(b["tokens_per_expert"]) == 8192, b
    assert b["imbalance"] >= 1 and 0 <= b["dropped_fraction"] < 1, b
EOF

# 3. Bad input: exit 2, a message naming the key, nothing left behind.
expect_input_error() {  # NAME PATTERN COMMAND...
  local name=$1 pattern=$2
  shift 2
  timeout 60 "$@" > "$name.out" 2> "$name.err"
  local rc=$?
  [ $rc -eq 2 ] || fail "$name: exit $rc, expected 2"
  grep -q -- "$pattern" "$name.err" || { fail "$name: message lacks '$pattern'"; cat "$name.err"; }
}
printf 'model: {layers: 2, d_model: 32, heads: 2, vocab: 64, seq: 16}\ntraining: {stpes: 3}\n' > typo.yaml
expect_input_error unknown_key "did you mean 'training.steps'" "$ORRERY" run typo.yaml
printf 'model:\n  layers: four\n' > type.yaml
expect_input_error wrong_type "type.yaml:2: key 'model.layers'" "$ORRERY" run type.yaml
expect_input_error nproc_mismatch "parallel.dp" "$ORRERY" run tiny.yaml --nproc 3
expect_input_error batch "training.global_batch" "$ORRERY" run tiny.yaml --set training.global_batch=6
expect_input_error data_file "data.path" "$ORRERY" run tiny.yaml \
  --set data.source=text --set data.path=missing.txt --set model.vocab=256
expect_input_error tp "parallel.tp" "$ORRERY" run tiny.yaml --set parallel.tp=3 --set parallel.dp=1
expect_input_error schedule "parallel.schedule" "$ORRERY" run tiny.yaml --set parallel.pp=2 \
  --set parallel.dp=1 --set parallel.schedule=interleaved
expect_input_error no_mpirun "mpirun not found" env PATH=/nonexistent "$ORRERY" run tiny.yaml
# Mixture of experts (issue 19): what the scenario refuses and what the CPU runtime does not take.
MOE_SCN="$SRC/scenarios/moe-tiny.yaml"
expect_input_error moe_ep "key 'parallel.ep'" "$ORRERY" run "$MOE_SCN" --set parallel.ep=3
expect_input_error moe_top_k "key 'model.moe.top_k'" "$ORRERY" run "$MOE_SCN" --set model.moe.top_k=9
expect_input_error moe_capacity "key 'model.moe.capacity_factor'" "$ORRERY" run "$MOE_SCN" \
  --set model.moe.capacity_factor=-1
expect_input_error moe_compression "key 'parallel.grad_compression'" "$ORRERY" run "$MOE_SCN" \
  --set parallel.grad_compression=int8 --set parallel.ep=1 --set parallel.zero=1
# Started under mpirun by hand with the wrong number of ranks: the ranks exit 2 before MPI_Init
# (mpirun stops the job at the first one and passes its exit code on), no hang.
expect_input_error launcher_size "launcher started 3 ranks" \
  mpirun -n 3 --oversubscribe --bind-to none "$ORRERY" run tiny.yaml
ls ./*.rank*.db > /dev/null 2>&1 && fail "per-rank files left behind"

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all orrery run checks passed"
