// The critical path of a training step: the chain of spans and waits, across ranks, that sets the
// step's end. Walked backwards from the step's last-ending work span with the dependency rules
// `orrery replay` uses (sim/replay.cpp), taken from the traces library, not the simulator:
//   - a span starts after its dependencies (traces::span_dependencies): its predecessor on its
//     (rank, stream) and the span of another stream of its rank it waited for; the one that ended
//     last is the one that held it up;
//   - a collective instance (communicator, sequence) completes when its last member arrives: a
//     member that started earlier waited, and the path goes to the late arriver;
//   - a P2P receive completes after its matching send (traces::match_p2p) has started: a receive
//     posted before its send waited for it.
// The walk stops at a span with no dependency in the step. Phase spans are not on it. Only the
// step's spans are looked at (sends are matched to receives within the step), so the cost is the
// step's, not the trace's.
#pragma once

#include <cstdint>
#include <vector>

#include "orrery/traces/trace.hpp"

namespace orrery::gui {

struct CriticalLink {
  enum class Via {
    First,        // the path's first span
    Stream,       // after its predecessor on its (rank, stream)
    CrossStream,  // after a span of another stream of its rank
    LastArrival,  // a collective member that waited for the last one to arrive (the one before)
    Send,         // a receive that waited for its send (the one before)
  };
  uint32_t span = 0;  // index into the trace's spans
  Via via = Via::First;
  // The part of the span on the path: from when it could go on (its start, or the late arrival
  // or the send it waited for) to its end. The rest, if any, was a wait.
  int64_t from_ns = 0;
  int64_t to_ns = 0;
};

struct CriticalPath {
  int32_t step = -1;
  std::vector<CriticalLink> links;  // in time order, the step's last-ending span last
  int64_t start_ns = 0;             // the first link's start
  int64_t end_ns = 0;               // the step's end
  int64_t length_ns() const { return end_ns - start_ns; }
  int64_t wait_ns =
      0;  // waits of the spans on it (collective members, receives) before they could go on
  bool empty() const { return links.empty(); }
};

// The critical path of `step`, or an empty one when the step has no work spans.
CriticalPath critical_path(const traces::Trace& t, int32_t step);

}  // namespace orrery::gui
