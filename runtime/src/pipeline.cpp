// Pipeline schedules (see pipeline.hpp).
#include "orrery/runtime/pipeline.hpp"

#include <algorithm>

#include "orrery/common/error.hpp"
#include "orrery/common/pipeline_schedule.hpp"
#include "orrery/common/scenario.hpp"

namespace orrery::runtime {

std::vector<int> pipeline_order(Schedule schedule, int stages, int stage, int m) {
  return pipeline_schedule_order(schedule, stages, stage, m, "the CPU runtime");
}

int pipeline_in_flight(Schedule schedule, int stages, int stage, int m) {
  if (schedule == Schedule::GPipe) return m;
  return std::max(1, std::min(m, stages - stage));
}

double pipeline_bubble_fraction(int stages, int m) {
  return static_cast<double>(stages - 1) / static_cast<double>(m + stages - 1);
}

}  // namespace orrery::runtime
