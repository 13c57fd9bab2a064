// runtime.precision bf16 / fp16 on device cpu in the simulator (cost_model.hpp's
// ModelDims::emulated_16bit): the rounding passes the runtime's emulated 16-bit products make,
// in closed form for a GPT block's forward (four GEMMs: qkv C->3C, proj C->C, fc C->4C, fcproj
// 4C->C over m = B*T tokens: operands and outputs m(7C) + (12C^2) + m(9C) elements, 8 bytes each),
// and only on the CPU (a GPU's bf16 runs on tensor cores, priced by its peak).
#include <gtest/gtest.h>

#include "orrery/model/names.hpp"
#include "orrery/sim/cost_model.hpp"
#include "test_workload_util.hpp"

namespace orrery::sim {
namespace {

TEST(Cpu16Bit, RoundingPassesOfABlockForwardAreTheClosedForm) {
  Scenario s = testing::small_scenario(4, 1, 1, 1, 1);
  s.runtime.device = "cpu";
  s.runtime.precision = "bf16";
  const ModelDims d = model_dims(s, 4);
  ASSERT_TRUE(d.emulated_16bit);
  ModelDims plain = d;
  plain.emulated_16bit = false;
  const auto a = op_kernels(model::names::kBlockForward, 0, 1, d);
  const auto b = op_kernels(model::names::kBlockForward, 0, 1, plain);
  ASSERT_TRUE(a && b);
  const double m = double(s.training.micro_batch) * s.model.seq, C = s.model.d_model;
  EXPECT_DOUBLE_EQ(total_bytes(*a) - total_bytes(*b), 8.0 * (16.0 * m * C + 12.0 * C * C));
  EXPECT_DOUBLE_EQ(total_flops(*a), total_flops(*b));  // the sgemm stays fp32
  s.runtime.precision = "fp16";
  EXPECT_TRUE(model_dims(s, 4).emulated_16bit);
  s.runtime.precision = "fp32";
  EXPECT_FALSE(model_dims(s, 4).emulated_16bit);
  s.runtime.device = "cuda";
  s.runtime.precision = "bf16";
  EXPECT_FALSE(model_dims(s, 2).emulated_16bit);
}

}  // namespace
}  // namespace orrery::sim
