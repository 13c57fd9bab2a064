// The tanh approximation of GELU (Hendrycks & Gimpel 2016, as GPT-2 uses it), written once for the
// CPU kernels (runtime/src/kernels.cpp) and the CUDA kernels (runtime/cuda/src/kernels.cu): its
// tanh argument, its value and its derivative given tanh of that argument (each side computes tanh
// its own way: the CPU a vectorisable approximation, CUDA tanhf).
//   gelu(x)  = 0.5·x·(1 + tanh(u)),  u = sqrt(2/π)·(x + 0.044715·x³)
//   gelu'(x) = 0.5·(1 + tanh(u)) + 0.5·x·(1 - tanh²(u))·sqrt(2/π)·(1 + 3·0.044715·x²)
#pragma once

#if defined(__CUDACC__)
#define ORRERY_HOST_DEVICE __host__ __device__
#else
#define ORRERY_HOST_DEVICE
#endif

namespace orrery::runtime::gelu {

inline constexpr float kScale = 0.7978845608028654f;  // sqrt(2/pi)
inline constexpr float kCubic = 0.044715f;

ORRERY_HOST_DEVICE inline float tanh_arg(float x) { return kScale * (x + kCubic * x * x * x); }
ORRERY_HOST_DEVICE inline float value(float x, float th) { return 0.5f * x * (1.0f + th); }
ORRERY_HOST_DEVICE inline float derivative(float x, float th) {
  const float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * kScale * (1.0f + 3.0f * kCubic * x * x);
}

}  // namespace orrery::runtime::gelu
