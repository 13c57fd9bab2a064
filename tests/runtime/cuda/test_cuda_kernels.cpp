// Every op of runtime/kernels.hpp on both backends, forward and backward, from the same random
// inputs (ggml's test-backend-ops idea): the CUDA result must match the CPU reference to a
// normalised error max|gpu - cpu| / max|cpu| below 1e-5 in fp32, 5e-3 with TF32 and 3e-2 with bf16
// matrix products. Backward outputs start from random values, so accumulation (+=) is checked too.
// Sizes are odd on purpose (T = 37, V = 101, OC = 96): rows longer than a warp, partial blocks.
// Suites are named Gpu*: they need a device and skip with the reason without one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "device_test_util.hpp"
#include "orrery/runtime/cuda/device.hpp"
#include "orrery/runtime/cuda/kernels.hpp"
#include "orrery/runtime/kernels.hpp"
#include "orrery/runtime/optimizer.hpp"

namespace orrery::runtime::cuda {
namespace {

using Vec = std::vector<float>;

Vec random_vec(std::size_t n, uint32_t seed, float scale = 1.0f, float shift = 0.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Vec v(n);
  for (auto& x : v) x = u(rng) * scale + shift;
  return v;
}

std::vector<int32_t> random_tokens(std::size_t n, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> u(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

using device_test_util::normalised_error;
using device_test_util::upload;

double bound_for(MathMode m) {
  switch (m) {
    case MathMode::kFp32:
      return 1e-5;
    case MathMode::kTf32:
      return 5e-3;
    case MathMode::kBf16:
      return 3e-2;
  }
  return 0;
}

class GpuKernelBase {
 public:  // check_attention below uses expect_close
  void start(MathMode math) {
    if (device_count() == 0) return;
    select_device(0);
    stream_ = std::make_unique<Stream>();
    ctx_ = std::make_unique<Context>(stream_->get(), math);
    bound_ = bound_for(math);
  }
  // Waits for the stream and compares a device array with the CPU result.
  void expect_close(const char* what, const DeviceArray<float>& gpu, const Vec& cpu,
                    double bound = -1) {
    stream_->synchronize();
    ASSERT_EQ(gpu.size(), cpu.size()) << what;
    const Vec g = gpu.to_host();
    const double err = normalised_error(g, cpu);
    const double b = bound < 0 ? bound_ : bound;
    std::printf("  %-28s %-5s normalised error %.3g (bound %.0e)\n", what,
                math_mode_name(ctx_->math()), err, b);
    EXPECT_LT(err, b) << what;
    for (float x : g) {
      if (!std::isfinite(x)) {
        ADD_FAILURE() << what << ": non-finite GPU value";
        break;
      }
    }
  }
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Context> ctx_;
  double bound_ = 1e-5;
};

// Ops without matrix products: fp32 only.
class GpuKernelOps : public GpuKernelBase, public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count() == 0) GTEST_SKIP() << no_device_reason();
    start(MathMode::kFp32);
  }
};

// Ops built on cuBLAS, in each math mode.
class GpuKernelGemm : public GpuKernelBase, public ::testing::TestWithParam<MathMode> {
 protected:
  void SetUp() override {
    if (device_count() == 0) GTEST_SKIP() << no_device_reason();
    start(GetParam());
  }
};

constexpr int B = 2, T = 37, C = 64, NH = 4, OC = 96, V = 101;
constexpr std::size_t BT = static_cast<std::size_t>(B) * T;
// Backward outputs start here (small next to the gradients, so they do not hide their errors).
constexpr float kInit = 0.01f;

TEST_F(GpuKernelOps, Encoder) {
  const Vec wte = random_vec(static_cast<std::size_t>(V) * C, 1),
            wpe = random_vec(static_cast<std::size_t>(T) * C, 2);
  const auto inp = random_tokens(BT, 7, 3);  // few distinct tokens: the scatter must add repeats
  Vec out(BT * C);
  runtime::encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  auto d_wte = upload(wte), d_wpe = upload(wpe);
  auto d_inp = upload(inp);
  DeviceArray<float> d_out(BT * C);
  encoder_forward(*ctx_, d_out.data(), d_inp.data(), d_wte.data(), d_wpe.data(), B, T, C);
  expect_close("encoder_forward out", d_out, out);

  const Vec dout = random_vec(BT * C, 4);
  Vec dwte = random_vec(wte.size(), 5, kInit), dwpe = random_vec(wpe.size(), 6, kInit);
  auto d_dwte = upload(dwte), d_dwpe = upload(dwpe), d_dout = upload(dout);
  runtime::encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), B, T, C);
  encoder_backward(*ctx_, d_dwte.data(), d_dwpe.data(), d_dout.data(), d_inp.data(), B, T, C);
  expect_close("encoder_backward dwte", d_dwte, dwte);
  expect_close("encoder_backward dwpe", d_dwpe, dwpe);
}

TEST_F(GpuKernelOps, LayerNorm) {
  const Vec inp = random_vec(BT * C, 10, 3.0f, 0.5f), w = random_vec(C, 11, 1.0f, 1.0f),
            b = random_vec(C, 12);
  Vec out(BT * C), mean(BT), rstd(BT);
  runtime::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(),
                             B, T, C);
  auto d_inp = upload(inp), d_w = upload(w), d_b = upload(b);
  DeviceArray<float> d_out(BT * C), d_mean(BT), d_rstd(BT);
  layernorm_forward(*ctx_, d_out.data(), d_mean.data(), d_rstd.data(), d_inp.data(), d_w.data(),
                    d_b.data(), B, T, C);
  expect_close("layernorm_forward out", d_out, out);
  expect_close("layernorm_forward mean", d_mean, mean);
  expect_close("layernorm_forward rstd", d_rstd, rstd);

  const Vec dout = random_vec(BT * C, 13);
  Vec dinp = random_vec(BT * C, 14, kInit), dw = random_vec(C, 15, kInit),
      db = random_vec(C, 16, kInit);
  auto d_dinp = upload(dinp), d_dw = upload(dw), d_db = upload(db), d_dout = upload(dout);
  runtime::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                              mean.data(), rstd.data(), B, T, C);
  layernorm_backward(*ctx_, d_dinp.data(), d_dw.data(), d_db.data(), d_dout.data(), d_inp.data(),
                     d_w.data(), d_mean.data(), d_rstd.data(), B, T, C);
  expect_close("layernorm_backward dinp", d_dinp, dinp);
  expect_close("layernorm_backward dweight", d_dw, dw);
  expect_close("layernorm_backward dbias", d_db, db);
}

TEST_F(GpuKernelOps, GeluResidualBias) {
  const std::size_t N = BT * C;
  const Vec x = random_vec(N, 20, 3.0f), y = random_vec(N, 21), bias = random_vec(C, 22);
  auto d_x = upload(x), d_y = upload(y), d_bias = upload(bias);
  Vec out(N);
  DeviceArray<float> d_out(N);
  runtime::gelu_forward(out.data(), x.data(), N);
  gelu_forward(*ctx_, d_out.data(), d_x.data(), N);
  expect_close("gelu_forward", d_out, out);

  Vec dinp = random_vec(N, 23, kInit);
  auto d_dinp = upload(dinp);
  runtime::gelu_backward(dinp.data(), x.data(), y.data(), N);
  gelu_backward(*ctx_, d_dinp.data(), d_x.data(), d_y.data(), N);
  expect_close("gelu_backward", d_dinp, dinp);

  runtime::residual_forward(out.data(), x.data(), y.data(), N);
  residual_forward(*ctx_, d_out.data(), d_x.data(), d_y.data(), N);
  expect_close("residual_forward", d_out, out);

  Vec partial = random_vec(N, 24);
  auto d_partial = upload(partial);
  runtime::bias_residual_forward(out.data(), x.data(), partial.data(), bias.data(), B, T, C);
  bias_residual_forward(*ctx_, d_out.data(), d_x.data(), d_partial.data(), d_bias.data(), B, T, C);
  expect_close("bias_residual_forward", d_out, out);
  runtime::bias_residual_forward(out.data(), x.data(), partial.data(), nullptr, B, T, C);
  bias_residual_forward(*ctx_, d_out.data(), d_x.data(), d_partial.data(), nullptr, B, T, C);
  expect_close("bias_residual_forward nobias", d_out, out);

  Vec dbias = random_vec(C, 25, kInit);
  auto d_dbias = upload(dbias);
  runtime::bias_backward(dbias.data(), y.data(), B, T, C);
  bias_backward(*ctx_, d_dbias.data(), d_y.data(), B, T, C);
  expect_close("bias_backward", d_dbias, dbias);
}

TEST_F(GpuKernelOps, SoftmaxCrossEntropy) {
  Vec logits = random_vec(BT * V, 30, 4.0f);
  const auto targets = random_tokens(BT, V, 31);
  auto d_logits = upload(logits);
  auto d_targets = upload(targets);
  Vec losses(BT);
  DeviceArray<float> d_losses(BT);
  const float cpu_mean =
      runtime::softmax_crossentropy_forward(losses.data(), logits.data(), targets.data(), B, T, V);
  const float gpu_mean = softmax_crossentropy_forward(*ctx_, d_losses.data(), d_logits.data(),
                                                      d_targets.data(), B, T, V);
  expect_close("softmax_ce_forward probs", d_logits, logits);
  expect_close("softmax_ce_forward losses", d_losses, losses);
  EXPECT_NEAR(gpu_mean, cpu_mean, 1e-5 * std::fabs(cpu_mean));

  const float dloss = 0.5f / static_cast<float>(BT);
  runtime::softmax_crossentropy_backward(logits.data(), targets.data(), dloss, B, T, V);
  softmax_crossentropy_backward(*ctx_, d_logits.data(), d_targets.data(), dloss, B, T, V);
  expect_close("softmax_ce_backward dlogits", d_logits, logits);
}

TEST_F(GpuKernelOps, AdamW) {
  // A flat array of 1200 elements; update [100, 1100) with decay on three ranges that cut across it.
  const std::size_t total = 1200, offset = 100, n = 1000;
  const std::vector<ParamRange> decay{{50, 250}, {600, 200}, {1000, 200}};
  AdamWConfig cfg;
  cfg.lr = 1e-2f;
  Vec p = random_vec(total, 40), m(total, 0.0f), v(total, 0.0f);
  auto d_p = upload(p), d_m = upload(m), d_v = upload(v);
  for (int64_t step = 1; step <= 3; ++step) {
    const Vec g = random_vec(total, 41 + static_cast<uint32_t>(step));
    auto d_g = upload(g);
    runtime::adamw_update(p.data() + offset, g.data() + offset, m.data() + offset,
                          v.data() + offset, offset, n, decay, step, cfg);
    adamw_update(*ctx_, d_p.data() + offset, d_g.data() + offset, d_m.data() + offset,
                 d_v.data() + offset, offset, n, decay, step, cfg);
    stream_->synchronize();  // d_g goes out of scope
  }
  expect_close("adamw params", d_p, p);
  expect_close("adamw m", d_m, m);
  expect_close("adamw v", d_v, v);
}

TEST_P(GpuKernelGemm, Matmul) {
  const Vec inp = random_vec(BT * C, 50),
            w = random_vec(static_cast<std::size_t>(OC) * C, 51, 0.5f), bias = random_vec(OC, 52);
  auto d_inp = upload(inp), d_w = upload(w), d_bias = upload(bias);
  Vec out(BT * OC);
  DeviceArray<float> d_out(BT * OC);
  runtime::matmul_forward(out.data(), inp.data(), w.data(), bias.data(), B, T, C, OC);
  matmul_forward(*ctx_, d_out.data(), d_inp.data(), d_w.data(), d_bias.data(), B, T, C, OC);
  expect_close("matmul_forward bias", d_out, out);
  runtime::matmul_forward(out.data(), inp.data(), w.data(), nullptr, B, T, C, OC);
  matmul_forward(*ctx_, d_out.data(), d_inp.data(), d_w.data(), nullptr, B, T, C, OC);
  expect_close("matmul_forward nobias", d_out, out);

  const Vec dout = random_vec(BT * OC, 53);
  Vec dinp = random_vec(BT * C, 54, kInit), dw = random_vec(w.size(), 55, kInit),
      db = random_vec(OC, 56, kInit);
  auto d_dout = upload(dout), d_dinp = upload(dinp), d_dw = upload(dw), d_db = upload(db);
  runtime::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), B,
                           T, C, OC, true);
  matmul_backward(*ctx_, d_dinp.data(), d_dw.data(), d_db.data(), d_dout.data(), d_inp.data(),
                  d_w.data(), B, T, C, OC, true);
  expect_close("matmul_backward dinp (+=)", d_dinp, dinp);
  expect_close("matmul_backward dweight", d_dw, dw);
  expect_close("matmul_backward dbias", d_db, db, 1e-5);  // a column sum: no GEMM
  runtime::matmul_backward(dinp.data(), dw.data(), nullptr, dout.data(), inp.data(), w.data(), B, T,
                           C, OC, false);
  matmul_backward(*ctx_, d_dinp.data(), d_dw.data(), nullptr, d_dout.data(), d_inp.data(),
                  d_w.data(), B, T, C, OC, false);
  expect_close("matmul_backward dinp (=)", d_dinp, dinp);
  expect_close("matmul_backward dweight 2", d_dw, dw);
}

// Multi-head (NKV = NH), grouped-query and multi-query attention against the CPU.
void check_attention(GpuKernelBase& t, const Context& ctx, int NKV, uint32_t seed) {
  const int W = C + 2 * NKV * (C / NH);
  const Vec inp = random_vec(BT * W, seed);
  auto d_inp = upload(inp);
  const std::size_t natt = static_cast<std::size_t>(B) * NH * T * T;
  Vec out(BT * C), att(natt);
  DeviceArray<float> d_out(BT * C), d_att(natt);
  runtime::attention_forward(out.data(), att.data(), inp.data(), B, T, C, NH, NKV);
  attention_forward(ctx, d_out.data(), d_att.data(), d_inp.data(), B, T, C, NH, NKV);
  t.expect_close(NKV == NH  ? "attention_forward out"
                 : NKV == 1 ? "mqa attention_forward out"
                            : "gqa attention_forward out",
                 d_out, out);
  t.expect_close(NKV == NH ? "attention_forward att" : "gqa/mqa attention_forward att", d_att, att);

  const Vec dout = random_vec(BT * C, seed + 1);
  Vec dinp = random_vec(BT * W, seed + 2, kInit), datt(natt);
  auto d_dout = upload(dout), d_dinp = upload(dinp);
  DeviceArray<float> d_datt(natt);
  runtime::attention_backward(dinp.data(), datt.data(), dout.data(), inp.data(), att.data(), B, T,
                              C, NH, NKV);
  // From the CPU's probabilities, so the backward is checked on its own.
  auto d_att_cpu = upload(att);
  attention_backward(ctx, d_dinp.data(), d_datt.data(), d_dout.data(), d_inp.data(),
                     d_att_cpu.data(), B, T, C, NH, NKV);
  t.expect_close(NKV == NH ? "attention_backward dinp (+=)" : "gqa/mqa attention_backward (+=)",
                 d_dinp, dinp);
}

TEST_P(GpuKernelGemm, Attention) { check_attention(*this, *ctx_, NH, 60); }
TEST_P(GpuKernelGemm, GroupedQueryAttention) { check_attention(*this, *ctx_, 2, 63); }
TEST_P(GpuKernelGemm, MultiQueryAttention) { check_attention(*this, *ctx_, 1, 66); }

TEST_F(GpuKernelOps, RmsNormSwigluRope) {
  const Vec inp = random_vec(BT * C, 70, 1.5f), w = random_vec(C, 71, 0.5f, 1.0f);
  auto d_inp = upload(inp), d_w = upload(w);
  Vec out(BT * C), rstd(BT);
  DeviceArray<float> d_out(BT * C), d_rstd(BT);
  runtime::rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), B, T, C);
  rmsnorm_forward(*ctx_, d_out.data(), d_rstd.data(), d_inp.data(), d_w.data(), B, T, C);
  expect_close("rmsnorm_forward out", d_out, out);
  expect_close("rmsnorm_forward rstd", d_rstd, rstd);
  const Vec dout = random_vec(BT * C, 72);
  Vec dinp = random_vec(BT * C, 73, kInit), dw = random_vec(C, 74, kInit);
  auto d_dout = upload(dout), d_dinp = upload(dinp), d_dw = upload(dw);
  runtime::rmsnorm_backward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(),
                            B, T, C);
  rmsnorm_backward(*ctx_, d_dinp.data(), d_dw.data(), d_dout.data(), d_inp.data(), d_w.data(),
                   d_rstd.data(), B, T, C);
  expect_close("rmsnorm_backward dinp (+=)", d_dinp, dinp);
  expect_close("rmsnorm_backward dweight", d_dw, dw);

  constexpr int F = 45;  // odd: partial blocks
  const Vec gu = random_vec(BT * 2 * F, 75, 2.0f);
  auto d_gu = upload(gu);
  Vec sw(BT * F);
  DeviceArray<float> d_sw(BT * F);
  runtime::swiglu_forward(sw.data(), gu.data(), BT, F);
  swiglu_forward(*ctx_, d_sw.data(), d_gu.data(), BT, F);
  expect_close("swiglu_forward", d_sw, sw);
  const Vec dsw = random_vec(BT * F, 76);
  Vec dgu = random_vec(BT * 2 * F, 77, kInit);
  auto d_dsw = upload(dsw), d_dgu = upload(dgu);
  runtime::swiglu_backward(dgu.data(), gu.data(), dsw.data(), BT, F);
  swiglu_backward(*ctx_, d_dgu.data(), d_gu.data(), d_dsw.data(), BT, F);
  expect_close("swiglu_backward (+=)", d_dgu, dgu);

  constexpr int NKV = 2, hs = C / NH, W = C + 2 * NKV * hs;
  Vec qkv = random_vec(BT * W, 78);
  auto d_qkv = upload(qkv);
  runtime::rope_forward(qkv.data(), B, T, NH, NKV, hs, 10000.0f);
  rope_forward(*ctx_, d_qkv.data(), B, T, NH, NKV, hs, 10000.0f);
  expect_close("rope_forward", d_qkv, qkv);
  runtime::rope_backward(qkv.data(), B, T, NH, NKV, hs, 500.0f);
  rope_backward(*ctx_, d_qkv.data(), B, T, NH, NKV, hs, 500.0f);
  expect_close("rope_backward", d_qkv, qkv);

  // LayerNorm without its shift, the embedding without positions.
  Vec mean(BT), ln(BT * C);
  DeviceArray<float> d_mean(BT), d_ln(BT * C);
  runtime::layernorm_forward(ln.data(), mean.data(), rstd.data(), inp.data(), w.data(), nullptr, B,
                             T, C);
  layernorm_forward(*ctx_, d_ln.data(), d_mean.data(), d_rstd.data(), d_inp.data(), d_w.data(),
                    nullptr, B, T, C);
  expect_close("layernorm_forward nobias", d_ln, ln);
  const auto tokens = random_tokens(BT, V, 79);
  const Vec wte = random_vec(static_cast<std::size_t>(V) * C, 80);
  auto d_tok = upload(tokens);
  auto d_wte = upload(wte);
  Vec emb(BT * C);
  DeviceArray<float> d_emb(BT * C);
  runtime::encoder_forward(emb.data(), tokens.data(), wte.data(), nullptr, B, T, C);
  encoder_forward(*ctx_, d_emb.data(), d_tok.data(), d_wte.data(), nullptr, B, T, C);
  expect_close("encoder_forward nowpe", d_emb, emb, 1e-12);  // a copy: exact
}

std::string mode_name(const ::testing::TestParamInfo<MathMode>& info) {
  return math_mode_name(info.param);
}

INSTANTIATE_TEST_SUITE_P(GpuModes, GpuKernelGemm,
                         ::testing::Values(MathMode::kFp32, MathMode::kTf32, MathMode::kBf16),
                         mode_name);

}  // namespace
}  // namespace orrery::runtime::cuda
