#!/usr/bin/env bash
# Elastic restarts end to end under mpirun (CTest runtime_mpi_elastic, label mpi):
#  1. dp2, 8 steps, a checkpoint every 2, rank 1 SIGKILLed at the start of step 3 (faults.kill_rank),
#     --max-restarts 2: the job exits 0 after exactly one restart, resumed from step 2 on the same
#     2 ranks; the losses of steps 3..8 equal the uninterrupted run's bit for bit, and so do the
#     step-8 checkpoint files (parameters and moments: every step's update, the ones before the
#     failure included), and an earlier job's newer checkpoint in the directory is not taken; the
#     trace's metadata records both attempts (attempt number, lost rank, the
#     step resumed from, the time lost), and `orrery report` (text and --json) shows the restart.
#  2. faults.every_attempt: true: the rank dies on every attempt, --max-restarts 1 runs out: exit 2,
#     an error naming both attempts, the remains of each kept.
#  3. Shrinking: a dp4 job on a hostfile of 4 slots loses rank 3 at step 3 while the hostfile drops
#     to 2 slots; with --min-nproc 2 it restarts on 2 ranks (dp 4 -> 2) from step 2 and finishes;
#     its losses equal the dp4 run's within 1e-6 relative (the same sequences in another grouping).
#  4. Bad input: a negative --max-restarts, --min-nproc above the job's ranks or without
#     --max-restarts, an unreadable --hostfile: exit 2 naming the flag, before any rank starts.
#  5. Mixture of experts (issue 19): a dp2·ep2 job loses rank 1 at step 3 and resumes on the same
#     layout: losses of steps 3..8 and the step-8 files bit for bit. A dropless dp4·ep2 job loses
#     rank 3 and resumes on 2 ranks (dp2·ep2): the first resumed loss within 1e-6 relative of the
#     dp4 run's (the same state and data, another summation order), every later one within 5e-5
#     (measured 1.2e-5: a routing decision near a tie takes the order difference further).
# Usage: elastic_checks.sh ORRERY_BINARY WORK_DIR
set -uo pipefail
ORRERY=$1
WORK=$2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RUN_TIMEOUT=150
# shellcheck source=tiny_run_checks.sh
source "$HERE/tiny_run_checks.sh"
tiny_yaml 8 2
cat > check.py <<'EOF'
import json, sqlite3
def run(name):  # the last JSON line: the final attempt's rank 0
    return json.loads(open(name + ".json").read().strip().splitlines()[-1])
def attempts(trace):
    db = sqlite3.connect(f"file:{trace}?mode=ro", uri=True)
    extra = json.loads(db.execute("SELECT value FROM meta WHERE key='extra_json'").fetchone()[0])
    return extra.get("attempts")
EOF

# 1. One rank dies, one restart, bit for bit.
run ref --nproc 2 --out ref.db --set checkpoint.dir=ref || { fail "reference run"; cat ref.err; }
# A complete checkpoint of an earlier job in the same directory (the reference's step-6, an hour
# old): a restart must not take it.
mkdir -p el && cp -r ref/step-6 el/step-6 && touch -d '1 hour ago' el/step-6/manifest.json
run el --nproc 2 --out el.db --set checkpoint.dir=el --max-restarts 2 \
  --set faults.kill_rank=1 --set faults.step=3
rc=$?
[ $rc -eq 0 ] || { fail "elastic: exit $rc, expected 0"; cat el.err; }
n=$(grep -c "orrery run: restart " el.err)
[ "$n" -eq 1 ] || { fail "elastic: $n restart lines, expected 1"; cat el.err; }
grep -F "orrery run: restart 1 of 2 (attempt 2): rank 1 lost during step 3; resuming from el/step-2 (step 2 of 8) on 2 rank(s) (dp=2);" el.err \
  || { fail "elastic: restart line"; cat el.err; }
grep "orrery run: restart " el.err
[ -f el.attempt1.db ] || fail "elastic: the first attempt's remains (el.attempt1.db) not kept"
python3 - <<'EOF' || fail "elastic: losses, checkpoint or trace record differ"
import sys; sys.path.insert(0, ".")
from check import run, attempts
ref, el = run("ref"), run("el")
assert el["first_step"] == 2 and len(el["loss"]) == 6 and el["ranks"] == 2, el
assert ref["loss"][2:] == el["loss"], (ref["loss"], el["loss"])  # bit-identical floats
print("steps 3..8 losses", el["loss"])
a = attempts("el.db")
assert [x["attempt"] for x in a] == [1, 2], a
assert a[0]["failed"] and a[0]["lost_ranks"] == [1] and a[0]["failed_step"] == 3, a[0]
assert a[0]["resumed_from_step"] == 0 and a[0]["trace"] == "el.attempt1.db", a[0]
assert a[0]["lost_ns"] > 0 and a[0]["end_unix_ns"] > a[0]["start_unix_ns"], a[0]
assert not a[1]["failed"] and a[1]["resumed_from_step"] == 2, a[1]
assert a[1]["resumed_from"] == "el/step-2" and a[1]["nproc"] == 2, a[1]
assert a[1]["start_unix_ns"] >= a[0]["end_unix_ns"], a
# The remains of attempt 1 record it as the attempt in flight.
b = attempts("el.attempt1.db")
assert len(b) == 1 and b[0]["attempt"] == 1 and not b[0]["failed"], b
print("time lost", a[0]["lost_ns"] / 1e9, "s")
EOF
for f in ref/step-8/*.bin; do
  cmp -s "$f" "el/step-8/$(basename "$f")" || fail "elastic: step-8 $(basename "$f") differs"
done
[ -n "$(ls ref/step-8/*.bin 2>/dev/null)" ] || fail "reference: no step-8 checkpoint"
"$ORRERY" report el.db > el_report.txt 2>&1 || fail "elastic: orrery report"
grep -E "^  restarts +1 \(" el_report.txt || { fail "elastic: report lacks the restart"; cat el_report.txt; }
grep -E "^    attempt 1 +rank 1 lost during step 3; resumed from step 2; .* lost \(el.attempt1.db\)$" \
  el_report.txt || { fail "elastic: report's attempt line"; cat el_report.txt; }
"$ORRERY" report el.db --json > el_report.json 2>&1 || fail "elastic: orrery report --json"
python3 - <<'EOF' || fail "elastic: report --json restarts"
import json, sys; sys.path.insert(0, ".")
from check import attempts
r = json.load(open("el_report.json"))["restarts"]
a = attempts("el.db")
assert len(r) == 1 and r[0]["attempt"] == 1 and r[0]["lost_ranks"] == [1], r
assert r[0]["failed_step"] == 3 and r[0]["resumed_from_step"] == 2, r
assert r[0]["lost_ns"] == a[0]["lost_ns"] > 0, (r, a)
assert json.load(open("el_report.json"))["summary"]["steps"] == 6
EOF
"$ORRERY" report ref.db --json | python3 -c "import json,sys; assert json.load(sys.stdin)['restarts'] == []" \
  || fail "reference: report --json restarts not empty"
python3 -c "
import sys; sys.path.insert(0, '.')
from check import attempts
assert attempts('ref.db') is None
" || fail "reference: a run without --max-restarts records attempts"

# 2. A rank dies on every attempt: the restarts run out.
run every --nproc 2 --out every.db --set checkpoint.dir=every --max-restarts 1 \
  --set faults.kill_rank=1 --set faults.step=3 --set faults.every_attempt=true
rc=$?
[ $rc -eq 2 ] || { fail "every_attempt: exit $rc, expected 2"; cat every.err; }
grep -F "orrery: error: restart limit reached: 2 attempt(s) failed (--max-restarts 1)" every.err \
  || { fail "every_attempt: no 'restart limit reached' error"; cat every.err; }
grep -F "  attempt 1: rank 1 was lost (killed by signal 9) during step 3" every.err \
  || fail "every_attempt: error lacks attempt 1"
grep -F "  attempt 2: rank 1 was lost (killed by signal 9) during step 3" every.err \
  || fail "every_attempt: error lacks attempt 2"
[ -f every.attempt1.db ] && [ -f every.db ] || fail "every_attempt: remains of the attempts not kept"
python3 -c "
import sys; sys.path.insert(0, '.')
from check import attempts
a = attempts('every.db')
assert [x['attempt'] for x in a] == [1, 2] and a[1]['resumed_from_step'] == 2, a
" || fail "every_attempt: the last remains do not record both attempts"

# 3. Fewer ranks at the restart: dp 4 -> 2.
echo "localhost slots=4" > hosts
run ref4 --nproc 4 --no-profile --set parallel.dp=4 --set checkpoint.dir=ref4 \
  || { fail "dp4 reference run"; cat ref4.err; }
# Once the first attempt's ranks are up, the "cluster" has only 2 slots left.
( for _ in $(seq 600); do
    [ -f shrink.db.rank3.db ] && { echo "localhost slots=2" > hosts; break; }
    sleep 0.1
  done ) &
watcher=$!
run shrink --nproc 4 --out shrink.db --set parallel.dp=4 --set checkpoint.dir=shrink \
  --hostfile hosts --max-restarts 1 --min-nproc 2 --set faults.kill_rank=3 --set faults.step=3
rc=$?
kill "$watcher" 2> /dev/null
wait "$watcher" 2> /dev/null
[ $rc -eq 0 ] || { fail "shrink: exit $rc, expected 0"; cat shrink.err; }
grep -F "orrery run: restart 1 of 1 (attempt 2): rank 3 lost during step 3; resuming from shrink/step-2 (step 2 of 8) on 2 rank(s) (dp=2);" shrink.err \
  || { fail "shrink: restart line"; cat shrink.err; }
grep -F "orrery run: only 2 slot(s) in hosts: dp 4 -> 2" shrink.err || fail "shrink: no dp 4 -> 2 line"
python3 - <<'EOF' || fail "shrink: losses differ from the dp4 run beyond 1e-6"
import sys; sys.path.insert(0, ".")
from check import run, attempts
ref, s = run("ref4"), run("shrink")
assert s["first_step"] == 2 and s["dp"] == 2 and s["ranks"] == 2 and len(s["loss"]) == 6, s
for a, b in zip(s["loss"], ref["loss"][2:]):
    assert abs(a - b) <= 1e-6 * abs(b), (s["loss"], ref["loss"])
print("dp2 after dp4:", s["loss"], "max relative", max(abs(a - b) / abs(b) for a, b in zip(s["loss"], ref["loss"][2:])))
a = attempts("shrink.db")
assert a[0]["nproc"] == 4 and a[0]["dp"] == 4 and a[0]["lost_ranks"] == [3], a
assert a[1]["nproc"] == 2 and a[1]["dp"] == 2 and a[1]["resumed_from_step"] == 2, a
EOF
"$ORRERY" report shrink.db 2>&1 | grep -E "attempt 1 +rank 3 lost during step 3; resumed from step 2 on 2 ranks \(was 4\)" \
  || fail "shrink: report lacks the shrink"

# 4. Bad input: exit 2 naming the flag, nothing started.
expect_input_error() {  # NAME PATTERN ARGS...
  local name=$1 pattern=$2
  shift 2
  run "$name" "$@"
  local rc=$?
  [ $rc -eq 2 ] || fail "$name: exit $rc, expected 2"
  grep -qF -- "$pattern" "$name.err" || { fail "$name: message lacks '$pattern'"; cat "$name.err"; }
  ls "$name"*.db > /dev/null 2>&1 && fail "$name: a trace was written"
}
expect_input_error negative "--max-restarts -1: expected a whole number >= 0" \
  --nproc 2 --out negative.db --max-restarts -1
expect_input_error above "--min-nproc 3: more than the job's 2 ranks" \
  --nproc 2 --out above.db --max-restarts 1 --min-nproc 3
expect_input_error alone "--min-nproc 1: only a restart shrinks a job; give --max-restarts N too" \
  --nproc 2 --out alone.db --min-nproc 1
expect_input_error nohosts "--hostfile 'missing-hosts': cannot read it" \
  --nproc 2 --out nohosts.db --max-restarts 1 --hostfile missing-hosts

# 5. Mixture of experts.
# moe_small.yaml beside this script (moe_checkpoint_checks.sh's model), 8 steps, a checkpoint every 2.
cp "$HERE/moe_small.yaml" moe.yaml || exit 1
moe() {  # NAME ARGS... : orrery run moe.yaml ARGS --json > NAME.json 2> NAME.err
  local name=$1
  shift
  timeout 150 "$ORRERY" run moe.yaml --json --set training.steps=8 --set checkpoint.every=2 "$@" > "$name.json" 2> "$name.err"
}
moe moeref --nproc 2 --no-profile --set checkpoint.dir=moeref || { fail "moe reference run"; cat moeref.err; }
moe moeel --nproc 2 --out moeel.db --set checkpoint.dir=moeel --max-restarts 2 \
  --set faults.kill_rank=1 --set faults.step=3
rc=$?
[ $rc -eq 0 ] || { fail "moe elastic: exit $rc, expected 0"; cat moeel.err; }
grep -F "orrery run: restart 1 of 2 (attempt 2): rank 1 lost during step 3; resuming from moeel/step-2 (step 2 of 8) on 2 rank(s) (dp=2);" moeel.err \
  || { fail "moe elastic: restart line"; cat moeel.err; }
python3 - <<'EOF' || fail "moe elastic: losses differ"
import sys; sys.path.insert(0, ".")
from check import run
ref, el = run("moeref"), run("moeel")
assert el["first_step"] == 2 and len(el["loss"]) == 6, el
assert ref["loss"][2:] == el["loss"], (ref["loss"], el["loss"])
print("moe steps 3..8 losses", el["loss"])
EOF
for f in moeref/step-8/*.bin; do
  cmp -s "$f" "moeel/step-8/$(basename "$f")" || fail "moe elastic: step-8 $(basename "$f") differs"
done
[ -n "$(ls moeref/step-8/*.bin 2>/dev/null)" ] || fail "moe reference: no step-8 checkpoint"
echo "localhost slots=4" > moehosts
moe moeref4 --nproc 4 --no-profile --set parallel.dp=4 --set model.moe.capacity_factor=0 \
  --set checkpoint.dir=moeref4 || { fail "moe dp4 reference run"; cat moeref4.err; }
( for _ in $(seq 600); do
    [ -f moeshrink.db.rank3.db ] && { echo "localhost slots=2" > moehosts; break; }
    sleep 0.1
  done ) &
watcher=$!
moe moeshrink --nproc 4 --out moeshrink.db --set parallel.dp=4 --set model.moe.capacity_factor=0 \
  --set checkpoint.dir=moeshrink --hostfile moehosts --max-restarts 1 --min-nproc 2 \
  --set faults.kill_rank=3 --set faults.step=3
rc=$?
kill "$watcher" 2> /dev/null
wait "$watcher" 2> /dev/null
[ $rc -eq 0 ] || { fail "moe shrink: exit $rc, expected 0"; cat moeshrink.err; }
grep -F "orrery run: only 2 slot(s) in moehosts: dp 4 -> 2" moeshrink.err \
  || { fail "moe shrink: no dp 4 -> 2 line"; cat moeshrink.err; }
python3 - <<'EOF' || fail "moe shrink: losses differ from the dp4 run"
import sys; sys.path.insert(0, ".")
from check import run
ref, s = run("moeref4"), run("moeshrink")
assert s["first_step"] == 2 and s["dp"] == 2 and s["ranks"] == 2 and len(s["loss"]) == 6, s
rel = [abs(a - b) / abs(b) for a, b in zip(s["loss"], ref["loss"][2:])]
assert rel[0] <= 1e-6 and max(rel) <= 5e-5, (rel, s["loss"], ref["loss"])
print("moe dp2 after dp4: max relative", max(rel))
EOF

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all elastic checks passed"
