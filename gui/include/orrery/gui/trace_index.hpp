// The timeline's view of a trace: one lane per (rank, stream), each split into rows so that spans in
// a row never overlap (nested phases go one row down), and the folding of spans too narrow to draw.
//
// Tracy's approach: spans are sorted per row, the first visible span is found by binary search on
// the end times, and a run of spans narrower than a few pixels is drawn as one counted block; the
// run is skipped by binary search too, so a frame costs O(pixels x log n) whatever the zoom.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "orrery/gui/time_mapping.hpp"
#include "orrery/traces/trace.hpp"
#include "orrery/traces/zoom.hpp"

namespace orrery::gui {

// Spans of one row of a lane, structure-of-arrays, sorted by start.
struct LaneRow {
  std::vector<int64_t> start_ns;
  std::vector<int64_t> end_ns;
  // Running maximum of end_ns; filled only for the overflow row, where spans may overlap (in every
  // other row end_ns is already sorted and is searched directly).
  std::vector<int64_t> max_end_ns;
  std::vector<uint32_t> span;  // index into Trace::spans
  std::vector<uint8_t> kind;   // the span's SpanKind
  // Per kind present in the row, the running sum of its spans' durations: prefix_ns[i] is the time
  // of that kind's spans among the row's first i spans (size() + 1 entries). A folded block's time
  // per kind is then two look-ups, so colouring blocks by their time keeps a frame O(pixels).
  struct KindTime {
    traces::SpanKind kind = traces::SpanKind::Other;
    std::vector<int64_t> prefix_ns;
  };
  std::vector<KindTime> kind_time;

  size_t size() const { return start_ns.size(); }
  const std::vector<int64_t>& search_end() const {
    return max_end_ns.empty() ? end_ns : max_end_ns;
  }
};

struct Lane {
  int32_t rank = 0;
  int32_t stream = 0;
  std::string name;  // the stream's name ("compute", "comm", ...)
  std::vector<LaneRow> rows;
  size_t span_count = 0;
};

// Bit i set = SpanKind i shown.
using KindMask = uint32_t;
inline constexpr KindMask kAllKinds = (1u << traces::kSpanKindCount) - 1;
inline constexpr KindMask kind_bit(traces::SpanKind k) { return 1u << static_cast<int>(k); }

class TraceIndex {
 public:
  // Nesting deeper than this shares the last row (which then keeps a running max of the ends).
  static constexpr int kMaxRows = 12;

  TraceIndex() = default;
  // Indexes the spans of `t` whose kind is in `kinds`. Lanes are ordered by (rank, stream); every
  // stream listed in t.streams gets a lane even when it has no span.
  explicit TraceIndex(const traces::Trace& t, KindMask kinds = kAllKinds);

  // The lanes of a trace drawn from its zoom levels: every stream of `header` and every lane of
  // `zoom`, each with the zoom's number of rows, all empty (no spans loaded), over [t0, t1).
  TraceIndex(const traces::Trace& header, const std::vector<traces::ZoomLane>& zoom, int64_t t0_ns,
             int64_t t1_ns);
  // Gives each lane of `zoom` at least its number of rows (empty ones), so that a window of the
  // spans lays out as the zoomed-out view does.
  void pad_rows(const std::vector<traces::ZoomLane>& zoom);

  const std::vector<Lane>& lanes() const { return lanes_; }
  int lane_of(int32_t rank, int32_t stream) const;  // -1 when absent
  // Earliest start and latest end over all spans (of every kind), 0 and 1 for an empty trace.
  int64_t start_ns() const { return start_ns_; }
  int64_t end_ns() const { return end_ns_; }
  KindMask kinds() const { return kinds_; }
  size_t span_count() const { return span_count_; }
  // Row of a span within its lane, or -1 when the span is filtered out.
  int row_of(uint32_t span) const { return span < row_of_.size() ? row_of_[span] : -1; }

 private:
  std::vector<Lane> lanes_;
  std::vector<int8_t> row_of_;
  int64_t start_ns_ = 0, end_ns_ = 1;
  KindMask kinds_ = kAllKinds;
  size_t span_count_ = 0;
};

// One thing to draw in a row: a span (count == 1) or a folded run of `count` spans.
struct DrawItem {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  uint32_t first = 0;  // index into the row's arrays of the first span
  uint32_t count = 0;
};

// Draw items of `row` over [0, width_px] under `m`. A span at least min_px wide is its own item; a
// narrower one starts a run that takes in every following span that ends less than min_px after the
// run's end, and every narrow span that starts before that limit; the run ends at the first span
// that is wide or starts later. Appends to `out`.
void fold_row(const LaneRow& row, const TimeMapping& m, double width_px, double min_px,
              std::vector<DrawItem>& out);

// What a draw item stands for: its spans' count, their time per kind, the busy time (the spans'
// summed durations, at most the item's length: spans of a row do not overlap, except in the
// overflow row) and the kind that covers most of that time (ties go to the lower SpanKind).
struct FoldSummary {
  uint32_t count = 0;
  int64_t start_ns = 0, end_ns = 0;
  int64_t busy_ns = 0;
  std::array<int64_t, traces::kSpanKindCount> kind_ns{};
  traces::SpanKind dominant = traces::SpanKind::Other;
  // busy_ns over the item's length, in [0, 1].
  double busy_fraction() const {
    return end_ns > start_ns ? static_cast<double>(busy_ns) / static_cast<double>(end_ns - start_ns)
                             : 1.0;
  }
};
FoldSummary summarize(const LaneRow& row, const DrawItem& item);

// The first span of `row` whose [start, end) contains t, searching from the last span that starts
// at or before t; -1 when none. Used for hit tests below the folding threshold.
int64_t span_at(const LaneRow& row, int64_t t_ns);

}  // namespace orrery::gui
