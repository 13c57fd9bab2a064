// The CUDA backend of the training loop (cuda/backend.hpp): device selection, the compute stream,
// event-timed spans, the device communicators of the groups, and the memory operations the loop
// asks for.
#include "orrery/runtime/cuda/backend.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "orrery/common/error.hpp"
#if ORRERY_HAVE_CUPTI_TRACER
#include "orrery/profiler/cupti_tracer.hpp"
#endif
#include "orrery/profiler/range_hooks.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/cuda/gpu_run.hpp"
#include "orrery/runtime/cuda/nccl_comm.hpp"
#include "orrery/runtime/rank_trainer.hpp"

namespace orrery::runtime::cuda {

using profiler::Recorder;
using traces::Span;

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

// ------------------------------------------------------------------------------------ backend

// --- the CUDA backend's kernel tracing

struct CudaBackend::Tracer {
#if ORRERY_HAVE_CUPTI_TRACER
  std::unique_ptr<profiler::CuptiTracer> cupti;
#endif
};

void CudaBackend::start_device_tracing(profiler::Recorder& rec) {
#if ORRERY_HAVE_CUPTI_TRACER
  // Kernel-level spans (every kernel, copy and memset on its CUDA stream) next to the trainer's
  // event-timed op spans. A CUPTI that refuses (no profiling permission, another profiler attached)
  // costs the kernel spans only: the run goes on and says why.
  tracer_ = std::make_unique<Tracer>();
  try {
    tracer_->cupti = profiler::CuptiTracer::start(rec);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "orrery: rank %d: CUPTI kernel tracing is off: %s\n", rec.rank(),
                 e.what());
  }
#else
  (void)rec;
#endif
}

void CudaBackend::stop_device_tracing() {
#if ORRERY_HAVE_CUPTI_TRACER
  if (!tracer_ || !tracer_->cupti) return;
  ORRERY_CUDA_CHECK(cudaDeviceSynchronize());  // every kernel complete, so flush() gets them all
  tracer_->cupti->flush();
  if (tracer_->cupti->dropped_records() > 0) {
    std::fprintf(stderr, "orrery: rank %d: CUPTI dropped %llu activity records (buffers full)\n",
                 rec_ != nullptr ? rec_->rank() : -1,
                 static_cast<unsigned long long>(tracer_->cupti->dropped_records()));
  }
  tracer_.reset();
#endif
}

CudaBackend::CudaBackend(const Scenario& s, Recorder* rec, const Options& opt)
    : opt_(opt),
      rec_(rec != nullptr && rec->enabled() ? rec : nullptr),
      watchdog_s_(s.runtime.watchdog_s),
      schedule_(schedule_of(s.parallel)),
      origin_(origin_of(s)) {
  device_ = select_device(launcher_local_rank());
  stream_ = std::make_unique<Stream>();
  ctx_ = std::make_unique<Context>(stream_->get(), opt_.math);
  kernels_.ctx = ctx_.get();
  spans_ = std::make_unique<EventSpans>(rec_, stream_->get(), profiler::kComputeStream);
}

CudaBackend::~CudaBackend() { drain(); }

std::unique_ptr<Communicator> CudaBackend::make_device_comm(Communicator& host,
                                                            CommBackend backend) {
  std::unique_ptr<Communicator> dev;
  if (backend == CommBackend::kNccl) {
#if defined(ORRERY_HAVE_NCCL)
    WorldOptions wopt;
    wopt.watchdog_s = watchdog_s_;
    dev = make_nccl_communicator(host, stream_->get(), wopt);
#else
    throw InputError(origin_ + ": the NCCL communicator was asked for, but this build has no NCCL");
#endif
  } else {
    dev = make_staged_communicator(host, stream_->get(), watchdog_s_);
  }
  if (rec_ != nullptr) dev->set_recorder(rec_);
  return dev;
}

DeviceGroups CudaBackend::connect(const RankGroups& g, const Layout& L) {
  if (L.dp == 1 && L.tp == 1 && L.pp == 1) return {};
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
  if (L.dp > 1) dp_ = make_device_comm(*g.dp, backend);
  if (L.tp > 1) tp_ = make_device_comm(*g.tp, backend);
  bool pipeline_staged = false;
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
    const CommBackend pipe = backend == CommBackend::kNccl && schedule_ == Schedule::OneFOneB
                                 ? CommBackend::kStaged
                                 : backend;
    pp_ = make_device_comm(*g.pp, pipe);
    if (g.embed->size() > 1) embed_ = make_device_comm(*g.embed, pipe);
    pipeline_staged = pipe != backend;
  }
  if (L.ep > 1) {
    // Expert parallelism (model/moe.hpp): the ep group's all-to-alls and the experts' gradient
    // all-reduce over their edp group (none when it is one rank: dp = ep).
    ep_ = make_device_comm(*g.ep, backend);
    if (g.edp && g.edp->size() > 1) edp_ = make_device_comm(*g.edp, backend);
  }
  comm_name_ =
      backend == CommBackend::kNccl ? (pipeline_staged ? "nccl+staged-pp" : "nccl") : "staged";
  return DeviceGroups{dp_.get(), tp_.get(), pp_.get(), embed_.get(), ep_.get(), edp_.get()};
}

void CudaBackend::add(float* acc, const float* in, std::size_t n) {
  residual_forward(*ctx_, acc, acc, in, n);
}

void CudaBackend::scale(float* p, float s, std::size_t n) { cuda::scale(*ctx_, p, p, s, n); }

void CudaBackend::copy(float* dst, const float* src, std::size_t n) {
  if (n == 0) return;
  ORRERY_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_->get()));
}

void CudaBackend::adamw(float* params, const float* grads, float* m, float* v, std::size_t offset,
                        std::size_t n, std::span<const ParamRange> decay, int64_t step,
                        const AdamWConfig& cfg) {
  adamw_update(*ctx_, params, grads, m, v, offset, n, decay, step, cfg);
}

void CudaBackend::download(float* host, const float* src, std::size_t n) {
  if (n == 0) return;
  ORRERY_CUDA_CHECK(
      cudaMemcpyAsync(host, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_->get()));
  ORRERY_CUDA_CHECK(cudaStreamSynchronize(stream_->get()));
}

void CudaBackend::upload(float* dst, const float* host, std::size_t n) {
  if (n == 0) return;
  ORRERY_CUDA_CHECK(
      cudaMemcpyAsync(dst, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_->get()));
  ORRERY_CUDA_CHECK(cudaStreamSynchronize(stream_->get()));
}

void CudaBackend::synchronize() { ORRERY_CUDA_CHECK(cudaStreamSynchronize(stream_->get())); }

CudaBackend::Model CudaBackend::make_model(Gpt host, bool storage) {
  Model m = gpu_gpt_create(std::move(host), storage);
  // The upload is a pageable copy on the legacy stream, which the non-blocking compute and
  // communicator streams do not wait for: complete before any of them reads the parameters.
  ORRERY_CUDA_CHECK(cudaDeviceSynchronize());
  return m;
}

std::unique_ptr<CudaBackend::Zero3> CudaBackend::make_zero3(Model& m, int dp_rank, int dp_size,
                                                            int ep) {
  auto z = std::make_unique<GpuZero3Storage>(m, dp_rank, dp_size, ep);
  ORRERY_CUDA_CHECK(cudaDeviceSynchronize());  // its shards' uploads, as make_model's
  return z;
}

void CudaBackend::end_step() {
  if (shards_) shards_->resolve();  // waits for its copy stream
  spans_->resolve();                // waits for the stream
  ORRERY_CUDA_CHECK(cudaStreamSynchronize(stream_->get()));
  ORRERY_CUDA_CHECK(cudaGetLastError());
}

void CudaBackend::finish() {
  ORRERY_CUDA_CHECK(cudaStreamSynchronize(stream_->get()));
  for (Communicator* c : {dp_.get(), tp_.get(), pp_.get(), embed_.get(), ep_.get(), edp_.get()}) {
    if (c == nullptr) continue;
    c->synchronize();
    c->set_recorder(nullptr);
  }
}

void CudaBackend::drain() noexcept {
  // Let queued work finish before buffers go (errors cannot be reported from here).
  if (stream_) cudaStreamSynchronize(stream_->get());
  if (offload_) offload_->drain();
  if (shards_) shards_->drain();
  for (Communicator* c : {dp_.get(), tp_.get(), pp_.get(), embed_.get(), ep_.get(), edp_.get()}) {
    if (c == nullptr) continue;
    try {
      c->set_recorder(nullptr);
      c->synchronize();
    } catch (...) {
    }
  }
}

std::string CudaBackend::device_description() const {
  return "cuda:" + std::to_string(device_.index) + " " + device_.name;
}

double CudaBackend::peak_flops_per_rank() const { return peak_flops(device_, opt_.math); }

nlohmann::json CudaBackend::meta_fields() const {
  return {{"device", device_.name},
          {"precision", std::string(math_mode_name(opt_.math))},
          {"comm_backend", comm_name_}};
}

}  // namespace orrery::runtime::cuda
