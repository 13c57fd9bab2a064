// Data parallelism: bucketed, overlapped gradient all-reduce (see ddp.hpp).
#include "orrery/runtime/ddp.hpp"

#include <algorithm>
#include <string>

#include "orrery/common/error.hpp"
#include "orrery/model/buckets.hpp"
#include "orrery/model/names.hpp"
#include "orrery/runtime/half.hpp"

namespace orrery::runtime {
namespace {

constexpr const char* kBucketSpanName = model::names::kDpAllReduce.data();
constexpr const char* kBroadcastSpanName = model::names::kDpBroadcast.data();

// Segments of the model in the order their gradients complete: head LayerNorm (n_layer), blocks
// from the last, the embedding (kEmbedSegment) last. Segments this shard does not hold are skipped.
std::vector<int> ready_order(const Gpt& model) {
  std::vector<int> order;
  const int L = model.config.n_layer;
  for (int seg = L; seg >= kEmbedSegment; --seg) {
    if (model.segment_range(seg).count > 0) order.push_back(seg);
  }
  return order;
}

// The model's segments in gradient-ready order with their sizes, for the bucket rules of
// model/buckets.hpp; `bucket_mb` checked.
std::vector<model::BucketSegment> bucket_segments(const Gpt& model, double bucket_mb) {
  if (!(bucket_mb > 0)) {
    throw InputError("parallel.bucket_mb: expected a size in MiB > 0, got " +
                     std::to_string(bucket_mb));
  }
  std::vector<model::BucketSegment> order;
  for (int seg : ready_order(model))
    order.push_back({seg, static_cast<int64_t>(model.segment_range(seg).count)});
  return order;
}

}  // namespace

std::vector<DdpBucket> make_expert_buckets(const Gpt& model, double bucket_mb) {
  std::vector<model::BucketSegment> order;
  std::vector<ParamRange> ranges;
  for (int seg = model.shard.layer_end - 1; seg >= model.shard.layer_begin; --seg) {
    const ParamRange r = model.expert_range(seg);
    if (r.count == 0) continue;
    ranges.push_back(r);
    order.push_back({seg, static_cast<int64_t>(r.count)});
  }
  std::vector<DdpBucket> buckets;
  for (const auto& plan : model::ddp_buckets(order, bucket_mb * 1024.0 * 1024.0, sizeof(float))) {
    DdpBucket b;
    b.index = static_cast<int>(buckets.size());
    b.range = ranges[plan.begin];
    b.lowest_layer = plan.lowest_segment;
    for (std::size_t i = plan.begin; i < plan.end; ++i) {
      if (i > plan.begin) {
        if (ranges[i].end() != b.range.offset) {
          throw InternalError("DDP: the experts of block " + std::to_string(order[i].segment) +
                              " are not adjacent to their bucket in the gradient array");
        }
        b.range.offset = ranges[i].offset;
        b.range.count += ranges[i].count;
      }
      b.segments.push_back(order[i].segment);
    }
    buckets.push_back(std::move(b));
  }
  return buckets;
}

std::vector<DdpBucket> make_ddp_buckets(const Gpt& model, double bucket_mb) {
  const std::vector<model::BucketSegment> order = bucket_segments(model, bucket_mb);
  std::vector<ParamRange> ranges;  // of order's segments
  for (const auto& sg : order) ranges.push_back(model.segment_range(sg.segment));
  const auto plans = model::ddp_buckets(order, bucket_mb * 1024.0 * 1024.0, sizeof(float));
  std::vector<DdpBucket> buckets;
  for (const auto& plan : plans) {
    DdpBucket b;
    b.index = static_cast<int>(buckets.size());
    b.range = ranges[plan.begin];
    b.lowest_layer = plan.lowest_segment;
    for (std::size_t i = plan.begin; i < plan.end; ++i) {
      const int seg = order[i].segment;
      const ParamRange& r = ranges[i];
      if (i > plan.begin) {
        // Ready order walks memory backwards, so the new segment must end where the bucket begins.
        if (r.end() != b.range.offset) {
          throw InternalError("DDP: model segment " + std::to_string(seg) +
                              " is not adjacent to its bucket in the gradient array");
        }
        b.range.offset = r.offset;
        b.range.count += r.count;
      }
      b.segments.push_back(seg);
    }
    buckets.push_back(std::move(b));
  }
  return buckets;
}

std::vector<DdpBucket> make_zero_buckets(const Gpt& model, double bucket_mb, int dp_size) {
  const std::vector<model::BucketSegment> order = bucket_segments(model, bucket_mb);
  std::vector<DdpBucket> buckets;
  for (const auto& z :
       model::zero_buckets(order, bucket_mb * 1024.0 * 1024.0, sizeof(float), dp_size)) {
    DdpBucket b;
    b.index = static_cast<int>(buckets.size());
    b.range = ParamRange{static_cast<std::size_t>(z.offset), static_cast<std::size_t>(z.elements)};
    b.lowest_layer = z.lowest_segment;
    b.shard = static_cast<std::size_t>(z.shard);
    b.shard_offset = static_cast<std::size_t>(z.shard_offset);
    for (std::size_t i = z.begin; i < z.end; ++i) b.segments.push_back(order[i].segment);
    buckets.push_back(std::move(b));
  }
  return buckets;
}

DataParallel::DataParallel(std::vector<DdpBucket> buckets, int n_layer, float* grads, float* params,
                           std::size_t n_params, Communicator* dp, const DdpOptions& opt)
    : buckets_(std::move(buckets)),
      grads_(grads),
      params_(params),
      n_params_(n_params),
      dp_(dp),
      opt_(opt) {
  bucket_of_segment_.assign(static_cast<size_t>(n_layer) + 2, -1);
  for (const auto& b : buckets_) {
    for (int seg : b.segments) bucket_of_segment_[static_cast<size_t>(seg + 1)] = b.index;
  }
  pending_.assign(buckets_.size(), 0);
  if (opt_.wire == DType::BF16 || opt_.wire == DType::F16) {
    std::size_t n = 0;
    for (const auto& b : buckets_) n = std::max(n, b.range.end());
    wire16_.assign(n, 0);
  }
}

DataParallel::DataParallel(Gpt& model, Communicator& dp, const DdpOptions& opt)
    : DataParallel(make_ddp_buckets(model, opt.bucket_mb), model.config.n_layer, model.grads.data(),
                   model.params.data(), model.params.size(), &dp, opt) {}

DataParallel::~DataParallel() = default;

void DataParallel::enable_compression(const CompressionOptions& opt,
                                      const std::vector<GradMatrix>& matrices,
                                      profiler::Recorder* rec, const GradStaging* staging,
                                      Communicator* host_dp) {
  if (opt.scheme == CompressionScheme::None || dp_ == nullptr || dp_->size() <= 1) return;
  if (staging != nullptr && (host_dp == nullptr || host_dp->size() != dp_->size())) {
    throw InternalError("DDP: compression on a device needs the dp group's host communicator");
  }
  hook_ = std::make_unique<CompressionHook>(opt, buckets_, matrices, grads_,
                                            staging != nullptr ? *host_dp : *dp_, rec, staging);
}

void DataParallel::begin_backward(bool sync, int32_t step, int32_t micro_batch) {
  sync_ = sync && dp_ != nullptr && dp_->size() > 1;
  compressing_ = sync_ && compresses(step);
  step_ = step;
  micro_batch_ = micro_batch;
  next_to_issue_ = 0;
  handles_.clear();
  for (const auto& b : buckets_)
    pending_[static_cast<size_t>(b.index)] = static_cast<int>(b.segments.size());
}

void DataParallel::on_grads_ready(int segment) {
  if (!sync_) return;
  const size_t slot = static_cast<size_t>(segment + 1);
  if (slot >= bucket_of_segment_.size() || bucket_of_segment_[slot] < 0) {
    throw InternalError("DDP: gradients ready for segment " + std::to_string(segment) +
                        ", which is in no bucket");
  }
  const int bi = bucket_of_segment_[slot];
  if (--pending_[static_cast<size_t>(bi)] < 0) {
    throw InternalError("DDP: segment " + std::to_string(segment) + " reported ready twice");
  }
  if (!opt_.overlap) return;
  // Issue in index order only, so every rank sends the same sequence of all-reduces; a held
  // bucket (opt.hold_segment) waits for finish_backward.
  const int held = opt_.hold_segment == DdpOptions::kNoSegment
                       ? -1
                       : bucket_of_segment_[static_cast<size_t>(opt_.hold_segment + 1)];
  while (next_to_issue_ < static_cast<int>(buckets_.size()) && next_to_issue_ != held &&
         pending_[static_cast<size_t>(next_to_issue_)] == 0) {
    issue(buckets_[static_cast<size_t>(next_to_issue_++)]);
  }
}

void DataParallel::issue(DdpBucket& b) {
  OpLabel label;
  label.name = opt_.span_name != nullptr ? opt_.span_name : kBucketSpanName;
  label.step = step_;
  label.micro_batch = micro_batch_;
  label.layer = b.lowest_layer;
  if (compressing_) {
    hook_->issue(b, label);
    return;
  }
  if (opt_.reduce_scatter) {
    if (scatter_into_ == nullptr) throw InternalError("DDP: no shard array to scatter into");
    handles_.push_back(dp_->reduce_scatter(grads_ + b.range.offset, scatter_into_ + b.shard_offset,
                                           b.shard, DType::F32, ReduceOp::Avg, label));
    return;
  }
  if (!wire16_.empty()) {
    const bool bf16 = opt_.wire == DType::BF16;
    uint16_t* w = wire16_.data() + b.range.offset;
    const float* g = grads_ + b.range.offset;
    for (std::size_t i = 0; i < b.range.count; ++i)
      w[i] = bf16 ? float_to_bf16_bits(g[i]) : float_to_fp16_bits(g[i]);
    handles_.push_back(dp_->all_reduce(w, b.range.count, opt_.wire, ReduceOp::Sum, label));
    return;
  }
  handles_.push_back(
      dp_->all_reduce(grads_ + b.range.offset, b.range.count, DType::F32, ReduceOp::Avg, label));
}

void DataParallel::widen_wire() {
  const bool bf16 = opt_.wire == DType::BF16;
  const float inv = 1.0f / static_cast<float>(dp_->size());
  for (const auto& b : buckets_) {
    const uint16_t* w = wire16_.data() + b.range.offset;
    float* g = grads_ + b.range.offset;
    for (std::size_t i = 0; i < b.range.count; ++i)
      g[i] = (bf16 ? bf16_bits_to_float(w[i]) : fp16_bits_to_float(w[i])) * inv;
  }
}

void DataParallel::finish_backward() {
  if (sync_) {
    for (size_t i = 0; i < buckets_.size(); ++i) {
      if (pending_[i] != 0) {
        throw InternalError("DDP: backward finished with " + std::to_string(pending_[i]) +
                            " segment(s) of bucket " + std::to_string(i) + " never ready");
      }
    }
    while (next_to_issue_ < static_cast<int>(buckets_.size())) {
      issue(buckets_[static_cast<size_t>(next_to_issue_++)]);
    }
  }
  for (auto& h : handles_) h.wait();
  handles_.clear();
  if (sync_ && !compressing_ && !wire16_.empty()) widen_wire();
  if (compressing_) hook_->finish();
  compressing_ = false;
  sync_ = false;
}

void DataParallel::broadcast_parameters() {
  if (dp_ == nullptr || dp_->size() <= 1) return;
  OpLabel label;
  label.name = kBroadcastSpanName;
  dp_->broadcast(params_, n_params_, DType::F32, 0, label).wait();
  dp_->synchronize();  // a device communicator: the broadcast is complete, not only queued
}

}  // namespace orrery::runtime
