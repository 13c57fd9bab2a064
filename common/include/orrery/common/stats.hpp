// Small statistics shared by the CLI, the runtime and the simulator.
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

namespace orrery {

// The middle value of `v`; for an even count the mean of the two middle values (for integer T that
// mean is rounded toward zero, as integer division rounds); 0 when `v` is empty.
template <typename T>
T median(std::vector<T> v) {
  static_assert(std::is_arithmetic_v<T>);
  if (v.empty()) return T{0};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  if (n % 2) return v[n / 2];
  if constexpr (std::is_floating_point_v<T>) {
    return T(0.5) * (v[n / 2 - 1] + v[n / 2]);
  } else {
    return (v[n / 2 - 1] + v[n / 2]) / 2;
  }
}

}  // namespace orrery
