// Gradient compression in a trace (see compression_metrics.hpp).
#include "orrery/profiler/compression_metrics.hpp"

#include <map>
#include <set>
#include <tuple>

namespace orrery::profiler {

namespace {

bool is_compressed_collective(const std::string& name) {
  return name == "ddp.int8_all_gather" || name == "ddp.topk_all_gather" ||
         name == "ddp.powersgd_p" || name == "ddp.powersgd_q" || name == "ddp.powersgd_vectors";
}

using BucketKey = std::tuple<int32_t, int32_t, int32_t>;  // rank, step, layer

}  // namespace

CompressionMetrics compression_metrics(const traces::Trace& t) {
  CompressionMetrics m;
  std::map<std::string, CompressedCollective> by_name;
  std::map<BucketKey, int64_t> raw, wire;
  std::map<BucketKey, std::set<std::string>> names_of;
  std::set<int32_t> ranks, steps;
  for (const auto& s : t.spans) {
    const std::string& name = t.name_of(s);
    const BucketKey key{s.rank, s.step, s.layer};
    if (s.kind == traces::SpanKind::Compute && name == "ddp.compress") {
      m.compress_ns += s.duration_ns();
      raw[key] += s.bytes;
    } else if (s.kind == traces::SpanKind::Compute && name == "ddp.decompress") {
      m.decompress_ns += s.duration_ns();
    } else if (s.kind == traces::SpanKind::Collective && is_compressed_collective(name)) {
      int64_t bytes = s.bytes;
      if (s.op == traces::CollOp::AllGather) {
        const traces::CommunicatorInfo* c = t.comm(s.comm);
        const int64_t size = c != nullptr && !c->ranks.empty() ? int64_t(c->ranks.size()) : 1;
        bytes /= size;
      }
      CompressedCollective& cc = by_name[name];
      cc.name = name;
      ++cc.calls;
      cc.wire_bytes += bytes;
      wire[key] += bytes;
      names_of[key].insert(name);
      ranks.insert(s.rank);
      steps.insert(s.step);
    }
  }
  for (const auto& [key, w] : wire) {
    const auto r = raw.find(key);
    const int64_t rb = r != raw.end() ? r->second : 0;
    ++m.buckets;
    m.raw_bytes += rb;
    m.wire_bytes += w;
    const auto& names = names_of[key];
    if (names.size() == 1) by_name[*names.begin()].raw_bytes += rb;
  }
  for (auto& [name, cc] : by_name) m.collectives.push_back(cc);
  m.ranks = int32_t(ranks.size());
  m.steps = int32_t(steps.size());
  return m;
}

}  // namespace orrery::profiler
