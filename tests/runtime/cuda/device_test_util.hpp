// Helpers shared by the GPU kernel tests (test_cuda_kernels.cpp, test_cuda_embedding.cpp):
//   upload(v)                 a device copy of a host vector;
//   normalised_error(gpu, cpu) max |gpu − cpu| over max |cpu| (the bound the tests compare with).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "orrery/runtime/cuda/device.hpp"

namespace orrery::runtime::cuda::device_test_util {

template <class T>
DeviceArray<T> upload(const std::vector<T>& v) {
  DeviceArray<T> d(v.size());
  d.copy_from_host(v);
  return d;
}

inline double normalised_error(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(gpu[i] - cpu[i])));
    ref = std::max(ref, static_cast<double>(std::fabs(cpu[i])));
  }
  return diff / std::max(ref, 1e-30);
}

}  // namespace orrery::runtime::cuda::device_test_util
