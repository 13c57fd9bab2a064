// The device-independent part of ZeRO-Offload on a device (offload_pipeline.hpp): the chunk
// schedule, its walk and the host step.
#include "orrery/runtime/offload_pipeline.hpp"

#include <algorithm>

#include "orrery/common/error.hpp"
#include "orrery/model/names.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/offload.hpp"

namespace orrery::runtime {

std::vector<OffloadOp> offload_chunk_schedule(std::size_t chunks) {
  std::vector<OffloadOp> out;
  if (chunks == 0) return out;
  out.reserve(3 * chunks);
  auto buffer = [](std::size_t i) { return static_cast<int>(i % kOffloadStagingBuffers); };
  out.push_back({OffloadOpKind::kDownload, 0, buffer(0)});
  for (std::size_t i = 0; i < chunks; ++i) {
    if (i + 1 < chunks) out.push_back({OffloadOpKind::kDownload, i + 1, buffer(i + 1)});
    out.push_back({OffloadOpKind::kStep, i, buffer(i)});
    out.push_back({OffloadOpKind::kUpload, i, -1});
  }
  return out;
}

OffloadPipeline::OffloadPipeline(OffloadTransfers& t, std::size_t count, std::size_t chunk)
    : t_(t),
      count_(count),
      chunk_(std::max<std::size_t>(1, std::min(chunk, count))),
      chunks_(count == 0 ? 0 : (count + chunk_ - 1) / chunk_),
      schedule_(offload_chunk_schedule(chunks_)) {}

std::size_t OffloadPipeline::size(std::size_t i) const {
  return std::min(chunk_, count_ - first(i));
}

void OffloadPipeline::issue(const OffloadOp& op) {
  if (op.kind == OffloadOpKind::kDownload) t_.download(first(op.chunk), size(op.chunk), op.buffer);
  if (op.kind == OffloadOpKind::kUpload) t_.upload(first(op.chunk), size(op.chunk));
}

const float* OffloadPipeline::before_step(std::size_t i) {
  while (pos_ < schedule_.size() && schedule_[pos_].kind != OffloadOpKind::kStep)
    issue(schedule_[pos_++]);
  if (pos_ == schedule_.size() || schedule_[pos_].chunk != i)
    throw InternalError("offload pipeline: chunk " + std::to_string(i) + " stepped out of order");
  return t_.downloaded(schedule_[pos_++].buffer);
}

void OffloadPipeline::after_step(std::size_t i) {
  while (pos_ < schedule_.size() && schedule_[pos_].kind != OffloadOpKind::kStep) {
    const OffloadOp& op = schedule_[pos_++];
    issue(op);
    if (op.kind == OffloadOpKind::kUpload && op.chunk == i) break;
  }
}

namespace {
// Chunk i's step: its master weights at `master`, moments at `m` / `v`.
void host_step(OffloadPipeline& pipe, std::size_t i, const OffloadRange& r, float* master, float* m,
               float* v, std::span<const ParamRange> decay, int64_t adam_step,
               const AdamWConfig& cfg, profiler::Recorder* rec, int32_t label_step) {
  const float* g = pipe.before_step(i);
  const std::size_t d = pipe.first(i), n = pipe.size(i);
  {
    traces::Span s;
    s.kind = traces::SpanKind::Optimizer;
    if (rec != nullptr) s.name = rec->intern(model::names::kOffloadAdamW);
    s.step = label_step;
    s.bytes = static_cast<int64_t>(n * sizeof(float));
    profiler::ScopedSpan span(rec, s);
    adamw_update(master, g, m, v, r.flat_offset + d, n, decay, adam_step, cfg);
  }
  pipe.after_step(i);
}
}  // namespace

void offload_adamw_range(OffloadTransfers& t, const OffloadRange& r, std::size_t chunk,
                         std::span<const ParamRange> decay, int64_t adam_step,
                         const AdamWConfig& cfg, profiler::Recorder* rec, int32_t label_step) {
  if (r.count == 0) return;
  if (r.master == nullptr && (r.store == nullptr || r.store->planes() < 3))
    throw InternalError("offload pipeline: no master weights (no array, no store plane 2)");
  if (r.store == nullptr) {
    OffloadPipeline pipe(t, r.count, chunk);
    for (std::size_t i = 0; i < pipe.chunks(); ++i) {
      const std::size_t k = r.moment_begin + pipe.first(i);
      host_step(pipe, i, r, r.master + pipe.first(i), r.m + k, r.v + k, decay, adam_step, cfg, rec,
                label_step);
    }
    return;
  }
  // The store's chunks are the pipeline's: the moments (and with a null master the master
  // weights, plane 2) of chunk i are read ahead while chunk i-1 steps and written behind while
  // chunk i+1 does.
  OffloadPipeline pipe(t, r.count, r.store->chunk_elems());
  r.store->for_each_chunk(
      r.moment_begin, r.count, label_step,
      [&](std::size_t first, std::size_t, float* const* plane) {
        const std::size_t i = (first - r.moment_begin) / r.store->chunk_elems();
        float* master = r.master != nullptr ? r.master + pipe.first(i) : plane[2];
        host_step(pipe, i, r, master, plane[0], plane[1], decay, adam_step, cfg, rec, label_step);
      });
}

}  // namespace orrery::runtime
