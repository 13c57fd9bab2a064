// Throughput of NVMe offload (runtime/include/orrery/runtime/offload.hpp) against the disk's
// sequential bandwidth measured in the same run with dd and direct I/O (oflag=direct /
// iflag=direct, the page cache bypassed). Per round, alternated: dd write, dd read, then the
// offload store's streamed pass over two planes (the AdamW moments: read ahead, written behind,
// a trivial update in between) with the file's pages evicted first (fdatasync + posix_fadvise
// DONTNEED), so its reads come from the disk; its writes land in the page cache, so the figure
// with the fdatasync that puts them on the disk is printed too. Medians over --rounds.
//
//   bench_offload [--dir /tmp] [--mb 256] [--chunk-mb 4] [--rounds 3]
#ifndef ORRERY_RUNTIME_AVAILABLE
#include <cstdio>
int main() {
  std::puts("bench_offload: the CPU runtime is not built (no OpenBLAS)");
  return 0;
}
#else
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "orrery/runtime/offload.hpp"

using Clock = std::chrono::steady_clock;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// dd's own figure: the seconds of its summary line ("... bytes ... copied, 1.23 s, ...").
double dd_seconds(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return 0;
  char line[512];
  double s = 0;
  while (std::fgets(line, sizeof line, p) != nullptr) {
    const std::string l(line);
    const auto copied = l.find("copied, ");
    if (copied != std::string::npos) s = std::atof(l.c_str() + copied + 8);
  }
  ::pclose(p);
  return s;
}

// The file's dirty pages on the disk, then none of its pages in the cache.
void sync_and_evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"NVMe offload throughput against dd with direct I/O"};
  std::string dir = "/tmp";
  double mb = 256, chunk_mb = 4;
  int rounds = 3;
  app.add_option("--dir", dir, "directory on the disk to measure");
  app.add_option("--mb", mb, "MiB per plane (two planes: the moments)");
  app.add_option("--chunk-mb", chunk_mb, "MiB per plane per I/O request");
  app.add_option("--rounds", rounds);
  CLI11_PARSE(app, argc, argv);
  const auto n = static_cast<std::size_t>(mb * 1048576.0 / 4.0);
  const auto chunk = static_cast<std::size_t>(chunk_mb * 1048576.0 / 4.0);
  const double bytes = 2.0 * double(n) * 4.0;  // per direction per pass
  const std::string dd_file = dir + "/orrery-bench-dd-" + std::to_string(::getpid());
  const long blocks = static_cast<long>(bytes / 4194304.0);
  orrery::runtime::OffloadStore store(dir, "bench", 2, n, chunk, nullptr);
  std::vector<double> dd_w, dd_r, pass, pass_sync;
  for (int r = 0; r < rounds; ++r) {
    dd_w.push_back(dd_seconds("dd if=/dev/zero of=" + dd_file + " bs=4M count=" +
                              std::to_string(blocks) + " oflag=direct conv=fsync"));
    dd_r.push_back(dd_seconds("dd if=" + dd_file + " of=/dev/null bs=4M iflag=direct"));
    sync_and_evict(store.path());
    const auto t0 = Clock::now();
    store.for_each_chunk(0, n, r, [](std::size_t, std::size_t count, float* const* p) {
      for (std::size_t i = 0; i < count; ++i) p[1][i] = p[0][i] + 1.0f;
    });
    pass.push_back(since(t0));
    sync_and_evict(store.path());
    pass_sync.push_back(since(t0));
  }
  ::unlink(dd_file.c_str());
  const double gb = bytes / 1e9;
  std::printf("offload file %s: 2 planes x %.0f MiB, chunks of %.1f MiB per plane, %d rounds\n",
              store.path().c_str(), mb, chunk_mb, rounds);
  std::printf("%-52s %10s %10s\n", "", "median s", "GB/s");
  std::printf("%-52s %10.3f %10.2f\n", "dd write, oflag=direct conv=fsync", median(dd_w),
              gb / median(dd_w));
  std::printf("%-52s %10.3f %10.2f\n", "dd read, iflag=direct", median(dd_r), gb / median(dd_r));
  std::printf("%-52s %10.3f %10.2f\n", "offload pass (read + write), writes to page cache",
              median(pass), 2 * gb / median(pass));
  std::printf("%-52s %10.3f %10.2f\n", "offload pass with fdatasync (read + write on disk)",
              median(pass_sync), 2 * gb / median(pass_sync));
  std::printf("offload pass against dd (read + write time): %.2f x with the sync\n",
              (median(dd_w) + median(dd_r)) / median(pass_sync));
  return 0;
}
#endif
