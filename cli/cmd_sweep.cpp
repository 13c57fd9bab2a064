// `orrery sweep SCENARIO --cluster C --gpus 8,64,512 [--search] [--csv FILE] [--json]`: the scaling
// table of a scenario over cluster sizes (same node type and topology, more nodes), optionally with
// the best dp/tp/pp/zero/micro-batch layout per size. Progress goes to stderr. Under mpirun or srun
// (`mpirun -n R orrery sweep ...`) the simulations are spread over the R ranks and rank 0 prints
// the same table a single process prints.
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "command.hpp"
#include "orrery/common/atomic_file.hpp"
#include "orrery/common/error.hpp"
#include "orrery/common/scenario.hpp"
#include "orrery/sim/cluster.hpp"
#include "orrery/sim/sim_target.hpp"
#include "orrery/sim/sweep.hpp"

#if defined(ORRERY_RUNTIME_AVAILABLE)
#include "orrery/runtime/comm.hpp"
#endif

namespace orrery::cli {
namespace {

#if defined(ORRERY_RUNTIME_AVAILABLE)
// Under mpirun (or srun): rank r simulates jobs r, r + n, r + 2n, ...; then each rank in turn
// broadcasts its results (wire format, sim/sweep.hpp), so every rank holds all of them in job
// order and assembles the same table. A simulation that fails on one rank fails the sweep on every
// rank with the same message (the first failing job's), after the exchange, so no rank waits for
// one that gave up.
sim::SweepRunner distributed_runner(runtime::Communicator& world,
                                    std::function<void(const std::string&)> progress) {
  return [&world, progress](const std::vector<sim::SweepJob>& jobs) {
    const int n = world.size(), me = world.rank();
    std::vector<sim::SimResult> mine;
    int64_t failed_job = -1;
    std::string failure;
    for (size_t j = size_t(me); j < jobs.size(); j += size_t(n)) {
      if (progress) progress(jobs[j].label);
      try {
        mine.push_back(sim::simulate(jobs[j].scenario, *jobs[j].cluster, jobs[j].options));
      } catch (const InputError& e) {
        if (failed_job < 0) failed_job = int64_t(j), failure = e.what();
        mine.emplace_back();
      } catch (const std::exception& e) {  // still exchanged: no rank waits for this one
        if (failed_job < 0) failed_job = int64_t(j), failure = std::string("internal: ") + e.what();
        mine.emplace_back();
      }
    }
    const std::string wire = nlohmann::json{
        {"results", sim::results_to_wire(mine)},
        {"failed_job", failed_job},
        {"failure", failure}}.dump();
    std::vector<sim::SimResult> all(jobs.size());
    int64_t first_failed = -1;
    std::string first_failure;
    for (int r = 0; r < n; ++r) {
      std::string bytes = r == me ? wire : std::string();
      int64_t len = static_cast<int64_t>(bytes.size());
      world.broadcast(&len, 1, runtime::DType::I64, r).wait();
      bytes.resize(size_t(len));
      world.broadcast(bytes.data(), size_t(len), runtime::DType::U8, r).wait();
      const auto msg = nlohmann::json::parse(bytes);
      const auto results = sim::results_from_wire(msg.at("results").get<std::string>());
      for (size_t k = 0, j = size_t(r); j < jobs.size(); ++k, j += size_t(n)) {
        if (k >= results.size())
          throw InternalError("sweep: rank " + std::to_string(r) + " sent too few results");
        all[j] = results[k];
      }
      const int64_t f = msg.at("failed_job").get<int64_t>();
      if (f >= 0 && (first_failed < 0 || f < first_failed)) {
        first_failed = f;
        first_failure = msg.at("failure").get<std::string>();
      }
    }
    if (first_failed >= 0) {
      if (first_failure.rfind("internal: ", 0) == 0) throw InternalError(first_failure.substr(10));
      throw InputError(first_failure);
    }
    return all;
  };
}
#endif

struct SweepArgs {
  std::string scenario;
  std::string cluster;
  std::string gpus;
  std::string hw;
  std::string csv;
  std::vector<std::string> sets;
  std::string model = "analytical";
  std::string precision;
  int top = 6;
  bool search = false;
  bool search_compression = false;
  bool json = false;
  bool quiet = false;
};

std::vector<int> parse_gpus(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t pos = 0;
    int v = 0;
    try {
      v = std::stoi(item, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    if (pos != item.size() || v < 1)
      throw InputError("--gpus '" + text +
                       "': expected a comma-separated list of positive GPU counts");
    out.push_back(v);
  }
  if (out.empty()) throw InputError("--gpus: expected at least one GPU count");
  return out;
}

Command setup(CLI::App& parent) {
  auto a = std::make_shared<SweepArgs>();
  CLI::App* app = parent.add_subcommand("sweep", "Predict a scenario's scaling over cluster sizes");
  app->add_option("scenario", a->scenario, "Scenario file (scenarios/*.yaml)")->required();
  app->add_option("--cluster", a->cluster,
                  "Cluster file or name in scenarios/clusters/ (the node type)")
      ->required();
  app->add_option("--gpus", a->gpus, "GPU counts, e.g. 8,64,512,4096,16384")->required();
  app->add_flag("--search", a->search,
                "Search the best dp/tp/pp/zero/micro-batch per size within device memory");
  app->add_flag(
      "--search-compression", a->search_compression,
      "--search: also consider int8 gradient compression (ZeRO 0/1) when the scenario has "
      "none; NVMe offload is always considered for layouts that need it to fit");
  app->add_option("--top", a->top,
                  "--search: layouts simulated per size (best by a closed-form estimate)")
      ->capture_default_str();
  app->add_option("--csv", a->csv, "Also write the table as CSV to this file");
  app->add_option("--hw", a->hw, "Hardware profile (default: scenarios/hardware/<device>.yaml)");
  app->add_option("--set", a->sets, "Override a scenario key, a.b.c=value (repeatable)");
  app->add_option("--model", a->model, "Network model: analytical (fast) or flow")
      ->capture_default_str();
  app->add_option("--precision", a->precision,
                  "fp32 or mixed (default: from the hardware profile)");
  app->add_flag("--quiet", a->quiet, "No progress on stderr");
  app->add_flag("--json", a->json, "Print one JSON object");

  auto run = [a]() {
    const Scenario s = load_scenario(a->scenario, a->sets);
    // Gradient compression (issue 18) is simulated; --search skips ZeRO 2/3 with it (sweep.cpp).
    const sim::SimTarget target = sim::load_target(a->cluster);
    const sim::Cluster& cluster = target.cluster;
    const auto model = sim::network_model_from_string(a->model);
    if (!model) throw InputError("--model '" + a->model + "': expected flow or analytical");
    if (a->top < 1) throw InputError("--top must be >= 1");
    sim::SweepOptions opt;
    opt.gpus = parse_gpus(a->gpus);
    opt.search = a->search;
    opt.search_top = a->top;
    opt.search_compression = a->search_compression;
    opt.sim.network = *model;
    opt.sim.precision = a->precision;
    opt.sim.profile = sim::target_profile(target, a->hw);
    if (!a->quiet)
      opt.progress = [](const std::string& line) {
        std::cerr << "orrery sweep: " << line << std::endl;
      };
    bool root = true;  // prints the table and writes the CSV
#if defined(ORRERY_RUNTIME_AVAILABLE)
    std::unique_ptr<runtime::Communicator> world;
    if (runtime::started_by_launcher() && runtime::launcher_world_size() > 1) {
      world = runtime::make_world_communicator();
      root = world->rank() == 0;
      const std::string who = "orrery sweep [rank " + std::to_string(world->rank()) + "/" +
                              std::to_string(world->size()) + "]: ";
      std::function<void(const std::string&)> say;
      if (!a->quiet)
        say = [who](const std::string& line) { std::cerr << who << line << std::endl; };
      opt.runner = distributed_runner(*world, say);
      if (!root) opt.progress = nullptr;  // the planning lines once, from rank 0
    }
#endif
    const auto rows = sim::sweep(s, cluster, opt);
    if (!root) return 0;
    if (!a->csv.empty()) write_file_atomic(a->csv, sim::format_sweep_csv(rows));
    if (a->json) {
      nlohmann::json j;
      j["scenario"] = s.name;
      j["cluster"] = cluster.name;
      j["network_model"] = std::string(sim::to_string(*model));
      j["search"] = a->search;
      j["rows"] = sim::to_json(rows);
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << "orrery sweep: " << s.name << " on " << cluster.device.name << " nodes like "
                << cluster.name << " (" << cluster.topology->describe() << "), global batch "
                << s.training.global_batch << ", network model " << sim::to_string(*model)
                << (a->search ? ", best layout per size" : "") << "\n";
      std::cout << sim::format_sweep_table(rows);
      if (a->search) {
        std::cout << "why\n";
        for (const auto& r : rows)
          if (const std::string w = sim::explain_choice(r); !w.empty())
            std::cout << "  " << r.gpus << " GPUs: " << w << "\n";
      }
      if (!a->csv.empty()) std::cout << "CSV written to " << a->csv << "\n";
    }
    return 0;
  };
  return Command{app, run};
}

const Registrar kRegistrar{setup};

}  // namespace
}  // namespace orrery::cli
