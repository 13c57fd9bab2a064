#!/usr/bin/env bash
# Calibration from a GPU trace from the command line (sim/calibrate.hpp step 5): a hand-written
# Kineto trace of one H100 (tests/data/calibrate/make_kineto_h100_fixture.py: gemm ceiling 0.80,
# attention 0.62, elementwise 0.90, layernorm 0.75, softmax_loss 0.70, optimizer 0.78, 4.5 us per
# kernel, a GEMM iteration latency of 96 cycles) is imported, calibrated (every parameter fitted, to
# 4 decimals; the GEMM ceiling, fitted with the latency, to 0.0001 and the latency to 0.1 %, as the
# kernel times are whole nanoseconds) and used to simulate
# GPT-3 175B on 1,024 H100s; the same trace without shapes fits nothing and says which defaults it
# kept; a device that is not a GPU preset exits 2.
# Usage: calibrate_gpu_checks.sh ORRERY SOURCE_DIR
set -u
ORRERY=$1
SRC=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
EXPECT_DIR="$TMP"
# shellcheck source=expect.sh
source "$(dirname "$0")/expect.sh"
DATA="$SRC/tests/data/calibrate"

expect 0 "1 rank, 115 spans" import kineto "$DATA/kineto_h100_calib.json" --out h100.trace
expect 0 "(H100-SXM, bf16)" calibrate h100.trace --out h100.yaml
for want in "overhead_us                           4.5000  fitted" \
            "attention.flops_efficiency            0.6200  fitted" \
            "elementwise.bandwidth_efficiency      0.9000  fitted" \
            "layernorm.bandwidth_efficiency        0.7500  fitted" \
            "softmax_loss.bandwidth_efficiency     0.7000  fitted" \
            "optimizer.bandwidth_efficiency        0.7800  fitted"; do
  grep -qF -- "$want" "$TMP/out" || fail "calibrate output lacks '$want'"
done
for want in "gemm.flops_efficiency +0\.800[01]  fitted from 18 kernels" \
            "gemm_shape.iteration_latency_cycles +9(5\.9|6\.0)[0-9]*  fitted from 18 kernels"; do
  grep -qE -- "$want" "$TMP/out" || fail "calibrate output lacks '$want'"
done
grep -q "^# fit: gemm.flops_efficiency .* from 18 kernels of h100.trace" "$TMP/h100.yaml" ||
  fail "h100.yaml does not say where the gemm ceiling came from"
expect 0 "hardware profile h100" sim "$SRC/scenarios/gpt3-175b.yaml" \
  --cluster "$SRC/scenarios/clusters/h100-1024.yaml" --hw h100.yaml
expect 0 '"fitted": true' calibrate h100.trace --out h100j.yaml --json
# --check: the fitted profile prices its own trace (nothing fitted, nothing written); without
# --out or --check calibrate exits 2.
expect 0 "checked against 1 trace(s)" calibrate h100.trace --check h100.yaml
grep -qF "aten::mm" "$TMP/out" || fail "--check printed no operator rows"
expect 2 "--out PROFILE is required" calibrate h100.trace

expect 0 "1 rank" import kineto "$DATA/kineto_h100_noshapes.json" --out plain.trace
expect 0 "gemm.flops_efficiency not fitted" calibrate plain.trace --out plain.yaml
grep -qF "record_shapes=True" "$TMP/out" || fail "no hint to record shapes"
# The overhead, six class rates, the GEMMs' bandwidth and kernel latency, the iteration latency
# and the L2 operand rate.
[ "$(grep -c "NOT FITTED" "$TMP/plain.yaml")" -eq 11 ] || fail "plain.yaml does not list 11 unfitted parameters"
expect 2 "is not a GPU preset" calibrate plain.trace --out bad.yaml --device cpu
[ -e "$TMP/bad.yaml" ] && fail "a failed calibrate wrote bad.yaml"

[ "$fails" -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all GPU calibration checks passed"
