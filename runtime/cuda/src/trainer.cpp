// The training loop of one rank on one CUDA device (see cuda/trainer.hpp): the CPU trainer's
// DDP, ZeRO 1/2/3, tensor- and pipeline-parallel paths with device buffers, event-timed spans and
// device communicators (NCCL or host-staged) for the dp, tp, pp and embedding groups.
#include "orrery/runtime/cuda/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

#include "orrery/common/error.hpp"
#include "orrery/profiler/range_hooks.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/cuda/nccl_comm.hpp"
#include "orrery/runtime/data.hpp"
#include "orrery/runtime/groups.hpp"
#include "orrery/runtime/pipeline.hpp"
#include "orrery/runtime/tensor_parallel.hpp"

namespace orrery::runtime::cuda {

using profiler::Recorder;
using traces::Span;
using traces::SpanKind;

namespace {

std::string origin_of(const Scenario& s) {
  return s.path.empty() ? std::string("scenario") : s.path;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long r = std::strtol(v, &end, 10);
  return end != v && *end == '\0' && r > 0 ? static_cast<int>(r) : fallback;
}

// Ranks the launcher put on this node (1 when not started by one).
int local_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE",
                           "LOCAL_WORLD_SIZE"}) {
    const int n = env_int(name, 0);
    if (n > 0) return n;
  }
  return 1;
}

AdamWConfig adamw_config(const TrainingConfig& t) {
  AdamWConfig c;
  c.lr = static_cast<float>(t.lr);
  c.beta1 = static_cast<float>(t.beta1);
  c.beta2 = static_cast<float>(t.beta2);
  c.eps = static_cast<float>(t.eps);
  c.weight_decay = static_cast<float>(t.weight_decay);
  return c;
}

Span proto(Recorder* rec, SpanKind kind, const char* name, int32_t step, int32_t micro_batch) {
  Span s;
  s.kind = kind;
  if (rec != nullptr && rec->enabled()) s.name = rec->intern(name);
  s.step = step;
  s.micro_batch = micro_batch;
  return s;
}

}  // namespace

CommBackend parse_comm_backend(const std::string& text, const std::string& key) {
  if (text == "auto") return CommBackend::kAuto;
  if (text == "nccl") return CommBackend::kNccl;
  if (text == "mpi" || text == "staged") return CommBackend::kStaged;
  throw InputError("key '" + key + "': expected auto, nccl or mpi, got '" + text + "'");
}

void check_supported_cuda(const Scenario& s) {
  const std::string origin = origin_of(s);
  if (s.parallel.pp > 1 && schedule_of(s.parallel) == Schedule::Interleaved) {
    throw InputError(origin + ": key 'parallel.schedule': '" + s.parallel.schedule +
                     "' is not available on device cuda; expected gpipe or 1f1b");
  }
  // Checkpoints need the device trainer's state ranges (the CPU trainer's state_to_save/load), not
  // written yet: refused rather than silently not written.
  if (s.checkpoint.every > 0) {
    throw InputError(origin +
                     ": key 'checkpoint.every': checkpoints are not available on device cuda " +
                     "yet (runtime.device: cpu writes them)");
  }
  Scenario c = s;
  // Everything the CPU runtime checks (layout, batch, threads) holds here too.
  c.runtime.device = "cpu";
  check_supported(c);
  if (device_count() == 0) {
    throw InputError(origin + ": key 'runtime.device' is cuda, but " + no_device_reason());
  }
}

// ------------------------------------------------------------------------------------ EventSpans

EventSpans::EventSpans(Recorder* rec, cudaStream_t stream, int32_t trace_stream)
    : rec_(rec != nullptr && rec->enabled() ? rec : nullptr),
      stream_(stream),
      trace_stream_(trace_stream) {
  if (rec_ != nullptr) ORRERY_CUDA_CHECK(cudaEventCreateWithFlags(&ref_, cudaEventDefault));
}

EventSpans::~EventSpans() {
  for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  if (ref_ != nullptr) cudaEventDestroy(ref_);
}

cudaEvent_t EventSpans::next_event() {
  if (used_ == pool_.size()) {
    cudaEvent_t e = nullptr;
    ORRERY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
    pool_.push_back(e);
  }
  return pool_[used_++];
}

void EventSpans::anchor() {
  if (rec_ == nullptr) return;
  ORRERY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  // The stream is idle, so the event completes as soon as it is recorded: its GPU time lies between
  // the two clock reads.
  const int64_t t0 = profiler::steady_now_ns();
  ORRERY_CUDA_CHECK(cudaEventRecord(ref_, stream_));
  ORRERY_CUDA_CHECK(cudaEventSynchronize(ref_));
  const int64_t t1 = profiler::steady_now_ns();
  ref_host_ns_ = t0 + (t1 - t0) / 2;
}

int EventSpans::open(const Span& proto, const char* annotation) {
  if (rec_ == nullptr) return -1;
  Pending p;
  p.span = proto;
  if (annotation != nullptr) {
    profiler::begin_annotation(annotation, proto.step, proto.micro_batch);
    p.annotated = true;
  }
  p.span.stream = trace_stream_;
  p.begin = next_event();
  ORRERY_CUDA_CHECK(cudaEventRecord(p.begin, stream_));
  pending_.push_back(p);
  return static_cast<int>(pending_.size()) - 1;
}

void EventSpans::close(int handle) {
  if (rec_ == nullptr || handle < 0) return;
  Pending& p = pending_.at(static_cast<std::size_t>(handle));
  p.end = next_event();
  ORRERY_CUDA_CHECK(cudaEventRecord(p.end, stream_));
  if (p.annotated) profiler::end_annotation();
}

void EventSpans::resolve() {
  if (rec_ == nullptr) return;
  ORRERY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (Pending& p : pending_) {
    if (p.end == nullptr) continue;  // never closed: not a span
    float b_ms = 0, e_ms = 0;
    ORRERY_CUDA_CHECK(cudaEventElapsedTime(&b_ms, ref_, p.begin));
    ORRERY_CUDA_CHECK(cudaEventElapsedTime(&e_ms, ref_, p.end));
    p.span.start_ns = ref_host_ns_ + std::llround(static_cast<double>(b_ms) * 1e6);
    p.span.end_ns = ref_host_ns_ + std::llround(static_cast<double>(e_ms) * 1e6);
    if (p.span.end_ns < p.span.start_ns) p.span.end_ns = p.span.start_ns;
    rec_->record(p.span);
  }
  pending_.clear();
  used_ = 0;
}

// ------------------------------------------------------------------------------------ observer

// The model's OpObserver calls as event-timed Compute spans (they never nest).
class GpuTrainer::Observer final : public OpObserver {
 public:
  Observer(Recorder* rec, EventSpans& spans) : names_(rec), spans_(spans) {}
  void set_context(int32_t step, int32_t micro_batch) {
    step_ = step;
    micro_batch_ = micro_batch;
  }
  void begin(const char* name, int layer, double flops) override {
    Span s;
    s.kind = SpanKind::Compute;
    s.name = names_.id(name);
    s.layer = layer;
    s.flops = flops;
    s.step = step_;
    s.micro_batch = micro_batch_;
    open_ = spans_.open(s, name);
  }
  void end() override {
    spans_.close(open_);
    open_ = -1;
  }

 private:
  profiler::LiteralNames names_;
  EventSpans& spans_;
  int open_ = -1;
  int32_t step_ = -1;
  int32_t micro_batch_ = -1;
};

// ------------------------------------------------------------------------------------ DDP

// runtime::DataParallel's logic (ddp.hpp) on the flat device gradient array.
class GpuTrainer::Ddp {
 public:
  Ddp(GpuGpt& model, Communicator* dp, std::vector<DdpBucket> buckets, bool overlap)
      : model_(model), dp_(dp), buckets_(std::move(buckets)), overlap_(overlap) {
    bucket_of_segment_.assign(static_cast<std::size_t>(model.config().n_layer) + 2, -1);
    for (const auto& b : buckets_) {
      for (int seg : b.segments) bucket_of_segment_[static_cast<std::size_t>(seg + 1)] = b.index;
    }
    pending_.assign(buckets_.size(), 0);
  }

  void begin_backward(bool sync, int32_t step, int32_t micro_batch) {
    sync_ = sync && dp_ != nullptr && dp_->size() > 1;
    step_ = step;
    micro_batch_ = micro_batch;
    next_ = 0;
    handles_.clear();
    for (const auto& b : buckets_)
      pending_[static_cast<std::size_t>(b.index)] = static_cast<int>(b.segments.size());
  }

  void on_grads_ready(int segment) {
    if (!sync_) return;
    const std::size_t slot = static_cast<std::size_t>(segment + 1);
    if (slot >= bucket_of_segment_.size() || bucket_of_segment_[slot] < 0) {
      throw InternalError("GPU DDP: gradients ready for segment " + std::to_string(segment) +
                          ", which is in no bucket");
    }
    const int bi = bucket_of_segment_[slot];
    if (--pending_[static_cast<std::size_t>(bi)] < 0) {
      throw InternalError("GPU DDP: segment " + std::to_string(segment) + " reported ready twice");
    }
    if (!overlap_) return;
    while (next_ < static_cast<int>(buckets_.size()) &&
           pending_[static_cast<std::size_t>(next_)] == 0) {
      issue(buckets_[static_cast<std::size_t>(next_++)]);
    }
  }

  // Issues what is due and orders the compute stream after every all-reduce (Handle::wait of a
  // device communicator does not block the host).
  void finish_backward() {
    if (sync_) {
      for (std::size_t i = 0; i < buckets_.size(); ++i) {
        if (pending_[i] != 0) {
          throw InternalError("GPU DDP: backward finished with bucket " + std::to_string(i) +
                              " incomplete");
        }
      }
      while (next_ < static_cast<int>(buckets_.size()))
        issue(buckets_[static_cast<std::size_t>(next_++)]);
    }
    for (auto& h : handles_) h.wait();
    handles_.clear();
    sync_ = false;
  }

  void broadcast_parameters() {
    if (dp_ == nullptr || dp_->size() <= 1) return;
    OpLabel label;
    label.name = names::kDpBroadcast.data();
    dp_->broadcast(model_.params.data(), model_.params.size(), DType::F32, 0, label).wait();
    dp_->synchronize();
  }

 private:
  void issue(const DdpBucket& b) {
    OpLabel label;
    label.name = names::kDpAllReduce.data();
    label.step = step_;
    label.micro_batch = micro_batch_;
    label.layer = b.lowest_layer;
    handles_.push_back(dp_->all_reduce(model_.grads.data() + b.range.offset, b.range.count,
                                       DType::F32, ReduceOp::Avg, label));
  }

  GpuGpt& model_;
  Communicator* dp_;
  std::vector<DdpBucket> buckets_;
  bool overlap_;
  std::vector<int> bucket_of_segment_;
  std::vector<int> pending_;
  std::vector<Handle> handles_;
  int next_ = 0;
  bool sync_ = false;
  int32_t step_ = -1;
  int32_t micro_batch_ = -1;
};

// ------------------------------------------------------------------------------------ trainer

GpuTrainer::GpuTrainer(const Scenario& s, Communicator& world, Recorder* rec,
                       const CudaRunOptions& opt)
    : s_(s), world_(world), rec_(rec != nullptr && rec->enabled() ? rec : nullptr), opt_(opt) {
  check_supported_cuda(s_);
  const std::string origin = origin_of(s_);
  if (world_.size() != s_.world_size()) {
    throw InputError(origin + ": parallel.dp * tp * pp = " + std::to_string(s_.world_size()) +
                     " but " + std::to_string(world_.size()) + " ranks were started");
  }
  layout_ = Layout::of(s_, world_.rank());
  micro_batches_ = s_.micro_batches_per_step();
  if (micro_batches_ < 1 ||
      micro_batches_ * s_.parallel.dp * s_.training.micro_batch != s_.training.global_batch) {
    throw InputError("key 'training.global_batch': " + std::to_string(s_.training.global_batch) +
                     " is not a multiple of parallel.dp * training.micro_batch = " +
                     std::to_string(s_.parallel.dp * s_.training.micro_batch));
  }

  device_ = select_device(launcher_local_rank());
  stream_ = std::make_unique<Stream>();
  ctx_ = std::make_unique<Context>(stream_->get(), opt_.math);

  const Layout& L = layout_;
  // The host groups (groups.hpp: split in one order on every rank).
  RankGroups groups = split_rank_groups(world_, L);
  dp_ = std::move(groups.dp);
  tp_ = std::move(groups.tp);
  pp_ = std::move(groups.pp);
  embed_ = std::move(groups.embed);

  const bool z3 = s_.parallel.zero == 3;  // dp >= 2 (check_supported)
  if (L.dp > 1 || L.tp > 1 || L.pp > 1) {
    CommBackend backend = opt_.comm;
    if (backend == CommBackend::kAuto) {
#if defined(ORRERY_HAVE_NCCL)
      // NCCL refuses two ranks on one device: stage through host memory when they would share.
      backend = local_world_size() <= device_count() ? CommBackend::kNccl : CommBackend::kStaged;
#else
      backend = CommBackend::kStaged;
#endif
    }
    // Created in the same order on every rank (NCCL's bootstrap is a collective of each group).
    if (L.dp > 1) dp_dev_ = make_device_comm(*dp_, backend);
    if (L.tp > 1) tp_dev_ = make_device_comm(*tp_, backend);
    if (L.pp > 1) {
      // NCCL runs all of a process's operations on one stream, in issue order (nccl_comm.cpp), and
      // a send there does not finish before its receive runs. Under 1F1B the pipeline's transfers
      // cross: stage s's stream holds send_act(i+1) before recv_grad(i), stage s+1's holds
      // send_grad(i) before recv_act(i+1), and each waits for the other (a second NCCL
      // communicator does not help: it shares the stream; one on a stream of its own is not
      // safe either: NCCL does not promise that kernels of communicators on different streams
      // progress together, CUDA_DEVICE_MAX_CONNECTIONS=1 serialises them, and a device-wide wait
      // such as cudaFree in step 0's scratch growth waits for a send whose receive the neighbour
      // queues behind a collective this rank has not issued yet). So under 1F1B the pipeline's
      // communicators (P2P and the tied embedding's sum, which ZeRO 2/3 issue between passes) are
      // host-staged over MPI, which completes operations independently; dp and tp stay on NCCL,
      // whose members all run one stage's schedule, so their orders agree. GPipe's transfers do
      // not cross (all forwards, then all backwards, in micro-batch order at both ends): on NCCL.
      // (Megatron pairs each send with the next receive in one NCCL group; not done here.)
      const CommBackend pipe =
          backend == CommBackend::kNccl && schedule_of(s_.parallel) == Schedule::OneFOneB
              ? CommBackend::kStaged
              : backend;
      pp_dev_ = make_device_comm(*pp_, pipe);
      if (embed_->size() > 1) embed_dev_ = make_device_comm(*embed_, pipe);
      pipeline_staged_ = pipe != backend;
    }
    comm_name_ =
        backend == CommBackend::kNccl ? (pipeline_staged_ ? "nccl+staged-pp" : "nccl") : "staged";
  }

  const GptConfig cfg = gpt_config(s_.model);
  // The CPU trainer's shard: the pipeline stage's layers (every layer when pp = 1), the tp slice of
  // each block.
  GptShard shard = L.pp > 1 ? GptShard::pipeline_stage(cfg, L.pp_rank, L.pp) : GptShard{};
  shard.tp_rank = L.tp_rank;
  shard.tp_size = L.tp;
  Gpt host = gpt_create(cfg, shard, s_.training.seed);
  buckets_ = make_ddp_buckets(host, s_.parallel.bucket_mb);  // before padding, as the CPU trainer's
  const std::size_t n = host.num_params();
  const bool zero = !z3 && s_.parallel.zero >= 1 && L.dp > 1;  // ZeRO 1/2
  if (z3) {
    zero_ = zero_partition(n, L.dp_rank, L.dp);
    model_ = std::make_unique<GpuGpt>(gpu_gpt_create(std::move(host), /*device_storage=*/false));
    z3_ = std::make_unique<GpuZero3Storage>(*model_, L.dp_rank, L.dp);
    z3_recv_.resize(z3_->shard_elems());
  } else {
    if (zero) {
      zero_ = zero_partition(n, L.dp_rank, L.dp);
      gpt_pad_storage(host, zero_.padded());
    } else {
      zero_ = zero_partition(n, 0, 1);
    }
    model_ = std::make_unique<GpuGpt>(gpu_gpt_create(std::move(host)));
  }
  ddp_ = std::make_unique<Ddp>(*model_, dp_dev_.get(), buckets_, s_.parallel.overlap);
  source_ = make_token_source(s_.data.source, s_.data.path, cfg.vocab, s_.training.seed);
  loader_ = std::make_unique<DataLoader>(*source_, s_.model.seq, s_.training.micro_batch, L.dp_rank,
                                         L.dp, s_.training.seed);
  // One activation set per micro-batch in flight (index mb % size), as the CPU trainer's.
  const int in_flight =
      L.pp > 1 ? pipeline_in_flight(s_.parallel.schedule, L.pp, L.pp_rank, micro_batches_) : 1;
  for (int i = 0; i < in_flight; ++i) {
    acts_.push_back(std::make_unique<GpuActivations>(
        gpu_activations(*model_, s_.training.micro_batch, s_.model.seq)));
  }
  act_send_h_.resize(static_cast<std::size_t>(in_flight));
  grad_send_h_.resize(static_cast<std::size_t>(in_flight));
  if (L.pp > 1 && L.pp_rank > 0) {
    for (int i = 0; i < in_flight; ++i) grad_send_.emplace_back(acts_[0]->boundary_elems);
  }
  scratch_ = std::make_unique<GpuGradScratch>(
      gpu_grad_scratch(*model_, s_.training.micro_batch, s_.model.seq));
  const std::size_t moments = z3 ? z3_->shard_elems() : zero ? zero_.shard : n;
  adam_m_.resize(moments);
  adam_v_.resize(moments);
  if (zero) {
    zero_grads_.resize(zero_.shard);
    if (s_.parallel.zero == 2) zero_recv_.resize(zero_.shard);
  }
  decay_ = model_->host.decay_ranges();
  adamw_ = adamw_config(s_.training);
  spans_ = std::make_unique<EventSpans>(rec_, stream_->get(), profiler::kComputeStream);
  if (rec_ != nullptr) observer_ = std::make_unique<Observer>(rec_, *spans_);
}

std::unique_ptr<Communicator> GpuTrainer::make_device_comm(Communicator& host,
                                                           CommBackend backend) {
  std::unique_ptr<Communicator> dev;
  if (backend == CommBackend::kNccl) {
#if defined(ORRERY_HAVE_NCCL)
    WorldOptions wopt;
    wopt.watchdog_s = s_.runtime.watchdog_s;
    dev = make_nccl_communicator(host, stream_->get(), wopt);
#else
    throw InputError(origin_of(s_) +
                     ": the NCCL communicator was asked for, but this build has no NCCL");
#endif
  } else {
    dev = make_staged_communicator(host, stream_->get(), s_.runtime.watchdog_s);
  }
  if (rec_ != nullptr) dev->set_recorder(rec_);
  return dev;
}

GpuTrainer::~GpuTrainer() {
  // Let queued work finish before buffers go (errors cannot be reported from here).
  if (stream_) cudaStreamSynchronize(stream_->get());
  for (Communicator* c : {dp_dev_.get(), tp_dev_.get(), pp_dev_.get(), embed_dev_.get()}) {
    if (c == nullptr) continue;
    try {
      c->set_recorder(nullptr);
      c->synchronize();
    } catch (...) {
    }
  }
}

void GpuTrainer::finish() {
  ORRERY_CUDA_CHECK(cudaStreamSynchronize(stream_->get()));
  for (Communicator* c : {dp_dev_.get(), tp_dev_.get(), pp_dev_.get(), embed_dev_.get()}) {
    if (c == nullptr) continue;
    c->synchronize();
    c->set_recorder(nullptr);
  }
}

void GpuTrainer::prepare() {
  if (!z3_) ddp_->broadcast_parameters();  // ZeRO 3 shards come from the same seed on every rank
  ORRERY_CUDA_CHECK(cudaStreamSynchronize(stream_->get()));
  world_.barrier().wait();
  record_memory();
}

Trainer::MemoryBytes GpuTrainer::memory() const {
  // The CPU trainer's categories (Trainer::memory) for the same state.
  Trainer::MemoryBytes m;
  double acts = static_cast<double>(scratch_->memory.size_bytes() + ctx_->scratch_bytes());
  for (const auto& a : acts_) acts += static_cast<double>(a->memory.size_bytes());
  m.activations = acts;
  if (z3_) {
    const double shard = static_cast<double>(z3_->shard_elems()) * sizeof(float);
    m.parameters = shard;
    m.gradients = shard;
    m.optimizer = 2 * shard;
    m.comm_buffers = static_cast<double>(z3_->buffer_bytes() + z3_recv_.size_bytes());
    for (const auto& g : grad_send_) m.comm_buffers += static_cast<double>(g.size_bytes());
    return m;
  }
  m.parameters = static_cast<double>(model_->params.size_bytes());
  const double full_grads = static_cast<double>(model_->grads.size_bytes());
  m.optimizer = static_cast<double>(adam_m_.size_bytes() + adam_v_.size_bytes());
  double comm = 0;  // DDP buckets are views of the gradient array
  for (const auto& g : grad_send_) comm += static_cast<double>(g.size_bytes());  // pipeline
  if (s_.parallel.zero == 2 && zero_.ranks > 1) {
    // The shard is the gradient state; the full array only stages one backward before scattering.
    m.gradients = static_cast<double>(zero_grads_.size_bytes());
    comm += full_grads + static_cast<double>(zero_recv_.size_bytes());
  } else {
    m.gradients = full_grads;
    comm += static_cast<double>(zero_grads_.size_bytes());  // ZeRO 1: the reduce-scatter output
  }
  m.comm_buffers = comm;
  return m;
}

void GpuTrainer::record_memory() {
  if (rec_ == nullptr) return;
  const int64_t now = profiler::steady_now_ns();
  const Trainer::MemoryBytes m = memory();
  rec_->counter(names::kMemParameters.data(), m.parameters, now);
  rec_->counter(names::kMemGradients.data(), m.gradients, now);
  rec_->counter(names::kMemOptimizer.data(), m.optimizer, now);
  rec_->counter(names::kMemActivations.data(), m.activations, now);
  rec_->counter(names::kMemCommBuffers.data(), m.comm_buffers, now);
}

std::size_t GpuTrainer::flat_elems() const {
  std::size_t n = 0;
  for (const auto& t : model_->host.tensors) n = std::max(n, t.offset + t.count);
  return n;
}

std::vector<float> GpuTrainer::parameters() {
  std::vector<float> out(flat_elems());
  if (z3_) {
    // Each segment gathered over the dp group into a scratch buffer, its real elements kept.
    for (const Zero3Segment& sg : z3_->segments()) {
      DeviceArray<float> full(sg.part.padded());
      dp_dev_->all_gather(z3_->params() + sg.shard_offset, full.data(), sg.part.shard, DType::F32)
          .wait();
      ORRERY_CUDA_CHECK(cudaStreamSynchronize(stream_->get()));
      full.copy_to_host(out.data() + sg.range.offset, sg.range.count);
    }
    return out;
  }
  ORRERY_CUDA_CHECK(cudaStreamSynchronize(stream_->get()));
  model_->params.copy_to_host(out.data(), out.size());
  return out;
}

// The tied wte's gradient summed over the first and last stage (pp > 1; a no-op elsewhere).
void GpuTrainer::embed_all_reduce() {
  if (!embed_dev_) return;
  const ParamTensor& wte = model_->host.tensor("wte");
  embed_dev_
      ->all_reduce(model_->dembed.wte, wte.count, DType::F32, ReduceOp::Sum,
                   OpLabel{names::kEmbedAllReduce.data(), step_, -1, -1})
      .wait();  // the compute stream waits for the sum
}

// The CPU trainer's reduce_gradients_zero on device buffers.
void GpuTrainer::reduce_gradients_zero(int32_t step, int32_t mb) {
  embed_all_reduce();
  const GptShard& sh = model_->host.shard;
  float* out = s_.parallel.zero == 2 ? zero_recv_.data() : zero_grads_.data();
  dp_dev_
      ->reduce_scatter(model_->grads.data(), out, zero_.shard, DType::F32, ReduceOp::Avg,
                       OpLabel{kZeroReduceScatterName, step, mb,
                               sh.has_embed || sh.has_head ? kEmbedSegment : sh.layer_begin})
      .wait();  // the compute stream waits for the scattered shard
  if (s_.parallel.zero == 2) {
    // The shard gradient accumulates each micro-batch's scattered shard: acc += out.
    residual_forward(*ctx_, zero_grads_.data(), zero_grads_.data(), out, zero_.shard);
    gpu_zero_grad(*ctx_, *model_);  // the next backward writes into a clean array
  }
}

// --- ZeRO 3: the CPU trainer's z3_* (runtime/src/trainer.cpp) on device buffers. Every operation is
// ordered against the compute stream by the device communicator (issue after the kernels queued so
// far; Handle::wait puts the compute stream behind the operation), so a working buffer is never
// gathered into while queued kernels still read it, nor cleared while its reduce-scatter reads it.
void GpuTrainer::z3_gather(int segment, int slot, int mb) {
  Zero3Segment& sg = z3_->segment(segment);
  z3_gather_h_[slot] =
      dp_dev_->all_gather(z3_->params() + sg.shard_offset, z3_->param_buffer(slot), sg.part.shard,
                          DType::F32, OpLabel{kZeroFetchLayerName, step_, mb, segment});
  z3_gathered_[slot] = segment;
}

void GpuTrainer::z3_bind_block(int layer, int next_layer, int mb) {
  const GptShard& sh = model_->host.shard;
  const int slot = zero3_slot(layer, model_->config().n_layer, sh.layer_begin);
  if (z3_gathered_[slot] != layer) z3_gather(layer, slot, mb);
  z3_gather_h_[slot].wait();
  // Prefetch: the next block's gather runs on the communicator's stream while this one computes.
  if (next_layer >= sh.layer_begin && next_layer < sh.layer_end)
    z3_gather(next_layer, slot ^ 1, mb);
  z3_->segment(layer).bind(z3_->param_buffer(slot), z3_->grad_buffer(slot));
}

void GpuTrainer::z3_reduce_scatter(int segment, int slot, int mb) {
  Zero3Segment& sg = z3_->segment(segment);
  z3_rs_h_[slot] = dp_dev_->reduce_scatter(
      z3_->grad_buffer(slot), z3_recv_.data() + sg.shard_offset, sg.part.shard, DType::F32,
      ReduceOp::Avg, OpLabel{kZeroReduceScatterName, step_, mb, segment});
}

float GpuTrainer::z3_forward(GpuActivations& acts, const GptHooks& hooks) {
  const GptShard& sh = model_->host.shard;
  if (sh.has_embed) gpu_embed_forward(*ctx_, *model_, acts, batch_.inputs.data(), hooks);
  for (int l = sh.layer_begin; l < sh.layer_end; ++l) {
    z3_bind_block(l, l + 1, cur_mb_);
    gpu_block_forward(*ctx_, *model_, acts, l, hooks);
    z3_gathered_[(l - sh.layer_begin) & 1] = -99;  // used: the backward gathers it again
  }
  return sh.has_head ? gpu_head_forward(*ctx_, *model_, acts, batch_.targets.data(), hooks) : 0.0f;
}

void GpuTrainer::z3_backward(GpuActivations& acts, int mb, const GptHooks& hooks,
                             float loss_scale) {
  const GptShard& sh = model_->host.shard;
  const int L = model_->config().n_layer;
  GptHooks h = hooks;
  h.on_grads_ready = nullptr;  // no DDP buckets: each segment is scattered below
  auto clear = [&](int slot, int segment) {
    ORRERY_CUDA_CHECK(cudaMemsetAsync(z3_->grad_buffer(slot), 0,
                                      z3_->segment(segment).part.padded() * sizeof(float),
                                      stream_->get()));
  };
  // The previous backward's scatters of these buffers were waited for in z3_finish_backward.
  if (sh.has_embed || sh.has_head) clear(2, kEmbedSegment);
  if (sh.has_head) {
    clear(3, L);
    gpu_head_backward(*ctx_, *model_, acts, *scratch_, loss_scale, h);
    z3_reduce_scatter(L, 3, mb);
  }
  for (int l = sh.layer_end - 1; l >= sh.layer_begin; --l) {
    const int slot = zero3_slot(l, L, sh.layer_begin);
    z3_rs_h_[slot].wait();  // the buffer's previous gradients are scattered
    z3_bind_block(l, l - 1, mb);
    clear(slot, l);
    gpu_block_backward(*ctx_, *model_, acts, *scratch_, l, h);
    z3_reduce_scatter(l, slot, mb);
    z3_gathered_[slot] = -99;
  }
  if (sh.has_embed) gpu_embed_backward(*ctx_, *model_, acts, *scratch_, h);
}

// After the pipeline send of the backward pass (a neighbour never waits behind a collective): the
// tied wte's gradient summed over the embedding group, the embedding's reduce-scatter, then every
// scattered shard added to the shard gradients.
void GpuTrainer::z3_finish_backward(int mb) {
  const GptShard& sh = model_->host.shard;
  if (sh.has_embed || sh.has_head) {
    embed_all_reduce();  // dembed.wte is bound to working buffer 2
    z3_reduce_scatter(kEmbedSegment, 2, mb);
  }
  for (auto& hd : z3_rs_h_) hd.wait();
  residual_forward(*ctx_, z3_->grads(), z3_->grads(), z3_recv_.data(), z3_->shard_elems());
}

// The CPU trainer's forward_pass: data on the stages that hold the embedding or the head, the
// activation received before / sent after the stage's forward (pp > 1).
// A pass of micro-batch `mb` begins: its labels and the slot of its activations (mb % in flight).
std::size_t GpuTrainer::begin_pass(int mb) {
  cur_mb_ = mb;
  if (rec_ != nullptr) rec_->set_step(step_, mb);
  if (observer_) observer_->set_context(step_, mb);
  return static_cast<std::size_t>(mb) % acts_.size();
}

void GpuTrainer::forward_pass(int mb, const GptHooks& hooks, double& loss_sum) {
  const int32_t step = step_;
  const std::size_t slot = begin_pass(mb);
  GpuActivations& acts = *acts_[slot];
  // The slot's previous activation send must be done before its buffer is overwritten.
  act_send_h_[slot].wait();
  const GptShard& sh = model_->host.shard;
  if (sh.has_embed || sh.has_head) {
    profiler::ScopedSpan data(rec_, proto(rec_, SpanKind::Data, names::kDataLoad.data(), step, mb));
    loader_->next_batch(batch_);
  }
  const int fwd = spans_->open(proto(rec_, SpanKind::Phase, names::kForward.data(), step, mb),
                               names::kForward.data());
  if (!sh.has_embed) {
    pp_dev_
        ->recv(acts.stage_input(), acts.boundary_elems, DType::F32, layout_.pp_rank - 1,
               OpLabel{names::kRecvActivation.data(), step, mb, -1})
        .wait();  // the compute stream waits for the activation
  }
  loss_sum +=
      z3_ ? z3_forward(acts, hooks)
          : gpu_forward(*ctx_, *model_, acts, batch_.inputs.data(), batch_.targets.data(), hooks);
  if (!sh.has_head) {
    act_send_h_[slot] =
        pp_dev_->send(acts.stage_output(), acts.boundary_elems, DType::F32, layout_.pp_rank + 1,
                      OpLabel{names::kSendActivation.data(), step, mb, -1});
  }
  spans_->close(fwd);
}

// The CPU trainer's backward_pass: the output gradient received first on a stage without the head,
// DDP's all-reduce during the last micro-batch's backward, the input gradient sent back (from a
// buffer of its own: the scratch is the next backward's) on a stage without the embedding, then
// ZeRO's reduce-scatter.
void GpuTrainer::backward_pass(int mb, const GptHooks& hooks, float loss_scale) {
  const int32_t step = step_;
  const std::size_t slot = begin_pass(mb);
  GpuActivations& acts = *acts_[slot];
  const GptShard& sh = model_->host.shard;
  const bool zero = zero12();
  const int bwd = spans_->open(proto(rec_, SpanKind::Phase, names::kBackward.data(), step, mb),
                               names::kBackward.data());
  if (!sh.has_head) {
    pp_dev_
        ->recv(scratch_->dres, acts.boundary_elems, DType::F32, layout_.pp_rank + 1,
               OpLabel{names::kRecvGradient.data(), step, mb, -1})
        .wait();
  }
  const bool last_mb = mb == micro_batches_ - 1;  // both schedules end with the last backward
  if (z3_) {
    z3_backward(acts, mb, hooks, loss_scale);
  } else {
    ddp_->begin_backward(!zero && last_mb, step, mb);
    gpu_backward(*ctx_, *model_, acts, *scratch_, loss_scale, hooks);
    ddp_->finish_backward();  // the compute stream now waits for the all-reduces
  }
  if (!sh.has_embed) {
    grad_send_h_[slot].wait();
    DeviceArray<float>& buf = grad_send_[slot];
    ORRERY_CUDA_CHECK(cudaMemcpyAsync(buf.data(), scratch_->dres, buf.size_bytes(),
                                      cudaMemcpyDeviceToDevice, stream_->get()));
    grad_send_h_[slot] = pp_dev_->send(buf.data(), buf.size(), DType::F32, layout_.pp_rank - 1,
                                       OpLabel{names::kSendGradient.data(), step, mb, -1});
  }
  if (z3_) z3_finish_backward(mb);
  if (zero && (s_.parallel.zero == 2 || last_mb)) reduce_gradients_zero(step, mb);
  spans_->close(bwd);
}

StepResult GpuTrainer::step() {
  const int32_t step = step_;
  StepResult result;
  result.step = step;
  result.tokens = static_cast<int64_t>(s_.training.global_batch) * s_.model.seq;
  const int64_t t0 = profiler::steady_now_ns();
  if (rec_ != nullptr) rec_->set_step(step);
  spans_->anchor();
  const int step_span = spans_->open(proto(rec_, SpanKind::Phase, names::kStep.data(), step, -1),
                                     names::kStep.data());
  const bool zero = zero12();
  {
    // The CPU trainer's own span for it (memory-bound, 4 bytes per gradient element held).
    const int zg = spans_->open(proto(rec_, SpanKind::Compute, names::kZeroGrad.data(), step, -1),
                                names::kZeroGrad.data());
    gpu_zero_grad(*ctx_, *model_);  // no full array under ZeRO 3: nothing to do
    if (zero) {
      ORRERY_CUDA_CHECK(
          cudaMemsetAsync(zero_grads_.data(), 0, zero_grads_.size_bytes(), stream_->get()));
    }
    if (z3_) {
      ORRERY_CUDA_CHECK(
          cudaMemsetAsync(z3_->grads(), 0, z3_->shard_elems() * sizeof(float), stream_->get()));
    }
    spans_->close(zg);
  }
  if (z3_) {
    // The embedding and final LayerNorm serve both ends of every micro-batch: gathered once a step.
    const GptShard& sh = model_->host.shard;
    const int L = model_->config().n_layer;
    for (int id : {kEmbedSegment, L}) {
      const bool held = id == kEmbedSegment ? (sh.has_embed || sh.has_head) : sh.has_head;
      if (!held) continue;
      const int slot = zero3_slot(id, L, sh.layer_begin);
      z3_gather(id, slot, -1);
      z3_gather_h_[slot].wait();
      z3_->segment(id).bind(z3_->param_buffer(slot), z3_->grad_buffer(slot));
    }
  }

  GptHooks hooks;
  hooks.observer = observer_.get();
  hooks.on_grads_ready = [this](int segment) { ddp_->on_grads_ready(segment); };
  if (tp_dev_) {
    hooks.tp_all_reduce = [this](TpPoint, int layer, float* data, std::size_t count) {
      // wait(): the compute stream (not the host) waits for the sum.
      tp_dev_
          ->all_reduce(data, count, DType::F32, ReduceOp::Sum,
                       OpLabel{kTpAllReduceName, step_, cur_mb_, layer})
          .wait();
    };
  }
  const float loss_scale = 1.0f / static_cast<float>(micro_batches_);
  double loss_sum = 0;
  if (layout_.pp > 1) {
    // The schedule's order (pipeline.hpp): mb >= 0 a forward, -(mb+1) a backward.
    for (int pass :
         pipeline_order(s_.parallel.schedule, layout_.pp, layout_.pp_rank, micro_batches_)) {
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
  } else {
    for (int mb = 0; mb < micro_batches_; ++mb) {
      forward_pass(mb, hooks, loss_sum);
      backward_pass(mb, hooks, loss_scale);
    }
  }
  if (rec_ != nullptr) rec_->set_step(step, -1);
  cur_mb_ = -1;
  // After DDP's all-reduce (under ZeRO 1/2: before each reduce-scatter; ZeRO 3: before the
  // embedding's reduce-scatter, every micro-batch).
  if (!zero && !z3_) embed_all_reduce();
  {
    const int opt = spans_->open(proto(rec_, SpanKind::Phase, names::kOptimizer.data(), step, -1),
                                 names::kOptimizer.data());
    const int adamw =
        spans_->open(proto(rec_, SpanKind::Optimizer, names::kOptimizerStep.data(), step, -1),
                     names::kOptimizerStep.data());
    ++adam_steps_;
    if (z3_) {
      // Each segment's shard in place; decay ranges in absolute flat coordinates.
      for (const Zero3Segment& sg : z3_->segments()) {
        if (sg.part.count() == 0) continue;
        const std::size_t k = sg.shard_offset;
        adamw_update(*ctx_, z3_->params() + k, z3_->grads() + k, adam_m_.data() + k,
                     adam_v_.data() + k, sg.range.offset + sg.part.begin(), sg.part.count(), decay_,
                     adam_steps_, adamw_);
      }
      for (int& g : z3_gathered_) g = -99;  // the buffers hold the old parameters
    } else if (zero) {
      // The owned shard [begin, begin + count) only; decay ranges are absolute flat coordinates.
      if (zero_.count() > 0) {
        adamw_update(*ctx_, model_->params.data() + zero_.begin(), zero_grads_.data(),
                     adam_m_.data(), adam_v_.data(), zero_.begin(), zero_.count(), decay_,
                     adam_steps_, adamw_);
      }
    } else {
      adamw_update(*ctx_, model_->params.data(), model_->grads.data(), adam_m_.data(),
                   adam_v_.data(), 0, flat_elems(), decay_, adam_steps_, adamw_);
    }
    spans_->close(adamw);
    if (zero) {
      // In place: this rank's shard is block dp_rank of the gathered array.
      dp_dev_
          ->all_gather(model_->params.data() + zero_.begin(), model_->params.data(), zero_.shard,
                       DType::F32, OpLabel{kZeroAllGatherName, step, -1, -1})
          .wait();
    }
    spans_->close(opt);
  }
  float loss = static_cast<float>(loss_sum / micro_batches_);
  if (layout_.pp > 1) {
    // Only the last stage computed the loss: it broadcasts it over the pipeline (host, 4 bytes).
    pp_->broadcast(&loss, 1, DType::F32, layout_.pp - 1,
                   OpLabel{names::kPipelineLoss.data(), step, -1, -1})
        .wait();
  }
  spans_->close(step_span);
  spans_->resolve();  // waits for the stream
  ORRERY_CUDA_CHECK(cudaStreamSynchronize(stream_->get()));
  ORRERY_CUDA_CHECK(cudaGetLastError());
  result.loss = loss;
  record_memory();
  result.duration_ns = profiler::steady_now_ns() - t0;
  ++step_;
  return result;
}

}  // namespace orrery::runtime::cuda
