// Throughput of the gradient compression kernels (runtime/include/orrery/runtime/compression.hpp):
// GB/s of fp32 gradient in, per scheme, against a memcpy of the same bytes in the same run,
// alternated (memcpy, int8, memcpy, top-k, memcpy, PowerSGD, ... for --rounds), medians printed.
// One thread, host memory. PowerSGD on a rows x cols matrix (default 768 x 3072, GPT-2 small's MLP)
// at --rank; int8 and top-k on the same number of floats.
//
//   bench_compression [--rows 768] [--cols 3072] [--rank 4] [--ratio 0.01] [--chunk 256]
//                     [--rounds 9]
#ifndef ORRERY_RUNTIME_AVAILABLE
#include <cstdio>
int main() {
  std::puts("bench_compression: the CPU runtime is not built (no OpenBLAS)");
  return 0;
}
#else
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "orrery/runtime/compression.hpp"

namespace c = orrery::runtime::compression;
using Clock = std::chrono::steady_clock;

namespace {
template <class F>
double seconds(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Gradient compression throughput against memcpy"};
  size_t rows = 768, cols = 3072, chunk = 256;
  int rank = 4, rounds = 9;
  double ratio = 0.01;
  app.add_option("--rows", rows);
  app.add_option("--cols", cols);
  app.add_option("--rank", rank);
  app.add_option("--ratio", ratio);
  app.add_option("--chunk", chunk);
  app.add_option("--rounds", rounds);
  CLI11_PARSE(app, argc, argv);
  const size_t n = rows * cols;
  const double gb = double(n) * sizeof(float) / 1e9;
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> g(n), dst(n), residual(n, 0.0f), sent(n), scales((n + chunk - 1) / chunk);
  for (auto& x : g) x = d(rng);
  std::vector<int8_t> codes(n);
  std::vector<uint32_t> idx;
  std::vector<float> val;
  std::vector<float> q(cols * size_t(std::min<size_t>(rank, std::min(rows, cols))));
  for (auto& x : q) x = d(rng);
  std::vector<double> tm, ti, tt, tp;
  volatile float sink = 0;
  for (int r = 0; r < rounds; ++r) {
    tm.push_back(seconds([&] { std::memcpy(dst.data(), g.data(), n * sizeof(float)); }));
    sink = sink + dst[r % n];
    ti.push_back(seconds([&] {
      c::int8_compress(g.data(), residual.data(), n, chunk, codes.data(), scales.data(),
                       sent.data());
    }));
    tm.push_back(seconds([&] { std::memcpy(dst.data(), g.data(), n * sizeof(float)); }));
    tt.push_back(seconds([&] { c::topk_compress(g.data(), residual.data(), n, ratio, idx, val); }));
    tm.push_back(seconds([&] { std::memcpy(dst.data(), g.data(), n * sizeof(float)); }));
    tp.push_back(seconds([&] {
      c::powersgd_step(
          g.data(), residual.data(), rows, cols, rank, q, [](float*, size_t) {}, sent.data());
    }));
  }
  std::printf("gradient %zu x %zu fp32 = %.1f MB, %d rounds alternated, medians, 1 thread\n", rows,
              cols, gb * 1e3, rounds);
  std::printf("%-28s %10s %10s %14s\n", "kernel", "ms", "GB/s in", "wire bytes");
  const auto row = [&](const char* name, const std::vector<double>& t, size_t wire) {
    std::printf("%-28s %10.3f %10.2f %14zu\n", name, median(t) * 1e3, gb / median(t), wire);
  };
  row("memcpy", tm, n * sizeof(float));
  row("int8 (compress+EF)", ti, c::int8_payload_bytes(n, chunk));
  row("topk (compress+EF)", tt, c::topk_payload_bytes(n, ratio));
  row("powersgd (step, no comm)", tp, c::powersgd_payload_bytes(rows, cols, rank));
  return sink == 12345.0f ? 1 : 0;
}
#endif
