// Name search over a trace file's span blocks (see file_search.hpp).
#include "orrery/gui/file_search.hpp"

#include <algorithm>
#include <cctype>
#include <queue>

namespace orrery::gui {
namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool earlier(const FileSearchHit& a, const FileSearchHit& b) {
  if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
  if (a.rank != b.rank) return a.rank < b.rank;
  return a.stream < b.stream;
}

struct Cancelled {};

}  // namespace

FileSearchResult search_file(const traces::TraceReader& reader, const traces::StringTable& strings,
                             const std::string& query, KindMask kinds, size_t keep,
                             const std::atomic<bool>* cancel) {
  FileSearchResult out;
  if (query.empty()) return out;
  const std::string q = lower(query);
  std::vector<char> name_hit(strings.size(), 0);
  for (size_t i = 0; i < strings.size(); ++i)
    name_hit[i] = lower(strings.all()[i]).find(q) != std::string::npos;
  // The latest of the hits kept on top, so a run's earlier match replaces it.
  std::priority_queue<FileSearchHit, std::vector<FileSearchHit>, decltype(&earlier)> kept(earlier);
  try {
    reader.for_each_span_run([&](std::span<const traces::Span> run) {
      if (cancel && cancel->load(std::memory_order_relaxed)) throw Cancelled{};
      for (const traces::Span& s : run) {
        if (s.name >= name_hit.size() || !name_hit[s.name] || !(kinds & kind_bit(s.kind))) continue;
        ++out.count;
        out.total_ns += s.duration_ns();
        const FileSearchHit h{s.start_ns, s.end_ns, s.rank, s.stream, s.name};
        if (kept.size() < keep) {
          kept.push(h);
        } else if (keep > 0 && earlier(h, kept.top())) {
          kept.pop();
          kept.push(h);
        }
      }
    });
  } catch (const Cancelled&) {
    out.cancelled = true;
  }
  out.hits.reserve(kept.size());
  while (!kept.empty()) {
    out.hits.push_back(kept.top());
    kept.pop();
  }
  std::reverse(out.hits.begin(), out.hits.end());
  return out;
}

bool is_hit(const traces::Span& s, const FileSearchHit& h) {
  return s.start_ns == h.start_ns && s.end_ns == h.end_ns && s.rank == h.rank &&
         s.stream == h.stream && s.name == h.name;
}

}  // namespace orrery::gui
