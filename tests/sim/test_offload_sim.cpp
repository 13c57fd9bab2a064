// NVMe offload in the simulator (zero.offload_optimizer nvme; workload.hpp, memory.hpp) on the CPU
// runtime's path (a profile without a host link; the device's path: test_device_nvme_sim.cpp): the
// ops the runtime records, in its I/O thread's order, each offload op's time the closed form bytes /
// (node bandwidth / ranks on the node), the memory saved the optimizer state's bytes (less the
// chunk buffers), the executor's overlap bounded by the serial sum, the profile's `offload:` keys,
// and `sweep --search` choosing offload when nothing fits without it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/model/names.hpp"
#include "orrery/sim/hardware.hpp"
#include "orrery/sim/memory.hpp"
#include "orrery/sim/sweep.hpp"
#include "orrery/sim/workload.hpp"
#include "test_workload_util.hpp"

namespace orrery::sim {
namespace {

using testing::h100_cluster;
using testing::small_scenario;
namespace names = model::names;

Scenario offloaded(Scenario s, double chunk_mb) {
  s.zero.offload_optimizer = "nvme";
  s.zero.nvme_path = "nvme";
  s.zero.offload_chunk_mb = chunk_mb;
  return s;
}

int64_t stage_params(const Scenario& s) {
  int64_t n = 0;
  for (const auto& t : stage_parameters(s, 0)) n += t.count;
  return n;
}

TEST(SimOffload, OpsAreTheRuntimesAndTimesAreBytesOverBandwidth) {
  Scenario s = offloaded(small_scenario(4, 2, 1, 1, 1), 1.0);  // 262144 elements per chunk
  s.parallel.zero = 1;
  HardwareProfile prof = default_hardware_profile("H100-SXM", true);
  prof.offload.host_link_bytes_per_s = 0;    // the CPU runtime's path (no host link)
  prof.offload.nvme_read_bytes_per_s = 4e9;  // per node, shared by its 2 ranks: 2 GB/s each
  prof.offload.nvme_write_bytes_per_s = 1e9;
  const Device d = *device_preset("H100-SXM");
  const CostModel cost(prof, d.peak_bf16_flops, d.mem_bandwidth_bytes_per_s);
  const PrecisionConfig fp32 = precision_config("fp32");
  const Workload w = build_workload(s, cost, {1, fp32, 2});
  const int64_t updated = stage_params(s) / 2;  // ZeRO 1 over dp 2 (even count here)
  ASSERT_EQ(stage_params(s) % 2, 0);
  const std::vector<int64_t> chunks = offload_chunks(s, updated);
  ASSERT_GT(chunks.size(), 2u);
  std::string order;
  int64_t read = 0, written = 0;
  int adamw = 0;
  size_t r = 0, wr = 0;
  for (const Op& op : w.stages[0].ops) {
    const std::string& n = w.names[op.name];
    if (n == names::kOptimizerStep) ++adamw;
    if (op.stream != names::kStreamOffload) continue;
    EXPECT_EQ(op.kind, traces::SpanKind::Memcpy);
    const bool is_read = n == names::kOffloadRead;
    const int64_t elems = chunks[is_read ? r++ : wr++];
    EXPECT_EQ(op.bytes, 8 * elems);  // fp32 moments
    const double bw = is_read ? 2e9 : 0.5e9;
    EXPECT_EQ(op.duration_ns, int64_t(std::ceil(double(op.bytes) / bw * 1e9)));
    (is_read ? read : written) += op.bytes;
    order += is_read ? 'r' : 'w';
  }
  EXPECT_EQ(read, 8 * updated);
  EXPECT_EQ(written, 8 * updated);
  EXPECT_EQ(adamw, static_cast<int>(chunks.size()));
  // The I/O thread's FIFO: read 0, then per chunk the next read before the previous write.
  std::string want = "r";
  for (size_t i = 0; i < chunks.size(); ++i)
    want += std::string(i + 1 < chunks.size() ? "r" : "") + "w";
  EXPECT_EQ(order, want);
}

TEST(SimOffload, MemorySavedIsTheOptimizerState) {
  const PrecisionConfig mixed = precision_config("mixed");
  Scenario plain = small_scenario(4, 4, 1, 1, 1);
  plain.parallel.zero = 1;
  const Scenario off = offloaded(plain, 0.25);  // 65536 elements per chunk
  const MemoryEstimate a = estimate_memory(plain, mixed, 0)[0];
  const MemoryEstimate b = estimate_memory(off, mixed, 0)[0];
  const double updated = double(a.param_count) / 4;
  EXPECT_DOUBLE_EQ(a.optimizer_bytes, 12 * updated);
  EXPECT_DOUBLE_EQ(b.offload_nvme_bytes, 12 * updated);
  EXPECT_DOUBLE_EQ(b.optimizer_bytes, 3.0 * 65536 * 12);
  EXPECT_DOUBLE_EQ(a.total_bytes - b.total_bytes, 12 * updated - 3.0 * 65536 * 12);
  EXPECT_DOUBLE_EQ(a.offload_nvme_bytes, 0);
  // ZeRO 3 with the parameter shards too: 2 more bytes per element in the file, the parameters
  // four staging buffers of the largest segment's shard.
  Scenario z3 = offloaded(plain, 0.25);
  z3.parallel.zero = 3;
  z3.zero.offload_params = "nvme";
  const MemoryEstimate c = estimate_memory(z3, mixed, 0)[0];
  EXPECT_DOUBLE_EQ(c.offload_nvme_bytes, 14 * updated);
  EXPECT_DOUBLE_EQ(c.optimizer_bytes, 3.0 * 65536 * 14);
  // The largest segment: a block, 12 h^2 + 13 h (weights, biases, two LayerNorms), h = 256; the
  // embedding (V + T) h = 294912 is smaller.
  const int64_t block = 12 * 256 * 256 + 13 * 256;
  EXPECT_DOUBLE_EQ(c.parameters_bytes, 4.0 * 2 * std::ceil(block / 4.0));
}

TEST(SimOffload, StepTimeGrowsByTheDiskTimeAtMost) {
  Scenario plain = small_scenario(4, 2, 1, 1, 1);
  plain.parallel.zero = 1;
  const Scenario off = offloaded(plain, 1.0);
  const Cluster c = h100_cluster(2);
  HardwareProfile prof = default_hardware_profile("H100-SXM", true);
  prof.offload.host_link_bytes_per_s = 0;      // the CPU runtime's path (no host link)
  prof.offload.nvme_read_bytes_per_s = 0.2e9;  // a slow disk: the I/O dominates AdamW
  prof.offload.nvme_write_bytes_per_s = 0.1e9;
  SimOptions opt;
  opt.profile = prof;
  opt.network = NetworkModel::Analytical;
  opt.precision = "fp32";
  const SimResult a = simulate(plain, c, opt), b = simulate(off, c, opt);
  const double bytes = 8.0 * double(stage_params(plain)) / 2;
  const double io_ns = bytes / 0.1e9 * 1e9 + bytes / 0.05e9 * 1e9;  // 2 ranks share the node
  const double extra = double(b.step_time_ns - a.step_time_ns);
  const Device d = *device_preset("H100-SXM");
  const CostModel cost(prof, d.peak_bf16_flops, d.mem_bandwidth_bytes_per_s);
  double adamw_ns = 0;
  const Workload w = build_workload(plain, cost, {1, precision_config("fp32"), 2});
  for (const Op& op : w.stages[0].ops)
    if (w.names[op.name] == names::kOptimizerStep) adamw_ns += double(op.duration_ns);
  ASSERT_GT(adamw_ns, 0);
  ASSERT_GT(io_ns, 10 * adamw_ns);
  // One I/O stream: the reads and writes in series; AdamW and the first read / last write
  // overlap the rest, so the step grows by the disk's time less at most the update itself.
  EXPECT_LE(extra, io_ns + 1e5);
  EXPECT_GE(extra, io_ns - adamw_ns - 1e5);
  EXPECT_EQ(b.offload, "nvme");
  EXPECT_EQ(a.offload, "none");
}

TEST(SimOffload, ProfileKeysDefaultAndRoundTrip) {
  const HardwareProfile h = default_hardware_profile("H100-SXM", true);
  EXPECT_DOUBLE_EQ(h.offload.host_link_bytes_per_s, 63e9);
  EXPECT_DOUBLE_EQ(h.offload.nvme_read_bytes_per_s, 8 * 7e9);
  EXPECT_DOUBLE_EQ(h.offload.nvme_write_bytes_per_s, 8 * 3.8e9);
  HardwareProfile p = parse_hardware_profile(
      "name: x\ndevice: A100-SXM-80GB\noffload: {nvme_read_gbps: 3.5}\n", "p.yaml");
  EXPECT_DOUBLE_EQ(p.offload.nvme_read_bytes_per_s, 3.5e9);
  EXPECT_DOUBLE_EQ(p.offload.nvme_write_bytes_per_s, 4 * 3.8e9);  // the preset's
  EXPECT_DOUBLE_EQ(p.offload.host_link_bytes_per_s, 31.5e9);
  const HardwareProfile back = parse_hardware_profile(to_yaml(p), "back.yaml");
  EXPECT_DOUBLE_EQ(back.offload.nvme_read_bytes_per_s, 3.5e9);
  EXPECT_THROW(parse_hardware_profile("name: x\noffload: {nvme_read_gbps: -1}\n", "p.yaml"),
               InputError);
  EXPECT_THROW(parse_hardware_profile("name: x\noffload: {disk_gbps: 1}\n", "p.yaml"), InputError);
}

TEST(SimOffload, SearchChoosesOffloadWhenNothingFitsWithout) {
  Scenario s = small_scenario(4, 2, 1, 1, 1);
  s.zero.offload_chunk_mb = 0.25;
  const PrecisionConfig mixed = precision_config("mixed");
  // The capacity: the dp 2 ZeRO 3 layout with everything offloaded fits, no layout of 2 GPUs
  // fits without offload (checked here over the search's whole space).
  Scenario best = offloaded(s, 0.25);
  best.parallel.zero = 3;
  best.zero.offload_params = "nvme";
  const double need = estimate_memory(best, mixed, 0)[0].total_bytes;
  const int64_t cap = int64_t(need) + 1;
  for (int tp : {1, 2}) {
    for (int pp : {1, 2}) {
      if (tp * pp > 2) continue;
      for (int mb : {1, 2}) {
        for (int zero = 0; zero <= (tp * pp == 1 ? 3 : 0); ++zero) {
          Scenario x = small_scenario(4, 2 / (tp * pp), tp, pp, 1);
          x.training.micro_batch = mb;
          x.training.global_batch = 4;
          x.parallel.zero = zero;
          for (const auto& m : estimate_memory(x, mixed, cap)) {
            if (m.stage == 0) ASSERT_FALSE(m.fits) << tp << " " << pp << " " << mb << " " << zero;
          }
        }
      }
    }
  }
  Cluster c = h100_cluster(2);
  c.device.mem_capacity_bytes = cap;
  SweepOptions opt;
  opt.gpus = {2};
  opt.search = true;
  opt.search_top = 2;
  opt.sim.network = NetworkModel::Analytical;
  const auto rows = sweep(s, c, opt);
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_TRUE(rows[0].ok) << rows[0].note;
  EXPECT_NE(rows[0].result.offload, "none");
  EXPECT_TRUE(rows[0].result.fits);
  // With room, the same search needs none.
  c.device.mem_capacity_bytes = int64_t(80) << 30;
  const auto roomy = sweep(s, c, opt);
  ASSERT_TRUE(roomy[0].ok);
  EXPECT_EQ(roomy[0].result.offload, "none");
}

TEST(SimOffload, SearchMayChooseCompressionWhenAsked) {
  Scenario s = small_scenario(4, 8, 1, 1, 1);
  const Cluster c = h100_cluster(8);
  SweepOptions opt;
  opt.gpus = {8};
  opt.search = true;
  opt.search_top = 40;
  opt.search_compression = true;
  opt.sim.network = NetworkModel::Analytical;
  const auto rows = sweep(s, c, opt);
  ASSERT_TRUE(rows[0].ok) << rows[0].note;
  bool int8_considered = rows[0].result.grad_compression == "int8";
  for (const auto& o : rows[0].others)
    int8_considered = int8_considered || o.grad_compression == "int8";
  EXPECT_TRUE(int8_considered);
}

}  // namespace
}  // namespace orrery::sim
