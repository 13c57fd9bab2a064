#!/usr/bin/env bash
# Checkpoints of runs with gradient compression and fp16 loss scaling under mpirun (CTest
# runtime_mpi_compression_checkpoint, label mpi; issue 18). The checkpoint holds each rank's
# compression hook state (error-feedback residuals, PowerSGD's Q) and the loss scaler's
# (runtime/include/orrery/runtime/checkpoint.hpp), so:
#  1. dp2, 6 steps, a checkpoint every 3, killed after the checkpoint of step 3 and resumed: the
#     losses of steps 4..6, every step-6 file (parameters, moments, compression state) byte for
#     byte and the manifest's compression and loss_scaler objects equal the uninterrupted run's:
#     int8 (ZeRO 0 and 1), top-k, PowerSGD rank 2 (background writes), and fp16 from a loss scale
#     of 2^24 with a window of 2 (steps skipped for overflow before the checkpoint and after it:
#     at step 3 scale 2^21 with 3 skipped, at step 6 2^21 with 4).
#     An elastic restart (--max-restarts, rank 1 killed in step 5) of the PowerSGD run likewise.
#  2. The step-3 checkpoints hold what they should: one state file per dp rank with residuals
#     (PowerSGD: and Q, equal on both dp ranks), the scheme and its parameters; fp16's scaler.
#  3. A checkpoint without compression state resumed with int8, and an int8 one resumed with
#     top-k, and the dp2 int8 one resumed on dp4: the run continues with fresh residuals and says
#     so on stderr. A damaged state file is
#     refused (exit 2) naming it.
# Usage: compression_checkpoint_checks.sh ORRERY_BINARY WORK_DIR
set -uo pipefail
ORRERY=$1
WORK=$2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tiny_run_checks.sh
source "$HERE/tiny_run_checks.sh"

kill_and_resume() {  # NAME EXTRA_SETS... : reference vs killed at step 3 + resumed
  local name=$1
  shift
  run "$name-ref" --nproc 2 --no-profile --set checkpoint.dir="$name-ref" "$@" \
    || { fail "$name: reference run"; cat "$name-ref.err"; return; }
  run "$name-killed" --nproc 2 --no-profile --set checkpoint.dir="$name" \
    --set faults.kill_after_step=3 "$@"
  [ $? -ne 0 ] || fail "$name: the run with faults.kill_after_step=3 was not killed"
  [ -f "$name/step-3/manifest.json" ] || fail "$name: no complete step-3 checkpoint before the kill"
  run "$name-resumed" --nproc 2 --no-profile --resume "$name" "$@" \
    || { fail "$name: resumed run"; cat "$name-resumed.err"; return; }
  grep -q "note:" "$name-resumed.err" && fail "$name: the resumed run lost state: $(cat "$name-resumed.err")"
  python3 - "$name" <<'EOF' || fail "$name: resumed run differs from the uninterrupted one"
import json, sys
n = sys.argv[1]
def run(name):
    return json.loads(open(name + ".json").read().strip().splitlines()[-1])
def manifest(step_dir):
    return json.load(open(step_dir + "/manifest.json"))
ref, res = run(n + "-ref"), run(n + "-resumed")
assert res["first_step"] == 3 and len(res["loss"]) == 3, res
assert ref["loss"][3:] == res["loss"], (ref["loss"], res["loss"])  # bit-identical floats
a, b = manifest(n + "-ref/step-6"), manifest(n + "/step-6")
for key in ("files", "compression", "loss_scaler"):
    assert a.get(key) == b.get(key), (key, a.get(key), b.get(key))
print(n, "steps 4..6 losses", res["loss"], "state", a.get("compression", {}).get("files"),
      a.get("loss_scaler"))
EOF
  for f in "$name-ref"/step-6/*.bin; do
    cmp -s "$f" "$name/step-6/$(basename "$f")" || fail "$name: $(basename "$f") differs"
  done
}

# 1. Kill and resume, bit for bit.
kill_and_resume int8 --set parallel.grad_compression=int8
kill_and_resume int8-zero1 --set parallel.grad_compression=int8 --set parallel.zero=1
kill_and_resume topk --set parallel.grad_compression=topk --set compression.topk_ratio=0.05
kill_and_resume powersgd-bg --set parallel.grad_compression=powersgd \
  --set compression.powersgd_rank=2 --set checkpoint.background=true
kill_and_resume fp16 --set runtime.precision=fp16 --set training.loss_scale=16777216 \
  --set training.loss_scale_window=2

# An elastic restart (--max-restarts) on the same ranks goes through the same resume: PowerSGD,
# rank 1 killed at the start of step 5, resumed from step 3, bit for bit.
run el-psgd --nproc 2 --out el-psgd.db --set checkpoint.dir=el-psgd --max-restarts 1 \
  --set faults.kill_rank=1 --set faults.step=5 --set parallel.grad_compression=powersgd \
  --set compression.powersgd_rank=2
rc=$?
[ $rc -eq 0 ] || { fail "el-psgd: exit $rc, expected 0"; cat el-psgd.err; }
grep -q "resuming from el-psgd/step-3" el-psgd.err || fail "el-psgd: not restarted from step 3"
python3 - <<'EOF' || fail "el-psgd: the restarted job differs from the uninterrupted one"
import json
def run(name):
    return json.loads(open(name + ".json").read().strip().splitlines()[-1])
ref, el = run("powersgd-bg-ref"), run("el-psgd")
assert el["first_step"] == 3 and ref["loss"][3:] == el["loss"], (ref["loss"], el["loss"])
print("el-psgd steps 4..6 losses", el["loss"])
EOF
for f in powersgd-bg-ref/step-6/*.bin; do
  cmp -s "$f" "el-psgd/step-6/$(basename "$f")" || fail "el-psgd: $(basename "$f") differs"
done

# 2. What the step-3 checkpoints hold.
python3 - <<'EOF' || fail "step-3 checkpoints: compression or loss scaler state"
import json, struct
def manifest(d):
    return json.load(open(d + "/manifest.json"))
for name, scheme in (("int8", "int8"), ("topk", "topk"), ("powersgd-bg", "powersgd")):
    c = manifest(name + "/step-3")["compression"]
    assert c["scheme"] == scheme and c["start_step"] == 0, c
    files = sorted(c["files"], key=lambda f: f["dp"])
    assert [f["name"] for f in files] == ["tp0-pp0-dp0.compression.bin",
                                          "tp0-pp0-dp1.compression.bin"], files
    blobs = [open(name + "/step-3/" + f["name"], "rb").read() for f in files]
    for f, b in zip(files, blobs):
        assert len(b) == 4 * (f["residual_elems"] + f["q_elems"]) and f["residual_elems"] > 0, f
        res = struct.unpack_from("<%df" % f["residual_elems"], b)
        assert any(x != 0 for x in res), (name, "all residuals zero")
    if scheme == "powersgd":
        assert c["powersgd_rank"] == 2 and files[0]["q_elems"] > 0, c
        q0, q1 = (b[4 * f["residual_elems"]:] for f, b in zip(files, blobs))
        assert q0 == q1, "PowerSGD's Q differs between the dp replicas"
    else:
        assert files[0]["q_elems"] == 0, files
    assert blobs[0] != blobs[1], (name, "the dp ranks' residuals are equal")
m3, m6 = manifest("fp16/step-3"), manifest("fp16-ref/step-6")
s3, s6 = m3["loss_scaler"], m6["loss_scaler"]
assert s3["skipped_steps"] >= 1 and s3["scale"] < 16777216, s3
assert s6 != s3, (s3, s6)  # the scaler's state changes after the checkpoint
assert "compression" not in m3, m3.keys()
print("step-3 state ok; fp16 scaler at step 3", s3, "at step 6", s6)
EOF

# 3. State that does not fit: fresh residuals, said on stderr.
# (fp16's step-3 checkpoint holds no compression state; resumed in fp32, its scaler is not used.)
run plain-int8 --nproc 2 --no-profile --resume fp16/step-3 --set checkpoint.dir=plain-int8 \
  --set parallel.grad_compression=int8 || fail "a checkpoint without compression state resumed with int8"
grep -q "note: .*error-feedback residuals start at zero: the checkpoint holds no compression state" \
  plain-int8.err || fail "plain-int8: no note about fresh residuals: $(cat plain-int8.err)"
run int8-topk --nproc 2 --no-profile --resume int8/step-3 --set checkpoint.dir=int8-topk \
  --set parallel.grad_compression=topk || fail "int8 checkpoint resumed with topk"
grep -q "note: .*residuals start at zero: it was written with parallel.grad_compression int8" \
  int8-topk.err || fail "int8-topk: no note about the other scheme: $(cat int8-topk.err)"

# Another dp (an elastic restart on more or fewer ranks): the dp2 int8 checkpoint on dp4 (4 ranks).
OMPI_MCA_rmaps_base_oversubscribe=1 run int8-dp4 --nproc 4 --no-profile --resume int8/step-3 \
  --set checkpoint.dir=int8-dp4 --set parallel.dp=4 --set parallel.grad_compression=int8 \
  || fail "int8 dp2 checkpoint resumed on dp4: $(cat int8-dp4.err)"
grep -q "note: .*residuals start at zero: it was written with parallel.dp 2" int8-dp4.err \
  || fail "int8-dp4: no note about the other dp: $(cat int8-dp4.err)"

# A damaged state file: refused (exit 2) naming it, as a damaged shard is.
mkdir -p damaged && cp -r int8/step-3 damaged/step-3
printf '\x55' | dd of=damaged/step-3/tp0-pp0-dp1.compression.bin bs=1 seek=100 conv=notrunc status=none
run damaged --nproc 2 --no-profile --resume damaged/step-3 --set parallel.grad_compression=int8
rc=$?
[ $rc -eq 2 ] || fail "damaged: exit $rc, expected 2"
grep -q "tp0-pp0-dp1.compression.bin' fails its checksum" damaged.err \
  || fail "damaged: message lacks the file: $(cat damaged.err)"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all compression checkpoint checks passed"
