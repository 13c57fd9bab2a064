// Benchmark: one simulated training step of GPT-3 175B (tp 8, pp 16, 1F1B, micro-batch 1, global
// batch 1536) on H100 clusters of 1,024, 4,096 and 16,384 GPUs (scenarios/clusters/h100-1024.yaml
// resized). Each size runs in its own child process, so its peak RSS is its own. Prints wall time,
// peak RSS, engine events and events/s, and the predicted step time; a figure, not a test.
//
//   bench_sim_step [--model flow|analytical] [--all-ranks [--no-rail-symmetry]] [--gpus 1024,4096,16384]
//                  [--source DIR]
// --no-rail-symmetry simulates every rank literally (executor.hpp's rail symmetry off).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/sim/cluster.hpp"
#include "orrery/sim/sweep.hpp"

using namespace orrery;

namespace {

int run_one(const std::string& source, int gpus, sim::NetworkModel model, bool all_ranks,
            bool symmetry, int fd) {
  const Scenario base = load_scenario(source + "/scenarios/gpt3-175b.yaml");
  const sim::Cluster c =
      sim::resize_cluster(sim::load_cluster(source + "/scenarios/clusters/h100-1024.yaml"), gpus);
  const Scenario s = sim::fit_layout(base, c);
  sim::SimOptions opt;
  opt.network = model;
  opt.all_ranks = all_ranks;
  opt.rail_symmetry = symmetry;
  const auto t0 = std::chrono::steady_clock::now();
  const sim::SimResult r = sim::simulate(s, c, opt);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char buf[512];
  std::snprintf(buf, sizeof buf, "%d %d %zu %zu %llu %.6f %.6f %.4f %.1f\n", gpus, s.parallel.dp,
                r.simulated_ranks, r.ops, static_cast<unsigned long long>(r.events), wall,
                double(r.step_time_ns) * 1e-9, r.mfu, r.tokens_per_s);
  if (write(fd, buf, std::strlen(buf)) < 0) return 1;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The source tree: the working directory when it holds scenarios/, else where this file was built from.
  std::string source = std::filesystem::exists("scenarios/gpt3-175b.yaml")
                           ? std::string(".")
                           : std::filesystem::path(__FILE__).parent_path().parent_path().string();
  sim::NetworkModel model = sim::NetworkModel::Flow;
  bool all_ranks = false;
  bool symmetry = true;
  std::vector<int> sizes = {1024, 4096, 16384};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      const auto m = sim::network_model_from_string(argv[++i]);
      if (!m) {
        std::fprintf(stderr, "--model: flow or analytical\n");
        return 2;
      }
      model = *m;
    } else if (a == "--all-ranks") {
      all_ranks = true;
    } else if (a == "--no-rail-symmetry") {
      symmetry = false;
    } else if (a == "--source" && i + 1 < argc) {
      source = argv[++i];
    } else if (a == "--gpus" && i + 1 < argc) {
      sizes.clear();
      std::stringstream ss(argv[++i]);
      std::string item;
      while (std::getline(ss, item, ',')) sizes.push_back(std::stoi(item));
    } else {
      std::fprintf(stderr,
                   "usage: bench_sim_step [--model flow|analytical] [--all-ranks "
                   "[--no-rail-symmetry]] [--gpus LIST] "
                   "[--source DIR]\n");
      return 2;
    }
  }
  std::printf(
      "bench_sim_step: GPT-3 175B, tp 8, pp 16, 1F1B, micro-batch 1, global batch 1536, H100 "
      "fat-tree, "
      "%s network, %s\n",
      std::string(sim::to_string(model)).c_str(),
      all_ranks ? (symmetry ? "all ranks (rail symmetry where exact)" : "all ranks, literally")
                : "one representative rank per stage");
  std::printf("%7s %4s %6s %9s %11s %9s %10s %12s %11s %6s\n", "gpus", "dp", "ranks", "ops",
              "events", "wall s", "peak RSS", "events/s", "step (sim)", "MFU");
  for (const int gpus : sizes) {
    int p[2];
    if (pipe(p) != 0) return 1;
    const pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      int rc = 1;
      try {
        rc = run_one(source, gpus, model, all_ranks, symmetry, p[1]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%d GPUs: %s\n", gpus, e.what());
      }
      _exit(rc);
    }
    close(p[1]);
    std::string line;
    char buf[512];
    ssize_t n;
    while ((n = read(p[0], buf, sizeof buf)) > 0) line.append(buf, size_t(n));
    close(p[0]);
    int status = 0;
    struct rusage ru {};
    wait4(pid, &status, 0, &ru);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || line.empty()) {
      std::printf("%7d failed\n", gpus);
      continue;
    }
    int g = 0, dp = 0;
    size_t ranks = 0, ops = 0;
    unsigned long long events = 0;
    double wall = 0, step = 0, mfu = 0, tokens = 0;
    std::sscanf(line.c_str(), "%d %d %zu %zu %llu %lf %lf %lf %lf", &g, &dp, &ranks, &ops, &events,
                &wall, &step, &mfu, &tokens);
    std::printf("%7d %4d %6zu %9zu %11llu %9.3f %7.0f MB %12.3g %9.3f s %5.1f%%\n", g, dp, ranks,
                ops, events, wall, double(ru.ru_maxrss) / 1024.0,
                wall > 0 ? double(events) / wall : 0.0, step, 100 * mfu);
  }
  return 0;
}
