// The training loop of one rank (see trainer.hpp for the spans it records).
#include "orrery/runtime/trainer.hpp"

#include <algorithm>
#include <sstream>
#include <unordered_map>

#include "orrery/common/error.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/kernels.hpp"

namespace orrery::runtime {

using profiler::Recorder;
using profiler::ScopedSpan;
using traces::Span;
using traces::SpanKind;

Layout Layout::of(const Scenario& s, int world_rank) {
  Layout l;
  l.dp = s.parallel.dp;
  l.tp = s.parallel.tp;
  l.pp = s.parallel.pp;
  // Axes fastest-varying first.
  std::vector<std::string> axes;
  std::stringstream ss(s.parallel.placement);
  for (std::string a; std::getline(ss, a, ',');) {
    a.erase(std::remove(a.begin(), a.end(), ' '), a.end());
    axes.push_back(a);
  }
  std::vector<std::string> sorted = axes;
  std::sort(sorted.begin(), sorted.end());
  if (sorted != std::vector<std::string>{"dp", "pp", "tp"}) {
    throw InputError("key 'parallel.placement': expected the three axes tp, dp, pp in some order "
                     "(fastest-varying first), e.g. \"tp,dp,pp\"; got \"" +
                     s.parallel.placement + "\"");
  }
  int rest = world_rank;
  for (const auto& a : axes) {
    int& coord = a == "dp" ? l.dp_rank : a == "tp" ? l.tp_rank : l.pp_rank;
    const int extent = a == "dp" ? l.dp : a == "tp" ? l.tp : l.pp;
    coord = rest % extent;
    rest /= extent;
  }
  return l;
}

void check_supported(const Scenario& s) {
  const std::string origin = s.path.empty() ? std::string("scenario") : s.path;
  if (s.parallel.tp > 1) {
    throw InputError(origin + ": key 'parallel.tp': tensor parallelism (tp = " +
                     std::to_string(s.parallel.tp) +
                     ") is not implemented in the CPU runtime yet; use parallel.tp: 1 (or `orrery "
                     "sim` to predict it)");
  }
  if (s.parallel.pp > 1) {
    throw InputError(origin + ": key 'parallel.pp': pipeline parallelism (pp = " +
                     std::to_string(s.parallel.pp) +
                     ") is not implemented in the CPU runtime yet; use parallel.pp: 1 (or `orrery "
                     "sim` to predict it)");
  }
  if (s.parallel.zero > 0) {
    throw InputError(origin + ": key 'parallel.zero': ZeRO stage " + std::to_string(s.parallel.zero) +
                     " is not implemented in the CPU runtime yet; use parallel.zero: 0");
  }
  if (s.runtime.device != "cpu") {
    throw InputError(origin + ": key 'runtime.device': '" + s.runtime.device +
                     "' is not available in this runtime; expected cpu");
  }
  if (s.runtime.threads < 1) {
    throw InputError(origin + ": key 'runtime.threads': expected at least 1, got " +
                     std::to_string(s.runtime.threads));
  }
}

// Turns the model's OpObserver calls into Compute spans with step, micro-batch and layer.
class Trainer::SpanObserver final : public OpObserver {
 public:
  explicit SpanObserver(Recorder* rec) : rec_(rec) {}
  void set_context(int32_t step, int32_t micro_batch) {
    step_ = step;
    micro_batch_ = micro_batch;
  }
  void begin(const char* name, int layer, double flops) override {
    open_.kind = SpanKind::Compute;
    open_.stream = Recorder::thread_stream();
    open_.name = name_id(name);
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
  // The model passes string literals: the pointer is a good enough key, the text the fallback.
  traces::NameId name_id(const char* name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const traces::NameId id = rec_->intern(name);
    ids_.emplace(name, id);
    return id;
  }
  Recorder* rec_;
  std::unordered_map<const char*, traces::NameId> ids_;
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

  // The data-parallel group: ranks with the same (tp, pp) coordinates.
  const int color = layout_.tp_rank + layout_.tp * layout_.pp_rank;
  dp_ = world_.split(color, layout_.dp_rank, traces::CommKind::DP,
                     "dp[tp=" + std::to_string(layout_.tp_rank) + ",pp=" +
                         std::to_string(layout_.pp_rank) + "]");

  const GptConfig cfg = gpt_config(s_.model);
  model_ = gpt_create(cfg, GptShard{}, s_.training.seed);
  source_ = make_token_source(s_.data.source, s_.data.path, cfg.vocab, s_.training.seed);
  loader_ = std::make_unique<DataLoader>(*source_, s_.model.seq, s_.training.micro_batch,
                                         layout_.dp_rank, layout_.dp, s_.training.seed);
  DdpOptions dopt;
  dopt.bucket_mb = s_.parallel.bucket_mb;
  dopt.overlap = s_.parallel.overlap;
  ddp_ = std::make_unique<DataParallel>(model_, *dp_, dopt);
  optimizer_ = std::make_unique<AdamW>(0, model_.num_params(), model_.decay_ranges(),
                                       adamw_config(s_.training));
  acts_ = gpt_activations(model_, s_.training.micro_batch, s_.model.seq);
  scratch_ = gpt_grad_scratch(model_, s_.training.micro_batch, s_.model.seq);
  if (rec_) observer_ = std::make_unique<SpanObserver>(rec_);
}

Trainer::~Trainer() = default;

void Trainer::prepare() {
  ddp_->broadcast_parameters();
  world_.barrier().wait();
  record_memory();
}

void Trainer::record_memory() {
  if (!rec_) return;
  const int64_t now = profiler::steady_now_ns();
  const double param_bytes = static_cast<double>(model_.params.size_bytes());
  rec_->counter("mem.parameters", param_bytes, now);
  rec_->counter("mem.gradients", static_cast<double>(model_.grads.size_bytes()), now);
  rec_->counter("mem.optimizer", 2.0 * param_bytes, now);  // AdamW's m and v, fp32
  rec_->counter("mem.activations",
                static_cast<double>(acts_.memory.size_bytes() + scratch_.memory.size_bytes()), now);
  rec_->counter("mem.comm_buffers", static_cast<double>(ddp_->comm_buffer_bytes()), now);
}

StepResult Trainer::step() {
  const int32_t step = step_;
  StepResult result;
  result.step = step;
  result.tokens = static_cast<int64_t>(s_.training.global_batch) * s_.model.seq;
  const int64_t t0 = profiler::steady_now_ns();
  if (rec_) rec_->set_step(step);
  {
    ScopedSpan step_span(rec_, proto(rec_, SpanKind::Phase, "step", step, -1));
    gpt_zero_grad(model_);
    GptHooks hooks;
    hooks.observer = observer_.get();
    hooks.on_grads_ready = [this](int segment) { ddp_->on_grads_ready(segment); };
    const float loss_scale = 1.0f / static_cast<float>(micro_batches_);
    double loss_sum = 0;
    for (int mb = 0; mb < micro_batches_; ++mb) {
      if (rec_) rec_->set_step(step, mb);
      if (observer_) observer_->set_context(step, mb);
      {
        ScopedSpan data(rec_, proto(rec_, SpanKind::Data, "data", step, mb));
        loader_->next_batch(batch_);
      }
      {
        ScopedSpan fwd(rec_, proto(rec_, SpanKind::Phase, "forward", step, mb));
        loss_sum += gpt_forward(model_, acts_, batch_.inputs.data(), batch_.targets.data(), hooks);
      }
      {
        ScopedSpan bwd(rec_, proto(rec_, SpanKind::Phase, "backward", step, mb));
        ddp_->begin_backward(mb == micro_batches_ - 1, step, mb);
        gpt_backward(model_, acts_, scratch_, loss_scale, hooks);
        ddp_->finish_backward();
      }
    }
    if (rec_) rec_->set_step(step, -1);
    {
      ScopedSpan opt(rec_, proto(rec_, SpanKind::Phase, "optimizer", step, -1));
      ScopedSpan adamw(rec_, proto(rec_, SpanKind::Optimizer, "adamw", step, -1));
      optimizer_->step(model_.params.data(), model_.grads.data());
    }
    result.loss = static_cast<float>(loss_sum / micro_batches_);
  }
  record_memory();
  result.duration_ns = profiler::steady_now_ns() - t0;
  ++step_;
  return result;
}

}  // namespace orrery::runtime
