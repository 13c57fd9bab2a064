// The timeline of a trace too big to load (tens of millions of spans): zoomed out it draws a
// row from the trace's zoom levels (traces/zoom.hpp), the level whose buckets are about a pixel
// wide; zoomed in it loads only the spans of the visible window (load_window in document.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "orrery/gui/time_mapping.hpp"
#include "orrery/gui/trace_index.hpp"
#include "orrery/traces/zoom.hpp"

namespace orrery::gui {

// The coarsest level whose bucket is at most a pixel under `ns_per_px` (0 when even level 0 is
// wider: the view is then finer than the levels and should show the spans).
int zoom_level_for(const traces::ZoomGrid& g, double ns_per_px);

// One bucket as the folded block it draws: its spans' count, the instants they cover in it, the
// busy time per kind and the dominant kind.
FoldSummary bucket_summary(const traces::ZoomBucket& b);

// A thing to draw from buckets: a folded block, or (solid) the part of one span that covers it
// whole, drawn as that span (its name and kind's colour).
struct ZoomItem {
  FoldSummary fold;
  traces::NameId name = 0;
  bool solid = false;
};

// Draw items of a row's buckets (sorted, non-empty ones) under `m`: consecutive buckets merge
// while the item is narrower than min_px and the next starts less than min_px after it ends, and
// adjacent buckets each covered whole by the same name and kind merge into one solid item (a long
// span). Counts and times are sums of the buckets'. Appends to `out`.
void zoom_items(const std::vector<traces::ZoomBucket>& buckets, const TimeMapping& m, double min_px,
                std::vector<ZoomItem>& out);

}  // namespace orrery::gui
