// `orrery sim SCENARIO [--cluster C] [--hw PROFILE] [--out TRACE] [--set k=v ...] [--json]`: one
// simulated training step of a scenario on a cluster: step time, tokens/s, TFLOP/s and MFU per GPU,
// the breakdown, memory per rank; optionally the simulated trace (source = sim).
#include <algorithm>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.hpp"
#include "orrery/common/error.hpp"
#include "orrery/common/scenario.hpp"
#include "orrery/sim/cluster.hpp"
#include "orrery/sim/sim_target.hpp"
#include "orrery/sim/sweep.hpp"
#include "output_file.hpp"

namespace orrery::cli {
namespace {

struct SimArgs {
  std::string scenario;
  std::string cluster;
  std::string hw;
  std::string out;
  std::vector<std::string> sets;
  std::string model = "flow";
  std::string precision;
  int steps = 1;
  int gpus = -1;  // -1: the cluster's own size
  bool all_ranks = false;
  bool representative = false;    // one rank per stage even where replicas contend on the fabric
  bool no_rail_symmetry = false;  // every rank literally, without the executor's rail symmetry
  bool fill = false;  // dp grows to fill a larger cluster (the behaviour before issue 17 item 4)
  bool allow_oom = false;
  bool json = false;
};

Command setup(CLI::App& root) {
  auto a = std::make_shared<SimArgs>();
  CLI::App* app = root.add_subcommand("sim", "Simulate training steps of a scenario on a cluster");
  app->add_option("scenario", a->scenario, "Scenario file (scenarios/*.yaml)")->required();
  app->add_option(
      "--cluster", a->cluster,
      "Cluster file or name in scenarios/clusters/ (default: one node of the scenario's device); "
      "a larger cluster runs the scenario's dp*tp*pp GPUs of it (--fill: dp grows to fill it)");
  app->add_option("--gpus", a->gpus,
                  "Simulate on this many GPUs of the cluster's design (nodes = GPUs / "
                  "gpus_per_node, rounded up; the fabric resized as a sweep does); dp fits them");
  app->add_flag("--fill", a->fill,
                "dp grows to fill the whole cluster (default: the scenario's dp on part of a "
                "larger cluster)");
  app->add_option("--hw", a->hw, "Hardware profile (default: scenarios/hardware/<device>.yaml)");
  app->add_option("--out", a->out, "Write the simulated trace (source=sim) to this file");
  app->add_option("--set", a->sets, "Override a scenario key, a.b.c=value (repeatable)");
  app->add_option("--model", a->model, "Network model: flow (max-min contention) or analytical")
      ->capture_default_str();
  app->add_option("--precision", a->precision,
                  "fp32 or mixed (default: from the hardware profile)");
  app->add_option("--steps", a->steps,
                  "Training steps to simulate (the first is excluded from the step time "
                  "when more than one)")
      ->capture_default_str();
  app->add_flag("--all-ranks", a->all_ranks,
                "Simulate every rank (default: one representative per stage, or every rank where "
                "replicas contend on the fabric: a fat-tree that is oversubscribed, not "
                "rail-optimized or whose rails span several leaves, a ring or a torus)");
  app->add_flag("--representative", a->representative,
                "One representative rank per stage even where replicas contend on the fabric");
  app->add_flag("--no-rail-symmetry", a->no_rail_symmetry,
                "With every rank: simulate each one literally instead of tp rank 0 of each group "
                "with copies for its peers on the other rails (the same times to the nanosecond "
                "where the symmetry applies; a check, 1/tp of the speed)");
  app->add_flag("--allow-oom", a->allow_oom,
                "Simulate even when the model does not fit device memory");
  app->add_flag("--json", a->json, "Print one JSON object");

  auto run = [a]() {
    const Scenario loaded = load_scenario(a->scenario, a->sets);
    // Gradient compression (issue 18) is modelled by the workload (sim/src/workload.cpp): the
    // compressed dp collectives' bytes and the compression compute.
    if (a->steps < 1) throw InputError("--steps must be >= 1");
    // Before anything is sized by the scenario (the default cluster has one GPU per rank): layers,
    // ranks, ops and the estimated memory against this machine's (sweep.hpp). The cluster is not
    // known yet: with --all-ranks the rail symmetry is assumed (the smallest size), and
    // check_simulation_fits repeats the check exactly once it is.
    sim::check_simulation_size(loaded, a->steps, a->all_ranks, !a->out.empty(), 0,
                               a->all_ranks ? std::max(1, loaded.parallel.tp) : 1);
    sim::SimTarget target = sim::sim_target(loaded, a->cluster, a->hw);
    if (a->gpus != -1 && a->gpus < 1)
      throw InputError("--gpus must be >= 1, got " + std::to_string(a->gpus));
    if (a->gpus != -1 && a->fill) throw InputError("--gpus and --fill: give one of them");
    if (a->gpus != -1) {
      target.cluster = sim::resize_cluster(target.cluster, a->gpus);
    } else if (!a->fill && target.cluster.num_gpus() > loaded.world_size()) {
      // A published run used part of a cluster: the scenario's own dp on its GPUs of the cluster's
      // design (the fabric resized as --gpus does), not dp grown to fill the cluster.
      if (!a->json)
        std::cerr << "orrery sim: " << loaded.world_size() << " of the "
                  << target.cluster.num_gpus() << " GPUs of " << target.cluster.name
                  << " (the scenario's dp " << loaded.parallel.dp
                  << "; --fill grows dp to fill the cluster)\n";
      target.cluster = sim::resize_cluster(target.cluster, loaded.world_size());
    }
    const sim::Cluster& cluster = target.cluster;
    // --gpus N or a smaller cluster: dp fits it (fit_layout); with --fill, dp grows to fill a larger
    // cluster; when that dp does not fit the scenario, the error says how to simulate the
    // scenario's own GPU count instead.
    const Scenario s = [&] {
      try {
        return sim::fit_layout(loaded, cluster);
      } catch (const InputError& e) {
        if (a->gpus != -1 || cluster.num_gpus() <= loaded.world_size()) throw;
        throw InputError(std::string(e.what()) + " (the cluster " + cluster.name + " has " +
                         std::to_string(cluster.num_gpus()) +
                         " GPUs and --fill grows dp to fill them; without --fill orrery sim "
                         "simulates the scenario's own " +
                         std::to_string(loaded.world_size()) + ")");
      }
    }();
    if (s.parallel.dp != loaded.parallel.dp && !a->json)
      std::cerr << "orrery sim: dp set to " << s.parallel.dp << " to fit the " << cluster.num_gpus()
                << " GPUs of " << cluster.name << "\n";
    const auto model = sim::network_model_from_string(a->model);
    if (!model) throw InputError("--model '" + a->model + "': expected flow or analytical");

    sim::SimOptions opt;
    opt.network = *model;
    if (a->all_ranks && a->representative)
      throw InputError("--all-ranks and --representative: give one of them");
    // Contention between replicas on the fabric by default where it matters (issue 17 item 3).
    opt.all_ranks =
        a->all_ranks || (!a->representative && sim::replica_contention_matters(s, cluster));
    if (opt.all_ranks && !a->all_ranks && !a->json)
      std::cerr << "orrery sim: every rank simulated: replicas contend on the fabric of "
                << cluster.name << " (--representative: one rank per stage)\n";
    opt.rail_symmetry = !a->no_rail_symmetry;
    opt.steps = a->steps;
    opt.precision = a->precision;
    opt.profile = sim::target_profile(target, a->hw);
    // Ranks sharing a node's cores (profiles with a `sharing:` section): sim::simulate shares the
    // cores among the ranks computing at each instant and scales the collectives.
    opt.keep_trace = !a->out.empty();
    // Again with the layout fitted to the cluster (dp may have grown) and the profile known; then
    // the device-memory check: a model that cannot fit is bad input, not a prediction.
    sim::check_simulation_fits(s, cluster, opt, a->allow_oom);

    sim::SimResult r = sim::simulate(s, cluster, opt);
    if (!a->out.empty()) write_trace_atomic(*r.trace, a->out);
    if (a->json) {
      nlohmann::json j = sim::to_json(r);
      j["scenario"] = s.name;
      j["cluster"] = cluster.name;
      j["gpus"] = cluster.num_gpus();
      j["network_model"] = std::string(sim::to_string(*model));
      if (!a->out.empty()) j["trace"] = a->out;
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << sim::format_report(r, s, cluster, *model);
      if (!a->out.empty()) std::cout << "trace written to " << a->out << " (source=sim)\n";
    }
    return 0;
  };
  return Command{app, run};
}

const Registrar kRegistrar{setup};

}  // namespace
}  // namespace orrery::cli
