// Helpers shared by the workload, executor and sweep tests: scenarios and clusters built in code.
#pragma once

#include <string>

#include "orrery/common/scenario.hpp"
#include "orrery/sim/cluster.hpp"
#include "orrery/sim/cost_model.hpp"
#include "orrery/sim/hardware.hpp"

namespace orrery::sim::testing {

// A small GPT with the given layout; global batch = dp · micro_batch · m.
inline Scenario small_scenario(int layers, int dp, int tp, int pp, int m,
                               const char* schedule = "1f1b") {
  Scenario s;
  s.path = "test.yaml";
  s.name = "test";
  s.model.layers = layers;
  s.model.d_model = 256;
  s.model.heads = 8;
  s.model.vocab = 1024;
  s.model.seq = 128;
  s.training.micro_batch = 2;
  s.training.global_batch = dp * 2 * m;
  s.parallel.dp = dp;
  s.parallel.tp = tp;
  s.parallel.pp = pp;
  s.parallel.schedule = schedule;
  s.runtime.device = "cuda";
  return s;
}

inline Scenario gpt3_175b(int dp) {
  Scenario s;
  s.path = "gpt3-175b (test)";
  s.name = "gpt3-175b";
  s.model.layers = 96;
  s.model.d_model = 12288;
  s.model.heads = 96;
  s.model.vocab = 51200;
  s.model.seq = 2048;
  s.training.micro_batch = 1;
  s.training.global_batch = 1536;
  s.parallel.dp = dp;
  s.parallel.tp = 8;
  s.parallel.pp = 16;
  s.parallel.schedule = "1f1b";
  s.runtime.device = "cuda";
  return s;
}

// DGX-like H100 nodes on a rail-optimized fat-tree (or one crossbar node).
inline Cluster h100_cluster(int gpus) {
  Cluster c;
  c.name = "test-h100-" + std::to_string(gpus);
  c.device = *device_preset("H100-SXM");
  c.gpus_per_node = gpus < 8 ? gpus : 8;
  c.nodes = gpus / c.gpus_per_node;
  c.topo.kind = c.nodes == 1 ? TopologyKind::Crossbar : TopologyKind::FatTree;
  if (gpus > 2048) {
    c.topo.tiers = 3;
  }
  build_topology(c);
  return c;
}

// A rail-optimized fat-tree of `nodes` DGX-like nodes of `gpn` GPUs and radix-`radix` switches.
inline Cluster rail_fat_tree(int nodes, int gpn, int radix, int tiers, bool rail = true) {
  Cluster c;
  c.name = "rail-radix" + std::to_string(radix);
  c.device = *device_preset("H100-SXM");
  c.nodes = nodes;
  c.gpus_per_node = gpn;
  c.topo.kind = TopologyKind::FatTree;
  c.topo.radix = radix;
  c.topo.tiers = tiers;
  c.topo.rail_optimized = rail;
  build_topology(c);
  return c;
}

inline CostModel h100_cost() {
  const Device d = *device_preset("H100-SXM");
  return CostModel(default_hardware_profile("H100-SXM", true), d.peak_bf16_flops,
                   d.mem_bandwidth_bytes_per_s);
}

}  // namespace orrery::sim::testing
