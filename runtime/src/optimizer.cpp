// AdamW over a range of the flat parameter array (see optimizer.hpp). The inner loop runs over
// stretches of equal decay so it vectorises; the bias corrections are folded into two scalars.
#include "orrery/runtime/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "orrery/runtime/kernels.hpp"

namespace orrery::runtime {
namespace {

void adamw_stretch(float* p, const float* g, float* m, float* v, std::size_t n, float decay_factor,
                   float b1, float b2, float step_size, float inv_sqrt_bc2, float eps) {
  // p <- p * (1 - lr*wd) - lr * mhat / (sqrt(vhat) + eps), mhat = m/bc1, vhat = v/bc2.
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay_factor - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

void adamw_update_serial(float* params, const float* grads, float* m, float* v, std::size_t offset,
                         std::size_t n, std::span<const ParamRange> decay, int64_t step,
                         const AdamWConfig& cfg) {
  const AdamWScalars k = adamw_scalars(step, cfg);
  for_each_decay_stretch(
      offset, n, decay, k.keep_decayed, [&](std::size_t from, std::size_t to, float factor) {
        const std::size_t i = from - offset;
        adamw_stretch(params + i, grads + i, m + i, v + i, to - from, factor, cfg.beta1, cfg.beta2,
                      k.step_size, k.inv_sqrt_bc2, cfg.eps);
      });
}

}  // namespace

AdamWScalars adamw_scalars(int64_t step, const AdamWConfig& cfg) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(cfg.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(cfg.beta2), static_cast<double>(step));
  AdamWScalars k;
  k.step_size = static_cast<float>(cfg.lr / bc1);
  k.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  k.keep_decayed = 1.0f - cfg.lr * cfg.weight_decay;
  return k;
}

void adamw_update(float* params, const float* grads, float* m, float* v, std::size_t offset,
                  std::size_t n, std::span<const ParamRange> decay, int64_t step,
                  const AdamWConfig& cfg) {
  if (step < 1) throw std::invalid_argument("adamw_update: step counts from 1");
  // Elementwise, so any split over threads gives the same bits.
  parallel_for(static_cast<std::ptrdiff_t>(n), n * 4, [&](std::ptrdiff_t b, std::ptrdiff_t e) {
    const auto k = static_cast<std::size_t>(b);
    adamw_update_serial(params + k, grads + k, m + k, v + k, offset + k,
                        static_cast<std::size_t>(e - b), decay, step, cfg);
  });
}

AdamW::AdamW(std::size_t offset, std::size_t n, std::vector<ParamRange> decay, AdamWConfig cfg)
    : offset_(offset), n_(n), decay_(std::move(decay)), cfg_(cfg), m_(n), v_(n) {}

void AdamW::step(float* params, const float* grads) {
  ++step_;
  adamw_update(params, grads, m_.data(), v_.data(), offset_, n_, decay_, step_, cfg_);
}

}  // namespace orrery::runtime
