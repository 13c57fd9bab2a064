// `orrery replay TRACE (--cluster CLUSTER | --hw PROFILE) [--out TRACE] [--json]`: rebuilds the
// dependency graph of a recorded run and re-simulates it on another cluster or device, or on the
// machine it came from (sim/replay.hpp).
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "command.hpp"
#include "orrery/common/error.hpp"
#include "orrery/sim/calibrate.hpp"
#include "orrery/sim/cluster.hpp"
#include "orrery/sim/replay.hpp"
#include "orrery/sim/sim_target.hpp"
#include "orrery/sim/sweep.hpp"
#include "orrery/traces/store.hpp"
#include "output_file.hpp"

namespace orrery::cli {
namespace {

struct ReplayArgs {
  std::string trace;
  std::string cluster;
  std::string hw;
  std::string source_cluster;
  std::string source_hw;
  std::string out;
  std::string model = "flow";
  bool identity = false;
  bool json = false;
};

// The device peak and bandwidth a profile sees on a cluster (the profile's overrides first).
std::pair<double, double> device_rates(const sim::Cluster& c, const sim::HardwareProfile& p) {
  double peak = p.peak_flops;
  if (!(peak > 0)) peak = c.device.peak_flops(p.precision);
  const double bw = p.memory_bandwidth_bytes_per_s > 0 ? p.memory_bandwidth_bytes_per_s
                                                       : c.device.mem_bandwidth_bytes_per_s;
  return {peak, bw};
}

// A cluster and its profile from --cluster / --hw (either may be absent, not both).
std::pair<sim::Cluster, sim::HardwareProfile> target(const std::string& cluster,
                                                     const std::string& hw, int ranks,
                                                     const char* cflag, const char* hflag) {
  sim::Cluster c;
  sim::HardwareProfile p;
  if (!hw.empty()) p = sim::load_hardware_profile(hw);
  if (!cluster.empty()) {
    const std::string path = sim::find_cluster_file(cluster, cflag);
    c = sim::load_cluster(path);
    if (hw.empty()) {
      // The default profile of the cluster's device: <cluster dir>/../hardware, else
      // scenarios/hardware.
      namespace fs = std::filesystem;
      const fs::path near = fs::path(path).parent_path().parent_path() / "hardware";
      p = sim::profile_for(c, fs::exists(near)                   ? near.string()
                              : fs::exists("scenarios/hardware") ? "scenarios/hardware"
                                                                 : "");
    }
  } else if (!hw.empty()) {
    c = sim::cluster_from_profile(p, ranks);
  } else {
    throw InputError(std::string("give ") + cflag + " CLUSTER or " + hflag +
                     " PROFILE (a calibrated profile describes its machine)");
  }
  if (c.num_gpus() > ranks && ranks > 0 && c.nodes == 1) c = sim::resize_cluster(c, ranks);
  p = sim::profile_for_ranks(p, std::max(1, std::min(ranks, c.gpus_per_node)));
  return {c, p};
}

int run_replay(const ReplayArgs& a) {
  if (!std::filesystem::exists(a.trace)) throw InputError(a.trace + ": no such trace file");
  traces::Trace t = traces::load_trace(a.trace);
  t.path = a.trace;
  int ranks = std::max<int>(1, t.meta.world_size);
  for (const auto& s : t.spans) ranks = std::max(ranks, s.rank + 1);
  const auto model = sim::network_model_from_string(a.model);
  if (!model) throw InputError("--model '" + a.model + "': expected flow or analytical");

  sim::ReplayOptions opt;
  opt.identity = a.identity;
  opt.network = *model;
  sim::Cluster cluster;
  sim::HardwareProfile prof;
  if (!a.identity || !a.cluster.empty() || !a.hw.empty()) {
    std::tie(cluster, prof) = target(a.cluster, a.hw, ranks, "--cluster", "--hw");
    opt.profile = &prof;
    // The recording's device: --source-cluster/--source-hw, else the target itself (ratio 1).
    if (!a.source_cluster.empty() || !a.source_hw.empty()) {
      auto [sc, sp] =
          target(a.source_cluster, a.source_hw, ranks, "--source-cluster", "--source-hw");
      const auto from = device_rates(sc, sp), to = device_rates(cluster, prof);
      sim::set_device_ratio(opt, from.first, from.second, to.first, to.second);
    }
  }
  const sim::ReplayResult r = sim::replay(t, cluster, opt);
  if (!a.out.empty()) write_trace_atomic(r.trace, a.out);
  const double err =
      r.recorded_step_ns > 0
          ? 100.0 * double(r.replayed_step_ns - r.recorded_step_ns) / r.recorded_step_ns
          : 0.0;
  if (a.json) {
    nlohmann::json j;
    j["trace"] = a.trace;
    j["cluster"] = a.identity && a.cluster.empty() && a.hw.empty() ? "identity" : cluster.name;
    j["identity"] = a.identity;
    j["compute_flops_scale"] = opt.compute_flops_scale;
    j["compute_bytes_scale"] = opt.compute_bytes_scale;
    j["recorded_step_ns"] = r.recorded_step_ns;
    j["replayed_step_ns"] = r.replayed_step_ns;
    j["step_error_pct"] = err;
    j["recorded_makespan_ns"] = r.recorded_makespan_ns;
    j["replayed_makespan_ns"] = r.replayed_makespan_ns;
    j["nodes"] = r.nodes;
    j["edges"] = r.edges;
    j["collectives"] = r.collectives;
    j["transfers"] = r.transfers;
    j["unmatched"] = r.unmatched;
    j["steps"] = nlohmann::json::array();
    for (const auto& s : r.steps)
      j["steps"].push_back(
          {{"step", s.step}, {"recorded_ns", s.recorded_ns}, {"replayed_ns", s.replayed_ns}});
    if (!a.out.empty()) j["out"] = a.out;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("replay of %s on %s%s\n", a.trace.c_str(),
              a.identity && a.cluster.empty() && a.hw.empty() ? "the recorded timings (identity)"
                                                              : cluster.name.c_str(),
              a.identity && !(a.cluster.empty() && a.hw.empty()) ? " (identity timings)" : "");
  std::printf(
      "  graph: %zu spans, %zu edges, %zu collectives, %zu send/recv pairs, %zu unmatched\n",
      r.nodes, r.edges, r.collectives, r.transfers, r.unmatched);
  if (!a.identity)
    std::printf(
        "  compute scaled x%.4g (spans with FLOPs), x%.4g (others); communication by the %s "
        "network model\n",
        opt.compute_flops_scale, opt.compute_bytes_scale,
        std::string(sim::to_string(*model)).c_str());
  std::printf(
      "  step time (median after the first step): recorded %.3f ms, replayed %.3f ms (%+.2f %%)\n",
      r.recorded_step_ns / 1e6, r.replayed_step_ns / 1e6, err);
  std::printf("  whole trace: recorded %.3f ms, replayed %.3f ms\n", r.recorded_makespan_ns / 1e6,
              r.replayed_makespan_ns / 1e6);
  if (!a.out.empty()) std::printf("  replayed trace written to %s (source=sim)\n", a.out.c_str());
  return 0;
}

Command setup(CLI::App& root) {
  auto a = std::make_shared<ReplayArgs>();
  CLI::App* app = root.add_subcommand(
      "replay",
      "Re-simulate a recorded run from its trace's dependency graph on another cluster or device");
  app->add_option("TRACE", a->trace, "Trace to replay")->required();
  app->add_option("--cluster", a->cluster, "Target cluster file or name in scenarios/clusters/");
  app->add_option("--hw", a->hw,
                  "Target hardware profile (a calibrated one also describes its machine)");
  app->add_option("--source-cluster", a->source_cluster,
                  "Cluster the trace was recorded on (compute scaling)");
  app->add_option("--source-hw", a->source_hw, "Profile of the machine the trace was recorded on");
  app->add_option("--model", a->model, "Network model: flow or analytical")->capture_default_str();
  app->add_flag("--identity", a->identity,
                "Keep the recorded durations and transfer times (checks the graph)");
  app->add_option("--out", a->out, "Write the replayed trace (source=sim)");
  app->add_flag("--json", a->json, "Print one JSON object");
  return {app, [a]() { return run_replay(*a); }};
}

const Registrar kRegistrar{setup};

}  // namespace
}  // namespace orrery::cli
