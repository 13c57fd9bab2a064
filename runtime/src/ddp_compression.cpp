// Gradient compression as a DDP communication hook (see ddp_compression.hpp).
#include "orrery/runtime/ddp_compression.hpp"

#include <algorithm>
#include <cstring>

#include "orrery/common/error.hpp"
#include "orrery/model/compression.hpp"
#include "orrery/model/names.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/compression.hpp"
#include "orrery/runtime/ddp.hpp"

namespace orrery::runtime {

namespace names = model::names;
namespace cz = compression;

namespace {

bool powersgd_compresses(const GradMatrix& m, int rank) {
  return model::powersgd_compresses(m.rows, m.cols, rank);
}

bool inside(const GradMatrix& m, const ParamRange& r) {
  return m.offset >= r.offset && m.offset + m.rows * m.cols <= r.end();
}

// Q's first value: uniform in [-1, 1) from a counter (splitmix64), the same on every rank.
float seeded_uniform(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<float>(static_cast<double>(x >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

}  // namespace

// One bucket's compression state.
struct CompressionHook::Bucket {
  int index = 0;
  ParamRange range;
  int32_t step = -1, micro_batch = -1, layer = -1;
  std::vector<float> residual;        // (n) error feedback
  std::vector<float> sent;            // (n) keep_sent only
  std::vector<uint8_t> send;          // this rank's wire payload
  std::vector<uint8_t> recv;          // (dp * payload) the gathered payloads
  std::vector<GradMatrix> matrices;   // PowerSGD: offsets relative to the bucket
  std::vector<std::vector<float>> q;  // PowerSGD: (cols x r) per matrix, warm-started
  std::vector<std::pair<std::size_t, std::size_t>> plain;  // PowerSGD: uncompressed [begin, end)
  std::vector<float> plain_buf;                            // their concatenation
  Handle h;
  std::size_t payload = 0;  // closed form, bytes
};

CompressionScheme compression_scheme_of(const std::string& name) {
  if (name == "none") return CompressionScheme::None;
  if (name == "int8") return CompressionScheme::Int8;
  if (name == "topk") return CompressionScheme::TopK;
  if (name == "powersgd") return CompressionScheme::PowerSgd;
  throw InputError("key 'parallel.grad_compression': expected none, int8, powersgd or topk, got '" +
                   name + "'");
}

std::vector<GradMatrix> grad_matrices(const Gpt& model) {
  std::vector<GradMatrix> out;
  for (const auto& t : model.tensors) {
    if (t.rows > 1 && t.cols > 1) {
      out.push_back({t.offset, static_cast<std::size_t>(t.rows), static_cast<std::size_t>(t.cols)});
    }
  }
  return out;
}

std::size_t compressed_bucket_bytes(const CompressionOptions& opt, const ParamRange& bucket,
                                    const std::vector<GradMatrix>& matrices) {
  const std::size_t n = bucket.count;
  switch (opt.scheme) {
    case CompressionScheme::None:
      return n * sizeof(float);
    case CompressionScheme::Int8:
      return cz::int8_payload_bytes(n, kInt8ChunkElems);
    case CompressionScheme::TopK:
      return cz::topk_payload_bytes(n, opt.topk_ratio);
    case CompressionScheme::PowerSgd: {
      std::size_t bytes = 0, covered = 0;
      for (const auto& m : matrices) {
        if (!inside(m, bucket) || !powersgd_compresses(m, opt.powersgd_rank)) continue;
        bytes += cz::powersgd_payload_bytes(m.rows, m.cols, opt.powersgd_rank);
        covered += m.rows * m.cols;
      }
      return bytes + (n - covered) * sizeof(float);
    }
  }
  return 0;
}

CompressionHook::CompressionHook(const CompressionOptions& opt,
                                 const std::vector<DdpBucket>& buckets,
                                 const std::vector<GradMatrix>& matrices, float* grads,
                                 Communicator& dp, profiler::Recorder* rec,
                                 const GradStaging* staging)
    : opt_(opt), grads_(grads), dp_(dp), rec_(rec != nullptr && rec->enabled() ? rec : nullptr) {
  if (opt_.scheme == CompressionScheme::None) {
    throw InternalError("CompressionHook: scheme none needs no hook");
  }
  if (staging != nullptr) {
    // The kernels below run on a host copy as long as the array the buckets reach into.
    std::size_t end = 0;
    for (const auto& b : buckets) end = std::max(end, b.range.end());
    staging_ = *staging;
    device_grads_ = grads;
    host_grads_.assign(end, 0.0f);
    grads_ = host_grads_.data();
  }
  std::size_t max_n = 0;
  for (const auto& b : buckets) {
    Bucket st;
    st.index = b.index;
    st.range = b.range;
    st.layer = b.lowest_layer;
    st.residual.assign(b.range.count, 0.0f);
    if (opt_.keep_sent) st.sent.assign(b.range.count, 0.0f);
    st.payload = compressed_bucket_bytes(opt_, b.range, matrices);
    max_n = std::max(max_n, b.range.count);
    if (opt_.scheme == CompressionScheme::PowerSgd) {
      std::size_t at = 0;  // matrices in memory order within the bucket; the rest is plain
      std::vector<GradMatrix> in;
      for (const auto& m : matrices) {
        if (inside(m, b.range) && powersgd_compresses(m, opt_.powersgd_rank)) in.push_back(m);
      }
      std::sort(in.begin(), in.end(),
                [](const GradMatrix& a, const GradMatrix& c) { return a.offset < c.offset; });
      std::size_t plain_n = 0;
      for (const auto& m : in) {
        GradMatrix rel{m.offset - b.range.offset, m.rows, m.cols};
        if (rel.offset > at) st.plain.emplace_back(at, rel.offset);
        plain_n += rel.offset - at;
        at = rel.offset + m.rows * m.cols;
        const std::size_t r = std::min<std::size_t>(static_cast<std::size_t>(opt_.powersgd_rank),
                                                    std::min(m.rows, m.cols));
        std::vector<float> q(m.cols * r);
        for (std::size_t i = 0; i < q.size(); ++i) q[i] = seeded_uniform((m.offset << 20) + i);
        st.q.push_back(std::move(q));
        st.matrices.push_back(rel);
      }
      if (at < b.range.count) st.plain.emplace_back(at, b.range.count);
      plain_n += b.range.count - at;
      st.plain_buf.resize(plain_n);
    } else {
      st.send.resize(st.payload);
      st.recv.resize(st.payload * static_cast<std::size_t>(dp_.size()));
    }
    buckets_.push_back(std::move(st));
  }
  if (opt_.scheme == CompressionScheme::Int8) scratch_.resize(max_n);
}

CompressionHook::~CompressionHook() = default;

void CompressionHook::span(const char* name, const Bucket& st, int64_t bytes,
                           int64_t start_ns) const {
  if (rec_ == nullptr) return;
  traces::Span s;
  s.kind = traces::SpanKind::Compute;
  s.name = rec_->intern(name);
  s.step = st.step;
  s.micro_batch = st.micro_batch;
  s.layer = st.layer;
  s.bytes = bytes;
  s.start_ns = start_ns;
  s.end_ns = profiler::steady_now_ns();
  s.stream = profiler::Recorder::thread_stream();
  rec_->record(s);
}

void CompressionHook::stage_in(const Bucket& st) {
  if (device_grads_ == nullptr) return;
  staging_.download(grads_ + st.range.offset, device_grads_ + st.range.offset, st.range.count);
}

void CompressionHook::stage_out(const Bucket& st) {
  if (device_grads_ == nullptr) return;
  staging_.upload(device_grads_ + st.range.offset, grads_ + st.range.offset, st.range.count);
}

void CompressionHook::issue(const DdpBucket& b, const OpLabel& label) {
  Bucket& st = buckets_.at(static_cast<std::size_t>(b.index));
  st.step = label.step;
  st.micro_batch = label.micro_batch;
  switch (opt_.scheme) {
    case CompressionScheme::Int8:
      issue_int8(st, label);
      break;
    case CompressionScheme::TopK:
      issue_topk(st, label);
      break;
    case CompressionScheme::PowerSgd:
      run_powersgd(st, label);
      break;
    case CompressionScheme::None:
      break;
  }
}

// Payload [codes (n int8) | scales (ceil(n / chunk) fp32)], all-gathered.
void CompressionHook::issue_int8(Bucket& st, const OpLabel& label) {
  const int64_t t0 = rec_ != nullptr ? profiler::steady_now_ns() : 0;
  stage_in(st);
  const std::size_t n = st.range.count;
  float* g = grads_ + st.range.offset;
  auto* codes = reinterpret_cast<int8_t*>(st.send.data());
  const std::size_t chunks = (n + kInt8ChunkElems - 1) / kInt8ChunkElems;
  std::vector<float> scales(chunks);
  cz::int8_compress(g, st.residual.data(), n, kInt8ChunkElems, codes, scales.data(),
                    scratch_.data());
  std::memcpy(st.send.data() + n, scales.data(), chunks * sizeof(float));
  if (opt_.keep_sent) std::copy(scratch_.begin(), scratch_.begin() + n, st.sent.begin());
  span(names::kDpCompress.data(), st, static_cast<int64_t>(n * sizeof(float)), t0);
  OpLabel l = label;
  l.name = names::kDpInt8AllGather;
  st.h = dp_.all_gather(st.send.data(), st.recv.data(), st.payload, DType::U8, l);
  pending_.push_back(st.index);
}

// Payload [k uint32 indices | k fp32 values], all-gathered.
void CompressionHook::issue_topk(Bucket& st, const OpLabel& label) {
  const int64_t t0 = rec_ != nullptr ? profiler::steady_now_ns() : 0;
  stage_in(st);
  const std::size_t n = st.range.count;
  const float* g = grads_ + st.range.offset;
  std::vector<uint32_t> index;
  std::vector<float> value;
  cz::topk_compress(g, st.residual.data(), n, opt_.topk_ratio, index, value);
  const std::size_t k = index.size();
  std::memcpy(st.send.data(), index.data(), k * sizeof(uint32_t));
  std::memcpy(st.send.data() + k * sizeof(uint32_t), value.data(), k * sizeof(float));
  if (opt_.keep_sent) {
    std::fill(st.sent.begin(), st.sent.end(), 0.0f);
    cz::topk_scatter_add(index, value, st.sent.data());
  }
  span(names::kDpCompress.data(), st, static_cast<int64_t>(n * sizeof(float)), t0);
  OpLabel l = label;
  l.name = names::kDpTopkAllGather;
  st.h = dp_.all_gather(st.send.data(), st.recv.data(), st.payload, DType::U8, l);
  pending_.push_back(st.index);
}

// Each compressed matrix: P and Q all-reduced (mean) inside powersgd_step; then the plain entries
// in one all-reduce. The compute between the collectives is recorded as "ddp.compress" spans (one
// per stretch between two all-reduces; the bucket's first carries its uncompressed bytes), the
// plain entries' copy back as "ddp.decompress".
void CompressionHook::run_powersgd(Bucket& st, const OpLabel& label) {
  float* g = grads_ + st.range.offset;
  const int64_t raw = static_cast<int64_t>(st.range.count * sizeof(float));
  int64_t t_open = rec_ != nullptr ? profiler::steady_now_ns() : 0;
  stage_in(st);
  bool first = true;
  const auto close_compress = [&] {
    span(names::kDpCompress.data(), st, first ? raw : 0, t_open);
    first = false;
  };
  int which = 0;  // even: P, odd: Q of the current matrix
  const auto all_reduce = [&](float* data, std::size_t count) {
    close_compress();
    OpLabel l = label;
    l.name = which++ % 2 == 0 ? names::kDpPowerSgdP : names::kDpPowerSgdQ;
    dp_.all_reduce(data, count, DType::F32, ReduceOp::Avg, l).wait();
    if (rec_ != nullptr) t_open = profiler::steady_now_ns();
  };
  for (std::size_t j = 0; j < st.matrices.size(); ++j) {
    const GradMatrix& m = st.matrices[j];
    float* mg = g + m.offset;
    float* res = st.residual.data() + m.offset;
    cz::powersgd_step(mg, res, m.rows, m.cols, opt_.powersgd_rank, st.q[j], all_reduce, mg);
    if (opt_.keep_sent) std::copy(mg, mg + m.rows * m.cols, st.sent.begin() + m.offset);
  }
  // The plain entries: e = g + residual (the residual stays 0: they are sent whole).
  std::size_t at = 0;
  for (const auto& [b, e] : st.plain) {
    for (std::size_t i = b; i < e; ++i) {
      const float v = g[i] + st.residual[i];
      st.residual[i] = 0.0f;
      st.plain_buf[at++] = v;
      if (opt_.keep_sent) st.sent[i] = v;
    }
  }
  if (st.plain_buf.empty()) {
    stage_out(st);  // inside the last compress span: no decompress span follows
    close_compress();
    return;
  }
  close_compress();
  OpLabel l = label;
  l.name = names::kDpPowerSgdVectors;
  dp_.all_reduce(st.plain_buf.data(), st.plain_buf.size(), DType::F32, ReduceOp::Avg, l).wait();
  const int64_t t0 = rec_ != nullptr ? profiler::steady_now_ns() : 0;
  at = 0;
  for (const auto& [b, e] : st.plain) {
    for (std::size_t i = b; i < e; ++i) g[i] = st.plain_buf[at++];
  }
  stage_out(st);
  span(names::kDpDecompress.data(), st, static_cast<int64_t>(st.plain_buf.size() * sizeof(float)),
       t0);
}

// Every rank's payload summed in rank order (fp32), divided by dp: the same on every rank.
void CompressionHook::finish_gathered(Bucket& st) {
  const int64_t t0 = rec_ != nullptr ? profiler::steady_now_ns() : 0;
  const std::size_t n = st.range.count;
  float* out = grads_ + st.range.offset;
  std::fill(out, out + n, 0.0f);
  const int ranks = dp_.size();
  for (int r = 0; r < ranks; ++r) {
    const uint8_t* p = st.recv.data() + static_cast<std::size_t>(r) * st.payload;
    if (opt_.scheme == CompressionScheme::Int8) {
      const auto* codes = reinterpret_cast<const int8_t*>(p);
      const std::size_t chunks = (n + kInt8ChunkElems - 1) / kInt8ChunkElems;
      std::vector<float> scales(chunks);
      std::memcpy(scales.data(), p + n, chunks * sizeof(float));
      for (std::size_t i = 0; i < n; ++i)
        out[i] += static_cast<float>(codes[i]) * scales[i / kInt8ChunkElems];
    } else {
      const std::size_t k = st.payload / (sizeof(uint32_t) + sizeof(float));
      std::vector<uint32_t> index(k);
      std::vector<float> value(k);
      std::memcpy(index.data(), p, k * sizeof(uint32_t));
      std::memcpy(value.data(), p + k * sizeof(uint32_t), k * sizeof(float));
      cz::topk_scatter_add(index, value, out);
    }
  }
  const float inv = 1.0f / static_cast<float>(ranks);
  for (std::size_t i = 0; i < n; ++i) out[i] *= inv;
  stage_out(st);
  span(names::kDpDecompress.data(), st, static_cast<int64_t>(st.recv.size()), t0);
}

void CompressionHook::finish() {
  for (int bi : pending_) {
    Bucket& st = buckets_[static_cast<std::size_t>(bi)];
    st.h.wait();
    st.h = Handle();
    finish_gathered(st);
  }
  pending_.clear();
}

std::size_t CompressionHook::residual_elems() const {
  std::size_t n = 0;
  for (const auto& st : buckets_) n += st.residual.size();
  return n;
}

std::size_t CompressionHook::q_elems() const {
  std::size_t n = 0;
  for (const auto& st : buckets_) {
    for (const auto& q : st.q) n += q.size();
  }
  return n;
}

void CompressionHook::get_state(std::vector<float>& residuals, std::vector<float>& q) const {
  residuals.clear();
  q.clear();
  for (const auto& st : buckets_) {
    residuals.insert(residuals.end(), st.residual.begin(), st.residual.end());
    for (const auto& qm : st.q) q.insert(q.end(), qm.begin(), qm.end());
  }
}

void CompressionHook::set_state(const std::vector<float>& residuals, const std::vector<float>& q) {
  if (residuals.size() != residual_elems() || q.size() != q_elems()) {
    throw InternalError("CompressionHook::set_state: state of another layout");
  }
  const float* r = residuals.data();
  const float* qs = q.data();
  for (auto& st : buckets_) {
    std::copy(r, r + st.residual.size(), st.residual.begin());
    r += st.residual.size();
    for (auto& qm : st.q) {
      std::copy(qs, qs + qm.size(), qm.begin());
      qs += qm.size();
    }
  }
}

const std::vector<float>& CompressionHook::residual(int bucket) const {
  return buckets_.at(static_cast<std::size_t>(bucket)).residual;
}

const std::vector<float>& CompressionHook::sent(int bucket) const {
  return buckets_.at(static_cast<std::size_t>(bucket)).sent;
}

std::size_t CompressionHook::payload_bytes(int bucket) const {
  return buckets_.at(static_cast<std::size_t>(bucket)).payload;
}

std::size_t CompressionHook::buffer_bytes() const {
  std::size_t bytes = (scratch_.size() + host_grads_.size()) * sizeof(float);
  for (const auto& st : buckets_) {
    bytes += (st.residual.size() + st.sent.size() + st.plain_buf.size()) * sizeof(float);
    bytes += st.send.size() + st.recv.size();
    for (const auto& q : st.q) bytes += q.size() * sizeof(float);
  }
  return bytes;
}

}  // namespace orrery::runtime
