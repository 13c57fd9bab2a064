// Figures for `orrery report` at scale: synthesize a trace of about 5 million spans, time
// compute_metrics on it in memory, then write it, load it back and time load + metrics (what
// `orrery report` does). Prints figures; asserts nothing about time.
//
//   bench_report [SPANS] [RANKS] [LAYERS] [DIR]   (defaults 5000000 8 48 /tmp)
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "orrery/profiler/metrics.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/synth.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Process CPU time (user + system, all threads): on a shared machine wall time alone misleads.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace orrery;
  const int64_t target = argc > 1 ? std::atoll(argv[1]) : 5'000'000;
  traces::SynthOptions o;
  o.ranks = argc > 2 ? std::atoi(argv[2]) : 8;
  o.layers = argc > 3 ? std::atoi(argv[3]) : 48;
  const std::string dir = argc > 4 ? argv[4] : "/tmp";
  o.steps = traces::synth_steps_for_spans(o, target);

  auto t0 = std::chrono::steady_clock::now();
  traces::Trace t = traces::synthesize(o);
  const double synth_s = seconds_since(t0);
  std::printf("synthesize: %zu spans, %zu counters (%d ranks x %d steps x %d layers) in %.3f s\n",
              t.spans.size(), t.counters.size(), o.ranks, o.steps, o.layers, synth_s);

  // In memory: first run (as `orrery report` sees it) and best of 3.
  double best = 1e30, first = 0, best_cpu = 1e30;
  profiler::Metrics m;
  for (int i = 0; i < 3; ++i) {
    t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    m = profiler::compute_metrics(t);
    const double s = seconds_since(t0);
    best_cpu = std::min(best_cpu, cpu_seconds() - c0);
    if (i == 0) first = s;
    best = std::min(best, s);
  }
  std::printf(
      "compute_metrics in memory: first %.3f s, best of 3 %.3f s wall (%.1f M spans/s), "
      "%.3f s CPU; step mean %.3f ms\n",
      first, best, double(t.spans.size()) / best / 1e6, best_cpu, m.step_mean_ns / 1e6);
  profiler::MetricsOptions single;
  single.threads = 1;
  t0 = std::chrono::steady_clock::now();
  profiler::compute_metrics(t, single);
  std::printf("compute_metrics with 1 thread: %.3f s\n", seconds_since(t0));

  profiler::MetricsOptions win;
  win.window_start_ns = m.start_ns + (m.end_ns - m.start_ns) / 4;
  win.window_end_ns = m.start_ns + (m.end_ns - m.start_ns) / 2;
  t0 = std::chrono::steady_clock::now();
  const auto mw = profiler::compute_metrics(t, win);
  std::printf("compute_metrics on a quarter window: %.3f s (%lld spans in window)\n",
              seconds_since(t0), static_cast<long long>(mw.span_count));

  const std::string path = dir + "/orrery_bench_report_" + std::to_string(::getpid()) + ".db";
  t0 = std::chrono::steady_clock::now();
  traces::write_trace(t, path);
  const double write_s = seconds_since(t0);
  std::printf("write_trace: %.3f s, %.1f MB\n", write_s,
              double(std::filesystem::file_size(path)) / 1e6);
  t = {};

  t0 = std::chrono::steady_clock::now();
  double c0 = cpu_seconds();
  traces::Trace loaded = traces::load_trace(path);
  const double load_s = seconds_since(t0), load_cpu = cpu_seconds() - c0;
  t0 = std::chrono::steady_clock::now();
  c0 = cpu_seconds();
  m = profiler::compute_metrics(loaded);
  const double metrics_s = seconds_since(t0), metrics_cpu = cpu_seconds() - c0;
  std::printf(
      "load_trace: %.3f s wall, %.3f s CPU; compute_metrics: %.3f s wall, %.3f s CPU; "
      "load + metrics: %.3f s wall (%zu spans)\n",
      load_s, load_cpu, metrics_s, metrics_cpu, load_s + metrics_s, loaded.spans.size());
  std::filesystem::remove(path);
  std::filesystem::remove(path + "-wal");
  std::filesystem::remove(path + "-shm");
  return 0;
}
