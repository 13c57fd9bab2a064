// The dependency graph of a trace's work spans (traces/chakra.hpp): the edges `orrery replay`
// builds (sim/replay.hpp) so that the Chakra export carries them. Rules, per rank:
//   - stream order: the spans of a (rank, stream) by (start, end, span index), each after the one
//     before it; except that a span starting before a P2P predecessor ended (a posted transfer
//     runs on while the stream goes on) follows the latest span of its stream that had ended by
//     its start;
//   - cross-stream waits: a span that started at or after its predecessor's end depends on the
//     latest-ending span of another stream of its rank that ended at or before its start (and,
//     unless it is communication, after its predecessor's end), among the spans ordered before
//     it by (start, end, span index), so that every edge points backwards and the graph has no
//     cycle.
#include <algorithm>
#include <climits>
#include <map>
#include <numeric>
#include <tuple>

#include "orrery/traces/chakra.hpp"

namespace orrery::traces {

namespace {

bool is_comm(const Span& s) { return s.kind == SpanKind::Collective || s.kind == SpanKind::P2P; }

}  // namespace

std::vector<SpanDependencies> span_dependencies(const Trace& t) {
  return span_dependencies(t.spans);
}

std::vector<SpanDependencies> span_dependencies(std::span<const Span> S) {
  std::vector<SpanDependencies> deps(S.size());
  std::vector<int64_t> work;  // span indices of the non-phase spans
  for (size_t i = 0; i < S.size(); ++i)
    if (S[i].kind != SpanKind::Phase) work.push_back(static_cast<int64_t>(i));

  // Stream order.
  std::vector<int64_t> order = work;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return std::tie(S[a].rank, S[a].stream, S[a].start_ns, S[a].end_ns, a) <
           std::tie(S[b].rank, S[b].stream, S[b].start_ns, S[b].end_ns, b);
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const int64_t p = order[k - 1], n = order[k];
    if (S[p].rank == S[n].rank && S[p].stream == S[n].stream) deps[n].pred = p;
  }
  for (const int64_t n : work) {
    int64_t p = deps[n].pred;
    if (p < 0 || S[p].kind != SpanKind::P2P || S[n].start_ns >= S[p].end_ns) continue;
    while (p >= 0 && S[p].end_ns > S[n].start_ns) p = deps[p].pred;
    deps[n].pred = p;
  }

  // Cross-stream waits: per rank, the work spans by (end, index).
  std::map<int32_t, std::vector<int64_t>> by_end;
  for (const int64_t n : work) by_end[S[n].rank].push_back(n);
  for (auto& [rank, v] : by_end)
    std::sort(v.begin(), v.end(), [&](int64_t a, int64_t b) {
      return std::tie(S[a].end_ns, a) < std::tie(S[b].end_ns, b);
    });
  auto before = [&](int64_t c, int64_t m) {
    return std::tie(S[c].start_ns, S[c].end_ns, c) < std::tie(S[m].start_ns, S[m].end_ns, m);
  };
  for (const int64_t n : work) {
    const Span& s = S[n];
    const int64_t pred_end = deps[n].pred < 0 ? INT64_MIN : S[deps[n].pred].end_ns;
    if (s.start_ns < pred_end) continue;  // nested in its predecessor: stream order only
    const int64_t after = is_comm(s) ? INT64_MIN : pred_end;
    const auto& v = by_end[s.rank];
    auto it = std::upper_bound(v.begin(), v.end(), s.start_ns,
                               [&](int64_t t0, int64_t m) { return t0 < S[m].end_ns; });
    while (it != v.begin()) {
      --it;
      const Span& c = S[*it];
      if (c.end_ns <= after) break;
      if (c.stream != s.stream && before(*it, n)) {
        deps[n].cross = *it;
        break;
      }
    }
  }
  return deps;
}

}  // namespace orrery::traces
