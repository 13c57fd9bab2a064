// DDP on 2 and 4 ranks against a serial run: data parallelism on N ranks with micro-batch b ends
// with the same parameters after k steps as one process with batch N*b (relative 1e-5), with
// overlap on and off, several buckets, and gradient accumulation. Also the spans a step records.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "mpi_env.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/trainer.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::runtime {
namespace {

using testing::world;

Scenario tiny(int dp, int global_batch, int micro_batch, int steps) {
  Scenario s;
  s.name = "ddp-test";
  s.model.layers = 3;
  s.model.d_model = 32;
  s.model.heads = 2;
  s.model.vocab = 64;
  s.model.seq = 16;
  s.training.steps = steps;
  s.training.global_batch = global_batch;
  s.training.micro_batch = micro_batch;
  s.training.seed = 42;
  s.training.lr = 1e-3;
  s.parallel.dp = dp;
  s.parallel.bucket_mb = 0.01;  // ~10 KiB: a bucket per block or two, several all-reduces per step
  s.runtime.threads = 1;
  return s;
}

std::vector<float> train(const Scenario& s, Communicator& comm) {
  Trainer t(s, comm, nullptr);
  t.prepare();
  for (int i = 0; i < s.training.steps; ++i) t.step();
  return std::vector<float>(t.model().params.begin(), t.model().params.end());
}

// max |a - b| / max |b|: relative to the parameters' scale, so elements near zero do not dominate.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(static_cast<double>(a[i]) - b[i]));
    max_ref = std::max(max_ref, std::abs(static_cast<double>(b[i])));
  }
  return max_diff / max_ref;
}

struct Case {
  bool overlap;
  int micro_per_rank;  // micro-batch size b' on each rank; b / b' micro-batches accumulated
};

class DdpEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(DdpEquivalence, SameParametersAsSerialBatch) {
  const int n = world().size();
  const int b = 4, k = 3;
  Scenario par = tiny(n, n * b, GetParam().micro_per_rank, k);
  par.parallel.overlap = GetParam().overlap;
  const std::vector<float> dp_params = train(par, world());

  // Replicas agree exactly: they apply the same averaged gradients.
  std::vector<float> rank0 = dp_params;
  world().broadcast(rank0.data(), rank0.size(), DType::F32, 0).wait();

  // The serial reference on every rank (cheap at this size): one process, batch N*b.
  auto local = make_local_communicator();
  const std::vector<float> serial = train(tiny(1, n * b, n * b, k), *local);

  ASSERT_EQ(dp_params.size(), serial.size());
  EXPECT_EQ(dp_params, rank0) << "replicas diverged";
  const double err = relative_error(dp_params, serial);
  if (world().rank() == 0) std::printf("  relative error vs serial: %.3g\n", err);
  EXPECT_LT(err, 1e-5) << "DP on " << n << " ranks vs serial batch " << n * b;
  // And training did move the parameters (the test is not vacuous).
  Trainer fresh(tiny(1, n * b, n * b, k), *local, nullptr);
  const std::vector<float> init(fresh.model().params.begin(), fresh.model().params.end());
  EXPECT_GT(relative_error(serial, init), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Modes, DdpEquivalence,
                         ::testing::Values(Case{true, 4}, Case{false, 4}, Case{true, 2}),
                         [](const auto& param_info) {
                           const Case& c = param_info.param;
                           return std::string(c.overlap ? "overlap" : "no_overlap") + "_micro" +
                                  std::to_string(c.micro_per_rank);
                         });

TEST(DdpBuckets, CoverTheGradientsInReadyOrder) {
  Scenario s = tiny(1, 4, 4, 1);
  Gpt m = gpt_create(gpt_config(s.model), GptShard{}, 1);
  const double block_bytes = static_cast<double>(m.segment_range(0).count) * 4;
  // A cap of 1.1 blocks: buckets [lnf, b2], [b1], [b0], [embed] (a segment is never split).
  auto buckets = make_ddp_buckets(m, 1.1 * block_bytes / (1024.0 * 1024.0));
  size_t covered = 0;
  for (const auto& bk : buckets) covered += bk.range.count;
  EXPECT_EQ(covered, m.num_params());
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_EQ(buckets[0].segments, (std::vector<int>{3, 2}));
  EXPECT_EQ(buckets[0].lowest_layer, 2);
  EXPECT_EQ(buckets[1].segments, (std::vector<int>{1}));
  EXPECT_EQ(buckets[2].segments, (std::vector<int>{0}));
  EXPECT_EQ(buckets[3].segments, (std::vector<int>{kEmbedSegment}));
  EXPECT_EQ(buckets[3].lowest_layer, kEmbedSegment);
  EXPECT_EQ(buckets[3].range.offset, 0u);
  EXPECT_EQ(buckets[0].range.end(), m.num_params());
  for (size_t i = 1; i < buckets.size(); ++i) {
    EXPECT_EQ(buckets[i].range.end(), buckets[i - 1].range.offset) << "buckets not contiguous";
  }
  // One huge bucket (the 25 MiB default on a small model).
  EXPECT_EQ(make_ddp_buckets(m, 25.0).size(), 1u);
}

TEST(DdpTrace, StepRecordsTheDocumentedSpans) {
  const int n = world().size(), r = world().rank();
  const int steps = 2, micro = 2;
  Scenario s = tiny(n, n * 4, 4 / micro, steps);
  const std::string path = ::testing::TempDir() + "orrery_ddp_trace_" + std::to_string(::getppid()) +
                           "_rank" + std::to_string(r) + ".db";
  size_t buckets = 0;
  {
    traces::TraceWriter writer(path);
    profiler::Recorder rec(&writer, r);
    world().set_recorder(&rec);
    Trainer t(s, world(), &rec);
    buckets = t.ddp().buckets().size();
    t.prepare();
    for (int i = 0; i < steps; ++i) t.step();
    world().synchronize();
    world().set_recorder(nullptr);
    rec.flush();
    writer.close();
  }
  traces::Trace t = traces::load_trace(path);
  std::remove(path.c_str());

  // The compute stream, in time order, for step 1.
  std::vector<std::string> names;
  std::vector<int> layers;
  int all_reduces = 0;
  int64_t last_seq = -1;
  bool seq_increasing = true;
  for (const auto& sp : t.spans) {
    if (sp.step != 1) continue;
    if (sp.stream == profiler::kComputeStream && sp.kind != traces::SpanKind::Phase) {
      names.push_back(t.name_of(sp));
      layers.push_back(sp.layer);
    }
    if (sp.kind == traces::SpanKind::Collective && t.name_of(sp) == "ddp.all_reduce") {
      ++all_reduces;
      EXPECT_EQ(sp.micro_batch, micro - 1);
      EXPECT_EQ(sp.stream, profiler::kCommStream);
      seq_increasing = seq_increasing && sp.seq > last_seq;
      last_seq = sp.seq;
    }
  }
  std::vector<std::string> expect;
  std::vector<int> expect_layers;
  expect.push_back("zero_grad");
  expect_layers.push_back(-1);
  for (int mb = 0; mb < micro; ++mb) {
    expect.push_back("data");
    expect_layers.push_back(-1);
    expect.push_back("fwd.embed");
    expect_layers.push_back(-1);
    for (int l = 0; l < s.model.layers; ++l) {
      expect.push_back("fwd.block");
      expect_layers.push_back(l);
    }
    expect.push_back("fwd.head");
    expect_layers.push_back(s.model.layers);
    expect.push_back("bwd.head");
    expect_layers.push_back(s.model.layers);
    for (int l = s.model.layers - 1; l >= 0; --l) {
      expect.push_back("bwd.block");
      expect_layers.push_back(l);
    }
    expect.push_back("bwd.embed");
    expect_layers.push_back(-1);
  }
  expect.push_back("adamw");
  expect_layers.push_back(-1);
  EXPECT_EQ(names, expect);
  EXPECT_EQ(layers, expect_layers);
  EXPECT_EQ(all_reduces, n > 1 ? static_cast<int>(buckets) : 0);
  EXPECT_TRUE(seq_increasing);

  // Phases of step 1: one step, M forwards and backwards, one optimizer.
  int step_phases = 0, fwd = 0, bwd = 0, opt = 0;
  for (const auto& sp : t.spans) {
    if (sp.step != 1 || sp.kind != traces::SpanKind::Phase) continue;
    const std::string& nm = t.name_of(sp);
    step_phases += nm == "step";
    fwd += nm == "forward";
    bwd += nm == "backward";
    opt += nm == "optimizer";
  }
  EXPECT_EQ(step_phases, 1);
  EXPECT_EQ(fwd, micro);
  EXPECT_EQ(bwd, micro);
  EXPECT_EQ(opt, 1);
  // Memory counters: the five series, parameters = 4 bytes per parameter.
  std::set<std::string> counter_names;
  for (const auto& c : t.counters) counter_names.insert(t.strings.str(c.name));
  EXPECT_EQ(counter_names, (std::set<std::string>{"mem.activations", "mem.comm_buffers",
                                                  "mem.gradients", "mem.optimizer",
                                                  "mem.parameters"}));
}

}  // namespace
}  // namespace orrery::runtime
