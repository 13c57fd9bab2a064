// Helper kernels of the GPU tests (see comm_test_kernels.hpp).
#include "comm_test_kernels.hpp"

namespace orrery::runtime::cuda::test {
namespace {

__global__ void late_fill(float* p, size_t n, float value, long long spin_cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < spin_cycles) {
  }
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    p[i] = value + static_cast<float>(i);
  }
}

__global__ void scale(float* p, size_t n, float factor) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) p[i] *= factor;
}

}  // namespace

void launch_late_fill(float* p, size_t n, float value, long long spin_cycles, cudaStream_t stream) {
  late_fill<<<1, 256, 0, stream>>>(p, n, value, spin_cycles);
}

void launch_scale(float* p, size_t n, float factor, cudaStream_t stream) {
  scale<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(p, n, factor);
}

}  // namespace orrery::runtime::cuda::test
