#!/usr/bin/env bash
# `orrery commbench` end to end (CTest runtime_mpi_commbench, label mpi): small sweeps on 2 and 4 ranks
# through the mpirun re-launch, checked against the merged trace with plain SQL (orrery export
# --format sqlite): exact span counts per rank and group size, each span's bytes, every collective's
# members, send/recv pairing, the warm-up marking, the metadata marker, and the JSON table recomputed
# from the spans. The sweep checks its data itself; a rank that corrupts its input must end the job
# (exit 1) naming the element. Every refused input exits 2 with its message, before MPI starts.
# Usage: commbench_checks.sh ORRERY_BINARY WORK_DIR
set -uo pipefail
ORRERY=$1
WORK=$2
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

ITERS=2
WARMUP=1
for n in 2 4; do
  if [ "$n" -eq 2 ]; then groups=2; else groups=2,4; fi
  if ! timeout 120 "$ORRERY" commbench --nproc $n --min-bytes 4K --max-bytes 64K --iters $ITERS \
      --warmup $WARMUP --groups $groups --out cb$n.db --json > cb$n.json 2> cb$n.err; then
    fail "commbench --nproc $n exited non-zero"; cat cb$n.err
    continue
  fi
  "$ORRERY" export cb$n.db --format sqlite --out cb$n-sql.db > /dev/null 2>&1 || { fail "export cb$n.db"; continue; }
  python3 - "$n" "$groups" "$ITERS" "$WARMUP" <<'EOF' || fail "commbench --nproc $n: trace checks"
import json, sqlite3, statistics, sys
from collections import defaultdict
n, groups, iters, warmup = int(sys.argv[1]), [int(g) for g in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4])
sizes = [4096 << k for k in range(5)]                 # 4K .. 64K
ops = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv"]
OP = {1: "all_reduce", 2: "reduce_scatter", 3: "all_gather", 4: "broadcast", 7: "send", 8: "recv"}
db = sqlite3.connect(f"file:cb{n}-sql.db?mode=ro", uri=True)
names = dict(db.execute("SELECT id, text FROM strings"))
comms = {cid: [int(r) for r in ranks.split(",")] for cid, ranks in db.execute("SELECT id, ranks FROM communicators")}
spans = [dict(zip(["rank", "kind", "name", "start", "end", "step", "bytes", "comm", "peer", "seq", "op"], r))
         for r in db.execute("SELECT rank, kind, name, start_ns, end_ns, step, bytes, comm, peer, seq, op FROM spans")]
for s in spans:
    s["name"] = names[s["name"]]
meta = dict(db.execute("SELECT key, value FROM meta"))
extra = json.loads(meta["extra_json"])
assert extra["kind"] == "commbench" and meta["scenario_name"] == "commbench", meta
assert extra["commbench"]["groups"] == groups and extra["commbench"]["sizes"] == sizes, extra

# Every span is a bench span on a bench communicator (no barrier, no set-up traffic recorded).
assert all(s["name"].startswith("bench.") for s in spans), {s["name"] for s in spans}
g_of = {cid: len(r) for cid, r in comms.items()}
bench_comms = {cid for cid in comms if cid != 0}
assert all(s["comm"] in bench_comms for s in spans)
assert sorted(g_of[c] for c in bench_comms) == sorted(g for g in groups for _ in range(n // g)), comms

# Exact counts per rank and group size: ops x sizes x (iters + warmup), send_recv counting 2.
per = defaultdict(int)
for s in spans:
    per[(s["rank"], g_of[s["comm"]])] += 1
want = (len(ops) + 1) * len(sizes) * (iters + warmup)
for r in range(n):
    for g in groups:
        assert per[(r, g)] == want, (r, g, per[(r, g)], want)
# Warm-up: name bench.warmup, step -1; timed: bench.<op>, steps 0..iters-1, iters per size per op.
for s in spans:
    if s["name"] == "bench.warmup":
        assert s["step"] == -1, s
    else:
        assert 0 <= s["step"] < iters and s["name"] == "bench." + (OP[s["op"]] if s["op"] not in (7, 8) else "send_recv"), s
# Each span's bytes: every size exactly (iters + warmup) times per rank, group size and op.
by = defaultdict(list)
for s in spans:
    by[(s["rank"], g_of[s["comm"]], s["op"])].append(s["bytes"])
for (r, g, op), b in by.items():
    assert sorted(b) == sorted(sizes * (iters + warmup)), (r, g, OP[op], sorted(b))
assert len(by) == n * len(groups) * 6, len(by)
# Every collective (comm, seq) has exactly its group's members, agreeing on op and bytes.
inst = defaultdict(list)
for s in spans:
    if s["kind"] == 1:
        inst[(s["comm"], s["seq"])].append(s)
for (c, q), members in inst.items():
    assert sorted(m["rank"] for m in members) == sorted(comms[c]), (c, q, [m["rank"] for m in members])
    assert len({(m["op"], m["bytes"], m["name"], m["step"]) for m in members}) == 1, (c, q)
    if members[0]["op"] == 4:  # broadcast: peer = the root, the group's first rank
        assert all(m["peer"] == comms[c][0] for m in members)
assert len(inst) == sum(n // g for g in groups) * 4 * len(sizes) * (iters + warmup), len(inst)
# send/recv: partners 0<->1, 2<->3 within the group; every send matched by the partner's recv.
sends, recvs = defaultdict(list), defaultdict(list)
for s in spans:
    if s["kind"] == 2:
        i = comms[s["comm"]].index(s["rank"])
        assert comms[s["comm"]][i ^ 1] == s["peer"], s
        (sends if s["op"] == 7 else recvs)[(s["comm"], s["rank"] if s["op"] == 7 else s["peer"],
                                            s["peer"] if s["op"] == 7 else s["rank"])].append(s)
assert sends.keys() == recvs.keys() and all(len(sends[k]) == len(recvs[k]) == len(sizes) * (iters + warmup) for k in sends)

# The JSON table, recomputed from the spans: median over timed instances of min(end) - max(start).
j = json.loads(open(f"cb{n}.json").read().strip().splitlines()[-1])
assert j["trace"] == f"cb{n}.db" and j["ranks"] == n, j
rows = {(r["op"], r["group_size"], r["size_bytes"]): r for r in j["rows"]}
assert len(rows) == len(ops) * len(groups) * len(sizes), len(rows)
times = defaultdict(list)
for (c, q), m in inst.items():
    if m[0]["step"] < 0:
        continue
    t = min(x["end"] for x in m) - max(x["start"] for x in m)
    if t > 0:
        times[(OP[m[0]["op"]], g_of[c], m[0]["bytes"])].append(t)
for k, sv in sends.items():
    rv = sorted(recvs[k], key=lambda x: x["seq"])
    for s, rcv in zip(sorted(sv, key=lambda x: x["seq"]), rv):
        if s["step"] < 0:
            continue
        t = rcv["end"] - max(s["start"], rcv["start"])
        if t > 0:
            times[("send_recv", g_of[k[0]], s["bytes"])].append(t)
factor = {"all_reduce": lambda g: 2 * (g - 1) / g, "reduce_scatter": lambda g: (g - 1) / g,
          "all_gather": lambda g: (g - 1) / g, "broadcast": lambda g: 1.0, "send_recv": lambda g: 1.0}
for key, r in rows.items():
    t = times.get(key, [])
    assert r["instances"] == len(t), (key, r, len(t))
    med = statistics.median(t) if t else 0.0
    assert abs(r["time_ns"] - med) < 1e-6, (key, r["time_ns"], med)
    if t:
        assert abs(r["algbw_gb_per_s"] - key[2] / med) < 1e-9 * max(1, key[2] / med), (key, r)
        assert abs(r["busbw_gb_per_s"] - key[2] / med * factor[key[0]](key[1])) < 1e-9 * max(1, key[2] / med), (key, r)
    assert r["count"] == key[2] // 4 and r["type"] == "float", r
# Rank 0's sweep: operations issued (= its spans) and elements checked (closed form: every element
# of the last iteration of a point, 3 in each other iteration).
assert j["rank0_ops_issued"] == sum(1 for s in spans if s["rank"] == 0), j["rank0_ops_issued"]
checked = 0
for g in groups:
    for b in sizes:
        full = {"all_reduce": b // 4, "reduce_scatter": b // (4 * g), "all_gather": b // 4,
                "broadcast": b // 4, "send_recv": b // 4}
        checked += sum(full[o] + 3 * (iters + warmup - 1) for o in ops)
assert j["rank0_elements_checked"] == checked, (j["rank0_elements_checked"], checked)
print(f"{n} ranks: {len(spans)} spans, {len(inst)} collectives, {len(rows)} rows checked")
EOF
  ls ./*.rank*.db > /dev/null 2>&1 && fail "per-rank files left behind"
done

# Text table: one section per (op, group size), rows per size.
timeout 60 "$ORRERY" commbench --nproc 2 --min-bytes 4K --max-bytes 8K --iters 1 --ops all_reduce,send_recv \
  --out text.db > text.txt 2> text.err || { fail "text table run"; cat text.err; }
grep -q "^# all_reduce, group size 2" text.txt && grep -q "^# send_recv, group size 2" text.txt \
  && [ "$(grep -cE '^ +(4096|8192) ' text.txt)" -eq 4 ] || { fail "text table"; cat text.txt; }

# An odd group (3 ranks, the default groups for 3): the last rank sits send_recv out (no hang).
if timeout 90 "$ORRERY" commbench --nproc 3 --min-bytes 4K --max-bytes 8K --iters 1 --ops send_recv,all_reduce \
    --out odd.db --json > odd.json 2> odd.err; then
  "$ORRERY" export odd.db --format sqlite --out odd-sql.db > /dev/null 2>&1 || fail "export odd.db"
  python3 - <<'EOF' || fail "odd group: spans"
import sqlite3
db = sqlite3.connect("file:odd-sql.db?mode=ro", uri=True)
per = dict(db.execute("SELECT rank || ':' || kind, COUNT(*) FROM spans GROUP BY rank, kind"))
# all_reduce: 2 sizes x 2 iterations per rank; send_recv: 2 sizes x 2 iterations x (send, recv) on ranks 0, 1.
assert per == {"0:1": 4, "1:1": 4, "2:1": 4, "0:2": 8, "1:2": 8}, per
# send_recv ran last (whatever --ops said), so every all_reduce lines up across the 3 members.
members = [m for (m,) in db.execute("SELECT COUNT(*) FROM spans WHERE kind = 1 GROUP BY comm, seq")]
assert members == [3, 3, 3, 3], members
import json
rows = json.loads(open("odd.json").read().strip().splitlines()[-1])["rows"]
assert [r["instances"] + r["skipped"] for r in rows if r["op"] == "all_reduce"] == [1, 1], rows
EOF
else
  fail "commbench --nproc 3 exited non-zero"; cat odd.err
fi

# Wrong data ends the job loudly: rank 1 corrupts its all_reduce input.
ORRERY_COMMBENCH_CORRUPT_RANK=1 timeout 60 "$ORRERY" commbench --nproc 2 --min-bytes 4K --max-bytes 4K \
  --iters 1 --ops all_reduce --out corrupt.db > corrupt.out 2> corrupt.err
rc=$?
[ $rc -eq 1 ] || fail "corrupted data: exit $rc, expected 1"
grep -q "wrong data after all_reduce on bench.g2\[0-1\].*4096 bytes, iteration 1: element 1023 is 22, expected 21" corrupt.err \
  || { fail "corrupted data: message"; cat corrupt.err; }

# Refused input: exit 2, the message, nothing started or left behind.
expect_input_error() {  # NAME PATTERN COMMAND...
  local name=$1 pattern=$2
  shift 2
  timeout 60 "$@" > "$name.out" 2> "$name.err"
  local rc=$?
  [ $rc -eq 2 ] || fail "$name: exit $rc, expected 2"
  grep -q -- "$pattern" "$name.err" || { fail "$name: message lacks '$pattern'"; cat "$name.err"; }
  [ -e "$name.db" ] && fail "$name: left $name.db"
  return 0
}
expect_input_error nproc1 "--nproc 1: commbench needs at least 2 ranks" "$ORRERY" commbench --nproc 1 --out nproc1.db
expect_input_error nproc0 "--nproc 0: commbench needs at least 2 ranks" "$ORRERY" commbench --nproc 0 --out nproc0.db
expect_input_error nodivide "--groups: group size 3 does not divide the 4 ranks" \
  "$ORRERY" commbench --nproc 4 --groups 2,3 --out nodivide.db
expect_input_error exceeds "--groups: group size 8 exceeds the 4 ranks" \
  "$ORRERY" commbench --nproc 4 --groups 8 --out exceeds.db
expect_input_error groupword "--groups: 'four' is not a whole number" \
  "$ORRERY" commbench --nproc 4 --groups four --out groupword.db
expect_input_error minmax "--min-bytes 65536 is larger than --max-bytes 4096" \
  "$ORRERY" commbench --nproc 2 --min-bytes 64K --max-bytes 4K --out minmax.db
expect_input_error badsize "--min-bytes: size '4Q' has an unknown suffix" \
  "$ORRERY" commbench --nproc 2 --min-bytes 4Q --out badsize.db
expect_input_error badop "--ops: unknown operation 'all_to_all'" \
  "$ORRERY" commbench --nproc 2 --ops all_reduce,all_to_all --out badop.db
expect_input_error iters "--iters 0: at least 1 timed iteration" "$ORRERY" commbench --nproc 2 --iters 0 --out iters.db
expect_input_error no_mpirun "mpirun not found" env PATH=/nonexistent "$ORRERY" commbench --nproc 2 --out no_mpirun.db
# Under mpirun by hand with another --nproc: the ranks exit 2 before MPI_Init.
expect_input_error launcher "--nproc 4, but the launcher started 2 ranks" \
  mpirun -n 2 --oversubscribe --bind-to none "$ORRERY" commbench --nproc 4 --out launcher.db
ls ./*.rank*.db > /dev/null 2>&1 && fail "per-rank files left behind by refused runs"

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "commbench checks passed"
