// merge_traces on per-rank files, as rank 0 runs it at the end of a multi-rank run: its time
// against copying the same files (the disk's speed for those bytes, measured in the same run,
// alternated), and its peak memory (the merge runs in a child process of its own, so its maximum
// resident set is the merge's alone) against the size of the files. The merge's last phase, the
// merged file's zoom levels from the inputs' levels, is timed again on its own in a child, with
// what computing them from the merged spans would cost instead.
//
//   bench_merge [SPANS=5000000] [RANKS=64] [REPEATS=3] [DIR=/tmp]
//   bench_merge --inputs SPANS RANKS DIR   (only writes the per-rank files into DIR, for profiling
//                                           `bench_merge --child OUT DIR/rank*.db` under callgrind)
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "orrery/common/stats.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/synth.hpp"
#include "orrery/traces/zoom.hpp"

namespace fs = std::filesystem;
using namespace orrery;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One merge in a fresh process (this program with --child): (seconds, peak resident MiB).
std::pair<double, double> merge_in_child(const std::string& self, const std::string& out,
                                         const std::vector<std::string>& inputs,
                                         const char* mode = "--child") {
  std::vector<std::string> args{self, mode, out};
  args.insert(args.end(), inputs.begin(), inputs.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    std::exit(1);
  }
  if (pid == 0) {
    execv(self.c_str(), argv.data());
    std::perror("execv");
    _exit(127);
  }
  int status = 0;
  rusage ru{};
  if (wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "bench_merge: the merge failed (status %d)\n", status);
    std::exit(1);
  }
  return {seconds_since(t0), double(ru.ru_maxrss) / 1024.0};
}

// The zoom phase in a child (--zoom-child): seconds from the inputs' levels; from the spans into
// *spans_s.
double zoom_phase(const std::string& self, const std::string& out,
                  const std::vector<std::string>& inputs, std::vector<double>* spans_s) {
  std::string cmd = "'" + self + "' --zoom-child '" + out + "'";
  for (const auto& in : inputs) cmd += " '" + in + "'";
  FILE* p = popen(cmd.c_str(), "r");
  double a = -1, b = -1;
  if (!p || std::fscanf(p, "%lf %lf", &a, &b) != 2) {
    std::fprintf(stderr, "bench_merge: the zoom phase failed\n");
    std::exit(1);
  }
  pclose(p);
  spans_s->push_back(b);
  return a;
}

double copy_all(const std::vector<std::string>& inputs, const fs::path& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& in : inputs) fs::copy_file(in, dir / fs::path(in).filename());
  sync();  // the copies on disk, as the merge's output is (SQLite syncs on commit)
  return seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--zoom-child") {
    // The merge's last phase alone: the merged file's zoom levels from the inputs' (read,
    // combined, written), and, for comparison, from its spans.
    std::vector<std::string> inputs(argv + 3, argv + argc);
    const auto t0 = std::chrono::steady_clock::now();
    const auto z = traces::merge_zoom_levels(inputs, argv[2]);
    if (!z) return 1;
    traces::write_zoom_levels(argv[2], *z);
    const double merged_s = seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    traces::write_zoom_levels(argv[2], traces::compute_zoom_levels(traces::TraceReader(argv[2])));
    std::printf("%.6f %.6f\n", merged_s, seconds_since(t1));
    return 0;
  }
  if (argc >= 3 && std::string(argv[1]) == "--child") {
    std::vector<std::string> inputs(argv + 3, argv + argc);
    traces::merge_traces(inputs, argv[2]);
    return 0;
  }
  const bool inputs_only = argc == 5 && std::string(argv[1]) == "--inputs";
  if (inputs_only) ++argv, --argc;
  const int64_t spans = argc > 1 ? std::atoll(argv[1]) : 5'000'000;
  const int ranks = argc > 2 ? std::atoi(argv[2]) : 64;
  const int repeats = argc > 3 && !inputs_only ? std::atoi(argv[3]) : 3;
  const fs::path dir = inputs_only ? fs::path(argv[3])
                                   : fs::path(argc > 4 ? argv[4] : "/tmp") / "orrery-bench-merge";
  fs::remove_all(dir);
  fs::create_directories(dir);

  // Per-rank files of a synthetic DDP trace, each with the rank's own string table.
  std::vector<std::string> inputs;
  uintmax_t input_bytes = 0;
  {
    traces::SynthOptions o;
    o.ranks = ranks;
    o.steps = traces::synth_steps_for_spans(o, spans);
    const traces::Trace full = traces::synthesize(o);
    for (int r = 0; r < ranks; ++r) {
      traces::Trace part;
      part.meta = full.meta;
      part.ranks.push_back(full.ranks[size_t(r)]);
      for (const auto& s : full.streams)
        if (s.rank == r) part.streams.push_back(s);
      part.comms = full.comms;
      part.strings = full.strings;
      for (const auto& s : full.spans)
        if (s.rank == r) part.spans.push_back(s);
      for (const auto& c : full.counters)
        if (c.rank == r) part.counters.push_back(c);
      inputs.push_back((dir / ("rank" + std::to_string(r) + ".db")).string());
      traces::write_trace(part, inputs.back());
      input_bytes += fs::file_size(inputs.back());
    }
    std::printf("%zu spans, %zu counter samples in %d per-rank files, %.1f MiB\n",
                full.spans.size(), full.counters.size(), ranks, double(input_bytes) / 1048576.0);
  }
  if (inputs_only) return 0;
  const std::string self = fs::canonical("/proc/self/exe").string();
  std::vector<double> merge_s, copy_s, rss_mib, zoom_s, spans_zoom_s;
  for (int i = 0; i < repeats; ++i) {
    // Alternated: copy, merge.
    copy_s.push_back(copy_all(inputs, dir / "copy"));
    const auto out = (dir / "merged.db").string();
    fs::remove(out);
    const auto [s, rss] = merge_in_child(self, out, inputs);
    merge_s.push_back(s);
    rss_mib.push_back(rss);
    zoom_s.push_back(zoom_phase(self, out, inputs, &spans_zoom_s));
  }
  const double m = median(merge_s), c = median(copy_s);
  std::printf("merge      %.2f s median of %d (%.0f MiB/s of input), peak resident %.0f MiB\n", m,
              repeats, double(input_bytes) / 1048576.0 / m, median(rss_mib));
  std::printf(
      "  of which  about %.2f s median: the merged file's zoom levels from the inputs' "
      "(timed again alone; from the merged spans instead: %.2f s)\n",
      median(zoom_s), median(spans_zoom_s));
  std::printf("copy       %.2f s median of %d (%.0f MiB/s): the same bytes copied and synced\n", c,
              repeats, double(input_bytes) / 1048576.0 / c);
  std::printf("ratio      merge / copy = %.2f; peak resident / input size = %.2f\n", m / c,
              median(rss_mib) / (double(input_bytes) / 1048576.0));
  fs::remove_all(dir);
  return 0;
}
