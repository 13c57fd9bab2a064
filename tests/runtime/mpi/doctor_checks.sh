#!/usr/bin/env bash
# `orrery doctor` on faults caused on purpose (CTest runtime_mpi_doctor, label mpi): a tiny 2-rank
# run with the test-only faults.* keys. A skipped collective, a changed size and a different op hang
# the job: the watchdog (3 s) dumps the flight records, the job exits non-zero, and the doctor reads
# the per-rank files. A sleeping rank finishes: the doctor reads the merged trace's spans.
# Every diagnosis is checked word for word. A case that fails prints its run's exit status, stderr
# and flight records (when each rank started each collective), and the work directory of a failed
# run is kept as WORK_DIR.failed-<time>-<pid> (the next run starts by deleting WORK_DIR).
# Usage: doctor_checks.sh ORRERY_BINARY WORK_DIR
set -uo pipefail
ORRERY=$1
WORK=$2
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# What is left to diagnose a failed case NAME: the run's exit status and stderr, and its flight
# records: per collective, each rank's op, bytes, state and start (ms after the earliest rank's),
# the figures the hang, mismatch and straggler findings are made of.
evidence() {
  local name=$1 rc=$2
  echo "  $name: run exit $rc; its stderr:"
  sed 's/^/  | /' "$name.err"
  local dbs=("$name.db")
  [ -e "$name.db" ] || dbs=("$name.db".rank*.db)
  python3 - "${dbs[@]}" <<'PY' || echo "  (no flight records readable from ${dbs[*]})"
import collections, sqlite3, sys
recs = collections.defaultdict(dict)
for path in sys.argv[1:]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    for rank, comm, seq, op, nbytes, step, state, start in db.execute(
            "SELECT rank, comm, seq, op, bytes, step, state, started_ns FROM flight_records"):
        recs[(comm, seq)][rank] = (op, nbytes, step, state, start)
states = {0: "scheduled", 1: "started", 2: "completed"}
ops = ["none", "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all",
       "send", "recv", "barrier"]  # traces::CollOp
print("  flight records, comm #seq (step): per rank op, bytes, state, start in ms after the earliest")
for (comm, seq), ranks in sorted(recs.items()):
    starts = [r[4] for r in ranks.values() if r[4] > 0]
    t0 = min(starts) if starts else 0
    cells = [f"rank {rank} {ops[op] if 0 <= op < len(ops) else op} {nb} {states.get(st, st)} "
             + (f"+{(start - t0) / 1e6:.1f}" if start > 0 else "-")
             for rank, (op, nb, step, st, start) in sorted(ranks.items())]
    step = max(r[2] for r in ranks.values())
    print(f"  comm {comm} #{seq} ({step}): " + "; ".join(cells))
PY
}

cat > tiny.yaml <<'YAML'
name: tiny
model: {layers: 1, d_model: 16, heads: 2, vocab: 32, seq: 8}
training: {steps: 3, global_batch: 4, micro_batch: 2, seed: 7, warmup_steps: 0}
parallel: {dp: 2, bucket_mb: 1}
runtime: {threads: 1, watchdog_s: 3}
YAML

# check NAME EXPECTED_RC_NONZERO(1|0) EXPECTED_DIAGNOSIS --set ...
check() {
  local name=$1 hang=$2 want=$3
  shift 3
  local sets=() before=$failures
  for kv in "$@"; do sets+=(--set "$kv"); done
  timeout 60 "$ORRERY" run tiny.yaml --nproc 2 --out "$name.db" --json "${sets[@]}" \
    > "$name.out" 2> "$name.err"
  local rc=$?
  if [ "$hang" = 1 ]; then
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "$name: exit $rc, expected a non-zero exit before the timeout"
    grep -q "flight records" "$name.err" || fail "$name: no flight records on stderr"
  else
    [ $rc -eq 0 ] || fail "$name: exit $rc"
  fi
  local got
  got=$("$ORRERY" doctor "$name.db" --straggler-ms 1000 2>&1)
  if [ "$got" != "$want" ]; then
    fail "$name: diagnosis"
    echo "  got:  $got"
    echo "  want: $want"
  fi
  [ $failures -eq $before ] || evidence "$name" $rc
}

check skip 1 "Collective #2 on dp[tp=0,pp=0] (all_reduce, step 1) never completed: rank 0 joined it, rank 1 never did." \
  faults.skip_collective_rank=1 faults.step=1
check size 1 "Size mismatch at collective #2 on dp[tp=0,pp=0] (step 1), all_reduce: rank 1 passed 31620 bytes where rank 0 passed 15808 bytes." \
  faults.size_mismatch_rank=1 faults.step=1
check op 1 "Op mismatch at collective #2 on dp[tp=0,pp=0] (step 1): rank 1 called all_gather where rank 0 called all_reduce." \
  faults.wrong_op_rank=1 faults.step=1
check sleep 0 "Rank 1 straggles: it arrived last, 1000 ms or more after the others, at 1 of 8 matched collectives (first at collective #2 on dp[tp=0,pp=0] (step 1))." \
  faults.sleep_rank=1 faults.sleep_ms=1500 faults.step=1 runtime.watchdog_s=30
# JSON form: one object.
"$ORRERY" doctor skip.db --json | python3 -c 'import json,sys; j=json.load(sys.stdin); assert j["findings"][0]["kind"]=="missing" and j["findings"][0]["ranks"]==[1], j' \
  || fail "doctor --json"
# Bad input exits 2.
"$ORRERY" doctor nope.db > /dev/null 2>&1; [ $? -eq 2 ] || fail "missing trace: expected exit 2"
# A threshold whose ns overflow int64 (was a float-cast overflow under UBSan) names the option.
got=$("$ORRERY" doctor skip.db --straggler-ms 1e308 2>&1); rc=$?
[ $rc -eq 2 ] && [[ $got == *"--straggler-ms: must be > 0 and at most 1e12"* ]] \
  || fail "--straggler-ms 1e308: expected exit 2 naming the option, got $rc: $got"

if [ $failures -eq 0 ]; then
  echo "doctor checks: all passed"
else
  kept="$WORK.failed-$(date -u +%Y%m%dT%H%M%SZ)-$$"
  cp -a "$WORK" "$kept" && echo "traces and logs of this run kept in $kept"
fi
exit $failures
