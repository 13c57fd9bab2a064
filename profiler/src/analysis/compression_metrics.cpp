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

}  // namespace

CompressionAccumulator::CompressionAccumulator(const traces::Trace& header) : t_(header) {}

void CompressionAccumulator::add(const traces::Span& s) {
  const std::string& name = t_.name_of(s);
  const BucketKey key{s.rank, s.step, s.layer};
  if (s.kind == traces::SpanKind::Compute && name == "ddp.compress") {
    m_.compress_ns += s.duration_ns();
    raw_[key] += s.bytes;
  } else if (s.kind == traces::SpanKind::Compute && name == "ddp.decompress") {
    m_.decompress_ns += s.duration_ns();
  } else if (s.kind == traces::SpanKind::Collective && is_compressed_collective(name)) {
    int64_t bytes = s.bytes;
    if (s.op == traces::CollOp::AllGather) {
      const traces::CommunicatorInfo* c = t_.comm(s.comm);
      const int64_t size = c != nullptr && !c->ranks.empty() ? int64_t(c->ranks.size()) : 1;
      bytes /= size;
    }
    CompressedCollective& cc = by_name_[name];
    cc.name = name;
    ++cc.calls;
    cc.wire_bytes += bytes;
    wire_[key] += bytes;
    names_of_[key].insert(name);
    ranks_.insert(s.rank);
    steps_.insert(s.step);
  }
}

CompressionMetrics CompressionAccumulator::result() const {
  CompressionMetrics m = m_;
  std::map<std::string, CompressedCollective> by_name = by_name_;
  for (const auto& [key, w] : wire_) {
    const auto r = raw_.find(key);
    const int64_t rb = r != raw_.end() ? r->second : 0;
    ++m.buckets;
    m.raw_bytes += rb;
    m.wire_bytes += w;
    const auto& names = names_of_.at(key);
    if (names.size() == 1) by_name[*names.begin()].raw_bytes += rb;
  }
  for (auto& [name, cc] : by_name) m.collectives.push_back(cc);
  m.ranks = int32_t(ranks_.size());
  m.steps = int32_t(steps_.size());
  return m;
}

CompressionMetrics compression_metrics(const traces::Trace& t) {
  CompressionAccumulator acc(t);
  for (const auto& s : t.spans) acc.add(s);
  return acc.result();
}

}  // namespace orrery::profiler
