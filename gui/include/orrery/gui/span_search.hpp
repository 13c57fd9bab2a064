// Search of spans by name (case-insensitive substring), in time order, with next/previous.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "orrery/gui/trace_index.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::gui {

class SpanSearch {
 public:
  // Matches among the spans of `t` whose kind is in `kinds`, ordered by (start, rank, stream).
  // Names are matched once per distinct name, so a search over millions of spans is one pass.
  void run(const traces::Trace& t, const std::string& query, KindMask kinds = kAllKinds);
  void clear();

  const std::vector<uint32_t>& matches() const { return matches_; }
  size_t size() const { return matches_.size(); }
  // Position of the current match, -1 before the first next()/previous().
  int64_t current() const { return current_; }
  // Moves to the next / previous match (wrapping) and returns its span index; -1 when none.
  int64_t next();
  int64_t previous();
  // Moves to the first match that starts at or after t (wrapping to the first); -1 when none.
  int64_t first_at_or_after(int64_t t_ns);

 private:
  const traces::Trace* trace_ = nullptr;
  std::vector<uint32_t> matches_;
  int64_t current_ = -1;
};

}  // namespace orrery::gui
