// Flows between spans of different ranks, as the timeline draws them: a point-to-point send to its
// receive, and the members of one collective instance (one communicator and sequence number) on
// every rank. The pairing is the traces library's (match_p2p, collective_instances), so the GUI
// links the same spans the metrics and the replay do.
//
// Built once per trace (linear in the spans); a span's flow is then one look-up, so the timeline
// can draw the flow of the selected span at any zoom.
#pragma once

#include <cstdint>
#include <vector>

#include "orrery/traces/trace.hpp"

namespace orrery::gui {

enum class FlowKind { None, P2P, Collective };

// One member of a flow, with its start relative to the others.
struct FlowMember {
  uint32_t span = 0;
  int32_t rank = 0;
  int64_t start_ns = 0;
  int64_t skew_ns = 0;  // start minus the earliest member's start
  int64_t wait_ns = 0;  // the latest member's start minus this start: how long it waited for it
};

struct FlowInfo {
  FlowKind kind = FlowKind::None;
  int32_t comm = -1;
  int64_t seq = -1;
  // By start (ties: span order). For P2P: the send first when both start together.
  std::vector<FlowMember> members;
  int64_t spread_ns = 0;        // latest start minus earliest start
  int32_t last_rank = -1;       // the rank that started last (arrived last), -1 when none
  uint32_t send = 0, recv = 0;  // P2P only
};

class FlowIndex {
 public:
  FlowIndex() = default;
  explicit FlowIndex(const traces::Trace& t);

  // The flow a span belongs to, kind None when it has none (or the index was built for another
  // trace's spans).
  FlowInfo flow_of(const traces::Trace& t, uint32_t span) const;
  // The spans of a span's flow (itself included), empty when none.
  std::vector<uint32_t> members_of(uint32_t span) const;
  size_t p2p_count() const { return p2p_count_; }
  size_t collective_count() const { return collective_count_; }

 private:
  // Per span: the group it is in, -1 for none. Groups: offsets into members_ (CSR).
  std::vector<int32_t> group_of_;
  std::vector<uint32_t> offsets_{0};
  std::vector<uint32_t> members_;
  std::vector<uint8_t> group_is_p2p_;
  size_t p2p_count_ = 0, collective_count_ = 0;
};

}  // namespace orrery::gui
