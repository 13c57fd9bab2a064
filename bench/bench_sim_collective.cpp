// Speed of the flow-level network model: one 1 GiB ring all-reduce across 1,024, 4,096 and 16,384
// H100 GPUs (DGX-style nodes, rail-optimized NDR fat-tree as scenarios/clusters/h100-*.yaml), printing
// wall time, peak RSS (VmHWM), flows and max-min solves. The brief's targets: 1,024 GPUs < 0.1 s;
// 4,096 GPUs < 0.5 s and < 500 MB. Usage: bench_sim_collective [--algo ring|tree|hierarchical] [GPUS...]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "orrery/sim/cluster.hpp"
#include "orrery/sim/collectives.hpp"
#include "orrery/sim/network.hpp"

using namespace orrery::sim;

namespace {

long peak_rss_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

Cluster h100_cluster(int gpus) {
  Cluster c;
  c.name = "h100-" + std::to_string(gpus);
  c.device = *device_preset("H100-SXM");
  c.nodes = gpus / 8;
  c.gpus_per_node = 8;
  c.topo.kind = TopologyKind::FatTree;
  c.topo.nvlink_gb_per_s = 450;
  c.topo.nvlink_latency_ns = 150;
  c.topo.nic_gb_per_s = 50;
  c.topo.nic_latency_ns = 1500;
  c.topo.switch_latency_ns = 150;
  c.topo.rail_optimized = true;
  c.topo.radix = 64;
  c.topo.tiers = gpus > 2048 ? 3 : 2;
  c.coll.step_latency_ns = 1000;
  c.coll.channels = 8;
  build_topology(c);
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  Algorithm algo = Algorithm::Ring;
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--algo") && i + 1 < argc) {
      algo = algorithm_from_string(argv[++i]).value_or(Algorithm::Ring);
    } else {
      sizes.push_back(std::atoi(argv[i]));
    }
  }
  if (sizes.empty()) sizes = {1024, 4096, 16384};
  std::printf("# one 1 GiB all-reduce (%s), flow-level model, DGX H100 nodes on a rail-optimized NDR fat-tree\n",
              std::string(to_string(algo)).c_str());
  std::printf("%8s %12s %12s %10s %10s %10s %12s %12s\n", "gpus", "build_s", "simulate_s", "flows", "solves",
              "events", "sim_time_ms", "busbw_GB/s");
  for (int gpus : sizes) {
    const auto t0 = std::chrono::steady_clock::now();
    const Cluster c = h100_cluster(gpus);
    const auto t1 = std::chrono::steady_clock::now();
    Engine e;
    auto net = make_network(NetworkModel::Flow, c, e);
    CollectiveRequest r;
    r.op = orrery::traces::CollOp::AllReduce;
    r.members.resize(gpus);
    std::iota(r.members.begin(), r.members.end(), 0);
    r.bytes = 1LL << 30;
    r.algo = algo;
    net->start(r, [] {});
    e.run();
    const auto t2 = std::chrono::steady_clock::now();
    const double t_ns = static_cast<double>(e.now());
    const double busbw = static_cast<double>(r.bytes) / t_ns * 2.0 * (gpus - 1) / gpus;
    std::printf("%8d %12.4f %12.4f %10llu %10llu %10llu %12.3f %12.2f\n", gpus,
                std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t1).count(),
                static_cast<unsigned long long>(net->stats().flows), static_cast<unsigned long long>(net->stats().solves),
                static_cast<unsigned long long>(e.events_processed()), t_ns / 1e6, busbw);
    std::fflush(stdout);
  }
  // Many concurrent collectives (a training step's pattern): on 1,024 GPUs every node runs 200
  // tensor-parallel all-reduces of 16 MiB back to back while 8 data-parallel rings (one per local GPU
  // index, 128 ranks each) all-reduce 256 MiB 4 times: contention between them shows in the flow model.
  {
    const auto t0 = std::chrono::steady_clock::now();
    const Cluster c = h100_cluster(1024);
    Engine e;
    auto net = make_network(NetworkModel::Flow, c, e);
    std::vector<std::function<void()>> loops;
    int finished = 0;
    std::function<void(CollectiveRequest, int)> chain = [&](CollectiveRequest r, int left) {
      if (left == 0) {
        ++finished;
        return;
      }
      net->start(r, [&, r, left] { chain(r, left - 1); });
    };
    for (int k = 0; k < c.nodes; ++k) {
      CollectiveRequest r;
      r.op = orrery::traces::CollOp::AllReduce;
      for (int g = 0; g < 8; ++g) r.members.push_back(k * 8 + g);
      r.bytes = 16 << 20;
      chain(r, 200);
    }
    for (int j = 0; j < 8; ++j) {
      CollectiveRequest r;
      r.op = orrery::traces::CollOp::AllReduce;
      for (int k = 0; k < c.nodes; ++k) r.members.push_back(k * 8 + j);
      r.bytes = 256 << 20;
      r.algo = Algorithm::Ring;
      chain(r, 4);
    }
    e.run();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("# mixed: %d chains, %llu collectives, %llu flows, %llu solves (%llu flows re-rated), %llu events,"
                " simulated %.3f ms, wall %.3f s (%.0f events/s)\n",
                finished, static_cast<unsigned long long>(net->stats().collectives),
                static_cast<unsigned long long>(net->stats().flows), static_cast<unsigned long long>(net->stats().solves),
                static_cast<unsigned long long>(net->stats().solved_flows),
                static_cast<unsigned long long>(e.events_processed()), static_cast<double>(e.now()) / 1e6, wall,
                static_cast<double>(e.events_processed()) / wall);
  }
  std::printf("# peak RSS (VmHWM) %.1f MB\n", peak_rss_kb() / 1024.0);
  return 0;
}
