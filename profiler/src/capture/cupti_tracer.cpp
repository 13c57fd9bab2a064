// CuptiTracer: the CUPTI Activity API feeding a GpuActivityMapper (see cupti_tracer.hpp).
// Built only when CUPTI was found (orrery_cupti, profiler/CMakeLists.txt).
#include "orrery/profiler/cupti_tracer.hpp"

#include <cuda_runtime_api.h>
#include <cupti.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/profiler/range_hooks.hpp"

namespace orrery::profiler {

// The callbacks below reach the running tracer through these (CUPTI's callbacks are plain C).
struct CuptiTracerAccess {
  static GpuActivityMapper& mapper(CuptiTracer& t) { return t.mapper_; }
};

namespace {

constexpr size_t kBufferBytes = 8u << 20;
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET,
                                         CUPTI_ACTIVITY_KIND_RUNTIME,
                                         CUPTI_ACTIVITY_KIND_DRIVER,
                                         CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION};
// API calls that launch no GPU work, several of them made in polling loops (a span's end event
// queried until it completes, NCCL's stream queries and event records): with the RUNTIME and
// DRIVER kinds on, each would be one more activity record (and one more external correlation
// record inside a range), the cost growing with the time spent waiting. Correlation needs only the
// calls that launch kernels, copies and memsets, so these are switched off after the kinds are
// enabled (cuptiActivityEnableRuntimeApi/DriverApi).
#define ORRERY_RT(name) CUPTI_RUNTIME_TRACE_CBID_##name
constexpr CUpti_CallbackId kQuietRuntimeApis[] = {
    ORRERY_RT(cudaEventQuery_v3020),
    ORRERY_RT(cudaEventRecord_v3020),
    ORRERY_RT(cudaEventRecord_ptsz_v7000),
    ORRERY_RT(cudaEventRecordWithFlags_v11010),
    ORRERY_RT(cudaEventRecordWithFlags_ptsz_v11010),
    ORRERY_RT(cudaEventSynchronize_v3020),
    ORRERY_RT(cudaEventElapsedTime_v3020),
    ORRERY_RT(cudaEventElapsedTime_v12080),
    ORRERY_RT(cudaEventCreateWithFlags_v3020),
    ORRERY_RT(cudaEventDestroy_v3020),
    ORRERY_RT(cudaStreamQuery_v3020),
    ORRERY_RT(cudaStreamQuery_ptsz_v7000),
    ORRERY_RT(cudaStreamSynchronize_v3020),
    ORRERY_RT(cudaStreamSynchronize_ptsz_v7000),
    ORRERY_RT(cudaStreamWaitEvent_v3020),
    ORRERY_RT(cudaStreamWaitEvent_ptsz_v7000),
    ORRERY_RT(cudaStreamGetFlags_v5050),
    ORRERY_RT(cudaStreamGetFlags_ptsz_v7000),
    ORRERY_RT(cudaStreamGetPriority_v5050),
    ORRERY_RT(cudaStreamGetPriority_ptsz_v7000),
    ORRERY_RT(cudaStreamIsCapturing_v10000),
    ORRERY_RT(cudaStreamIsCapturing_ptsz_v10000),
    ORRERY_RT(cudaStreamGetCaptureInfo_v10010),
    ORRERY_RT(cudaStreamGetCaptureInfo_v12030),
    ORRERY_RT(cudaThreadExchangeStreamCaptureMode_v10010),
    ORRERY_RT(cudaDeviceSynchronize_v3020),
    ORRERY_RT(cudaGetLastError_v3020),
    ORRERY_RT(cudaPeekAtLastError_v3020),
    ORRERY_RT(cudaGetDevice_v3020),
    ORRERY_RT(cudaSetDevice_v3020),
    ORRERY_RT(cudaGetDeviceCount_v3020)};
#undef ORRERY_RT
#define ORRERY_DRV(name) CUPTI_DRIVER_TRACE_CBID_##name
constexpr CUpti_CallbackId kQuietDriverApis[] = {ORRERY_DRV(cuEventQuery),
                                                 ORRERY_DRV(cuEventRecord),
                                                 ORRERY_DRV(cuEventRecord_ptsz),
                                                 ORRERY_DRV(cuEventRecordWithFlags),
                                                 ORRERY_DRV(cuEventRecordWithFlags_ptsz),
                                                 ORRERY_DRV(cuEventSynchronize),
                                                 ORRERY_DRV(cuEventElapsedTime),
                                                 ORRERY_DRV(cuEventElapsedTime_v2),
                                                 ORRERY_DRV(cuStreamQuery),
                                                 ORRERY_DRV(cuStreamQuery_ptsz),
                                                 ORRERY_DRV(cuStreamSynchronize),
                                                 ORRERY_DRV(cuStreamSynchronize_ptsz),
                                                 ORRERY_DRV(cuStreamWaitEvent),
                                                 ORRERY_DRV(cuStreamWaitEvent_ptsz),
                                                 ORRERY_DRV(cuStreamIsCapturing),
                                                 ORRERY_DRV(cuStreamIsCapturing_ptsz),
                                                 ORRERY_DRV(cuStreamGetCaptureInfo),
                                                 ORRERY_DRV(cuStreamGetCaptureInfo_ptsz),
                                                 ORRERY_DRV(cuStreamGetCaptureInfo_v2),
                                                 ORRERY_DRV(cuStreamGetCaptureInfo_v2_ptsz),
                                                 ORRERY_DRV(cuStreamGetCaptureInfo_v3),
                                                 ORRERY_DRV(cuThreadExchangeStreamCaptureMode),
                                                 ORRERY_DRV(cuStreamGetCtx),
                                                 ORRERY_DRV(cuStreamGetCtx_v2),
                                                 ORRERY_DRV(cuCtxGetCurrent),
                                                 ORRERY_DRV(cuCtxSetCurrent),
                                                 ORRERY_DRV(cuCtxGetDevice),
                                                 ORRERY_DRV(cuCtxGetDevice_v2),
                                                 ORRERY_DRV(cuCtxGetId),
                                                 ORRERY_DRV(cuPointerGetAttribute),
                                                 ORRERY_DRV(cuGetProcAddress),
                                                 ORRERY_DRV(cuGetProcAddress_v2),
                                                 ORRERY_DRV(cuGetErrorString)};
#undef ORRERY_DRV

// External correlation kinds: named ranges, and communication operations (range_hooks.hpp).
constexpr CUpti_ExternalCorrelationKind kRangeKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;
constexpr CUpti_ExternalCorrelationKind kCollectiveKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1;

// Guards g_active: callbacks and range hooks hold it shared (they run concurrently), start() and
// the destructor exclusively.
std::shared_mutex g_mu;
CuptiTracer* g_active = nullptr;  // the running tracer
std::atomic<uint64_t> g_dropped{0};
std::atomic<uint64_t> g_next_external_id{0};

std::string cupti_error(CUptiResult r) {
  const char* s = nullptr;
  if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || s == nullptr) s = "unknown CUPTI error";
  std::string msg = std::string(s) + " (CUptiResult " + std::to_string(static_cast<int>(r)) + ")";
  if (r == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES) {
    msg +=
        "; GPU profiling is restricted to administrators on this machine (driver option "
        "NVreg_RestrictProfilingToAdminUsers=0 lifts it)";
  } else if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
    msg += "; another profiler (Nsight Systems/Compute, a CUPTI tool) is already attached";
  }
  return msg;
}

const char* copy_kind_name(uint8_t k) {
  switch (static_cast<CUpti_ActivityMemcpyKind>(k)) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA:
      return "HtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH:
      return "AtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA:
      return "AtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD:
      return "AtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA:
      return "DtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "PtoP";
    default:
      return "unknown";
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void handle_record(GpuActivityMapper& m, const CUpti_Activity* r) {
  GpuActivity a;
  switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
      a.kind = GpuActivity::Kind::Kernel;
      a.name = k->name ? k->name : "unknown kernel";
      a.start_ns = k->start;
      a.end_ns = k->end;
      a.stream_id = k->streamId;
      a.correlation_id = k->correlationId;
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
      a.kind = GpuActivity::Kind::Memcpy;
      a.name = copy_kind_name(c->copyKind);
      a.start_ns = c->start;
      a.end_ns = c->end;
      a.stream_id = c->streamId;
      a.correlation_id = c->correlationId;
      a.bytes = c->bytes;
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* s = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
      a.kind = GpuActivity::Kind::Memset;
      a.name = "memset";
      a.start_ns = s->start;
      a.end_ns = s->end;
      a.stream_id = s->streamId;
      a.correlation_id = s->correlationId;
      a.bytes = s->bytes;
      break;
    }
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(r);
      if (e->externalKind == kRangeKind) {
        m.correlate(e->correlationId, e->externalId);
      } else if (e->externalKind == kCollectiveKind) {
        m.correlate_collective(e->correlationId, e->externalId);
      }
      return;
    }
    default:
      return;  // RUNTIME and DRIVER records only carry the external correlations along
  }
  if (a.start_ns == 0 && a.end_ns == 0) return;  // CUPTI could not time it
  m.add(a);
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t* buffer, size_t size,
                               size_t valid_size) {
  {
    std::shared_lock lock(g_mu);
    if (g_active != nullptr && valid_size > 0) {
      GpuActivityMapper& m = CuptiTracerAccess::mapper(*g_active);
      CUpti_Activity* r = nullptr;
      while (cuptiActivityGetNextRecord(buffer, valid_size, &r) == CUPTI_SUCCESS)
        handle_record(m, r);
    }
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(ctx, stream_id, &dropped) == CUPTI_SUCCESS) {
    g_dropped += dropped;
  }
  std::free(buffer);
}

// Range hooks: one external correlation id per open range, pushed on the range's thread.
void range_open(const char*, uint64_t, int32_t step, int32_t micro_batch) {
  const uint64_t id = ++g_next_external_id;
  {
    std::shared_lock lock(g_mu);
    if (g_active) CuptiTracerAccess::mapper(*g_active).range_opened(id, step, micro_batch);
  }
  cuptiActivityPushExternalCorrelationId(kRangeKind, id);
}

void range_close() {
  uint64_t id = 0;
  cuptiActivityPopExternalCorrelationId(kRangeKind, &id);
}

// Collective hooks: one external correlation id (its own kind) per communication operation, pushed
// around the call that launches its kernels; taken only while a tracer runs.
bool collective_open(const CollectiveAnnotation& a) {
  const uint64_t id = ++g_next_external_id;
  {
    std::shared_lock lock(g_mu);
    if (g_active == nullptr) return false;
    CuptiTracerAccess::mapper(*g_active).collective_issued(id, a);
  }
  return cuptiActivityPushExternalCorrelationId(kCollectiveKind, id) == CUPTI_SUCCESS;
}

void collective_close() {
  uint64_t id = 0;
  cuptiActivityPopExternalCorrelationId(kCollectiveKind, &id);
}

const RangeHooks kHooks{&range_open, &range_close, &collective_open, &collective_close};

void disable_all() {
  for (CUpti_ActivityKind k : kKinds) cuptiActivityDisable(k);
}

}  // namespace

CuptiTracer::CuptiTracer(Recorder& rec, int64_t offset_ns, int64_t uncertainty_ns)
    : mapper_(rec, offset_ns), offset_uncertainty_ns_(uncertainty_ns) {}

std::unique_ptr<CuptiTracer> CuptiTracer::start(Recorder& rec) {
  int devices = 0;
  const cudaError_t ce = cudaGetDeviceCount(&devices);
  if (ce != cudaSuccess || devices == 0) {
    std::string why = ce != cudaSuccess
                          ? std::string(cudaGetErrorName(ce)) + " (" + cudaGetErrorString(ce) + ")"
                          : "no CUDA device visible";
    if (ce == cudaErrorInsufficientDriver) {
      why += "; no NVIDIA driver is installed, or it is older than this CUDA runtime";
    }
    cudaGetLastError();
    throw InternalError("CUPTI tracing needs a CUDA device: " + why);
  }
  {
    std::lock_guard lock(g_mu);
    if (g_active != nullptr) throw InternalError("CUPTI tracing: a tracer is already running");
  }

  // Clock offset, measured before any record is taken (see the header).
  int64_t best_bracket = INT64_MAX, offset = 0;
  for (int i = 0; i < 16; ++i) {
    uint64_t c = 0;
    const int64_t t0 = steady_now_ns();
    const CUptiResult r = cuptiGetTimestamp(&c);
    const int64_t t1 = steady_now_ns();
    if (r != CUPTI_SUCCESS) throw InternalError("cuptiGetTimestamp: " + cupti_error(r));
    if (t1 - t0 < best_bracket) {
      best_bracket = t1 - t0;
      offset = t0 + (t1 - t0) / 2 - static_cast<int64_t>(c);
    }
  }

  std::unique_ptr<CuptiTracer> t(new CuptiTracer(rec, offset, best_bracket / 2));
  CUptiResult r = cuptiActivityRegisterCallbacks(&buffer_requested, &buffer_completed);
  if (r != CUPTI_SUCCESS) throw InternalError("cuptiActivityRegisterCallbacks: " + cupti_error(r));
  {
    std::lock_guard lock(g_mu);
    g_active = t.get();
  }
  for (CUpti_ActivityKind k : kKinds) {
    r = cuptiActivityEnable(k);
    if (r != CUPTI_SUCCESS) {
      disable_all();
      {
        std::lock_guard lock(g_mu);
        g_active = nullptr;
      }
      throw InternalError("cuptiActivityEnable(kind " + std::to_string(static_cast<int>(k)) +
                          "): " + cupti_error(r));
    }
  }
  // A CUPTI that refuses one of these only keeps its records (overhead, not a wrong trace).
  for (CUpti_CallbackId id : kQuietRuntimeApis) cuptiActivityEnableRuntimeApi(id, 0);
  for (CUpti_CallbackId id : kQuietDriverApis) cuptiActivityEnableDriverApi(id, 0);
  set_range_hooks(&kHooks);
  return t;
}

CuptiTracer::~CuptiTracer() {
  set_range_hooks(nullptr);
  disable_all();
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  {
    std::lock_guard lock(g_mu);
    if (g_active == this) g_active = nullptr;
  }
  mapper_.flush();
}

void CuptiTracer::flush() {
  const CUptiResult r = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (r != CUPTI_SUCCESS) throw InternalError("cuptiActivityFlushAll: " + cupti_error(r));
  mapper_.flush();
}

uint64_t CuptiTracer::dropped_records() const { return g_dropped.load(); }

}  // namespace orrery::profiler
