# Shared by the mpirun check scripts that train the tiny dense model (checkpoint_checks.sh,
# compression_checkpoint_checks.sh, elastic_checks.sh). Source it after setting ORRERY and WORK:
# it makes WORK afresh and works in it, lets mpirun run as root, counts failures in $failures
# (fail MESSAGE), writes tiny.yaml (tiny_yaml STEPS EVERY: dp2, a checkpoint every EVERY steps)
# with 6 steps and a checkpoint every 3, and defines run NAME ARGS...: orrery run tiny.yaml ARGS
# --json > NAME.json 2> NAME.err within RUN_TIMEOUT seconds (default 120), its exit status.
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

tiny_yaml() {
  cat > tiny.yaml <<YAML
name: tiny
model: {layers: 2, d_model: 32, heads: 2, vocab: 64, seq: 16}
training: {steps: $1, global_batch: 8, micro_batch: 2, seed: 7, lr: 1.0e-3, warmup_steps: 0}
parallel: {dp: 2, bucket_mb: 0.01}
runtime: {threads: 1}
checkpoint: {every: $2}
YAML
}
tiny_yaml 6 3

run() {
  local name=$1
  shift
  timeout "${RUN_TIMEOUT:-120}" "$ORRERY" run tiny.yaml --json "$@" > "$name.json" 2> "$name.err"
}
