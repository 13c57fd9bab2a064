// The gpipe, 1f1b and interleaved 1F1B per-stage orders shared by the runtime and the simulator.
#include "orrery/common/pipeline_schedule.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "orrery/common/error.hpp"
#include "orrery/common/scenario.hpp"

namespace orrery {

std::vector<int> pipeline_schedule_order(Schedule schedule, int stages, int stage, int m,
                                         const std::string& who) {
  std::vector<int> order;
  order.reserve(2 * static_cast<size_t>(m));
  const Schedule kind = schedule;
  if (kind == Schedule::GPipe) {
    for (int i = 0; i < m; ++i) order.push_back(i);
    for (int i = 0; i < m; ++i) order.push_back(-i - 1);
  } else if (kind == Schedule::OneFOneB) {
    const int warmup = std::min(stages - stage - 1, m);
    int f = 0, b = 0;
    for (; f < warmup; ++f) order.push_back(f);
    while (f < m) {
      order.push_back(f++);
      order.push_back(-(b++) - 1);
    }
    while (b < m) order.push_back(-(b++) - 1);
  } else {
    throw InputError("key 'parallel.schedule': '" + std::string(schedule_name(schedule)) +
                     "' is not available in " + who + "; expected gpipe or 1f1b");
  }
  return order;
}

std::vector<PipelinePass> pipeline_interleaved_order(int stages, int stage, int m, int chunks) {
  if (stages < 1 || chunks < 1 || m < 1 || stage < 0 || stage >= stages)
    throw InputError("interleaved pipeline schedule: stages (" + std::to_string(stages) +
                     "), stage (" + std::to_string(stage) + "), micro-batches (" +
                     std::to_string(m) + ") and chunks (" + std::to_string(chunks) +
                     ") must be >= 1 with stage < stages");
  if (m % stages != 0)
    throw InputError(
        "key 'parallel.schedule': interleaved 1F1B needs the micro-batches per step (" +
        std::to_string(m) + ") to be a multiple of pp (" + std::to_string(stages) + ")");
  const int p = stages, v = chunks;
  const int64_t total = int64_t(m) * v;
  auto pass = [&](int64_t k, bool forward) {
    const int c = static_cast<int>((k / p) % v);
    PipelinePass x;
    x.chunk = forward ? c : v - 1 - c;
    x.micro_batch = static_cast<int>((k / (int64_t(p) * v)) * p + k % p);
    x.forward = forward;
    return x;
  };
  const int64_t warmup = std::min<int64_t>(int64_t(p - stage - 1) * 2 + int64_t(v - 1) * p, total);
  std::vector<PipelinePass> order;
  order.reserve(2 * static_cast<size_t>(total));
  int64_t f = 0, b = 0;
  for (; f < warmup; ++f) order.push_back(pass(f, true));
  while (f < total) {
    order.push_back(pass(f++, true));
    order.push_back(pass(b++, false));
  }
  while (b < total) order.push_back(pass(b++, false));
  return order;
}

}  // namespace orrery
