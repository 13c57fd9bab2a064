// compute_metrics: one pass over the spans to find ranks and steps, then per rank one sort of its
// intervals by class, merged lists with prefix sums (so any window or step is an O(log n) query),
// and a grouping of collectives by (comm, seq) for bandwidth and straggler figures.
// Definitions are in metrics.hpp.
#include "orrery/profiler/metrics.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <exception>
#include <thread>
#include <unordered_map>
#include <utility>

#include "orrery/common/error.hpp"

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

struct FlopSpan {
  int64_t start_ns, end_ns;
  double flops;
};

struct Arrival {
  int32_t comm;
  int64_t seq;
  int32_t rank;
  int64_t start_ns;
  CollOp op;
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

// Orders arrivals by (comm, seq, start). Sequence numbers are normally dense per communicator,
// so a counting sort by (comm, seq) does it in linear time, then each (small) group is sorted by
// start; sparse numbers fall back to a comparison sort.
void group_arrivals(std::vector<Arrival>& v) {
  const auto full = [](const Arrival& a, const Arrival& b) {
    if (a.comm != b.comm) return a.comm < b.comm;
    if (a.seq != b.seq) return a.seq < b.seq;
    return a.start_ns < b.start_ns;
  };
  if (v.size() < 2) return;
  std::unordered_map<int32_t, std::pair<int64_t, int64_t>> range;  // comm -> [min, max] seq
  std::pair<int64_t, int64_t>* cur = nullptr;
  int32_t cur_comm = INT32_MIN;
  for (const Arrival& a : v) {
    if (!cur || a.comm != cur_comm) {
      cur_comm = a.comm;
      cur = &range.try_emplace(a.comm, a.seq, a.seq).first->second;
    }
    cur->first = std::min(cur->first, a.seq);
    cur->second = std::max(cur->second, a.seq);
  }
  std::vector<int32_t> comms;
  for (const auto& [c, r] : range) comms.push_back(c);
  std::sort(comms.begin(), comms.end());
  std::unordered_map<int32_t, size_t> base;  // comm -> first bucket
  size_t buckets = 0;
  for (int32_t c : comms) {
    base[c] = buckets;
    const auto [lo, hi] = range[c];
    if (uint64_t(hi - lo) >= 4 * v.size() + 1024) {
      std::sort(v.begin(), v.end(), full);
      return;
    }
    buckets += size_t(hi - lo) + 1;
  }
  std::vector<uint32_t> offset(buckets + 1, 0);
  std::vector<size_t> key(v.size());
  int32_t last_comm = INT32_MIN;
  size_t last_base = 0;
  int64_t last_lo = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i].comm != last_comm) {
      last_comm = v[i].comm;
      last_base = base[last_comm];
      last_lo = range[last_comm].first;
    }
    key[i] = last_base + size_t(v[i].seq - last_lo);
    ++offset[key[i] + 1];
  }
  for (size_t b = 0; b < buckets; ++b) offset[b + 1] += offset[b];
  std::vector<Arrival> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[offset[key[i]]++] = v[i];
  v.swap(out);
  for (size_t i = 0; i < v.size();) {
    size_t j = i + 1;
    while (j < v.size() && v[j].comm == v[i].comm && v[j].seq == v[i].seq) ++j;
    if (j - i > 1) std::sort(v.begin() + long(i), v.begin() + long(j), full);
    i = j;
  }
}

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

}  // namespace

Metrics compute_metrics(const traces::Trace& t, const MetricsOptions& opt) {
  const int64_t ws = opt.window_start_ns, we = opt.window_end_ns;
  if (we <= ws) throw InputError("metrics window: the end must lie after the start");
  if (opt.skip_steps < 0) throw InputError("skip steps: expected a count >= 0");
  const auto& spans = t.spans;
  Metrics m;

  // ---- Pass 1: which ranks, whether spans are grouped by rank, and the extent of every step.
  const traces::NameId step_name = t.strings.find("step");
  bool phase_steps = false;
  if (step_name != UINT32_MAX) {
    for (const Span& s : spans) {
      if (s.kind == SpanKind::Phase && s.name == step_name) {
        phase_steps = true;
        break;
      }
    }
  }
  // Rank ids index dense arrays; a corrupt id must not allocate gigabytes.
  constexpr int32_t kMaxRank = 1 << 24;
  int32_t max_rank = -1;
  for (const auto& r : t.ranks) {
    if (r.rank >= kMaxRank)
      throw InputError(where(t) + ": rank " + std::to_string(r.rank) + " out of range");
    max_rank = std::max(max_rank, r.rank);
  }
  std::unordered_map<int32_t, StepExtent> step_ext;
  int32_t cached_step = INT32_MIN;
  StepExtent* cached_ext = nullptr;
  struct StepPhase {
    int32_t rank, step;
    int64_t start_ns, end_ns;
  };
  std::vector<StepPhase> step_phases;  // resolved after the pass: untagged ones need ordinals
  std::vector<int64_t> window_count;   // in-window spans per rank id
  std::vector<size_t> first_idx, last_idx;
  bool rank_sorted = true;
  int32_t prev_rank = INT32_MIN;
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    if (s.rank < 0 || s.rank >= kMaxRank)
      throw InputError(where(t) + ": span with rank " + std::to_string(s.rank) +
                       ", expected 0 <= rank < " + std::to_string(kMaxRank));
    if (s.end_ns < s.start_ns) {
      throw InputError(where(t) + ": span ending before it starts (rank " + std::to_string(s.rank) +
                       ", start " + std::to_string(s.start_ns) + " ns)");
    }
    if (s.rank != prev_rank) {
      if (s.rank < prev_rank) rank_sorted = false;
      prev_rank = s.rank;
    }
    if (s.rank >= int32_t(window_count.size())) {
      window_count.resize(size_t(s.rank) + 1, 0);
      first_idx.resize(size_t(s.rank) + 1, SIZE_MAX);
      last_idx.resize(size_t(s.rank) + 1, 0);
    }
    if (first_idx[size_t(s.rank)] == SIZE_MAX) first_idx[size_t(s.rank)] = i;
    last_idx[size_t(s.rank)] = i + 1;
    max_rank = std::max(max_rank, s.rank);
    if (phase_steps) {
      if (s.kind == SpanKind::Phase && s.name == step_name)
        step_phases.push_back({s.rank, s.step, s.start_ns, s.end_ns});
    } else if (s.step >= 0) {
      if (s.step != cached_step) {
        cached_step = s.step;
        cached_ext = &step_ext[s.step];  // unordered_map references stay valid on insertion
      }
      cached_ext->add(s.start_ns, s.end_ns);
    }
    if (in_window(s, ws, we)) {
      ++window_count[size_t(s.rank)];
      ++m.span_count;
    }
  }
  if (!step_phases.empty()) {
    // A "step" phase without a step number is the k-th "step" phase of its rank, by start.
    std::stable_sort(step_phases.begin(), step_phases.end(), [](const auto& a, const auto& b) {
      return a.rank != b.rank ? a.rank < b.rank : a.start_ns < b.start_ns;
    });
    int32_t ordinal = 0;
    for (size_t i = 0; i < step_phases.size(); ++i) {
      if (i > 0 && step_phases[i].rank != step_phases[i - 1].rank) ordinal = 0;
      const auto& p = step_phases[i];
      step_ext[p.step >= 0 ? p.step : ordinal].add(p.start_ns, p.end_ns);
      ++ordinal;
    }
  }

  // Steps, by id; warm-up by position in the whole trace, then kept when inside the window.
  std::vector<StepStats> all_steps;
  all_steps.reserve(step_ext.size());
  for (const auto& [id, e] : step_ext) all_steps.push_back({id, e.start_ns, e.end_ns, false});
  std::sort(all_steps.begin(), all_steps.end(),
            [](const StepStats& a, const StepStats& b) { return a.step < b.step; });
  for (size_t i = 0; i < all_steps.size(); ++i) {
    all_steps[i].warmup = int64_t(i) < opt.skip_steps;
    if (all_steps[i].start_ns >= ws && all_steps[i].end_ns <= we) m.steps.push_back(all_steps[i]);
  }
  std::vector<double> counted_durations;
  RunList counted_runs;
  int64_t counted_total_ns = 0;
  for (const StepStats& st : m.steps) {
    if (st.warmup) continue;
    counted_durations.push_back(double(st.duration_ns()));
    counted_total_ns += st.duration_ns();
    counted_runs.push(st.start_ns, st.end_ns);
  }
  Merged counted_union;  // union of the counted steps' windows (they normally do not overlap)
  counted_runs.merge_into(counted_union);
  m.counted_steps = int32_t(counted_durations.size());
  if (!counted_durations.empty()) {
    double sum = 0;
    for (double d : counted_durations) sum += d;
    m.step_mean_ns = sum / double(counted_durations.size());
    m.step_p50_ns = percentile(counted_durations, 0.5);
    m.step_p90_ns = percentile(counted_durations, 0.9);
  }

  // Dense rank index: ranks declared in the trace plus ranks with spans in the window.
  std::vector<int32_t> dense(size_t(max_rank + 1), -1);
  for (const auto& r : t.ranks) {
    if (r.rank >= 0) dense[size_t(r.rank)] = 0;
  }
  for (size_t r = 0; r < window_count.size(); ++r) {
    if (window_count[r] > 0) dense[r] = 0;
  }
  std::vector<int32_t> rank_ids;
  for (size_t r = 0; r < dense.size(); ++r) {
    if (dense[r] >= 0) {
      dense[r] = int32_t(rank_ids.size());
      rank_ids.push_back(int32_t(r));
    }
  }
  m.ranks.resize(rank_ids.size());

  // Spans of a rank: a contiguous range of the trace when it is grouped by rank (the order of a
  // loaded trace), otherwise a counting sort of the in-window span indices.
  std::vector<uint32_t> order;
  std::vector<size_t> order_offset;
  if (!rank_sorted) {
    if (spans.size() > UINT32_MAX) throw InternalError("more than 2^32 spans in one trace");
    order_offset.assign(window_count.size() + 1, 0);
    for (size_t r = 0; r < window_count.size(); ++r)
      order_offset[r + 1] = order_offset[r] + size_t(window_count[r]);
    order.resize(order_offset.back());
    std::vector<size_t> fill(order_offset.begin(), order_offset.end() - 1);
    for (size_t i = 0; i < spans.size(); ++i) {
      if (in_window(spans[i], ws, we)) order[fill[size_t(spans[i].rank)]++] = uint32_t(i);
    }
  }

  bool pipeline = t.meta.pp > 1;
  for (const auto& r : t.ranks) pipeline = pipeline || r.pp > 0;
  m.pipeline = pipeline;

  std::unordered_map<int32_t, int32_t> comm_size;
  for (const auto& c : t.comms) comm_size[c.id] = int32_t(c.ranks.size());

  // ---- Per rank, in parallel: ranks are independent; each worker has its own scratch buffers
  // and collective accumulators, merged afterwards in a fixed order so results do not depend on
  // the thread count.
  using CollMap = std::unordered_map<CollKey, CollAcc, CollKeyHash>;
  struct Worker {
    CollMap coll;
    std::vector<Arrival> arrivals;
    RunList comp, comm, colls, mem;
    std::vector<FlopSpan> flop_spans;
    Merged mc, mk, mm, mck, mcol, mtmp, mall, mbusy;
  };
  const size_t n_ranks = rank_ids.size();
  std::vector<double> counted_flops(n_ranks, 0), window_flops(n_ranks, 0);
  std::vector<int64_t> rank_lo(n_ranks, INT64_MAX), rank_hi(n_ranks, INT64_MIN);

  const auto process_rank = [&](size_t ri, Worker& w) {
    const int32_t rank = rank_ids[ri];
    RankMetrics& rm = m.ranks[ri];
    rm.rank = rank;
    w.comp.clear();
    w.comm.clear();
    w.colls.clear();
    w.mem.clear();
    w.flop_spans.clear();
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    CollKey last_key{CollOp::None, INT32_MIN};
    CollAcc* last_acc = nullptr;

    const auto visit = [&](const Span& s) {
      const int64_t a = std::max(s.start_ns, ws), b = std::min(s.end_ns, we);
      lo = std::min(lo, a);
      hi = std::max(hi, b);
      if (is_compute(s.kind)) {
        w.comp.push(a, b);
        if (s.flops != 0) {
          const int64_t len = s.end_ns - s.start_ns;
          const double kept = len > 0 ? s.flops * double(b - a) / double(len) : s.flops;
          w.flop_spans.push_back({a, b, kept});
        }
      } else if (is_comm(s.kind)) {
        w.comm.push(a, b);
        if (s.kind == SpanKind::Collective) w.colls.push(a, b);
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
        if (s.kind == SpanKind::Collective && s.seq >= 0 && s.start_ns >= ws && s.start_ns < we)
          w.arrivals.push_back({s.comm, s.seq, rank, s.start_ns, s.op});
      } else if (s.kind == SpanKind::Memcpy) {
        w.mem.push(a, b);
      }
    };
    if (rank_sorted) {
      if (size_t(rank) < first_idx.size() && first_idx[size_t(rank)] != SIZE_MAX) {
        for (size_t i = first_idx[size_t(rank)]; i < last_idx[size_t(rank)]; ++i) {
          if (in_window(spans[i], ws, we)) visit(spans[i]);
        }
      }
    } else if (size_t(rank) < window_count.size()) {
      for (size_t k = order_offset[size_t(rank)]; k < order_offset[size_t(rank) + 1]; ++k)
        visit(spans[order[k]]);
    }

    w.comp.merge_into(w.mc);
    w.comm.merge_into(w.mk);
    w.mem.merge_into(w.mm);
    intersect(w.mc, w.mk, w.mck);
    unite(w.mc, w.mk, w.mtmp);
    unite(w.mtmp, w.mm, w.mall);
    if (lo < hi) rm.total = breakdown(w.mc, w.mk, w.mm, w.mck, w.mall, lo, hi);
    rank_lo[ri] = lo;
    rank_hi[ri] = hi;
    for (const StepStats& st : m.steps)
      rm.by_step[st.step] = breakdown(w.mc, w.mk, w.mm, w.mck, w.mall, st.start_ns, st.end_ns);
    if (pipeline) {
      w.colls.merge_into(w.mcol);
      unite(w.mc, w.mcol, w.mbusy);
      for (const StepStats& st : m.steps) {
        if (st.warmup) continue;
        rm.bubble_ns += st.duration_ns() - w.mbusy.clipped(st.start_ns, st.end_ns);
        rm.counted_step_ns += st.duration_ns();
      }
    }
    for (const FlopSpan& f : w.flop_spans) {
      window_flops[ri] += f.flops;
      if (counted_union.iv.empty()) continue;
      if (f.end_ns > f.start_ns) {
        counted_flops[ri] += f.flops * double(counted_union.clipped(f.start_ns, f.end_ns)) /
                             double(f.end_ns - f.start_ns);
      } else if (counted_union.clipped(f.start_ns, f.start_ns + 1) > 0) {
        counted_flops[ri] += f.flops;
      }
    }
  };

  // Threads pay off only with enough spans; an explicit count is obeyed (tests use it).
  size_t n_threads = opt.threads > 0
                         ? size_t(opt.threads)
                         : std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()),
                                            size_t(m.span_count / 200'000) + 1);
  n_threads = std::min(n_threads, n_ranks);
  std::vector<Worker> workers(std::max<size_t>(1, n_threads));
  if (n_threads <= 1) {
    for (size_t ri = 0; ri < n_ranks; ++ri) process_rank(ri, workers[0]);
  } else {
    std::atomic<size_t> next{0};
    std::vector<std::exception_ptr> errors(n_threads);
    std::vector<std::thread> threads;
    for (size_t k = 0; k < n_threads; ++k) {
      threads.emplace_back([&, k] {
        try {
          for (size_t ri = next++; ri < n_ranks; ri = next++) process_rank(ri, workers[k]);
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

  double counted_flops_sum = 0, window_flops_sum = 0;
  m.start_ns = INT64_MAX;
  m.end_ns = INT64_MIN;
  for (size_t ri = 0; ri < n_ranks; ++ri) {
    add_to(m.total, m.ranks[ri].total);
    counted_flops_sum += counted_flops[ri];
    window_flops_sum += window_flops[ri];
    if (rank_lo[ri] < rank_hi[ri]) {
      m.start_ns = std::min(m.start_ns, rank_lo[ri]);
      m.end_ns = std::max(m.end_ns, rank_hi[ri]);
    }
  }
  if (m.start_ns > m.end_ns) m.start_ns = m.end_ns = 0;
  CollMap coll;
  std::vector<Arrival> arrivals;
  {
    size_t total = 0;
    for (const Worker& w : workers) total += w.arrivals.size();
    arrivals.reserve(total);
  }
  for (Worker& w : workers) {
    for (auto& [key, acc] : w.coll) {
      CollAcc& dst = coll[key];
      if (dst.stats.count == 0) {
        dst.stats.op = acc.stats.op;
        dst.stats.comm = acc.stats.comm;
        dst.p2p = acc.p2p;
      }
      dst.stats.count += acc.stats.count;
      dst.stats.bytes += acc.stats.bytes;
      dst.stats.time_ns += acc.stats.time_ns;
      dst.ranks_seen += acc.ranks_seen;  // each rank is processed by one worker only
    }
    arrivals.insert(arrivals.end(), w.arrivals.begin(), w.arrivals.end());
    w = Worker{};
  }

  // ---- Collectives: sizes, operation counts, bandwidths.
  group_arrivals(arrivals);
  std::vector<double> late_sum(rank_ids.size(), 0);
  for (size_t i = 0; i < arrivals.size();) {
    size_t j = i + 1;
    while (j < arrivals.size() && arrivals[j].comm == arrivals[i].comm &&
           arrivals[j].seq == arrivals[i].seq)
      ++j;
    auto it = coll.find(CollKey{arrivals[i].op, arrivals[i].comm});
    if (it != coll.end()) ++it->second.stats.ops;
    const size_t n = j - i;
    if (n >= 2) {
      const double median = n % 2 ? double(arrivals[i + n / 2].start_ns)
                                  : 0.5 * (double(arrivals[i + n / 2 - 1].start_ns) +
                                           double(arrivals[i + n / 2].start_ns));
      for (size_t k = i; k < j; ++k) {
        const size_t ri = size_t(dense[size_t(arrivals[k].rank)]);
        const double late = double(arrivals[k].start_ns) - median;
        late_sum[ri] += late;
        ++m.ranks[ri].collectives_checked;
        if (late > double(opt.straggler_threshold_ns)) ++m.ranks[ri].collectives_late;
      }
    }
    i = j;
  }
  for (size_t ri = 0; ri < m.ranks.size(); ++ri) {
    RankMetrics& rm = m.ranks[ri];
    if (rm.collectives_checked == 0) continue;
    rm.late_ns_mean = late_sum[ri] / double(rm.collectives_checked);
    // Late often but early by more on the whole (seen with 2 ranks, where each is the other's
    // mirror) is not a rank that holds the others back.
    if (double(rm.collectives_late) > opt.straggler_late_fraction * double(rm.collectives_checked) &&
        rm.late_ns_mean > 0)
      m.stragglers.push_back(rm.rank);
  }

  std::unordered_map<int32_t, int32_t> seen_size;  // ranks seen per communicator, when undeclared
  for (const auto& [key, acc] : coll)
    seen_size[key.comm] = std::max(seen_size[key.comm], acc.ranks_seen);
  for (auto& [key, acc] : coll) {
    CollectiveStats s = acc.stats;
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
    m.collectives.push_back(std::move(s));
  }
  std::sort(m.collectives.begin(), m.collectives.end(),
            [](const CollectiveStats& a, const CollectiveStats& b) {
              return a.comm != b.comm ? a.comm < b.comm : a.op < b.op;
            });

  // ---- Throughput.
  if (counted_total_ns > 0) {
    m.achieved_flops = counted_flops_sum / (double(counted_total_ns) * 1e-9);
    if (t.meta.tokens_per_step > 0)
      m.tokens_per_s = double(t.meta.tokens_per_step) / (m.step_mean_ns * 1e-9);
    if (t.meta.model_flops_per_step > 0)
      m.model_flops_per_s = t.meta.model_flops_per_step / (m.step_mean_ns * 1e-9);
  } else if (m.end_ns > m.start_ns) {
    m.achieved_flops = window_flops_sum / (double(m.end_ns - m.start_ns) * 1e-9);
  }
  m.peak_flops_per_rank =
      opt.peak_flops_per_rank > 0 ? opt.peak_flops_per_rank : t.meta.peak_flops_per_rank;
  if (m.peak_flops_per_rank > 0 && !m.ranks.empty()) {
    const double model = m.model_flops_per_s > 0 ? m.model_flops_per_s : m.achieved_flops;
    m.mfu = model / (m.peak_flops_per_rank * double(m.ranks.size()));
  }
  if (pipeline) {
    double sum = 0;
    int n = 0;
    for (const RankMetrics& rm : m.ranks) {
      if (rm.counted_step_ns <= 0) continue;
      sum += 100.0 * double(rm.bubble_ns) / double(rm.counted_step_ns);
      ++n;
    }
    m.bubble_pct = n ? sum / n : 0;
  }

  // ---- Memory: peaks per "mem.*" counter and of their sum over time.
  std::vector<char> is_mem(t.strings.size(), 0);
  for (size_t i = 0; i < t.strings.size(); ++i)
    is_mem[i] = t.strings.str(traces::NameId(i)).rfind("mem.", 0) == 0;
  const traces::NameId total_name = t.strings.find("mem.total");
  std::vector<std::vector<const traces::CounterSample*>> by_rank(m.ranks.size());
  for (const auto& c : t.counters) {
    if (c.name >= is_mem.size() || !is_mem[c.name] || c.ts_ns < ws || c.ts_ns >= we) continue;
    if (c.rank < 0 || c.rank > max_rank || dense[size_t(c.rank)] < 0) continue;
    by_rank[size_t(dense[size_t(c.rank)])].push_back(&c);
  }
  std::vector<double> current(t.strings.size(), 0);
  std::vector<char> seen(t.strings.size(), 0);
  for (size_t ri = 0; ri < m.ranks.size(); ++ri) {
    auto& samples = by_rank[ri];
    if (samples.empty()) continue;
    std::stable_sort(samples.begin(), samples.end(),
                     [](const auto* a, const auto* b) { return a->ts_ns < b->ts_ns; });
    RankMetrics& rm = m.ranks[ri];
    std::vector<traces::NameId> names;
    double sum = 0, peak_sum = 0, peak_total = 0;
    bool has_total = false;
    for (size_t i = 0; i < samples.size();) {
      size_t j = i;
      for (; j < samples.size() && samples[j]->ts_ns == samples[i]->ts_ns; ++j) {
        const auto* c = samples[j];
        if (!seen[c->name]) {
          seen[c->name] = 1;
          names.push_back(c->name);
          peak_total = c->name == total_name ? c->value : peak_total;
          rm.peak_memory_bytes[t.strings.str(c->name)] = c->value;
        }
        double& peak = rm.peak_memory_bytes[t.strings.str(c->name)];
        peak = std::max(peak, c->value);
        if (c->name == total_name) {
          has_total = true;
          peak_total = std::max(peak_total, c->value);
        } else {
          sum += c->value - current[c->name];
          current[c->name] = c->value;
        }
      }
      peak_sum = std::max(peak_sum, sum);
      i = j;
    }
    rm.peak_memory_total_bytes = has_total ? peak_total : peak_sum;
    for (traces::NameId n : names) {
      seen[n] = 0;
      current[n] = 0;
    }
  }
  return m;
}

}  // namespace orrery::profiler
