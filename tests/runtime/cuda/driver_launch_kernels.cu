// See driver_launch_kernels.hpp.
#include <cuda.h>
#include <cudaTypedefs.h>

#include "driver_launch_kernels.hpp"

namespace orrery::runtime::cuda::test {
namespace {

__global__ void scale_by_driver(float* p, size_t n, float factor) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) p[i] *= factor;
}

}  // namespace

std::string launch_scale_by_driver(float* p, size_t n, float factor, cudaStream_t stream) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  cudaError_t e = cudaGetDriverEntryPointByVersion("cuLaunchKernel", &fn, CUDART_VERSION,
                                                   cudaEnableDefault, &found);
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
    cudaGetLastError();
    return std::string("no cuLaunchKernel driver entry point: ") + cudaGetErrorString(e);
  }
  cudaFunction_t f = nullptr;
  e = cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(&scale_by_driver));
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("cudaGetFuncBySymbol: ") + cudaGetErrorString(e);
  }
  auto launch = reinterpret_cast<PFN_cuLaunchKernel_v4000>(fn);
  void* args[] = {&p, &n, &factor};
  const auto blocks = static_cast<unsigned>((n + 255) / 256);
  const CUresult r = launch(reinterpret_cast<CUfunction>(f), blocks, 1, 1, 256, 1, 1, 0,
                            reinterpret_cast<CUstream>(stream), args, nullptr);
  if (r != CUDA_SUCCESS)
    return "cuLaunchKernel failed (CUresult " + std::to_string(static_cast<int>(r)) + ")";
  return "";
}

}  // namespace orrery::runtime::cuda::test
