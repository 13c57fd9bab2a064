// Dynamic loss scaling for runtime.precision fp16 (Micikevicius et al. 2018; PyTorch's GradScaler
// with growth 2, backoff 0.5): the loss gradient is multiplied by scale() so that small gradients
// survive fp16's range; the optimizer sees the gradients divided by it again. A step whose
// gradients hold an inf or NaN on any rank is skipped (no optimizer update) and the scale halves;
// after `window` clean steps in a row it doubles. Scales stay powers of two when the initial one
// is, so scaling and unscaling are exact (away from fp32's subnormals).
#pragma once

#include <cstdint>

namespace orrery::runtime {

// What a checkpoint keeps of a LossScaler (checkpoint.hpp: the manifest's loss_scaler).
struct LossScalerState {
  double scale = 1.0;
  int clean_steps = 0;
  int64_t skipped_steps = 0;
};

class LossScaler {
 public:
  LossScaler(double initial_scale, int window) : scale_(initial_scale), window_(window) {}

  double scale() const { return scale_; }
  int64_t skipped_steps() const { return skipped_; }
  int clean_steps() const { return clean_; }
  LossScalerState state() const { return {scale_, clean_, skipped_}; }
  // Continues from a checkpoint's state: the next update() is the one the saved run made next.
  void restore(const LossScalerState& st) {
    scale_ = st.scale;
    clean_ = st.clean_steps;
    skipped_ = st.skipped_steps;
  }

  // After a step's overflow check (the same on every rank): true when the optimizer applies it.
  bool update(bool overflow) {
    if (overflow) {
      scale_ *= 0.5;
      clean_ = 0;
      ++skipped_;
      return false;
    }
    if (++clean_ >= window_) {
      scale_ *= 2.0;
      clean_ = 0;
    }
    return true;
  }

 private:
  double scale_;
  int window_;
  int clean_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace orrery::runtime
