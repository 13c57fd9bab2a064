// The gpipe and 1f1b per-stage orders shared by the runtime and the simulator.
#include "orrery/common/pipeline_schedule.hpp"

#include <algorithm>

#include "orrery/common/error.hpp"

namespace orrery {

std::vector<int> pipeline_schedule_order(const std::string& schedule, int stages, int stage, int m,
                                         const std::string& who) {
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
    throw InputError("key 'parallel.schedule': '" + schedule + "' is not available in " + who +
                     "; expected gpipe or 1f1b");
  }
  return order;
}

}  // namespace orrery
