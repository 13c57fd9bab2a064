#!/usr/bin/env bash
# NVMe offload end to end (CTest runtime_mpi_offload, label mpi): `orrery run` of a 2-rank ZeRO 1
# gpt-tiny with zero.offload_optimizer nvme gives the losses of the same run without offload, bit
# for bit (the --json loss arrays), records offload.read / offload.write spans on the stream
# "offload" and the mem.offload_nvme counter, and leaves nvme_path empty; a file that vanishes
# mid-run (test-only faults.offload_remove_rank) stops the job within a deadline, non-zero, with
# the path in the message, the trace of the steps before saved and no file left behind; bad
# input exits 2 naming the key.
# Usage: offload_checks.sh ORRERY_BINARY SOURCE_DIR WORK_DIR
set -uo pipefail
ORRERY=$1
SRC=$2
WORK=$3
rm -rf "$WORK" && mkdir -p "$WORK/nvme" && cd "$WORK" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

SETS=(--set model.layers=1 --set model.d_model=32 --set model.heads=2 --set model.vocab=64
      --set model.seq=16 --set training.global_batch=8 --set training.micro_batch=2
      --set training.steps=4 --set parallel.dp=2 --set parallel.zero=1 --set runtime.threads=1)
NVME=(--set zero.offload_optimizer=nvme --set "zero.nvme_path=$WORK/nvme"
      --set zero.offload_chunk_mb=0.01)
SCEN="$SRC/scenarios/gpt-tiny.yaml"

timeout 120 "$ORRERY" run "$SCEN" --nproc 2 "${SETS[@]}" --json --out ref.db > ref.out 2> ref.err \
  || { fail "run without offload exited non-zero"; cat ref.err; }
timeout 120 "$ORRERY" run "$SCEN" --nproc 2 "${SETS[@]}" "${NVME[@]}" --json --out nvme.db \
  > nvme.out 2> nvme.err || { fail "run with nvme offload exited non-zero"; cat nvme.err; }
python3 - <<'PY' || fail "offload run: losses, spans or counters wrong"
import json, sqlite3, sys
ref = json.load(open("ref.out"))["loss"]
got = json.load(open("nvme.out"))["loss"]
if ref != got:
    sys.exit(f"losses differ: {ref} vs {got}")
db = sqlite3.connect("file:nvme.db?mode=ro", uri=True)
streams = {(r, s): n for r, s, n in db.execute("SELECT rank, stream, name FROM streams")}
if streams.get((0, 6)) != "offload" or streams.get((1, 6)) != "offload":
    sys.exit(f"no offload stream: {streams}")
names = {n for (n,) in db.execute("SELECT text FROM strings")}
for n in ("offload.read", "offload.write", "mem.offload_nvme"):
    if n not in names:
        sys.exit(f"{n} missing from the trace")
print("losses equal; offload stream, spans and counter present")
PY
[ -z "$(ls -A nvme)" ] || fail "offload files left in nvme_path: $(ls nvme)"

start=$(date +%s.%N)
timeout 60 "$ORRERY" run "$SCEN" --nproc 2 "${SETS[@]}" "${NVME[@]}" --json --out gone.db \
  --set faults.offload_remove_rank=1 --set faults.step=2 > gone.out 2> gone.err
rc=$?
elapsed=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")
echo "vanished file: exit $rc after ${elapsed} s (deadline 30 s)"
[ $rc -eq 1 ] || fail "vanished: exit $rc, expected 1"
python3 -c "import sys; sys.exit(0 if $elapsed < 30 else 1)" || fail "vanished: took ${elapsed} s"
grep -E "rank 1: internal error: offload file '$WORK/nvme/orrery-offload-[^']*-rank1.bin' vanished" \
  gone.err > /dev/null || { fail "vanished: stderr does not name the file"; cat gone.err; }
[ -f gone.db ] || fail "vanished: no trace"
python3 - <<'PY' || fail "vanished: the trace does not hold the failure and steps 0-1"
import sqlite3, sys
db = sqlite3.connect("file:gone.db?mode=ro", uri=True)
meta = dict(db.execute("SELECT key, value FROM meta"))
if "during step 2" not in meta.get("failure", ""):
    sys.exit(f"failure meta: {meta.get('failure')}")
steps = {(r, s) for r, s in db.execute("SELECT rank, step FROM steps WHERE step IN (0, 1)")}
if steps != {(0, 0), (0, 1), (1, 0), (1, 1)}:
    sys.exit(f"steps: {sorted(steps)}")
PY
[ -z "$(ls -A nvme)" ] || fail "vanished: offload files left in nvme_path: $(ls nvme)"

# Bad input: exit 2 naming the key, before any rank starts.
bad() {
  local want=$1
  shift
  timeout 60 "$ORRERY" run "$SCEN" --nproc 2 "${SETS[@]}" "$@" > bad.out 2> bad.err
  local rc=$?
  [ $rc -eq 2 ] || fail "bad input ($*): exit $rc, expected 2"
  grep -F "$want" bad.err > /dev/null || { fail "bad input ($*): no '$want'"; cat bad.err; }
}
bad "key 'zero.nvme_path': '$WORK/none' is not an existing directory" \
  --set zero.offload_optimizer=nvme --set "zero.nvme_path=$WORK/none"
bad "key 'zero.offload_optimizer': expected none, host or nvme, got 'ssd'" \
  --set zero.offload_optimizer=ssd
bad "key 'zero.offload_params': 'nvme' offloads ZeRO 3's parameter shards" \
  --set zero.offload_optimizer=nvme --set zero.offload_params=nvme --set "zero.nvme_path=$WORK/nvme"
bad "key 'zero.offload_optimizer': 'host' moves the optimizer state" \
  --set zero.offload_optimizer=host
# The GPU path runs the optimizer's offload (host, nvme) and ZeRO 3's parameter shards in the file;
# the parameter shards without ZeRO 3 are refused there as here (before it needs a GPU or a CUDA
# build).
bad "key 'zero.offload_params': 'nvme' offloads ZeRO 3's parameter shards" \
  --set runtime.device=cuda --set zero.offload_optimizer=nvme \
  --set zero.offload_params=nvme --set "zero.nvme_path=$WORK/nvme"

[ $failures -eq 0 ] && echo "offload checks passed" || echo "$failures offload check(s) failed"
exit $failures
