// The in-memory trace: string interning, communicator lookup and the canonical span order.
#include "orrery/traces/trace.hpp"

#include <algorithm>
#include <cstdint>

namespace orrery::traces {

NameId StringTable::intern(std::string_view s) {
  // Heterogeneous lookup needs C++20 transparent hashing; one temporary string per call is cheap
  // next to a span's SQLite write, and interning is not on the per-span path of hot callers.
  auto key = std::string(s);
  auto it = index_.find(key);
  if (it != index_.end()) return it->second;
  const auto id = static_cast<NameId>(strings_.size());
  strings_.push_back(key);
  index_.emplace(std::move(key), id);
  return id;
}

NameId StringTable::find(std::string_view s) const {
  auto it = index_.find(std::string(s));
  return it == index_.end() ? UINT32_MAX : it->second;
}

const CommunicatorInfo* Trace::comm(int32_t id) const {
  for (const auto& c : comms) {
    if (c.id == id) return &c;
  }
  return nullptr;
}

void Trace::sort_spans() {
  // Stable, so spans with equal starts keep their recorded order: the order TraceReader::load_all()
  // returns (the store breaks ties by arrival), so sort -> write -> load is the identity.
  std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    if (a.stream != b.stream) return a.stream < b.stream;
    return a.start_ns < b.start_ns;
  });
}

}  // namespace orrery::traces
