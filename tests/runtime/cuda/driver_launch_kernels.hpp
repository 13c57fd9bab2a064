// A kernel launched through the CUDA driver API (driver_launch_kernels.cu), the way NCCL launches
// its kernels: cuLaunchKernel from the runtime's driver entry point
// (cudaGetDriverEntryPointByVersion), on a function from cudaGetFuncBySymbol. For the CUPTI
// collective-annotation test.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace orrery::runtime::cuda::test {

// On `stream`: p[i] *= factor, launched with the driver's cuLaunchKernel. Returns "" when launched,
// else why not.
std::string launch_scale_by_driver(float* p, size_t n, float factor, cudaStream_t stream);

}  // namespace orrery::runtime::cuda::test
