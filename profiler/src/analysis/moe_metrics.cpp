// Mixture of experts in a trace (see moe_metrics.hpp).
#include "orrery/profiler/moe_metrics.hpp"

#include <algorithm>
#include <cstdio>

namespace orrery::profiler {

double MoeBlockLoad::total() const {
  double n = 0;
  for (double x : tokens) n += x;
  return n;
}

double MoeBlockLoad::imbalance() const {
  const double sum = total();
  if (tokens.empty() || sum <= 0) return 0;
  return *std::max_element(tokens.begin(), tokens.end()) / (sum / double(tokens.size()));
}

double MoeBlockLoad::dropped_fraction() const {
  const double sum = total();
  return sum > 0 ? dropped / sum : 0;
}

namespace {

// "moe.tokens[l=3,e=5]" -> (3, 5); "moe.dropped[l=3]" -> (3, -1); else false.
bool parse_counter(const std::string& name, int& layer, int& expert) {
  expert = -1;
  if (std::sscanf(name.c_str(), "moe.tokens[l=%d,e=%d]", &layer, &expert) == 2) return true;
  return name.rfind("moe.dropped[", 0) == 0 &&
         std::sscanf(name.c_str(), "moe.dropped[l=%d]", &layer) == 1;
}

std::vector<MoeBlockLoad> block_loads(const traces::Trace& t) {
  std::map<int, MoeBlockLoad> by_layer;
  for (const auto& c : t.counters) {
    int layer = 0, expert = -1;
    if (!parse_counter(t.strings.str(c.name), layer, expert)) continue;
    MoeBlockLoad& b = by_layer[layer];
    b.layer = layer;
    if (expert < 0) {
      b.dropped += c.value;
    } else {
      if (b.tokens.size() <= std::size_t(expert)) b.tokens.resize(std::size_t(expert) + 1, 0.0);
      b.tokens[std::size_t(expert)] += c.value;
    }
  }
  std::vector<MoeBlockLoad> out;
  for (auto& [l, b] : by_layer) out.push_back(std::move(b));
  return out;
}

}  // namespace

MoeAccumulator::MoeAccumulator(const traces::Trace& header) : t_(header) {
  for (const auto& c : header.counters) {
    int layer = 0, expert = -1;
    if (parse_counter(header.strings.str(c.name), layer, expert)) {
      moe_ = true;
      break;
    }
  }
}

void MoeAccumulator::add(const traces::Span& s) {
  if (s.kind == traces::SpanKind::Compute) {
    if (moe_) compute_[s.rank].push_back({s.start_ns, s.end_ns});
    return;
  }
  if (s.kind != traces::SpanKind::Collective || s.op != traces::CollOp::AllToAll) return;
  const std::string& name = t_.name_of(s);
  AllToAllStats& a = by_name_[name];
  a.name = name;
  ++a.calls;
  a.bytes += s.bytes;
  a.time_ns += s.duration_ns();
  if (const traces::CommunicatorInfo* c = t_.comm(s.comm); c != nullptr) {
    a.group_size = std::max(a.group_size, int(c->ranks.size()));
  }
  calls_[s.rank].push_back({name, {s.start_ns, s.end_ns}});
}

MoeMetrics MoeAccumulator::result() const {
  MoeMetrics m;
  std::map<std::string, AllToAllStats> by_name = by_name_;
  for (const auto& [rank, calls] : calls_) {
    const auto it = compute_.find(rank);
    const std::vector<Interval> compute =
        it != compute_.end() ? merge_intervals(it->second) : std::vector<Interval>{};
    for (const auto& c : calls) {
      const int64_t len = c.iv.end_ns - c.iv.start_ns;
      const int64_t exposed = len - intersection_length({c.iv}, compute);
      by_name[c.name].exposed_ns += exposed;
      m.all_to_all_ns += len;
      m.exposed_ns += exposed;
    }
  }
  for (auto& [name, a] : by_name) m.all_to_alls.push_back(a);
  m.blocks = block_loads(t_);
  return m;
}

MoeMetrics moe_metrics(const traces::Trace& t) {
  MoeAccumulator acc(t);
  for (const auto& s : t.spans) acc.add(s);
  return acc.result();
}

}  // namespace orrery::profiler
