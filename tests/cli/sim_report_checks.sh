#!/usr/bin/env bash
# One bubble definition from the command line: `orrery sim --out sim.db` and `orrery report sim.db`
# (no options) give the same step time and the same breakdown (profiler::account_step), for a
# pipeline with tp and for a pp = 1 layout; the report's default warm-up is the simulation's own
# (its first step of three), and --skip-steps still overrides it; the report's MFU is the
# simulator's for a trace of one rank per stage and one of every rank.
# Usage: sim_report_checks.sh ORRERY SOURCE_DIR
set -u
ORRERY=$1
SRC=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

for layout in "2 2 2" "2 2 1" "1 1 4"; do
  read -r dp tp pp <<< "$layout"
  name="dp$dp-tp$tp-pp$pp"
  if ! "$ORRERY" sim "$SRC/scenarios/gpt-tiny.yaml" --set parallel.dp=$dp --set parallel.tp=$tp \
      --set parallel.pp=$pp --set training.global_batch=8 --set training.micro_batch=1 \
      --steps 3 --all-ranks --json --out "$TMP/$name.db" > "$TMP/$name.sim.json" 2> "$TMP/$name.err"; then
    fail "$name: orrery sim exited non-zero: $(tail -3 "$TMP/$name.err")"; continue
  fi
  if ! "$ORRERY" report "$TMP/$name.db" --json > "$TMP/$name.report.json" 2>> "$TMP/$name.err"; then
    fail "$name: orrery report exited non-zero: $(tail -3 "$TMP/$name.err")"; continue
  fi
  if ! "$ORRERY" report "$TMP/$name.db" --json --skip-steps 0 > "$TMP/$name.all.json" 2>> "$TMP/$name.err"; then
    fail "$name: orrery report --skip-steps 0 exited non-zero"; continue
  fi
  if python3 - "$TMP/$name.sim.json" "$TMP/$name.report.json" "$TMP/$name.all.json" "$pp" <<'PY'
import json, sys
sim = json.load(open(sys.argv[1]))
rep = json.load(open(sys.argv[2]))["summary"]
allsteps = json.load(open(sys.argv[3]))["summary"]
pp = int(sys.argv[4])
b = sim["breakdown_ns"]
sb = rep["step_breakdown_ns"]
def near(x, y, what):
    assert abs(x - y) <= max(2.0, 1e-6 * abs(y)), f"{what}: report {x} vs sim {y}"
assert rep["counted_steps"] == 2 and allsteps["counted_steps"] == 3, (rep["counted_steps"], allsteps["counted_steps"])
near(rep["step_mean_ns"], sim["step_time_ns"], "step time")
near(sb["window"], b["window"], "window")
near(sb["compute"], b["compute"], "compute")
near(sb["exposed_tp_comm"], b["exposed_tp_comm"], "exposed tp")
near(sb["exposed_dp_comm"], b["exposed_dp_comm"], "exposed dp")
near(sb["p2p_in_rest"], b["exposed_pp_comm"], "p2p")
if pp > 1:
    near(sb["bubble"], b["bubble"], "bubble")
    assert b["bubble"] > 0 and b["idle"] == 0
    near(rep["bubble_pct"], 100.0 * b["bubble"] / b["window"], "bubble %")
else:
    near(sb["idle"], b["idle"], "idle")
    assert b["bubble"] == 0
PY
  then
    echo "ok: $name: orrery report of the simulated trace gives the simulator's step time and breakdown"
  else
    fail "$name: report and sim disagree"
  fi
done

# MFU of a trace that records a subset of the ranks: the model FLOPs are the whole world's, so the
# report divides by the peak of meta.world_size ranks, not of the ranks recorded. The report's MFU
# equals the simulator's, for one rank per stage (4 of 8 ranks here, 1 of 64 for llama3-8b) and for
# every rank. The layout is also the one that deadlocked (pp 4, dp 2, ZeRO 2, tied, 4 micro-batches).
mfu_case() {  # name, scenario, sim options...
  local name=$1 scenario=$2
  shift 2
  if ! timeout 120 "$ORRERY" sim "$scenario" "$@" --steps 3 --json --out "$TMP/$name.db" \
      > "$TMP/$name.sim.json" 2> "$TMP/$name.err"; then
    fail "$name: orrery sim exited non-zero: $(tail -3 "$TMP/$name.err")"; return
  fi
  if ! "$ORRERY" report "$TMP/$name.db" --json > "$TMP/$name.report.json" 2>> "$TMP/$name.err"; then
    fail "$name: orrery report exited non-zero: $(tail -3 "$TMP/$name.err")"; return
  fi
  if python3 - "$TMP/$name.sim.json" "$TMP/$name.report.json" <<'PY'
import json, sys
sim = json.load(open(sys.argv[1]))
rep = json.load(open(sys.argv[2]))["summary"]
assert 0 < sim["mfu"] < 1, sim["mfu"]
assert abs(rep["mfu"] - sim["mfu"]) <= 1e-6 * sim["mfu"] + 1e-9, f"report MFU {rep['mfu']} vs sim {sim['mfu']}"
PY
  then
    echo "ok: $name: the report's MFU is the simulator's"
  else
    fail "$name: report MFU differs from the simulator's"
  fi
}
dense=(--set parallel.dp=2 --set parallel.pp=4 --set parallel.zero=2 --set training.global_batch=16
  --set training.micro_batch=2)
mfu_case dense-representative "$SRC/scenarios/gpt-tiny.yaml" "${dense[@]}" --representative
mfu_case dense-all-ranks "$SRC/scenarios/gpt-tiny.yaml" "${dense[@]}" --all-ranks
mfu_case llama3-8b-representative "$SRC/scenarios/llama/llama3-8b.yaml" --representative

if [ "$failures" -ne 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "all sim/report checks passed"
