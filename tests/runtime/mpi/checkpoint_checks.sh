#!/usr/bin/env bash
# Checkpoints and resume end to end under mpirun (CTest runtime_mpi_checkpoint, label mpi):
#  1. dp2, 6 steps, a checkpoint every 3: uninterrupted (reference) against killed after the
#     checkpoint of step 3 (faults.kill_after_step, a real SIGKILL) and resumed with --resume: the
#     losses of steps 4..6 and the step-6 checkpoint (parameters and moments, byte for byte) are
#     identical; the same with background writes, and with ZeRO 1.
#  2. Resharding: the dp2 step-3 checkpoint resumed on dp1, and the ZeRO-1 one on dp1 (zero 0): the
#     first loss equals the reference's step-4 loss within 1e-6 relative (not bit-identical: dp1
#     sums the same sequences in another grouping). A dp1 checkpoint resumed on dp2 with ZeRO 1.
#     ZeRO 1 with zero.overlap_grad_reduce (per-bucket parts) killed and resumed bit for bit, and
#     its checkpoint resumed without the key and the other way round.
#  3. A damaged checkpoint is refused (exit 2, the file named), a partial newer one skipped, a tp
#     change refused naming parallel.tp.
# Usage: checkpoint_checks.sh ORRERY_BINARY WORK_DIR
set -uo pipefail
ORRERY=$1
WORK=$2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tiny_run_checks.sh
source "$HERE/tiny_run_checks.sh"
# Python: losses of a run's JSON from its first step; the manifest's files by name.
cat > check.py <<'EOF'
import json, sys
def run(name):
    return json.loads(open(name + ".json").read().strip().splitlines()[-1])
def files(step_dir):
    m = json.load(open(step_dir + "/manifest.json"))
    return {f["name"]: (f["bytes"], f["crc32c"]) for f in m["files"]}
EOF

kill_and_resume() {  # NAME EXTRA_SETS... : reference vs killed at step 3 + resumed
  local name=$1
  shift
  run "$name-ref" --nproc 2 --no-profile --set checkpoint.dir="$name-ref" "$@" \
    || { fail "$name: reference run"; cat "$name-ref.err"; return; }
  run "$name-killed" --nproc 2 --no-profile --set checkpoint.dir="$name" --set faults.kill_after_step=3 "$@"
  local rc=$?
  [ $rc -ne 0 ] || fail "$name: the run with faults.kill_after_step=3 was not killed"
  [ -f "$name/step-3/manifest.json" ] || fail "$name: no complete step-3 checkpoint before the kill"
  [ ! -f "$name/step-6/manifest.json" ] || fail "$name: the killed run went on to step 6"
  run "$name-resumed" --nproc 2 --no-profile --resume "$name" "$@" \
    || { fail "$name: resumed run"; cat "$name-resumed.err"; return; }
  grep -q "resuming from $name/step-3" "$name-resumed.err" || fail "$name: no 'resuming from' line"
  python3 - "$name" <<'EOF' || fail "$name: resumed run differs from the uninterrupted one"
import sys; sys.path.insert(0, ".")
from check import run, files
n = sys.argv[1]
ref, res = run(n + "-ref"), run(n + "-resumed")
assert res["first_step"] == 3 and len(res["loss"]) == 3, res
assert ref["loss"][3:] == res["loss"], (ref["loss"], res["loss"])  # bit-identical floats
a, b = files(n + "-ref/step-6"), files(n + "/step-6")
assert a == b and a, (a, b)
print(n, "steps 4..6 losses", res["loss"], "step-6 files", a)
EOF
  for f in "$name-ref"/step-6/*.bin; do
    cmp -s "$f" "$name/step-6/$(basename "$f")" || fail "$name: $(basename "$f") differs"
  done
}

# 1. Kill and resume, bit for bit.
kill_and_resume fg
kill_and_resume bg --set checkpoint.background=true
kill_and_resume zero1 --set parallel.zero=1
# ZeRO 1 per bucket (zero.overlap_grad_reduce): each rank saves its part of every bucket.
ZOVERLAP=(--set zero.overlap_grad_reduce=true --set zero.overlap_param_gather=true)
kill_and_resume zero1-overlap --set parallel.zero=1 "${ZOVERLAP[@]}"
# A profiled run's trace holds the checkpoint phases (the write on its own stream in background).
if run traced --nproc 2 --out traced.db --set checkpoint.dir=traced --set checkpoint.background=true \
   && "$ORRERY" export traced.db --format chrome --out traced.json > /dev/null 2>&1; then
  grep -q '"checkpoint.save"' traced.json || fail "no checkpoint.save span in the trace"
  grep -q '"checkpoint.write"' traced.json || fail "no checkpoint.write span in the trace"
else
  fail "profiled run with checkpoints"; cat traced.err
fi
python3 -c "
import sys; sys.path.insert(0, '.')
from check import run
c = run('fg-ref')['checkpoint']
assert c['saves'] == 2 and c['written'] == ['fg-ref/step-3', 'fg-ref/step-6'] and c['bytes'] > 0, c
" || fail "checkpoint figures in --json"

# 2. Resharding: dp2 -> dp1, ZeRO-1 dp2 -> dp1, dp1 -> ZeRO-1 dp2.
reshard() {  # NAME CHECKPOINT REFERENCE_RUN ARGS...
  local name=$1 ckpt=$2 ref=$3
  shift 3
  run "$name" --no-profile --resume "$ckpt" --set checkpoint.every=0 "$@" \
    || { fail "$name: resharded run"; cat "$name.err"; return; }
  python3 - "$name" "$ref" <<'EOF' || fail "$name: first loss differs from the reference"
import sys; sys.path.insert(0, ".")
from check import run
res, ref = run(sys.argv[1]), run(sys.argv[2])
a, b = res["loss"][0], ref["loss"][3]
assert res["first_step"] == 3, res
assert abs(a - b) <= 1e-6 * abs(b), (a, b)
print(sys.argv[1], "first loss", a, "reference", b, "relative", abs(a - b) / abs(b))
EOF
}
reshard dp1 fg-ref/step-3 fg-ref --nproc 1 --set parallel.dp=1
reshard zero1-dp1 zero1-ref/step-3 zero1-ref --nproc 1 --set parallel.dp=1
# The per-bucket parts resumed as one contiguous shard and the other way round (ZeRO 1, dp2).
reshard zero1-overlap-off zero1-overlap-ref/step-3 zero1-ref --nproc 2 --set parallel.zero=1
reshard zero1-overlap-on zero1-ref/step-3 zero1-ref --nproc 2 --set parallel.zero=1 "${ZOVERLAP[@]}"
run serial --nproc 1 --no-profile --set parallel.dp=1 --set checkpoint.dir=serial \
  || { fail "dp1 reference run"; cat serial.err; }
reshard dp2-zero1 serial/step-3 serial --nproc 2 --set parallel.zero=1

# 3. Damage, partial, a tp change.
expect_input_error() {  # NAME PATTERN ARGS...
  local name=$1 pattern=$2
  shift 2
  run "$name" "$@"
  local rc=$?
  [ $rc -eq 2 ] || fail "$name: exit $rc, expected 2"
  grep -q -- "$pattern" "$name.err" || { fail "$name: message lacks '$pattern'"; cat "$name.err"; }
}
cp -r fg-ref damaged
printf '\x55' | dd of=damaged/step-6/tp0-pp0-dp0.bin bs=1 seek=100 conv=notrunc status=none
expect_input_error damaged "tp0-pp0-dp0.bin' fails its checksum" --nproc 2 --no-profile --resume damaged/step-6
cp -r fg-ref partial
rm partial/step-6/manifest.json
run partial --nproc 2 --no-profile --resume partial --set training.steps=7 --set checkpoint.every=0 \
  || { fail "partial: resume"; cat partial.err; }
grep -q "skipped checkpoint 'partial/step-6': no manifest.json" partial.err || { fail "partial: no skip message"; cat partial.err; }
grep -q "resuming from partial/step-3" partial.err || fail "partial: did not resume from step-3"
expect_input_error tp2 "key 'parallel.tp': the checkpoint was written with parallel.tp=1" \
  --nproc 2 --no-profile --resume fg-ref --set parallel.dp=1 --set parallel.tp=2 --set training.steps=8

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checkpoint checks passed"
