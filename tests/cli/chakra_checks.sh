#!/usr/bin/env bash
# Chakra execution traces from the command line (traces/chakra.hpp), for a real 2-rank run under
# mpirun and for simulated traces (every rank of a dp 2 x pp 2 pipeline; one representative rank
# per stage):
#  - `orrery export TRACE --format chakra --out P` writes P.<rank>.et per rank with one node per
#    span of that rank (counted against `orrery info`), as many dependencies as `orrery replay`
#    finds edges, and P.comm_groups.json with every communicator's members;
#  - `orrery import chakra P --out B` gives back a trace with the same spans by kind, streams,
#    communicators and ranks; `orrery report --json` of B equals the original's (but for the path
#    and source), and `orrery replay` of B predicts exactly what replay of the original does, with
#    recorded timings and on a cluster;
#  - bad input exits 2 naming the file and the message, and writes no trace: a flipped byte, a
#    truncated file, a missing rank file; an unknown export format exits 2.
# With a third argument `unavailable` (a build without protobuf): both commands exit 2 saying so.
# Usage: chakra_checks.sh ORRERY SOURCE_DIR [unavailable]
set -u
ORRERY=$1
SRC=$2
MODE=${3:-}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
EXPECT_DIR="$TMP"
# shellcheck source=expect.sh
source "$(dirname "$0")/expect.sh"

if [ "$MODE" = unavailable ]; then
  (cd "$TMP" && "$ORRERY" synth --ranks 2 --steps 1 --layers 2 --out s.db) > /dev/null || fail "synth"
  expect 2 "this Orrery was built without protobuf" export s.db --format chakra --out et
  expect 2 "this Orrery was built without protobuf" import chakra et --out back.db
  [ -e "$TMP/back.db" ] && fail "import wrote back.db"
  [ "$fails" -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
  echo "all Chakra checks of a build without protobuf passed"
  exit 0
fi
CLUSTER="$SRC/scenarios/clusters/cpu-local.yaml"

cat > "$TMP/dp2.yaml" <<'EOF'
name: chakra-dp2
model: {layers: 2, d_model: 32, heads: 2, vocab: 64, seq: 16}
training: {steps: 3, global_batch: 4, micro_batch: 2, seed: 7, warmup_steps: 0}
parallel: {dp: 2, tp: 1, pp: 1, bucket_mb: 0.01}
runtime: {threads: 1}
EOF
cat > "$TMP/pp2.yaml" <<'EOF'
name: chakra-pp2
model: {layers: 4, d_model: 32, heads: 2, vocab: 64, seq: 16}
training: {steps: 2, global_batch: 8, micro_batch: 2, seed: 7, warmup_steps: 0}
parallel: {dp: 2, tp: 1, pp: 2, bucket_mb: 0.01, schedule: 1f1b}
runtime: {threads: 1}
EOF

run() { (cd "$TMP" && timeout 300 "$ORRERY" "$@"); }

# The traces: a real run on 2 ranks (mpirun), a simulated pipeline with every rank, and the
# same simulation with one representative rank per stage (ranks 0 and 2 only).
run run dp2.yaml --nproc 2 --out real.db > "$TMP/run.log" 2>&1 || { fail "orrery run"; tail -20 "$TMP/run.log"; }
run sim pp2.yaml --all-ranks --steps 2 --out simall.db > "$TMP/sim.log" 2>&1 || { fail "orrery sim --all-ranks"; tail "$TMP/sim.log"; }
run sim pp2.yaml --steps 2 --out simrep.db > "$TMP/sim.log" 2>&1 || { fail "orrery sim"; tail "$TMP/sim.log"; }

for name in real simall simrep; do
  mkdir -p "$TMP/et"
  expect 0 "Chakra execution trace" export $name.db --format chakra --out et/$name
  run export $name.db --format chakra --out et/$name --json > "$TMP/$name.export.json" 2>&1 || fail "export --json $name"
  run info $name.db --json > "$TMP/$name.info.json" 2>&1 || fail "info $name"
  expect 0 "imported" import chakra et/$name --out $name.back.db
  run import chakra et/$name --out $name.back2.db --json > "$TMP/$name.import.json" 2>&1 || fail "import --json $name"
  run info $name.back.db --json > "$TMP/$name.back.info.json" 2>&1 || fail "info $name.back"
  run export $name.db --format sqlite --out $name.sql.db > /dev/null 2>&1 || fail "export sqlite $name"
  run export $name.back.db --format sqlite --out $name.back.sql.db > /dev/null 2>&1 || fail "export sqlite $name.back"
  run report $name.db --json > "$TMP/$name.report.json" 2>&1 || fail "report $name"
  run report $name.back.db --json > "$TMP/$name.back.report.json" 2>&1 || fail "report $name.back"
  for mode in identity cluster; do
    args=(--identity)
    [ $mode = cluster ] && args=(--cluster "$CLUSTER")
    run replay $name.db "${args[@]}" --json > "$TMP/$name.replay.$mode.json" 2>&1 || fail "replay $name $mode"
    run replay $name.back.db "${args[@]}" --json > "$TMP/$name.back.replay.$mode.json" 2>&1 \
      || { fail "replay $name.back $mode"; cat "$TMP/$name.back.replay.$mode.json"; }
  done
  if python3 - "$TMP" $name <<'EOF'
import json, os, sys
tmp, name = sys.argv[1], sys.argv[2]
load = lambda f: json.load(open(os.path.join(tmp, f)))
ex, info, back = load(name + ".export.json"), load(name + ".info.json"), load(name + ".back.info.json")
imp = load(name + ".import.json")
# One node per span, per rank.
spans_by_rank = {}
for s in info["streams"]:
    spans_by_rank[str(s["rank"])] = spans_by_rank.get(str(s["rank"]), 0) + s["spans"]
spans_by_rank = {r: n for r, n in spans_by_rank.items() if n > 0}
assert ex["nodes_by_rank"] == spans_by_rank, (ex["nodes_by_rank"], spans_by_rank)
assert ex["nodes"] == info["span_count"] == back["span_count"] == imp["spans"], (ex["nodes"], info["span_count"], back["span_count"])
assert len(ex["files"]) == len(spans_by_rank) + 1, ex["files"]
# Dependencies: replay's edges, and the imported trace's replay graph is the same.
for mode in ("identity", "cluster"):
    a, b = load(name + ".replay." + mode + ".json"), load(name + ".back.replay." + mode + ".json")
    assert ex["data_deps"] == a["edges"] == b["edges"], (ex["data_deps"], a["edges"], b["edges"])
    a.pop("trace"); b.pop("trace")
    assert a == b, (mode, a, b)
    print(name, mode, "replayed step", a["replayed_step_ns"], "ns, edges", a["edges"],
          "collectives", a["collectives"], "transfers", a["transfers"])
# Every span exactly: times (ns), kind, name, step, micro-batch, layer, bytes, FLOPs, communicator,
# peer, sequence number, op, in the same order.
import sqlite3
def spans(db):
    c = sqlite3.connect(os.path.join(tmp, db))
    return c.execute("SELECT s.rank, s.stream, s.kind, t.text, s.start_ns, s.end_ns, s.step, s.micro_batch, "
                     "s.layer, s.bytes, s.flops, s.comm, s.peer, s.seq, s.op FROM spans s "
                     "JOIN strings t ON t.id = s.name ORDER BY s.id").fetchall()
sa, sb = spans(name + ".sql.db"), spans(name + ".back.sql.db")
assert len(sa) == ex["nodes"] and sa == sb, [(x, y) for x, y in zip(sa, sb) if x != y][:3]
assert sum(1 for r in sa if r[9] > 0) > 0 and sum(1 for r in sa if r[10] > 0) > 0, "no bytes or FLOPs to compare"
# Streams, communicators, ranks and metadata kept.
for key in ("streams", "communicators", "ranks", "world_size", "layout", "tokens_per_step",
            "model_flops_per_step", "peak_flops_per_rank", "scenario_name", "counter_count"):
    assert info[key] == back[key], (key, info[key], back[key])
assert back["source"] == "import", back["source"]
groups = json.load(open(os.path.join(tmp, "et", name + ".comm_groups.json")))
assert groups == {str(c["id"]): c["ranks"] for c in info["communicators"]}, groups
# The report of the import is the original's.
ra, rb = load(name + ".report.json"), load(name + ".back.report.json")
assert rb["origin"] == "import", rb["origin"]
for r in (ra, rb):
    r.pop("trace"); r.pop("source"); r.pop("origin")  # an import's own, as it should be
assert ra == rb, "report differs"
print(name, "nodes", ex["nodes"], "per rank", ex["nodes_by_rank"], "deps", ex["data_deps"])
EOF
  then echo "ok: $name: nodes = spans per rank, deps = replay edges, report and replay of the import equal the original's"
  else fail "$name round trip"; fi
done
# The pipeline's sends and receives made it through, with their peers.
grep -q '"p2p": 32' "$TMP/simall.import.json" || { fail "simall import lacks its 32 p2p spans"; cat "$TMP/simall.import.json"; }

# Bad input: exit 2 naming the file and the message; no trace written.
cp "$TMP/et/real.1.et" "$TMP/good.et"
python3 - "$TMP/et/real.1.et" <<'EOF'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0x10
open(p, "wb").write(bytes(b))
EOF
expect 2 "et/real.1.et: message " import chakra et/real --out bad.db
[ -e "$TMP/bad.db" ] && fail "a failed import left bad.db"
head -c $(( $(stat -c %s "$TMP/good.et") - 50 )) "$TMP/good.et" > "$TMP/et/real.1.et"
expect 2 "et/real.1.et: message " import chakra et/real --out bad.db
grep -qF "truncated" "$TMP/out" || fail "truncated file: the message does not say so"
[ -e "$TMP/bad.db" ] && fail "a failed import left bad.db"
rm "$TMP/et/real.1.et"
expect 2 "et/real.1.et: missing" import chakra et/real --out bad.db
expect 2 "et/real.1.et: missing" import chakra et/real.0.et --out bad.db
expect 2 "et/none: no such file, and no Chakra files et/none.<rank>.et" import chakra et/none --out bad.db
[ -e "$TMP/bad.db" ] && fail "a failed import left bad.db"
expect 2 "unknown export format, expected chrome, sqlite or chakra" export real.db --format astra --out x
expect 2 "import format 'astra': expected kineto, nsys or chakra" import astra et/real --out bad.db

if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all Chakra checks passed"
