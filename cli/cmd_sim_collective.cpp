// `orrery sim-collective OP --cluster C --ranks N -b MIN -e MAX -f FACTOR`: the nccl-tests table a
// cluster would print, predicted by the simulator's network models (sim/nccl_table.hpp).
#include <cctype>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "command.hpp"
#include "orrery/common/error.hpp"
#include "orrery/common/format.hpp"
#include "orrery/sim/cluster.hpp"
#include "orrery/sim/nccl_table.hpp"
#include "orrery/sim/sim_target.hpp"

namespace orrery::cli {
namespace {

struct SimCollectiveArgs {
  std::string op;
  std::string cluster;
  int ranks = 0;
  std::string min_size = "8";
  std::string max_size = "128M";
  int64_t factor = 2;
  std::string algo = "auto";
  std::string proto = "auto";
  std::string model = "flow";
  int channels = 0;
  bool json = false;
};

// "all_reduce", "allreduce", "all-reduce" and nccl-tests' binary names ("all_reduce_perf") all
// work.
traces::CollOp parse_op(std::string s) {
  for (char& ch : s)
    ch = ch == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (s.size() > 5 && s.substr(s.size() - 5) == "_perf") s.resize(s.size() - 5);
  if (s == "allreduce") s = "all_reduce";
  if (s == "allgather") s = "all_gather";
  if (s == "reducescatter") s = "reduce_scatter";
  if (s == "alltoall") s = "all_to_all";
  if (s == "sendrecv") s = "send";
  auto op = traces::coll_op_from_string(s);
  if (!op || *op == traces::CollOp::None || *op == traces::CollOp::Barrier) {
    throw InputError("unknown collective '" + s +
                     "'; expected all_reduce, reduce_scatter, all_gather, broadcast, reduce, "
                     "all_to_all or sendrecv");
  }
  return *op;
}

Command setup(CLI::App& root) {
  auto a = std::make_shared<SimCollectiveArgs>();
  CLI::App* app = root.add_subcommand(
      "sim-collective",
      "Predict the nccl-tests table (size, time, algbw, busbw) of one collective on a cluster");
  app->add_option("op", a->op,
                  "all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all, sendrecv")
      ->required();
  app->add_option("--cluster", a->cluster, "Cluster file (scenarios/clusters/*.yaml) or its name")
      ->required();
  app->add_option("--ranks,-n", a->ranks, "Ranks (the first N GPUs of the cluster; default: all)");
  app->add_option("-b,--minbytes", a->min_size, "Smallest size (8, 1K, 1M, 1G)")
      ->capture_default_str();
  app->add_option("-e,--maxbytes", a->max_size, "Largest size")->capture_default_str();
  app->add_option("-f,--stepfactor", a->factor, "Size multiplication factor")
      ->capture_default_str();
  app->add_option("--algo", a->algo,
                  "auto, ring, tree, hd (halving-doubling), direct, hierarchical, nvls, nvls-tree")
      ->capture_default_str();
  app->add_option("--proto", a->proto,
                  "NCCL protocol: auto, ll, ll128, simple (only with the cluster's nccl model)")
      ->capture_default_str();
  app->add_option("--model", a->model, "Network model: flow (max-min contention) or analytical")
      ->capture_default_str();
  app->add_option("--channels", a->channels, "Channels (0: the cluster's default)")
      ->capture_default_str();
  app->add_flag("--json", a->json, "Print one JSON object");

  auto run = [a]() {
    sim::NcclSweep s;
    s.op = parse_op(a->op);
    const sim::Cluster cluster = sim::load_cluster(sim::find_cluster_file(a->cluster));
    s.ranks = a->ranks > 0 ? a->ranks : cluster.num_gpus();
    if (a->ranks < 0) throw InputError("--ranks must be >= 1");
    if ((s.op == traces::CollOp::Send || s.op == traces::CollOp::Recv) && a->ranks == 0)
      s.ranks = 2;
    s.min_bytes = parse_size(a->min_size);
    s.max_bytes = parse_size(a->max_size);
    s.factor = a->factor;
    const auto algo = sim::algorithm_from_string(a->algo);
    if (!algo)
      throw InputError("--algo '" + a->algo +
                       "': expected auto, ring, tree, hd, direct, hierarchical, nvls or nvls-tree");
    s.algo = *algo;
    const auto proto = sim::protocol_from_string(a->proto);
    if (!proto) throw InputError("--proto '" + a->proto + "': expected auto, ll, ll128 or simple");
    s.protocol = *proto;
    const auto model = sim::network_model_from_string(a->model);
    if (!model) throw InputError("--model '" + a->model + "': expected flow or analytical");
    s.model = *model;
    if (a->channels < 0) throw InputError("--channels must be >= 0");
    s.channels = a->channels;
    const auto rows = sim::predict_nccl_table(cluster, s);
    if (a->json) {
      nlohmann::json j;
      j["op"] = std::string(traces::to_string(s.op));
      j["cluster"] = cluster.name;
      j["topology"] = cluster.topology->describe();
      j["ranks"] = s.ranks;
      j["model"] = std::string(sim::to_string(s.model));
      j["algo"] = std::string(sim::to_string(s.algo));
      j["rows"] = nlohmann::json::array();
      double sum = 0;
      for (const auto& r : rows) {
        j["rows"].push_back({{"size_bytes", r.bytes},
                             {"count", r.count},
                             {"type", "float"},
                             {"time_us", static_cast<double>(r.time_ns) / 1000.0},
                             {"time_ns", r.time_ns},
                             {"algbw_gb_per_s", r.algbw_gb_per_s},
                             {"busbw_gb_per_s", r.busbw_gb_per_s},
                             {"algorithm", std::string(sim::to_string(r.algo))},
                             {"protocol", std::string(sim::to_string(r.protocol))},
                             {"channels", r.channels}});
        sum += r.busbw_gb_per_s;
      }
      j["avg_busbw_gb_per_s"] = rows.empty() ? 0.0 : sum / static_cast<double>(rows.size());
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << sim::format_nccl_table(cluster, s, rows);
    }
    return 0;
  };
  return Command{app, run};
}

const Registrar kRegistrar{setup};

}  // namespace
}  // namespace orrery::cli
