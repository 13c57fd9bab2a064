#!/usr/bin/env bash
# Mixture-of-experts predictions (issue 19 item 5): orrery sim of scenarios/moe on H100 clusters
# and a search over layouts (ep included) from 256 to 2,048 GPUs. Prints, per case: step time,
# MFU, the breakdown (compute, exposed tp / dp, of which the ep all-to-all, bubble), peak memory
# per GPU and whether it fits, and the simulator's own wall time. Figures, not assertions.
#
#   bench/run_moe_sim.sh [BUILD_DIR]      (default build/; run from the repo root)
set -u
BUILD=${1:-build}
ORRERY=$BUILD/bin/orrery
summary() {  # the --json of one orrery sim, as one line
  python3 -c '
import json, sys
j = json.load(sys.stdin)
b, l = j["breakdown_ns"], j["layout"]
w = b["window"] or 1
pct = lambda k: 100.0 * b[k] / w
print("%-14s dp=%d tp=%d pp=%d ep=%d zero=%d  step %.3f s  MFU %.1f %%  compute %.1f %%  exp tp %.1f %%"
      "  exp dp %.1f %% (a2a %.1f %%)  bubble %.1f %%  mem %.1f GB %s  wall %.2f s" % (
      sys.argv[1], l["dp"], l["tp"], l["pp"], l.get("ep", 1), l["zero"], j["step_time_s"],
      100 * j["mfu"], pct("compute"), pct("exposed_tp_comm"), pct("exposed_dp_comm"),
      pct("exposed_ep_all_to_all"), pct("bubble"), j["peak_memory_bytes"] / 1e9,
      "fits" if j["fits"] else "DOES NOT FIT", j["wall_s"]))' "$1"
}
"$ORRERY" sim scenarios/moe/mixtral-8x7b.yaml --cluster scenarios/clusters/h100-1024.yaml --json |
  summary mixtral-256
"$ORRERY" sim scenarios/moe/deepseek-v3.yaml --cluster scenarios/clusters/h100-16384.yaml \
  --allow-oom --json | summary deepseek-2048
"$ORRERY" sweep scenarios/moe/mixtral-8x7b.yaml --cluster scenarios/clusters/h100-16384.yaml \
  --gpus 256,512,1024,2048 --search
