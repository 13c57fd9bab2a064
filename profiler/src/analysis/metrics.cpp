// compute_metrics: one pass over the spans to find ranks and steps, then per rank one sort of its
// intervals by class, merged lists with prefix sums (so any window or step is an O(log n) query),
// and the collectives grouped by (comm, seq) (traces::collective_instances) for bandwidth and
// straggler figures. Each of these is a step below that returns its result; compute_metrics
// chains them. Definitions are in metrics.hpp.
#include "orrery/profiler/metrics.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <exception>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/traces/collective_instances.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::profiler {
namespace {

using traces::CollOp;
using traces::Span;
using traces::SpanKind;

// A merged interval list with prefix sums: clipped(a, b) is the covered length inside [a, b).
struct Merged {
  std::vector<Interval> iv;
  std::vector<int64_t> prefix;  // prefix[i] = summed length of iv[0, i)

  void finish() {
    prefix.resize(iv.size() + 1);
    prefix[0] = 0;
    for (size_t i = 0; i < iv.size(); ++i)
      prefix[i + 1] = prefix[i] + (iv[i].end_ns - iv[i].start_ns);
  }
  int64_t total() const { return prefix.empty() ? 0 : prefix.back(); }
  int64_t clipped(int64_t a, int64_t b) const {
    if (b <= a || iv.empty()) return 0;
    // Intervals are disjoint and sorted, so their ends are sorted too.
    const auto first = std::upper_bound(iv.begin(), iv.end(), a,
                                        [](int64_t x, const Interval& v) { return x < v.end_ns; });
    const auto last = std::lower_bound(iv.begin(), iv.end(), b,
                                       [](const Interval& v, int64_t x) { return v.start_ns < x; });
    if (first >= last) return 0;
    const size_t i = size_t(first - iv.begin()), j = size_t(last - iv.begin());
    int64_t sum = prefix[j] - prefix[i];
    sum -= std::max<int64_t>(0, a - iv[i].start_ns);
    sum -= std::max<int64_t>(0, iv[j - 1].end_ns - b);
    return sum;
  }
};

// Intervals appended in a few ascending runs (one per stream of a rank trace sorted by stream and
// start): merging the runs is linear-ish where a full sort would be n log n.
struct RunList {
  std::vector<Interval> v;
  std::vector<size_t> runs;  // start index of each ascending run

  void clear() {
    v.clear();
    runs.clear();
  }
  void push(int64_t a, int64_t b) {
    // Touching or overlapping the last interval (the common case of a stream's back-to-back
    // spans): coalesced at once, so a rank's lists stay small. Merging gives the same union.
    if (!v.empty() && a >= v.back().start_ns && a <= v.back().end_ns) {
      v.back().end_ns = std::max(v.back().end_ns, b);
      return;
    }
    if (v.empty() || a < v.back().start_ns) runs.push_back(v.size());
    v.push_back({a, b});
  }
  // Sorts by start and coalesces into `out`.
  void merge_into(Merged& out) {
    const auto by_start = [](const Interval& x, const Interval& y) {
      return x.start_ns < y.start_ns;
    };
    if (runs.size() > 64) {
      std::sort(v.begin(), v.end(), by_start);
    } else {
      while (runs.size() > 1) {
        std::vector<size_t> next;
        for (size_t k = 0; k < runs.size(); k += 2) {
          next.push_back(runs[k]);
          if (k + 1 < runs.size()) {
            const size_t end = k + 2 < runs.size() ? runs[k + 2] : v.size();
            std::inplace_merge(v.begin() + long(runs[k]), v.begin() + long(runs[k + 1]),
                               v.begin() + long(end), by_start);
          }
        }
        runs.swap(next);
      }
    }
    out.iv.clear();
    for (const Interval& x : v) {
      if (x.end_ns <= x.start_ns) continue;
      if (!out.iv.empty() && x.start_ns <= out.iv.back().end_ns) {
        out.iv.back().end_ns = std::max(out.iv.back().end_ns, x.end_ns);
      } else {
        out.iv.push_back(x);
      }
    }
    out.finish();
  }
};

void intersect(const Merged& a, const Merged& b, Merged& out) {
  out.iv.clear();
  size_t i = 0, j = 0;
  while (i < a.iv.size() && j < b.iv.size()) {
    const int64_t lo = std::max(a.iv[i].start_ns, b.iv[j].start_ns);
    const int64_t hi = std::min(a.iv[i].end_ns, b.iv[j].end_ns);
    if (hi > lo) out.iv.push_back({lo, hi});
    if (a.iv[i].end_ns < b.iv[j].end_ns) {
      ++i;
    } else {
      ++j;
    }
  }
  out.finish();
}

void unite(const Merged& a, const Merged& b, Merged& out) {
  out.iv.clear();
  size_t i = 0, j = 0;
  while (i < a.iv.size() || j < b.iv.size()) {
    const bool take_a =
        j >= b.iv.size() || (i < a.iv.size() && a.iv[i].start_ns <= b.iv[j].start_ns);
    const Interval x = take_a ? a.iv[i++] : b.iv[j++];
    if (!out.iv.empty() && x.start_ns <= out.iv.back().end_ns) {
      out.iv.back().end_ns = std::max(out.iv.back().end_ns, x.end_ns);
    } else {
      out.iv.push_back(x);
    }
  }
  out.finish();
}

bool is_compute(SpanKind k) { return k == SpanKind::Compute || k == SpanKind::Optimizer; }
bool is_comm(SpanKind k) { return k == SpanKind::Collective || k == SpanKind::P2P; }

bool in_window(const Span& s, int64_t ws, int64_t we) {
  if (s.start_ns == s.end_ns) return s.start_ns >= ws && s.start_ns < we;
  return s.start_ns < we && s.end_ns > ws;
}

struct StepExtent {
  int64_t start_ns = INT64_MAX;
  int64_t end_ns = INT64_MIN;
  void add(int64_t a, int64_t b) {
    start_ns = std::min(start_ns, a);
    end_ns = std::max(end_ns, b);
  }
};

struct CollKey {
  CollOp op;
  int32_t comm;
  bool operator==(const CollKey& o) const { return op == o.op && comm == o.comm; }
};
struct CollKeyHash {
  size_t operator()(const CollKey& k) const {
    return std::hash<int64_t>()((int64_t(k.op) << 32) ^ int64_t(uint32_t(k.comm)));
  }
};
struct CollAcc {
  CollectiveStats stats;
  bool p2p = false;
  int32_t last_rank = -1;
  int32_t ranks_seen = 0;
};
using CollMap = std::unordered_map<CollKey, CollAcc, CollKeyHash>;

TimeBreakdown breakdown(const Merged& c, const Merged& k, const Merged& mc, const Merged& ck,
                        const Merged& all, int64_t a, int64_t b) {
  TimeBreakdown tb;
  if (b <= a) return tb;
  tb.window_ns = b - a;
  tb.compute_ns = c.clipped(a, b);
  tb.comm_ns = k.clipped(a, b);
  tb.memcpy_ns = mc.clipped(a, b);
  tb.overlap_ns = ck.clipped(a, b);
  tb.exposed_comm_ns = tb.comm_ns - tb.overlap_ns;
  tb.idle_ns = tb.window_ns - all.clipped(a, b);
  return tb;
}

void add_to(TimeBreakdown& sum, const TimeBreakdown& x) {
  sum.window_ns += x.window_ns;
  sum.compute_ns += x.compute_ns;
  sum.comm_ns += x.comm_ns;
  sum.memcpy_ns += x.memcpy_ns;
  sum.overlap_ns += x.overlap_ns;
  sum.exposed_comm_ns += x.exposed_comm_ns;
  sum.idle_ns += x.idle_ns;
}

std::string where(const traces::Trace& t) { return t.path.empty() ? "trace" : "trace " + t.path; }

// Rank ids index dense arrays; a corrupt id must not allocate gigabytes.
constexpr int32_t kMaxRank = 1 << 24;

// ---- Pass 1: which ranks, whether spans are grouped by rank, and the extent of every step.
struct SpanScan {
  int32_t max_rank = -1;
  bool rank_sorted = true;
  int64_t span_count = 0;                   // spans overlapping the window
  int64_t grouped_count = 0;                // collectives with seq >= 0 starting in the window
  std::vector<int64_t> window_count;        // in-window spans per rank id
  std::vector<size_t> first_idx, last_idx;  // per rank id: its spans lie in [first, last)
  std::unordered_map<int32_t, StepExtent> step_ext;
};

struct StepPhase {
  int32_t rank, step;
  int64_t start_ns, end_ns;
  // Position in trace order among the rank's phases of equal start: the span's index, or (stream,
  // block id, index in the block) when the blocks are read out of trace order.
  std::tuple<int64_t, int64_t, int64_t> order;
};

bool has_step_phases(const traces::Trace& t, traces::NameId step_name) {
  if (step_name == UINT32_MAX) return false;
  for (const Span& s : t.spans) {
    if (s.kind == SpanKind::Phase && s.name == step_name) return true;
  }
  return false;
}

// A "step" phase without a step number is the k-th "step" phase of its rank, by start.
std::unordered_map<int32_t, StepExtent> phase_step_extents(std::vector<StepPhase> phases) {
  std::unordered_map<int32_t, StepExtent> ext;
  std::sort(phases.begin(), phases.end(), [](const auto& a, const auto& b) {
    return std::tie(a.rank, a.start_ns, a.order) < std::tie(b.rank, b.start_ns, b.order);
  });
  int32_t ordinal = 0;
  for (size_t i = 0; i < phases.size(); ++i) {
    if (i > 0 && phases[i].rank != phases[i - 1].rank) ordinal = 0;
    const auto& p = phases[i];
    ext[p.step >= 0 ? p.step : ordinal].add(p.start_ns, p.end_ns);
    ++ordinal;
  }
  return ext;
}

void check_span(const traces::Trace& t, const Span& s) {
  if (s.rank < 0 || s.rank >= kMaxRank)
    throw InputError(where(t) + ": span with rank " + std::to_string(s.rank) +
                     ", expected 0 <= rank < " + std::to_string(kMaxRank));
  if (s.end_ns < s.start_ns) {
    throw InputError(where(t) + ": span ending before it starts (rank " + std::to_string(s.rank) +
                     ", start " + std::to_string(s.start_ns) + " ns)");
  }
}

// The scan, one span at a time (spans numbered in trace order). `collect_phases` / `collect_tags`:
// which step definitions to gather; finish() takes the "step" phases when there are any (the
// in-memory path knows beforehand and gathers one, the streaming path gathers both).
class ScanBuilder {
 public:
  ScanBuilder(const traces::Trace& t, int64_t ws, int64_t we, bool collect_phases,
              bool collect_tags)
      : t_(t), ws_(ws), we_(we), phases_(collect_phases), tags_(collect_tags) {
    step_name_ = t.strings.find("step");
    for (const auto& r : t.ranks) {
      if (r.rank >= kMaxRank)
        throw InputError(where(t) + ": rank " + std::to_string(r.rank) + " out of range");
      sc_.max_rank = std::max(sc_.max_rank, r.rank);
    }
  }
  traces::NameId step_name() const { return step_name_; }

  // `order`: where the span lies in trace order (see StepPhase); `i` its index when read in order.
  void add(const Span& s, size_t i) { add(s, i, {int64_t(i), 0, 0}); }
  void add(const Span& s, size_t i, const std::tuple<int64_t, int64_t, int64_t>& order) {
    check_span(t_, s);
    if (s.rank != prev_rank_) {
      if (s.rank < prev_rank_) sc_.rank_sorted = false;
      prev_rank_ = s.rank;
    }
    if (s.rank >= int32_t(sc_.window_count.size())) {
      sc_.window_count.resize(size_t(s.rank) + 1, 0);
      sc_.first_idx.resize(size_t(s.rank) + 1, SIZE_MAX);
      sc_.last_idx.resize(size_t(s.rank) + 1, 0);
    }
    if (sc_.first_idx[size_t(s.rank)] == SIZE_MAX) sc_.first_idx[size_t(s.rank)] = i;
    sc_.last_idx[size_t(s.rank)] = i + 1;
    sc_.max_rank = std::max(sc_.max_rank, s.rank);
    if (phases_ && s.kind == SpanKind::Phase && s.name == step_name_)
      step_phases_.push_back({s.rank, s.step, s.start_ns, s.end_ns, order});
    if (tags_ && s.step >= 0) {
      if (s.step != cached_step_) {
        cached_step_ = s.step;
        cached_ext_ = &sc_.step_ext[s.step];  // unordered_map references stay valid on insertion
      }
      cached_ext_->add(s.start_ns, s.end_ns);
    }
    if (s.kind == SpanKind::Collective && s.seq >= 0 && s.start_ns >= ws_ && s.start_ns < we_)
      ++sc_.grouped_count;
    if (in_window(s, ws_, we_)) {
      ++sc_.window_count[size_t(s.rank)];
      ++sc_.span_count;
    }
  }

  SpanScan finish() {
    if (!step_phases_.empty()) sc_.step_ext = phase_step_extents(std::move(step_phases_));
    return std::move(sc_);
  }

 private:
  const traces::Trace& t_;
  int64_t ws_, we_;
  bool phases_, tags_;
  traces::NameId step_name_ = UINT32_MAX;
  SpanScan sc_;
  int32_t cached_step_ = INT32_MIN;
  StepExtent* cached_ext_ = nullptr;
  std::vector<StepPhase> step_phases_;  // resolved at the end: untagged ones need ordinals
  int32_t prev_rank_ = INT32_MIN;
};

SpanScan scan_spans(const traces::Trace& t, int64_t ws, int64_t we) {
  const bool phase_steps = has_step_phases(t, t.strings.find("step"));
  ScanBuilder b(t, ws, we, phase_steps, !phase_steps);
  for (size_t i = 0; i < t.spans.size(); ++i) b.add(t.spans[i], i);
  return b.finish();
}

// ---- Steps, by id; warm-up by position in the whole trace, then kept when inside the window.
struct StepSummary {
  std::vector<StepStats> steps;  // inside the window, warm-up ones flagged
  Merged counted_union;  // union of the counted steps' windows (they normally do not overlap)
  int64_t counted_total_ns = 0;
  int32_t counted_steps = 0;
  double mean_ns = 0, p50_ns = 0, p90_ns = 0;
};

StepSummary summarize_steps(const std::unordered_map<int32_t, StepExtent>& step_ext, int skip_steps,
                            int64_t ws, int64_t we) {
  StepSummary out;
  std::vector<StepStats> all_steps;
  all_steps.reserve(step_ext.size());
  for (const auto& [id, e] : step_ext) all_steps.push_back({id, e.start_ns, e.end_ns, false});
  std::sort(all_steps.begin(), all_steps.end(),
            [](const StepStats& a, const StepStats& b) { return a.step < b.step; });
  for (size_t i = 0; i < all_steps.size(); ++i) {
    all_steps[i].warmup = int64_t(i) < skip_steps;
    if (all_steps[i].start_ns >= ws && all_steps[i].end_ns <= we) out.steps.push_back(all_steps[i]);
  }
  std::vector<double> counted_durations;
  RunList counted_runs;
  for (const StepStats& st : out.steps) {
    if (st.warmup) continue;
    counted_durations.push_back(double(st.duration_ns()));
    out.counted_total_ns += st.duration_ns();
    counted_runs.push(st.start_ns, st.end_ns);
  }
  counted_runs.merge_into(out.counted_union);
  out.counted_steps = int32_t(counted_durations.size());
  if (!counted_durations.empty()) {
    double sum = 0;
    for (double d : counted_durations) sum += d;
    out.mean_ns = sum / double(counted_durations.size());
    out.p50_ns = percentile(counted_durations, 0.5);
    out.p90_ns = percentile(counted_durations, 0.9);
  }
  return out;
}

// ---- Dense rank index: ranks declared in the trace plus ranks with spans in the window.
struct RankIndex {
  std::vector<int32_t> dense;  // rank id -> index into ids, -1 when absent
  std::vector<int32_t> ids;    // the ranks, ascending
};

RankIndex index_ranks(const traces::Trace& t, const SpanScan& sc) {
  RankIndex ix;
  ix.dense.assign(size_t(sc.max_rank + 1), -1);
  for (const auto& r : t.ranks) {
    if (r.rank >= 0) ix.dense[size_t(r.rank)] = 0;
  }
  for (size_t r = 0; r < sc.window_count.size(); ++r) {
    if (sc.window_count[r] > 0) ix.dense[r] = 0;
  }
  for (size_t r = 0; r < ix.dense.size(); ++r) {
    if (ix.dense[r] >= 0) {
      ix.dense[r] = int32_t(ix.ids.size());
      ix.ids.push_back(int32_t(r));
    }
  }
  return ix;
}

// Spans of a rank: a contiguous range of the trace when it is grouped by rank (the order of a
// loaded trace, then this is empty), otherwise a counting sort of the in-window span indices.
struct RankOrder {
  std::vector<uint32_t> order;
  std::vector<size_t> offset;  // per rank id: its spans are order[offset[r], offset[r + 1])
};

RankOrder order_by_rank(const std::vector<Span>& spans, const SpanScan& sc, int64_t ws,
                        int64_t we) {
  RankOrder ro;
  if (sc.rank_sorted) return ro;
  if (spans.size() > UINT32_MAX) throw InternalError("more than 2^32 spans in one trace");
  ro.offset.assign(sc.window_count.size() + 1, 0);
  for (size_t r = 0; r < sc.window_count.size(); ++r)
    ro.offset[r + 1] = ro.offset[r] + size_t(sc.window_count[r]);
  ro.order.resize(ro.offset.back());
  std::vector<size_t> fill(ro.offset.begin(), ro.offset.end() - 1);
  for (size_t i = 0; i < spans.size(); ++i) {
    if (in_window(spans[i], ws, we)) ro.order[fill[size_t(spans[i].rank)]++] = uint32_t(i);
  }
  return ro;
}

// ---- Per rank: time breakdowns, bubble, flops and the collective accumulators.
struct RankInput {
  const std::vector<Span>& spans;
  const SpanScan& scan;
  const RankOrder& order;
  const StepSummary& steps;
  bool pipeline;
  int64_t ws, we;
  const std::vector<uint8_t>& tp_comm;  // tp_comm[comm id] != 0: a tp communicator
};

struct RankResult {
  RankMetrics rm;
  double counted_flops = 0, window_flops = 0;
  int64_t lo = INT64_MAX, hi = INT64_MIN;  // extent of the rank's spans in the window
};

// A worker's scratch buffers (reused rank after rank) and its collective accumulators.
struct Worker {
  CollMap coll;
  RunList comp, comm, tp, dp, p2p, mem;
  Merged mc, mk, mm, mck, mtmp, mall, mtp, mdp, mpp;
};

// Calls visit on each in-window span of the rank.
template <typename Visit>
void for_rank_spans(const RankInput& in, int32_t rank, Visit&& visit) {
  const SpanScan& sc = in.scan;
  if (sc.rank_sorted) {
    if (size_t(rank) < sc.first_idx.size() && sc.first_idx[size_t(rank)] != SIZE_MAX) {
      for (size_t i = sc.first_idx[size_t(rank)]; i < sc.last_idx[size_t(rank)]; ++i) {
        if (in_window(in.spans[i], in.ws, in.we)) visit(in.spans[i]);
      }
    }
  } else if (size_t(rank) < sc.window_count.size()) {
    for (size_t k = in.order.offset[size_t(rank)]; k < in.order.offset[size_t(rank) + 1]; ++k)
      visit(in.spans[in.order.order[k]]);
  }
}

// Sorts a rank's spans, one at a time, into the worker's interval lists and collective
// accumulators; lo and hi are the rank's extent in the window.
struct RankCollector {
  const RankInput& in;
  int32_t rank;
  Worker& w;
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  double window_flops = 0, counted_flops = 0;
  CollKey last_key{CollOp::None, INT32_MIN};
  CollAcc* last_acc = nullptr;

  RankCollector(const RankInput& in_, int32_t rank_, Worker& w_) : in(in_), rank(rank_), w(w_) {
    w.comp.clear();
    w.comm.clear();
    w.tp.clear();
    w.dp.clear();
    w.p2p.clear();
    w.mem.clear();
  }

  void add_collective(const Span& s) {
    const CollKey key{s.op, s.comm};
    if (!last_acc || !(key == last_key)) {
      last_key = key;
      last_acc = &w.coll[key];
      if (last_acc->stats.count == 0) {
        last_acc->stats.op = std::string(traces::to_string(s.op));
        last_acc->stats.comm = s.comm;
        last_acc->p2p = s.kind == SpanKind::P2P;
      }
    }
    CollAcc& acc = *last_acc;
    ++acc.stats.count;
    acc.stats.bytes += s.bytes;
    acc.stats.time_ns += s.end_ns - s.start_ns;
    if (acc.last_rank != rank) {
      acc.last_rank = rank;
      ++acc.ranks_seen;
    }
  }

  // A compute span's FLOPs (pro-rated to its clipped part [a, b)), and the part of them inside
  // the counted steps (pro-rated again), summed span by span.
  void add_flops(int64_t a, int64_t b, double flops) {
    window_flops += flops;
    const Merged& counted = in.steps.counted_union;
    if (counted.iv.empty()) return;
    if (b > a) {
      counted_flops += flops * double(counted.clipped(a, b)) / double(b - a);
    } else if (counted.clipped(a, a + 1) > 0) {
      counted_flops += flops;
    }
  }

  // An in-window span of the rank.
  void add(const Span& s) {
    const int64_t a = std::max(s.start_ns, in.ws), b = std::min(s.end_ns, in.we);
    lo = std::min(lo, a);
    hi = std::max(hi, b);
    if (is_compute(s.kind)) {
      w.comp.push(a, b);
      if (s.flops != 0) {
        const int64_t len = s.end_ns - s.start_ns;
        add_flops(a, b, len > 0 ? s.flops * double(b - a) / double(len) : s.flops);
      }
    } else if (is_comm(s.kind)) {
      w.comm.push(a, b);
      if (s.kind == SpanKind::P2P) {
        w.p2p.push(a, b);
      } else if (s.comm >= 0 && size_t(s.comm) < in.tp_comm.size() && in.tp_comm[size_t(s.comm)]) {
        w.tp.push(a, b);
      } else {
        w.dp.push(a, b);
      }
      add_collective(s);
    } else if (s.kind == SpanKind::Memcpy) {
      w.mem.push(a, b);
    }
  }
};

// The rank's figures from the lists a RankCollector filled.
RankResult finish_rank(const RankCollector& c) {
  const RankInput& in = c.in;
  Worker& w = c.w;
  RankResult res;
  RankMetrics& rm = res.rm;
  rm.rank = c.rank;
  res.lo = c.lo;
  res.hi = c.hi;
  res.window_flops = c.window_flops;
  res.counted_flops = c.counted_flops;
  w.comp.merge_into(w.mc);
  w.comm.merge_into(w.mk);
  w.mem.merge_into(w.mm);
  intersect(w.mc, w.mk, w.mck);
  unite(w.mc, w.mk, w.mtmp);
  unite(w.mtmp, w.mm, w.mall);
  if (res.lo < res.hi) rm.total = breakdown(w.mc, w.mk, w.mm, w.mck, w.mall, res.lo, res.hi);
  const std::vector<StepStats>& steps = in.steps.steps;
  for (const StepStats& st : steps)
    rm.by_step[st.step] = breakdown(w.mc, w.mk, w.mm, w.mck, w.mall, st.start_ns, st.end_ns);
  w.tp.merge_into(w.mtp);
  w.dp.merge_into(w.mdp);
  w.p2p.merge_into(w.mpp);
  for (const StepStats& st : steps) {
    if (st.warmup) continue;
    rm.counted += account_step({w.mc.iv, w.mtp.iv, w.mdp.iv, w.mpp.iv}, st.start_ns, st.end_ns);
    rm.counted_step_ns += st.duration_ns();
  }
  if (in.pipeline) rm.bubble_ns = rm.counted.rest_ns;
  return res;
}

RankResult process_rank(const RankInput& in, int32_t rank, Worker& w) {
  RankCollector c(in, rank, w);
  for_rank_spans(in, rank, [&](const Span& s) { c.add(s); });
  return finish_rank(c);
}

// Adds a worker's accumulators into the sum (each rank is processed by one worker only).
void merge_collectives(CollMap& sum, const CollMap& part) {
  for (const auto& [key, acc] : part) {
    CollAcc& dst = sum[key];
    if (dst.stats.count == 0) {
      dst.stats.op = acc.stats.op;
      dst.stats.comm = acc.stats.comm;
      dst.p2p = acc.p2p;
    }
    dst.stats.count += acc.stats.count;
    dst.stats.bytes += acc.stats.bytes;
    dst.stats.time_ns += acc.stats.time_ns;
    dst.ranks_seen += acc.ranks_seen;
  }
}

struct RankRun {
  std::vector<RankResult> ranks;  // by dense index
  CollMap coll;
};

// Ranks are independent: in parallel, each worker with its own scratch buffers and collective
// accumulators, merged afterwards in a fixed order so results do not depend on the thread count.
RankRun run_ranks(const RankInput& in, const std::vector<int32_t>& rank_ids, size_t n_threads) {
  const size_t n_ranks = rank_ids.size();
  RankRun run;
  run.ranks.resize(n_ranks);
  n_threads = std::min(n_threads, n_ranks);
  std::vector<Worker> workers(std::max<size_t>(1, n_threads));
  if (n_threads <= 1) {
    for (size_t ri = 0; ri < n_ranks; ++ri)
      run.ranks[ri] = process_rank(in, rank_ids[ri], workers[0]);
  } else {
    std::atomic<size_t> next{0};
    std::vector<std::exception_ptr> errors(n_threads);
    std::vector<std::thread> threads;
    for (size_t k = 0; k < n_threads; ++k) {
      threads.emplace_back([&, k] {
        try {
          for (size_t ri = next++; ri < n_ranks; ri = next++)
            run.ranks[ri] = process_rank(in, rank_ids[ri], workers[k]);
        } catch (...) {
          errors[k] = std::current_exception();
        }
      });
    }
    for (auto& th : threads) th.join();
    for (const auto& e : errors) {
      if (e) std::rethrow_exception(e);
    }
  }
  for (Worker& w : workers) {
    merge_collectives(run.coll, w.coll);
    w = Worker{};
  }
  return run;
}

// ---- Lateness at collective entry: each (comm, seq) entered inside the window, against the
// median entry of its members.
// Lateness against a median is a multiple of half a nanosecond: summed as integers of half
// nanoseconds, the sums do not depend on the order the instances are visited in (and equal the
// double sums these were while those were exact, below 2^52 ns).
struct Lateness {
  std::vector<int64_t> late_sum2;  // by rank (dense index or id): twice the summed lateness
  std::vector<int64_t> checked, late;
  std::unordered_map<CollKey, int64_t, CollKeyHash> ops;  // distinct (comm, seq) per (op, comm)

  void resize(size_t n) {
    late_sum2.resize(n, 0);
    checked.resize(n, 0);
    late.resize(n, 0);
  }
  // One instance: its n members' starts, sorted (ties in trace order), and rank slots
  // (start(k), slot(k) for k < n).
  template <typename Start, typename Slot>
  void add_instance(CollOp op, int32_t comm, size_t n, Start start, Slot slot,
                    int64_t threshold_ns) {
    ++ops[CollKey{op, comm}];
    if (n < 2) return;
    const int64_t threshold2 = threshold_ns > INT64_MAX / 2 ? INT64_MAX : 2 * threshold_ns;
    const int64_t a = start(n % 2 ? n / 2 : n / 2 - 1), b = start(n / 2);  // median (a + b) / 2
    for (size_t k = 0; k < n; ++k) {
      const size_t ri = slot(k);
      const int64_t late2 = (start(k) - a) + (start(k) - b);
      late_sum2[ri] += late2;
      ++checked[ri];
      if (late2 > threshold2) ++late[ri];
    }
  }
};

Lateness collective_lateness(const traces::Trace& t, const RankIndex& ix, int64_t ws, int64_t we,
                             int64_t threshold_ns) {
  const auto& spans = t.spans;
  Lateness out;
  out.resize(ix.ids.size());
  traces::CollectiveOptions copt;
  copt.require_comm = false;  // a communicator-less collective numbered by seq is grouped too
  copt.keep = [ws, we](const Span& s) { return s.start_ns >= ws && s.start_ns < we; };
  std::vector<std::pair<int64_t, uint32_t>> arrivals;  // (start, span), by start
  for (const auto& ci : traces::collective_instances(spans, copt)) {
    arrivals.clear();
    for (uint32_t k : ci.members) arrivals.emplace_back(spans[k].start_ns, k);
    std::stable_sort(arrivals.begin(), arrivals.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    out.add_instance(
        spans[arrivals.front().second].op, ci.comm, arrivals.size(),
        [&](size_t k) { return arrivals[k].first; },
        [&](size_t k) { return size_t(ix.dense[size_t(spans[arrivals[k].second].rank)]); },
        threshold_ns);
  }
  return out;
}

// Sets the ranks' lateness figures; returns the stragglers.
std::vector<int32_t> apply_lateness(const Lateness& l, const MetricsOptions& opt,
                                    std::vector<RankMetrics>& ranks) {
  std::vector<int32_t> stragglers;
  for (size_t ri = 0; ri < ranks.size(); ++ri) {
    RankMetrics& rm = ranks[ri];
    rm.collectives_checked = l.checked[ri];
    rm.collectives_late = l.late[ri];
    if (rm.collectives_checked == 0) continue;
    rm.late_ns_mean = 0.5 * double(l.late_sum2[ri]) / double(rm.collectives_checked);
    // Late often but early by more on the whole (seen with 2 ranks, where each is the other's
    // mirror) is not a rank that holds the others back.
    if (double(rm.collectives_late) >
            opt.straggler_late_fraction * double(rm.collectives_checked) &&
        rm.late_ns_mean > 0)
      stragglers.push_back(rm.rank);
  }
  return stragglers;
}

// ---- Collectives: sizes, operation counts, bandwidths; by (comm, op name).
std::vector<CollectiveStats> collective_stats(const traces::Trace& t, const CollMap& coll,
                                              const Lateness& l) {
  std::unordered_map<int32_t, int32_t> comm_size;
  for (const auto& c : t.comms) comm_size[c.id] = int32_t(c.ranks.size());
  std::unordered_map<int32_t, int32_t> seen_size;  // ranks seen per communicator, when undeclared
  for (const auto& [key, acc] : coll)
    seen_size[key.comm] = std::max(seen_size[key.comm], acc.ranks_seen);
  std::vector<CollectiveStats> out;
  for (const auto& [key, acc] : coll) {
    CollectiveStats s = acc.stats;
    if (const auto ops = l.ops.find(key); ops != l.ops.end()) s.ops = ops->second;
    const auto cs = comm_size.find(key.comm);
    s.comm_size = cs != comm_size.end() ? cs->second : seen_size[key.comm];
    if (const auto* info = t.comm(key.comm)) s.comm_name = info->name;
    if (s.ops == 0) {
      s.ops = acc.p2p || s.comm_size <= 1 ? s.count : (s.count + s.comm_size - 1) / s.comm_size;
    }
    if (s.time_ns > 0) {
      s.algbw_gbps = double(s.bytes) / double(s.time_ns);  // bytes per ns = GB/s
      s.busbw_gbps = s.algbw_gbps * traces::busbw_factor(key.op, s.comm_size);
    }
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(), [](const CollectiveStats& a, const CollectiveStats& b) {
    return a.comm != b.comm ? a.comm < b.comm : a.op < b.op;
  });
  return out;
}

// ---- Throughput: FLOP/s, tokens/s, MFU (fields of m that the earlier steps filled are inputs).
struct Throughput {
  double achieved_flops = 0, tokens_per_s = 0, model_flops_per_s = 0;
  double peak_flops_per_rank = 0, mfu = 0;
};

Throughput throughput(const traces::Trace& t, const MetricsOptions& opt, const Metrics& m,
                      int64_t counted_total_ns, double counted_flops, double window_flops) {
  Throughput out;
  if (counted_total_ns > 0) {
    out.achieved_flops = counted_flops / (double(counted_total_ns) * 1e-9);
    if (t.meta.tokens_per_step > 0)
      out.tokens_per_s = double(t.meta.tokens_per_step) / (m.step_mean_ns * 1e-9);
    if (t.meta.model_flops_per_step > 0)
      out.model_flops_per_s = t.meta.model_flops_per_step / (m.step_mean_ns * 1e-9);
  } else if (m.end_ns > m.start_ns) {
    out.achieved_flops = window_flops / (double(m.end_ns - m.start_ns) * 1e-9);
  }
  out.peak_flops_per_rank =
      opt.peak_flops_per_rank > 0 ? opt.peak_flops_per_rank : t.meta.peak_flops_per_rank;
  if (out.peak_flops_per_rank > 0 && !m.ranks.empty()) {
    // The model's FLOPs are the whole world's (meta.world_size ranks), the achieved FLOPs those of
    // the ranks recorded: a trace of a subset of the ranks (the simulator's one rank per stage, a
    // real run's files of some ranks) divides each by its own ranks.
    const double recorded = double(m.ranks.size());
    const double world = std::max(recorded, double(t.meta.world_size));
    out.mfu = out.model_flops_per_s > 0 ? out.model_flops_per_s / (out.peak_flops_per_rank * world)
                                        : out.achieved_flops / (out.peak_flops_per_rank * recorded);
  }
  return out;
}

double bubble_pct(const std::vector<RankMetrics>& ranks) {
  double sum = 0;
  int n = 0;
  for (const RankMetrics& rm : ranks) {
    if (rm.counted_step_ns <= 0) continue;
    sum += 100.0 * double(rm.bubble_ns) / double(rm.counted_step_ns);
    ++n;
  }
  return n ? sum / n : 0;
}

// ---- Memory: peaks per "mem.*" counter and of their sum over time.
struct MemoryPeaks {
  std::map<std::string, double> by_name;
  double total = 0;
};

// The samples of one rank, in time order, one at a time; `current` and `seen` are zeroed scratch
// indexed by name id, returned zeroed by finish().
class RankMemory {
 public:
  RankMemory(const traces::Trace& t, traces::NameId total_name, std::vector<double>& current,
             std::vector<char>& seen)
      : t_(t), total_name_(total_name), current_(current), seen_(seen) {}

  void add(const traces::CounterSample& c) {
    if (any_ && c.ts_ns != group_ts_) peak_sum_ = std::max(peak_sum_, sum_);  // a group's end
    any_ = true;
    group_ts_ = c.ts_ns;
    if (!seen_[c.name]) {
      seen_[c.name] = 1;
      names_.push_back(c.name);
      peak_total_ = c.name == total_name_ ? c.value : peak_total_;
      out_.by_name[t_.strings.str(c.name)] = c.value;
    }
    double& peak = out_.by_name[t_.strings.str(c.name)];
    peak = std::max(peak, c.value);
    if (c.name == total_name_) {
      has_total_ = true;
      peak_total_ = std::max(peak_total_, c.value);
    } else if (in_sum(t_.strings.str(c.name))) {
      sum_ += c.value - current_[c.name];
      current_[c.name] = c.value;
    }
  }

  // ZeRO offload's counters ("mem.offload_nvme": the rank's file; "mem.offload_host": pinned host
  // memory of a GPU run) hold the state moved out of the rank's memory: peaks by name, not in the
  // sum, which shows the saving rather than adding the moved state back.
  static bool in_sum(std::string_view name) { return name.rfind("mem.offload_", 0) != 0; }

  MemoryPeaks finish() {
    if (any_) peak_sum_ = std::max(peak_sum_, sum_);
    out_.total = has_total_ ? peak_total_ : peak_sum_;
    for (traces::NameId n : names_) {
      seen_[n] = 0;
      current_[n] = 0;
    }
    return std::move(out_);
  }

 private:
  const traces::Trace& t_;
  traces::NameId total_name_;
  std::vector<double>& current_;
  std::vector<char>& seen_;
  MemoryPeaks out_;
  std::vector<traces::NameId> names_;
  double sum_ = 0, peak_sum_ = 0, peak_total_ = 0;
  bool has_total_ = false, any_ = false;
  int64_t group_ts_ = 0;
};

bool is_mem_name(std::string_view name) { return name.rfind("mem.", 0) == 0; }

// Per dense rank index; ranks without samples get none.
std::vector<std::optional<MemoryPeaks>> memory_peaks(const traces::Trace& t, const RankIndex& ix,
                                                     int64_t ws, int64_t we) {
  std::vector<char> is_mem(t.strings.size(), 0);
  for (size_t i = 0; i < t.strings.size(); ++i)
    is_mem[i] = is_mem_name(t.strings.str(traces::NameId(i)));
  const traces::NameId total_name = t.strings.find("mem.total");
  const int32_t max_rank = int32_t(ix.dense.size()) - 1;
  std::vector<std::vector<const traces::CounterSample*>> by_rank(ix.ids.size());
  for (const auto& c : t.counters) {
    if (c.name >= is_mem.size() || !is_mem[c.name] || c.ts_ns < ws || c.ts_ns >= we) continue;
    if (c.rank < 0 || c.rank > max_rank || ix.dense[size_t(c.rank)] < 0) continue;
    by_rank[size_t(ix.dense[size_t(c.rank)])].push_back(&c);
  }
  std::vector<double> current(t.strings.size(), 0);
  std::vector<char> seen(t.strings.size(), 0);
  std::vector<std::optional<MemoryPeaks>> out(ix.ids.size());
  for (size_t ri = 0; ri < ix.ids.size(); ++ri) {
    auto& samples = by_rank[ri];
    if (samples.empty()) continue;
    std::stable_sort(samples.begin(), samples.end(),
                     [](const auto* a, const auto* b) { return a->ts_ns < b->ts_ns; });
    RankMemory acc(t, total_name, current, seen);
    for (const auto* c : samples) acc.add(*c);
    out[ri] = acc.finish();
  }
  return out;
}

// The same from the file's counter blocks, a rank's samples at a time (the header's strings name
// them); nothing of the header's own counters is used.
std::vector<std::optional<MemoryPeaks>> memory_peaks_streamed(const traces::TraceReader& reader,
                                                              const traces::Trace& t,
                                                              const RankIndex& ix, int64_t ws,
                                                              int64_t we) {
  const traces::NameId total_name = t.strings.find("mem.total");
  const int32_t max_rank = int32_t(ix.dense.size()) - 1;
  std::vector<double> current(t.strings.size(), 0);
  std::vector<char> seen(t.strings.size(), 0);
  std::vector<std::optional<MemoryPeaks>> out(ix.ids.size());
  std::optional<RankMemory> acc;
  size_t acc_index = 0;
  int32_t acc_rank = -1;
  const auto finish = [&] {
    if (acc) out[acc_index] = acc->finish();
    acc.reset();
  };
  reader.for_each_counter_run(is_mem_name, [&](std::span<const traces::CounterSample> run) {
    for (const auto& c : run) {
      if (c.name >= t.strings.size() || c.ts_ns < ws || c.ts_ns >= we) continue;
      if (c.rank < 0 || c.rank > max_rank || ix.dense[size_t(c.rank)] < 0) continue;
      if (!acc || c.rank != acc_rank) {
        finish();
        acc_rank = c.rank;
        acc_index = size_t(ix.dense[size_t(c.rank)]);
        acc.emplace(t, total_name, current, seen);
      }
      acc->add(c);
    }
  });
  finish();
  return out;
}

bool is_pipeline(const traces::Trace& t) {
  bool pipeline = t.meta.pp > 1;
  for (const auto& r : t.ranks) pipeline = pipeline || r.pp > 0;
  return pipeline;
}

// Threads pay off only with enough spans; an explicit count is obeyed (tests use it).
size_t thread_count(const MetricsOptions& opt, int64_t span_count) {
  return opt.threads > 0 ? size_t(opt.threads)
                         : std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()),
                                            size_t(span_count / 200'000) + 1);
}

}  // namespace

namespace {

void check_options(const MetricsOptions& opt) {
  if (opt.window_end_ns <= opt.window_start_ns)
    throw InputError("metrics window: the end must lie after the start");
  if (opt.skip_steps < 0) throw InputError("skip steps: expected a count >= 0");
}

// What the scan and the steps give, before the ranks are processed.
struct Prepared {
  StepSummary steps;
  RankIndex ix;
  std::vector<uint8_t> tp_comm;  // tp_comm[comm id] != 0: a tp communicator
};

Prepared prepare(const traces::Trace& t, const SpanScan& scan, const MetricsOptions& opt,
                 Metrics& m) {
  Prepared p;
  m.span_count = scan.span_count;
  p.steps = summarize_steps(scan.step_ext, opt.skip_steps, opt.window_start_ns, opt.window_end_ns);
  m.steps = p.steps.steps;
  m.counted_steps = p.steps.counted_steps;
  m.step_mean_ns = p.steps.mean_ns;
  m.step_p50_ns = p.steps.p50_ns;
  m.step_p90_ns = p.steps.p90_ns;
  p.ix = index_ranks(t, scan);
  m.pipeline = is_pipeline(t);
  for (const auto& c : t.comms) {
    if (c.id < 0) continue;
    if (size_t(c.id) >= p.tp_comm.size()) p.tp_comm.resize(size_t(c.id) + 1, 0);
    p.tp_comm[size_t(c.id)] = c.kind == traces::CommKind::TP;
  }
  return p;
}

// Everything after the ranks: totals, lateness, collectives, throughput, bubble, memory.
void finish_metrics(const traces::Trace& t, const MetricsOptions& opt, const Prepared& p,
                    RankRun& run, const Lateness& lateness,
                    std::vector<std::optional<MemoryPeaks>> memory, Metrics& m) {
  double counted_flops_sum = 0, window_flops_sum = 0;
  m.start_ns = INT64_MAX;
  m.end_ns = INT64_MIN;
  m.ranks.reserve(run.ranks.size());
  for (RankResult& r : run.ranks) {
    add_to(m.total, r.rm.total);
    counted_flops_sum += r.counted_flops;
    window_flops_sum += r.window_flops;
    if (r.lo < r.hi) {
      m.start_ns = std::min(m.start_ns, r.lo);
      m.end_ns = std::max(m.end_ns, r.hi);
    }
    m.ranks.push_back(std::move(r.rm));
  }
  if (m.start_ns > m.end_ns) m.start_ns = m.end_ns = 0;

  m.stragglers = apply_lateness(lateness, opt, m.ranks);
  m.collectives = collective_stats(t, run.coll, lateness);

  const Throughput tp =
      throughput(t, opt, m, p.steps.counted_total_ns, counted_flops_sum, window_flops_sum);
  m.achieved_flops = tp.achieved_flops;
  m.tokens_per_s = tp.tokens_per_s;
  m.model_flops_per_s = tp.model_flops_per_s;
  m.peak_flops_per_rank = tp.peak_flops_per_rank;
  m.mfu = tp.mfu;
  if (m.pipeline) m.bubble_pct = bubble_pct(m.ranks);

  for (size_t ri = 0; ri < m.ranks.size(); ++ri) {
    if (!memory[ri]) continue;
    m.ranks[ri].peak_memory_bytes = std::move(memory[ri]->by_name);
    m.ranks[ri].peak_memory_total_bytes = memory[ri]->total;
  }
}

// ---- Streaming lateness: the collective instances grouped while the span blocks arrive in time
// order (TraceReader::for_each_block_by_time), each settled as soon as its members are in, so only
// the instances in flight are held. An instance of communicator c waits for c's declared ranks
// that have spans (every rank with spans when c is undeclared); a rank whose last block has been
// read no longer holds one up. Members are ordered as collective_lateness orders them: by start,
// ties in trace order (rank, stream, block id, index in the block).
class InstanceTracker {
 public:
  InstanceTracker(const traces::Trace& header, std::vector<int32_t> ranks_with_spans,
                  int64_t threshold_ns)
      : present_(std::move(ranks_with_spans)), threshold_(threshold_ns) {
    std::sort(present_.begin(), present_.end());
    present_.erase(std::unique(present_.begin(), present_.end()), present_.end());
    for (const auto& c : header.comms) {
      std::vector<int32_t> r;
      for (int32_t x : c.ranks) {
        if (std::binary_search(present_.begin(), present_.end(), x)) r.push_back(x);
      }
      std::sort(r.begin(), r.end());
      r.erase(std::unique(r.begin(), r.end()), r.end());
      expected_[c.id] = {std::move(r), 0};
    }
  }

  // A grouped collective span (seq >= 0, starting in the window) of a block; false when its
  // (comm, seq) was settled already (a repeated instance: the grouping then needs the whole trace).
  bool add(const Span& s, int32_t stream, int64_t block, uint32_t idx) {
    const Key key{s.comm, s.seq};
    auto it = open_.find(key);
    if (it == open_.end()) {
      if (settled(key)) return false;
      it = open_.emplace(key, Open{}).first;
    }
    it->second.members.push_back({s.start_ns, s.rank, stream, block, idx, s.op});
    if (complete(key.first, it->second)) {
      settle(key, it->second);
      open_.erase(it);
    }
    return true;
  }

  // No more spans of `rank`: the instances waiting only for ranks that are done are settled.
  void rank_done(int32_t rank) {
    done_.insert(rank);
    for (auto& [comm, e] : expected_) {
      if (std::binary_search(e.ranks.begin(), e.ranks.end(), rank)) ++e.done;
    }
    for (auto it = open_.begin(); it != open_.end();) {
      if (complete(it->first.first, it->second)) {
        settle(it->first, it->second);
        it = open_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Settles what is still open (members outside the window, ...); the lateness by dense index.
  Lateness finish(const RankIndex& ix) {
    for (auto& [key, inst] : open_) settle(key, inst);
    open_.clear();
    Lateness out;
    out.ops = std::move(by_rank_.ops);
    out.resize(ix.ids.size());
    for (size_t r = 0; r < by_rank_.checked.size(); ++r) {
      if (by_rank_.checked[r] == 0) continue;
      const size_t ri = size_t(ix.dense.at(r));
      out.late_sum2[ri] = by_rank_.late_sum2[r];
      out.checked[ri] = by_rank_.checked[r];
      out.late[ri] = by_rank_.late[r];
    }
    return out;
  }

 private:
  struct Member {
    int64_t start_ns;
    int32_t rank, stream;
    int64_t block;
    uint32_t idx;
    CollOp op;
    auto order() const { return std::tie(start_ns, rank, stream, block, idx); }
  };
  struct Open {
    std::vector<Member> members;
  };
  struct Expected {
    std::vector<int32_t> ranks;  // sorted
    size_t done = 0;             // of them done
  };
  using Key = std::pair<int32_t, int64_t>;  // (comm, seq)
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<int64_t>()(k.second * 0x9E3779B97F4A7C15LL ^ int64_t(k.first));
    }
  };

  bool complete(int32_t comm, const Open& inst) const {
    const auto e = expected_.find(comm);
    const std::vector<int32_t>& want = e != expected_.end() ? e->second.ranks : present_;
    const size_t done = e != expected_.end() ? e->second.done : done_.size();
    if (inst.members.size() + done < want.size()) return false;
    scratch_.clear();
    for (const Member& m : inst.members) scratch_.push_back(m.rank);
    std::sort(scratch_.begin(), scratch_.end());
    for (int32_t r : want) {
      if (!std::binary_search(scratch_.begin(), scratch_.end(), r) && !done_.count(r)) return false;
    }
    return true;
  }

  // Settled seqs per communicator as disjoint closed intervals; past 256 of them, one interval
  // over all (a seq first seen inside it then reads as repeated: the exact fallback, not an error).
  bool settled(const Key& key) const {
    const auto m = settled_.find(key.first);
    if (m == settled_.end()) return false;
    auto it = m->second.upper_bound(key.second);
    return it != m->second.begin() && std::prev(it)->second >= key.second;
  }
  void mark_settled(const Key& key) {
    auto& m = settled_[key.first];
    int64_t a = key.second, b = key.second;
    auto next = m.upper_bound(a);
    if (next != m.begin()) {
      const auto prev = std::prev(next);
      if (a == INT64_MIN || prev->second >= a - 1) {
        a = prev->first;
        b = std::max(b, prev->second);
        m.erase(prev);
      }
    }
    if (next != m.end() && next->first - 1 <= b) {
      b = std::max(b, next->second);
      m.erase(next);
    }
    m[a] = b;
    if (m.size() > 256) {
      const int64_t lo = m.begin()->first, hi = m.rbegin()->second;
      m.clear();
      m[lo] = hi;
    }
  }

  void settle(const Key& key, Open& inst) {
    auto& v = inst.members;
    std::sort(v.begin(), v.end(),
              [](const Member& x, const Member& y) { return x.order() < y.order(); });
    const size_t max_rank = size_t(std::max_element(v.begin(), v.end(), [](auto& x, auto& y) {
                                     return x.rank < y.rank;
                                   })->rank);
    if (max_rank >= by_rank_.checked.size()) by_rank_.resize(max_rank + 1);
    by_rank_.add_instance(
        v.front().op, key.first, v.size(), [&](size_t k) { return v[k].start_ns; },
        [&](size_t k) { return size_t(v[k].rank); }, threshold_);
    mark_settled(key);
  }

  std::vector<int32_t> present_;
  int64_t threshold_;
  std::unordered_map<int32_t, Expected> expected_;  // by declared communicator id
  std::unordered_map<Key, Open, KeyHash> open_;
  std::unordered_set<int32_t> done_;
  std::unordered_map<int32_t, std::map<int64_t, int64_t>> settled_;
  Lateness by_rank_;  // by rank id
  mutable std::vector<int32_t> scratch_;
};

// ---- Streaming: a compact record per grouped collective span instead of the span (the exact
// fallback when an instance repeats).
struct CollRecord {
  int64_t start_ns;
  int64_t seq;
  int32_t comm;
  uint32_t rank_op;  // dense rank index << 8 | op (ranks < 2^24)
  uint32_t rank_index() const { return rank_op >> 8; }
  CollOp op() const { return CollOp(rank_op & 0xff); }
};
static_assert(sizeof(CollRecord) == 24);

// collective_lateness on the records (taken in trace order): the same grouping by (comm, seq),
// members in trace order (so in rank order), arrivals by start. Sorted through 4-byte indices,
// the index itself breaking ties (a stable order without a stable sort's buffer of records).
Lateness lateness_from_records(const std::vector<CollRecord>& recs, size_t n_ranks,
                               int64_t threshold_ns) {
  Lateness out;
  out.resize(n_ranks);
  if (recs.size() > UINT32_MAX) throw InternalError("more than 2^32 collective spans");
  std::vector<uint32_t> idx(recs.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = uint32_t(i);
  std::sort(idx.begin(), idx.end(), [&recs](uint32_t a, uint32_t b) {
    const CollRecord &x = recs[a], &y = recs[b];
    return std::tie(x.comm, x.seq, a) < std::tie(y.comm, y.seq, b);
  });
  std::vector<uint32_t> arrivals;
  for (size_t i = 0; i < idx.size();) {
    const CollRecord& first = recs[idx[i]];
    size_t j = i + 1;
    while (j < idx.size() && recs[idx[j]].comm == first.comm && recs[idx[j]].seq == first.seq) ++j;
    arrivals.assign(idx.begin() + long(i), idx.begin() + long(j));
    std::stable_sort(arrivals.begin(), arrivals.end(), [&recs](uint32_t a, uint32_t b) {
      return recs[a].start_ns < recs[b].start_ns;
    });
    out.add_instance(
        recs[arrivals.front()].op(), first.comm, arrivals.size(),
        [&](size_t k) { return recs[arrivals[k]].start_ns; },
        [&](size_t k) { return size_t(recs[arrivals[k]].rank_index()); }, threshold_ns);
    i = j;
  }
  return out;
}

// The second streaming pass: the ranks one after another (the file is in rank order), one
// worker's lists reused; the collective records for the lateness.
RankRun stream_ranks(const traces::TraceReader& reader, const RankInput& in, const RankIndex& ix,
                     std::vector<CollRecord>* records,
                     const traces::TraceReader::SpanRunVisitor& also) {
  RankRun run;
  run.ranks.resize(ix.ids.size());
  std::vector<char> done(ix.ids.size(), 0);
  Worker w;
  std::optional<RankCollector> cur;
  size_t cur_index = 0;
  const auto finish = [&] {
    if (!cur) return;
    run.ranks[cur_index] = finish_rank(*cur);
    done[cur_index] = 1;
    cur.reset();
  };
  reader.for_each_span_run([&](std::span<const Span> spans) {
    if (also) also(spans);
    for (const Span& s : spans) {
      // A file still being written can grow between the passes: a rank the first did not see
      // (or spans with a damaged rank) cannot be placed.
      if (s.rank < 0 || size_t(s.rank) >= ix.dense.size() ||
          (in_window(s, in.ws, in.we) && ix.dense[size_t(s.rank)] < 0))
        throw InputError(reader.path() + ": trace changed while read (rank " +
                         std::to_string(s.rank) + " new in the second pass)");
      if (records && s.kind == SpanKind::Collective && s.seq >= 0 && s.start_ns >= in.ws &&
          s.start_ns < in.we) {
        const int32_t ri = ix.dense[size_t(s.rank)];
        records->push_back({s.start_ns, s.seq, s.comm, uint32_t(ri) << 8 | uint32_t(s.op)});
      }
      if (!in_window(s, in.ws, in.we)) continue;
      if (!cur || cur->rank != s.rank) {
        finish();
        cur_index = size_t(ix.dense[size_t(s.rank)]);
        if (done[cur_index])
          throw InputError(reader.path() + ": trace changed while read (rank " +
                           std::to_string(s.rank) + " seen twice)");
        cur.emplace(in, s.rank, w);
      }
      cur->add(s);
    }
  });
  finish();
  for (size_t ri = 0; ri < ix.ids.size(); ++ri) {
    if (done[ri]) continue;
    RankCollector empty(in, ix.ids[ri], w);
    run.ranks[ri] = finish_rank(empty);
  }
  merge_collectives(run.coll, w.coll);
  return run;
}

}  // namespace

Metrics compute_metrics(const traces::Trace& t, const MetricsOptions& opt) {
  check_options(opt);
  const int64_t ws = opt.window_start_ns, we = opt.window_end_ns;
  Metrics m;
  const SpanScan scan = scan_spans(t, ws, we);
  const Prepared p = prepare(t, scan, opt, m);
  const RankOrder order = order_by_rank(t.spans, scan, ws, we);
  const RankInput in{t.spans, scan, order, p.steps, m.pipeline, ws, we, p.tp_comm};
  RankRun run = run_ranks(in, p.ix.ids, thread_count(opt, m.span_count));
  const Lateness lateness = collective_lateness(t, p.ix, ws, we, opt.straggler_threshold_ns);
  finish_metrics(t, opt, p, run, lateness, memory_peaks(t, p.ix, ws, we), m);
  return m;
}

Metrics compute_metrics_streamed(const traces::TraceReader& reader, const traces::Trace& header,
                                 const MetricsOptions& opt,
                                 const traces::TraceReader::SpanRunVisitor& also) {
  check_options(opt);
  const int64_t ws = opt.window_start_ns, we = opt.window_end_ns;
  Metrics m;
  // Pass 1, the blocks in time order: ranks, counts, the steps (every rank's step windows are
  // needed before any rank's breakdown) and the lateness. Both step definitions are gathered; the
  // "step" phases win when there are any.
  ScanBuilder builder(header, ws, we, true, true);
  std::optional<InstanceTracker> tracker;
  tracker.emplace(header, reader.span_ranks(), opt.straggler_threshold_ns);
  size_t index = 0;
  reader.for_each_block_by_time([&](const traces::TraceReader::SpanBlockView& b) {
    for (uint32_t k = 0; k < b.spans.size(); ++k) {
      const Span& s = b.spans[k];
      builder.add(s, index++, {b.stream, b.id, k});
      if (tracker && s.kind == SpanKind::Collective && s.seq >= 0 && s.start_ns >= ws &&
          s.start_ns < we && !tracker->add(s, b.stream, b.id, k))
        tracker.reset();  // a repeated instance: grouped from records in pass 2 instead
    }
    if (tracker && b.rank_done) tracker->rank_done(b.rank);
  });
  const SpanScan scan = builder.finish();
  const Prepared p = prepare(header, scan, opt, m);
  // Pass 2: rank by rank.
  const std::vector<Span> no_spans;
  const RankOrder no_order;
  const RankInput in{no_spans, scan, no_order, p.steps, m.pipeline, ws, we, p.tp_comm};
  std::vector<CollRecord> records;
  if (!tracker) records.reserve(size_t(scan.grouped_count));  // exact: no growth slack
  RankRun run = stream_ranks(reader, in, p.ix, tracker ? nullptr : &records, also);
  const Lateness lateness =
      tracker ? tracker->finish(p.ix)
              : lateness_from_records(records, p.ix.ids.size(), opt.straggler_threshold_ns);
  std::vector<CollRecord>().swap(records);
  finish_metrics(header, opt, p, run, lateness, memory_peaks_streamed(reader, header, p.ix, ws, we),
                 m);
  return m;
}

}  // namespace orrery::profiler
