// Flows between spans (see flows.hpp).
#include "orrery/gui/flows.hpp"

#include <algorithm>
#include <limits>

#include "orrery/traces/collective_instances.hpp"

namespace orrery::gui {

FlowIndex::FlowIndex(const traces::Trace& t) {
  const auto& spans = t.spans;
  group_of_.assign(spans.size(), -1);
  auto add_group = [&](const std::vector<uint32_t>& m, bool p2p) {
    const auto g = static_cast<int32_t>(group_is_p2p_.size());
    for (uint32_t s : m) {
      if (group_of_[s] >= 0) continue;  // a span is in one flow (the first found)
      group_of_[s] = g;
      members_.push_back(s);
    }
    offsets_.push_back(static_cast<uint32_t>(members_.size()));
    group_is_p2p_.push_back(p2p ? 1 : 0);
  };
  // The replay's pairing: the k-th send from a to b on a communicator with the k-th receive, in
  // each rank's recorded order; spans without a communicator are paired as communicator -1.
  traces::P2pOptions po;
  po.require_comm = false;
  po.order = traces::P2pOrder::Stream;
  for (const auto& m : traces::match_p2p(spans, po)) {
    add_group({m.send, m.recv}, true);
    ++p2p_count_;
  }
  traces::CollectiveOptions co;
  co.require_comm = false;
  for (const auto& inst : traces::collective_instances(spans, co)) {
    if (inst.members.size() < 2) continue;  // nothing to link
    add_group(inst.members, false);
    ++collective_count_;
  }
}

std::vector<uint32_t> FlowIndex::members_of(uint32_t span) const {
  if (span >= group_of_.size() || group_of_[span] < 0) return {};
  const auto g = static_cast<size_t>(group_of_[span]);
  return {members_.begin() + offsets_[g], members_.begin() + offsets_[g + 1]};
}

FlowInfo FlowIndex::flow_of(const traces::Trace& t, uint32_t span) const {
  FlowInfo f;
  if (group_of_.size() != t.spans.size()) return f;
  const auto ids = members_of(span);
  if (ids.size() < 2) return f;
  const auto g = static_cast<size_t>(group_of_[span]);
  f.kind = group_is_p2p_[g] ? FlowKind::P2P : FlowKind::Collective;
  const auto& first = t.spans[ids.front()];
  f.comm = first.comm;
  f.seq = first.seq;
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (uint32_t id : ids) {
    const auto& s = t.spans[id];
    f.members.push_back({id, s.rank, s.start_ns, 0, 0});
    lo = std::min(lo, s.start_ns);
    hi = std::max(hi, s.start_ns);
    if (f.kind == FlowKind::P2P) {
      if (s.op == traces::CollOp::Send) f.send = id;
      if (s.op == traces::CollOp::Recv) f.recv = id;
    }
  }
  std::stable_sort(f.members.begin(), f.members.end(),
                   [&](const FlowMember& a, const FlowMember& b) {
                     if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
                     if (f.kind == FlowKind::P2P) return a.span == f.send && b.span != f.send;
                     return a.span < b.span;
                   });
  for (auto& m : f.members) {
    m.skew_ns = m.start_ns - lo;
    m.wait_ns = hi - m.start_ns;
  }
  f.spread_ns = hi - lo;
  // The last to arrive: the latest start; on a tie, the first of them in member order.
  for (const auto& m : f.members) {
    if (m.start_ns == hi) {
      f.last_rank = m.rank;
      break;
    }
  }
  return f;
}

}  // namespace orrery::gui
