// zero.offload_params nvme on a device in the simulator (ZeRO 3 on a profile with a host link;
// workload.hpp device_offload_params, memory.hpp) against the CUDA runtime's path
// (training_loop_impl.hpp z3_shard / z3_prefetch_shard / z3_bind_block, cuda/host_offload.hpp
// CudaShardStaging), on 4 blocks, dp 2, one micro-batch, one step:
//  - one offload.h2d per zero.fetch_layer (10: the embedding and final norm, then blocks 0-3 in the
//    forward and 3-0 in the backward), each gather after its upload, 4 bytes per shard element at
//    the rank's share of the host link; offload.read on the I/O queue at the rank's share of the
//    NVMe read bandwidth, 8 of them: the backward's first two shards (blocks 3 and 2) are still in
//    their slots' host staging and are uploaded again without a read, blocks 2 and 3 (forward) and
//    1 and 0 (backward) are read one after next ahead; each upload after its read and after the
//    previous gather from its slot, each read after its slot's last upload;
//  - executed, each gather starts after its upload ends, each upload after its read;
//  - the optimizer: 12 bytes per element read and written (the moments and the shards), no upload
//    after the host step;
//  - memory: parameters 4 staging slots of the largest shard in fp32, offload_nvme 12u,
//    offload_host 2cg + 36c + the host staging (tests/runtime/mpi/test_offload_mpi.cpp
//    DeviceOffloadParams.Zero3EqualsTheCpuRunBitForBit's closed form), optimizer 0;
//  - the CPU profile (no host link) keeps the CPU runtime's model: no uploads, the gathers after
//    no copy, reads of 12 bytes per element (fp32 moments and parameters) on "offload".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "offload_test_util.hpp"
#include "orrery/model/names.hpp"
#include "orrery/sim/executor.hpp"
#include "orrery/sim/hardware.hpp"
#include "orrery/sim/memory.hpp"
#include "orrery/sim/workload.hpp"
#include "test_workload_util.hpp"

namespace orrery::sim {
namespace {

using testing::build_fp32;
using testing::ceil_ns;
using testing::chunk_mb_of;
using testing::depends_on;
using testing::small_scenario;
namespace names = model::names;

constexpr int64_t kChunk = 65536;

// 4 blocks over dp 2 under ZeRO 3, the moments and the parameter shards in the file.
Scenario params_offloaded() {
  Scenario s = small_scenario(4, 2, 1, 1, 1);
  s.parallel.zero = 3;
  s.zero.offload_optimizer = "nvme";
  s.zero.offload_params = "nvme";
  s.zero.nvme_path = "nvme";
  s.zero.offload_chunk_mb = chunk_mb_of(kChunk);
  return s;
}

// An H100 profile: host link 20 GB/s, host AdamW 100, NVMe read 4 and write 1 (2 ranks share it).
HardwareProfile gpu_links() {
  HardwareProfile p = default_hardware_profile("H100-SXM", true);
  p.offload.host_link_bytes_per_s = 20e9;
  p.offload.host_link_shared_by = 1;
  p.offload.host_adamw_bytes_per_s = 100e9;
  p.offload.nvme_read_bytes_per_s = 4e9;
  p.offload.nvme_write_bytes_per_s = 1e9;
  return p;
}

// Parameters of each segment of stage 0: the embedding (V + T) h, a block 12 h^2 + 13 h, the final
// norm 2 h (h 256, V 1024, T 128); the shard over dp 2 is half of each (all even).
int64_t segment_elems(int segment) {
  const int64_t h = 256;
  if (segment < 0) return (1024 + 128) * h;
  if (segment >= 4) return 2 * h;
  return 12 * h * h + 13 * h;
}

struct ShardOps {
  std::vector<uint32_t> gather, upload, read;  // outside the optimizer, in program order
  std::vector<uint32_t> opt_read, opt_write, opt_upload;
};
ShardOps shard_ops(const Workload& w) {
  ShardOps o;
  const StageProgram& p = w.stages[0];
  for (uint32_t id = 0; id < p.ops.size(); ++id) {
    const std::string& n = w.names[p.ops[id].name];
    const bool opt = p.ops[id].phase == PhaseKind::Optimizer;
    if (n == names::kZeroAllGather) o.gather.push_back(id);
    if (n == names::kOffloadH2D) (opt ? o.opt_upload : o.upload).push_back(id);
    if (n == names::kOffloadRead) (opt ? o.opt_read : o.read).push_back(id);
    if (n == names::kOffloadWrite && opt) o.opt_write.push_back(id);
  }
  return o;
}

std::vector<int> layers_of(const StageProgram& p, const std::vector<uint32_t>& ids) {
  std::vector<int> out;
  for (uint32_t id : ids) out.push_back(p.ops[id].layer);
  return out;
}

TEST(SimDeviceParams, EachGatherFollowsItsShardsUploadAndRead) {
  const Scenario s = params_offloaded();
  const Workload w = build_fp32(s, gpu_links(), 2);
  const StageProgram& p = w.stages[0];
  const ShardOps o = shard_ops(w);
  const std::vector<int> gathers{-1, 4, 0, 1, 2, 3, 3, 2, 1, 0};
  ASSERT_EQ(layers_of(p, o.gather), gathers);
  EXPECT_EQ(layers_of(p, o.upload), gathers);  // one upload per gather, in the gathers' order
  EXPECT_EQ(layers_of(p, o.read), (std::vector<int>{-1, 4, 0, 1, 2, 3, 1, 0}));
  for (size_t i = 0; i < o.gather.size(); ++i) {
    const Op& up = p.ops[o.upload[i]];
    const int64_t shard = segment_elems(gathers[i]) / 2;
    EXPECT_TRUE(depends_on(p, o.gather[i], o.upload[i])) << i;
    EXPECT_EQ(up.stream, names::kStreamOffload);
    EXPECT_EQ(up.bytes, 4 * shard);
    EXPECT_EQ(up.duration_ns, ceil_ns(4.0 * double(shard), 20e9));
    // The upload after the latest read of its segment.
    uint32_t read = 0;
    for (uint32_t r : o.read)
      if (r < o.upload[i] && p.ops[r].layer == gathers[i]) read = r;
    EXPECT_TRUE(depends_on(p, o.upload[i], read)) << i;
  }
  for (uint32_t r : o.read) {
    const int64_t shard = segment_elems(p.ops[r].layer) / 2;
    EXPECT_EQ(p.ops[r].stream, kStreamOffloadIo);
    EXPECT_EQ(p.ops[r].bytes, 4 * shard);
    EXPECT_EQ(p.ops[r].duration_ns, ceil_ns(4.0 * double(shard), 2e9));  // 4 GB/s over 2 ranks
  }
  // The slots' limit: blocks alternate slots 0 / 1, so block gather k's upload waits for gather
  // k - 2 (its slot's last), and the read of block k after upload k - 2.
  for (size_t k = 4; k < 6; ++k) EXPECT_TRUE(depends_on(p, o.upload[k], o.gather[k - 2])) << k;
  EXPECT_TRUE(depends_on(p, o.read[4], o.upload[2]));  // block 2's read after block 0's upload
  EXPECT_TRUE(depends_on(p, o.read[5], o.upload[3]));
  EXPECT_LE(double(p.ops.size()), workload_ops_bound(s, 1));
}

TEST(SimDeviceParams, ExecutedGathersStartAfterTheirUploadsAndReads) {
  const Workload w = build_fp32(params_offloaded(), gpu_links(), 2);
  const ShardOps o = shard_ops(w);
  const ExecResult r = execute(w, testing::h100_cluster(2));
  const auto& ops = r.ranks[0].ops;
  for (size_t i = 0; i < o.gather.size(); ++i) {
    EXPECT_GE(ops[o.gather[i]].start_ns, ops[o.upload[i]].end_ns) << i;
    EXPECT_EQ(ops[o.upload[i]].end_ns - ops[o.upload[i]].start_ns,
              w.stages[0].ops[o.upload[i]].duration_ns);
  }
  // Each upload after its segment's latest read (reads 0..5: -1, 4, 0, 1, 2, 3; 6, 7: 1, 0).
  const std::vector<size_t> read_of{0, 1, 2, 3, 4, 5, 5, 4, 6, 7};
  for (size_t i = 0; i < o.upload.size(); ++i)
    EXPECT_GE(ops[o.upload[i]].start_ns, ops[o.read[read_of[i]]].end_ns) << i;
}

TEST(SimDeviceParams, OptimizerStreamsTheShardsAndUploadsNothing) {
  const Scenario s = params_offloaded();
  const Workload w = build_fp32(s, gpu_links(), 2);
  const StageProgram& p = w.stages[0];
  const ShardOps o = shard_ops(w);
  EXPECT_TRUE(o.opt_upload.empty());
  ASSERT_EQ(o.opt_read.size(), o.opt_write.size());
  // Each segment's shard is a range (dp 2: half of each); 12 bytes per element through the file.
  int64_t updated = 0;
  for (int seg : {-1, 0, 1, 2, 3, 4}) updated += segment_elems(seg) / 2;
  int64_t read = 0, written = 0;
  for (size_t i = 0; i < o.opt_read.size(); ++i) {
    read += p.ops[o.opt_read[i]].bytes;
    written += p.ops[o.opt_write[i]].bytes;
  }
  EXPECT_EQ(read, 12 * updated);
  EXPECT_EQ(written, 12 * updated);
}

TEST(SimDeviceParams, MemoryIsTheRuntimesClosedForm) {
  const Scenario s = params_offloaded();
  const PrecisionConfig fp32 = precision_config("fp32");
  const MemoryEstimate dev = estimate_memory(s, fp32, 0, true)[0];
  int64_t updated = 0;
  for (int seg : {-1, 0, 1, 2, 3, 4}) updated += segment_elems(seg) / 2;
  const double largest = double(segment_elems(0) / 2);  // a block's shard
  const double c = kChunk;
  EXPECT_DOUBLE_EQ(dev.parameters_bytes, 4 * 4 * largest);
  EXPECT_DOUBLE_EQ(dev.optimizer_bytes, 0);
  EXPECT_DOUBLE_EQ(dev.offload_nvme_bytes, 12.0 * double(updated));
  EXPECT_DOUBLE_EQ(dev.offload_host_bytes, 4 * (2 * c + 9 * c + 4 * largest));
  // The CPU path's (no host link): the shards' bytes at the precision, four staging buffers.
  const MemoryEstimate cpu = estimate_memory(s, fp32, 0, false)[0];
  EXPECT_DOUBLE_EQ(cpu.offload_nvme_bytes, 12.0 * double(updated));
  EXPECT_DOUBLE_EQ(cpu.optimizer_bytes, 3.0 * c * 12);
  EXPECT_DOUBLE_EQ(cpu.parameters_bytes, 4 * 4 * largest);
  EXPECT_DOUBLE_EQ(cpu.offload_host_bytes, 0);
}

TEST(SimDeviceParams, MoeExpertsHaveTheirOwnStagingReadAtEachGather) {
  // dp 4, ep 2 (edp 2), experts in every second block: each experts' gather (over edp) after an
  // upload of its block's experts' shard, read each time (the runtime's z3_expert_shard), and six
  // staging slots of the largest shard.
  Scenario s = params_offloaded();
  s.parallel.dp = 4;
  s.training.global_batch = 8;
  s.model.moe.experts = 4;
  s.model.moe.top_k = 2;
  s.model.moe.every = 2;
  s.parallel.ep = 2;
  const Workload w = build_fp32(s, gpu_links(), 4);
  const StageProgram& p = w.stages[0];
  const int64_t eshard = w.stages[0].expert_param_count / 2 / 2;  // 2 MoE blocks, edp 2
  int experts = 0, expert_reads = 0;
  for (uint32_t id = 0; id < p.ops.size(); ++id) {
    const Op& op = p.ops[id];
    if (w.names[op.name] == names::kOffloadRead && op.phase != PhaseKind::Optimizer &&
        op.bytes == 4 * eshard)
      ++expert_reads;
    if (w.names[op.name] != names::kZeroAllGather || op.group != GroupRole::EDP) continue;
    ++experts;
    uint32_t up = 0;
    for (uint32_t k = 0; k < op.dep_count; ++k) {
      const uint32_t d = p.deps[op.dep_begin + k];
      if (w.names[p.ops[d].name] == names::kOffloadH2D) up = d;
    }
    ASSERT_NE(up, 0u) << "experts' gather " << id << " after no upload";
    EXPECT_EQ(p.ops[up].bytes, 4 * eshard);
    EXPECT_EQ(p.ops[up].layer, op.layer);
  }
  EXPECT_EQ(experts, 4);  // 2 MoE blocks, forward and backward
  EXPECT_EQ(expert_reads, 4);
  EXPECT_LE(double(p.ops.size()), workload_ops_bound(s, 1));
  // The largest shard: of the dense segments over dp 4 and the experts' over edp 2.
  std::map<int, int64_t> segments;
  for (const auto& t : stage_parameters(s, 0)) segments[t.segment] += t.count;
  int64_t largest = eshard;
  for (const auto& [seg, n] : segments) largest = std::max(largest, (n + 3) / 4);
  const MemoryEstimate m = estimate_memory(s, precision_config("fp32"), 0, true)[0];
  EXPECT_DOUBLE_EQ(m.parameters_bytes, 6 * 4 * double(largest));
}

TEST(SimDeviceParams, CpuProfileKeepsTheCpuModel) {
  const Scenario s = params_offloaded();
  const Workload w = build_fp32(s, default_hardware_profile("cpu", false), 1);
  const StageProgram& p = w.stages[0];
  const ShardOps o = shard_ops(w);
  EXPECT_EQ(o.gather.size(), 10u);
  EXPECT_TRUE(o.upload.empty());
  EXPECT_TRUE(o.read.empty());
  EXPECT_TRUE(o.opt_upload.empty());
  for (uint32_t g : o.gather) {
    for (uint32_t k = 0; k < p.ops[g].dep_count; ++k)
      EXPECT_NE(p.ops[p.deps[p.ops[g].dep_begin + k]].kind, traces::SpanKind::Memcpy);
  }
  for (uint32_t r : o.opt_read) {
    EXPECT_EQ(p.ops[r].stream, names::kStreamOffload);
    EXPECT_EQ(p.ops[r].bytes % 12, 0);  // fp32 moments and parameters, per element
  }
}

}  // namespace
}  // namespace orrery::sim
