// ZeRO-Offload's device-independent part (runtime offload_pipeline.hpp), on the CPU: the chunk
// schedule against its closed form and the hazards it must avoid, and the pipeline's host step
// over a CPU stand-in for the device's copies (memcpy into staging and back), bit for bit the
// whole range's adamw_update, with the moments in memory and streamed through an OffloadStore.
// The CUDA copies themselves (cuda/host_offload.hpp) are checked on a GPU
// (tests/runtime/cuda/test_cuda_offload.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "orrery/runtime/offload.hpp"
#include "orrery/runtime/offload_pipeline.hpp"

namespace orrery::runtime {
namespace {

using Kind = OffloadOpKind;

// Where the closed form puts each operation of chunk i among c chunks (offload_pipeline.hpp):
// D(0) first, D(i) right after S(i-2)'s upload U(i-2) for i >= 1, i.e. at 3(i-1)+1; S(i) two after
// it (3i+2), or at 3c-2 for the last chunk (no download follows it); U(i) right after S(i).
std::size_t download_at(std::size_t i) { return i == 0 ? 0 : 3 * (i - 1) + 1; }
std::size_t step_at(std::size_t i, std::size_t c) { return i + 1 == c ? 3 * c - 2 : 3 * i + 2; }

TEST(OffloadSchedule, IsTheClosedForm) {
  EXPECT_TRUE(offload_chunk_schedule(0).empty());
  for (std::size_t c = 1; c <= 9; ++c) {
    const std::vector<OffloadOp> s = offload_chunk_schedule(c);
    ASSERT_EQ(s.size(), 3 * c);
    for (std::size_t i = 0; i < c; ++i) {
      const int b = static_cast<int>(i % 2);
      EXPECT_EQ(s[download_at(i)], (OffloadOp{Kind::kDownload, i, b})) << c << " " << i;
      EXPECT_EQ(s[step_at(i, c)], (OffloadOp{Kind::kStep, i, b})) << c << " " << i;
      EXPECT_EQ(s[step_at(i, c) + 1], (OffloadOp{Kind::kUpload, i, -1})) << c << " " << i;
    }
  }
}

// What the schedule promises: while the host steps chunk i, chunk i+1's download and chunk i-1's
// upload are queued before it (they overlap it on the copy stream); a download never lands in a
// staging buffer whose previous chunk has not been stepped.
TEST(OffloadSchedule, OverlapsNeighboursAndNeverOverwritesAnUnsteppedBuffer) {
  for (std::size_t c = 1; c <= 9; ++c) {
    const std::vector<OffloadOp> s = offload_chunk_schedule(c);
    std::vector<long> stepped_chunk(kOffloadStagingBuffers, -1);  // by buffer: last chunk stepped
    std::vector<long> loaded_chunk(kOffloadStagingBuffers, -1);   // last chunk downloaded into it
    for (std::size_t p = 0; p < s.size(); ++p) {
      const OffloadOp& op = s[p];
      if (op.kind == Kind::kDownload) {
        EXPECT_EQ(stepped_chunk[op.buffer], loaded_chunk[op.buffer]) << c << " at " << p;
        loaded_chunk[op.buffer] = long(op.chunk);
      } else if (op.kind == Kind::kStep) {
        EXPECT_EQ(loaded_chunk[op.buffer], long(op.chunk)) << c << " at " << p;
        stepped_chunk[op.buffer] = long(op.chunk);
        if (op.chunk + 1 < c) {
          EXPECT_LT(download_at(op.chunk + 1), p);
        }
        if (op.chunk > 0) {
          EXPECT_LT(step_at(op.chunk - 1, c) + 1, p);  // U(i-1)
        }
      }
    }
  }
}

std::vector<float> random_vec(std::size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// The device's copies done with memcpy on the calling thread: gradients and parameters are plain
// arrays here; each call is logged as the schedule's operation it carries out.
class MemcpyTransfers final : public OffloadTransfers {
 public:
  MemcpyTransfers(std::size_t chunk, float* params, const float* grads, const float* master)
      : staging_{std::vector<float>(chunk), std::vector<float>(chunk)},
        params_(params),
        grads_(grads),
        master_(master) {}
  void download(std::size_t first, std::size_t n, int buffer) override {
    std::memcpy(staging_[buffer].data(), grads_ + first, n * sizeof(float));
    log.push_back({Kind::kDownload, first, buffer});
  }
  const float* downloaded(int buffer) override {
    log.push_back({Kind::kStep, 0, buffer});
    return staging_[buffer].data();
  }
  void upload(std::size_t first, std::size_t n) override {
    std::memcpy(params_ + first, master_ + first, n * sizeof(float));
    log.push_back({Kind::kUpload, first, -1});
  }
  std::vector<OffloadOp> log;  // chunk: the first element (steps: 0)

 private:
  std::vector<float> staging_[2];
  float* params_;
  const float* grads_;
  const float* master_;
};

// A range of 1000 elements at flat offset 300, its moments at 100 in arrays of 1200, decay on
// ranges that cut across the 128-element chunks (the last one 104).
struct Case {
  static constexpr std::size_t kCount = 1000, kMomentBegin = 100, kFlat = 300, kChunk = 128;
  std::vector<ParamRange> decay{{250, 100}, {500, 300}, {1250, 10}};
  AdamWConfig cfg;
  Case() { cfg.lr = 1e-2f; }
};

TEST(OffloadPipeline, HostStepIsTheWholeRangesAdamWBitForBit) {
  const Case k;
  std::vector<float> want_p = random_vec(k.kCount, 1, -1, 1), want_m(1200, 0), want_v(1200, 0);
  std::vector<float> params = want_p, master = want_p, m(1200, 0), v(1200, 0);
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<float> g = random_vec(k.kCount, 10 + uint32_t(step), -0.5f, 0.5f);
    adamw_update(want_p.data(), g.data(), want_m.data() + k.kMomentBegin,
                 want_v.data() + k.kMomentBegin, k.kFlat, k.kCount, k.decay, step, k.cfg);
    MemcpyTransfers t(k.kChunk, params.data(), g.data(), master.data());
    OffloadRange r{master.data(), m.data(), v.data(), nullptr, k.kMomentBegin, k.kFlat, k.kCount};
    offload_adamw_range(t, r, k.kChunk, k.decay, step, k.cfg, nullptr, 0);
    // The log is the schedule, each chunk at its first element.
    const std::vector<OffloadOp> s = offload_chunk_schedule(8);
    ASSERT_EQ(t.log.size(), s.size());
    for (std::size_t p = 0; p < s.size(); ++p) {
      EXPECT_EQ(t.log[p].kind, s[p].kind) << p;
      EXPECT_EQ(t.log[p].buffer, s[p].buffer) << p;
      if (s[p].kind != Kind::kStep) {
        EXPECT_EQ(t.log[p].chunk, s[p].chunk * k.kChunk) << p;
      }
    }
  }
  EXPECT_EQ(0, std::memcmp(master.data(), want_p.data(), k.kCount * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(params.data(), want_p.data(), k.kCount * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(m.data(), want_m.data(), m.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(v.data(), want_v.data(), v.size() * sizeof(float)));
}

TEST(OffloadPipeline, NvmeMomentsStreamWithThePipelinesChunks) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("orrery_offload_pipe_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const Case k;
  std::vector<float> want_p = random_vec(k.kCount, 2, -1, 1), want_m(1200, 0), want_v(1200, 0);
  std::vector<float> params = want_p, master = want_p;
  {
    OffloadStore store(dir.string(), "pipe", 2, 1200, k.kChunk, nullptr);
    ASSERT_EQ(store.chunk_elems(), k.kChunk);
    for (int64_t step = 1; step <= 3; ++step) {
      const std::vector<float> g = random_vec(k.kCount, 20 + uint32_t(step), -0.5f, 0.5f);
      adamw_update(want_p.data(), g.data(), want_m.data() + k.kMomentBegin,
                   want_v.data() + k.kMomentBegin, k.kFlat, k.kCount, k.decay, step, k.cfg);
      MemcpyTransfers t(k.kChunk, params.data(), g.data(), master.data());
      OffloadRange r{master.data(), nullptr, nullptr, &store, k.kMomentBegin, k.kFlat, k.kCount};
      // The chunk asked for is the store's when it has one.
      offload_adamw_range(t, r, 7, k.decay, step, k.cfg, nullptr, int32_t(step));
      EXPECT_EQ(t.log.size(), 3u * 8u);
    }
    std::vector<float> m(1200), v(1200);
    store.read(0, 0, 1200, m.data(), -1);
    store.read(1, 0, 1200, v.data(), -1);
    EXPECT_EQ(0, std::memcmp(m.data(), want_m.data(), m.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(v.data(), want_v.data(), v.size() * sizeof(float)));
  }
  EXPECT_EQ(0, std::memcmp(master.data(), want_p.data(), k.kCount * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(params.data(), want_p.data(), k.kCount * sizeof(float)));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace orrery::runtime
