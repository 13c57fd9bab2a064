// NcclCommunicator: the Communicator over NCCL, one GPU per rank (see nccl_comm.hpp).
//
// All NCCL communicators of a process share one NcclEngine per device: one non-blocking CUDA
// stream for every NCCL operation (so operations run in issue order over all communicators, the
// contract of comm.hpp and NCCL's own rule for several communicators on one stream), the pending
// operations, and a watchdog thread.
//
// NCCL runs in non-blocking mode (ncclConfig_t::blocking = 0): initialisation, splits, finalize and
// each enqueue return at once, possibly with ncclInProgress, and the caller polls
// ncclCommGetAsyncError with a deadline. So a peer that never arrives, or an NCCL failure, ends in an
// exception naming the cause instead of a hang. The watchdog thread, every kWatchdogPeriod:
//  - resolves the completed operations: their start/end events become span times and
//    flight-recorder states (off the issuing thread's path);
//  - polls ncclCommGetAsyncError of every communicator;
//  - fails the engine when an NCCL async error shows up or the oldest pending operation is older
//    than WorldOptions::watchdog_s: it dumps the flight recorder, calls ncclCommAbort on every
//    communicator (which ends the NCCL kernels, so nothing waits on them forever) and every later
//    call (issue, wait, synchronize) throws InternalError with the reason.
//
// Time mapping: CUDA events only give differences (cudaEventElapsedTime, float milliseconds), so the
// engine keeps an anchor event whose steady-clock time is known: recorded on the idle comm stream,
// synchronised at once, and dated at the midpoint of the host clock reads around record and sync
// (error: half that interval, a few microseconds). An event's time is anchor_ns + elapsed(anchor,
// event). The anchor is re-taken in synchronize() when older than kReanchorAfterNs, which bounds
// both the float rounding of long intervals and the GPU/host clock drift.
#include "orrery/runtime/cuda/nccl_comm.hpp"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/model/names.hpp"
#include "orrery/profiler/flight_recorder.hpp"
#include "orrery/profiler/range_hooks.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/cuda/device.hpp"

namespace orrery::runtime::cuda {
namespace {

using traces::CollOp;
using traces::CommKind;

constexpr auto kWatchdogPeriod = std::chrono::milliseconds(20);
constexpr int64_t kReanchorAfterNs = 1'000'000'000;

std::string nccl_error_text(ncclResult_t rc, ncclComm_t comm) {
  std::string s =
      std::string(ncclGetErrorString(rc)) + " (ncclResult_t " + std::to_string(rc) + ")";
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') s += ": " + std::string(last);
  return s;
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::U8:
      return ncclUint8;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
      return ncclFloat16;
  }
  throw InternalError("NCCL communicator: unknown dtype " + std::to_string(static_cast<int>(t)));
}

ncclRedOp_t nccl_op(ReduceOp op, DType t) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      // As the MPI communicator: an average of integers is not what anyone means.
      if (t != DType::F32 && t != DType::F64) {
        throw InternalError("NCCL communicator: ReduceOp::Avg needs a floating-point dtype");
      }
      return ncclAvg;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  throw InternalError("NCCL communicator: unknown reduce op");
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  return c;
}

// Polls a non-blocking NCCL call's state until it leaves ncclInProgress or `deadline` passes
// (returns ncclInProgress then). `rc` is what the call returned.
ncclResult_t settle(ncclComm_t comm, ncclResult_t rc,
                    std::chrono::steady_clock::time_point deadline) {
  int polls = 0;
  while (rc == ncclInProgress) {
    if (std::chrono::steady_clock::now() > deadline) return ncclInProgress;
    if (++polls > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    if (q != ncclSuccess) return q;
    rc = state;
  }
  return rc;
}

std::chrono::steady_clock::time_point deadline_after(double s) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(s));
}

// One issued operation.
struct Op {
  std::string what;  // "all_reduce seq 3 on world (4096 bytes)"
  cudaEvent_t start = nullptr;
  cudaEvent_t end = nullptr;
  int64_t issued_ns = 0;
  bool record = false;
  traces::Span span;
  uint64_t flight_id = 0;
  bool started = false;  // flight recorder told
  std::atomic<bool> complete{false};

  ~Op() {
    // Destroying an event whose work is pending is allowed (released once it completes).
    if (start) cudaEventDestroy(start);
    if (end) cudaEventDestroy(end);
  }
};

// The process's NCCL state on one device (shared by its communicators; see the top of the file).
class NcclEngine {
 public:
  NcclEngine(int device, double watchdog_s) : device_(device), watchdog_s_(watchdog_s) {
    ORRERY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ORRERY_CUDA_CHECK(cudaEventCreateWithFlags(&fence_, cudaEventDisableTiming));
    ORRERY_CUDA_CHECK(cudaEventCreate(&anchor_));
    {
      std::lock_guard lock(mu_);
      take_anchor_locked();
    }
    thread_ = std::thread([this] { watchdog_loop(); });
  }

  ~NcclEngine() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    {
      std::lock_guard lock(mu_);
      resolve_locked(/*all=*/true);
    }
    cudaEventDestroy(anchor_);
    cudaEventDestroy(fence_);
    cudaStreamDestroy(stream_);
  }

  // The engine of `device` for this process (created on first use, dropped with its last user).
  static std::shared_ptr<NcclEngine> for_device(int device, double watchdog_s) {
    static std::mutex registry_mu;
    static std::map<int, std::weak_ptr<NcclEngine>> registry;
    std::lock_guard lock(registry_mu);
    if (auto e = registry[device].lock()) return e;
    auto e = std::make_shared<NcclEngine>(device, watchdog_s);
    registry[device] = e;
    return e;
  }

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  int64_t clock_error_ns() const { return clock_error_ns_.load(std::memory_order_relaxed); }
  double watchdog_s() const { return watchdog_s_; }
  profiler::Recorder* recorder() const { return recorder_.load(std::memory_order_acquire); }
  void set_recorder(profiler::Recorder* r) { recorder_.store(r, std::memory_order_release); }

  void add_comm(ncclComm_t c) {
    std::lock_guard lock(mu_);
    comms_.push_back(c);
  }

  // Finalizes and destroys `c` (or aborts it after a failure, or when finalize does not settle).
  void remove_comm(ncclComm_t c) {
    std::lock_guard lock(mu_);
    auto it = std::find(comms_.begin(), comms_.end(), c);
    if (it == comms_.end()) return;  // already aborted with the engine
    comms_.erase(it);
    if (failure_.empty()) {
      ncclResult_t rc = settle(c, ncclCommFinalize(c), deadline_after(std::min(watchdog_s_, 30.0)));
      if (rc == ncclSuccess) {
        ncclCommDestroy(c);
        return;
      }
    }
    ncclCommAbort(c);
  }

  // Enqueues one operation: the comm stream waits for `compute` as of now, then `launch` runs the
  // NCCL call(s) on the comm stream between the op's start and end events. With `tag`, the call is
  // bracketed by a collective annotation (range_hooks.hpp); when a tracer took it and NCCL launched
  // on this thread (the call did not return ncclInProgress), the tracer's kernel span counts the
  // operation and op->span is recorded as kind Other.
  void issue(const std::shared_ptr<Op>& op, cudaStream_t compute, cudaEvent_t ready,
             ncclComm_t comm, const std::function<ncclResult_t(cudaStream_t)>& launch,
             const profiler::CollectiveAnnotation* tag) {
    std::lock_guard lock(mu_);
    throw_if_failed_locked();
    ORRERY_CUDA_CHECK(cudaSetDevice(device_));
    ORRERY_CUDA_CHECK(cudaEventCreate(&op->start));
    ORRERY_CUDA_CHECK(cudaEventCreate(&op->end));
    ORRERY_CUDA_CHECK(cudaEventRecord(ready, compute));
    ORRERY_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    ORRERY_CUDA_CHECK(cudaEventRecord(op->start, stream_));
    const bool tagged = tag != nullptr && profiler::begin_collective_annotation(*tag);
    const ncclResult_t launched = launch(stream_);
    if (tagged) profiler::end_collective_annotation();
    if (tagged && launched == ncclSuccess) op->span.kind = traces::SpanKind::Other;
    const ncclResult_t rc = settle(comm, launched, deadline_after(watchdog_s_));
    if (rc != ncclSuccess) {
      const std::string msg =
          op->what + ": " +
          (rc == ncclInProgress ? "NCCL did not accept the operation within " +
                                      std::to_string(watchdog_s_) + " s (runtime.watchdog_s)"
                                : nccl_error_text(rc, comm));
      fail_locked(msg);
      throw InternalError(msg);
    }
    ORRERY_CUDA_CHECK(cudaEventRecord(op->end, stream_));
    op->issued_ns = profiler::steady_now_ns();
    pending_.push_back(op);
  }

  // Runs `fn` (an NCCL setup call that settles itself) under the engine lock, on the device.
  ncclResult_t call(const std::function<ncclResult_t()>& fn) {
    std::lock_guard lock(mu_);
    throw_if_failed_locked();
    ORRERY_CUDA_CHECK(cudaSetDevice(device_));
    return fn();
  }

  // Why the engine failed ("" while it has not).
  std::string failure() const {
    std::lock_guard lock(mu_);
    return failure_;
  }

  void throw_if_failed() const {
    std::lock_guard lock(mu_);
    throw_if_failed_locked();
  }

  // Blocks until everything issued on the comm stream so far is complete, or throws (failure,
  // timeout). Resolves the spans and, when the anchor is old and the stream idle, re-anchors.
  void synchronize(const std::string& what) {
    {
      std::lock_guard lock(mu_);
      throw_if_failed_locked();
      ORRERY_CUDA_CHECK(cudaSetDevice(device_));
      ORRERY_CUDA_CHECK(cudaEventRecord(fence_, stream_));
    }
    const auto deadline = deadline_after(watchdog_s_);
    for (int polls = 0;; ++polls) {
      {
        std::lock_guard lock(mu_);
        throw_if_failed_locked();
        const cudaError_t q = cudaEventQuery(fence_);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) {
          const std::string msg =
              what + ": " + cudaGetErrorName(q) + " (" + cudaGetErrorString(q) + ")";
          fail_locked(msg);
          throw InternalError(msg);
        }
        if (std::chrono::steady_clock::now() > deadline) {
          const std::string msg = "watchdog: " + what + " not complete after " +
                                  std::to_string(watchdog_s_) + " s (runtime.watchdog_s); " +
                                  oldest_pending_locked();
          fail_locked(msg);
          throw InternalError(msg);
        }
      }
      if (polls > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    std::lock_guard lock(mu_);
    resolve_locked(false);
    if (profiler::steady_now_ns() - anchor_taken_ns_ > kReanchorAfterNs &&
        cudaStreamQuery(stream_) == cudaSuccess && pending_.empty()) {
      take_anchor_locked();
    }
  }

  // Aborts every communicator at once (Communicator::abort and fatal errors).
  void abort_all(const std::string& why) {
    std::lock_guard lock(mu_);
    fail_locked(why);
  }

 private:
  void throw_if_failed_locked() const {
    if (!failure_.empty()) throw InternalError("NCCL communicator failed earlier: " + failure_);
  }

  std::string oldest_pending_locked() const {
    for (const auto& op : pending_) {
      if (!op->complete) {
        return "oldest pending: " + op->what +
               "; a rank is missing from this operation or issued operations in another order";
      }
    }
    return "no NCCL operation pending (the compute stream did not reach the issue point)";
  }

  // Records the failure, dumps the flight records and aborts every NCCL communicator.
  void fail_locked(const std::string& why) {
    if (!failure_.empty()) return;
    failure_ = why;
    profiler::FlightRecorder::instance().dump(why, true);
    for (ncclComm_t c : comms_) ncclCommAbort(c);
    comms_.clear();
  }

  void take_anchor_locked() {
    const int64_t t0 = profiler::steady_now_ns();
    ORRERY_CUDA_CHECK(cudaEventRecord(anchor_, stream_));
    ORRERY_CUDA_CHECK(cudaEventSynchronize(anchor_));
    const int64_t t1 = profiler::steady_now_ns();
    anchor_ns_ = t0 + (t1 - t0) / 2;
    anchor_taken_ns_ = t1;
    // The anchor is dated to the middle of [t0, t1]: every span time it maps is off by at most half
    // that interval (a driver call in a sandbox can take far longer than on bare metal).
    clock_error_ns_.store(std::max(clock_error_ns_.load(std::memory_order_relaxed), (t1 - t0) / 2),
                          std::memory_order_relaxed);
  }

  // The steady-clock time of a completed event (-1 when it cannot be dated).
  int64_t event_ns_locked(cudaEvent_t e) const {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, anchor_, e) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    return anchor_ns_ + static_cast<int64_t>(static_cast<double>(ms) * 1e6);
  }

  // Turns completed pending operations into spans and flight-recorder states, in issue order (the
  // stream runs them in that order, so the first incomplete one ends the scan). With `all`, drops
  // the incomplete ones too (engine teardown).
  void resolve_locked(bool all) {
    auto& fr = profiler::FlightRecorder::instance();
    while (!pending_.empty()) {
      const std::shared_ptr<Op>& op = pending_.front();
      const cudaError_t q = cudaEventQuery(op->end);
      if (q == cudaErrorNotReady) {
        if (!op->started && op->flight_id && cudaEventQuery(op->start) == cudaSuccess) {
          op->started = true;
          const int64_t s = event_ns_locked(op->start);
          fr.started(op->flight_id, s >= 0 ? s : profiler::steady_now_ns());
        }
        if (!all) return;
        pending_.pop_front();
        continue;
      }
      if (q != cudaSuccess) {
        cudaGetLastError();
        if (!all) {
          fail_locked(op->what + ": " + cudaGetErrorName(q) + " (" + cudaGetErrorString(q) + ")");
          return;
        }
        pending_.pop_front();
        continue;
      }
      const int64_t start_ns = event_ns_locked(op->start);
      const int64_t end_ns = event_ns_locked(op->end);
      op->complete = true;
      if (op->flight_id) {
        if (!op->started) fr.started(op->flight_id, start_ns >= 0 ? start_ns : end_ns);
        fr.completed(op->flight_id, end_ns >= 0 ? end_ns : profiler::steady_now_ns());
      }
      if (op->record && start_ns >= 0 && end_ns >= start_ns) {
        if (auto* rec = recorder(); rec && rec->enabled()) {
          op->span.start_ns = start_ns;
          op->span.end_ns = end_ns;
          rec->record(op->span);
        }
      }
      pending_.pop_front();
    }
  }

  void watchdog_loop() {
    cudaSetDevice(device_);
    std::unique_lock lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, kWatchdogPeriod, [&] { return stop_; });
      if (stop_ || !failure_.empty()) continue;
      resolve_locked(false);
      if (!failure_.empty()) continue;
      for (ncclComm_t c : comms_) {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t q = ncclCommGetAsyncError(c, &state);
        const ncclResult_t bad = q != ncclSuccess ? q : state;
        if (bad != ncclSuccess && bad != ncclInProgress) {
          fail_locked("NCCL asynchronous error (ncclCommGetAsyncError): " +
                      nccl_error_text(bad, c));
          break;
        }
      }
      if (!failure_.empty() || pending_.empty()) continue;
      const auto& oldest = pending_.front();
      const double age_s =
          static_cast<double>(profiler::steady_now_ns() - oldest->issued_ns) * 1e-9;
      if (age_s > watchdog_s_) {
        std::ostringstream msg;
        msg << "watchdog: " << oldest->what << " not complete after " << watchdog_s_
            << " s (runtime.watchdog_s); a rank is missing from this operation or issued "
               "operations in another order; NCCL communicators aborted";
        fail_locked(msg.str());
      }
    }
  }

  const int device_;
  const double watchdog_s_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t fence_ = nullptr;
  cudaEvent_t anchor_ = nullptr;
  int64_t anchor_ns_ = 0;
  int64_t anchor_taken_ns_ = 0;
  std::atomic<int64_t> clock_error_ns_{0};  // the largest half-interval of any anchor taken
  std::atomic<profiler::Recorder*> recorder_{nullptr};

  mutable std::mutex mu_;  // guards everything below and serialises NCCL calls
  std::condition_variable cv_;
  std::vector<ncclComm_t> comms_;
  std::deque<std::shared_ptr<Op>> pending_;
  std::string failure_;
  bool stop_ = false;
  std::thread thread_;
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclEngine> engine, std::shared_ptr<Op> op, cudaStream_t compute)
      : engine_(std::move(engine)), op_(std::move(op)), compute_(compute) {}

  // Orders the compute stream after the operation; the host does not block.
  void wait() override {
    engine_->throw_if_failed();
    ORRERY_CUDA_CHECK(cudaStreamWaitEvent(compute_, op_->end, 0));
  }
  bool done() const override {
    if (!engine_->failure().empty()) return true;  // wait() reports it
    return cudaEventQuery(op_->end) != cudaErrorNotReady;
  }

 private:
  std::shared_ptr<NcclEngine> engine_;
  std::shared_ptr<Op> op_;
  cudaStream_t compute_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclEngine> engine, ncclComm_t comm, Communicator& bootstrap,
                   cudaStream_t compute, traces::CommunicatorInfo info, int world_size)
      : engine_(std::move(engine)),
        comm_(comm),
        bootstrap_(bootstrap),
        compute_(compute),
        info_(std::move(info)),
        world_size_(world_size) {
    ORRERY_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    int r = 0, n = 0;
    ncclResult_t rc = ncclCommUserRank(comm_, &r);
    if (rc == ncclSuccess) rc = ncclCommCount(comm_, &n);
    if (rc != ncclSuccess) {
      cudaEventDestroy(ready_);
      throw InternalError("NCCL communicator " + info_.name + ": " + nccl_error_text(rc, comm_));
    }
    rank_ = r;
    size_ = n;
    engine_->add_comm(comm_);
  }

  ~NcclCommunicator() override {
    try {
      if (engine_->failure().empty())
        engine_->synchronize("destroying NCCL communicator " + info_.name);
    } catch (...) {
      // Torn down after a failure: the communicator is aborted below.
    }
    engine_->remove_comm(comm_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (counts_ != nullptr) cudaFree(counts_);
    cudaEventDestroy(ready_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const traces::CommunicatorInfo& info() const override { return info_; }

  Handle all_reduce(void* data, size_t count, DType dtype, ReduceOp op,
                    const OpLabel& label) override {
    const ncclDataType_t t = nccl_type(dtype);
    const ncclRedOp_t o = nccl_op(op, dtype);
    ncclComm_t c = comm_;
    return issue(CollOp::AllReduce, label, count * dtype_size(dtype), -1, dtype,
                 [=](cudaStream_t s) { return ncclAllReduce(data, data, count, t, o, c, s); });
  }

  Handle reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op,
                        const OpLabel& label) override {
    const ncclDataType_t t = nccl_type(dtype);
    const ncclRedOp_t o = nccl_op(op, dtype);
    ncclComm_t c = comm_;
    return issue(
        CollOp::ReduceScatter, label, recv_count * size_ * dtype_size(dtype), -1, dtype,
        [=](cudaStream_t s) { return ncclReduceScatter(send, recv, recv_count, t, o, c, s); });
  }

  Handle all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                    const OpLabel& label) override {
    const ncclDataType_t t = nccl_type(dtype);
    ncclComm_t c = comm_;
    // NCCL treats send == recv + rank*send_count as in place, the same convention as comm.hpp.
    return issue(CollOp::AllGather, label, send_count * size_ * dtype_size(dtype), -1, dtype,
                 [=](cudaStream_t s) { return ncclAllGather(send, recv, send_count, t, c, s); });
  }

  Handle broadcast(void* data, size_t count, DType dtype, int root, const OpLabel& label) override {
    check_peer(root);
    const ncclDataType_t t = nccl_type(dtype);
    ncclComm_t c = comm_;
    return issue(CollOp::Broadcast, label, count * dtype_size(dtype), global_rank(root), dtype,
                 [=](cudaStream_t s) { return ncclBroadcast(data, data, count, t, root, c, s); });
  }

  Handle send(const void* data, size_t count, DType dtype, int peer,
              const OpLabel& label) override {
    check_peer(peer);
    const ncclDataType_t t = nccl_type(dtype);
    ncclComm_t c = comm_;
    return issue(CollOp::Send, label, count * dtype_size(dtype), global_rank(peer), dtype,
                 [=](cudaStream_t s) { return ncclSend(data, count, t, peer, c, s); });
  }

  Handle recv(void* data, size_t count, DType dtype, int peer, const OpLabel& label) override {
    check_peer(peer);
    const ncclDataType_t t = nccl_type(dtype);
    ncclComm_t c = comm_;
    return issue(CollOp::Recv, label, count * dtype_size(dtype), global_rank(peer), dtype,
                 [=](cudaStream_t s) { return ncclRecv(data, count, t, peer, c, s); });
  }

  // Counts first, then the data (comm.hpp). The receive layout depends on the counts, so the host
  // waits for their exchange (bounded by the watchdog); the data's NCCL group is queued as any
  // operation and is this call's one AllToAll span.
  Handle all_to_all_v(const void* send, const int64_t* send_counts, std::size_t groups, void* recv,
                      int64_t* recv_counts, std::size_t recv_capacity, DType dtype,
                      const OpLabel& label) override {
    const std::string what = "all_to_all_v on " + info_.name;
    const auto peers = static_cast<std::size_t>(size_);
    exchange_counts(send_counts, recv_counts, groups, what);
    const AllToAllPlan plan =
        all_to_all_plan(send_counts, recv_counts, peers, groups, recv_capacity, what);
    const ncclDataType_t t = nccl_type(dtype);
    const std::size_t es = dtype_size(dtype);
    ncclComm_t c = comm_;
    return issue(CollOp::AllToAll, label, static_cast<size_t>(plan.sent) * es, -1, dtype,
                 [=](cudaStream_t s) {
                   const auto* from = static_cast<const char*>(send);
                   auto* to = static_cast<char*>(recv);
                   return nccl_group(peers, [&](std::size_t p, ncclResult_t& rc) {
                     const int q = static_cast<int>(p);
                     if (ok(rc) && plan.send_count[p] > 0) {
                       rc = ncclSend(from + plan.send_offset[p] * es,
                                     static_cast<size_t>(plan.send_count[p]), t, q, c, s);
                     }
                     if (ok(rc) && plan.recv_count[p] > 0) {
                       rc = ncclRecv(to + plan.recv_offset[p] * es,
                                     static_cast<size_t>(plan.recv_count[p]), t, q, c, s);
                     }
                   });
                 });
  }

  // NCCL has no barrier: a one-element all-reduce on a scratch device word.
  Handle barrier(const OpLabel& label) override {
    if (scratch_ == nullptr) {
      ORRERY_CUDA_CHECK(cudaSetDevice(engine_->device()));
      cuda_check(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc (NCCL barrier word)",
                 sizeof(float));
      ORRERY_CUDA_CHECK(cudaMemsetAsync(scratch_, 0, sizeof(float), compute_));
    }
    void* w = scratch_;
    ncclComm_t c = comm_;
    return issue(CollOp::Barrier, label, 0, -1, DType::F32, [=](cudaStream_t s) {
      return ncclAllReduce(w, w, 1, ncclFloat32, ncclSum, c, s);
    });
  }

  void synchronize() override { engine_->synchronize("synchronize on " + info_.name); }

  std::unique_ptr<Communicator> split(int color, int key, CommKind kind,
                                      const std::string& name) override {
    const int ordinal = ++splits_;
    // Everyone's (color, key, global rank), gathered over this communicator, gives the members in
    // NCCL's order (key, then parent rank), which ncclCommSplit does not report.
    std::vector<int32_t> mine = {color < 0 ? -1 : color, key, global_rank(rank_)};
    std::vector<int32_t> all(3 * static_cast<size_t>(size_));
    int32_t* dev = nullptr;
    ORRERY_CUDA_CHECK(cudaSetDevice(engine_->device()));
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&dev), all.size() * sizeof(int32_t)),
               "cudaMalloc (NCCL split table)", all.size() * sizeof(int32_t));
    struct Free {
      int32_t* p;
      ~Free() { cudaFree(p); }
    } free_dev{dev};
    // On the compute stream, which the gather waits for (a plain cudaMemcpy runs on the legacy
    // stream, which our non-blocking streams do not wait for).
    ORRERY_CUDA_CHECK(cudaMemcpyAsync(dev + 3 * rank_, mine.data(), 3 * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, compute_));
    all_gather(dev + 3 * rank_, dev, 3, DType::I32, OpLabel{"split"}).wait();
    synchronize();
    ORRERY_CUDA_CHECK(
        cudaMemcpy(all.data(), dev, all.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));

    ncclComm_t out = nullptr;
    ncclConfig_t config = nonblocking_config();
    ncclComm_t parent = comm_;
    const int nccl_color = color < 0 ? NCCL_SPLIT_NOCOLOR : color;
    const auto deadline = deadline_after(engine_->watchdog_s());
    // Non-blocking split: the new communicator (or, for a rank left out, the parent) settles.
    const ncclResult_t settled = engine_->call([&] {
      const ncclResult_t rc = ncclCommSplit(parent, nccl_color, key, &out, &config);
      return settle(out != nullptr ? out : parent, rc, deadline);
    });
    if (settled != ncclSuccess) {
      if (out != nullptr) ncclCommAbort(out);
      const std::string msg = "ncclCommSplit of " + info_.name + " into " + name + " failed: " +
                              (settled == ncclInProgress
                                   ? "not complete after " + std::to_string(engine_->watchdog_s()) +
                                         " s (runtime.watchdog_s)"
                                   : nccl_error_text(settled, parent));
      engine_->abort_all(msg);
      throw InternalError(msg);
    }
    if (color < 0 || out == nullptr) {
      if (out != nullptr) ncclCommDestroy(out);
      return nullptr;
    }

    struct Member {
      int key, parent_rank, global;
    };
    std::vector<Member> members;
    for (int r = 0; r < size_; ++r) {
      const auto* e = &all[3 * static_cast<size_t>(r)];
      if (e[0] == color) members.push_back({e[1], r, e[2]});
    }
    std::stable_sort(members.begin(), members.end(), [](const Member& a, const Member& b) {
      return a.key != b.key ? a.key < b.key : a.parent_rank < b.parent_rank;
    });
    traces::CommunicatorInfo info;
    int min_rank = INT_MAX;
    for (const auto& m : members) {
      info.ranks.push_back(m.global);
      min_rank = std::min(min_rank, m.global);
    }
    // The MPI communicator's id scheme: the same on every member, distinct between groups.
    const int64_t id = (static_cast<int64_t>(info_.id) * 97 + ordinal) * world_size_ + min_rank;
    if (id > INT32_MAX) {
      ncclCommAbort(out);
      throw InternalError("communicator ids exhausted (splits nested too deep)");
    }
    info.id = static_cast<int32_t>(id);
    info.kind = kind;
    info.name = name;
    auto c = std::make_unique<NcclCommunicator>(engine_, out, bootstrap_, compute_, std::move(info),
                                                world_size_);
    if (static_cast<size_t>(c->size()) != c->info().ranks.size() ||
        c->info().ranks.at(static_cast<size_t>(c->rank())) != global_rank(rank_)) {
      throw InternalError("ncclCommSplit of " + info_.name + " into " + name +
                          ": NCCL's rank order differs from (key, parent rank)");
    }
    if (auto* rec = engine_->recorder()) rec->add_communicator(c->info());
    return c;
  }

  int64_t clock_error_ns() const { return engine_->clock_error_ns(); }

  void set_recorder(profiler::Recorder* rec) override {
    engine_->set_recorder(rec);
    if (rec) {
      rec->add_communicator(info_);
    }
  }

  [[noreturn]] void abort(int code) override {
    try {
      engine_->abort_all("abort(" + std::to_string(code) + ") called on " + info_.name);
    } catch (...) {
    }
    bootstrap_.abort(code);
    std::_Exit(code);  // not reached (abort is [[noreturn]]), but the override must not return
  }

 private:
  void check_peer(int peer) const {
    if (peer < 0 || peer >= size_) {
      throw InternalError("NCCL communicator " + info_.name + ": peer " + std::to_string(peer) +
                          " out of range for " + std::to_string(size_) + " ranks");
    }
  }

  static bool ok(ncclResult_t rc) { return rc == ncclSuccess || rc == ncclInProgress; }

  // One NCCL group of `peers` calls of `each(peer, rc)` (which leaves rc unchanged on success); the
  // first failure's code, else ncclGroupEnd's (ncclInProgress on a non-blocking communicator).
  template <class Each>
  static ncclResult_t nccl_group(std::size_t peers, Each each) {
    ncclResult_t rc = ncclGroupStart();
    if (!ok(rc)) return rc;
    rc = ncclSuccess;
    for (std::size_t p = 0; p < peers; ++p) each(p, rc);
    const ncclResult_t end = ncclGroupEnd();
    return ok(rc) ? end : rc;
  }

  // all_to_all_v's counts: recv_counts[p·groups + g] = peer p's send_counts[rank·groups + g], by a
  // send and a receive of `groups` int64 per peer in one NCCL group on the comm stream (through a
  // device table), waited for on the host. Not an operation of its own in the trace (under the
  // CUPTI tracer its kernel, launched without an annotation, is a span of kind Other).
  void exchange_counts(const int64_t* send_counts, int64_t* recv_counts, std::size_t groups,
                       const std::string& what) {
    const std::size_t n = static_cast<std::size_t>(size_) * groups;
    if (n == 0) return;
    ORRERY_CUDA_CHECK(cudaSetDevice(engine_->device()));
    if (counts_elems_ < 2 * n) {
      if (counts_ != nullptr) cudaFree(counts_);
      counts_ = nullptr;
      cuda_check(cudaMalloc(reinterpret_cast<void**>(&counts_), 2 * n * sizeof(int64_t)),
                 "cudaMalloc (NCCL all-to-all counts)", 2 * n * sizeof(int64_t));
      counts_elems_ = 2 * n;
    }
    int64_t* sd = counts_;
    int64_t* rd = counts_ + n;
    ncclComm_t c = comm_;
    const auto deadline = deadline_after(engine_->watchdog_s());
    const ncclResult_t rc = engine_->call([&] {
      ORRERY_CUDA_CHECK(cudaMemcpyAsync(sd, send_counts, n * sizeof(int64_t),
                                        cudaMemcpyHostToDevice, engine_->stream()));
      const ncclResult_t launched =
          nccl_group(std::size_t(size_), [&](std::size_t p, ncclResult_t& r) {
            const int q = static_cast<int>(p);
            if (ok(r)) r = ncclSend(sd + p * groups, groups, ncclInt64, q, c, engine_->stream());
            if (ok(r)) r = ncclRecv(rd + p * groups, groups, ncclInt64, q, c, engine_->stream());
          });
      return settle(c, launched, deadline);
    });
    if (rc != ncclSuccess) {
      const std::string msg = what + ": the counts' exchange " +
                              (rc == ncclInProgress ? "was not accepted within " +
                                                          std::to_string(engine_->watchdog_s()) +
                                                          " s (runtime.watchdog_s)"
                                                    : "failed: " + nccl_error_text(rc, c));
      engine_->abort_all(msg);
      throw InternalError(msg);
    }
    engine_->synchronize(what + " (the counts' exchange)");
    ORRERY_CUDA_CHECK(cudaMemcpy(recv_counts, rd, n * sizeof(int64_t), cudaMemcpyDeviceToHost));
  }

  Handle issue(CollOp op, const OpLabel& label, size_t bytes, int peer_global, DType dtype,
               const std::function<ncclResult_t(cudaStream_t)>& launch) {
    auto o = std::make_shared<Op>();
    const int64_t seq = seq_++;
    o->what = std::string(traces::to_string(op)) + " seq " + std::to_string(seq) + " on " +
              info_.name + " (" + std::to_string(bytes) + " bytes, NCCL)";
    o->flight_id = schedule_flight_record(info_.id, seq, op, bytes, static_cast<int32_t>(dtype),
                                          peer_global, label.step);
    profiler::Recorder* rec = engine_->recorder();
    if (rec && rec->enabled()) {
      o->record = true;
      const int32_t stream = comm_stream_of(info_.kind, op);
      rec->ensure_stream(stream, model::names::stream_name(stream));
      o->span = comm_op_span(*rec, stream, op, label, bytes, info_.id, peer_global, seq);
    }
    // The operation's identity for the tracer's NCCL kernel span (range_hooks.hpp). Not on one
    // rank: NCCL launches no kernel for an in-place operation there, so this span counts it.
    profiler::CollectiveAnnotation tag;
    tag.kind = (op == CollOp::Send || op == CollOp::Recv) ? traces::SpanKind::P2P
                                                          : traces::SpanKind::Collective;
    tag.op = op;
    tag.comm = info_.id;
    tag.seq = seq;
    tag.bytes = static_cast<int64_t>(bytes);
    tag.peer = peer_global;
    tag.step = label.step;
    tag.micro_batch = label.micro_batch;
    tag.layer = label.layer;
    engine_->issue(o, compute_, ready_, comm_, launch, size_ > 1 ? &tag : nullptr);
    return Handle(std::make_shared<NcclWork>(engine_, o, compute_));
  }

  std::shared_ptr<NcclEngine> engine_;
  ncclComm_t comm_;
  Communicator& bootstrap_;
  cudaStream_t compute_;
  traces::CommunicatorInfo info_;
  int world_size_;
  cudaEvent_t ready_ = nullptr;  // compute stream's position at issue (reused: waits capture it)
  void* scratch_ = nullptr;      // barrier word
  int64_t* counts_ = nullptr;    // all_to_all_v's counts: (2, size·groups) send | receive
  std::size_t counts_elems_ = 0;
  int rank_ = 0;
  int size_ = 1;
  int64_t seq_ = 0;
  int splits_ = 0;
};

// The per-rank status exchanged before NCCL starts, so every rank fails together with the reason.
struct BootStatus {
  int32_t ok = 1;
  char why[252] = {};
};

// "rank 0: why; rank 3: why" over the ranks whose status is not ok ("" when all are).
std::string describe_failures(const std::vector<BootStatus>& statuses, const Communicator& boot) {
  std::string out;
  for (size_t r = 0; r < statuses.size(); ++r) {
    const BootStatus& s = statuses[r];
    if (s.ok) continue;
    out += (out.empty() ? "" : "; ") + std::string("rank ") +
           std::to_string(boot.global_rank(static_cast<int>(r))) + ": " +
           std::string(s.why, strnlen(s.why, sizeof(s.why)));
  }
  return out;
}

}  // namespace

int64_t nccl_clock_error_ns(const Communicator& c) {
  const auto* n = dynamic_cast<const NcclCommunicator*>(&c);
  return n ? n->clock_error_ns() : -1;
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap,
                                                     cudaStream_t compute_stream,
                                                     const WorldOptions& opt) {
  const int n = bootstrap.size();
  const int me = bootstrap.rank();

  // 1. Local checks, then every rank learns every rank's status (no rank waits on a failed one).
  BootStatus status;
  int device = -1;
  ncclUniqueId id{};
  auto fail_local = [&](const std::string& why) {
    status.ok = 0;
    std::snprintf(status.why, sizeof(status.why), "%s", why.c_str());
  };
  if (std::string why = no_device_reason(); !why.empty()) {
    fail_local(why);
  } else if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    fail_local("cudaGetDevice failed: no current CUDA device");
  } else if (me == 0) {
    const ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) fail_local("ncclGetUniqueId: " + nccl_error_text(rc, nullptr));
  }
  std::vector<BootStatus> statuses(static_cast<size_t>(n));
  bootstrap
      .all_gather(&status, statuses.data(), sizeof(BootStatus), DType::U8,
                  OpLabel{"nccl_bootstrap"})
      .wait();
  std::string failures = describe_failures(statuses, bootstrap);
  if (!failures.empty()) throw InternalError("NCCL cannot start: " + failures);

  // 2. Rank 0's unique id to everyone, over the bootstrap in host memory.
  bootstrap.broadcast(&id, sizeof(id), DType::U8, 0, OpLabel{"nccl_unique_id"}).wait();

  // 3. Non-blocking init, settled with a deadline; then everyone learns whether all succeeded.
  auto engine = NcclEngine::for_device(device, opt.watchdog_s);
  ncclComm_t comm = nullptr;
  ncclConfig_t config = nonblocking_config();
  ncclResult_t rc = ncclCommInitRankConfig(&comm, n, id, me, &config);
  if (comm != nullptr) rc = settle(comm, rc, deadline_after(opt.watchdog_s));
  status = BootStatus{};
  if (rc != ncclSuccess) {
    std::string why = rc == ncclInProgress
                          ? "ncclCommInitRankConfig not complete after " +
                                std::to_string(opt.watchdog_s) + " s (runtime.watchdog_s)"
                          : "ncclCommInitRankConfig: " + nccl_error_text(rc, comm);
    if (rc == ncclInvalidUsage && n > 1) {
      why +=
          " (two ranks on one GPU? NCCL needs one GPU per rank; ranks sharing a GPU use the "
          "host-staged MPI communicator)";
    }
    fail_local(why);
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
  }
  bootstrap
      .all_gather(&status, statuses.data(), sizeof(BootStatus), DType::U8, OpLabel{"nccl_init"})
      .wait();
  failures = describe_failures(statuses, bootstrap);
  if (!failures.empty()) {
    if (comm != nullptr) ncclCommAbort(comm);
    throw InternalError("NCCL failed to start: " + failures);
  }
  int world_size = 0;
  for (int32_t r : bootstrap.info().ranks) world_size = std::max(world_size, r + 1);
  return std::make_unique<NcclCommunicator>(engine, comm, bootstrap, compute_stream,
                                            bootstrap.info(), world_size);
}

}  // namespace orrery::runtime::cuda
