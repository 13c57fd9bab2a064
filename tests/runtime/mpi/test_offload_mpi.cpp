// NVMe offload under mpirun (zero.offload_optimizer / offload_params nvme; runtime offload.hpp):
// ZeRO 1, 2 and 3 with the moments in a file per rank give the same losses and parameters, bit
// for bit, as without (the same arithmetic, chunk by chunk); ZeRO 3 with the parameter shards in
// the file too equals ZeRO 3; and the offload spans carry the closed-form bytes: ZeRO 1 reads and
// writes 2 moments x 4 bytes x the rank's shard per step; ZeRO 3 with offload_params writes
// 3 planes (moments and parameters) x 4 bytes x its shard. ZeRO-Offload's device path of the
// training loop (zero.offload_optimizer host and nvme on a backend whose memory is not the host's;
// ../host_device_backend.hpp runs it on the CPU with memcpy for the device's copies) under ZeRO
// 1, 2 and 3 equals the CPU trainer without offload bit for bit, one pipeline range a step (ZeRO
// 1/2: the shard) or a segment (ZeRO 3: each segment's shard). ZeRO 3 with zero.offload_params on
// that device path (the shards read from the file into the backend's host staging and "uploaded"
// before each gather, AdamW on the file's plane 2, no master weights pinned) equals it too, dense
// and with MoE blocks (the experts' shards in staging slots 4 and 5), every upload into a slot
// after that slot's gather was waited for, with the memory counters in closed form; its checkpoints are the CPU trainer's without offload byte for byte, and a run resumed from
// one ends as the uninterrupted run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../host_device_backend.hpp"
#include "mpi_env.hpp"
#include "orrery/model/names.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/checkpoint.hpp"
#include "orrery/runtime/trainer.hpp"
#include "orrery/runtime/training_loop_impl.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::runtime {
template class TrainingLoop<testing::HostDeviceBackend>;

namespace {

using testing::world;
namespace fs = std::filesystem;

// One directory for the job (the parent mpirun's pid): the ranks' files must not collide in it.
std::string shared_dir() {
  const fs::path p =
      fs::temp_directory_path() / ("orrery_offload_mpi_" + std::to_string(::getppid()));
  fs::create_directories(p);
  return p.string();
}

Scenario tiny(int dp, int zero, const std::string& optimizer, const std::string& params) {
  Scenario s;
  s.name = "offload-mpi-test";
  s.model.layers = 2;
  s.model.d_model = 32;
  s.model.heads = 2;
  s.model.vocab = 64;
  s.model.seq = 16;
  s.training.steps = 3;
  s.training.global_batch = 2 * dp;
  s.training.micro_batch = 1;  // two micro-batches: ZeRO 2 and 3 scatter twice per step
  s.training.seed = 5;
  s.training.lr = 1e-3;
  s.parallel.dp = dp;
  s.parallel.zero = zero;
  s.zero.offload_optimizer = optimizer;
  s.zero.offload_params = params;
  s.zero.nvme_path = shared_dir();
  s.zero.offload_chunk_mb = 0.005;  // 1310 floats: several chunks per shard and segment
  return s;
}

struct RunOut {
  std::vector<float> losses;
  std::vector<float> params;
};

RunOut run(const Scenario& s) {
  Trainer t(s, world(), nullptr);
  t.prepare();
  RunOut out;
  for (int i = 0; i < s.training.steps; ++i) out.losses.push_back(t.step().loss);
  out.params = t.parameters();
  return out;
}

struct Case {
  int zero;
  const char* params;
};

class OffloadDp : public ::testing::TestWithParam<Case> {};

TEST_P(OffloadDp, EqualsTheRunWithoutOffloadBitForBit) {
  const Case c = GetParam();
  const int n = world().size();
  const RunOut want = run(tiny(n, c.zero, "none", "none"));
  const RunOut got = run(tiny(n, c.zero, "nvme", c.params));
  EXPECT_EQ(got.losses, want.losses);
  ASSERT_EQ(got.params.size(), want.params.size());
  EXPECT_EQ(0, std::memcmp(got.params.data(), want.params.data(), want.params.size() * 4));
  // Every rank's file is gone with its trainer: the job's directory is empty, then removed.
  world().barrier().wait();
  if (world().rank() == 0) {
    EXPECT_TRUE(fs::is_empty(shared_dir()));
    fs::remove(shared_dir());
  }
  world().barrier().wait();
}

INSTANTIATE_TEST_SUITE_P(Stages, OffloadDp,
                         ::testing::Values(Case{1, "none"}, Case{2, "none"}, Case{3, "none"},
                                           Case{3, "nvme"}),
                         [](const auto& p) {
                           return "zero" + std::to_string(p.param.zero) +
                                  (std::string(p.param.params) == "nvme" ? "_params" : "");
                         });

// ZeRO-Offload's device path (host, nvme) against the CPU trainer without offload, ZeRO 1/2/3.
class DeviceOffloadDp : public ::testing::TestWithParam<int> {};

TEST_P(DeviceOffloadDp, EqualsTheCpuRunBitForBit) {
  const int zero = GetParam(), n = world().size();
  const RunOut want = run(tiny(n, zero, "none", "none"));
  for (const char* mode : {"host", "nvme"}) {
    testing::HostDeviceLoop t(tiny(n, zero, mode, "none"), world(), nullptr);
    t.prepare();
    RunOut got;
    for (int i = 0; i < 3; ++i) got.losses.push_back(t.step().loss);
    got.params = t.parameters();
    EXPECT_EQ(got.losses, want.losses) << mode;
    ASSERT_EQ(got.params.size(), want.params.size()) << mode;
    EXPECT_EQ(0, std::memcmp(got.params.data(), want.params.data(), want.params.size() * 4))
        << mode;
    // Ranges a step: ZeRO 1/2 the shard, ZeRO 3 each segment's shard, those not empty.
    int stepped = t.zero().count() > 0 ? 1 : 0;
    if (zero == 3) {
      stepped = 0;
      for (const auto& sg : t.zero3()->segments()) stepped += sg.part.count() > 0 ? 1 : 0;
    }
    EXPECT_EQ(t.backend().host_offload()->ranges, 3 * stepped) << mode;
  }
  world().barrier().wait();
  if (world().rank() == 0) fs::remove_all(shared_dir());
  world().barrier().wait();
}

INSTANTIATE_TEST_SUITE_P(Stages, DeviceOffloadDp, ::testing::Values(1, 2, 3),
                         [](const auto& p) { return "zero" + std::to_string(p.param); });

// ZeRO 3 with zero.offload_params on the device path against the CPU trainer without offload.
TEST(DeviceOffloadParams, Zero3EqualsTheCpuRunBitForBit) {
  const int n = world().size();
  const RunOut want = run(tiny(n, 3, "none", "none"));
  MemoryBytes on_cpu;  // the CPU trainer's with offload_params (its file gone before the next's)
  {
    Trainer c(tiny(n, 3, "nvme", "nvme"), world(), nullptr);
    on_cpu = c.memory();
  }
  testing::HostDeviceLoop t(tiny(n, 3, "nvme", "nvme"), world(), nullptr);
  t.prepare();
  RunOut got;
  for (int i = 0; i < 3; ++i) got.losses.push_back(t.step().loss);
  got.params = t.parameters();
  EXPECT_EQ(got.losses, want.losses);
  ASSERT_EQ(got.params.size(), want.params.size());
  EXPECT_EQ(0, std::memcmp(got.params.data(), want.params.data(), want.params.size() * 4));
  const auto& staging = *t.backend().shard_staging();
  const auto& h = *t.backend().host_offload();
  EXPECT_FALSE(h.has_master()) << "the file's plane 2 is the master weights";
  // Per step: the embedding and final LayerNorm once, each block before its forward and its
  // backward, per micro-batch (two).
  const int blocks = 2, micro_batches = 2;
  EXPECT_EQ(staging.uploads, 3 * (2 + 2 * blocks * micro_batches));
  EXPECT_EQ(staging.unreleased_uploads, 0);
  std::size_t max_shard = 0, k = 0;
  int stepped = 0;
  for (const auto& sg : t.zero3()->segments()) {
    max_shard = std::max(max_shard, sg.part.shard);
    k += sg.part.shard;
    stepped += sg.part.count() > 0 ? 1 : 0;
  }
  EXPECT_EQ(h.ranges, 3 * stepped);
  // Memory: the four staging slots (device) as the parameters, 4 bytes a float; the file's three
  // planes; on the host the two gradient staging chunks, the store's three chunk buffers of three
  // planes and the four host staging slots.
  const MemoryBytes m = t.memory();
  const double c = double(std::min<std::size_t>(1310, k)), f = 4;
  EXPECT_EQ(m.parameters, 4 * f * double(max_shard));
  EXPECT_EQ(m.parameters, on_cpu.parameters);
  EXPECT_EQ(m.optimizer, 0.0);
  EXPECT_EQ(m.offload_nvme, 3 * f * double(k));
  EXPECT_EQ(m.offload_nvme, on_cpu.offload_nvme);
  EXPECT_EQ(m.offload_host, f * (2 * c + 9 * c + 4 * double(max_shard)));
  world().barrier().wait();
  if (world().rank() == 0) fs::remove_all(shared_dir());
  world().barrier().wait();
}

// The same with MoE blocks (ep 2: each rank's experts a segment of their own over the edp group),
// the experts' shards staged through slots 4 and 5: bit for bit, each upload after its slot's
// release, one upload per gather (the experts' with their block's).
TEST(DeviceOffloadParams, MoeZero3EqualsTheCpuRunBitForBit) {
  const int n = world().size();
  auto moe = [&](const char* optimizer, const char* params) {
    Scenario s = tiny(n, 3, optimizer, params);
    s.model.moe.experts = 4;
    s.model.moe.top_k = 2;
    s.model.moe.expert_ffn_hidden = 48;
    s.parallel.ep = 2;
    return s;
  };
  const RunOut want = run(moe("none", "none"));
  testing::HostDeviceLoop t(moe("nvme", "nvme"), world(), nullptr);
  t.prepare();
  RunOut got;
  for (int i = 0; i < 3; ++i) got.losses.push_back(t.step().loss);
  got.params = t.parameters();
  EXPECT_EQ(got.losses, want.losses);
  ASSERT_EQ(got.params.size(), want.params.size());
  EXPECT_EQ(0, std::memcmp(got.params.data(), want.params.data(), want.params.size() * 4));
  const auto& staging = *t.backend().shard_staging();
  int expert_segments = 0;
  for (const auto& sg : t.zero3()->segments()) expert_segments += sg.expert ? 1 : 0;
  EXPECT_EQ(expert_segments, 2);  // every block an MoE block
  EXPECT_EQ(staging.slots(), 6);
  const int blocks = 2, micro_batches = 2;
  EXPECT_EQ(staging.uploads, 3 * (2 + 2 * (blocks + expert_segments) * micro_batches));
  EXPECT_EQ(staging.unreleased_uploads, 0);
  world().barrier().wait();
  if (world().rank() == 0) fs::remove_all(shared_dir());
  world().barrier().wait();
}

// Every file of a checkpoint directory, by name, its bytes.
std::vector<std::pair<std::string, std::string>> files_of(const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    out.emplace_back(e.path().filename().string(),
                     std::string(std::istreambuf_iterator<char>(in), {}));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// `steps` of s, a checkpoint every 2 steps under `dir`, resumed from `resume` when not empty.
template <class Loop>
RunOut run_checkpointed(Scenario s, int steps, const std::string& dir, const std::string& resume) {
  s.training.steps = steps;
  s.checkpoint.every = 2;
  s.checkpoint.dir = dir;
  Loop t(s, world(), nullptr);
  CheckpointSession ck(s, t, world(), nullptr, dir);
  if (!resume.empty()) restore_trainer(t, s, resume, verify_checkpoint(resume));
  t.prepare();
  RunOut out;
  while (t.steps_done() < steps) {
    out.losses.push_back(t.step().loss);
    ck.after_step();
  }
  ck.finish();
  out.params = t.parameters();
  return out;
}

TEST(DeviceOffloadParams, CheckpointsAreTheCpuRunsAndResumeBitForBit) {
  const int n = world().size();
  const fs::path root = fs::path(shared_dir()) / "ckpt";
  const RunOut cpu =
      run_checkpointed<Trainer>(tiny(n, 3, "none", "none"), 4, (root / "cpu").string(), "");
  const Scenario off = tiny(n, 3, "nvme", "nvme");
  const RunOut full =
      run_checkpointed<testing::HostDeviceLoop>(off, 4, (root / "full").string(), "");
  EXPECT_EQ(full.losses, cpu.losses);
  world().barrier().wait();  // every rank's files and the manifests written
  for (const char* step : {"step-2", "step-4"}) {
    EXPECT_EQ(files_of(root / "full" / step), files_of(root / "cpu" / step)) << step;
  }
  const RunOut resumed = run_checkpointed<testing::HostDeviceLoop>(
      off, 4, (root / "again").string(), (root / "full" / "step-2").string());
  ASSERT_EQ(resumed.losses.size(), 2u);
  EXPECT_EQ(resumed.losses[0], full.losses[2]);
  EXPECT_EQ(resumed.losses[1], full.losses[3]);
  ASSERT_EQ(resumed.params.size(), full.params.size());
  EXPECT_EQ(0, std::memcmp(resumed.params.data(), full.params.data(), full.params.size() * 4));
  world().barrier().wait();
  EXPECT_EQ(files_of(root / "again" / "step-4"), files_of(root / "full" / "step-4"));
  world().barrier().wait();
  if (world().rank() == 0) fs::remove_all(shared_dir());
  world().barrier().wait();
}

// Bytes of this rank's offload spans of `name` in step `step` of a run of `s` (two steps).
struct Bytes {
  int64_t read = 0, written = 0;
  std::size_t shard = 0;  // the elements this rank updates
};

Bytes offload_bytes(const Scenario& s, int step) {
  const int r = world().rank();
  const std::string path = ::testing::TempDir() + "offload18_bytes_" + std::to_string(::getppid()) +
                           "_rank" + std::to_string(r) + ".db";
  Bytes b;
  {
    traces::TraceWriter writer(path);
    profiler::Recorder rec(&writer, r);
    world().set_recorder(&rec);
    Trainer t(s, world(), &rec);
    if (t.zero3() != nullptr) {
      for (const auto& sg : t.zero3()->segments()) b.shard += sg.part.count();
    } else {
      b.shard = t.zero().count();
    }
    t.prepare();
    t.step();
    t.step();
    world().synchronize();
    world().set_recorder(nullptr);
    rec.flush();
    writer.close();
  }
  const traces::Trace tr = traces::load_trace(path);
  std::remove(path.c_str());
  for (const auto& sp : tr.spans) {
    if (sp.step != step) continue;
    if (tr.name_of(sp) == model::names::kOffloadRead) b.read += sp.bytes;
    if (tr.name_of(sp) == model::names::kOffloadWrite) b.written += sp.bytes;
  }
  return b;
}

TEST(OffloadSpans, ZeroOneMovesTheMomentsOncePerStep) {
  const Bytes b = offload_bytes(tiny(world().size(), 1, "nvme", "none"), 1);
  ASSERT_GT(b.shard, 0u);
  EXPECT_EQ(b.read, static_cast<int64_t>(2 * 4 * b.shard));
  EXPECT_EQ(b.written, static_cast<int64_t>(2 * 4 * b.shard));
}

TEST(OffloadSpans, ZeroThreeWithParametersWritesThreePlanes) {
  const Bytes b = offload_bytes(tiny(world().size(), 3, "nvme", "nvme"), 1);
  ASSERT_GT(b.shard, 0u);
  EXPECT_EQ(b.written, static_cast<int64_t>(3 * 4 * b.shard));
  // Reads: the optimizer's three planes, plus the shards read for the gathers.
  EXPECT_GT(b.read, static_cast<int64_t>(3 * 4 * b.shard));
}

}  // namespace
}  // namespace orrery::runtime
