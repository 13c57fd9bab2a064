// TrainingLoop's definitions (training_loop.hpp), included only by a backend's trainer.cpp, which
// instantiates them once: `template class TrainingLoop<ItsBackend>;`.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>

#include "orrery/common/error.hpp"
#include "orrery/model/buckets.hpp"
#include "orrery/model/names.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/buffers.hpp"
#include "orrery/runtime/gpt_pieces.hpp"
#include "orrery/runtime/offload_pipeline.hpp"
#include "orrery/runtime/pipeline.hpp"
#include "orrery/runtime/tensor_parallel.hpp"
#include "orrery/runtime/training_loop.hpp"

namespace orrery::runtime {

namespace loop_detail {

inline AdamWConfig adamw_config(const TrainingConfig& t) {
  AdamWConfig c;
  c.lr = static_cast<float>(t.lr);
  c.beta1 = static_cast<float>(t.beta1);
  c.beta2 = static_cast<float>(t.beta2);
  c.eps = static_cast<float>(t.eps);
  c.weight_decay = static_cast<float>(t.weight_decay);
  return c;
}

inline std::string origin_of(const Scenario& s) {
  return s.path.empty() ? std::string("scenario") : s.path;
}

// The world's size and the batch split, checked before any group is made.
inline Layout checked_layout(const Scenario& s, const Communicator& world) {
  if (world.size() != s.world_size()) {
    throw InputError(origin_of(s) + ": parallel.dp * tp * pp = " + std::to_string(s.world_size()) +
                     " but " + std::to_string(world.size()) + " ranks were started");
  }
  const int m = s.micro_batches_per_step();
  if (m < 1 || m * s.parallel.dp * s.training.micro_batch != s.training.global_batch) {
    throw InputError("key 'training.global_batch': " + std::to_string(s.training.global_batch) +
                     " is not a multiple of parallel.dp * training.micro_batch = " +
                     std::to_string(s.parallel.dp * s.training.micro_batch));
  }
  return Layout::of(s, world.rank());
}

template <class B>
const Scenario& checked(const Scenario& s) {
  B::check_supported(s);
  return s;
}

}  // namespace loop_detail

// The model's OpObserver calls as Compute spans timed by the backend (they never nest).
template <class B>
class TrainingLoop<B>::Observer final : public OpObserver {
 public:
  Observer(profiler::Recorder* rec, B& backend) : names_(rec), backend_(backend) {}
  void set_context(int32_t step, int32_t micro_batch) {
    step_ = step;
    micro_batch_ = micro_batch;
  }
  void begin(const char* name, int layer, double flops) override {
    traces::Span s;
    s.kind = traces::SpanKind::Compute;
    s.name = names_.id(name);
    s.layer = layer;
    s.flops = flops;
    s.step = step_;
    s.micro_batch = micro_batch_;
    open_ = backend_.open(s, name);
  }
  void end() override {
    backend_.close(open_);
    open_ = -1;
  }

 private:
  profiler::LiteralNames names_;
  B& backend_;
  int open_ = -1;
  int32_t step_ = -1;
  int32_t micro_batch_ = -1;
};

// A stretch of checkpoint state copied to the host (backends whose memory is not the host's).
template <class B>
struct TrainingLoop<B>::Staged {
  float* device = nullptr;
  std::vector<float> host;
  bool upload = false;  // copied back by commit_loaded_state
};

template <class B>
TrainingLoop<B>::TrainingLoop(const Scenario& s, Communicator& world, profiler::Recorder* rec,
                              const typename B::Options& opt)
    : s_(loop_detail::checked<B>(s)),
      world_(world),
      rec_(rec != nullptr && rec->enabled() ? rec : nullptr),
      layout_(loop_detail::checked_layout(s_, world_)),
      micro_batches_(s_.micro_batches_per_step()),
      groups_(split_rank_groups(world_, layout_)),
      backend_(s_, rec_, opt) {
  const Layout& L = layout_;
  dev_ = backend_.connect(groups_, L);

  const GptConfig cfg = gpt_config(s_.model);
  // The pipeline stage's layers (parallel.pp_layers, or an even split; every layer when pp = 1),
  // the tp slice of each block.
  GptShard shard =
      L.pp > 1 ? GptShard::pipeline_stage(cfg, L.pp_rank, L.pp, s_.parallel.pp_layers) : GptShard{};
  shard.tp_rank = L.tp_rank;
  shard.tp_size = L.tp;
  shard.sequence_parallel = s_.parallel.sequence_parallel;
  shard.ep_size = L.ep;
  shard.ep_rank = model::moe::ep_rank(L.dp_rank, L.ep);
  Gpt host = gpt_create(cfg, shard, s_.training.seed);
  std::vector<DdpBucket> buckets = make_ddp_buckets(host, s_.parallel.bucket_mb);  // unpadded
  std::vector<DdpBucket> expert_buckets = make_expert_buckets(host, s_.parallel.bucket_mb);
  // The dense parameters come first (model.hpp): DDP broadcasts only those; the experts are the
  // seed's on every rank that holds them.
  std::size_t dense_elems = host.num_params();
  for (const auto& t : host.tensors) {
    if (t.expert) dense_elems = std::min(dense_elems, t.offset);
  }
  expert_segment_.assign(std::size_t(cfg.n_layer) + 2, 0);
  for (const auto& b : expert_buckets) {
    for (int seg : b.segments) expert_segment_[std::size_t(seg + 1)] = 1;
  }
  const std::size_t n = host.num_params();
  dense_elems_ = dense_elems;
  decay_ = host.decay_ranges();
  adamw_ = loop_detail::adamw_config(s_.training);
  if (precision_of(s_.runtime) == Precision::FP16)
    scaler_.emplace(s_.training.loss_scale, s_.training.loss_scale_window);
  const bool z3 = s_.parallel.zero == 3;                       // dp >= 2 (check_supported)
  const bool zero = !z3 && s_.parallel.zero >= 1 && L.dp > 1;  // ZeRO 1/2
  std::size_t moments = n;
  opt_count_ = n;
  std::vector<DdpBucket> zbuckets;  // zero.overlap_grad_reduce: ZeRO 1/2 per bucket
  if (z3) {
    zero_ = zero_partition(n, L.dp_rank, L.dp);
    model_ = std::make_unique<Model>(backend_.make_model(std::move(host), false));
    z3_ = backend_.make_zero3(*model_, L.dp_rank, L.dp, L.ep);
    z3_recv_.resize(z3_->shard_elems());
    moments = z3_->shard_elems();
    opt_count_ = 0;  // per segment shard
  } else {
    if (zero && L.ep > 1) {
      // MoE with ep > 1 (model/moe.hpp): the dense prefix partitioned over dp, the experts over
      // their edp group; storage padded for both (the dense all-gather goes through zero_stage_,
      // so its padding never overwrites the experts that follow the dense tensors).
      expert_offset_ = dense_elems;
      zero_ = zero_partition(dense_elems, L.dp_rank, L.dp);
      ezero_ = zero_partition(n - dense_elems, L.dp_rank / L.ep, L.dp / L.ep);
      gpt_pad_storage(host, std::max(zero_.padded(), dense_elems + ezero_.padded()));
      moments = zero_.shard;
      opt_offset_ = zero_.begin();
      opt_count_ = zero_.count();
    } else if (zero) {
      zero_ = zero_partition(n, L.dp_rank, L.dp);
      gpt_pad_storage(host, zero_.padded());
      moments = zero_.shard;
      opt_offset_ = zero_.begin();
      opt_count_ = zero_.count();
      if (s_.zero.overlap_grad_reduce)
        zbuckets = make_zero_buckets(host, s_.parallel.bucket_mb, L.dp);
    } else {
      zero_ = zero_partition(n, 0, 1);
    }
    model_ = std::make_unique<Model>(backend_.make_model(std::move(host), true));
  }
  DdpOptions dopt;
  dopt.bucket_mb = s_.parallel.bucket_mb;
  dopt.overlap = s_.parallel.overlap;
  if (const Precision g = grad_dtype_of(s_.parallel); g != Precision::FP32) {
    if constexpr (!B::kHostMemory) {
      throw InputError(loop_detail::origin_of(s_) +
                       ": key 'parallel.grad_dtype': 16-bit gradients run on device cpu only");
    } else {
      dopt.wire = g == Precision::BF16 ? DType::BF16 : DType::F16;
    }
  }
  if (!zbuckets.empty()) use_zero_buckets(buckets, std::move(zbuckets), dopt);
  ddp_ = std::make_unique<DataParallel>(std::move(buckets), cfg.n_layer, model_->grads.data(),
                                        model_->params.data(), dense_elems, dev_.dp, dopt);
  if (cfg.moe.enabled() && !zero && !z3) {
    // Averaged over edp here, then divided by ep after the step's backward (backward_pass): the
    // experts' gradients summed over their edp group and divided by dp (model/moe.hpp). Under
    // ZeRO 1/2 with ep 1 the experts are replicated over dp like the dense tensors: the whole
    // array's reduce-scatter averages them and the partition shards their optimizer state over dp,
    // which is the edp group (ep > 1: reduce_expert_gradients_zero; ZeRO 3: z3_reduce_scatter).
    DdpOptions eopt = dopt;
    eopt.span_name = names::kEdpAllReduce.data();
    edp_ = std::make_unique<DataParallel>(std::move(expert_buckets), cfg.n_layer,
                                          model_->grads.data(), model_->params.data(), 0,
                                          L.ep > 1 ? dev_.edp : dev_.dp, eopt);
  }
  if (s_.parallel.grad_compression != "none") enable_compression();
  source_ = make_token_source(s_.data.source, s_.data.path, cfg.vocab, s_.training.seed);
  loader_ = std::make_unique<DataLoader>(*source_, s_.model.seq, s_.training.micro_batch, L.dp_rank,
                                         L.dp, s_.training.seed);
  // One activation set per micro-batch in flight (index mb % size); under recomputation the buffers
  // the blocks do not keep are the scratch's workspace, once per rank (buffers.hpp).
  const Recompute recompute = recompute_of(s_.training);
  const int in_flight =
      L.pp > 1 ? pipeline_in_flight(schedule_of(s_.parallel), L.pp, L.pp_rank, micro_batches_) : 1;
  for (int i = 0; i < in_flight; ++i) {
    acts_.push_back(std::make_unique<typename B::Activations>(
        backend_.activations(*model_, s_.training.micro_batch, s_.model.seq, recompute)));
  }
  act_send_h_.resize(static_cast<std::size_t>(in_flight));
  grad_send_h_.resize(static_cast<std::size_t>(in_flight));
  if (L.pp > 1 && L.pp_rank > 0) {
    for (int i = 0; i < in_flight; ++i) grad_send_.emplace_back(acts_[0]->boundary_elems);
  }
  scratch_ = std::make_unique<typename B::Scratch>(
      backend_.scratch(*model_, s_.training.micro_batch, s_.model.seq, recompute));
  for (auto& a : acts_) bind_workspace(*a, *scratch_);
  if (const BlockArch& arch = layout_of(*model_).config.arch; arch.kv_replicas(L.tp) > 1) {
    kv_replicas_ = arch.kv_replicas(L.tp);
    const BlockDims& d = layout_of(*model_).dims;
    const std::size_t rows = 2 * std::size_t(d.Ckvl);  // k | v
    kv_buf_.resize(std::size_t(arch.kv_heads) * rows * (std::size_t(d.C) + (arch.bias ? 1 : 0)));
  }
  make_optimizer_state(moments, zero);
  if (zbuckets_)
    ddp_->set_scatter_target(s_.parallel.zero == 2 ? zero_recv_.data() : zero_grads_.data());
  if (rec_ != nullptr) observer_ = std::make_unique<Observer>(rec_, backend_);
  backend_.synchronize();  // the model's upload is complete before any stream uses it
}

// parallel.grad_compression (ddp_compression.hpp): the hook on DDP's dense buckets. Its kernels run
// on the host: on a device over a host copy of the gradients (the backend's download / upload) with
// its collectives on the dp group's host communicator, the same arithmetic as the CPU's.
template <class B>
void TrainingLoop<B>::enable_compression() {
  CompressionOptions c;
  c.scheme = compression_scheme_of(s_.parallel.grad_compression);
  c.powersgd_rank = s_.compression.powersgd_rank;
  c.topk_ratio = s_.compression.topk_ratio;
  c.start_step = s_.compression.start_step;
  if constexpr (B::kHostMemory) {
    ddp_->enable_compression(c, grad_matrices(layout_of(*model_)), rec_);
  } else {
    // Refused by check_supported_on_device (launch.cpp): other groups' host-staged collectives
    // would share the process's MPI thread with the hook's during the backward.
    if (layout_.tp > 1 || layout_.pp > 1 || layout_of(*model_).config.moe.enabled()) {
      throw InputError(loop_detail::origin_of(s_) +
                       ": key 'parallel.grad_compression': on a device with dp only (tp 1, pp 1, "
                       "no MoE blocks)");
    }
    GradStaging staging;
    staging.download = [this](float* h, const float* d, std::size_t n) {
      backend_.download(h, d, n);
    };
    staging.upload = [this](float* d, const float* h, std::size_t n) { backend_.upload(d, h, n); };
    ddp_->enable_compression(c, grad_matrices(layout_of(*model_)), rec_, &staging,
                             groups_.dp.get());
  }
}

// The optimizer's state of this rank: the AdamW moments of the `moments` elements it updates (in
// memory, or NVMe offload's file), ZeRO 1/2's gradient shards (`zero`), and with MoE's expert
// partition over edp the experts' shards and moments.
template <class B>
void TrainingLoop<B>::make_optimizer_state(std::size_t moments, bool zero) {
  // MoE, ep > 1, ZeRO 1/2: the experts' shard's moments follow the dense shard's.
  const std::size_t all = moments + ezero_.shard;
  if (s_.zero.nvme()) {
    make_offload(all);
  } else if (s_.zero.offload_optimizer == "host") {
    make_host_offload(all, true);
  } else {
    adam_m_.resize(all);
    adam_v_.resize(all);
  }
  if (zero) {
    zero_grads_.resize(zero_.shard);
    if (s_.parallel.zero == 2) zero_recv_.resize(zero_.shard);
  }
  if (ezero_.total > 0) {
    ezero_grads_.resize(ezero_.shard);
    if (s_.parallel.zero == 2) ezero_recv_.resize(ezero_.shard);
    zero_stage_.resize(zero_.padded());
  }
}

// zero.overlap_grad_reduce (Megatron's distributed optimizer): DDP's machinery over ZeRO's buckets
// issues each bucket's reduce-scatter as its gradients are ready; the tied wte's bucket waits for
// its sum over the first and last stage.
template <class B>
void TrainingLoop<B>::use_zero_buckets(std::vector<DdpBucket>& buckets,
                                       std::vector<DdpBucket> zbuckets, DdpOptions& dopt) {
  zbuckets_ = true;
  dopt.overlap = true;
  dopt.reduce_scatter = true;
  dopt.span_name = kZeroReduceScatterName;
  if (dev_.embed != nullptr && layout_of(*model_).config.arch.tied_embeddings)
    dopt.hold_segment = kEmbedSegment;
  plan_zero_buckets(zbuckets);
  buckets = std::move(zbuckets);
}

// zero.overlap_grad_reduce: what this rank updates (its part of each bucket: flat offset, place in
// the shard array, real elements) and, per segment, the buckets its forward waits for.
template <class B>
void TrainingLoop<B>::plan_zero_buckets(const std::vector<DdpBucket>& buckets) {
  const Gpt& g = layout_of(*model_);
  std::vector<model::ZeroBucketPlan> plans;
  for (const auto& b : buckets) {
    const std::size_t flat = b.range.offset + std::size_t(layout_.dp_rank) * b.shard;
    const std::size_t n = flat_elems();  // the real elements (params may be padded)
    const std::size_t count = flat >= n ? 0 : std::min(b.shard, n - flat);
    if (count > 0) opt_ranges_.push_back({flat, b.shard_offset, count});
    model::ZeroBucketPlan p;
    p.offset = int64_t(b.range.offset);
    p.elements = int64_t(b.range.count);
    plans.push_back(p);
  }
  const int L = g.config.n_layer;
  zero_gather_waits_.assign(std::size_t(L) + 2, {});
  for (int seg = kEmbedSegment; seg <= L; ++seg) {
    const ParamRange r = g.segment_range(seg);
    zero_gather_waits_[std::size_t(seg + 1)] =
        model::zero_buckets_overlapping(plans, int64_t(r.offset), int64_t(r.count));
  }
  zero_ag_h_.resize(buckets.size());
}

// zero.overlap_param_gather: the parameters of `segment` are gathered (the head's too, with the
// copy of the tied wte that a last stage holds in its embedding segment).
template <class B>
void TrainingLoop<B>::wait_zero_gathers(int segment) {
  if (zero_ag_h_.empty()) return;
  const int L = layout_of(*model_).config.n_layer;
  for (int seg : {segment, segment == L ? kEmbedSegment : segment}) {
    for (int b : zero_gather_waits_[std::size_t(seg + 1)]) {
      zero_ag_h_[std::size_t(b)].wait();
      zero_ag_h_[std::size_t(b)] = Handle();
    }
  }
}

template <class B>
void TrainingLoop<B>::wait_zero_gathers() {
  for (auto& h : zero_ag_h_) {
    h.wait();
    h = Handle();
  }
}

// zero.offload_optimizer nvme: the file of this rank (offload.hpp), its planes the moments and,
// with zero.offload_params, ZeRO 3's parameter shards (offload_shards). On a device the master
// weights go to pinned host memory too (make_host_offload), unless the file holds them.
template <class B>
void TrainingLoop<B>::make_offload(std::size_t moments) {
  offload_params_ = z3_ && s_.zero.offload_params == "nvme";
  const auto chunk = static_cast<std::size_t>(s_.zero.offload_chunk_mb * 1048576.0 / 4.0);
  offload_ =
      std::make_unique<OffloadStore>(s_.zero.nvme_path, "rank" + std::to_string(world_.rank()),
                                     offload_params_ ? 3 : 2, moments, chunk, rec_);
  if (offload_params_) offload_shards(moments);
  if constexpr (!B::kHostMemory) make_host_offload(moments, false);
}

// zero.offload_params: the storage's shards (`shard_elems`, segments in memory order) written to
// the file's plane 2 and the storage's array freed; the staging of the shards being gathered, by
// working buffer, at the largest shard's size: four host arrays here (and an MoE block's experts'
// two, sized when read), or on a device the backend's staging (four slots, six with experts).
template <class B>
void TrainingLoop<B>::offload_shards(std::size_t shard_elems) {
  std::size_t max_shard = 0;
  bool experts = false;
  for (const auto& sg : z3_->segments()) {
    max_shard = std::max(max_shard, sg.part.shard);
    experts = experts || sg.expert;
  }
  if constexpr (B::kHostMemory) {
    offload_->write(2, 0, shard_elems, z3_->params(), -1);
    for (auto& st : z3_stage_) st.resize(max_shard);
  } else {
    std::vector<float> shards(shard_elems);
    backend_.download(shards.data(), z3_->params(), shard_elems);
    offload_->write(2, 0, shard_elems, shards.data(), -1);
    backend_.make_shard_staging(experts ? 6 : 4, max_shard);
  }
  z3_->release_params();
}

// ZeRO-Offload on a device (offload_pipeline.hpp): the master weights of the `moments` elements
// this rank updates, with `pinned_moments` their AdamW moments too, in the backend's pinned host
// memory; AdamW steps there (offloaded_adamw). Host memory already holds everything on device cpu,
// where the scenario refuses 'host'.
template <class B>
void TrainingLoop<B>::make_host_offload(std::size_t moments, bool pinned_moments) {
  if constexpr (B::kHostMemory) {
    (void)moments;
    (void)pinned_moments;
    throw InputError(loop_detail::origin_of(s_) +
                     ": key 'zero.offload_optimizer': 'host' needs a device whose memory is not "
                     "the host's (runtime.device cuda)");
  } else {
    const auto chunk = offload_
                           ? offload_->chunk_elems()
                           : static_cast<std::size_t>(s_.zero.offload_chunk_mb * 1048576.0 / 4.0);
    // offload_params: the file's plane 2 is the master weights (the device holds no shard).
    backend_.make_host_offload(moments, pinned_moments, chunk, !offload_params_);
    master_stale_ = true;
  }
}

template <class B>
TrainingLoop<B>::~TrainingLoop() {
  try {
    wait_zero_gathers();  // none still writes into the parameters
  } catch (...) {
    // A failed collective: the job is ending; drain below waits for the rest.
  }
  backend_.drain();                 // nothing queued still reads a buffer when the members go
  if (offload_) offload_->drain();  // nor a read-ahead into z3_stage_
}

template <class B>
void TrainingLoop<B>::prepare() {
  if (!z3_) ddp_->broadcast_parameters();  // ZeRO 3 shards come from the same seed on every rank
  backend_.synchronize();
  world_.barrier().wait();
  record_memory();
}

template <class B>
void TrainingLoop<B>::finish() {
  backend_.finish();
}

template <class B>
std::size_t TrainingLoop<B>::flat_elems() const {
  std::size_t n = 0;
  for (const auto& t : layout_of(*model_).tensors) n = std::max(n, t.offset + t.count);
  return n;
}

template <class B>
MemoryBytes TrainingLoop<B>::memory() const {
  MemoryBytes m;
  double acts = static_cast<double>(scratch_->memory.size_bytes()) + backend_.scratch_bytes();
  for (const auto& a : acts_) {
    acts += static_cast<double>(a->memory.size_bytes());
    acts += static_cast<double>(moe_state_bytes(*a));  // MoE blocks' state
  }
  m.activations = acts;
  if (z3_) {
    const double shard = static_cast<double>(z3_->shard_elems()) * sizeof(float);
    m.parameters = shard;
    m.gradients = shard;
    m.optimizer = 2 * shard;
    if (offload_) {
      m.optimizer = static_cast<double>(offload_->buffer_bytes());
      m.offload_nvme = static_cast<double>(offload_->file_bytes());
    }
    count_host_offload(m);
    if (offload_params_) {
      m.parameters = 0;  // the staging of the shards being gathered instead
      if constexpr (B::kHostMemory) {
        for (const auto& st : z3_stage_) m.parameters += static_cast<double>(st.size_bytes());
        for (const auto& st : z3_estage_) m.parameters += static_cast<double>(st.size_bytes());
      } else {
        m.parameters = static_cast<double>(backend_.shard_staging()->device_bytes());
      }
    }
    m.comm_buffers =
        static_cast<double>(z3_->buffer_bytes() + z3_recv_.size_bytes() + kv_buf_.size_bytes());
    for (const auto& g : grad_send_) m.comm_buffers += static_cast<double>(g.size_bytes());
    return m;
  }
  m.parameters = static_cast<double>(model_->params.size_bytes());
  const double full_grads = static_cast<double>(model_->grads.size_bytes());
  m.optimizer = static_cast<double>(adam_m_.size_bytes() + adam_v_.size_bytes());
  if (offload_) {
    m.optimizer = static_cast<double>(offload_->buffer_bytes());  // the three chunk buffers
    m.offload_nvme = static_cast<double>(offload_->file_bytes());
  }
  count_host_offload(m);
  double comm = static_cast<double>(ddp_->comm_buffer_bytes() + kv_buf_.size_bytes());
  for (const auto& g : grad_send_) comm += static_cast<double>(g.size_bytes());  // pipeline
  if (zero12() && s_.parallel.zero == 2) {
    // The shard is the gradient state; the full array only stages one backward before scattering.
    m.gradients = static_cast<double>(zero_grads_.size_bytes() + ezero_grads_.size_bytes());
    comm += full_grads + static_cast<double>(zero_recv_.size_bytes() + ezero_recv_.size_bytes());
  } else {
    m.gradients = full_grads;
    // ZeRO 1: the reduce-scatter output (MoE, ep > 1: the experts' too, and the staging buffer)
    comm += static_cast<double>(zero_grads_.size_bytes() + ezero_grads_.size_bytes());
  }
  m.comm_buffers = comm + static_cast<double>(zero_stage_.size_bytes());
  return m;
}

// ZeRO-Offload on a device: no optimizer state in device memory; the pinned arrays (and with nvme
// the store's chunk buffers, host memory too; with offload_params the shards' host staging)
// counted as mem.offload_host.
template <class B>
void TrainingLoop<B>::count_host_offload(MemoryBytes& m) const {
  if constexpr (!B::kHostMemory) {
    if (const auto* h = backend_.host_offload()) {
      m.optimizer = 0;
      m.offload_host = static_cast<double>(h->pinned_bytes());
      if (offload_) m.offload_host += static_cast<double>(offload_->buffer_bytes());
      if (const auto* st = backend_.shard_staging())
        m.offload_host += static_cast<double>(st->host_bytes());
    }
  }
}

template <class B>
bool TrainingLoop<B>::host_moments() const {
  if constexpr (B::kHostMemory) {
    return true;
  } else {
    return offload_ != nullptr || backend_.host_offload() != nullptr;
  }
}

template <class B>
void TrainingLoop<B>::record_memory() {
  if (rec_ == nullptr) return;
  const int64_t now = profiler::steady_now_ns();
  const MemoryBytes m = memory();
  rec_->counter(names::kMemParameters.data(), m.parameters, now);
  rec_->counter(names::kMemGradients.data(), m.gradients, now);
  rec_->counter(names::kMemOptimizer.data(), m.optimizer, now);
  rec_->counter(names::kMemActivations.data(), m.activations, now);
  rec_->counter(names::kMemCommBuffers.data(), m.comm_buffers, now);
  if (offload_) rec_->counter(names::kMemOffloadNvme.data(), m.offload_nvme, now);
  if (!B::kHostMemory && host_moments())
    rec_->counter(names::kMemOffloadHost.data(), m.offload_host, now);
}

template <class B>
bool TrainingLoop<B>::unscale_and_check_overflow() {
  if constexpr (!B::kHostMemory) {
    throw InputError("key 'runtime.precision': fp16 loss scaling runs on device cpu only");
  } else {
    float* g = model_->grads.data() + opt_offset_;
    std::size_t n = opt_count_;
    if (z3_) {
      g = z3_->grads();
      n = z3_->shard_elems();
    } else if (zero12()) {
      g = zero_grads_.data();
      n = zero_grads_.size();
    }
    float overflow = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (!std::isfinite(g[i])) {
        overflow = 1;
        break;
      }
    }
    for (std::size_t i = 0; i < ezero_grads_.size(); ++i) {  // MoE, ep > 1, ZeRO 1/2
      if (!std::isfinite(ezero_grads_.data()[i])) overflow = 1;
    }
    // Over dp, then tp, then pp: the max over the whole world, so every rank skips together.
    for (Communicator* c : {groups_.dp.get(), groups_.tp.get(), groups_.pp.get()}) {
      if (c == nullptr || c->size() < 2) continue;
      c->all_reduce(&overflow, 1, DType::F32, ReduceOp::Max,
                    OpLabel{names::kLossScaleOverflow.data(), step_, -1, -1})
          .wait();
    }
    if (overflow != 0) return true;
    const auto inv = static_cast<float>(1.0 / scaler_->scale());
    for (std::size_t i = 0; i < n; ++i) g[i] *= inv;
    for (std::size_t i = 0; i < ezero_grads_.size(); ++i) ezero_grads_.data()[i] *= inv;
    return false;
  }
}

template <class B>
int TrainingLoop<B>::open(traces::SpanKind kind, const char* name, int32_t micro_batch) {
  if (rec_ == nullptr) return -1;
  traces::Span s;
  s.kind = kind;
  s.name = rec_->intern(name);
  s.step = step_;
  s.micro_batch = micro_batch;
  return backend_.open(s, name);
}

template <class B>
std::vector<float> TrainingLoop<B>::parameters() {
  std::vector<float> out(flat_elems());
  if (z3_) {
    // Each segment gathered over the dp group into a scratch buffer, its real elements kept.
    for (const auto& sg : z3_->segments()) {
      Array full(sg.part.padded());
      std::vector<float> mine;
      Array on_device;  // offload_params on a device: the shard uploaded for the gather
      const float* send = z3_->params() + sg.shard_offset;
      if (offload_params_) {
        mine.resize(sg.part.shard);
        offload_->read(2, sg.shard_offset, sg.part.shard, mine.data(), step_);
        send = mine.data();
        if constexpr (!B::kHostMemory) {
          on_device = Array(sg.part.shard);
          backend_.upload(on_device.data(), mine.data(), sg.part.shard);
          send = on_device.data();
        }
      }
      z3_all_gather(sg, send, full.data(), OpLabel{}).wait();
      backend_.synchronize();
      backend_.download(out.data() + sg.range.offset, full.data(), sg.range.count);
    }
    return out;
  }
  wait_zero_gathers();
  backend_.synchronize();
  backend_.download(out.data(), model_->params.data(), out.size());
  return out;
}

// --- checkpoint state

template <class B>
float* TrainingLoop<B>::stage(float* data, std::size_t n, bool upload) {
  if constexpr (B::kHostMemory) {
    return data;
  } else {
    Staged st;
    st.device = data;
    st.host.resize(n);
    st.upload = upload;
    if (!upload) backend_.download(st.host.data(), data, n);  // saving: the current values
    staged_.push_back(std::move(st));
    return staged_.back().host.data();
  }
}

template <class B>
std::vector<StateRange> TrainingLoop<B>::state_to_save() {
  wait_zero_gathers();
  staged_.clear();
  backend_.synchronize();
  std::vector<StateRange> out;
  auto add = [&](std::size_t offset, std::size_t count, float* p, float* m, float* v, bool load) {
    out.push_back({offset, count, p ? stage_params(p, count, load) : nullptr,
                   m ? stage_moments(m, count, load) : nullptr,
                   v ? stage_moments(v, count, load) : nullptr});
  };
  // The offload file's planes copied to memory (off_ckpt_), valid as long as the ranges.
  read_offload_state();
  float* mom_m = moment_plane(0);
  float* mom_v = moment_plane(1);
  if (z3_) {
    float* params = offload_params_ ? off_ckpt_[2].data() : z3_->params();
    for (const auto& sg : z3_->segments()) {
      if (sg.part.count() == 0) continue;
      add(sg.range.offset + sg.part.begin(), sg.part.count(), params + sg.shard_offset,
          mom_m + sg.shard_offset, mom_v + sg.shard_offset, false);
    }
    return out;
  }
  if (s_.parallel.zero == 0 && layout_.dp_rank != 0) {
    // dp rank 0 holds the same, but for the experts of the other ep ranks (MoE, ep > 1): their
    // first holders (dp ranks 1..ep-1, the first of their edp groups) save those.
    const std::size_t n = flat_elems(), e = dense_elems_;
    if (layout_.dp_rank < layout_.ep && e < n)
      add(e, n - e, model_->params.data() + e, mom_m + e, mom_v + e, false);
    return out;
  }
  if (zbuckets_) {  // this rank's part of each bucket
    for (const auto& r : opt_ranges_) {
      add(r.flat, r.count, model_->params.data() + r.flat, mom_m + r.moment, mom_v + r.moment,
          false);
    }
    return out;
  }
  if (opt_count_ > 0) {
    add(opt_offset_, opt_count_, model_->params.data() + opt_offset_, mom_m, mom_v, false);
  }
  if (ezero_.count() > 0) {  // MoE, ep > 1, ZeRO 1/2: this rank's shard of its experts
    const std::size_t off = expert_offset_ + ezero_.begin(), k = zero_.shard;
    add(off, ezero_.count(), model_->params.data() + off, mom_m + k, mom_v + k, false);
  }
  return out;
}

template <class B>
std::vector<StateRange> TrainingLoop<B>::state_to_load() {
  if (z3_) {
    std::vector<StateRange> out = state_to_save();
    for (auto& st : staged_) st.upload = true;  // whatever is read goes back to the device
    off_upload_ = offload_ != nullptr;          // and into the offload file
    return out;
  }
  wait_zero_gathers();
  staged_.clear();
  std::vector<StateRange> out;
  const std::size_t n = flat_elems();
  out.push_back({0, n, stage(model_->params.data(), n, true), nullptr, nullptr});
  if (zbuckets_) {
    for (const auto& r : opt_ranges_) {
      out.push_back({r.flat, r.count, nullptr, stage(adam_m_.data() + r.moment, r.count, true),
                     stage(adam_v_.data() + r.moment, r.count, true)});
    }
    return out;
  }
  if (opt_count_ == 0 && ezero_.count() == 0) return out;
  read_offload_state();
  off_upload_ = offload_ != nullptr;
  float* mom_m = moment_plane(0);
  float* mom_v = moment_plane(1);
  if (opt_count_ > 0) {
    out.push_back({opt_offset_, opt_count_, nullptr, stage_moments(mom_m, opt_count_, true),
                   stage_moments(mom_v, opt_count_, true)});
  }
  if (ezero_.count() > 0) {  // MoE, ep > 1, ZeRO 1/2: the moments of this rank's expert shard
    const std::size_t en = ezero_.count(), k = zero_.shard;
    out.push_back({expert_offset_ + ezero_.begin(), en, nullptr, stage_moments(mom_m + k, en, true),
                   stage_moments(mom_v + k, en, true)});
  }
  return out;
}

// The parameters' checkpoint copies: host memory already under offload_params (the file's plane 2
// read into off_ckpt_[2]), else staged like any device array.
template <class B>
float* TrainingLoop<B>::stage_params(float* data, std::size_t n, bool upload) {
  return offload_params_ ? data : stage(data, n, upload);
}

// The moments' checkpoint copies: host memory already under offload (the file's planes read into
// off_ckpt_, or a device's pinned arrays), else staged like any device array.
template <class B>
float* TrainingLoop<B>::stage_moments(float* data, std::size_t n, bool upload) {
  return host_moments() ? data : stage(data, n, upload);
}

// Moment plane j (0: m, 1: v) as the checkpoint reads and writes it.
template <class B>
float* TrainingLoop<B>::moment_plane(int j) {
  if (offload_) return off_ckpt_[j].data();
  if constexpr (!B::kHostMemory) {
    if (auto* h = backend_.host_offload()) return j == 0 ? h->m() : h->v();
  }
  return j == 0 ? adam_m_.data() : adam_v_.data();
}

template <class B>
void TrainingLoop<B>::read_offload_state() {
  off_upload_ = false;
  if (!offload_) return;
  for (int j = 0; j < (offload_params_ ? 3 : 2); ++j) {
    off_ckpt_[j].resize(offload_->elems());
    offload_->read(j, 0, offload_->elems(), off_ckpt_[j].data(), step_);
  }
}

template <class B>
void TrainingLoop<B>::commit_loaded_state() {
  for (auto& st : staged_) {
    if (st.upload) backend_.upload(st.device, st.host.data(), st.host.size());
  }
  staged_.clear();
  for (int j = 0; off_upload_ && j < (offload_params_ ? 3 : 2); ++j)
    offload_->write(j, 0, offload_->elems(), off_ckpt_[j].data(), step_);
  off_upload_ = false;
  for (auto& c : off_ckpt_) c = std::vector<float>();
  for (int& st : z3_staged_) st = -99;  // offload_params: the file holds the loaded shards
  master_stale_ = true;                 // a device's offload: the loaded parameters are the master
  backend_.synchronize();
}

template <class B>
void TrainingLoop<B>::restore_counters(int32_t steps_done, int64_t adamw_steps,
                                       int64_t data_calls) {
  step_ = steps_done;
  adam_steps_ = adamw_steps;
  loader_->seek(data_calls);
}

template <class B>
std::optional<CompressionState> TrainingLoop<B>::compression_state() const {
  const CompressionHook* hook =
      ddp_ ? static_cast<const DataParallel&>(*ddp_).compression() : nullptr;
  if (hook == nullptr) return std::nullopt;
  CompressionState st;
  hook->get_state(st.residuals, st.q);
  return st;
}

template <class B>
void TrainingLoop<B>::restore_compression_state(const CompressionState& st) {
  CompressionHook* hook = ddp_ ? ddp_->compression() : nullptr;
  if (hook != nullptr) hook->set_state(st.residuals, st.q);
}

// --- one step

// MoE: DDP's hook also completes the experts' buckets; the all-to-alls over the ep group; the
// routing tallied for the step's counters.
template <class B>
void TrainingLoop<B>::moe_hooks(GptHooks& hooks) {
  if (edp_) {
    hooks.on_grads_ready = [this](int segment) {
      ddp_->on_grads_ready(segment);
      if (expert_segment_[std::size_t(segment + 1)]) edp_->on_grads_ready(segment);
    };
  }
  if (dev_.ep != nullptr) {
    hooks.ep_all_to_all = [this](const char* name, int layer, const float* send,
                                 const int64_t* send_counts, std::size_t groups, float* recv,
                                 int64_t* recv_counts, std::size_t capacity) {
      dev_.ep
          ->all_to_all_v(send, send_counts, groups, recv, recv_counts, capacity, DType::F32,
                         OpLabel{name, step_, cur_mb_, layer})
          .wait();
    };
  }
  const Gpt& g = layout_of(*model_);
  const auto E = std::size_t(g.moe_dims.E);
  moe_tokens_.assign(std::size_t(g.num_blocks()) * E, 0.0);
  moe_dropped_.assign(std::size_t(g.num_blocks()), 0.0);
  moe_aux_ = 0;
  hooks.on_routing = [this, E, first = g.shard.layer_begin](int layer, const model::moe::Routing& r,
                                                            double aux) {
    const auto b = std::size_t(layer - first);
    for (std::size_t e = 0; e < E; ++e) moe_tokens_[b * E + e] += double(r.routed[e]);
    moe_dropped_[b] += double(r.dropped);
    moe_aux_ += aux;
  };
}

// The step's MoE counters (model/moe.hpp: per held MoE block and expert, summed over the step's
// micro-batches) and its aux loss.
template <class B>
void TrainingLoop<B>::record_moe_counters(StepResult& result) {
  result.aux_loss = moe_aux_ / micro_batches_;
  if (rec_ == nullptr) return;
  const Gpt& g = layout_of(*model_);
  const int64_t now = profiler::steady_now_ns();
  const auto E = std::size_t(g.moe_dims.E);
  for (int l = g.shard.layer_begin; l < g.shard.layer_end; ++l) {
    if (!g.is_moe_block(l)) continue;
    const auto b = std::size_t(l - g.shard.layer_begin);
    for (std::size_t e = 0; e < E; ++e) {
      rec_->counter(model::moe::moe_tokens_counter(l, int(e)).c_str(), moe_tokens_[b * E + e], now);
    }
    rec_->counter(model::moe::moe_dropped_counter(l).c_str(), moe_dropped_[b], now);
  }
}

// A pass of micro-batch `mb` begins: its labels and the slot of its activations (mb % in flight).
template <class B>
std::size_t TrainingLoop<B>::begin_pass(int mb) {
  cur_mb_ = mb;
  if (rec_ != nullptr) rec_->set_step(step_, mb);
  if (observer_) observer_->set_context(step_, mb);
  return static_cast<std::size_t>(mb) % acts_.size();
}

// Data on the stages that hold the embedding or the head; the activation received before / sent
// after the stage's forward (pp > 1).
template <class B>
void TrainingLoop<B>::forward_pass(int mb, const GptHooks& hooks, double& loss_sum) {
  const int32_t step = step_;
  const std::size_t slot = begin_pass(mb);
  auto& acts = *acts_[slot];
  // The slot's previous activation send must be done before its buffer is overwritten.
  act_send_h_[slot].wait();
  const GptShard& sh = layout_of(*model_).shard;
  if (sh.has_embed || sh.has_head) {
    traces::Span data;
    data.kind = traces::SpanKind::Data;
    if (rec_ != nullptr) data.name = rec_->intern(names::kDataLoad.data());
    data.step = step;
    data.micro_batch = mb;
    profiler::ScopedSpan span(rec_, data);  // the host loader: a host span on every backend
    loader_->next_batch(batch_);
  }
  const int fwd = open(traces::SpanKind::Phase, names::kForward.data(), mb);
  if (!sh.has_embed) {
    dev_.pp
        ->recv(acts.stage_input(), acts.boundary_elems, DType::F32, layout_.pp_rank - 1,
               OpLabel{names::kRecvActivation.data(), step, mb, -1})
        .wait();
  }
  loss_sum += z3_ ? z3_forward(acts, mb, hooks)
                  : pieces::forward(backend_.kernels(), *model_, acts, batch_.inputs.data(),
                                    batch_.targets.data(), hooks);
  if (!sh.has_head) {
    act_send_h_[slot] =
        dev_.pp->send(acts.stage_output(), acts.boundary_elems, DType::F32, layout_.pp_rank + 1,
                      OpLabel{names::kSendActivation.data(), step, mb, -1});
  }
  close(fwd);
}

// The output gradient received first on a stage without the head, DDP's all-reduce during the
// last micro-batch's backward, the input gradient sent back (from a buffer of its own: the scratch
// is the next backward's) on a stage without the embedding, then ZeRO's reduce-scatter.
template <class B>
void TrainingLoop<B>::backward_pass(int mb, const GptHooks& hooks, float loss_scale) {
  const int32_t step = step_;
  const std::size_t slot = begin_pass(mb);
  auto& acts = *acts_[slot];
  const GptShard& sh = layout_of(*model_).shard;
  const int bwd = open(traces::SpanKind::Phase, names::kBackward.data(), mb);
  if (!sh.has_head) {
    dev_.pp
        ->recv(scratch_->dres, acts.boundary_elems, DType::F32, layout_.pp_rank + 1,
               OpLabel{names::kRecvGradient.data(), step, mb, -1})
        .wait();
  }
  const bool last_mb = mb == micro_batches_ - 1;  // both schedules end with the last backward
  if (z3_) {
    z3_backward(acts, mb, hooks, loss_scale);
  } else {
    // ZeRO 1 with a compressed step: DDP's compressed reduction of the whole gradient, then each
    // rank keeps its shard of the average (reduce_gradients_zero) instead of a reduce-scatter.
    // zero.overlap_grad_reduce: the buckets' reduce-scatters (every micro-batch under ZeRO 2),
    // waited for in reduce_gradients_zero after the pipeline send.
    const bool zsync = zbuckets_ && (s_.parallel.zero == 2 || last_mb);
    ddp_->begin_backward(((!zero12() || ddp_->compresses(step)) && last_mb) || zsync, step, mb);
    if (edp_) edp_->begin_backward(last_mb, step, mb);
    pieces::backward(backend_.kernels(), *model_, acts, *scratch_, loss_scale, hooks);
    if (!zbuckets_) ddp_->finish_backward();
    if (edp_) {
      edp_->finish_backward();
      if (last_mb && layout_.ep > 1) {
        const auto inv = static_cast<float>(1.0 / layout_.ep);
        for (const auto& b : edp_->buckets())
          backend_.scale(model_->grads.data() + b.range.offset, inv, b.range.count);
      }
    }
  }
  if (!sh.has_embed) {
    grad_send_h_[slot].wait();
    Array& buf = grad_send_[slot];
    backend_.copy(buf.data(), scratch_->dres, buf.size());
    grad_send_h_[slot] = dev_.pp->send(buf.data(), buf.size(), DType::F32, layout_.pp_rank - 1,
                                       OpLabel{names::kSendGradient.data(), step, mb, -1});
  }
  if (z3_) z3_finish_backward(mb);
  if (zero12() && (s_.parallel.zero == 2 || last_mb)) reduce_gradients_zero(mb);
  close(bwd);
}

// The tied wte's gradient summed over the first and last stage (pp > 1; a no-op elsewhere).
template <class B>
void TrainingLoop<B>::embed_all_reduce() {
  if (dev_.embed == nullptr || !layout_of(*model_).config.arch.tied_embeddings) return;
  const ParamTensor& wte = layout_of(*model_).tensor("wte");
  dev_.embed
      ->all_reduce(model_->dembed.wte, wte.count, DType::F32, ReduceOp::Sum,
                   OpLabel{names::kEmbedAllReduce.data(), step_, -1, -1})
      .wait();
}

// Key/value heads replicated over tp (model/parameters.hpp: fewer kv heads than tp ranks, each on
// tp / kv_heads consecutive ranks): every rank sharing a head holds the part of its gradient that
// its own query heads produced, and the head's gradient is their sum. Summed over the tp group
// with one all-reduce of a buffer holding a slot per kv head, each rank writing its head's slot
// (the k and v rows of qkvw, and of qkvb with biases) and zeros elsewhere, so a slot sums its
// head's ranks and no other's: kv_heads times the bytes of a sub-group's all-reduce (the same for
// multi-query attention). Linear, so its place among the dp reductions does not change the sum:
// after DDP's all-reduce, before ZeRO 1/2's reduce-scatter, before each ZeRO 3 block's.
template <class B>
void TrainingLoop<B>::kv_grad_all_reduce(int layer, int mb) {
  const Gpt& g = layout_of(*model_);
  const BlockDims& d = g.dims;
  const auto& grads = model_->dblocks[pieces::block_index(*model_, layer)];
  const std::size_t rows = 2 * std::size_t(d.Ckvl), q = std::size_t(d.Cl);
  const std::size_t wn = rows * std::size_t(d.C), bn = grads.qkvb != nullptr ? rows : 0;
  float* mine = kv_buf_.data() + std::size_t(layout_.tp_rank / kv_replicas_) * (wn + bn);
  backend_.zero(kv_buf_.data(), kv_buf_.size());
  backend_.copy(mine, grads.qkvw + q * std::size_t(d.C), wn);
  if (bn > 0) backend_.copy(mine + wn, grads.qkvb + q, bn);
  dev_.tp
      ->all_reduce(kv_buf_.data(), kv_buf_.size(), DType::F32, ReduceOp::Sum,
                   OpLabel{names::kTpKvGradAllReduce.data(), step_, mb, layer})
      .wait();
  backend_.copy(grads.qkvw + q * std::size_t(d.C), mine, wn);
  if (bn > 0) backend_.copy(grads.qkvb + q, mine + wn, bn);
}

// Every block this rank holds, first to last.
template <class B>
void TrainingLoop<B>::kv_grad_all_reduce_blocks(int mb) {
  if (kv_replicas_ == 1) return;
  const GptShard& sh = layout_of(*model_).shard;
  for (int l = sh.layer_begin; l < sh.layer_end; ++l) kv_grad_all_reduce(l, mb);
}

template <class B>
void TrainingLoop<B>::reduce_gradients_zero(int mb) {
  kv_grad_all_reduce_blocks(mb);
  embed_all_reduce();
  if (ddp_->compresses(step_)) {
    // ZeRO 1, compressed: the gradients are averaged already (same order as without ZeRO: DDP,
    // then the kv and wte sums); this rank's shard of them, as the reduce-scatter would give.
    backend_.copy(zero_grads_.data(), model_->grads.data() + zero_.begin(), zero_.shard);
    return;
  }
  const GptShard& sh = layout_of(*model_).shard;
  float* out = s_.parallel.zero == 2 ? zero_recv_.data() : zero_grads_.data();
  if (zbuckets_) {
    ddp_->finish_backward();  // the held bucket issued; every bucket's part scattered into `out`
  } else {
    dev_.dp
        ->reduce_scatter(
            model_->grads.data(), out, zero_.shard, DType::F32, ReduceOp::Avg,
            OpLabel{kZeroReduceScatterName, step_, mb,
                    holds_embedding_segment(layout_of(*model_)) ? kEmbedSegment : sh.layer_begin})
        .wait();
  }
  if (ezero_.total > 0) reduce_expert_gradients_zero(mb);
  if (s_.parallel.zero == 2) {
    backend_.add(zero_grads_.data(), out, zero_.shard);         // the shard gradient accumulates
    backend_.zero(model_->grads.data(), model_->grads.size());  // the next backward: a clean array
  }
}

// MoE with ep > 1 under ZeRO 1/2: the experts' reduce-scatter over their edp group, averaged there
// and divided by ep (sum over edp / dp, model/moe.hpp), into this rank's expert shard.
template <class B>
void TrainingLoop<B>::reduce_expert_gradients_zero(int mb) {
  float* out = s_.parallel.zero == 2 ? ezero_recv_.data() : ezero_grads_.data();
  const float* g = model_->grads.data() + expert_offset_;
  if (dev_.edp != nullptr) {
    const Gpt& m = layout_of(*model_);
    int lowest = m.shard.layer_end;
    for (int l = m.shard.layer_begin; l < m.shard.layer_end; ++l) {
      if (m.expert_range(l).count > 0) lowest = std::min(lowest, l);
    }
    dev_.edp
        ->reduce_scatter(g, out, ezero_.shard, DType::F32, ReduceOp::Avg,
                         OpLabel{kZeroReduceScatterName, step_, mb, lowest})
        .wait();
  } else {
    backend_.copy(out, g, ezero_.shard);  // an edp group of one: the whole expert range
  }
  backend_.scale(out, static_cast<float>(1.0 / layout_.ep), ezero_.shard);
  if (s_.parallel.zero == 2) backend_.add(ezero_grads_.data(), out, ezero_.shard);
}

// MoE with ep > 1 under ZeRO 1/2: the dense shards all-gathered over dp through zero_stage_ (its
// padding would overwrite the experts after the dense tensors), the expert shards over edp in place
// (their padding lies past the array's real end).
template <class B>
void TrainingLoop<B>::gather_zero_shards_ep() {
  float* p = model_->params.data();
  backend_.copy(zero_stage_.data() + zero_.begin(), p + zero_.begin(), zero_.count());
  dev_.dp
      ->all_gather(zero_stage_.data() + zero_.begin(), zero_stage_.data(), zero_.shard, DType::F32,
                   OpLabel{kZeroAllGatherName, step_, -1, -1})
      .wait();
  backend_.copy(p, zero_stage_.data(), expert_offset_);
  if (dev_.edp != nullptr) {
    dev_.edp
        ->all_gather(p + expert_offset_ + ezero_.begin(), p + expert_offset_, ezero_.shard,
                     DType::F32, OpLabel{kZeroAllGatherName, step_, -1, -1})
        .wait();
  }
}

// --- ZeRO 3. Working buffers (zero3_slot): 0/1 blocks by layer parity, 2 embedding, 3 final LN.
// On a device every operation is ordered against the compute stream by the device communicator
// (issued after the kernels queued so far; Handle::wait puts the compute stream behind it), so a
// working buffer is never gathered into while queued kernels still read it, nor cleared while its
// reduce-scatter reads it.
template <class B>
void TrainingLoop<B>::z3_gather(int segment, int slot, int mb) {
  auto& sg = z3_->segment(segment);
  const float* send = offload_params_ ? z3_shard(segment, slot) : z3_->params() + sg.shard_offset;
  z3_gather_h_[slot] = dev_.dp->all_gather(send, z3_->param_buffer(slot), sg.part.shard, DType::F32,
                                           OpLabel{kZeroFetchLayerName, step_, mb, segment});
  // MoE: the block's experts, over their edp group, into the experts' buffer of this slot.
  if (const Zero3Segment* e = slot < 2 ? z3_->expert_segment(segment) : nullptr) {
    const float* esend =
        offload_params_ ? z3_expert_shard(*e, slot) : z3_->params() + e->shard_offset;
    z3_egather_h_[slot] = z3_all_gather(*e, esend, z3_->expert_param_buffer(slot),
                                        OpLabel{kZeroFetchLayerName, step_, mb, segment});
  }
  z3_gathered_[slot] = segment;
}

// offload_params: an MoE block's experts' shard read from the file (the slot's previous gather is
// done), on a device through staging slot 4 + slot.
template <class B>
const float* TrainingLoop<B>::z3_expert_shard(const Zero3Segment& e, int slot) {
  if constexpr (B::kHostMemory) {
    z3_estage_[slot].resize(e.part.shard);
    offload_->read(2, e.shard_offset, e.part.shard, z3_estage_[slot].data(), step_);
    return z3_estage_[slot].data();
  } else {
    ShardStaging& st = *backend_.shard_staging();
    offload_->read(2, e.shard_offset, e.part.shard, st.host(4 + slot), step_);
    return st.upload(4 + slot, e.part.shard, step_, e.id);
  }
}

template <class B>
Communicator* TrainingLoop<B>::z3_group(const Zero3Segment& sg) const {
  if (!sg.expert) return dev_.dp;
  return layout_.ep > 1 ? dev_.edp : dev_.dp;
}

template <class B>
Handle TrainingLoop<B>::z3_all_gather(const Zero3Segment& sg, const float* send, float* recv,
                                      const OpLabel& label) {
  if (Communicator* c = z3_group(sg)) {
    return c->all_gather(send, recv, sg.part.shard, DType::F32, label);
  }
  backend_.copy(recv, send, sg.part.shard);  // a group of one: the shard is the whole segment
  return Handle();
}

template <class B>
Handle TrainingLoop<B>::z3_scatter_avg(const Zero3Segment& sg, const float* send, float* recv,
                                       const OpLabel& label) {
  if (Communicator* c = z3_group(sg)) {
    return c->reduce_scatter(send, recv, sg.part.shard, DType::F32, ReduceOp::Avg, label);
  }
  backend_.copy(recv, send, sg.part.shard);
  return Handle();
}

// offload_params: the staging of working buffer `slot` is free once that buffer's gather is done
// (the all-gather reads it as its send buffer). On a device the host staging is uploaded into the
// device staging, the send buffer (again for each gather: the upload is the device's copy).
template <class B>
const float* TrainingLoop<B>::z3_shard(int segment, int slot) {
  if (z3_staged_[slot] != segment) z3_prefetch_shard(segment, slot);
  if (z3_stage_ticket_[slot] != 0) {
    const uint64_t t = z3_stage_ticket_[slot];
    z3_stage_ticket_[slot] = 0;
    offload_->wait(t);
  }
  if constexpr (B::kHostMemory) {
    return z3_stage_[slot].data();
  } else {
    return backend_.shard_staging()->upload(slot, z3_->segment(segment).part.shard, step_, segment);
  }
}

template <class B>
void TrainingLoop<B>::z3_prefetch_shard(int segment, int slot) {
  if (z3_stage_ticket_[slot] != 0) offload_->wait(z3_stage_ticket_[slot]);
  const auto& sg = z3_->segment(segment);
  z3_stage_ticket_[slot] =
      offload_->read_async(2, sg.shard_offset, sg.part.shard, z3_stage_host(slot), step_);
  z3_staged_[slot] = segment;
}

template <class B>
float* TrainingLoop<B>::z3_stage_host(int slot) {
  if constexpr (B::kHostMemory) {
    return z3_stage_[slot].data();
  } else {
    return backend_.shard_staging()->host(slot);  // waits for the slot's last upload
  }
}

// offload_params on a device: the gathers from working buffer `slot`'s staging (and its experts')
// are waited for, so the compute stream is behind them: the next uploads into the staging may run
// after what it holds now.
template <class B>
void TrainingLoop<B>::z3_release_staging(int slot) {
  if constexpr (!B::kHostMemory) {
    if (!offload_params_) return;
    ShardStaging& st = *backend_.shard_staging();
    st.released(slot);
    if (slot < 2 && st.slots() > 4) st.released(4 + slot);
  } else {
    (void)slot;
  }
}

// The embedding and final LayerNorm serve both ends of every micro-batch: gathered once a step.
template <class B>
void TrainingLoop<B>::z3_gather_step_segments() {
  const GptShard& sh = layout_of(*model_).shard;
  const int L = layout_of(*model_).config.n_layer;
  for (int id : {kEmbedSegment, L}) {
    const bool held =
        id == kEmbedSegment ? holds_embedding_segment(layout_of(*model_)) : sh.has_head;
    if (!held) continue;
    const int slot = zero3_slot(id, L, sh.layer_begin);
    z3_gather(id, slot, -1);
    z3_gather_h_[slot].wait();
    z3_release_staging(slot);
    z3_->segment(id).bind(z3_->param_buffer(slot), z3_->grad_buffer(slot));
  }
}

template <class B>
void TrainingLoop<B>::z3_bind_block(int layer, int next_layer, int mb) {
  const GptShard& sh = layout_of(*model_).shard;
  const int slot = zero3_slot(layer, layout_of(*model_).config.n_layer, sh.layer_begin);
  if (z3_gathered_[slot] != layer) z3_gather(layer, slot, mb);
  z3_gather_h_[slot].wait();
  z3_egather_h_[slot].wait();
  z3_release_staging(slot);
  auto held = [&](int l) { return l >= sh.layer_begin && l < sh.layer_end; };
  // Prefetch: the next block's gather runs on the communicator while this one computes.
  if (held(next_layer)) z3_gather(next_layer, slot ^ 1, mb);
  // offload_params: the shard after that read from the file meanwhile, into this slot's staging
  // (its gather is done).
  const int after_next = 2 * next_layer - layer;
  if (offload_params_ && held(after_next)) z3_prefetch_shard(after_next, slot);
  z3_->segment(layer).bind(z3_->param_buffer(slot), z3_->grad_buffer(slot));
  if (const Zero3Segment* e = z3_->expert_segment(layer))
    e->bind(z3_->expert_param_buffer(slot), z3_->expert_grad_buffer(slot));
}

template <class B>
void TrainingLoop<B>::z3_reduce_scatter(int segment, int slot, int mb) {
  auto& sg = z3_->segment(segment);
  z3_rs_h_[slot] = dev_.dp->reduce_scatter(
      z3_->grad_buffer(slot), z3_recv_.data() + sg.shard_offset, sg.part.shard, DType::F32,
      ReduceOp::Avg, OpLabel{kZeroReduceScatterName, step_, mb, segment});
  // MoE: the block's experts averaged over edp (divided by ep in z3_finish_backward: the sum over
  // edp / dp, model/moe.hpp).
  if (const Zero3Segment* e = slot < 2 ? z3_->expert_segment(segment) : nullptr) {
    z3_ers_h_[slot] =
        z3_scatter_avg(*e, z3_->expert_grad_buffer(slot), z3_recv_.data() + e->shard_offset,
                       OpLabel{kZeroReduceScatterName, step_, mb, segment});
  }
}

template <class B>
float TrainingLoop<B>::z3_forward(typename B::Activations& acts, int mb, const GptHooks& hooks) {
  const auto& k = backend_.kernels();
  const GptShard& sh = layout_of(*model_).shard;
  if (sh.has_embed) pieces::embed_forward(k, *model_, acts, batch_.inputs.data(), hooks);
  for (int l = sh.layer_begin; l < sh.layer_end; ++l) {
    z3_bind_block(l, l + 1, mb);
    pieces::block_forward(k, *model_, acts, l, hooks);
    z3_gathered_[(l - sh.layer_begin) & 1] = -99;  // used: the backward gathers it again
  }
  return sh.has_head ? pieces::head_forward(k, *model_, acts, batch_.targets.data(), hooks) : 0.0f;
}

template <class B>
void TrainingLoop<B>::z3_backward(typename B::Activations& acts, int mb, const GptHooks& hooks,
                                  float loss_scale) {
  const auto& k = backend_.kernels();
  const GptShard& sh = layout_of(*model_).shard;
  const int L = layout_of(*model_).config.n_layer;
  GptHooks h = hooks;
  h.on_grads_ready = nullptr;         // no DDP buckets: each segment is scattered below
  acts.objective_scale = loss_scale;  // MoE: the aux loss's gradient scale (as pieces::backward)
  auto clear = [&](int slot, int segment) {
    backend_.zero(z3_->grad_buffer(slot), z3_->segment(segment).part.padded());
  };
  // The previous backward's scatters of these buffers were waited for in z3_finish_backward.
  if (holds_embedding_segment(layout_of(*model_))) clear(2, kEmbedSegment);
  if (sh.has_head) {
    clear(3, L);
    pieces::head_backward(k, *model_, acts, *scratch_, loss_scale, h);
    z3_reduce_scatter(L, 3, mb);
  }
  for (int l = sh.layer_end - 1; l >= sh.layer_begin; --l) {
    const int slot = zero3_slot(l, L, sh.layer_begin);
    z3_rs_h_[slot].wait();  // the buffer's previous gradients are scattered
    z3_ers_h_[slot].wait();
    z3_bind_block(l, l - 1, mb);
    clear(slot, l);
    if (const Zero3Segment* e = z3_->expert_segment(l))
      backend_.zero(z3_->expert_grad_buffer(slot), e->part.padded());
    pieces::block_backward(k, *model_, acts, *scratch_, l, h);
    if (kv_replicas_ > 1) kv_grad_all_reduce(l, mb);
    z3_reduce_scatter(l, slot, mb);
    z3_gathered_[slot] = -99;
  }
  if (sh.has_embed) pieces::embed_backward(k, *model_, acts, *scratch_, h);
}

// After the pipeline send of the backward pass (so a neighbour never waits behind a collective):
// the tied wte's gradient, the embedding's reduce-scatter, then every scattered shard accumulated.
template <class B>
void TrainingLoop<B>::z3_finish_backward(int mb) {
  if (holds_embedding_segment(layout_of(*model_))) {
    embed_all_reduce();  // dembed.wte is bound to working buffer 2
    z3_reduce_scatter(kEmbedSegment, 2, mb);
  }
  for (auto& hd : z3_rs_h_) hd.wait();
  for (auto& hd : z3_ers_h_) hd.wait();
  if (layout_.ep > 1) {  // MoE: the experts' sum over edp / dp
    const auto inv = static_cast<float>(1.0 / layout_.ep);
    for (const auto& sg : z3_->segments()) {
      if (sg.expert) backend_.scale(z3_recv_.data() + sg.shard_offset, inv, sg.part.shard);
    }
  }
  backend_.add(z3_->grads(), z3_recv_.data(), z3_->shard_elems());
}

// The step's passes: forward then backward per micro-batch, or the pipeline schedule's order.
template <class B>
void TrainingLoop<B>::run_passes(const GptHooks& hooks, double& loss_sum) {
  // fp16: the loss gradient scaled up (loss_scaler.hpp), divided again before the optimizer.
  const float loss_scale =
      static_cast<float>((scaler_ ? scaler_->scale() : 1.0) / static_cast<double>(micro_batches_));
  if (layout_.pp == 1) {
    for (int mb = 0; mb < micro_batches_; ++mb) {
      forward_pass(mb, hooks, loss_sum);
      backward_pass(mb, hooks, loss_scale);
    }
    return;
  }
  // pipeline.hpp: mb >= 0 a forward, -(mb+1) a backward.
  for (int pass :
       pipeline_order(schedule_of(s_.parallel), layout_.pp, layout_.pp_rank, micro_batches_)) {
    if (pass >= 0)
      forward_pass(pass, hooks, loss_sum);
    else
      backward_pass(-pass - 1, hooks, loss_scale);
  }
  // Every send of the step complete (and the handles dropped: the next step starts clean).
  for (auto& h : act_send_h_) h.wait();
  for (auto& h : grad_send_h_) h.wait();
  std::fill(act_send_h_.begin(), act_send_h_.end(), Handle());
  std::fill(grad_send_h_.begin(), grad_send_h_.end(), Handle());
}

// Phase "optimizer": AdamW on what this rank updates, then ZeRO 1/2's parameter all-gather.
template <class B>
void TrainingLoop<B>::optimizer_phase(bool apply) {
  const int opt = open(traces::SpanKind::Phase, names::kOptimizer.data(), -1);
  const int adamw = open(traces::SpanKind::Optimizer, names::kOptimizerStep.data(), -1);
  // A skipped step (fp16 overflow) keeps its spans, empty: parameters, moments and AdamW's step
  // count stay as they were, and ZeRO 1/2 has no new shard to gather.
  if (apply) ++adam_steps_;
  if (apply && z3_) {
    // Each segment's shard in place; decay ranges in absolute flat coordinates.
    for (const auto& sg : z3_->segments()) {
      if (sg.part.count() == 0) continue;
      const std::size_t k = sg.shard_offset;
      adamw_range(offload_params_ ? nullptr : z3_->params() + k, z3_->grads() + k, k,
                  sg.range.offset + sg.part.begin(), sg.part.count());
    }
    // offload_params: the staged shards are the old parameters.
    for (int& st : z3_staged_) st = -99;
    for (int& g : z3_gathered_) g = -99;  // the buffers hold the old parameters
  } else if (apply && zbuckets_) {
    // Per bucket: this rank's part, its gradients and moments at the part's place in the shard.
    for (const auto& r : opt_ranges_) {
      adamw_range(model_->params.data() + r.flat, zero_grads_.data() + r.moment, r.moment, r.flat,
                  r.count);
    }
  } else if (apply && opt_count_ > 0) {
    // ZeRO 1/2: the owned shard [begin, begin + count) only, its gradients in the shard array.
    const float* grads = zero12() ? zero_grads_.data() : model_->grads.data();
    adamw_range(model_->params.data() + opt_offset_, grads, 0, opt_offset_, opt_count_);
  }
  if (apply && ezero_.total > 0 && ezero_.count() > 0) {  // MoE, ep > 1: the expert shard
    const std::size_t off = expert_offset_ + ezero_.begin();
    adamw_range(model_->params.data() + off, ezero_grads_.data(), zero_.shard, off, ezero_.count());
  }
  if (apply) master_stale_ = false;
  close(adamw);
  if (zero12() && apply && ezero_.total > 0) {
    gather_zero_shards_ep();
  } else if (zero12() && apply && zbuckets_) {
    gather_zero_buckets();
  } else if (zero12() && apply) {
    // In place: this rank's shard is block dp_rank of the gathered array.
    dev_.dp
        ->all_gather(model_->params.data() + zero_.begin(), model_->params.data(), zero_.shard,
                     DType::F32, OpLabel{kZeroAllGatherName, step_, -1, -1})
        .wait();
  }
  close(opt);
}

// zero.overlap_grad_reduce: each bucket's parts all-gathered in place, in forward order (the
// embedding's bucket first, as Megatron dispatches them); with zero.overlap_param_gather each is
// waited for before the first forward that reads it (before_forward), else all here.
template <class B>
void TrainingLoop<B>::gather_zero_buckets() {
  const auto& buckets = ddp_->buckets();
  for (std::size_t i = buckets.size(); i-- > 0;) {
    const DdpBucket& b = buckets[i];
    float* p = model_->params.data() + b.range.offset;
    zero_ag_h_[i] =
        dev_.dp->all_gather(p + std::size_t(layout_.dp_rank) * b.shard, p, b.shard, DType::F32,
                            OpLabel{kZeroAllGatherName, step_, -1, b.lowest_layer});
  }
  if (!s_.zero.overlap_param_gather) wait_zero_gathers();
}

template <class B>
void TrainingLoop<B>::adamw_range(float* params, const float* grads, std::size_t moment_begin,
                                  std::size_t flat_offset, std::size_t count) {
  if constexpr (!B::kHostMemory) {
    if (backend_.host_offload() != nullptr) {
      offloaded_adamw(params, grads, moment_begin, flat_offset, count);
      return;
    }
  }
  if (!offload_) {
    backend_.adamw(params, grads, adam_m_.data() + moment_begin, adam_v_.data() + moment_begin,
                   flat_offset, count, decay_, adam_steps_, adamw_);
    return;
  }
  // Elementwise, so chunk by chunk gives the same bits as the whole range at once.
  offload_->for_each_chunk(moment_begin, count, step_,
                           [&](std::size_t first, std::size_t n, float* const* plane) {
                             const std::size_t d = first - moment_begin;
                             float* p = params != nullptr ? params + d : plane[2];
                             backend_.adamw(p, grads + d, plane[0], plane[1], flat_offset + d, n,
                                            decay_, adam_steps_, adamw_);
                           });
}

// ZeRO-Offload on a device (offload_pipeline.hpp): the range's gradients down chunk by chunk, AdamW
// on the host's master weights and moments (pinned arrays, or the file's planes), the parameters
// back up. The master weights start as the device's parameters (the same bits: fp32 on both), read
// once after the model is made or a checkpoint loaded.
template <class B>
void TrainingLoop<B>::offloaded_adamw(float* params, const float* grads, std::size_t moment_begin,
                                      std::size_t flat_offset, std::size_t count) {
  if constexpr (!B::kHostMemory) {
    auto& h = *backend_.host_offload();
    OffloadRange r;
    // offload_params (params null): the master weights are the file's plane 2.
    r.master = params != nullptr ? h.master() + moment_begin : nullptr;
    r.m = h.m();
    r.v = h.v();
    r.store = offload_.get();
    r.moment_begin = moment_begin;
    r.flat_offset = flat_offset;
    r.count = count;
    if (master_stale_ && r.master != nullptr) backend_.download(r.master, params, count);
    h.begin(params, grads, r.master, step_);
    offload_adamw_range(h, r, h.chunk(), decay_, adam_steps_, adamw_, rec_, step_);
    h.end();
  } else {
    (void)params, (void)grads, (void)moment_begin, (void)flat_offset, (void)count;
  }
}

template <class B>
StepResult TrainingLoop<B>::step() {
  const int32_t step = step_;
  StepResult result;
  result.step = step;
  result.tokens = static_cast<int64_t>(s_.training.global_batch) * s_.model.seq;
  const int64_t t0 = profiler::steady_now_ns();
  if (rec_ != nullptr) rec_->set_step(step);
  for (auto& c : off_ckpt_) c = std::vector<float>();  // a checkpoint's copies are done with
  if (offload_ && step == s_.faults.step && world_.rank() == s_.faults.offload_remove_rank)
    std::filesystem::remove(offload_->path());  // test-only: the file vanishes (scenarios/README)
  backend_.begin_step();
  const int step_span = open(traces::SpanKind::Phase, names::kStep.data(), -1);
  {
    // Memory-bound and not small (4 bytes per gradient element held): its own span, so that
    // calibration and the simulator see it rather than an unexplained gap at the start of the step.
    const int zg = open(traces::SpanKind::Compute, names::kZeroGrad.data(), -1);
    backend_.zero(model_->grads.data(), model_->grads.size());  // none under ZeRO 3
    if (zero12()) backend_.zero(zero_grads_.data(), zero_grads_.size());
    if (ezero_.total > 0) backend_.zero(ezero_grads_.data(), ezero_grads_.size());
    if (z3_) backend_.zero(z3_->grads(), z3_->shard_elems());
    close(zg);
  }
  if (z3_) z3_gather_step_segments();

  GptHooks hooks;
  hooks.observer = observer_.get();
  hooks.on_grads_ready = [this](int segment) { ddp_->on_grads_ready(segment); };
  if (zbuckets_) hooks.before_forward = [this](int segment) { wait_zero_gathers(segment); };
  if (layout_of(*model_).config.moe.enabled()) moe_hooks(hooks);
  if (dev_.tp != nullptr) {
    hooks.tp_all_reduce = [this](TpPoint point, int layer, float* data, std::size_t count) {
      const char* name = point == TpPoint::kReplicatedGrads   ? names::kTpGradAllReduce.data()
                         : point == TpPoint::kMoeGateBackward ? names::kTpMoeGateAllReduce.data()
                                                              : kTpAllReduceName;
      dev_.tp
          ->all_reduce(data, count, DType::F32, ReduceOp::Sum, OpLabel{name, step_, cur_mb_, layer})
          .wait();  // on a device the compute stream (not the host) waits for the sum
    };
    // Sequence parallelism (gpt_pieces.hpp).
    hooks.tp_reduce_scatter = [this](TpPoint, int layer, const float* send, float* recv,
                                     std::size_t recv_count) {
      dev_.tp
          ->reduce_scatter(send, recv, recv_count, DType::F32, ReduceOp::Sum,
                           OpLabel{names::kTpReduceScatter.data(), step_, cur_mb_, layer})
          .wait();
    };
    hooks.tp_all_gather = [this](TpPoint, int layer, const float* send, float* recv,
                                 std::size_t send_count) {
      dev_.tp
          ->all_gather(send, recv, send_count, DType::F32,
                       OpLabel{names::kTpAllGather.data(), step_, cur_mb_, layer})
          .wait();
    };
  }
  double loss_sum = 0;
  run_passes(hooks, loss_sum);
  if (rec_ != nullptr) rec_->set_step(step, -1);
  cur_mb_ = -1;
  // After DDP's all-reduce (ZeRO 1/2: before each reduce-scatter; ZeRO 3: before the embedding's
  // reduce-scatter, every micro-batch), the replicated kv heads' and the tied wte's sums.
  if (!zero12() && !z3_) {
    kv_grad_all_reduce_blocks(-1);
    embed_all_reduce();
  }
  bool apply = true;
  const double scale_used = scaler_ ? scaler_->scale() : 1.0;
  if (scaler_) apply = scaler_->update(unscale_and_check_overflow());
  optimizer_phase(apply);
  // The scenario's last step ends with the parameters gathered.
  if (step_ + 1 >= s_.training.steps) wait_zero_gathers();
  if (scaler_ && rec_ != nullptr) {
    const int64_t now = profiler::steady_now_ns();
    rec_->counter(names::kLossScale.data(), scale_used, now);
    rec_->counter(names::kSkippedSteps.data(), static_cast<double>(scaler_->skipped_steps()), now);
  }
  result.skipped = !apply;
  result.loss_scale = scale_used;
  if (layout_of(*model_).config.moe.enabled()) record_moe_counters(result);
  float loss = static_cast<float>(loss_sum / micro_batches_);
  if (layout_.pp > 1) {
    // Only the last stage computed the loss: it broadcasts it over the pipeline (host, 4 bytes).
    groups_.pp
        ->broadcast(&loss, 1, DType::F32, layout_.pp - 1,
                    OpLabel{names::kPipelineLoss.data(), step, -1, -1})
        .wait();
  }
  close(step_span);
  backend_.end_step();
  result.loss = loss;
  record_memory();
  result.duration_ns = profiler::steady_now_ns() - t0;
  ++step_;
  return result;
}

}  // namespace orrery::runtime
