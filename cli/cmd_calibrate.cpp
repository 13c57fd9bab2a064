// `orrery calibrate TRACE... --out PROFILE.yaml`: fits the simulator's hardware profile from real
// traces (sim/calibrate.hpp): compute cost per op class, per-kernel overhead, collective latency
// and bandwidth per group size, the cost of ranks sharing cores, and the machine itself.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.hpp"
#include "orrery/common/atomic_file.hpp"
#include "orrery/common/error.hpp"
#include "orrery/sim/calibrate.hpp"
#include "orrery/sim/hardware.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::cli {
namespace {

struct CalibrateArgs {
  std::vector<std::string> traces;
  std::string out;
  std::string check;  // --check PROFILE
  sim::CalibrationOptions opt;
  bool json = false;
};

// A GPU fit (calibrate.hpp step 5): the parameters, where each came from, the fit per operator.
int print_gpu(const sim::CalibrationResult& r, const CalibrateArgs& a, size_t traces) {
  if (a.check.empty())
    std::printf("calibrated GPU profile '%s' (%s, %s) written to %s from %zu trace(s)\n",
                r.profile.name.c_str(), r.profile.device.c_str(),
                std::string(to_string(r.profile.precision)).c_str(), a.out.c_str(), traces);
  else
    std::printf("GPU profile '%s' (%s) checked against %zu trace(s) at %s, nothing fitted\n",
                r.profile.name.c_str(), a.check.c_str(), traces,
                std::string(to_string(r.profile.precision)).c_str());
  for (const auto& g : r.gpu) {
    if (g.fitted)
      std::printf("  %-34s %9.4f  fitted from %lld %s\n", g.parameter.c_str(), g.value,
                  static_cast<long long>(g.kernels),
                  g.parameter.rfind("offload.", 0) == 0 ? "spans" : "kernels");
    else
      std::printf("  %-34s %9.4f  NOT FITTED (default kept): %s\n", g.parameter.c_str(), g.value,
                  g.why.c_str());
  }
  std::printf("\n  %-44s %-30s %6s %14s %14s %8s\n", "op", "shape", "count", "measured", "fitted",
              "error");
  for (const auto& o : r.ops)
    std::printf("  %-44s %-30s %6lld %11.2f us %11.2f us %+7.2f%%\n", o.name.c_str(),
                o.shape.c_str(), static_cast<long long>(o.count), o.measured_ns / 1e3,
                o.fitted_ns / 1e3, o.error_pct());
  std::printf("  time-weighted relative RMS error of the fit: %.2f %%\n", 100 * r.compute_rel_rms);
  for (const auto& n : r.notes) std::printf("  note: %s\n", n.c_str());
  return 0;
}

int run_calibrate(const CalibrateArgs& a) {
  std::vector<traces::Trace> ts;
  for (const auto& p : a.traces) {
    if (!std::filesystem::exists(p)) throw InputError(p + ": no such trace file");
    ts.push_back(traces::load_trace(p));
    ts.back().path = p;
  }
  sim::CalibrationOptions opt = a.opt;
  if (opt.name.empty()) opt.name = std::filesystem::path(a.out).stem().string();
  if (!a.check.empty())
    opt.check = sim::load_hardware_profile(a.check);
  else if (a.out.empty())
    throw InputError("orrery calibrate: --out PROFILE is required (unless --check PROFILE)");
  const sim::CalibrationResult r = sim::calibrate(ts, opt);
  if (!a.out.empty()) write_file_atomic(a.out, sim::calibrated_yaml(r));

  if (a.json) {
    nlohmann::json j;
    j["profile"] = a.out;
    j["peak_flops"] = r.profile.peak_flops;
    j["memory_bandwidth_bytes_per_s"] = r.profile.memory_bandwidth_bytes_per_s;
    j["overhead_ns"] = r.profile.classes[0].overhead_ns;
    j["data_load_ns"] = r.profile.data_load_ns;
    j["compute_rel_rms_pct"] = 100 * r.compute_rel_rms;
    j["sharing"] = {{"cores", r.profile.sharing.cores},
                    {"threads_per_rank", r.profile.sharing.threads_per_rank},
                    {"contention_at_full", r.profile.sharing.contention_at_full},
                    {"oversubscription_exponent", r.profile.sharing.oversubscription_exponent},
                    {"comm_exponent", r.profile.sharing.comm_exponent}};
    j["ops"] = nlohmann::json::array();
    for (const auto& o : r.ops)
      j["ops"].push_back({{"name", o.name},
                          {"shape", o.shape},
                          {"count", o.count},
                          {"measured_ns", o.measured_ns},
                          {"fitted_ns", o.fitted_ns},
                          {"error_pct", o.error_pct()}});
    j["slowdowns"] = nlohmann::json::array();
    for (const auto& s : r.sharing)
      j["slowdowns"].push_back(
          {{"trace", s.trace}, {"ranks", s.ranks}, {"measured", s.factor}, {"law", s.model}});
    j["collectives"] = nlohmann::json::array();
    for (const auto& c : r.collectives)
      j["collectives"].push_back({{"op", std::string(traces::to_string(c.op))},
                                  {"ranks", c.ranks},
                                  {"ranks_on_node", c.ranks_on_node},
                                  {"points", c.points},
                                  {"latency_ns", c.latency_ns},
                                  {"busbw_bytes_per_s", c.busbw_bytes_per_s},
                                  {"r2", c.r2}});
    j["notes"] = r.notes;
    j["gpu"] = nlohmann::json::array();
    for (const auto& g : r.gpu)
      j["gpu"].push_back({{"parameter", g.parameter},
                          {"value", g.value},
                          {"fitted", g.fitted},
                          {"kernels", g.kernels},
                          {"traces", g.traces},
                          {"why", g.why}});
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  if (!r.gpu.empty() || !a.check.empty()) return print_gpu(r, a, ts.size());
  const auto& p = r.profile;
  std::printf("calibrated profile '%s' written to %s from %zu trace(s)\n", p.name.c_str(),
              a.out.c_str(), ts.size());
  std::printf(
      "  one rank alone: %.2f GFLOP/s peak (gemm %.0f %%, attention %.0f %%), %.2f GB/s, "
      "%.1f us per kernel, %.1f us host time per micro-batch\n",
      p.peak_flops / 1e9, 100 * p.cost(sim::OpClass::Gemm).flops_efficiency,
      100 * p.cost(sim::OpClass::Attention).flops_efficiency, p.memory_bandwidth_bytes_per_s / 1e9,
      p.classes[0].overhead_ns / 1e3, p.data_load_ns / 1e3);
  std::printf(
      "  sharing %d cores, %d thread(s) per rank: contention at full %.3f, oversubscription "
      "exponent "
      "%.2f, comm exponent %.2f\n",
      p.sharing.cores, p.sharing.threads_per_rank, p.sharing.contention_at_full,
      p.sharing.oversubscription_exponent, p.sharing.comm_exponent);
  std::printf("\n  %-16s %-30s %6s %14s %14s %8s\n", "op", "shape", "spans", "measured", "fitted",
              "error");
  for (const auto& o : r.ops)
    std::printf("  %-16s %-30s %6lld %11.1f us %11.1f us %+7.1f%%\n", o.name.c_str(),
                o.shape.c_str(), static_cast<long long>(o.count), o.measured_ns / 1e3,
                o.fitted_ns / 1e3, o.error_pct());
  std::printf("  time-weighted relative RMS error of the compute fit: %.2f %%\n",
              100 * r.compute_rel_rms);
  std::printf("\n  %-40s %6s %12s %10s\n", "run", "ranks", "slowdown", "law");
  for (const auto& s : r.sharing)
    std::printf("  %-40s %6d %12.3f %10.3f\n", s.trace.c_str(), s.ranks, s.factor, s.model);
  if (!r.collectives.empty()) {
    std::printf("\n  %-16s %6s %10s %8s %14s %14s %6s\n", "collective", "group", "run ranks",
                "points", "latency", "busbw", "r2");
    for (const auto& c : r.collectives)
      std::printf("  %-16s %6d %10d %8d %11.1f us %9.3f GB/s %6.3f\n",
                  std::string(traces::to_string(c.op)).c_str(), c.ranks, c.ranks_on_node, c.points,
                  c.latency_ns / 1e3, c.busbw_bytes_per_s / 1e9, c.r2);
  }
  for (const auto& n : r.notes) std::printf("  note: %s\n", n.c_str());
  return 0;
}

Command setup(CLI::App& root) {
  auto a = std::make_shared<CalibrateArgs>();
  CLI::App* app = root.add_subcommand(
      "calibrate",
      "Fit the simulator's hardware profile (and the machine's description) from real traces");
  app->add_option("TRACE", a->traces, "Traces of `orrery run` (e.g. a serial run and a dp2 run)")
      ->required();
  app->add_option("--out", a->out, "Profile to write (YAML); not needed with --check");
  app->add_option("--name", a->opt.name, "Profile name (default: the file's stem)");
  a->opt.name.clear();
  app->add_option("--cores", a->opt.cores, "Cores the ranks shared (default: this machine's)");
  app->add_option("--threads", a->opt.threads_per_rank,
                  "Compute threads per rank (default: the scenario's)");
  app->add_option("--skip-steps", a->opt.skip_steps, "Warm-up steps left out")
      ->capture_default_str();
  app->add_option("--ranks-per-node", a->opt.ranks_per_node, "Rank slots of the described machine")
      ->capture_default_str();
  app->add_flag(
      "--roofline-only", [a](std::int64_t) { a->opt.measured_ops = false; },
      "Leave the measured op times out of the profile: every op costs the fitted roofline");
  app->add_option("--device", a->opt.device,
                  "GPU traces: the device preset they ran on (A100-SXM-80GB, H100-SXM, H200) when "
                  "the traces do not name it");
  app->add_flag("--flat-gemm", a->opt.flat_gemm,
                "GPU traces: fit every GEMM at one rate, without the gemm_shape model (for "
                "comparison)");
  app->add_option("--check", a->check,
                  "GPU traces: price their kernels with this profile instead of fitting (a "
                  "held-out check; the fit table's 'fitted' column is the profile's time)")
      ->check(CLI::ExistingFile);
  app->add_flag("--json", a->json, "Print one JSON object");
  return {app, [a]() { return run_calibrate(*a); }};
}

const Registrar kRegistrar{setup};

}  // namespace
}  // namespace orrery::cli
