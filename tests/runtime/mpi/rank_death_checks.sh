#!/usr/bin/env bash
# Rank death and losing no spans (CTest runtime_mpi_rank_death, label mpi): a 4-rank gpt-tiny run
# (tiny model) whose rank 2 SIGKILLs itself at the start of step 2 (test-only faults.kill_rank) must
# end within a 30 s deadline, non-zero, naming rank 2; its merged trace must hold exactly the spans
# of steps 0 and 1 of every rank that an uninterrupted run records, and `orrery doctor` must name
# rank 2. The watchdog path (a rank skipping a collective of step 2) must keep them too.
# Usage: rank_death_checks.sh ORRERY_BINARY SOURCE_DIR WORK_DIR
set -uo pipefail
ORRERY=$1
SRC=$2
WORK=$3
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

SETS=(--set model.layers=1 --set model.d_model=32 --set model.heads=2 --set model.vocab=64
      --set model.seq=16 --set training.global_batch=8 --set training.micro_batch=2
      --set training.steps=4 --set parallel.dp=4 --set parallel.bucket_mb=0.01
      --set runtime.threads=1)

# Spans per (rank, step) of steps 0 and 1, as "rank:step:count" lines.
span_counts() {
  python3 - "$1" <<'EOF'
import sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
# The store's per-(rank, step) aggregates count every span of the step.
for r, s, n in db.execute("SELECT rank, step, span_count FROM steps WHERE step IN (0, 1) "
                          "ORDER BY rank, step"):
    print(f"{r}:{s}:{n}")
EOF
}

# 1. The reference: the same run, uninterrupted.
if ! timeout 120 "$ORRERY" run "$SRC/scenarios/gpt-tiny.yaml" --nproc 4 "${SETS[@]}" --json \
    --out ref.db > ref.out 2> ref.err; then
  fail "uninterrupted run exited non-zero"; cat ref.err
fi
ref=$(span_counts ref.db)
[ "$(echo "$ref" | wc -l)" -eq 8 ] || fail "reference: expected spans of steps 0-1 on 4 ranks, got: $ref"

# 2. Rank 2 dies of SIGKILL at the start of step 2.
start=$(date +%s.%N)
timeout 60 "$ORRERY" run "$SRC/scenarios/gpt-tiny.yaml" --nproc 4 "${SETS[@]}" --json \
  --set faults.kill_rank=2 --set faults.step=2 --out kill.db > kill.out 2> kill.err
rc=$?
elapsed=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")
echo "rank death: exit $rc after ${elapsed} s (deadline 30 s)"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "kill: exit $rc, expected non-zero before the timeout"
python3 -c "import sys; sys.exit(0 if $elapsed < 30 else 1)" || fail "kill: took ${elapsed} s, deadline 30 s"
grep -F "rank 2 was lost (killed by signal 9) during step 2; ranks 0,1,3 stopped" kill.err \
  || { fail "kill: stderr does not name the lost rank"; cat kill.err; }
[ -f kill.db ] || fail "kill: no merged trace"
ls ./kill.db.rank*.db > /dev/null 2>&1 && fail "kill: per-rank files left behind"
got=$(span_counts kill.db)
[ "$got" = "$ref" ] || { fail "kill: spans of steps 0-1 differ from the uninterrupted run"; \
  echo "  ref: $(echo $ref)"; echo "  got: $(echo $got)"; }
python3 - <<'EOF' || fail "kill: meta does not mark the failure"
import json, sqlite3
db = sqlite3.connect("file:kill.db?mode=ro", uri=True)
meta = dict(db.execute("SELECT key, value FROM meta"))
assert meta["failed"] == 1 and json.loads(meta["lost_ranks"]) == [2], meta
assert meta["failed_step"] == 2, meta
assert meta["failure"].startswith("rank 2 was lost"), meta
extra = json.loads(meta["extra_json"])
assert "failed" not in extra and extra["threads"] == 1, extra
EOF
"$ORRERY" info --json kill.db | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j["origin"] == "run", j["origin"]
assert j["failure"] == {"failed": True, "lost_ranks": [2], "step": 2, "message": j["failure"]["message"]}, j["failure"]
assert j["failure"]["message"].startswith("rank 2 was lost (killed by signal 9) during step 2")
assert j["layout"]["micro_batches"] == 1 and j["layout"]["schedule"] == "1f1b", j["layout"]
' || fail "kill: info --json does not give the typed failure and layout"
doctor=$("$ORRERY" doctor kill.db 2>&1)
echo "doctor: $doctor"
echo "$doctor" | grep -q "rank 2 never did" || fail "kill: doctor does not name rank 2"
"$ORRERY" report kill.db > kill_report.txt 2>&1 || fail "kill: orrery report on the remains"
grep -q "^FAILED RUN: rank 2 was lost (killed by signal 9) during step 2" kill_report.txt \
  || { fail "kill: report does not say the run failed"; head -5 kill_report.txt; }
"$ORRERY" report ref.db 2>&1 | grep -q "FAILED" && fail "ref: report of a finished run says FAILED"

# 3. The watchdog path: rank 1 skips the first collective of step 2, the others time out (3 s).
timeout 60 "$ORRERY" run "$SRC/scenarios/gpt-tiny.yaml" --nproc 4 "${SETS[@]}" --json \
  --set faults.skip_collective_rank=1 --set faults.step=2 --set runtime.watchdog_s=3 \
  --out wd.db > wd.out 2> wd.err
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "watchdog: exit $rc, expected non-zero before the timeout"
[ -f wd.db ] || { fail "watchdog: no merged trace"; cat wd.err; }
got=$(span_counts wd.db)
[ "$got" = "$ref" ] || { fail "watchdog: spans of steps 0-1 differ from the uninterrupted run"; \
  echo "  ref: $(echo $ref)"; echo "  got: $(echo $got)"; }
"$ORRERY" doctor wd.db 2>&1 | grep -q "rank 1 never did" || fail "watchdog: doctor does not name rank 1"

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "rank death checks: all passed"
