#!/usr/bin/env bash
# Orrery under a real Slurm (CTest cli_slurm, labels slurm;mpi;cli): a private single-node cluster
# (deploy/slurm/local-cluster: munged, slurmctld, slurmd with a generated configuration) runs
#  1. deploy/slurm/orrery-run.sbatch with 4 tasks (dp 2, tp 2): srun --mpi=pmix starts the ranks;
#     the trace has 4 ranks and 16 step rows, the Slurm job (its id, step, tasks, node) in the run's
#     metadata and in `orrery report`, and the final loss of the same run started by mpirun, bit
#     for bit;
#  2. `orrery run --nproc 4` inside a batch script (mpirun within the allocation): the same loss;
#  3. deploy/slurm/orrery-sweep.sbatch with 2 tasks: the table and CSV one process prints;
#  4. `orrery commbench` under srun: a merged trace of 2 ranks;
#  5. bad input: a 4-rank layout in an allocation of 2 tasks (exit 2 naming the allocation and the
#     layout, before any rank starts), srun of 2 tasks for a 4-rank layout (exit 2 naming srun's
#     tasks), srun without a PMI plugin (exit 2 naming --mpi=pmix, not MPI's abort).
# Exits 77 (skipped) with the reason when Slurm cannot start on this machine (not installed, not
# root, a daemon that does not come up).
# Usage: slurm_checks.sh ORRERY SOURCE_DIR
set -u
ORRERY=$1
SRC=$2
WORK=$(mktemp -d /tmp/orrery-slurm.XXXXXX)
chmod 755 "$WORK"
CLUSTER=$WORK/cluster
cleanup() { "$SRC/deploy/slurm/local-cluster" stop "$CLUSTER"; rm -rf "$WORK"; }
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
line=$("$SRC/deploy/slurm/local-cluster" start "$CLUSTER" --cpus 4 2> "$WORK/start.err")
rc=$?
if [ $rc != 0 ]; then
  cat "$WORK/start.err"
  [ $rc = 3 ] && { echo "SKIPPED: $(tail -1 "$WORK/start.err")"; exit 77; }
  exit 1
fi
eval "$line"
echo "ok: a private Slurm is up ($SLURM_CONF)"
cd "$WORK" || exit 1
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# The final_loss of the last JSON line of a file (orrery run --json prints one per run).
final_loss() {
  grep '^{' "$1" 2> /dev/null | tail -1 |
    python3 -c 'import json,sys; print(repr(json.loads(sys.stdin.read())["final_loss"]))' 2> /dev/null
}
count() {  # count TRACE SQL
  python3 -c 'import sqlite3,sys; print(sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True).execute(sys.argv[2]).fetchone()[0])' "$1" "$2" 2> /dev/null
}
# sjob NAME SBATCH-ARGS... : sbatch --wait; the job's exit status; its output in NAME.out.
sjob() {
  local name=$1
  shift
  timeout 300 sbatch --wait --output="$WORK/$name.out" "$@" > "$WORK/$name.sbatch" 2>&1
}

cat > tiny.yaml << 'YAML'
name: tiny
model: {layers: 2, d_model: 32, heads: 2, vocab: 64, seq: 16}
training: {steps: 4, global_batch: 8, micro_batch: 2, seed: 7, lr: 1.0e-3, warmup_steps: 0}
parallel: {dp: 2, tp: 2, bucket_mb: 0.01}
runtime: {threads: 1}
YAML

# The reference: the same layout started by mpirun, outside Slurm.
(unset SLURM_CONF; timeout 300 "$ORRERY" run tiny.yaml --nproc 4 --json --out ref.db > ref.json 2> ref.err) ||
  { fail "the mpirun reference run"; cat ref.err; }
ref_loss=$(final_loss ref.json)
[ -n "$ref_loss" ] || fail "no final loss from the mpirun reference run"

# 1. The run template: 4 tasks through srun --mpi=pmix.
if SCENARIO=tiny.yaml OUT=$WORK/srun.db ORRERY=$ORRERY ORRERY_ARGS="--json" \
  sjob run --chdir="$WORK" --nodes=1 --ntasks-per-node=4 "$SRC/deploy/slurm/orrery-run.sbatch"; then
  job=$(grep -o '[0-9]\+' run.sbatch | tail -1)
  if python3 - "$job" > run.check 2>&1 << 'PY'; then
import json, sqlite3, sys
job = sys.argv[1]
db = sqlite3.connect("file:srun.db?mode=ro", uri=True)
meta = dict(db.execute("SELECT key, value FROM meta"))
ranks = db.execute("SELECT COUNT(*) FROM ranks").fetchone()[0]
assert ranks == 4, f"{ranks} ranks in the trace, expected 4"
extra = json.loads(meta["extra_json"])
sl = extra.get("slurm")
assert sl, f"no slurm object in the run metadata: {sorted(extra)}"
assert sl["job_id"] == job, f"slurm job {sl['job_id']} in the trace, sbatch said {job}"
assert sl["step_id"] == "0", f"step {sl['step_id']}, expected 0 (the job's first srun)"
assert sl["tasks"] == 4 and sl["nodes"] == 1, sl
print(f"Slurm job {job} step 0, 4 tasks on 1 node in the trace's metadata")
PY
    echo "ok: run template: $(cat run.check)"
  else
    fail "run template: $(cat run.check)"; cat run.out
  fi
  grep -q "scheduler *Slurm job $job step 0: 4 tasks on 1 node" run.out &&
    echo "ok: run template: orrery report shows the Slurm job" ||
    fail "run template: orrery report does not show 'Slurm job $job step 0: 4 tasks on 1 node'"
  srun_loss=$(final_loss run.out)
  [ -n "$ref_loss" ] && [ "$srun_loss" = "$ref_loss" ] &&
    echo "ok: run template: final loss $srun_loss, the mpirun run's bit for bit" ||
    fail "run template: final loss '$srun_loss', the mpirun run's '$ref_loss'"
  a=$(count srun.db "SELECT COUNT(*) FROM steps")
  b=$(count ref.db "SELECT COUNT(*) FROM steps")
  [ "$a" = 16 ] && [ "$b" = 16 ] && echo "ok: run template: 4 steps on each of 4 ranks, as under mpirun" ||
    fail "run template: $a step rows (mpirun: $b), expected 16"
else
  fail "run template: sbatch failed"; cat run.sbatch run.out
fi

# 2. mpirun inside the batch script takes the allocation's slots.
cat > mpirun-in-job.sh << EOF
#!/usr/bin/env bash
"$ORRERY" run tiny.yaml --nproc 4 --json --out mpirun-in-job.db
EOF
if sjob mpirun --chdir="$WORK" --ntasks=4 mpirun-in-job.sh; then
  loss=$(final_loss mpirun.out)
  [ -n "$ref_loss" ] && [ "$loss" = "$ref_loss" ] &&
    echo "ok: orrery run --nproc 4 inside sbatch: final loss $loss, bit for bit" ||
    fail "orrery run --nproc 4 inside sbatch: final loss '$loss', expected '$ref_loss'"
else
  fail "orrery run --nproc 4 inside sbatch: the job failed"; cat mpirun.out
fi

# 3. The sweep template: 2 tasks print the one-process table.
(unset SLURM_CONF; cd "$SRC" && timeout 300 "$ORRERY" sweep scenarios/gpt3-175b.yaml --gpus 512,1024 \
  --cluster scenarios/clusters/h100-16384.yaml --quiet --csv "$WORK/sweep1.csv") > sweep1.txt 2> sweep1.err ||
  { fail "one-process sweep"; cat sweep1.err; }
if SCENARIO=scenarios/gpt3-175b.yaml GPUS=512,1024 CLUSTER=scenarios/clusters/h100-16384.yaml \
  CSV=$WORK/sweepn.csv ORRERY=$ORRERY sjob sweep --chdir="$SRC" --ntasks=2 "$SRC/deploy/slurm/orrery-sweep.sbatch"; then
  if diff <(grep -v "^CSV written" sweep1.txt) <(grep -v "^CSV written" sweep.out) > sweep.diff &&
    cmp -s sweep1.csv sweepn.csv && [ "$(wc -l < sweep1.csv)" -ge 2 ]; then
    echo "ok: sweep template: 2 tasks print the one-process table and CSV ($(($(wc -l < sweep1.csv) - 1)) rows)"
  else
    fail "sweep template: the table or CSV differs"; head -20 sweep.diff
  fi
else
  fail "sweep template: the job failed"; cat sweep.sbatch sweep.out
fi

# 4. commbench under srun.
if timeout 120 srun --mpi=pmix -n 2 "$ORRERY" commbench --ops all_reduce --min-bytes 1024 --max-bytes 4096 \
  --iters 2 --warmup 1 --out cb.db > cb.out 2> cb.err; then
  n=$(count cb.db "SELECT COUNT(*) FROM ranks")
  [ "$n" = 2 ] && echo "ok: commbench under srun: a trace of 2 ranks" || fail "commbench under srun: '$n' ranks in cb.db"
else
  fail "commbench under srun: it failed"; tail -5 cb.err
fi

# 5. Bad input. A layout larger than the allocation: refused before mpirun starts a rank.
cat > small-alloc.sh << EOF
#!/usr/bin/env bash
"$ORRERY" run tiny.yaml --nproc 4 --out small-alloc.db
echo "exit=\$?"
EOF
sjob small --chdir="$WORK" --ntasks=2 small-alloc.sh
if grep -q "the Slurm allocation is smaller than the layout: it holds 2 ranks (SLURM_NTASKS; Slurm job [0-9]*: 2 tasks on 1 node .*), the layout needs 4" small.out &&
  grep -q "^exit=2$" small.out && ! grep -q "^step " small.out && [ ! -e small-alloc.db ]; then
  echo "ok: a 4-rank layout in a 2-task allocation: exit 2 naming both, no rank started"
else
  fail "a 4-rank layout in a 2-task allocation: not refused as expected"; cat small.out
fi
timeout 120 srun --mpi=pmix -n 2 "$ORRERY" run tiny.yaml --out s2.db > s2.out 2> s2.err
rc=$?
if [ $rc = 2 ] && grep -q "srun (Slurm job [0-9]* step [0-9]*: 2 tasks.*) started 2 tasks, but parallel.dp \* tp \* pp = 4" s2.err; then
  echo "ok: srun -n 2 for a 4-rank layout: exit 2 naming srun's tasks"
else
  fail "srun -n 2 for a 4-rank layout: exit $rc"; head -5 s2.err
fi
sed 's/tp: 2, //' tiny.yaml > dp2.yaml
timeout 120 srun --mpi=none -n 2 "$ORRERY" run dp2.yaml --out nopmi.db > nopmi.out 2> nopmi.err
rc=$?
if [ $rc = 2 ] && grep -q "without a PMI plugin.*srun --mpi=pmix" nopmi.err && ! grep -q "MPI_Init" nopmi.err; then
  echo "ok: srun without a PMI plugin: exit 2 naming --mpi=pmix"
else
  fail "srun without a PMI plugin: exit $rc"; head -8 nopmi.err
fi

[ $fails = 0 ] && echo "slurm_checks: all passed" || echo "slurm_checks: $fails failure(s)"
[ $fails = 0 ]
