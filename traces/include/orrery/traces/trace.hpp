// In-memory trace: the whole content of a trace file, as the metrics, exporters and GUI use it.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "orrery/traces/span.hpp"

namespace orrery::traces {

// Interned strings: span and counter names are stored once and referred to by NameId.
class StringTable {
 public:
  NameId intern(std::string_view s);
  const std::string& str(NameId id) const { return strings_.at(id); }
  size_t size() const { return strings_.size(); }
  const std::vector<std::string>& all() const { return strings_; }
  // Returns the id of `s` if interned, or UINT32_MAX.
  NameId find(std::string_view s) const;

 private:
  std::vector<std::string> strings_;
  std::unordered_map<std::string, NameId> index_;
};

struct Trace {
  std::string path;  // file it was loaded from, when any
  RunMeta meta;
  std::vector<RankInfo> ranks;
  std::vector<StreamInfo> streams;
  std::vector<CommunicatorInfo> comms;
  StringTable strings;
  std::vector<Span> spans;  // sorted by (rank, stream, start_ns) after load / sort_spans()
  std::vector<CounterSample> counters;

  const std::string& name_of(const Span& s) const { return strings.str(s.name); }
  const CommunicatorInfo* comm(int32_t id) const;
  void sort_spans();
};

}  // namespace orrery::traces
