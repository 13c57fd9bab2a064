// Zoom levels to draw items (see zoom_view.hpp).
#include "orrery/gui/zoom_view.hpp"

namespace orrery::gui {

int zoom_level_for(const traces::ZoomGrid& g, double ns_per_px) {
  int level = 0;
  while (level < g.levels && static_cast<double>(g.bucket_ns(level + 1)) <= ns_per_px) ++level;
  return level;
}

FoldSummary bucket_summary(const traces::ZoomBucket& b) {
  FoldSummary f;
  f.count = static_cast<uint32_t>(b.count);
  f.start_ns = b.lo_ns;
  f.end_ns = b.hi_ns;
  f.kind_ns = b.kind_ns;
  f.busy_ns = b.busy_ns();
  f.dominant = b.dominant();
  return f;
}

namespace {

// Covered whole by one name and one kind: the middle of a span longer than the bucket.
bool solid(const traces::ZoomBucket& b) {
  const int64_t busy = b.busy_ns();
  return busy > 0 && busy == b.hi_ns - b.lo_ns && b.name_ns == busy &&
         b.kind_ns[static_cast<int>(b.dominant())] == busy;
}

void absorb(ZoomItem& into, const traces::ZoomBucket& b) {
  FoldSummary& f = into.fold;
  f.count += static_cast<uint32_t>(b.count);
  f.end_ns = std::max(f.end_ns, b.hi_ns);
  for (int k = 0; k < traces::kSpanKindCount; ++k) f.kind_ns[k] += b.kind_ns[k];
  f.busy_ns += b.busy_ns();
  int best = 0;
  for (int k = 1; k < traces::kSpanKindCount; ++k) {
    if (f.kind_ns[k] > f.kind_ns[best]) best = k;
  }
  f.dominant = static_cast<traces::SpanKind>(best);
}

}  // namespace

void zoom_items(const std::vector<traces::ZoomBucket>& buckets, const TimeMapping& m, double min_px,
                std::vector<ZoomItem>& out) {
  const double min_ns = min_px * m.ns_per_px;
  bool open = false;
  for (const auto& b : buckets) {
    if (open) {
      ZoomItem& cur = out.back();
      const bool both_solid = cur.solid && solid(b) && cur.name == b.name &&
                              cur.fold.dominant == b.dominant() && cur.fold.end_ns == b.lo_ns;
      const bool narrow = !cur.solid && !solid(b) &&
                          static_cast<double>(cur.fold.end_ns - cur.fold.start_ns) < min_ns &&
                          static_cast<double>(b.lo_ns - cur.fold.end_ns) < min_ns;
      if (both_solid || narrow) {
        absorb(cur, b);
        continue;
      }
    }
    out.push_back(ZoomItem{bucket_summary(b), b.name, solid(b)});
    open = true;
  }
}

}  // namespace orrery::gui
