// StagedCommunicator: a host communicator (MPI) for device buffers, staged through pinned host
// memory, for ranks that share one GPU (NCCL needs one GPU per rank). See nccl_comm.hpp.
//
// An operation goes through two threads of the process's StagedEngine:
//  issue (caller):  records `ready` on the compute stream; for an input, the device-to-host copy
//                   into a pinned buffer is queued on the D2H stream after `ready`;
//  stage 1 thread:  in issue order, waits for that copy, then issues the host operation on the
//                   pinned buffers (MPI's own thread runs it and records its span on the "comm"
//                   stream);
//  stage 2 thread:  completes operations in whatever order their host operations finish: once an
//                   operation's host part is done and the compute stream has passed its `ready`
//                   event (kernels issued before the operation are done with the buffer), it queues
//                   the copy back on the H2D stream and, when that is done, completes the operation.
// Two stages, so that an operation is issued to MPI before an earlier one completes: a rank's send
// and receive of an exchange are both posted, as the MPI communicator's are. Completion in any
// order, because an earlier send may wait for a receive that its peer posts only after this rank's
// later operation completes: under 1F1B a stage's activation send waits for the next stage's
// receive, which that stage posts after a collective (ZeRO 2/3's per-micro-batch embedding sum) that
// this stage joins only once its gradient receive, issued after the send, is complete. In-order
// completion deadlocked there; MPI completes them independently, and so does this. Two copy
// streams, so a copy back never queues behind a copy out that waits on the compute stream, and no
// copy back is queued before its `ready` has passed, so the H2D stream never waits on the compute
// stream (which may itself wait on another operation's copy back).
// Handle::wait() blocks the host until the copy back is done (as the MPI communicator's wait does),
// then orders the compute stream after it. Every wait has a deadline (the host operation has the MPI
// watchdog; the copies WorldOptions' default watchdog), so nothing hangs silently.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/runtime/cuda/device.hpp"
#include "orrery/runtime/cuda/nccl_comm.hpp"

namespace orrery::runtime::cuda {
namespace {

using traces::CommKind;

struct Pinned {
  void* ptr = nullptr;
  size_t capacity = 0;
};

// Reused pinned host buffers (cudaMallocHost costs milliseconds; the same sizes recur every step).
class PinnedPool {
 public:
  ~PinnedPool() {
    for (auto& [cap, p] : free_) cudaFreeHost(p);
  }
  Pinned acquire(size_t bytes) {
    if (bytes == 0) return {};
    {
      std::lock_guard lock(mu_);
      auto it = free_.lower_bound(bytes);
      if (it != free_.end() && it->first <= 2 * bytes + 4096) {
        Pinned p{it->second, it->first};
        free_.erase(it);
        return p;
      }
    }
    size_t cap = 4096;
    while (cap < bytes) cap *= 2;
    void* p = nullptr;
    cuda_check(cudaMallocHost(&p, cap), "cudaMallocHost (staging buffer)", cap);
    return {p, cap};
  }
  void release(Pinned p) {
    if (!p.ptr) return;
    std::lock_guard lock(mu_);
    free_.emplace(p.capacity, p.ptr);
  }

 private:
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
};

// Waits for a CUDA event by polling, with a deadline (a copy that never runs must not hang us).
void poll_event(cudaEvent_t e, double timeout_s, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  for (int polls = 0;; ++polls) {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) cuda_check(q, what.c_str());
    if (std::chrono::steady_clock::now() > deadline) {
      throw InternalError(
          "watchdog: " + what + " not complete after " + std::to_string(timeout_s) +
          " s (runtime.watchdog_s); the compute stream did not reach the operation");
    }
    if (polls > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

class StagedTask final : public Work {
 public:
  ~StagedTask() override {
    if (ready) cudaEventDestroy(ready);
    if (d2h_done) cudaEventDestroy(d2h_done);
    if (h2d_done) cudaEventDestroy(h2d_done);
  }

  // Set at issue.
  std::function<Handle(const OpLabel&)> host_op;
  std::string name;  // the label's name, owned (OpLabel holds a view)
  OpLabel label;
  std::string what;
  Pinned in, out;  // out.ptr may equal in.ptr (in-place operations)
  void* dev_out = nullptr;
  size_t out_bytes = 0;
  // When set, what to copy back, known once the host operation is done (all_to_all_v: what
  // arrived); out_bytes is then the capacity.
  std::function<size_t()> result_bytes;
  cudaEvent_t ready = nullptr;     // compute stream at issue
  cudaEvent_t d2h_done = nullptr;  // input staged (nullptr: no input)
  cudaEvent_t h2d_done = nullptr;  // result copied back (nullptr: no output)
  cudaStream_t compute = nullptr;
  double timeout_s = 300;
  Handle host;  // set by stage 1
  // A copy of this task's may still be queued when it fails (a copy that missed its deadline): its
  // pinned buffers are then never reused (leaked), so the copy cannot write into another task's.
  bool keep_buffers = false;

  void complete(std::exception_ptr err) { completion_.complete(std::move(err)); }

  void wait() override {
    // The stages have deadlines of their own; this one only guards against a lost completion.
    if (!completion_.wait_for(2 * timeout_s + 10)) {
      throw InternalError("watchdog: " + what +
                          " (staged through host memory) not complete after " +
                          std::to_string(2 * timeout_s + 10) + " s");
    }
    if (h2d_done)
      cuda_check(cudaStreamWaitEvent(compute, h2d_done, 0), "cudaStreamWaitEvent (staged)");
  }
  bool done() const override { return completion_.done(); }

 private:
  Completion completion_;
};

// A FIFO of tasks and the thread that serves it.
class TaskThread {
 public:
  void start(int device, std::function<void()> body) {
    thread_ = std::thread([device, body = std::move(body)] {
      cudaSetDevice(device);
      body();
    });
  }
  void stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void push(std::shared_ptr<StagedTask> t) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(t));
    }
    cv_.notify_one();
  }
  // Moves the queued tasks to the end of `out`: waits for one when `idle`, else at most `poll`.
  // False once stopping with nothing queued.
  bool take(std::vector<std::shared_ptr<StagedTask>>& out, bool idle,
            std::chrono::microseconds poll = std::chrono::microseconds(20)) {
    std::unique_lock lock(mu_);
    auto ready = [&] { return stop_ || !queue_.empty(); };
    if (idle) {
      cv_.wait(lock, ready);
    } else {
      cv_.wait_for(lock, poll, ready);
    }
    if (queue_.empty()) return !stop_;
    for (auto& t : queue_) out.push_back(std::move(t));
    queue_.clear();
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<StagedTask>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// Stage 1 (see the top of the file): `fn` on each task, in issue order.
class Stage {
 public:
  explicit Stage(std::function<void(const std::shared_ptr<StagedTask>&)> fn) : fn_(std::move(fn)) {}
  void start(int device) {
    thread_.start(device, [this] {
      std::vector<std::shared_ptr<StagedTask>> batch;
      for (;;) {
        batch.clear();
        if (!thread_.take(batch, /*idle=*/true)) return;  // stopping, drained
        for (const auto& t : batch) fn_(t);
      }
    });
  }
  void stop() { thread_.stop(); }
  void push(std::shared_ptr<StagedTask> t) { thread_.push(std::move(t)); }

 private:
  std::function<void(const std::shared_ptr<StagedTask>&)> fn_;
  TaskThread thread_;
};

// Stage 2 (see the top of the file): one thread polling every operation in flight.
class Completer {
 public:
  using Finish = std::function<void(const std::shared_ptr<StagedTask>&, std::exception_ptr)>;
  Completer(Finish finish, cudaStream_t h2d) : finish_(std::move(finish)), h2d_(h2d) {}
  void start(int device) {
    thread_.start(device, [this] { loop(); });
  }
  void stop() { thread_.stop(); }
  void push(std::shared_ptr<StagedTask> t) { thread_.push(std::move(t)); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Active {
    std::shared_ptr<StagedTask> t;
    Clock::time_point deadline;
    bool copying = false;  // the copy back is queued
  };

  void loop() {
    std::vector<Active> active;
    std::vector<std::shared_ptr<StagedTask>> incoming;
    for (;;) {
      incoming.clear();
      const bool more = thread_.take(incoming, /*idle=*/active.empty());
      if (!more && active.empty()) return;                                   // stopping, drained
      if (!more) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // stopping: no spin
      for (auto& t : incoming) {
        const auto limit = std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(t->timeout_s));
        active.push_back(Active{std::move(t), Clock::now() + limit, false});
      }
      for (std::size_t i = 0; i < active.size();) {
        if (advance(active[i])) {
          active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
      }
    }
  }

  // True when the event has completed; throws for a CUDA error.
  static bool reached(cudaEvent_t e, const char* what, const StagedTask& t) {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) cuda_check(q, (std::string(what) + t.what).c_str());  // throws
    return false;
  }

  // One step of `a`'s completion; true when it is finished (completed or failed).
  bool advance(Active& a) {
    StagedTask& t = *a.t;
    try {
      const bool late = Clock::now() > a.deadline;
      if (!a.copying) {
        if (!t.host.done()) {
          if (!late) return false;
          t.host.wait();  // past the deadline: the host communicator's watchdog says why (throws)
        }
        t.host.wait();  // done: returns at once, or rethrows the operation's error
        if (t.dev_out == nullptr) {
          finish_(a.t, nullptr);
          return true;
        }
        if (!reached(t.ready, "compute stream before ", t)) {
          if (late) {
            throw InternalError(
                "watchdog: " + t.what + " not complete after " + std::to_string(t.timeout_s) +
                " s (runtime.watchdog_s); the compute stream did not reach the operation");
          }
          return false;
        }
        t.keep_buffers = true;  // until the copy is seen done
        const size_t bytes = t.result_bytes ? std::min(t.result_bytes(), t.out_bytes) : t.out_bytes;
        ORRERY_CUDA_CHECK(
            cudaMemcpyAsync(t.dev_out, t.out.ptr, bytes, cudaMemcpyHostToDevice, h2d_));
        ORRERY_CUDA_CHECK(cudaEventRecord(t.h2d_done, h2d_));
        a.copying = true;
        // The copy has a deadline of its own (the host operation may have finished just in time).
        a.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(t.timeout_s));
        return false;
      }
      if (!reached(t.h2d_done, "copy to device for ", t)) {
        if (Clock::now() > a.deadline) {
          throw InternalError("watchdog: copy to device for " + t.what + " not complete after " +
                              std::to_string(t.timeout_s) + " s (runtime.watchdog_s)");
        }
        return false;
      }
      t.keep_buffers = false;  // the copy is done
    } catch (...) {
      finish_(a.t, std::current_exception());
      return true;
    }
    finish_(a.t, nullptr);
    return true;
  }

  Finish finish_;
  cudaStream_t h2d_;
  TaskThread thread_;
};

// The process's staging machinery on one device, shared by a staged communicator and its splits.
class StagedEngine {
 public:
  explicit StagedEngine(int device)
      : device_(device),
        h2d_(make_stream()),
        stage1_([this](const std::shared_ptr<StagedTask>& t) { run_stage1(t); }),
        stage2_([this](const std::shared_ptr<StagedTask>& t,
                       std::exception_ptr err) { finish(t, std::move(err)); },
                h2d_) {
    ORRERY_CUDA_CHECK(cudaStreamCreateWithFlags(&d2h_, cudaStreamNonBlocking));
    stage1_.start(device);
    stage2_.start(device);
  }
  ~StagedEngine() {
    stage1_.stop();
    stage2_.stop();
    cudaStreamDestroy(d2h_);
    cudaStreamDestroy(h2d_);
  }

  int device() const { return device_; }
  cudaStream_t d2h() const { return d2h_; }
  PinnedPool& pool() { return pool_; }

  void submit(const std::shared_ptr<StagedTask>& t) {
    {
      std::lock_guard lock(mu_);
      std::erase_if(inflight_, [](const std::shared_ptr<StagedTask>& x) { return x->done(); });
      inflight_.push_back(t);
    }
    stage1_.push(t);
  }
  // The tasks submitted and not yet seen complete (they complete in any order).
  std::vector<std::shared_ptr<StagedTask>> inflight() {
    std::lock_guard lock(mu_);
    return inflight_;
  }

 private:
  static cudaStream_t make_stream() {
    cudaStream_t s = nullptr;
    ORRERY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }

  void finish(const std::shared_ptr<StagedTask>& t, std::exception_ptr err) {
    if (!t->keep_buffers) {
      pool_.release(t->in);
      if (t->out.ptr != t->in.ptr) pool_.release(t->out);
    }
    t->in = t->out = {};
    t->complete(std::move(err));
  }

  void run_stage1(const std::shared_ptr<StagedTask>& t) {
    try {
      if (t->d2h_done) {
        t->keep_buffers = true;  // until the copy out is seen done
        poll_event(t->d2h_done, t->timeout_s, "copy to host for " + t->what);
        t->keep_buffers = false;
      }
      OpLabel label = t->label;
      label.name = t->name;
      t->host = t->host_op(label);
    } catch (...) {
      finish(t, std::current_exception());
      return;
    }
    stage2_.push(t);
  }

  int device_;
  cudaStream_t d2h_ = nullptr;
  cudaStream_t h2d_ = nullptr;
  PinnedPool pool_;
  std::mutex mu_;
  std::vector<std::shared_ptr<StagedTask>> inflight_;
  Stage stage1_;
  Completer stage2_;
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::shared_ptr<StagedEngine> engine, Communicator& host,
                     std::unique_ptr<Communicator> owned, cudaStream_t compute, double timeout_s)
      : engine_(std::move(engine)),
        host_(host),
        owned_(std::move(owned)),
        compute_(compute),
        timeout_s_(timeout_s) {}

  ~StagedCommunicator() override {
    try {
      drain();
    } catch (...) {
      // A failed operation already reported its error to its waiter.
    }
  }

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  const traces::CommunicatorInfo& info() const override { return host_.info(); }

  Handle all_reduce(void* data, size_t count, DType dtype, ReduceOp op,
                    const OpLabel& label) override {
    const size_t bytes = count * dtype_size(dtype);
    Communicator& h = host_;
    return stage("all_reduce", label, data, bytes, data, bytes, true,
                 [&h, count, dtype, op](void* in, void*, const OpLabel& l) {
                   return h.all_reduce(in, count, dtype, op, l);
                 });
  }

  Handle reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op,
                        const OpLabel& label) override {
    const size_t out_bytes = recv_count * dtype_size(dtype);
    Communicator& h = host_;
    return stage("reduce_scatter", label, send, out_bytes * static_cast<size_t>(size()), recv,
                 out_bytes, false,
                 [&h, recv_count, dtype, op](void* in, void* out, const OpLabel& l) {
                   return h.reduce_scatter(in, out, recv_count, dtype, op, l);
                 });
  }

  Handle all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                    const OpLabel& label) override {
    const size_t in_bytes = send_count * dtype_size(dtype);
    Communicator& h = host_;
    return stage("all_gather", label, send, in_bytes, recv, in_bytes * static_cast<size_t>(size()),
                 false, [&h, send_count, dtype](void* in, void* out, const OpLabel& l) {
                   return h.all_gather(in, out, send_count, dtype, l);
                 });
  }

  Handle broadcast(void* data, size_t count, DType dtype, int root, const OpLabel& label) override {
    const size_t bytes = count * dtype_size(dtype);
    Communicator& h = host_;
    // Only the root's data matters on the way in; only the others need it back.
    const bool is_root = rank() == root;
    return stage("broadcast", label, is_root ? data : nullptr, bytes, is_root ? nullptr : data,
                 bytes, true, [&h, count, dtype, root](void* in, void*, const OpLabel& l) {
                   return h.broadcast(in, count, dtype, root, l);
                 });
  }

  Handle send(const void* data, size_t count, DType dtype, int peer,
              const OpLabel& label) override {
    const size_t bytes = count * dtype_size(dtype);
    Communicator& h = host_;
    return stage("send", label, data, bytes, nullptr, 0, false,
                 [&h, count, dtype, peer](void* in, void*, const OpLabel& l) {
                   return h.send(in, count, dtype, peer, l);
                 });
  }

  Handle recv(void* data, size_t count, DType dtype, int peer, const OpLabel& label) override {
    const size_t bytes = count * dtype_size(dtype);
    Communicator& h = host_;
    return stage("recv", label, nullptr, 0, data, bytes, false,
                 [&h, count, dtype, peer](void*, void* out, const OpLabel& l) {
                   return h.recv(out, count, dtype, peer, l);
                 });
  }

  // The host all_to_all_v on staged copies: the blocks sent go out, and only what arrived (the
  // received counts, known once the host operation is done) comes back.
  Handle all_to_all_v(const void* send, const int64_t* send_counts, std::size_t groups, void* recv,
                      int64_t* recv_counts, std::size_t recv_capacity, DType dtype,
                      const OpLabel& label) override {
    const std::size_t n = static_cast<std::size_t>(size()) * groups, es = dtype_size(dtype);
    auto counts = std::make_shared<std::vector<int64_t>>(send_counts, send_counts + n);
    std::size_t sent = 0;
    for (int64_t c : *counts) sent += static_cast<std::size_t>(std::max<int64_t>(c, 0));
    Communicator& h = host_;
    return stage(
        "all_to_all_v", label, send, sent * es, recv, recv_capacity * es, false,
        [&h, counts, groups, recv_counts, recv_capacity, dtype](void* in, void* out,
                                                                const OpLabel& l) {
          return h.all_to_all_v(in, counts->data(), groups, out, recv_counts, recv_capacity, dtype,
                                l);
        },
        [recv_counts, n, es] {
          std::size_t r = 0;
          for (std::size_t i = 0; i < n; ++i) r += static_cast<std::size_t>(recv_counts[i]);
          return r * es;
        });
  }

  Handle barrier(const OpLabel& label) override {
    Communicator& h = host_;
    return stage("barrier", label, nullptr, 0, nullptr, 0, false,
                 [&h](void*, void*, const OpLabel& l) { return h.barrier(l); });
  }

  void synchronize() override {
    drain();
    host_.synchronize();
  }

  std::unique_ptr<Communicator> split(int color, int key, CommKind kind,
                                      const std::string& name) override {
    // Every staged operation must have reached MPI first: the split is an MPI call of its own and
    // must come after them on every rank.
    drain();
    auto sub = host_.split(color, key, kind, name);
    if (!sub) return nullptr;
    Communicator& ref = *sub;
    return std::make_unique<StagedCommunicator>(engine_, ref, std::move(sub), compute_, timeout_s_);
  }

  void set_recorder(profiler::Recorder* rec) override { host_.set_recorder(rec); }

  [[noreturn]] void abort(int code) override {
    host_.abort(code);
    std::_Exit(code);  // not reached: abort is [[noreturn]]
  }

 private:
  // Waits until every operation submitted so far is complete (errors stay with their handles).
  void drain() {
    for (const auto& t : engine_->inflight()) {
      try {
        t->wait();
      } catch (const std::exception&) {
        if (!t->done()) throw;  // the wait itself timed out
      }
    }
  }

  // Queues one staged operation: `dev_in` (in_bytes) is copied out, `op` runs on the pinned buffers,
  // the pinned output (the input buffer when `in_place`) is copied back to `dev_out` (out_bytes).
  // With `result_bytes`, only that many bytes (at most out_bytes) are copied back.
  Handle stage(const char* op_name, const OpLabel& label, const void* dev_in, size_t in_bytes,
               void* dev_out, size_t out_bytes, bool in_place,
               std::function<Handle(void*, void*, const OpLabel&)> op,
               std::function<size_t()> result_bytes = {}) {
    auto t = std::make_shared<StagedTask>();
    t->name = std::string(label.name);
    t->label = label;
    t->what = std::string(op_name) + " on " + info().name;
    t->compute = compute_;
    t->timeout_s = timeout_s_;
    ORRERY_CUDA_CHECK(cudaSetDevice(engine_->device()));
    ORRERY_CUDA_CHECK(cudaEventCreateWithFlags(&t->ready, cudaEventDisableTiming));
    ORRERY_CUDA_CHECK(cudaEventRecord(t->ready, compute_));
    const size_t in_cap = in_place ? std::max(in_bytes, out_bytes) : in_bytes;
    t->in = engine_->pool().acquire(in_cap);
    t->out = in_place ? t->in : engine_->pool().acquire(out_bytes);
    if (dev_in != nullptr && in_bytes > 0) {
      ORRERY_CUDA_CHECK(cudaEventCreateWithFlags(&t->d2h_done, cudaEventDisableTiming));
      ORRERY_CUDA_CHECK(cudaStreamWaitEvent(engine_->d2h(), t->ready, 0));
      ORRERY_CUDA_CHECK(
          cudaMemcpyAsync(t->in.ptr, dev_in, in_bytes, cudaMemcpyDeviceToHost, engine_->d2h()));
      ORRERY_CUDA_CHECK(cudaEventRecord(t->d2h_done, engine_->d2h()));
    }
    if (dev_out != nullptr && out_bytes > 0) {
      t->dev_out = dev_out;
      t->out_bytes = out_bytes;
      t->result_bytes = std::move(result_bytes);
      ORRERY_CUDA_CHECK(cudaEventCreateWithFlags(&t->h2d_done, cudaEventDisableTiming));
    }
    void* in = t->in.ptr;
    void* out = t->out.ptr;
    t->host_op = [op = std::move(op), in, out](const OpLabel& l) { return op(in, out, l); };
    engine_->submit(t);
    return Handle(t);
  }

  std::shared_ptr<StagedEngine> engine_;
  Communicator& host_;
  std::unique_ptr<Communicator> owned_;  // host_ when this communicator came from split()
  cudaStream_t compute_;
  double timeout_s_;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(Communicator& host_comm,
                                                       cudaStream_t compute_stream,
                                                       double watchdog_s) {
  if (std::string why = no_device_reason(); !why.empty()) {
    throw InternalError("staged device communicator: " + why);
  }
  int device = 0;
  ORRERY_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex registry_mu;
  static std::map<int, std::weak_ptr<StagedEngine>> registry;
  std::shared_ptr<StagedEngine> engine;
  {
    std::lock_guard lock(registry_mu);
    engine = registry[device].lock();
    if (!engine) {
      engine = std::make_shared<StagedEngine>(device);
      registry[device] = engine;
    }
  }
  return std::make_unique<StagedCommunicator>(engine, host_comm, nullptr, compute_stream,
                                              watchdog_s);
}

}  // namespace orrery::runtime::cuda
