// The training loop of one rank (see trainer.hpp for the spans it records).
#include "orrery/runtime/trainer.hpp"

#include <algorithm>
#include <sstream>
#include <unordered_map>

#include "orrery/common/error.hpp"
#include "orrery/model/grid.hpp"
#include "orrery/model/names.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/groups.hpp"
#include "orrery/runtime/kernels.hpp"
#include "orrery/runtime/pipeline.hpp"
#include "orrery/runtime/tensor_parallel.hpp"

namespace orrery::runtime {

using profiler::Recorder;
using profiler::ScopedSpan;
using traces::Span;
using traces::SpanKind;

Layout Layout::of(const Scenario& s, int world_rank) {
  const model::RankGrid grid = model::RankGrid::from(s);
  const model::RankGrid::Coord c = grid.coord(world_rank);
  Layout l;
  l.dp = grid.dp;
  l.tp = grid.tp;
  l.pp = grid.pp;
  l.dp_rank = c.dp;
  l.tp_rank = c.tp;
  l.pp_rank = c.pp;
  return l;
}

void check_supported(const Scenario& s) {
  const std::string origin = s.path.empty() ? std::string("scenario") : s.path;
  try {
    validate_layout(s);
  } catch (const InputError& e) {
    const std::string what = e.what();
    throw InputError(what.rfind(origin, 0) == 0 ? what : origin + ": " + what);
  }
  if (s.parallel.zero < 0 || s.parallel.zero > 3) {
    throw InputError(origin + ": key 'parallel.zero': expected a ZeRO stage 0-3, got " +
                     std::to_string(s.parallel.zero));
  }
  if (s.parallel.pp > 1 && schedule_of(s.parallel) == Schedule::Interleaved) {
    throw InputError(origin + ": key 'parallel.schedule': '" + s.parallel.schedule +
                     "' is not available in the CPU runtime; expected gpipe or 1f1b");
  }
  if (s.runtime.device != "cpu") {
    // Device cuda goes to the CUDA runtime (runtime/cuda, check_supported_cuda) when it is built.
    throw InputError(
        origin + ": key 'runtime.device': '" + s.runtime.device +
        "' is not available in the CPU runtime; expected cpu (device cuda needs a build "
        "with the CUDA toolkit)");
  }
  if (s.runtime.threads < 1) {
    throw InputError(origin + ": key 'runtime.threads': expected at least 1, got " +
                     std::to_string(s.runtime.threads));
  }
}

// Turns the model's OpObserver calls into Compute spans with step, micro-batch and layer.
class Trainer::SpanObserver final : public OpObserver {
 public:
  explicit SpanObserver(Recorder* rec) : rec_(rec), names_(rec) {}
  void set_context(int32_t step, int32_t micro_batch) {
    step_ = step;
    micro_batch_ = micro_batch;
  }
  void begin(const char* name, int layer, double flops) override {
    open_.kind = SpanKind::Compute;
    open_.stream = Recorder::thread_stream();
    open_.name = names_.id(name);
    open_.layer = layer;
    open_.flops = flops;
    open_.step = step_;
    open_.micro_batch = micro_batch_;
    open_.start_ns = profiler::steady_now_ns();
  }
  void end() override {
    open_.end_ns = profiler::steady_now_ns();
    rec_->record(open_);
  }

 private:
  Recorder* rec_;
  profiler::LiteralNames names_;
  Span open_;
  int32_t step_ = -1;
  int32_t micro_batch_ = -1;
};

namespace {

Span proto(Recorder* rec, SpanKind kind, const char* name, int32_t step, int32_t micro_batch) {
  Span s;
  s.kind = kind;
  if (rec && rec->enabled()) s.name = rec->intern(name);
  s.step = step;
  s.micro_batch = micro_batch;
  return s;
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

}  // namespace

Trainer::Trainer(const Scenario& s, Communicator& world, Recorder* rec)
    : s_(s), world_(world), rec_(rec && rec->enabled() ? rec : nullptr) {
  check_supported(s_);
  if (world_.size() != s_.world_size()) {
    throw InputError((s_.path.empty() ? std::string("scenario") : s_.path) +
                     ": parallel.dp * tp * pp = " + std::to_string(s_.world_size()) + " but " +
                     std::to_string(world_.size()) + " ranks were started");
  }
  layout_ = Layout::of(s_, world_.rank());
  micro_batches_ = s_.micro_batches_per_step();
  if (micro_batches_ < 1 ||
      micro_batches_ * s_.parallel.dp * s_.training.micro_batch != s_.training.global_batch) {
    throw InputError("key 'training.global_batch': " + std::to_string(s_.training.global_batch) +
                     " is not a multiple of parallel.dp * training.micro_batch = " +
                     std::to_string(s_.parallel.dp * s_.training.micro_batch));
  }
  set_compute_threads(s_.runtime.threads);

  const Layout& L = layout_;
  // The host groups (groups.hpp: split in one order on every rank).
  RankGroups groups = split_rank_groups(world_, L);
  dp_ = std::move(groups.dp);
  tp_ = std::move(groups.tp);
  pp_ = std::move(groups.pp);
  embed_ = std::move(groups.embed);

  const GptConfig cfg = gpt_config(s_.model);
  GptShard shard = L.pp > 1 ? GptShard::pipeline_stage(cfg, L.pp_rank, L.pp) : GptShard{};
  shard.tp_rank = L.tp_rank;
  shard.tp_size = L.tp;
  model_ = gpt_create(cfg, shard, s_.training.seed);
  source_ = make_token_source(s_.data.source, s_.data.path, cfg.vocab, s_.training.seed);
  loader_ = std::make_unique<DataLoader>(*source_, s_.model.seq, s_.training.micro_batch, L.dp_rank,
                                         L.dp, s_.training.seed);
  DdpOptions dopt;
  dopt.bucket_mb = s_.parallel.bucket_mb;
  dopt.overlap = s_.parallel.overlap;
  ddp_ = std::make_unique<DataParallel>(model_, *dp_, dopt);
  const size_t n = model_.num_params();
  if (s_.parallel.zero == 3) {
    zero_ = zero_partition(n, L.dp_rank, L.dp);
    const std::vector<ParamRange> decay = model_.decay_ranges();
    z3_ = std::make_unique<Zero3Storage>(model_, L.dp_rank, L.dp);
    for (const auto& sg : z3_->segments()) {
      z3_opt_.push_back(std::make_unique<AdamW>(sg.range.offset + sg.part.begin(), sg.part.count(),
                                                decay, adamw_config(s_.training)));
    }
    z3_recv_ = FloatArray(z3_->shard_elems());
  } else if (s_.parallel.zero >= 1) {
    zero_ = zero_partition(n, L.dp_rank, L.dp);
    gpt_pad_storage(model_, zero_.padded());
    zero_grads_ = FloatArray(zero_.shard);
    if (s_.parallel.zero == 2) zero_recv_ = FloatArray(zero_.shard);
    optimizer_ = std::make_unique<AdamW>(zero_.begin(), zero_.count(), model_.decay_ranges(),
                                         adamw_config(s_.training));
  } else {
    zero_ = zero_partition(n, 0, 1);
    optimizer_ = std::make_unique<AdamW>(0, n, model_.decay_ranges(), adamw_config(s_.training));
  }
  const int in_flight =
      L.pp > 1 ? pipeline_in_flight(s_.parallel.schedule, L.pp, L.pp_rank, micro_batches_) : 1;
  for (int i = 0; i < in_flight; ++i)
    acts_.push_back(gpt_activations(model_, s_.training.micro_batch, s_.model.seq));
  act_send_h_.resize(static_cast<size_t>(in_flight));
  grad_send_h_.resize(static_cast<size_t>(in_flight));
  if (L.pp > 1 && L.pp_rank > 0) {
    for (int i = 0; i < in_flight; ++i) grad_send_.emplace_back(acts_[0].boundary_elems);
  }
  scratch_ = gpt_grad_scratch(model_, s_.training.micro_batch, s_.model.seq);
  if (rec_) observer_ = std::make_unique<SpanObserver>(rec_);
}

Trainer::~Trainer() = default;

void Trainer::prepare() {
  if (!z3_) ddp_->broadcast_parameters();  // ZeRO 3 shards come from the same seed on every rank
  world_.barrier().wait();
  record_memory();
}

Trainer::MemoryBytes Trainer::memory() const {
  MemoryBytes m;
  double acts0 = static_cast<double>(scratch_.memory.size_bytes());
  for (const auto& a : acts_) acts0 += static_cast<double>(a.memory.size_bytes());
  if (z3_) {
    const double shard = static_cast<double>(z3_->shard_elems()) * sizeof(float);
    m.parameters = shard;
    m.gradients = shard;
    m.optimizer = 2 * shard;
    m.activations = acts0;
    m.comm_buffers = static_cast<double>(z3_->buffer_bytes() + z3_recv_.size_bytes());
    for (const auto& g : grad_send_) m.comm_buffers += static_cast<double>(g.size_bytes());
    return m;
  }
  m.parameters = static_cast<double>(model_.params.size_bytes());
  const double full_grads = static_cast<double>(model_.grads.size_bytes());
  m.optimizer = 2.0 * sizeof(float) *
                static_cast<double>(s_.parallel.zero >= 1 ? zero_.shard : model_.params.size());
  double acts = static_cast<double>(scratch_.memory.size_bytes());
  for (const auto& a : acts_) acts += static_cast<double>(a.memory.size_bytes());
  m.activations = acts;
  double comm = static_cast<double>(ddp_->comm_buffer_bytes());
  for (const auto& g : grad_send_) comm += static_cast<double>(g.size_bytes());
  if (s_.parallel.zero == 2) {
    // The shard is the gradient state; the full array only stages one backward before scattering.
    m.gradients = static_cast<double>(zero_grads_.size_bytes());
    comm += full_grads + static_cast<double>(zero_recv_.size_bytes());
  } else {
    m.gradients = full_grads;
    comm += static_cast<double>(zero_grads_.size_bytes());
  }
  m.comm_buffers = comm;
  return m;
}

void Trainer::record_memory() {
  if (!rec_) return;
  const int64_t now = profiler::steady_now_ns();
  const MemoryBytes m = memory();
  rec_->counter(names::kMemParameters.data(), m.parameters, now);
  rec_->counter(names::kMemGradients.data(), m.gradients, now);
  rec_->counter(names::kMemOptimizer.data(), m.optimizer, now);
  rec_->counter(names::kMemActivations.data(), m.activations, now);
  rec_->counter(names::kMemCommBuffers.data(), m.comm_buffers, now);
}

void Trainer::forward_pass(int mb, const GptHooks& hooks, double& loss_sum) {
  const int32_t step = step_;
  cur_mb_ = mb;
  if (rec_) rec_->set_step(step, mb);
  if (observer_) observer_->set_context(step, mb);
  const size_t slot = static_cast<size_t>(mb) % acts_.size();
  GptActivations& acts = acts_[slot];
  // The slot's previous activation send must be done before its buffer is overwritten.
  act_send_h_[slot].wait();
  if (model_.shard.has_embed || model_.shard.has_head) {
    ScopedSpan data(rec_, proto(rec_, SpanKind::Data, names::kDataLoad.data(), step, mb));
    loader_->next_batch(batch_);
  }
  ScopedSpan fwd(rec_, proto(rec_, SpanKind::Phase, names::kForward.data(), step, mb));
  if (!model_.shard.has_embed) {
    pp_->recv(acts.stage_input(), acts.boundary_elems, DType::F32, layout_.pp_rank - 1,
              OpLabel{names::kRecvActivation.data(), step, mb, -1})
        .wait();
  }
  loss_sum += z3_ ? z3_forward(mb, acts, hooks)
                  : gpt_forward(model_, acts, batch_.inputs.data(), batch_.targets.data(), hooks);
  if (!model_.shard.has_head) {
    act_send_h_[slot] =
        pp_->send(acts.stage_output(), acts.boundary_elems, DType::F32, layout_.pp_rank + 1,
                  OpLabel{names::kSendActivation.data(), step, mb, -1});
  }
}

void Trainer::embed_all_reduce(float* wte_grad) {
  if (!embed_ || embed_->size() < 2) return;
  const ParamTensor& wte = model_.tensor("wte");
  embed_
      ->all_reduce(wte_grad, wte.count, DType::F32, ReduceOp::Sum,
                   OpLabel{names::kEmbedAllReduce.data(), step_, -1, -1})
      .wait();
}

void Trainer::reduce_gradients_zero(int mb) {
  const int32_t step = step_;
  embed_all_reduce(model_.dembed.wte);
  float* out = s_.parallel.zero == 2 ? zero_recv_.data() : zero_grads_.data();
  dp_->reduce_scatter(
         model_.grads.data(), out, zero_.shard, DType::F32, ReduceOp::Avg,
         OpLabel{kZeroReduceScatterName, step, mb,
                 model_.shard.has_embed || model_.shard.has_head ? kEmbedSegment
                                                                 : model_.shard.layer_begin})
      .wait();
  if (s_.parallel.zero == 2) {
    float* acc = zero_grads_.data();
    for (size_t i = 0; i < zero_.shard; ++i) acc[i] += out[i];
    gpt_zero_grad(model_);  // the next backward writes into a clean array
  }
}

void Trainer::backward_pass(int mb, const GptHooks& hooks, float loss_scale) {
  const int32_t step = step_;
  cur_mb_ = mb;
  if (rec_) rec_->set_step(step, mb);
  if (observer_) observer_->set_context(step, mb);
  const size_t slot = static_cast<size_t>(mb) % acts_.size();
  ScopedSpan bwd(rec_, proto(rec_, SpanKind::Phase, names::kBackward.data(), step, mb));
  if (!model_.shard.has_head) {
    pp_->recv(scratch_.dres, acts_[slot].boundary_elems, DType::F32, layout_.pp_rank + 1,
              OpLabel{names::kRecvGradient.data(), step, mb, -1})
        .wait();
  }
  const bool last_mb = mb == micro_batches_ - 1;  // both schedules end with the last backward
  if (z3_) {
    z3_backward(mb, acts_[slot], hooks, loss_scale);
  } else {
    ddp_->begin_backward(s_.parallel.zero == 0 && last_mb, step, mb);
    gpt_backward(model_, acts_[slot], scratch_, loss_scale, hooks);
    ddp_->finish_backward();
  }
  if (!model_.shard.has_embed) {
    grad_send_h_[slot].wait();
    FloatArray& buf = grad_send_[slot];
    std::copy(scratch_.dres, scratch_.dres + buf.size(), buf.begin());
    grad_send_h_[slot] = pp_->send(buf.data(), buf.size(), DType::F32, layout_.pp_rank - 1,
                                   OpLabel{names::kSendGradient.data(), step, mb, -1});
  }
  if (z3_) z3_finish_backward();
  if (layout_.dp > 1 && ((s_.parallel.zero == 1 && last_mb) || s_.parallel.zero == 2))
    reduce_gradients_zero(mb);
}

// --- ZeRO 3 (zero.hpp). Working buffers: slots 0/1 blocks by layer parity, 2 embedding, 3 final LN.
void Trainer::z3_gather(int segment, int slot, int mb) {
  Zero3Storage::Segment& sg = z3_->segment(segment);
  z3_gather_h_[slot] =
      dp_->all_gather(z3_->params() + sg.shard_offset, z3_->param_buffer(slot), sg.part.shard,
                      DType::F32, OpLabel{kZeroFetchLayerName, step_, mb, segment});
  z3_gathered_[slot] = segment;
}

void Trainer::z3_bind_block(int layer, int next_layer, int mb) {
  const int slot = (layer - model_.shard.layer_begin) & 1;
  if (z3_gathered_[slot] != layer) z3_gather(layer, slot, mb);
  z3_gather_h_[slot].wait();
  // Prefetch: the next block's gather runs on the comm thread while this one computes.
  if (next_layer >= model_.shard.layer_begin && next_layer < model_.shard.layer_end)
    z3_gather(next_layer, slot ^ 1, mb);
  z3_->segment(layer).bind(z3_->param_buffer(slot), z3_->grad_buffer(slot));
}

void Trainer::z3_reduce_scatter(int segment, int slot, int mb) {
  Zero3Storage::Segment& sg = z3_->segment(segment);
  z3_rs_h_[slot] = dp_->reduce_scatter(z3_->grad_buffer(slot), z3_recv_.data() + sg.shard_offset,
                                       sg.part.shard, DType::F32, ReduceOp::Avg,
                                       OpLabel{kZeroReduceScatterName, step_, mb, segment});
}

float Trainer::z3_forward(int mb, GptActivations& acts, const GptHooks& hooks) {
  if (model_.shard.has_embed) gpt_embed_forward(model_, acts, batch_.inputs.data(), hooks);
  for (int l = model_.shard.layer_begin; l < model_.shard.layer_end; ++l) {
    z3_bind_block(l, l + 1, mb);
    gpt_block_forward(model_, acts, l, hooks);
    z3_gathered_[(l - model_.shard.layer_begin) & 1] = -99;  // used: the backward gathers it again
  }
  return model_.shard.has_head ? gpt_head_forward(model_, acts, batch_.targets.data(), hooks)
                               : 0.0f;
}

void Trainer::z3_backward(int mb, GptActivations& acts, const GptHooks& hooks, float loss_scale) {
  const int L = model_.config.n_layer;
  GptHooks h = hooks;
  h.on_grads_ready = nullptr;
  auto clear = [&](int slot, size_t n) {
    std::fill(z3_->grad_buffer(slot), z3_->grad_buffer(slot) + n, 0.0f);
  };
  if (model_.shard.has_embed || model_.shard.has_head)
    clear(2, z3_->segment(kEmbedSegment).part.padded());
  if (model_.shard.has_head) {
    clear(3, z3_->segment(L).part.padded());
    gpt_head_backward(model_, acts, scratch_, loss_scale, h);
    z3_reduce_scatter(L, 3, mb);
  }
  for (int l = model_.shard.layer_end - 1; l >= model_.shard.layer_begin; --l) {
    const int slot = (l - model_.shard.layer_begin) & 1;
    z3_rs_h_[slot].wait();  // the buffer's previous gradients are scattered
    z3_bind_block(l, l - 1, mb);
    clear(slot, z3_->segment(l).part.padded());
    gpt_block_backward(model_, acts, scratch_, l, h);
    z3_reduce_scatter(l, slot, mb);
    z3_gathered_[slot] = -99;
  }
  if (model_.shard.has_embed) gpt_embed_backward(model_, acts, scratch_, h);
}

// After the pipeline send of the backward pass (so a neighbour never waits behind a collective):
// the tied wte's gradient, the embedding's reduce-scatter, then every scattered shard accumulated.
void Trainer::z3_finish_backward() {
  if (model_.shard.has_embed || model_.shard.has_head) {
    embed_all_reduce(model_.dembed.wte);
    z3_reduce_scatter(kEmbedSegment, 2, cur_mb_);
  }
  for (auto& h : z3_rs_h_) h.wait();
  float* acc = z3_->grads();
  const float* in = z3_recv_.data();
  for (size_t i = 0; i < z3_->shard_elems(); ++i) acc[i] += in[i];
}

std::vector<float> Trainer::full_parameters() {
  if (!z3_) {
    size_t n = 0;
    for (const auto& t : model_.tensors) n = std::max(n, t.offset + t.count);
    return std::vector<float>(model_.params.begin(),
                              model_.params.begin() + static_cast<std::ptrdiff_t>(n));
  }
  size_t n = 0;
  for (const auto& sg : z3_->segments()) n = std::max(n, sg.range.end());
  std::vector<float> out(n);
  for (const auto& sg : z3_->segments()) {
    std::vector<float> buf(sg.part.padded());
    dp_->all_gather(z3_->params() + sg.shard_offset, buf.data(), sg.part.shard, DType::F32).wait();
    std::copy(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(sg.range.count),
              out.begin() + static_cast<std::ptrdiff_t>(sg.range.offset));
  }
  return out;
}

std::size_t Trainer::flat_elems() const {
  std::size_t n = 0;
  for (const auto& t : model_.tensors) n = std::max(n, t.offset + t.count);
  return n;
}

int64_t Trainer::adamw_steps() const {
  if (z3_) return z3_opt_.empty() ? 0 : z3_opt_.front()->steps();
  return optimizer_->steps();
}

std::vector<Trainer::StateRange> Trainer::state_to_save() {
  std::vector<StateRange> out;
  if (z3_) {
    auto& segs = z3_->segments();
    for (size_t i = 0; i < segs.size(); ++i) {
      if (segs[i].part.count() == 0) continue;
      out.push_back({segs[i].range.offset + segs[i].part.begin(), segs[i].part.count(),
                     z3_->params() + segs[i].shard_offset, z3_opt_[i]->m(), z3_opt_[i]->v()});
    }
    return out;
  }
  if (s_.parallel.zero == 0 && layout_.dp_rank != 0) return out;  // dp rank 0 holds the same
  if (optimizer_->size() > 0) {
    out.push_back({optimizer_->offset(), optimizer_->size(),
                   model_.params.data() + optimizer_->offset(), optimizer_->m(), optimizer_->v()});
  }
  return out;
}

std::vector<Trainer::StateRange> Trainer::state_to_load() {
  if (z3_) return state_to_save();
  std::vector<StateRange> out;
  out.push_back({0, flat_elems(), model_.params.data(), nullptr, nullptr});
  if (optimizer_->size() > 0) {
    out.push_back(
        {optimizer_->offset(), optimizer_->size(), nullptr, optimizer_->m(), optimizer_->v()});
  }
  return out;
}

void Trainer::restore_counters(int32_t steps_done, int64_t adamw_steps, int64_t data_calls) {
  step_ = steps_done;
  if (optimizer_) optimizer_->set_steps(adamw_steps);
  for (auto& o : z3_opt_) o->set_steps(adamw_steps);
  loader_->seek(data_calls);
}

StepResult Trainer::step() {
  const int32_t step = step_;
  StepResult result;
  result.step = step;
  result.tokens = static_cast<int64_t>(s_.training.global_batch) * s_.model.seq;
  const int64_t t0 = profiler::steady_now_ns();
  if (rec_) rec_->set_step(step);
  {
    ScopedSpan step_span(rec_, proto(rec_, SpanKind::Phase, names::kStep.data(), step, -1));
    {
      // Memory-bound and not small (4 bytes per parameter held): its own span, so that calibration
      // and the simulator see it rather than an unexplained gap at the start of the step.
      ScopedSpan zero_span(rec_, proto(rec_, SpanKind::Compute, names::kZeroGrad.data(), step, -1));
      gpt_zero_grad(model_);
      if (s_.parallel.zero >= 1) std::fill(zero_grads_.begin(), zero_grads_.end(), 0.0f);
      if (z3_) std::fill(z3_->grads(), z3_->grads() + z3_->shard_elems(), 0.0f);
    }
    if (z3_) {
      // The embedding and final LayerNorm serve both ends of every micro-batch: gathered once a step.
      for (int id : {kEmbedSegment, model_.config.n_layer}) {
        const bool held = id == kEmbedSegment ? (model_.shard.has_embed || model_.shard.has_head)
                                              : model_.shard.has_head;
        if (!held) continue;
        const int slot = id == kEmbedSegment ? 2 : 3;
        z3_gather(id, slot, -1);
        z3_gather_h_[slot].wait();
        z3_->segment(id).bind(z3_->param_buffer(slot), z3_->grad_buffer(slot));
      }
    }
    GptHooks hooks;
    hooks.observer = observer_.get();
    hooks.on_grads_ready = [this](int segment) { ddp_->on_grads_ready(segment); };
    if (layout_.tp > 1) {
      hooks.tp_all_reduce = [this](TpPoint, int layer, float* data, size_t count) {
        tp_->all_reduce(data, count, DType::F32, ReduceOp::Sum,
                        OpLabel{kTpAllReduceName, step_, cur_mb_, layer})
            .wait();
      };
    }
    const float loss_scale = 1.0f / static_cast<float>(micro_batches_);
    double loss_sum = 0;
    const std::vector<int> order = layout_.pp > 1 ? pipeline_order(s_.parallel.schedule, layout_.pp,
                                                                   layout_.pp_rank, micro_batches_)
                                                  : pipeline_order("gpipe", 1, 0, 1);
    if (layout_.pp > 1) {
      for (int pass : order) {
        if (pass >= 0)
          forward_pass(pass, hooks, loss_sum);
        else
          backward_pass(-pass - 1, hooks, loss_scale);
      }
      for (auto& h : act_send_h_) h.wait();
      for (auto& h : grad_send_h_) h.wait();
    } else {
      for (int mb = 0; mb < micro_batches_; ++mb) {
        forward_pass(mb, hooks, loss_sum);
        backward_pass(mb, hooks, loss_scale);
      }
    }
    if (rec_) rec_->set_step(step, -1);
    cur_mb_ = -1;
    if (s_.parallel.zero == 0 || layout_.dp == 1) embed_all_reduce(model_.dembed.wte);
    {
      ScopedSpan opt(rec_, proto(rec_, SpanKind::Phase, names::kOptimizer.data(), step, -1));
      if (z3_) {
        ScopedSpan adamw(rec_,
                         proto(rec_, SpanKind::Optimizer, names::kOptimizerStep.data(), step, -1));
        auto& segs = z3_->segments();
        for (size_t i = 0; i < segs.size(); ++i) {
          if (segs[i].part.count() == 0) continue;
          z3_opt_[i]->step(z3_->params() + segs[i].shard_offset,
                           z3_->grads() + segs[i].shard_offset);
        }
        for (int& g : z3_gathered_) g = -99;
      } else if (s_.parallel.zero >= 1 && layout_.dp > 1) {
        {
          ScopedSpan adamw(
              rec_, proto(rec_, SpanKind::Optimizer, names::kOptimizerStep.data(), step, -1));
          if (zero_.count() > 0)
            optimizer_->step(model_.params.data() + zero_.begin(), zero_grads_.data());
        }
        dp_->all_gather(model_.params.data() + zero_.begin(), model_.params.data(), zero_.shard,
                        DType::F32, OpLabel{kZeroAllGatherName, step, -1, -1})
            .wait();
      } else {
        ScopedSpan adamw(rec_,
                         proto(rec_, SpanKind::Optimizer, names::kOptimizerStep.data(), step, -1));
        optimizer_->step(model_.params.data(), model_.grads.data());
      }
    }
    float loss = static_cast<float>(loss_sum / micro_batches_);
    if (layout_.pp > 1) {
      pp_->broadcast(&loss, 1, DType::F32, layout_.pp - 1,
                     OpLabel{names::kPipelineLoss.data(), step, -1, -1})
          .wait();
    }
    result.loss = loss;
  }
  record_memory();
  result.duration_ns = profiler::steady_now_ns() - t0;
  ++step_;
  return result;
}

}  // namespace orrery::runtime
