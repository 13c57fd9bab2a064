// Host offload in the simulator (zero.offload_optimizer host, ZeRO-Offload on a GPU; workload.hpp,
// memory.hpp) against the CUDA runtime's pipeline (runtime offload_pipeline.hpp):
//  - per chunk exactly one offload.d2h and offload.h2d on the stream "offload" (4 bytes per element
//    at fp32, time bytes / the rank's share of its host link) and one offload.adamw on the compute
//    stream (time 28 bytes per element / the rank's share of the node's host AdamW bandwidth), no
//    GPU adamw; the copy stream in the host's issue order D0 D1 U0 D2 U1 ..., step i after
//    download i, upload i after step i, download i+1 and upload i-1 queued before step i; 3 ops
//    per chunk in place of the GPU's adamw, within workload_ops_bound (host and nvme);
//  - the executed pipeline's makespan equals its closed form on one rank with 3 chunks, host-bound
//    (d0 + a0 + a1 + a2 + u2) and link-bound (every copy back to back: Σd + Σu);
//  - memory: mem.optimizer 0 on the device, mem.offload_host 12n + 8c (the runtime's closed form,
//    tests/runtime/cuda/test_cuda_offload.cpp), the simulated trace's counters;
//  - the profile keys, a profile without a host link refused naming the key, and `sweep --search`
//    offering +host for a layout that fits only without its optimizer state;
//  - calibration recovers the host link and the host AdamW bandwidth exactly from synthetic spans
//    (GPU traces: as fitted rows; CPU traces: from the run's own adamw spans).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "calibration_fixtures.hpp"
#include "offload_test_util.hpp"
#include "orrery/common/error.hpp"
#include "orrery/model/names.hpp"
#include "orrery/sim/calibrate.hpp"
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

Scenario host_offloaded(Scenario s, int64_t chunk_elems) {
  s.zero.offload_optimizer = "host";
  s.zero.offload_chunk_mb = chunk_mb_of(chunk_elems);
  return s;
}

HardwareProfile h100_links(double link_gbps, double adamw_gbps) {
  HardwareProfile p = default_hardware_profile("H100-SXM", true);
  p.offload.host_link_bytes_per_s = link_gbps * 1e9;
  p.offload.host_adamw_bytes_per_s = adamw_gbps * 1e9;
  return p;
}

struct OffloadOps {
  std::vector<uint32_t> d2h, adamw, h2d;  // op ids, in program order
  int gpu_adamw = 0;
  std::string copy_order;  // 'D' / 'U' along the offload stream
};
OffloadOps offload_ops(const Workload& w) {
  OffloadOps o;
  const StageProgram& p = w.stages[0];
  for (uint32_t id = 0; id < p.ops.size(); ++id) {
    const std::string& n = w.names[p.ops[id].name];
    if (n == names::kOffloadD2H) o.d2h.push_back(id);
    if (n == names::kOffloadAdamW) o.adamw.push_back(id);
    if (n == names::kOffloadH2D) o.h2d.push_back(id);
    if (n == names::kOptimizerStep) ++o.gpu_adamw;
  }
  for (uint32_t id : p.stream_ops[names::kStreamOffload])
    o.copy_order += w.names[p.ops[id].name] == names::kOffloadD2H ? 'D' : 'U';
  return o;
}

TEST(SimHostOffload, ChunksHaveTheRuntimesSpansBytesTimesAndOrder) {
  Scenario s = small_scenario(4, 2, 1, 1, 1);
  s.parallel.zero = 1;
  const int64_t updated = stage_params(s) / 2;  // ZeRO 1 over dp 2 (even count here)
  ASSERT_EQ(stage_params(s) % 2, 0);
  s = host_offloaded(s, 262144);
  HardwareProfile prof = h100_links(20, 100);  // 2 ranks on the node: 50 GB/s of host each
  prof.offload.host_link_shared_by = 2;        // and one link for both: 10 GB/s each
  const Workload w = build_fp32(s, prof, 2);
  const StageProgram& p = w.stages[0];
  const std::vector<int64_t> chunks = offload_chunks(s, updated);
  ASSERT_EQ(chunks.size(), size_t((updated + 262143) / 262144));
  ASSERT_GT(chunks.size(), 2u);
  const OffloadOps o = offload_ops(w);
  ASSERT_EQ(o.d2h.size(), chunks.size());
  ASSERT_EQ(o.adamw.size(), chunks.size());
  ASSERT_EQ(o.h2d.size(), chunks.size());
  EXPECT_EQ(o.gpu_adamw, 0);  // the GPU's own AdamW is gone
  std::string want = "D";
  for (size_t i = 0; i < chunks.size(); ++i)
    want += std::string(i + 1 < chunks.size() ? "D" : "") + "U";
  EXPECT_EQ(o.copy_order, want);  // D0 D1 U0 D2 U1 ... U(c-1)
  int64_t down = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Op& d = p.ops[o.d2h[i]];
    const Op& a = p.ops[o.adamw[i]];
    const Op& u = p.ops[o.h2d[i]];
    EXPECT_EQ(d.bytes, 4 * chunks[i]);
    EXPECT_EQ(u.bytes, 4 * chunks[i]);
    EXPECT_EQ(a.bytes, 4 * chunks[i]);  // the runtime's span: the chunk's fp32 bytes
    EXPECT_EQ(d.kind, traces::SpanKind::Memcpy);
    EXPECT_EQ(d.stream, names::kStreamOffload);
    EXPECT_EQ(u.stream, names::kStreamOffload);
    EXPECT_EQ(a.stream, names::kStreamCompute);
    EXPECT_EQ(a.kind, traces::SpanKind::Optimizer);
    EXPECT_EQ(d.duration_ns, ceil_ns(4.0 * double(chunks[i]), 10e9));
    EXPECT_EQ(u.duration_ns, ceil_ns(4.0 * double(chunks[i]), 10e9));
    EXPECT_EQ(a.duration_ns, ceil_ns(28.0 * double(chunks[i]), 50e9));
    EXPECT_TRUE(depends_on(p, o.adamw[i], o.d2h[i]));  // step i after download i
    EXPECT_TRUE(depends_on(p, o.h2d[i], o.adamw[i]));  // upload i after step i
    // Queued before step i: download i+1 and upload i-1; download i+2 and upload i after it.
    if (i + 1 < chunks.size()) {
      EXPECT_LT(o.d2h[i + 1], o.adamw[i]);
    }
    if (i > 0) {
      EXPECT_LT(o.h2d[i - 1], o.adamw[i]);
    }
    if (i + 2 < chunks.size()) {
      EXPECT_GT(o.d2h[i + 2], o.adamw[i]);
    }
    EXPECT_GT(o.h2d[i], o.adamw[i]);
    down += d.bytes;
  }
  EXPECT_EQ(down, 4 * updated);
}

TEST(SimHostOffload, OpsBoundCountsTheChunks) {
  // Chunks of 1 element: the simulator's cap of kMaxOffloadChunks, 3 (host) or 5 (nvme) ops each,
  // within the bound.
  for (const char* o : {"host", "nvme"}) {
    Scenario s = host_offloaded(small_scenario(1, 1, 1, 1, 1), 1);
    s.zero.offload_optimizer = o;
    s.zero.nvme_path = "nvme";
    const Workload w = build_fp32(s, h100_links(20, 100), 1);
    const size_t ops = w.stages[0].ops.size();
    EXPECT_LE(double(ops), workload_ops_bound(s, 1)) << o;
    Scenario plain = s;
    plain.zero.offload_optimizer = "none";
    // nvme on a device: the file's read and write too (test_device_nvme_sim.cpp).
    const unsigned per_chunk = std::string(o) == "host" ? 3u : 5u;
    EXPECT_EQ(ops - build_fp32(plain, h100_links(20, 100), 1).stages[0].ops.size(),
              per_chunk * kMaxOffloadChunks - 1)
        << o;  // the GPU's adamw replaced
  }
}

// One rank, 3 chunks (2 of `n`, the last the rest): the executed optimizer pipeline's makespan,
// from the first download's start to the last upload's end.
Makespan pipeline_makespan(double link_gbps, double adamw_gbps) {
  Scenario s = small_scenario(4, 1, 1, 1, 1);
  const int64_t params = stage_params(s), n = (params + 2) / 3;
  s = host_offloaded(s, n);
  const Workload w = build_fp32(s, h100_links(link_gbps, adamw_gbps), 1);
  const OffloadOps o = offload_ops(w);
  EXPECT_EQ(o.d2h.size(), 3u);
  const ExecResult r = execute(w, h100_cluster(1));
  const auto& ops = r.ranks[0].ops;
  return {ops[o.h2d.back()].end_ns - ops[o.d2h.front()].start_ns, {n, n, params - 2 * n}};
}

TEST(SimHostOffload, PipelineMakespanIsItsClosedForm) {
  // Host-bound (28 / 10 > 8 / 40 ns per element): the host steps back to back after the first
  // download, the last upload after the last step.
  const Makespan h = pipeline_makespan(40, 10);
  auto d = [](int64_t n, double gbps) { return ceil_ns(4.0 * double(n), gbps * 1e9); };
  auto a = [](int64_t n, double gbps) { return ceil_ns(28.0 * double(n), gbps * 1e9); };
  EXPECT_EQ(h.measured,
            d(h.n[0], 40) + a(h.n[0], 10) + a(h.n[1], 10) + a(h.n[2], 10) + d(h.n[2], 40));
  // Link-bound (28 / 1000 < 4 / 2 ns per element): the copy stream never idles.
  const Makespan l = pipeline_makespan(2, 1000);
  int64_t copies = 0;
  for (int64_t n : l.n) copies += 2 * d(n, 2);
  EXPECT_EQ(l.measured, copies);
}

TEST(SimHostOffload, MemoryIsTheRuntimesClosedForm) {
  const PrecisionConfig fp32 = precision_config("fp32");
  Scenario plain = small_scenario(4, 4, 1, 1, 1);
  plain.parallel.zero = 1;
  const int64_t c = 65536;
  const Scenario off = host_offloaded(plain, c);
  const MemoryEstimate a = estimate_memory(plain, fp32, 0)[0];
  const MemoryEstimate b = estimate_memory(off, fp32, 0)[0];
  const double n = double(a.param_count) / 4;
  EXPECT_DOUBLE_EQ(a.optimizer_bytes, 8 * n);
  EXPECT_DOUBLE_EQ(b.optimizer_bytes, 0);                    // mem.optimizer 0
  EXPECT_DOUBLE_EQ(b.offload_host_bytes, 12 * n + 8.0 * c);  // mem.offload_host 12n + 8c
  EXPECT_DOUBLE_EQ(a.total_bytes - b.total_bytes, 8 * n);
  EXPECT_DOUBLE_EQ(a.offload_host_bytes, 0);
  // A chunk larger than the range: the runtime clamps it to the range.
  const MemoryEstimate whole = estimate_memory(host_offloaded(plain, 1 << 24), fp32, 0)[0];
  EXPECT_DOUBLE_EQ(whole.offload_host_bytes, 12 * n + 8 * n);
  // The simulated trace carries the counters.
  SimResult r;
  auto k = simulated_counters(off, h100_cluster(4), &r);
  EXPECT_EQ(r.offload, "host");
  ASSERT_EQ(k.count(std::string(names::kMemOffloadHost)), 1u);
  EXPECT_DOUBLE_EQ(k[std::string(names::kMemOffloadHost)], 12 * n + 8.0 * c);
  ASSERT_EQ(k.count(std::string(names::kMemOptimizer)), 1u);
  EXPECT_DOUBLE_EQ(k[std::string(names::kMemOptimizer)], 0);
}

TEST(SimHostOffload, ProfileKeysDefaultsAndRefusals) {
  const HardwareProfile a = default_hardware_profile("A100-SXM-80GB", true);
  EXPECT_DOUBLE_EQ(a.offload.host_link_bytes_per_s, 31.5e9);
  EXPECT_DOUBLE_EQ(a.offload.host_adamw_bytes_per_s, 2 * 8 * 25.6e9);  // DDR4-3200, 2 x 8 channels
  EXPECT_EQ(a.offload.host_link_shared_by, 1);
  EXPECT_DOUBLE_EQ(default_hardware_profile("H200", true).offload.host_adamw_bytes_per_s,
                   2 * 8 * 38.4e9);  // DDR5-4800
  const HardwareProfile p = parse_hardware_profile(
      "name: x\ndevice: H100-SXM\noffload: {host_adamw_gbps: 100, host_link_shared_by: 2}\n",
      "p.yaml");
  EXPECT_DOUBLE_EQ(p.offload.host_adamw_bytes_per_s, 100e9);
  EXPECT_EQ(p.offload.host_link_shared_by, 2);
  EXPECT_DOUBLE_EQ(p.offload.host_link_bytes_per_s, 63e9);  // the preset's
  const HardwareProfile back = parse_hardware_profile(to_yaml(p), "back.yaml");
  EXPECT_DOUBLE_EQ(back.offload.host_adamw_bytes_per_s, 100e9);
  EXPECT_EQ(back.offload.host_link_shared_by, 2);
  EXPECT_THROW(parse_hardware_profile("name: x\noffload: {host_link_shared_by: 0}\n", "p.yaml"),
               InputError);
  EXPECT_THROW(parse_hardware_profile("name: x\noffload: {host_link_shared_by: 1.5}\n", "p.yaml"),
               InputError);
  // A CPU profile has no host link: a host-offload scenario is refused, naming the key.
  const Scenario s = host_offloaded(small_scenario(4, 1, 1, 1, 1), 65536);
  const HardwareProfile cpu = default_hardware_profile("cpu", false);
  try {
    build_fp32(s, cpu, 1);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("zero.offload_optimizer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("host_link_gbps"), std::string::npos) << e.what();
  }
}

TEST(SimHostOffload, SearchOffersHostWhenTheStateDoesNotFit) {
  Scenario s = small_scenario(4, 1, 1, 1, 1);
  s.training.global_batch = 2;
  s.zero.offload_chunk_mb = 0.25;
  const PrecisionConfig mixed = precision_config("mixed");
  // One GPU whose memory holds the host-offloaded layout but not the plain one.
  const double need = estimate_memory(host_offloaded(s, 65536), mixed, 0)[0].total_bytes;
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
  EXPECT_EQ(rows[0].result.offload, "host");  // nvme fits too (no state on the GPU), but is slower
  EXPECT_TRUE(rows[0].result.fits);
}

// Adds a host offload's spans to rank `rank` of `t` at step `step`: `chunks` chunks of `elems`
// elements, each copy `copy_ns` and each host step `step_ns` long.
void add_host_offload_spans(traces::Trace& t, int rank, int step, int chunks, int64_t elems,
                            int64_t copy_ns, int64_t step_ns) {
  int64_t now = 1'000'000'000LL * (step + 1);
  auto add = [&](std::string_view name, traces::SpanKind kind, int stream, int64_t dur) {
    traces::Span sp;
    sp.rank = rank, sp.stream = stream, sp.kind = kind,
    sp.name = t.strings.intern(std::string(name));
    sp.start_ns = now, sp.end_ns = now + dur, sp.step = step, sp.bytes = 4 * elems;
    t.spans.push_back(sp);
    now += dur;
  };
  for (int i = 0; i < chunks; ++i) {
    add(names::kOffloadD2H, traces::SpanKind::Memcpy, names::kStreamOffload, copy_ns);
    add(names::kOffloadAdamW, traces::SpanKind::Optimizer, names::kStreamCompute, step_ns);
    add(names::kOffloadH2D, traces::SpanKind::Memcpy, names::kStreamOffload, copy_ns);
  }
}

const GpuFitRow* find_row(const CalibrationResult& r, const std::string& name) {
  for (const auto& g : r.gpu)
    if (g.parameter == name) return &g;
  return nullptr;
}

TEST(CalibrateHostOffload, RecoversLinkAndHostRateFromGpuSpans) {
  using testing_fixtures::make_run;
  using testing_fixtures::tiny;
  const testing_fixtures::Truth truth;
  std::vector<traces::Trace> runs = {make_run(tiny(2), truth, 1.0), make_run(tiny(1), truth, 1.0)};
  for (auto& t : runs) {
    t.meta.layout.device = "cuda";
    for (auto& r : t.ranks) r.device = "cuda:0 NVIDIA H100 80GB HBM3";
  }
  // The dp 2 run offloads chunks of 2^18 elements: each copy 1 MiB in 41943 ns (about 25 GB/s),
  // each host step 28 x 2^18 bytes of state in 917504 ns (8 GB/s per rank; 2 ranks on the node).
  const int64_t elems = 262144;
  const int64_t copy_ns = 41943, step_ns = 917504;
  for (int step = 1; step < 4; ++step)
    for (int rank = 0; rank < 2; ++rank)
      add_host_offload_spans(runs[0], rank, step, 3, elems, copy_ns, step_ns);
  // Its adamw spans hold the whole pipeline: ten times the GPU kernel's time here.
  for (auto& sp : runs[0].spans)
    if (runs[0].name_of(sp) == names::kOptimizerStep) sp.end_ns += 9 * sp.duration_ns();
  CalibrationOptions opt;
  opt.flat_gemm = true;
  const CalibrationResult r = calibrate(runs, opt);
  const OffloadLinks& o = r.profile.offload;
  EXPECT_DOUBLE_EQ(o.host_link_bytes_per_s, 4.0 * elems / double(copy_ns) * 1e9);
  EXPECT_DOUBLE_EQ(o.host_adamw_bytes_per_s, 28.0 * elems / double(step_ns) * 1e9 * 2);
  const GpuFitRow* link = find_row(r, "offload.host_link_gbps");
  ASSERT_NE(link, nullptr);
  EXPECT_TRUE(link->fitted);
  EXPECT_EQ(link->kernels, 3 * 2 * 3 * 2);  // steps 1-3, 2 ranks, 3 chunks, d2h and h2d
  EXPECT_DOUBLE_EQ(link->value, o.host_link_bytes_per_s / 1e9);
  const GpuFitRow* adamw = find_row(r, "offload.host_adamw_gbps");
  ASSERT_NE(adamw, nullptr);
  EXPECT_EQ(adamw->kernels, 3 * 2 * 3);
  EXPECT_EQ(adamw->traces, std::vector<std::string>{runs[0].path});
  EXPECT_NE(calibrated_yaml(r).find("# fit: offload.host_link_gbps"), std::string::npos);
  EXPECT_NE(calibrated_yaml(r).find("from 36 spans of " + runs[0].path), std::string::npos);
  // The offloading run's adamw spans left the optimizer class's fit: the other run's give it.
  const Device h100 = *device_preset("H100-SXM");
  EXPECT_NEAR(r.profile.cost(OpClass::Optimizer).bandwidth_efficiency *
                  h100.mem_bandwidth_bytes_per_s * truth.s_byte[3],
              1.0, 0.01);
  const CalibrationResult plain = calibrate({runs[1]}, opt);
  EXPECT_EQ(find_row(plain, "offload.host_link_gbps"), nullptr);
}

TEST(CalibrateHostOffload, ACpuRunsAdamwIsTheHostRate) {
  using testing_fixtures::make_run;
  using testing_fixtures::tiny;
  const testing_fixtures::Truth truth;
  const Scenario s = tiny(2);
  const traces::Trace t = make_run(s, truth, 1.0);
  CalibrationOptions opt;
  opt.cores = 4;
  const CalibrationResult r = calibrate({t}, opt);
  // Every adamw span of steps 1-3 has the same length; each rank updates all the parameters.
  int64_t ns = -1;
  for (const auto& sp : t.spans)
    if (t.name_of(sp) == names::kOptimizerStep && sp.step == 1) ns = sp.duration_ns();
  ASSERT_GT(ns, 0);
  const double want = 28.0 * double(stage_params(s)) / double(ns) * 1e9 * 2;  // 2 ranks on the node
  EXPECT_NEAR(r.profile.offload.host_adamw_bytes_per_s / want, 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(r.profile.offload.host_link_bytes_per_s, 0);  // a CPU has no host link
  bool noted = false;
  for (const auto& n : r.notes) noted = noted || n.rfind("offload.host_adamw_gbps", 0) == 0;
  EXPECT_TRUE(noted);
}

}  // namespace
}  // namespace orrery::sim
