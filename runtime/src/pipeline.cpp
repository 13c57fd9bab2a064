// Pipeline schedules (see pipeline.hpp).
#include "orrery/runtime/pipeline.hpp"

#include <algorithm>

#include "orrery/common/error.hpp"

namespace orrery::runtime {

std::vector<int> pipeline_order(const std::string& schedule, int stages, int stage, int m) {
  std::vector<int> order;
  order.reserve(2 * static_cast<size_t>(m));
  if (schedule == "gpipe") {
    for (int i = 0; i < m; ++i) order.push_back(i);
    for (int i = 0; i < m; ++i) order.push_back(-i - 1);
  } else if (schedule == "1f1b") {
    const int warmup = std::min(stages - stage - 1, m);
    int f = 0, b = 0;
    for (; f < warmup; ++f) order.push_back(f);
    while (f < m) {
      order.push_back(f++);
      order.push_back(-(b++) - 1);
    }
    while (b < m) order.push_back(-(b++) - 1);
  } else {
    throw InputError("key 'parallel.schedule': '" + schedule +
                     "' is not available in the CPU runtime; expected gpipe or 1f1b");
  }
  return order;
}

int pipeline_in_flight(const std::string& schedule, int stages, int stage, int m) {
  if (schedule == "gpipe") return m;
  return std::max(1, std::min(m, stages - stage));
}

double pipeline_bubble_fraction(int stages, int m) {
  return static_cast<double>(stages - 1) / static_cast<double>(m + stages - 1);
}

}  // namespace orrery::runtime
