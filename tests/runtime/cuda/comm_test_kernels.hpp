// Helper kernels of the GPU tests (comm_test_kernels.cu): a write that is deliberately late, so that a
// missing stream ordering shows up as a wrong value rather than going unnoticed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace orrery::runtime::cuda::test {

// On `stream`: spins about `spin_cycles` GPU clock cycles, then sets p[i] = value + i for i < n.
void launch_late_fill(float* p, size_t n, float value, long long spin_cycles, cudaStream_t stream);
// On `stream`: p[i] *= factor (the tiny kernel of the CUPTI test).
void launch_scale(float* p, size_t n, float factor, cudaStream_t stream);

}  // namespace orrery::runtime::cuda::test
