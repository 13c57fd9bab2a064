// Setup shared by the GPU model tests of one device (test_cuda_tp_model.cpp, test_cuda_pp_model.cpp):
//   small_gpt_config(n_layer)  a GPT of n_layer blocks, 64 wide, 4 heads, vocab 128, 32 positions;
//   kB, kT                     the micro-batch they run: 2 sequences of 32 tokens;
//   tokens(mul, add, V)        kB · kT token ids, id i = (i · mul + add) mod V.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "orrery/runtime/cuda/model.hpp"

namespace orrery::runtime::cuda::model_test_fixtures {

inline GptConfig small_gpt_config(int n_layer) {
  GptConfig c;
  c.n_layer = n_layer;
  c.n_embd = 64;
  c.n_head = 4;
  c.vocab = 128;
  c.max_seq = 32;
  return c;
}

constexpr int kB = 2, kT = 32;

inline std::vector<int32_t> tokens(int mul, int add, int V) {
  std::vector<int32_t> v(static_cast<std::size_t>(kB * kT));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<int32_t>((i * mul + add) % static_cast<std::size_t>(V));
  return v;
}

}  // namespace orrery::runtime::cuda::model_test_fixtures
