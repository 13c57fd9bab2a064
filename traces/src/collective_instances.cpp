// Grouping of collective spans by (comm, seq) and matching of sends with receives (see
// collective_instances.hpp). The grouping is a counting sort over dense per-communicator sequence
// numbers (the metrics run it over traces of millions of spans); sparse numbers fall back to a
// comparison sort.
#include "orrery/traces/collective_instances.hpp"

#include <algorithm>
#include <climits>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "orrery/common/error.hpp"

namespace orrery::traces {
namespace {

void check_indexable(std::span<const Span> spans) {
  if (spans.size() > UINT32_MAX) throw InternalError("more than 2^32 spans in one trace");
}

struct SeqRange {
  int64_t lo = 0, hi = 0;
  size_t base = 0;  // first bucket of the communicator
};

// The candidates' indices sorted stably by (comm, seq): by buckets when sequence numbers are
// dense enough, else by comparison.
void sort_by_comm_seq(std::span<const Span> spans, std::vector<uint32_t>& idx) {
  const auto key_less = [&](uint32_t a, uint32_t b) {
    return std::tie(spans[a].comm, spans[a].seq) < std::tie(spans[b].comm, spans[b].seq);
  };
  if (idx.size() < 2) return;
  std::unordered_map<int32_t, SeqRange> range;
  SeqRange* cur = nullptr;
  int32_t cur_comm = INT32_MIN;
  for (uint32_t i : idx) {
    const Span& s = spans[i];
    if (!cur || s.comm != cur_comm) {
      cur_comm = s.comm;
      cur = &range.try_emplace(s.comm, SeqRange{s.seq, s.seq, 0}).first->second;
    }
    cur->lo = std::min(cur->lo, s.seq);
    cur->hi = std::max(cur->hi, s.seq);
  }
  std::vector<int32_t> comms;
  comms.reserve(range.size());
  for (const auto& [c, r] : range) comms.push_back(c);
  std::sort(comms.begin(), comms.end());
  size_t buckets = 0;
  for (int32_t c : comms) {
    SeqRange& r = range[c];
    if (uint64_t(r.hi - r.lo) >= 4 * idx.size() + 1024) {
      std::stable_sort(idx.begin(), idx.end(), key_less);
      return;
    }
    r.base = buckets;
    buckets += size_t(r.hi - r.lo) + 1;
  }
  std::vector<uint32_t> offset(buckets + 1, 0);
  std::vector<size_t> key(idx.size());
  cur = nullptr;
  cur_comm = INT32_MIN;
  for (size_t k = 0; k < idx.size(); ++k) {
    const Span& s = spans[idx[k]];
    if (!cur || s.comm != cur_comm) {
      cur_comm = s.comm;
      cur = &range[s.comm];
    }
    key[k] = cur->base + size_t(s.seq - cur->lo);
    ++offset[key[k] + 1];
  }
  for (size_t b = 0; b < buckets; ++b) offset[b + 1] += offset[b];
  std::vector<uint32_t> out(idx.size());
  for (size_t k = 0; k < idx.size(); ++k) out[offset[key[k]]++] = idx[k];
  idx.swap(out);
}

// A send or receive, keyed by its flow and its place in the flow's order.
struct P2pEntry {
  int32_t comm, src, dst;
  int64_t bytes;
  int64_t k1, k2, k3;  // the order key (P2pOrder)
  uint32_t index;
  auto key() const { return std::tie(comm, src, dst, bytes, k1, k2, k3, index); }
  bool same_flow(const P2pEntry& o) const {
    return comm == o.comm && src == o.src && dst == o.dst && bytes == o.bytes;
  }
  bool flow_before(const P2pEntry& o) const {
    return std::tie(comm, src, dst, bytes) < std::tie(o.comm, o.src, o.dst, o.bytes);
  }
};

P2pEntry p2p_entry(const Span& s, uint32_t index, const P2pOptions& opt) {
  const bool send = s.op == CollOp::Send;
  P2pEntry e{
      s.comm, send ? s.rank : s.peer, send ? s.peer : s.rank, opt.by_bytes ? s.bytes : 0, 0, 0, 0,
      index};
  switch (opt.order) {
    case P2pOrder::Start:
      e.k1 = s.start_ns;
      break;
    case P2pOrder::Seq:
      std::tie(e.k1, e.k2, e.k3) = std::make_tuple(s.seq, s.start_ns, s.end_ns);
      break;
    case P2pOrder::Stream:
      std::tie(e.k1, e.k2, e.k3) = std::make_tuple(int64_t(s.stream), s.start_ns, s.end_ns);
      break;
  }
  return e;
}

}  // namespace

std::vector<CollectiveInstance> collective_instances(std::span<const Span> spans,
                                                     const CollectiveOptions& opt) {
  check_indexable(spans);
  std::vector<uint32_t> idx;
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    if (s.kind != SpanKind::Collective || s.seq < 0 || (opt.require_comm && s.comm < 0)) continue;
    if (opt.keep && !opt.keep(s)) continue;
    idx.push_back(uint32_t(i));
  }
  sort_by_comm_seq(spans, idx);
  std::vector<CollectiveInstance> out;
  const auto by_rank = [&](uint32_t a, uint32_t b) { return spans[a].rank < spans[b].rank; };
  for (size_t i = 0; i < idx.size();) {
    const Span& first = spans[idx[i]];
    size_t j = i + 1;
    while (j < idx.size() && spans[idx[j]].comm == first.comm && spans[idx[j]].seq == first.seq)
      ++j;
    CollectiveInstance& ci = out.emplace_back();
    ci.comm = first.comm;
    ci.seq = first.seq;
    ci.members.assign(idx.begin() + long(i), idx.begin() + long(j));
    // Members are in span order; a trace sorted by rank (as loaded) has them in rank order already.
    if (!std::is_sorted(ci.members.begin(), ci.members.end(), by_rank))
      std::stable_sort(ci.members.begin(), ci.members.end(), by_rank);
    i = j;
  }
  return out;
}

std::vector<P2pMatch> match_p2p(std::span<const Span> spans, const P2pOptions& opt) {
  check_indexable(spans);
  std::vector<P2pEntry> sends, recvs;
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    if (s.kind != SpanKind::P2P || (s.op != CollOp::Send && s.op != CollOp::Recv)) continue;
    if (s.peer < 0 || (opt.require_comm && s.comm < 0)) continue;
    if (opt.keep && !opt.keep(s)) continue;
    (s.op == CollOp::Send ? sends : recvs).push_back(p2p_entry(s, uint32_t(i), opt));
  }
  const auto less = [](const P2pEntry& a, const P2pEntry& b) { return a.key() < b.key(); };
  std::sort(sends.begin(), sends.end(), less);
  std::sort(recvs.begin(), recvs.end(), less);
  // Walk both lists flow by flow: the k-th send of a flow pairs with the flow's k-th receive.
  std::vector<P2pMatch> out;
  size_t i = 0, j = 0;
  while (i < sends.size() && j < recvs.size()) {
    if (sends[i].flow_before(recvs[j])) {
      ++i;
    } else if (recvs[j].flow_before(sends[i])) {
      ++j;
    } else {
      for (; i < sends.size() && j < recvs.size() && sends[i].same_flow(recvs[j]); ++i, ++j)
        out.push_back({sends[i].index, recvs[j].index});
    }
  }
  return out;
}

}  // namespace orrery::traces
