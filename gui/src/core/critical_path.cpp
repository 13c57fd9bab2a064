// The critical path of a step (see critical_path.hpp).
#include "orrery/gui/critical_path.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "orrery/traces/chakra.hpp"
#include "orrery/traces/collective_instances.hpp"

namespace orrery::gui {
namespace {

using Via = CriticalLink::Via;

// Who each communication span of the step waited for: a collective member's last arriver (the
// member that started last), a receive's send. Absent when it did not wait.
std::unordered_map<uint32_t, std::pair<uint32_t, Via>> comm_waits(const traces::Trace& t,
                                                                  int32_t step) {
  std::unordered_map<uint32_t, std::pair<uint32_t, Via>> out;
  const auto& S = t.spans;
  traces::CollectiveOptions copt;
  copt.keep = [step](const traces::Span& s) { return s.step == step; };
  copt.require_comm = false;
  for (const auto& ci : traces::collective_instances(S, copt)) {
    uint32_t last = ci.members.front();
    for (uint32_t m : ci.members) {
      if (S[m].start_ns > S[last].start_ns) last = m;
    }
    for (uint32_t m : ci.members) {
      if (S[m].start_ns < S[last].start_ns) out[m] = {last, Via::LastArrival};
    }
  }
  traces::P2pOptions popt;
  popt.require_comm = false;  // as the replay matches them
  popt.order = traces::P2pOrder::Stream;
  for (const auto& m : traces::match_p2p(S, popt)) {
    if (S[m.recv].step == step && S[m.send].start_ns > S[m.recv].start_ns)
      out[m.recv] = {m.send, Via::Send};
  }
  return out;
}

}  // namespace

CriticalPath critical_path(const traces::Trace& t, int32_t step) {
  CriticalPath path;
  path.step = step;
  // The step's work spans only (the walk stops at the step's edge anyway): on a long trace the
  // dependencies of one step cost what the step has, not what the trace has.
  traces::Trace sub;
  std::vector<uint32_t> orig;  // sub's span -> t's span
  for (size_t i = 0; i < t.spans.size(); ++i) {
    if (t.spans[i].step != step || t.spans[i].kind == traces::SpanKind::Phase) continue;
    sub.spans.push_back(t.spans[i]);
    orig.push_back(static_cast<uint32_t>(i));
  }
  if (sub.spans.empty()) return path;
  const auto& S = sub.spans;
  // The step's last-ending work span (ties: the later one in the trace).
  int64_t cur = 0;
  for (size_t i = 1; i < S.size(); ++i) {
    if (S[i].end_ns >= S[static_cast<size_t>(cur)].end_ns) cur = static_cast<int64_t>(i);
  }
  const auto deps = traces::span_dependencies(sub);
  const auto waits = comm_waits(sub, step);
  std::vector<CriticalLink> back;  // from the end backwards
  std::unordered_set<int64_t> seen;
  while (cur >= 0 && seen.insert(cur).second) {
    const auto& s = S[static_cast<size_t>(cur)];
    CriticalLink link{orig[static_cast<size_t>(cur)], Via::First, s.start_ns, s.end_ns};
    int64_t next = -1;
    if (auto w = waits.find(static_cast<uint32_t>(cur)); w != waits.end()) {
      // It waited: it went on once the late member (or the send) started; the path goes there.
      next = w->second.first;
      link.via = w->second.second;
      link.from_ns = std::min(s.end_ns, S[static_cast<size_t>(next)].start_ns);
      path.wait_ns += link.from_ns - s.start_ns;
    } else {
      // It started after the dependency that ended last.
      const auto& d = deps[static_cast<size_t>(cur)];
      const int64_t pe = d.pred >= 0 ? S[static_cast<size_t>(d.pred)].end_ns : INT64_MIN;
      const int64_t ce = d.cross >= 0 ? S[static_cast<size_t>(d.cross)].end_ns : INT64_MIN;
      if (pe != INT64_MIN || ce != INT64_MIN) {
        next = ce > pe ? d.cross : d.pred;
        link.via = ce > pe ? Via::CrossStream : Via::Stream;
      }
    }
    back.push_back(link);
    cur = next;
  }
  // Each link says how it followed the one before it; the first one follows nothing.
  path.links.assign(back.rbegin(), back.rend());
  path.links.front().via = Via::First;
  path.start_ns = t.spans[path.links.front().span].start_ns;
  path.end_ns = t.spans[path.links.back().span].end_ns;
  return path;
}

}  // namespace orrery::gui
