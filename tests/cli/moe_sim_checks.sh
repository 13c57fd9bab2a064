#!/usr/bin/env bash
# Mixture of experts in `orrery sim` and `orrery sweep` (issue 19 items 5 and 6, the simulator's
# side):
#  - the MoE scenarios of scenarios/moe simulate, print ep in the layout and the exposed ep
#    all-to-all share of the exposed dp time, and carry them in --json;
#  - bad input exits 2 naming the key: ep not dividing dp or the experts, top_k above the experts,
#    a negative capacity factor;
#  - ZeRO 3 with MoE blocks simulates (the experts' states over the edp group in the memory);
#  - sweep --search tries ep and says the all-to-all in its why line;
#  - sim-collective all_to_all prints the (n-1)/n busbw on one node, and auto picks the
#    hierarchical (PXN) plan across rail-optimized nodes.
# Usage: moe_sim_checks.sh ORRERY SOURCE_DIR
set -u
ORRERY=$1
SRC=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
EXPECT_DIR="$SRC"
# shellcheck source=expect.sh
source "$(dirname "$0")/expect.sh"

MIX=scenarios/moe/mixtral-8x7b.yaml
C1024=scenarios/clusters/h100-1024.yaml
expect 0 "layout        dp=64 tp=1 pp=4 ep=8 zero=1" sim $MIX --cluster $C1024
grep -qF "    of which ep a2a" "$TMP/out" || fail "sim report lacks the exposed ep all-to-all line"
(cd "$SRC" && "$ORRERY" sim $MIX --cluster $C1024 --json) > "$TMP/sim.json" 2>/dev/null || fail "sim --json"
python3 - "$TMP/sim.json" <<'PY' || fail "sim --json lacks ep or the all-to-all exposure"
import json, sys
j = json.load(open(sys.argv[1]))
b = j["breakdown_ns"]
assert j["layout"]["ep"] == 8, j["layout"]
assert 0 < b["exposed_ep_all_to_all"] <= b["exposed_dp_comm"], b
PY
expect 0 "ep=64" sim scenarios/moe/deepseek-v3.yaml --cluster scenarios/clusters/h100-16384.yaml \
  --allow-oom --set training.global_batch=1280

expect 2 "key 'parallel.ep'" sim $MIX --cluster $C1024 --set parallel.ep=3
expect 2 "key 'parallel.ep'" sim $MIX --cluster $C1024 --set parallel.ep=16
expect 2 "key 'model.moe.top_k'" sim $MIX --cluster $C1024 --set model.moe.top_k=9
expect 2 "key 'model.moe.capacity_factor'" sim $MIX --cluster $C1024 --set model.moe.capacity_factor=-1
expect 0 "zero=3" sim $MIX --cluster $C1024 --set parallel.zero=3

expect 0 "(of which ep all-to-all" sweep $MIX --cluster $C1024 --gpus 256 --search
grep -qE "^ +256  dp=[0-9]+ tp=[0-9]+ pp=[0-9]+ ep=[0-9]+" "$TMP/out" || fail "sweep table lacks ep"

expect 0 "direct/" sim-collective all_to_all --cluster scenarios/clusters/h100-8.yaml --ranks 8 -b 1M -e 1M -f 2
expect 0 "hierarchical/" sim-collective all_to_all --cluster $C1024 --ranks 64 -b 1M -e 1M -f 2

[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all MoE simulator checks passed"
