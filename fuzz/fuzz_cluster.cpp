// libFuzzer harness: cluster YAML (sim/src/cluster.cpp, topology.cpp). Input: YAML text. Expected: a
// Cluster with a built topology, or an orrery::InputError. A parsed cluster is also routed (first
// GPU to last, to the middle) and resized to half its GPUs, as `orrery sweep` does.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "orrery/common/error.hpp"
#include "orrery/sim/cluster.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = orrery::fuzz::as_text(data, size);
  orrery::sim::Cluster c;
  try {
    c = orrery::sim::parse_cluster(text, "fuzz.yaml");
  } catch (const orrery::InputError&) {
    return 0;
  }
  if (!c.topology) orrery::fuzz::fail("parse_cluster returned no topology");
  const int n = c.num_gpus();
  if (c.topology->num_gpus() != n) orrery::fuzz::fail("topology GPU count differs from nodes x gpus_per_node");
  std::vector<int32_t> path;
  for (int dst : {n - 1, n / 2}) {
    if (dst <= 0) continue;
    path.clear();
    c.topology->route(0, dst, 12345, path);
    if (path.empty()) orrery::fuzz::fail("no route between two distinct GPUs");
    for (int32_t l : path) {
      if (l < 0 || static_cast<size_t>(l) >= c.topology->links().size()) orrery::fuzz::fail("route names a link out of range");
    }
    (void)c.topology->path_latency_ns(path);
    (void)c.topology->path_gb_per_s(path);
  }
  try {
    const auto r = orrery::sim::resize_cluster(c, n / 2 > 0 ? n / 2 : 1);
    if (!r.topology) orrery::fuzz::fail("resize_cluster returned no topology");
  } catch (const orrery::InputError&) {
  }
  return 0;
}
