// Figures for `orrery report` at scale: synthesize a trace of about 5 million spans, time
// compute_metrics on it in memory, then write it, load it back and time load + metrics (what
// `orrery report` does). Prints figures; asserts nothing about time.
//
//   bench_report [SPANS] [RANKS] [LAYERS] [DIR]   (defaults 5000000 8 48 /tmp)
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
  double best = 1e30, first = 0;
  profiler::Metrics m;
  for (int i = 0; i < 3; ++i) {
    t0 = std::chrono::steady_clock::now();
    m = profiler::compute_metrics(t);
    const double s = seconds_since(t0);
    if (i == 0) first = s;
    best = std::min(best, s);
  }
  std::printf("compute_metrics in memory: first %.3f s, best of 3 %.3f s (%.1f M spans/s); "
              "step mean %.3f ms\n",
              first, best, double(t.spans.size()) / best / 1e6, m.step_mean_ns / 1e6);

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
  traces::Trace loaded = traces::load_trace(path);
  const double load_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  m = profiler::compute_metrics(loaded);
  const double metrics_s = seconds_since(t0);
  std::printf("load_trace: %.3f s; compute_metrics: %.3f s; load + metrics: %.3f s\n", load_s,
              metrics_s, load_s + metrics_s);
  std::filesystem::remove(path);
  std::filesystem::remove(path + "-wal");
  std::filesystem::remove(path + "-shm");
  return 0;
}
