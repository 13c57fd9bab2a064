// The deterministic embedding backward (runtime/cuda/kernels.hpp: encoder_backward) against the CPU
// reference (runtime/kernels.hpp): the GPU adds the same dout rows to the same gradient rows in the
// same order as the CPU, so dwte and dwpe must come out bit-identical to the CPU's (and the
// normalised error, printed, is 0), and two calls from the same state give the same bits.
// Token mixes: uniform over a large vocabulary, a few distinct tokens, every position the same
// token (one run of B*T positions), sorted and reversed ids; C not a multiple of the kernel's
// 128-channel blocks. Suites are named Gpu*: they skip with the reason without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <random>
#include <vector>

#include "orrery/runtime/cuda/device.hpp"
#include "orrery/runtime/cuda/kernels.hpp"
#include "orrery/runtime/kernels.hpp"

#include "device_test_util.hpp"

namespace orrery::runtime::cuda {
namespace {

using Vec = std::vector<float>;

Vec random_vec(std::size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Vec v(n);
  for (auto& x : v) x = u(rng) * scale;
  return v;
}

using device_test_util::normalised_error;
using device_test_util::upload;

std::size_t bit_mismatches(const Vec& a, const Vec& b) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

enum class Tokens { Uniform, FewDistinct, AllSame, Sorted, Reversed };

struct Case {
  const char* name;
  int B, T, C, V;
  Tokens tokens;
};

// gtest prints parameters into the test names ctest discovers: the name alone, not the bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<int32_t> make_tokens(const Case& c) {
  const std::size_t n = static_cast<std::size_t>(c.B) * c.T;
  std::vector<int32_t> v(n);
  std::mt19937 rng(11);
  for (std::size_t i = 0; i < n; ++i) {
    switch (c.tokens) {
      case Tokens::Uniform:
        v[i] = std::uniform_int_distribution<int32_t>(0, c.V - 1)(rng);
        break;
      case Tokens::FewDistinct:
        v[i] = std::uniform_int_distribution<int32_t>(0, 4)(rng) * 13 % c.V;
        break;
      case Tokens::AllSame:
        v[i] = c.V - 1;
        break;
      case Tokens::Sorted:
        v[i] = static_cast<int32_t>(i * c.V / n);
        break;
      case Tokens::Reversed:
        v[i] = static_cast<int32_t>((n - 1 - i) * c.V / n);
        break;
    }
  }
  return v;
}

class GpuEmbeddingBackward : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (device_count() == 0) GTEST_SKIP() << no_device_reason();
    select_device(0);
    stream_ = std::make_unique<Stream>();
    ctx_ = std::make_unique<Context>(stream_->get(), MathMode::kFp32);
  }
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Context> ctx_;
};

TEST_P(GpuEmbeddingBackward, BitIdenticalToTheCpuAndAcrossCalls) {
  const Case& c = GetParam();
  const auto inp = make_tokens(c);
  const std::size_t bt = inp.size();
  const Vec dout = random_vec(bt * c.C, 4, 1.0f);
  // Gradients start non-zero, so accumulation (+=) is checked; rows of absent tokens must keep
  // them.
  const Vec dwte0 = random_vec(static_cast<std::size_t>(c.V) * c.C, 5, 0.01f);
  const Vec dwpe0 = random_vec(static_cast<std::size_t>(c.T) * c.C, 6, 0.01f);
  Vec dwte = dwte0, dwpe = dwpe0;
  runtime::encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), c.B, c.T, c.C);

  auto d_inp = upload(inp);
  auto d_dout = upload(dout);
  Vec first_wte, first_wpe;
  for (int call = 0; call < 2; ++call) {
    auto d_dwte = upload(dwte0), d_dwpe = upload(dwpe0);
    encoder_backward(*ctx_, d_dwte.data(), d_dwpe.data(), d_dout.data(), d_inp.data(), c.B, c.T,
                     c.C);
    stream_->synchronize();
    const Vec g_wte = d_dwte.to_host(), g_wpe = d_dwpe.to_host();
    const double e_wte = normalised_error(g_wte, dwte), e_wpe = normalised_error(g_wpe, dwpe);
    std::printf(
        "  %-12s call %d: dwte normalised error %.3g (%zu values differ in bits), dwpe %.3g "
        "(%zu)\n",
        c.name, call, e_wte, bit_mismatches(g_wte, dwte), e_wpe, bit_mismatches(g_wpe, dwpe));
    EXPECT_LT(e_wte, 1e-6) << c.name;
    EXPECT_LT(e_wpe, 1e-6) << c.name;
    EXPECT_EQ(bit_mismatches(g_wte, dwte), 0u) << c.name << ": dwte not the CPU's bits";
    EXPECT_EQ(bit_mismatches(g_wpe, dwpe), 0u) << c.name << ": dwpe not the CPU's bits";
    if (call == 0) {
      first_wte = g_wte;
      first_wpe = g_wpe;
    } else {
      EXPECT_EQ(bit_mismatches(g_wte, first_wte), 0u)
          << c.name << ": dwte differs between two calls";
      EXPECT_EQ(bit_mismatches(g_wpe, first_wpe), 0u)
          << c.name << ": dwpe differs between two calls";
    }
  }
}

// Either gradient alone (the other null) gives the same values as both together.
TEST_P(GpuEmbeddingBackward, EachGradientAlone) {
  const Case& c = GetParam();
  const auto inp = make_tokens(c);
  const Vec dout = random_vec(inp.size() * c.C, 7, 1.0f);
  Vec dwte(static_cast<std::size_t>(c.V) * c.C, 0.0f),
      dwpe(static_cast<std::size_t>(c.T) * c.C, 0.0f);
  runtime::encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), c.B, c.T, c.C);
  auto d_inp = upload(inp);
  auto d_dout = upload(dout);
  DeviceArray<float> d_dwte(dwte.size()), d_dwpe(dwpe.size());  // zeroed
  encoder_backward(*ctx_, d_dwte.data(), nullptr, d_dout.data(), d_inp.data(), c.B, c.T, c.C);
  encoder_backward(*ctx_, nullptr, d_dwpe.data(), d_dout.data(), d_inp.data(), c.B, c.T, c.C);
  stream_->synchronize();
  EXPECT_EQ(bit_mismatches(d_dwte.to_host(), dwte), 0u) << c.name;
  EXPECT_EQ(bit_mismatches(d_dwpe.to_host(), dwpe), 0u) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    GpuTokenMixes, GpuEmbeddingBackward,
    ::testing::Values(Case{"uniform", 4, 64, 200, 50257, Tokens::Uniform},  // GPT-2 vocabulary
                      Case{"few", 3, 37, 64, 101, Tokens::FewDistinct},     // 5 tokens, long runs
                      Case{"all_same", 8, 256, 130, 97, Tokens::AllSame},   // one run of 2048
                      Case{"sorted", 2, 37, 33, 60, Tokens::Sorted},       // runs in position order
                      Case{"reversed", 2, 37, 257, 60, Tokens::Reversed},  // ... and against it
                      Case{"tiny", 1, 1, 1, 3, Tokens::Uniform}),  // one position, one channel
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace orrery::runtime::cuda
