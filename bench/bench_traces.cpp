// Trace store figures: writer throughput over millions of spans, file size, open + load_all,
// time-window queries returning ~10k spans, collective and step queries, Chrome JSON export.
// Usage: bench_traces [--spans N] [--dir DIR] [--keep] [--json] [--write-only]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "orrery/traces/chrome_export.hpp"
#include "orrery/traces/store.hpp"

using namespace orrery::traces;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Process CPU time (user + system): on a shared machine this, not wall time, shows what the code
// costs. Every phase here is single-threaded, so on an idle machine the two agree.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// Cheap deterministic generator: the span generation must not dominate what is measured.
struct XorShift {
  uint64_t s = 0x9e3779b97f4a7c15ull;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

constexpr int kRanks = 8;
constexpr int kStreams = 4;  // compute, comm, memcpy, phases

// Wall and CPU seconds of one phase.
struct Phase {
  Clock::time_point wall0 = Clock::now();
  double cpu0 = cpu_seconds();
  double wall() const { return seconds_since(wall0); }
  double cpu() const { return cpu_seconds() - cpu0; }
};

}  // namespace

int main(int argc, char** argv) {
  int64_t n_spans = 5'000'000;
  std::string dir = std::filesystem::temp_directory_path().string();
  bool keep = false, as_json = false, write_only = false;
  std::string read_path;  // --read FILE: skip writing, measure the reads of an existing trace
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--spans") && i + 1 < argc) {
      n_spans = std::atoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--dir") && i + 1 < argc) {
      dir = argv[++i];
    } else if (!std::strcmp(argv[i], "--keep")) {
      keep = true;
    } else if (!std::strcmp(argv[i], "--json")) {
      as_json = true;
    } else if (!std::strcmp(argv[i], "--read") && i + 1 < argc) {
      read_path = argv[++i];
      keep = true;
    } else if (!std::strcmp(argv[i], "--write-only")) {
      write_only = true;  // for profiling the writer
    } else {
      std::fprintf(stderr, "usage: bench_traces [--spans N] [--dir DIR] [--keep] [--json] [--write-only] [--read FILE]\n");
      return 2;
    }
  }
  const std::string path = read_path.empty() ? dir + "/bench_traces.db" : read_path;
  nlohmann::json fig;
  auto record = [&](const char* name, const Phase& p) {
    fig[std::string(name) + "_wall_s"] = p.wall();
    fig[std::string(name) + "_cpu_s"] = p.cpu();
  };

  // --- write: spans arrive round-robin over ranks and streams, each stream in time order, as a
  // multi-threaded recorder would produce them.
  if (read_path.empty()) {
    Phase all;
    TraceWriter w(path);
    RunMeta meta;
    meta.source = TraceSource::Synth;
    meta.scenario_name = "bench";
    meta.world_size = kRanks;
    meta.dp = kRanks;
    w.set_meta(meta);
    w.add_communicator({0, CommKind::World, "world", {0, 1, 2, 3, 4, 5, 6, 7}});
    for (int r = 0; r < kRanks; ++r) {
      w.add_rank({r, "bench", "cpu", r, 0, 0});
      for (int s = 0; s < kStreams; ++s) w.add_stream({r, s, "stream " + std::to_string(s)});
    }
    std::vector<NameId> names;
    for (int i = 0; i < 64; ++i) names.push_back(w.intern("kernel_" + std::to_string(i)));
    std::vector<int64_t> now(kRanks * kStreams, 0);
    XorShift rng;
    for (int64_t i = 0; i < n_spans; ++i) {
      const int key = static_cast<int>(i % (kRanks * kStreams));
      const uint64_t x = rng.next();
      Span s;
      s.rank = key / kStreams;
      s.stream = key % kStreams;
      s.kind = s.stream == 1 ? SpanKind::Collective : SpanKind::Compute;
      s.name = names[x & 63];
      s.start_ns = now[key] + static_cast<int64_t>((x >> 8) & 255);
      s.end_ns = s.start_ns + 200 + static_cast<int64_t>((x >> 16) & 4095);
      now[key] = s.end_ns;
      s.step = static_cast<int32_t>(i / (n_spans / 100 + 1));
      s.layer = static_cast<int32_t>((x >> 32) % 12);
      s.flops = static_cast<double>((x >> 40) & 0xffff) * 1e6;
      if (s.kind == SpanKind::Collective) {
        s.comm = 0;
        s.op = CollOp::AllReduce;
        s.bytes = 1 << 22;
        s.seq = i / (kRanks * kStreams);
      }
      w.add_span(s);
    }
    w.flush();
    record("write", all);
    if (write_only) {
      std::printf("write: %.3f s cpu, %.0f spans per cpu-second\n", all.cpu(),
                  static_cast<double>(n_spans) / all.cpu());
      return 0;
    }
    Phase close;
    w.close();
    record("close", close);
  }
  const auto file_bytes = std::filesystem::file_size(path);
  fig["file_bytes"] = file_bytes;

  {
    Phase load;
    TraceReader r(path);
    Trace t = r.load_all();
    record("open_load_all", load);
    fig["loaded_spans"] = t.spans.size();
    fig["load_threads_default"] = std::min(8u, std::thread::hardware_concurrency());
    {
      Phase one;
      const Trace t1 = r.load_all(1);
      record("load_all_1thread", one);
    }

    if (!read_path.empty()) n_spans = static_cast<int64_t>(t.spans.size());

    // Windows on the stream with the most spans, sized to hold ~10k spans.
    int64_t b0 = 0, b1 = 0, cnt = 0;
    int32_t wrank = 0, wstream = 0;
    for (const auto& b : r.stream_bounds()) {
      if (b.count > cnt) b0 = b.start_ns, b1 = b.end_ns, cnt = b.count, wrank = b.rank, wstream = b.stream;
    }
    const int64_t width = cnt > 0 ? (b1 - b0) * 10000 / cnt : 1;
    std::vector<double> wall_ms, cpu_ms;
    size_t returned = 0;
    XorShift rng;
    constexpr int kQueries = 50;
    for (int q = 0; q < kQueries; ++q) {
      const auto range = static_cast<uint64_t>(std::max<int64_t>(1, b1 - b0 - width));
      const int64_t start = b0 + static_cast<int64_t>(rng.next() % range);
      Phase p;
      returned += r.spans_in_window(wrank, wstream, start, start + width).size();
      wall_ms.push_back(p.wall() * 1e3);
      cpu_ms.push_back(p.cpu() * 1e3);
    }
    std::sort(wall_ms.begin(), wall_ms.end());
    std::sort(cpu_ms.begin(), cpu_ms.end());
    fig["window_wall_ms_median"] = wall_ms[kQueries / 2];
    fig["window_cpu_ms_median"] = cpu_ms[kQueries / 2];
    fig["window_spans_mean"] = static_cast<double>(returned) / kQueries;

    Phase coll;
    fig["collectives_returned"] = r.collectives_of(0).size();
    record("collectives_of", coll);
    Phase steps;
    fig["step_rows"] = r.step_aggregates().size();
    record("step_aggregates", steps);
    const std::string json_path = dir + "/bench_traces.json";
    Phase exp;
    export_chrome_json_file(t, json_path);
    record("chrome_export", exp);
    fig["chrome_json_bytes"] = std::filesystem::file_size(json_path);
    if (!keep) std::filesystem::remove(json_path);
  }
  if (!keep) std::filesystem::remove(path);

  fig["spans"] = n_spans;
  if (as_json) {
    std::printf("%s\n", fig.dump().c_str());
    return 0;
  }
  const double n = static_cast<double>(n_spans);
  auto line = [&](const char* label, const char* key) {
    std::printf("  %-26s wall %8.3f s   cpu %8.3f s\n", label,
                fig[std::string(key) + "_wall_s"].get<double>(),
                fig[std::string(key) + "_cpu_s"].get<double>());
  };
  std::printf("trace store, %lld spans (%d ranks x %d streams); cpu = process user+sys time\n",
              static_cast<long long>(n_spans), kRanks, kStreams);
  if (!read_path.empty()) {
    fig["write_wall_s"] = fig["write_cpu_s"] = fig["close_wall_s"] = fig["close_cpu_s"] = 0.0;
  }
  line("write (add_span, flush)", "write");
  std::printf("  %-26s wall %8.0f /s  cpu %8.0f /s\n", "  spans per second",
              n / fig["write_wall_s"].get<double>(), n / fig["write_cpu_s"].get<double>());
  line("close (indexes)", "close");
  std::printf("  %-26s %.1f MiB (%.1f bytes/span)\n", "file size",
              static_cast<double>(file_bytes) / (1 << 20), static_cast<double>(file_bytes) / n);
  line("open + load_all", "open_load_all");
  line("load_all, 1 thread", "load_all_1thread");
  std::printf("  %-26s wall %8.3f ms  cpu %8.3f ms  (median of 50, %.0f spans each)\n",
              "window query", fig["window_wall_ms_median"].get<double>(),
              fig["window_cpu_ms_median"].get<double>(), fig["window_spans_mean"].get<double>());
  line("collectives_of(world)", "collectives_of");
  line("step_aggregates", "step_aggregates");
  line("chrome json export", "chrome_export");
  std::printf("  %-26s %.1f MiB\n", "chrome json size",
              static_cast<double>(fig["chrome_json_bytes"].get<uint64_t>()) / (1 << 20));
  return 0;
}
