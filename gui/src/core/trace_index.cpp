// Lanes and rows of a trace for the timeline, and the folding of narrow spans (see the header).
#include "orrery/gui/trace_index.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

namespace orrery::gui {
namespace {

// The row's per-kind running sums of durations, for the kinds it has.
void build_kind_time(LaneRow& row) {
  KindMask present = 0;
  for (uint8_t k : row.kind) present |= 1u << k;
  const size_t n = row.size();
  for (int k = 0; k < traces::kSpanKindCount; ++k) {
    if (!(present & (1u << k))) continue;
    LaneRow::KindTime kt;
    kt.kind = static_cast<traces::SpanKind>(k);
    kt.prefix_ns.resize(n + 1);
    int64_t sum = 0;
    kt.prefix_ns[0] = 0;
    for (size_t i = 0; i < n; ++i) {
      if (row.kind[i] == k) sum += row.end_ns[i] - row.start_ns[i];
      kt.prefix_ns[i + 1] = sum;
    }
    row.kind_time.push_back(std::move(kt));
  }
}

}  // namespace

TraceIndex::TraceIndex(const traces::Trace& t, KindMask kinds) : kinds_(kinds) {
  const auto& spans = t.spans;
  row_of_.assign(spans.size(), -1);

  // Lanes: every (rank, stream) that has a span or a StreamInfo, in order.
  std::map<std::pair<int32_t, int32_t>, std::string> lane_names;
  for (const auto& s : t.streams) lane_names[{s.rank, s.stream}] = s.name;
  std::pair<int32_t, int32_t> last{INT32_MIN, INT32_MIN};
  for (const auto& s : spans) {
    if (std::pair{s.rank, s.stream} == last)
      continue;  // spans come grouped by lane: one lookup per run
    last = {s.rank, s.stream};
    lane_names.try_emplace(last, std::string());
  }
  std::map<std::pair<int32_t, int32_t>, size_t> lane_pos;
  for (auto& [key, name] : lane_names) {
    Lane lane;
    lane.rank = key.first;
    lane.stream = key.second;
    lane.name = name.empty() ? "stream " + std::to_string(key.second) : name;
    lane_pos[key] = lanes_.size();
    lanes_.push_back(std::move(lane));
  }

  // Span order: the trace's (rank, stream, start) order when it is sorted, which load_trace gives.
  std::vector<uint32_t> order;
  auto key_less = [&](uint32_t a, uint32_t b) {
    const auto& x = spans[a];
    const auto& y = spans[b];
    if (x.rank != y.rank) return x.rank < y.rank;
    if (x.stream != y.stream) return x.stream < y.stream;
    if (x.start_ns != y.start_ns) return x.start_ns < y.start_ns;
    return x.end_ns > y.end_ns;
  };
  bool sorted = true;
  for (size_t i = 1; i < spans.size() && sorted; ++i) {
    if (key_less(static_cast<uint32_t>(i), static_cast<uint32_t>(i - 1))) sorted = false;
  }
  if (!sorted) {
    order.resize(spans.size());
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), key_less);
  }

  bool any = false;
  int64_t lo = 0, hi = 1;
  Lane* lane = nullptr;
  std::pair<int32_t, int32_t> lane_key{INT32_MIN, INT32_MIN};
  std::vector<int64_t> row_last_end;  // end of the last span placed in each row of the lane
  for (size_t n = 0; n < spans.size(); ++n) {
    const uint32_t i = sorted ? static_cast<uint32_t>(n) : order[n];
    const auto& s = spans[i];
    if (!any) {
      lo = s.start_ns;
      hi = s.end_ns;
      any = true;
    }
    lo = std::min(lo, s.start_ns);
    hi = std::max(hi, s.end_ns);
    if (!(kinds & kind_bit(s.kind))) continue;
    if (lane_key != std::pair{s.rank, s.stream}) {
      lane_key = {s.rank, s.stream};
      lane = &lanes_[lane_pos.at(lane_key)];
      row_last_end.clear();
    }
    // Greedy interval colouring: the first row whose last span has ended. Spans are sorted by start
    // with enclosing spans first, so a nested span lands one row below its parent.
    size_t r = 0;
    while (r < row_last_end.size() && row_last_end[r] > s.start_ns) ++r;
    if (r >= static_cast<size_t>(kMaxRows)) r = kMaxRows - 1;
    if (r == row_last_end.size()) {
      row_last_end.push_back(s.end_ns);
      lane->rows.emplace_back();
    }
    LaneRow& row = lane->rows[r];
    const bool overlaps = !row.end_ns.empty() && row_last_end[r] > s.start_ns;
    if (overlaps && row.max_end_ns.empty()) {
      // First overlap in the overflow row: from here on keep a running max of the ends.
      row.max_end_ns.resize(row.end_ns.size());
      int64_t m = INT64_MIN;
      for (size_t k = 0; k < row.end_ns.size(); ++k)
        row.max_end_ns[k] = m = std::max(m, row.end_ns[k]);
    }
    row.start_ns.push_back(s.start_ns);
    row.end_ns.push_back(s.end_ns);
    if (!row.max_end_ns.empty()) {
      row.max_end_ns.push_back(std::max(row.max_end_ns.back(), s.end_ns));
    }
    row.span.push_back(i);
    row.kind.push_back(static_cast<uint8_t>(s.kind));
    row_last_end[r] = std::max(row_last_end[r], s.end_ns);
    row_of_[i] = static_cast<int8_t>(r);
    ++lane->span_count;
    ++span_count_;
  }
  for (auto& l : lanes_) {
    for (auto& row : l.rows) build_kind_time(row);
  }
  start_ns_ = lo;
  end_ns_ = any ? std::max(hi, lo + 1) : 1;
}

TraceIndex::TraceIndex(const traces::Trace& header, const std::vector<traces::ZoomLane>& zoom,
                       int64_t t0_ns, int64_t t1_ns)
    : start_ns_(t0_ns), end_ns_(std::max(t1_ns, t0_ns + 1)) {
  std::map<std::pair<int32_t, int32_t>, std::string> lane_names;
  for (const auto& s : header.streams) lane_names[{s.rank, s.stream}] = s.name;
  for (const auto& z : zoom) lane_names.try_emplace({z.rank, z.stream}, std::string());
  for (auto& [key, name] : lane_names) {
    Lane lane;
    lane.rank = key.first;
    lane.stream = key.second;
    lane.name = name.empty() ? "stream " + std::to_string(key.second) : name;
    lanes_.push_back(std::move(lane));
  }
  pad_rows(zoom);
  for (const auto& z : zoom) {
    const int l = lane_of(z.rank, z.stream);
    lanes_[static_cast<size_t>(l)].span_count = static_cast<size_t>(z.spans);
    span_count_ += static_cast<size_t>(z.spans);
  }
}

void TraceIndex::pad_rows(const std::vector<traces::ZoomLane>& zoom) {
  for (const auto& z : zoom) {
    const int l = lane_of(z.rank, z.stream);
    if (l < 0) continue;
    auto& rows = lanes_[static_cast<size_t>(l)].rows;
    if (rows.size() < static_cast<size_t>(z.rows)) rows.resize(static_cast<size_t>(z.rows));
  }
}

int TraceIndex::lane_of(int32_t rank, int32_t stream) const {
  auto it = std::lower_bound(lanes_.begin(), lanes_.end(), std::pair{rank, stream},
                             [](const Lane& l, const std::pair<int32_t, int32_t>& k) {
                               return std::pair{l.rank, l.stream} < k;
                             });
  if (it == lanes_.end() || it->rank != rank || it->stream != stream) return -1;
  return static_cast<int>(it - lanes_.begin());
}

void fold_row(const LaneRow& row, const TimeMapping& m, double width_px, double min_px,
              std::vector<DrawItem>& out) {
  if (row.size() == 0) return;
  const auto& ends = row.search_end();
  const int64_t t0 = m.t_floor(0);
  const int64_t t1 = m.t_ceil(width_px);
  const double min_ns = min_px * m.ns_per_px;
  // Visible spans: [i, n) with i the first that ends after t0 (the running max makes this exact in
  // the overflow row too) and n the first that starts at or after t1 (starts are sorted in any row).
  const size_t n = static_cast<size_t>(
      std::lower_bound(row.start_ns.begin(), row.start_ns.end(), t1) - row.start_ns.begin());
  size_t i = static_cast<size_t>(
      std::upper_bound(ends.begin(), ends.begin() + static_cast<ptrdiff_t>(n), t0) - ends.begin());
  while (i < n) {
    const int64_t dur = row.end_ns[i] - row.start_ns[i];
    if (static_cast<double>(dur) >= min_ns) {
      out.push_back({row.start_ns[i], row.end_ns[i], static_cast<uint32_t>(i), 1});
      ++i;
      continue;
    }
    const int64_t g_start = row.start_ns[i];
    int64_t g_end = row.end_ns[i];
    size_t k = i + 1;
    while (k < n) {
      const double limit = static_cast<double>(g_end) + min_ns;
      // Every span that ends before the limit is within min_px of the run: skip them all at once.
      const auto lim = static_cast<int64_t>(std::ceil(limit));
      const size_t j =
          static_cast<size_t>(std::lower_bound(ends.begin() + static_cast<ptrdiff_t>(k),
                                               ends.begin() + static_cast<ptrdiff_t>(n), lim) -
                              ends.begin());
      if (j > k) {
        g_end = std::max(g_end, ends[j - 1]);
        k = j;
        continue;
      }
      // The next span ends past the limit: take it only if it starts before the limit and is narrow.
      const int64_t next_dur = row.end_ns[k] - row.start_ns[k];
      if (static_cast<double>(row.start_ns[k]) < limit && static_cast<double>(next_dur) < min_ns) {
        g_end = std::max(g_end, row.end_ns[k]);
        ++k;
        continue;
      }
      break;
    }
    out.push_back({g_start, g_end, static_cast<uint32_t>(i), static_cast<uint32_t>(k - i)});
    i = k;
  }
}

FoldSummary summarize(const LaneRow& row, const DrawItem& item) {
  FoldSummary f;
  f.count = item.count;
  f.start_ns = item.start_ns;
  f.end_ns = item.end_ns;
  const size_t a = item.first, b = static_cast<size_t>(item.first) + item.count;
  if (b > row.size() || a >= b) return f;
  int64_t best = -1;
  for (const auto& kt : row.kind_time) {
    const int64_t ns = kt.prefix_ns[b] - kt.prefix_ns[a];
    f.kind_ns[static_cast<size_t>(kt.kind)] = ns;
    f.busy_ns += ns;
    if (ns > best) {  // kind_time is in SpanKind order, so a tie keeps the lower kind
      best = ns;
      f.dominant = kt.kind;
    }
  }
  f.busy_ns = std::min(f.busy_ns, f.end_ns - f.start_ns);
  return f;
}

int64_t span_at(const LaneRow& row, int64_t t_ns) {
  const auto& ends = row.search_end();
  size_t i = static_cast<size_t>(std::upper_bound(ends.begin(), ends.end(), t_ns) - ends.begin());
  for (; i < row.size() && row.start_ns[i] <= t_ns; ++i) {
    if (row.end_ns[i] > t_ns) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace orrery::gui
