// Gradient compression in DDP (issue 18 item 1), on 2 and 4 real MPI ranks: inside the DDP path
// error feedback conserves every bucket's gradient (sent + residual = g + previous residual, per
// step) and the averaged result is every rank's sent values summed in rank order, bit-identical on
// every rank; the bytes of the compressed collectives in the trace equal the closed form (after the
// uncompressed warm-up); PowerSGD reproduces a rank-r gradient; each scheme's loss after 40 steps
// (5 of warm-up) on the synthetic source is within 2 % of the uncompressed run's; dp replicas stay
// bit-identical with ZeRO 1, tp 2 and pp 2. int8 and top-k conserve bit for bit; PowerSGD up to
// the fp32 rounding of residual = e - P Qᵀ. The training loop's device path (a backend whose
// arrays are not host memory: ../host_device_backend.hpp, the CPU kernels with kHostMemory false)
// runs each scheme through the hook's host copy and gives the CPU trainer's losses, parameters and
// ddp.* spans (names, steps, layers, bytes) exactly, with ZeRO 0 and 1, on 2 ranks.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "../host_device_backend.hpp"
#include "mpi_env.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/compression.hpp"
#include "orrery/runtime/ddp.hpp"
#include "orrery/runtime/trainer.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::runtime {
extern template class TrainingLoop<testing::HostDeviceBackend>;  // test_offload_mpi.cpp

namespace {

using testing::world;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

Scenario tiny(int dp, int steps) {
  Scenario s;
  s.name = "ddp-compression-test";
  s.model.layers = 3;
  s.model.d_model = 32;
  s.model.heads = 2;
  s.model.vocab = 64;
  s.model.seq = 16;
  s.training.steps = steps;
  s.training.global_batch = 4 * dp;
  s.training.micro_batch = 4;
  s.training.seed = 42;
  s.training.lr = 1e-3;
  s.parallel.dp = dp;
  s.parallel.bucket_mb = 0.01;  // several buckets per step
  s.runtime.threads = 1;
  return s;
}

CompressionOptions options(CompressionScheme scheme) {
  CompressionOptions c;
  c.scheme = scheme;
  c.powersgd_rank = 2;
  c.topk_ratio = 0.05;
  c.keep_sent = true;
  return c;
}

const char* scheme_name(CompressionScheme s) {
  switch (s) {
    case CompressionScheme::Int8:
      return "int8";
    case CompressionScheme::TopK:
      return "topk";
    case CompressionScheme::PowerSgd:
      return "powersgd";
    default:
      return "none";
  }
}

// Runs one synchronised backward pass of DDP over the gradients already in `m.grads`.
void reduce(DataParallel& ddp, const Gpt& m, int32_t step) {
  ddp.begin_backward(true, step, 0);
  for (int seg = m.config.n_layer; seg >= kEmbedSegment; --seg) ddp.on_grads_ready(seg);
  ddp.finish_backward();
}

class Compressed : public ::testing::TestWithParam<CompressionScheme> {};

TEST_P(Compressed, ErrorFeedbackConservesAndTheAverageIsBitIdentical) {
  const int n = world().size(), r = world().rank();
  const CompressionScheme scheme = GetParam();
  Gpt m = gpt_create(gpt_config(tiny(n, 1).model), GptShard{}, 7);
  DdpOptions dopt;
  dopt.bucket_mb = 0.01;
  DataParallel ddp(m, world(), dopt);
  ddp.enable_compression(options(scheme), grad_matrices(m), nullptr);
  ASSERT_NE(ddp.compression(), nullptr);
  ASSERT_GT(ddp.buckets().size(), 2u);
  const CompressionHook& hook = *ddp.compression();
  for (int32_t step = 0; step < 3; ++step) {
    for (size_t i = 0; i < m.grads.size(); ++i) {
      m.grads[i] = std::sin(0.37f * static_cast<float>(i) + 1.3f * r + 0.7f * step) *
                   (1.0f + 0.5f * static_cast<float>(i % 7));
    }
    const std::vector<float> g(m.grads.begin(), m.grads.end());
    std::vector<std::vector<float>> before;
    for (const auto& b : ddp.buckets()) before.push_back(hook.residual(b.index));
    reduce(ddp, m, step);
    for (const auto& b : ddp.buckets()) {
      const auto& sent = hook.sent(b.index);
      const auto& res = hook.residual(b.index);
      const auto& prev = before[static_cast<size_t>(b.index)];
      for (size_t i = 0; i < b.range.count; ++i) {
        const float e = g[b.range.offset + i] + prev[i];
        if (scheme == CompressionScheme::PowerSgd) {
          // sent = P Qᵀ (fp32 products) and residual = e - sent: conserved up to the two
          // roundings of e - sent and sent + residual, each within 2^-24 of |e| + |sent|.
          ASSERT_LE(std::fabs(sent[i] + res[i] - e),
                    std::ldexp(std::fabs(e) + std::fabs(sent[i]), -23) + 1e-30f)
              << "step " << step << " bucket " << b.index << " entry " << i;
        } else {
          ASSERT_TRUE(same_bits(sent[i] + res[i], e))
              << "step " << step << " bucket " << b.index << " entry " << i;
        }
      }
      // int8 and top-k: the average is everyone's sent values summed in rank order, / n.
      if (scheme == CompressionScheme::PowerSgd) continue;
      std::vector<float> all(sent.size() * static_cast<size_t>(n));
      world().all_gather(sent.data(), all.data(), sent.size(), DType::F32).wait();
      for (size_t i = 0; i < b.range.count; ++i) {
        float sum = 0;
        for (int k = 0; k < n; ++k) sum += all[static_cast<size_t>(k) * sent.size() + i];
        ASSERT_TRUE(same_bits(m.grads[b.range.offset + i], sum * (1.0f / static_cast<float>(n))))
            << "bucket " << b.index << " entry " << i;
      }
    }
    // Every rank ends with the same gradients, bit for bit.
    std::vector<float> rank0(m.grads.begin(), m.grads.end());
    world().broadcast(rank0.data(), rank0.size(), DType::F32, 0).wait();
    for (size_t i = 0; i < rank0.size(); ++i) ASSERT_TRUE(same_bits(rank0[i], m.grads[i])) << i;
  }
}

// The bytes of step 1's compressed collectives (warm-up: step 0 uncompressed, start_step 1), per
// bucket and per rank (an all-gather's span holds the group's total), against compression.hpp's
// closed forms; "ddp.compress" carries each bucket's fp32 bytes.
TEST_P(Compressed, WireBytesInTheTraceEqualTheClosedForm) {
  const int n = world().size(), r = world().rank();
  const CompressionScheme scheme = GetParam();
  Scenario s = tiny(n, 2);
  s.parallel.grad_compression = scheme_name(scheme);
  s.compression.powersgd_rank = 2;
  s.compression.topk_ratio = 0.05;
  s.compression.start_step = 1;
  const std::string path = ::testing::TempDir() + "comp18_wire_" + std::to_string(::getppid()) +
                           "_" + scheme_name(scheme) + "_rank" + std::to_string(r) + ".db";
  std::vector<DdpBucket> buckets;
  std::vector<ParamTensor> tensors;
  {
    traces::TraceWriter writer(path);
    profiler::Recorder rec(&writer, r);
    world().set_recorder(&rec);
    Trainer t(s, world(), &rec);
    buckets = t.ddp().buckets();
    tensors = t.model().tensors;
    t.prepare();
    for (int i = 0; i < s.training.steps; ++i) t.step();
    world().synchronize();
    world().set_recorder(nullptr);
    rec.flush();
    writer.close();
  }
  traces::Trace tr = traces::load_trace(path);
  std::remove(path.c_str());
  std::map<int, int64_t> wire, raw;   // by bucket layer, step 1
  int plain_all_reduces[2] = {0, 0};  // "ddp.all_reduce" in steps 0 and 1
  for (const auto& sp : tr.spans) {
    const std::string name = tr.name_of(sp);
    if (name == "ddp.all_reduce" && sp.step >= 0 && sp.step < 2) ++plain_all_reduces[sp.step];
    if (sp.step != 1) continue;
    if (name == "ddp.compress") raw[sp.layer] += sp.bytes;
    if (name.rfind("ddp.", 0) == 0 && sp.kind == traces::SpanKind::Collective &&
        name != "ddp.all_reduce") {
      wire[sp.layer] += sp.op == traces::CollOp::AllGather ? sp.bytes / n : sp.bytes;
    }
  }
  EXPECT_EQ(plain_all_reduces[0], static_cast<int>(buckets.size()));
  EXPECT_EQ(plain_all_reduces[1], 0);
  ASSERT_EQ(wire.size(), buckets.size());
  size_t total_wire = 0, total_raw = 0;
  for (const auto& b : buckets) {
    const size_t count = b.range.count;
    size_t expect = 0;
    if (scheme == CompressionScheme::Int8) expect = compression::int8_payload_bytes(count, 256);
    if (scheme == CompressionScheme::TopK) expect = compression::topk_payload_bytes(count, 0.05);
    if (scheme == CompressionScheme::PowerSgd) {
      size_t covered = 0;
      for (const auto& t : tensors) {
        const size_t rows = t.rows, cols = t.cols;
        if (t.offset < b.range.offset || t.offset >= b.range.end()) continue;
        if (rows > 1 && cols > 1 && 2 * (rows + cols) < rows * cols) {
          expect += compression::powersgd_payload_bytes(rows, cols, 2);
          covered += t.count;
        }
      }
      expect += 4 * (count - covered);
    }
    EXPECT_EQ(wire[b.lowest_layer], static_cast<int64_t>(expect)) << "bucket " << b.index;
    EXPECT_EQ(raw[b.lowest_layer], static_cast<int64_t>(4 * count)) << "bucket " << b.index;
    EXPECT_LE(expect, 4 * count) << "bucket " << b.index;
    total_wire += expect;
    total_raw += 4 * count;
  }
  EXPECT_LT(total_wire, total_raw / 2);  // compression: under half the fp32 bytes overall
}

// Each scheme trains: the mean loss of steps 35..39 within 2 % of the uncompressed run's, with 5
// uncompressed warm-up steps (compression.start_step), PowerSGD rank 4, top-k 10 %. Measured (this
// machine): dp 2 int8 +0.00 %, top-k +1.08 %, PowerSGD +0.94 %; dp 4 +0.00 %, +1.11 %, +1.46 %.
// (With AdamW and no warm-up, top-k 5 % and rank 2 lag by ~2.7 % after 40 steps on this model.)
TEST_P(Compressed, LossWithinTwoPercentOfUncompressedAfter40Steps) {
  const int n = world().size();
  const auto mean_tail_loss = [&](const std::string& scheme) {
    Scenario s = tiny(n, 40);
    s.parallel.grad_compression = scheme;
    s.compression.powersgd_rank = 4;
    s.compression.topk_ratio = 0.1;
    s.compression.start_step = 5;
    Trainer t(s, world(), nullptr);
    t.prepare();
    double tail = 0;
    for (int i = 0; i < s.training.steps; ++i) {
      const float loss = t.step().loss;
      if (i >= 35) tail += loss / 5.0;
    }
    return tail;
  };
  const double base = mean_tail_loss("none");
  const double comp = mean_tail_loss(scheme_name(GetParam()));
  if (world().rank() == 0) {
    std::printf("%s: mean loss of steps 35-39 %.5f, uncompressed %.5f (%+.2f %%)\n",
                scheme_name(GetParam()), comp, base, 100.0 * (comp - base) / base);
  }
  EXPECT_LE(std::fabs(comp - base), 0.02 * base);
}

INSTANTIATE_TEST_SUITE_P(Schemes, Compressed,
                         ::testing::Values(CompressionScheme::Int8, CompressionScheme::TopK,
                                           CompressionScheme::PowerSgd),
                         [](const auto& p) { return std::string(scheme_name(p.param)); });

// PowerSGD on gradients of rank r: every rank's matrix is (rank + 1) U Vᵀ with U, V of r columns,
// so the average is rank r and P = M Q spans its columns: DDP returns it up to fp32 rounding.
TEST(CompressedPowerSgd, ReproducesARankRGradient) {
  const int n = world().size(), r = world().rank();
  Gpt m = gpt_create(gpt_config(tiny(n, 1).model), GptShard{}, 7);
  DdpOptions dopt;
  dopt.bucket_mb = 0.01;
  DataParallel ddp(m, world(), dopt);
  CompressionOptions c = options(CompressionScheme::PowerSgd);
  ddp.enable_compression(c, grad_matrices(m), nullptr);
  std::vector<float> mean(m.grads.size(), 0.0f);
  const float avg_scale = static_cast<float>(n + 1) / 2.0f;  // mean of (rank + 1)
  for (const auto& mat : grad_matrices(m)) {
    for (size_t i = 0; i < mat.rows; ++i)
      for (size_t k = 0; k < mat.cols; ++k) {
        float v = 0;
        for (int j = 0; j < 2; ++j) {
          v += std::cos(0.3f * i + 1.1f * j) * std::sin(0.17f * k + 0.5f * j + 0.2f);
        }
        mean[mat.offset + i * mat.cols + k] = v * avg_scale;
        m.grads[mat.offset + i * mat.cols + k] = v * static_cast<float>(r + 1);
      }
  }
  reduce(ddp, m, 0);
  double max_err = 0, max_abs = 0;
  for (const auto& mat : grad_matrices(m)) {
    if (2 * (mat.rows + mat.cols) >= mat.rows * mat.cols) continue;  // sent uncompressed
    for (size_t i = 0; i < mat.rows * mat.cols; ++i) {
      const size_t at = mat.offset + i;
      max_err = std::max(max_err, double(std::fabs(m.grads[at] - mean[at])));
      max_abs = std::max(max_abs, double(std::fabs(mean[at])));
    }
  }
  EXPECT_GT(max_abs, 1.0);
  EXPECT_LE(max_err, 1e-4 * max_abs);
}

// dp replicas bit-identical under compression with ZeRO 1 (np 2: dp 2; np 4: dp 4) and, on 4
// ranks, dp 2 x tp 2 and dp 2 x pp 2: the parameters after 3 steps equal dp rank 0's.
struct Grid {
  int dp, tp, pp, zero;
  const char* scheme;
};

class CompressedGrid : public ::testing::TestWithParam<Grid> {};

TEST_P(CompressedGrid, DpReplicasStayBitIdentical) {
  const Grid g = GetParam();
  if (g.dp * g.tp * g.pp != world().size()) GTEST_SKIP() << "needs dp*tp*pp ranks";
  Scenario s = tiny(g.dp, 3);
  s.model.layers = 4;
  s.model.heads = 4;
  s.parallel.tp = g.tp;
  s.parallel.pp = g.pp;
  s.parallel.zero = g.zero;
  s.parallel.grad_compression = g.scheme;
  s.compression.powersgd_rank = 2;
  s.compression.topk_ratio = 0.05;
  if (g.pp > 1) s.training.global_batch = 8 * g.dp;  // two micro-batches through the pipeline
  Trainer t(s, world(), nullptr);
  ASSERT_NE(t.ddp().compression(), nullptr);
  t.prepare();
  for (int i = 0; i < s.training.steps; ++i) t.step();
  std::vector<float> mine = t.parameters();
  std::vector<float> first = mine;
  t.dp_group().broadcast(first.data(), first.size(), DType::F32, 0).wait();
  size_t differ = 0;
  for (size_t i = 0; i < mine.size(); ++i) differ += same_bits(mine[i], first[i]) ? 0 : 1;
  EXPECT_EQ(differ, 0u);
}

INSTANTIATE_TEST_SUITE_P(Layouts, CompressedGrid,
                         ::testing::Values(Grid{2, 1, 1, 1, "int8"}, Grid{2, 1, 1, 1, "powersgd"},
                                           Grid{4, 1, 1, 1, "topk"}, Grid{2, 2, 1, 0, "int8"},
                                           Grid{2, 2, 1, 1, "powersgd"}, Grid{2, 1, 2, 0, "topk"},
                                           Grid{2, 1, 2, 1, "int8"}));

// One rank's run: losses, parameters and its ddp.* spans as (name, kind, step, micro-batch, layer,
// bytes), sorted (the comm thread's and the compute thread's spans interleave by timing only).
struct ProfiledRun {
  std::vector<float> losses, params;
  std::vector<std::tuple<std::string, int, int32_t, int32_t, int32_t, int64_t>> ddp_spans;
  bool staged = false;  // the hook works on a host copy (the device path)
};

template <class T>
ProfiledRun run_profiled(const Scenario& s, const std::string& path) {
  ProfiledRun out;
  {
    traces::TraceWriter writer(path);
    profiler::Recorder rec(&writer, world().rank());
    world().set_recorder(&rec);
    T t(s, world(), &rec);
    out.staged = t.ddp().compression() != nullptr && t.ddp().compression()->staged();
    t.prepare();
    for (int i = 0; i < s.training.steps; ++i) out.losses.push_back(t.step().loss);
    out.params = t.parameters();
    world().synchronize();
    world().set_recorder(nullptr);
    rec.flush();
    writer.close();
  }
  const traces::Trace tr = traces::load_trace(path);
  std::remove(path.c_str());
  for (const auto& sp : tr.spans) {
    const std::string name = tr.name_of(sp);
    if (name.rfind("ddp.", 0) != 0) continue;
    out.ddp_spans.emplace_back(name, static_cast<int>(sp.kind), sp.step, sp.micro_batch, sp.layer,
                               sp.bytes);
  }
  std::sort(out.ddp_spans.begin(), out.ddp_spans.end());
  return out;
}

// The device path of the training loop with each scheme (one uncompressed warm-up step), ZeRO 0
// and 1, against the CPU trainer: the same losses and parameters bit for bit, and the same ddp.*
// spans, the compressed collectives' wire bytes and "ddp.compress" / "ddp.decompress" included.
TEST_P(Compressed, DevicePathEqualsTheCpuTrainerBitForBit) {
  if (world().size() != 2) GTEST_SKIP() << "runs on 2 ranks (CI time)";
  const CompressionScheme scheme = GetParam();
  for (const int zero : {0, 1}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    Scenario s = tiny(2, 3);
    s.parallel.zero = zero;
    s.parallel.grad_compression = scheme_name(scheme);
    s.compression.powersgd_rank = 2;
    s.compression.topk_ratio = 0.05;
    s.compression.start_step = 1;
    const std::string path = ::testing::TempDir() + "comp18_device_" + std::to_string(::getppid()) +
                             "_rank" + std::to_string(world().rank()) + ".db";
    const ProfiledRun cpu = run_profiled<Trainer>(s, path);
    const ProfiledRun dev = run_profiled<testing::HostDeviceLoop>(s, path);
    EXPECT_FALSE(cpu.staged);
    EXPECT_TRUE(dev.staged);
    EXPECT_EQ(dev.losses, cpu.losses);
    ASSERT_EQ(dev.params.size(), cpu.params.size());
    EXPECT_EQ(0, std::memcmp(dev.params.data(), cpu.params.data(), cpu.params.size() * 4));
    EXPECT_EQ(dev.ddp_spans, cpu.ddp_spans);
    // The comparison is of compressed runs: steps 1 and 2 compress (a compress span per bucket).
    int compress = 0;
    for (const auto& sp : cpu.ddp_spans) compress += std::get<0>(sp) == "ddp.compress" ? 1 : 0;
    EXPECT_GE(compress, 2 * 3);
  }
}

}  // namespace
}  // namespace orrery::runtime
