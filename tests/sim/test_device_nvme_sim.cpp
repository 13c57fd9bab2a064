// NVMe offload on a device in the simulator (zero.offload_optimizer nvme on a profile with a host
// link; workload.hpp device_nvme_offload, memory.hpp) against the CUDA runtime's path
// (training_loop_impl.hpp offloaded_adamw, offload_pipeline.hpp, offload.hpp):
//  - per chunk exactly one offload.read and offload.write (8 bytes per element: the two fp32
//    moments, time bytes / the rank's share of the node's NVMe bandwidth) on the I/O queue in the
//    I/O thread's order R0 R1 W0 R2 W1 ..., one offload.d2h and offload.h2d on the copy stream in
//    the order D0 D1 U0 D2 U1 ..., one offload.adamw on the compute stream, no GPU adamw; the host
//    thread's dependencies (D0 and D1 after R0, D(i+1) after R(i), step i after D(i) and R(i),
//    upload i and write i after step i); 5 ops per chunk within workload_ops_bound;
//  - the executed pipeline's makespan equals its closed form on one rank with 3 chunks, disk-bound
//    (every read and write back to back: ΣR + ΣW) and host-bound (r0 + d0 + a0 + a1 + a2 + w2);
//  - ZeRO 3's segments and MoE's expert shard priced as separate pipelines: per segment (and on
//    every offload path) as many chunks as offload_chunks of its shard;
//  - memory: mem.optimizer 0, mem.offload_nvme 8n, mem.offload_host 4n + 8c + 24c at fp32 (the CUDA
//    runtime's, tests/runtime/cuda/test_cuda_offload.cpp), the CPU path's unchanged;
//  - a profile with a host link but no host AdamW rate refused naming the key; the CPU profile
//    keeps the CPU runtime's model (reads and writes on "offload", the CPU's adamw pieces).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "offload_test_util.hpp"
#include "orrery/common/error.hpp"
#include "orrery/model/names.hpp"
#include "orrery/sim/executor.hpp"
#include "orrery/sim/hardware.hpp"
#include "orrery/sim/memory.hpp"
#include "orrery/sim/sweep.hpp"
#include "orrery/sim/workload.hpp"
#include "test_workload_util.hpp"

namespace orrery::sim {
namespace {

using testing::build_fp32;
using testing::ceil_ns;
using testing::chunk_mb_of;
using testing::depends_on;
using testing::h100_cluster;
using testing::Makespan;
using testing::simulated_counters;
using testing::small_scenario;
using testing::stage_params;
namespace names = model::names;

Scenario nvme_offloaded(Scenario s, int64_t chunk_elems) {
  s.zero.offload_optimizer = "nvme";
  s.zero.nvme_path = "nvme";
  s.zero.offload_chunk_mb = chunk_mb_of(chunk_elems);
  return s;
}

// An H100 profile with the given links, GB/s: host link, host AdamW, NVMe read and write.
HardwareProfile links(double link, double adamw, double read, double write) {
  HardwareProfile p = default_hardware_profile("H100-SXM", true);
  p.offload.host_link_bytes_per_s = link * 1e9;
  p.offload.host_adamw_bytes_per_s = adamw * 1e9;
  p.offload.nvme_read_bytes_per_s = read * 1e9;
  p.offload.nvme_write_bytes_per_s = write * 1e9;
  return p;
}

struct NvmeOps {
  std::vector<uint32_t> read, write, d2h, adamw, h2d;  // op ids, in program order
  int gpu_adamw = 0;
  std::string io_order, copy_order;  // 'R' / 'W' along the I/O queue, 'D' / 'U' along "offload"
};
NvmeOps nvme_ops(const Workload& w) {
  NvmeOps o;
  const StageProgram& p = w.stages[0];
  for (uint32_t id = 0; id < p.ops.size(); ++id) {
    const std::string& n = w.names[p.ops[id].name];
    if (n == names::kOffloadRead) o.read.push_back(id);
    if (n == names::kOffloadWrite) o.write.push_back(id);
    if (n == names::kOffloadD2H) o.d2h.push_back(id);
    if (n == names::kOffloadAdamW) o.adamw.push_back(id);
    if (n == names::kOffloadH2D) o.h2d.push_back(id);
    if (n == names::kOptimizerStep) ++o.gpu_adamw;
  }
  for (uint32_t id : p.stream_ops[kStreamOffloadIo])
    o.io_order += w.names[p.ops[id].name] == names::kOffloadRead ? 'R' : 'W';
  for (uint32_t id : p.stream_ops[names::kStreamOffload])
    o.copy_order += w.names[p.ops[id].name] == names::kOffloadD2H ? 'D' : 'U';
  return o;
}

// "R R W R W ... W" for `c` chunks: the I/O thread's FIFO (and "D D U D U ... U" with 'D', 'U').
std::string pipeline_order(size_t c, char first, char second) {
  std::string want(1, first);
  for (size_t i = 0; i < c; ++i)
    want += std::string(i + 1 < c ? std::string(1, first) : "") + second;
  return want;
}

TEST(SimDeviceNvme, ChunksHaveTheRuntimesOpsBytesTimesAndOrder) {
  Scenario s = small_scenario(4, 2, 1, 1, 1);
  s.parallel.zero = 1;
  const int64_t updated = stage_params(s) / 2;  // ZeRO 1 over dp 2 (even count here)
  ASSERT_EQ(stage_params(s) % 2, 0);
  s = nvme_offloaded(s, 262144);
  // 2 ranks on the node: NVMe 2 and 0.5 GB/s, host AdamW 50 GB/s each; a link of 20 GB/s each.
  const Workload w = build_fp32(s, links(20, 100, 4, 1), 2);
  const StageProgram& p = w.stages[0];
  const std::vector<int64_t> chunks = offload_chunks(s, updated);
  ASSERT_GT(chunks.size(), 2u);
  const NvmeOps o = nvme_ops(w);
  for (const auto* v : {&o.read, &o.write, &o.d2h, &o.adamw, &o.h2d})
    ASSERT_EQ(v->size(), chunks.size());
  EXPECT_EQ(o.gpu_adamw, 0);
  EXPECT_EQ(o.io_order, pipeline_order(chunks.size(), 'R', 'W'));
  EXPECT_EQ(o.copy_order, pipeline_order(chunks.size(), 'D', 'U'));
  int64_t read = 0, written = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const double n = double(chunks[i]);
    const Op &r = p.ops[o.read[i]], &wr = p.ops[o.write[i]], &a = p.ops[o.adamw[i]];
    EXPECT_EQ(r.bytes, 8 * chunks[i]);  // the two fp32 moments
    EXPECT_EQ(wr.bytes, 8 * chunks[i]);
    EXPECT_EQ(p.ops[o.d2h[i]].bytes, 4 * chunks[i]);
    EXPECT_EQ(p.ops[o.h2d[i]].bytes, 4 * chunks[i]);
    EXPECT_EQ(r.stream, kStreamOffloadIo);
    EXPECT_EQ(trace_stream(r.stream), names::kStreamOffload);  // recorded as the runtime's
    EXPECT_EQ(p.ops[o.d2h[i]].stream, names::kStreamOffload);
    EXPECT_EQ(a.stream, names::kStreamCompute);
    EXPECT_EQ(r.duration_ns, ceil_ns(8 * n, 2e9));
    EXPECT_EQ(wr.duration_ns, ceil_ns(8 * n, 0.5e9));
    EXPECT_EQ(p.ops[o.d2h[i]].duration_ns, ceil_ns(4 * n, 20e9));
    EXPECT_EQ(p.ops[o.h2d[i]].duration_ns, ceil_ns(4 * n, 20e9));
    EXPECT_EQ(a.duration_ns, ceil_ns(28 * n, 50e9));
    // The host thread: downloads 0 and 1 after read 0, download i+1 after read i.
    EXPECT_TRUE(depends_on(p, o.d2h[i], o.read[i == 0 ? 0 : i - 1]));
    EXPECT_TRUE(depends_on(p, o.adamw[i], o.d2h[i]));
    EXPECT_TRUE(depends_on(p, o.adamw[i], o.read[i]));
    EXPECT_TRUE(depends_on(p, o.h2d[i], o.adamw[i]));
    EXPECT_TRUE(depends_on(p, o.write[i], o.adamw[i]));
    if (i + 1 < chunks.size()) EXPECT_TRUE(depends_on(p, o.read[i + 1], o.read[i]));
    read += r.bytes, written += wr.bytes;
  }
  EXPECT_EQ(read, 8 * updated);
  EXPECT_EQ(written, 8 * updated);
}

TEST(SimDeviceNvme, OpsBoundCountsTheChunks) {
  // Chunks of 1 element: the simulator's cap of kMaxOffloadChunks, 5 ops each, within the bound.
  Scenario s = nvme_offloaded(small_scenario(1, 1, 1, 1, 1), 1);
  const Workload w = build_fp32(s, links(20, 100, 4, 1), 1);
  Scenario plain = s;
  plain.zero.offload_optimizer = "none";
  const size_t ops = w.stages[0].ops.size();
  EXPECT_LE(double(ops), workload_ops_bound(s, 1));
  EXPECT_EQ(ops - build_fp32(plain, links(20, 100, 4, 1), 1).stages[0].ops.size(),
            5u * kMaxOffloadChunks - 1);  // the GPU's adamw replaced
}

// One rank, 3 chunks (2 of `n`, the last the rest): the executed optimizer's makespan, from the
// first read's start to the last upload's or write's end.
Makespan pipeline_makespan(const HardwareProfile& prof) {
  Scenario s = small_scenario(4, 1, 1, 1, 1);
  const int64_t params = stage_params(s), n = (params + 2) / 3;
  s = nvme_offloaded(s, n);
  const Workload w = build_fp32(s, prof, 1);
  const NvmeOps o = nvme_ops(w);
  EXPECT_EQ(o.read.size(), 3u);
  const ExecResult r = execute(w, h100_cluster(1));
  const auto& ops = r.ranks[0].ops;
  const int64_t end = std::max(ops[o.h2d.back()].end_ns, ops[o.write.back()].end_ns);
  return {end - ops[o.read.front()].start_ns, {n, n, params - 2 * n}};
}

TEST(SimDeviceNvme, PipelineMakespanIsItsClosedForm) {
  auto t = [](int64_t n, double bytes_per_elem, double gbps) {
    return ceil_ns(bytes_per_elem * double(n), gbps * 1e9);
  };
  // Disk-bound (8 / 1 + 8 / 2 ns per element against 28 / 1000 and 4 / 1000): the I/O queue
  // never idles, R0 R1 W0 R2 W1 W2 back to back.
  const Makespan d = pipeline_makespan(links(1000, 1000, 1, 2));
  int64_t disk = 0;
  for (int64_t n : d.n) disk += t(n, 8, 1) + t(n, 8, 2);
  EXPECT_EQ(d.measured, disk);
  // Host-bound (28 / 1 ns per element against 8 / 1000 and 4 / 1000): read 0, download 0, the
  // three host steps back to back, then the last chunk's write (its upload is shorter).
  const Makespan h = pipeline_makespan(links(1000, 1, 1000, 1000));
  EXPECT_EQ(h.measured, t(h.n[0], 8, 1000) + t(h.n[0], 4, 1000) + t(h.n[0], 28, 1) +
                            t(h.n[1], 28, 1) + t(h.n[2], 28, 1) + t(h.n[2], 8, 1000));
}

// The chunk sizes of the reads, in program order.
std::vector<int64_t> read_chunks(const Workload& w) {
  std::vector<int64_t> out;
  for (const Op& op : w.stages[0].ops)
    if (w.names[op.name] == names::kOffloadRead) out.push_back(op.bytes);
  return out;
}

TEST(SimDeviceNvme, Zero3SegmentsArePricedApart) {
  Scenario s = small_scenario(4, 2, 1, 1, 1);
  s.parallel.zero = 3;
  s = nvme_offloaded(s, 65536);
  // The segments in memory order (embedding -1, blocks 0..3, head 4) and rank 0's shard of each.
  std::map<int, int64_t> segments;
  for (const auto& t : stage_parameters(s, 0)) segments[t.segment] += t.count;
  ASSERT_EQ(segments.size(), 6u);
  std::vector<int64_t> want;  // each segment's chunks, in elements
  size_t total = 0;
  for (const auto& [id, n] : segments) {  // ascending: the memory order
    const std::vector<int64_t> c = offload_chunks(s, (n + 1) / 2);
    want.insert(want.end(), c.begin(), c.end());
    total += c.size();
  }
  // One range (the old model) would have ceil(Ψ / 2 / 65536) chunks: fewer than the segments'.
  ASSERT_LT(offload_chunks(s, (stage_params(s) + 1) / 2).size(), total);
  // Device (5 ops per chunk, 8 bytes per element through the file), CPU path (3 per chunk, the
  // state's 8 bytes at fp32) and host offload (3 per chunk, no file): per segment its own chunks.
  const Workload dev = build_fp32(s, links(20, 100, 4, 1), 2);
  const NvmeOps o = nvme_ops(dev);
  EXPECT_EQ(o.read.size(), total);
  EXPECT_EQ(o.d2h.size(), total);
  EXPECT_EQ(o.adamw.size(), total);
  EXPECT_EQ(o.h2d.size(), total);
  EXPECT_EQ(o.write.size(), total);
  std::vector<int64_t> bytes;
  for (int64_t c : want) bytes.push_back(8 * c);
  EXPECT_EQ(read_chunks(dev), bytes);
  HardwareProfile cpu_path = links(0, 0, 4, 1);
  const Workload cpu = build_fp32(s, cpu_path, 2);
  EXPECT_EQ(read_chunks(cpu), bytes);
  EXPECT_EQ(nvme_ops(cpu).gpu_adamw, int(total));
  EXPECT_EQ(nvme_ops(cpu).d2h.size(), 0u);
  Scenario host = s;
  host.zero.offload_optimizer = "host";
  const NvmeOps h = nvme_ops(build_fp32(host, links(20, 100, 4, 1), 2));
  EXPECT_EQ(h.d2h.size(), total);
  EXPECT_EQ(h.read.size(), 0u);
}

TEST(SimDeviceNvme, MoeExpertShardIsItsOwnRange) {
  // ZeRO 1 over dp 4 with ep 2: the dense shard over dp, then the experts' over edp 2.
  Scenario s = small_scenario(4, 4, 1, 1, 1);
  s.model.moe.experts = 4;
  s.model.moe.top_k = 2;
  s.model.moe.every = 2;
  s.parallel.ep = 2;
  s.parallel.zero = 1;
  s = nvme_offloaded(s, 65536);
  const Workload w = build_fp32(s, links(20, 100, 4, 1), 4);
  const double dense = double(w.stages[0].param_count) / 4;
  const double experts = double(w.stages[0].expert_param_count) / 2;
  std::vector<int64_t> want;
  for (double n : {dense, experts})
    for (int64_t c : offload_chunks(s, int64_t(std::llround(n)))) want.push_back(8 * c);
  EXPECT_EQ(read_chunks(w), want);
}

TEST(SimDeviceNvme, MemoryIsTheRuntimesClosedForm) {
  const PrecisionConfig fp32 = precision_config("fp32");
  Scenario plain = small_scenario(4, 4, 1, 1, 1);
  plain.parallel.zero = 1;
  const int64_t c = 65536;
  const Scenario off = nvme_offloaded(plain, c);
  const MemoryEstimate a = estimate_memory(plain, fp32, 0)[0];
  const MemoryEstimate dev = estimate_memory(off, fp32, 0, true)[0];
  const MemoryEstimate cpu = estimate_memory(off, fp32, 0, false)[0];
  const double n = double(a.param_count) / 4;
  EXPECT_DOUBLE_EQ(dev.optimizer_bytes, 0);                              // mem.optimizer 0
  EXPECT_DOUBLE_EQ(dev.offload_nvme_bytes, 8 * n);                       // mem.offload_nvme 8n
  EXPECT_DOUBLE_EQ(dev.offload_host_bytes, 4 * n + 8.0 * c + 24.0 * c);  // 4n + 8c + 24c
  EXPECT_DOUBLE_EQ(a.total_bytes - dev.total_bytes, 8 * n);
  // The CPU path's: the state in the file, three chunk buffers of it in memory.
  EXPECT_DOUBLE_EQ(cpu.offload_nvme_bytes, 8 * n);
  EXPECT_DOUBLE_EQ(cpu.optimizer_bytes, 3.0 * c * 8);
  EXPECT_DOUBLE_EQ(cpu.offload_host_bytes, 0);
  // Mixed precision: the file still holds the fp32 moments only, the staging buffers 16-bit.
  const MemoryEstimate mixed = estimate_memory(off, precision_config("mixed"), 0, true)[0];
  EXPECT_DOUBLE_EQ(mixed.offload_nvme_bytes, 8 * n);
  EXPECT_DOUBLE_EQ(mixed.offload_host_bytes, 4 * n + 4.0 * c + 24.0 * c);
  // The simulated trace carries the counters.
  SimResult r;
  auto k = simulated_counters(off, h100_cluster(4), &r);
  ASSERT_EQ(k.count(std::string(names::kMemOffloadHost)), 1u);
  EXPECT_DOUBLE_EQ(k[std::string(names::kMemOffloadHost)], 4 * n + 32.0 * c);
  EXPECT_DOUBLE_EQ(k[std::string(names::kMemOffloadNvme)], 8 * n);
  EXPECT_DOUBLE_EQ(k[std::string(names::kMemOptimizer)], 0);
  // The file's requests are recorded on the stream "offload", as the runtime records them; the
  // simulator's I/O queue is no stream of the trace.
  int reads = 0;
  for (const auto& sp : r.trace->spans) {
    if (r.trace->strings.str(sp.name) != names::kOffloadRead) continue;
    ++reads;
    EXPECT_EQ(sp.stream, names::kStreamOffload);
  }
  EXPECT_GT(reads, 0);
  for (const auto& st : r.trace->streams) EXPECT_LT(st.stream, names::kStreamCount) << st.name;
}

TEST(SimDeviceNvme, ProfileWithoutHostAdamWIsRefused) {
  const Scenario s = nvme_offloaded(small_scenario(4, 1, 1, 1, 1), 65536);
  try {
    build_fp32(s, links(20, 0, 4, 1), 1);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("zero.offload_optimizer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("host_adamw_gbps"), std::string::npos) << e.what();
  }
  // The CPU profile (no host link) keeps the CPU runtime's path: reads on "offload", adamw pieces.
  const Workload cpu = build_fp32(s, default_hardware_profile("cpu", false), 1);
  const NvmeOps o = nvme_ops(cpu);
  EXPECT_TRUE(o.io_order.empty());
  EXPECT_EQ(o.d2h.size(), 0u);
  EXPECT_EQ(size_t(o.gpu_adamw), o.read.size());
  for (uint32_t id : o.read) EXPECT_EQ(cpu.stages[0].ops[id].stream, names::kStreamOffload);
}

TEST(SimDeviceNvme, SearchKeepsWorkingWithNvme) {
  // One GPU whose memory holds the offloaded layouts only: the search offers host and nvme (both
  // keep no optimizer state on the device) and picks the faster, host (no disk).
  Scenario s = small_scenario(4, 1, 1, 1, 1);
  s.training.global_batch = 2;
  s.zero.offload_chunk_mb = 0.25;
  const PrecisionConfig mixed = precision_config("mixed");
  const double need = estimate_memory(nvme_offloaded(s, 65536), mixed, 0, true)[0].total_bytes;
  Cluster c = h100_cluster(1);
  c.device.mem_capacity_bytes = int64_t(need) + 1;
  ASSERT_FALSE(estimate_memory(s, mixed, c.device.mem_capacity_bytes)[0].fits);
  SweepOptions opt;
  opt.gpus = {1};
  opt.search = true;
  opt.search_top = 4;
  opt.sim.network = NetworkModel::Analytical;
  const auto rows = sweep(s, c, opt);
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_TRUE(rows[0].ok) << rows[0].note;
  EXPECT_EQ(rows[0].result.offload, "host");
  EXPECT_TRUE(rows[0].result.fits);
}

}  // namespace
}  // namespace orrery::sim
