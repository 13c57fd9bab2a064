// Name search over a trace too large to load, opened through its zoom levels (document.hpp): one
// pass over the file's span blocks (TraceReader::for_each_span_run), memory bounded by a block
// and the hits kept. Names match as in SpanSearch (case-insensitive substring, once per distinct
// name). Every match is counted and its time summed; the first `keep` in time order (start, rank,
// stream) are kept for next / previous, which the timeline reaches by zooming to them.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "orrery/gui/trace_index.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::gui {

struct FileSearchHit {
  int64_t start_ns = 0, end_ns = 0;
  int32_t rank = 0, stream = 0;
  uint32_t name = 0;
};

struct FileSearchResult {
  int64_t count = 0;                // every match in the file
  int64_t total_ns = 0;             // their summed durations
  std::vector<FileSearchHit> hits;  // the first `keep` by (start, rank, stream)
  bool cancelled = false;           // `cancel` was set: count and hits are partial
};

FileSearchResult search_file(const traces::TraceReader& reader, const traces::StringTable& strings,
                             const std::string& query, KindMask kinds, size_t keep,
                             const std::atomic<bool>* cancel = nullptr);

// Whether span `s` (in the string table `strings`) is the hit `h`: the key the timeline uses to
// find a hit among the spans of the window it loaded.
bool is_hit(const traces::Span& s, const FileSearchHit& h);

}  // namespace orrery::gui
