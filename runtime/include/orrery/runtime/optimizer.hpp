// AdamW (Loshchilov & Hutter; PyTorch's torch.optim.AdamW) over a contiguous range of a flat
// parameter array, with weight decay only on given ranges (the matrices), so ZeRO can update the
// shard a rank owns with the same function the serial run uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "orrery/runtime/tensor.hpp"

namespace orrery::runtime {

struct AdamWConfig {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

// One AdamW step (step counts from 1) on the elements [offset, offset + n) of the flat array.
// params, grads, m, v point at element `offset` (each may be a shard-local buffer); `decay` holds
// ranges in absolute flat-array coordinates (Gpt::decay_ranges()), sorted, non-overlapping:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * wd * p          (decayed elements only, decoupled, before the Adam term)
//   p -= lr * (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps)
void adamw_update(float* params, const float* grads, float* m, float* v, std::size_t offset,
                  std::size_t n, std::span<const ParamRange> decay, int64_t step,
                  const AdamWConfig& cfg);

// What every AdamW implementation (this CPU one, the CUDA kernel) computes once per call: the bias
// corrections as scalars, in double and then rounded as here, so the two give the same bits.
struct AdamWScalars {
  float step_size = 0;     // lr / (1 - b1^step)
  float inv_sqrt_bc2 = 0;  // 1 / sqrt(1 - b2^step)
  float keep_decayed = 0;  // 1 - lr * wd
};
AdamWScalars adamw_scalars(int64_t step, const AdamWConfig& cfg);

// Calls run(from, to, factor) for consecutive stretches of [offset, offset + n) in order: factor
// `keep_decayed` inside the decay ranges, 1 outside (the decoupled weight decay's multiplier).
template <class Run>
void for_each_decay_stretch(std::size_t offset, std::size_t n, std::span<const ParamRange> decay,
                            float keep_decayed, Run&& run) {
  const std::size_t end = offset + n;
  std::size_t pos = offset;
  auto go = [&](std::size_t from, std::size_t to, float factor) {
    if (to > from) run(from, to, factor);
  };
  for (const ParamRange& r : decay) {
    if (r.end() <= pos) continue;
    if (r.offset >= end) break;
    const std::size_t lo = r.offset > pos ? r.offset : pos;
    const std::size_t hi = r.end() < end ? r.end() : end;
    go(pos, lo, 1.0f);
    go(lo, hi, keep_decayed);
    pos = hi;
  }
  go(pos, end, 1.0f);
}

// Convenience owner of the moments for a range of the flat array.
class AdamW {
 public:
  AdamW(std::size_t offset, std::size_t n, std::vector<ParamRange> decay, AdamWConfig cfg = {});
  // params and grads point at element `offset` of their arrays. Increments the step count first.
  void step(float* params, const float* grads);
  int64_t steps() const { return step_; }
  // Resuming from a checkpoint: the step count the bias corrections continue from.
  void set_steps(int64_t steps) { step_ = steps; }
  std::size_t offset() const { return offset_; }
  std::size_t size() const { return n_; }
  AdamWConfig& config() { return cfg_; }
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }

 private:
  std::size_t offset_;
  std::size_t n_;
  std::vector<ParamRange> decay_;
  AdamWConfig cfg_;
  FloatArray m_, v_;
  int64_t step_ = 0;
};

}  // namespace orrery::runtime
