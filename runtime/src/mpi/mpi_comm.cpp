// MpiCommunicator: the Communicator over MPI (OpenMPI), for CPU ranks.
//
// One communication thread per process makes every MPI call, MPI_Init_thread and MPI_Finalize
// included (MPI_THREAD_FUNNELED: the thread that initialised MPI is the only one that calls it), so
// any MPI build works and compute threads never block in MPI. Callers queue operations and get a
// Handle. The thread runs collectives one at a time in issue order; sends and receives are posted
// and completed by polling, so exchanges in both directions cannot deadlock. Every operation is
// recorded as a span on the comm stream.
//
// Waiting: a blocking MPI collective busy-polls shared memory for as long as the slowest rank is
// late, taking a core from the rank's own compute threads, which is exactly what overlapping
// communication with backward must avoid. So collectives are posted non-blocking (MPI_Iallreduce,
// ...) and the thread polls MPI_Test, sleeping ORRERY_COMM_POLL_US microseconds (default 50)
// between polls after a short spin; ORRERY_COMM_POLL_US=0 polls without sleeping.
// The one exception to the funnel is MPI_Abort, which the failing thread calls directly: it must
// work while the communication thread is stuck in a collective.
//
// Ending without losing spans: when one rank dies (or calls MPI_Abort), mpirun sends the others
// SIGTERM and, a grace period later (odls_base_sigkill_timeout), SIGKILL. Each rank's SIGTERM and
// SIGINT handler only writes the signal to a pipe; a thread waiting on it flushes the recorders'
// buffered spans and the flight records (status "stopped", the step it was in) into the rank's
// trace file, then ends the process with 128 + signal. abort() does the same with status "failed"
// before MPI_Abort.
// The C API only: Open MPI's mpi.h pulls in the deprecated C++ bindings (libmpi_cxx) otherwise.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <fcntl.h>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/model/names.hpp"
#include "orrery/profiler/flight_recorder.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/half.hpp"
#include "orrery/runtime/offload.hpp"

namespace orrery::runtime {
namespace {

using traces::CollOp;
using traces::CommKind;

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

#define ORRERY_MPI_CHECK(call)                                                             \
  do {                                                                                     \
    const int orrery_rc_ = (call);                                                         \
    if (orrery_rc_ != MPI_SUCCESS) {                                                       \
      throw InternalError(std::string(#call) + " failed at " + __FILE__ + ":" +            \
                          std::to_string(__LINE__) + ": " + mpi_error_string(orrery_rc_)); \
    }                                                                                      \
  } while (0)

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::U8:
      return MPI_UINT8_T;
    case DType::BF16:
    case DType::F16:
      return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

// The 16-bit sums: each pair converted to fp32, added, rounded back (half.hpp).
template <Precision P>
void sum_16_bit(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    if constexpr (P == Precision::BF16) {
      b[i] = float_to_bf16_bits(bf16_bits_to_float(a[i]) + bf16_bits_to_float(b[i]));
    } else {
      b[i] = float_to_fp16_bits(fp16_bits_to_float(a[i]) + fp16_bits_to_float(b[i]));
    }
  }
}

MPI_Op op_16_bit(DType t) {
  // Created once (MPI is initialised before any communicator exists), freed by MPI_Finalize.
  static MPI_Op bf16 = [] {
    MPI_Op op;
    MPI_Op_create(&sum_16_bit<Precision::BF16>, 1, &op);
    return op;
  }();
  static MPI_Op f16 = [] {
    MPI_Op op;
    MPI_Op_create(&sum_16_bit<Precision::FP16>, 1, &op);
    return op;
  }();
  return t == DType::BF16 ? bf16 : f16;
}

MPI_Op mpi_op(ReduceOp op, DType t = DType::F32) {
  if (t == DType::BF16 || t == DType::F16) {
    if (op != ReduceOp::Sum)
      throw InternalError("MPI communicator: 16-bit dtypes reduce by Sum only");
    return op_16_bit(t);
  }
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:  // summed, then divided on the communication thread
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

int checked_count(size_t count) {
  if (count > static_cast<size_t>(INT_MAX)) {
    throw InternalError("MPI communicator: " + std::to_string(count) +
                        " elements in one operation exceed MPI's int count");
  }
  return static_cast<int>(count);
}

void divide_in_place(void* data, size_t count, DType t, int n) {
  if (t == DType::F32) {
    auto* p = static_cast<float*>(data);
    const float inv = 1.0f / static_cast<float>(n);
    for (size_t i = 0; i < count; ++i) p[i] *= inv;
  } else if (t == DType::F64) {
    auto* p = static_cast<double*>(data);
    const double inv = 1.0 / n;
    for (size_t i = 0; i < count; ++i) p[i] *= inv;
  } else {
    throw InternalError("MPI communicator: ReduceOp::Avg needs a floating-point dtype");
  }
}

// The failure paths' flush: spans and flight records (with this rank's final status) to disk.
void flush_for_exit(profiler::RankState state, const std::string& detail) {
  auto& fr = profiler::FlightRecorder::instance();
  fr.set_status(state, fr.status().step, detail);  // first: a SIGTERM meanwhile sees it
  profiler::Recorder::flush_live();
  fr.save();
  remove_offload_files_for_exit();  // the process ends without its destructors
}

int g_signal_pipe[2] = {-1, -1};

void on_stop_signal(int sig) {  // async-signal-safe: one write(2)
  const unsigned char b = static_cast<unsigned char>(sig);
  const int saved = errno;
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

// SIGTERM/SIGINT: flush on a thread (nothing of that is allowed in a handler), then exit.
void install_stop_handlers() {
  static const bool installed = [] {
    if (::pipe2(g_signal_pipe, O_CLOEXEC) != 0) return false;
    std::thread([] {
      unsigned char b = 0;
      while (::read(g_signal_pipe[0], &b, 1) != 1) {
        if (errno != EINTR) return;
      }
      const int sig = b;
      auto& fr = profiler::FlightRecorder::instance();
      // A rank that called MPI_Abort is already flushed and leaves through MPI_Abort.
      if (fr.status().state == profiler::RankState::Failed) return;
      flush_for_exit(profiler::RankState::Stopped, sig == SIGINT ? "SIGINT" : "SIGTERM");
      const profiler::RankStatus st = fr.status();
      std::fprintf(stderr,
                   "orrery: rank %d stopped by %s in step %d; spans recorded so far saved\n",
                   st.rank, sig == SIGINT ? "SIGINT" : "SIGTERM", st.step);
      std::fflush(stderr);
      std::_Exit(128 + sig);
    }).detach();
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGINT, &sa, nullptr);
    return true;
  }();
  (void)installed;
}

// One queued operation and its completion.
class Task final : public Work {
 public:
  enum class Kind { Collective, Send, Recv, Fence, Stop };

  Kind kind = Kind::Collective;
  std::function<void()> run;                    // Collective, blocking form (setup calls)
  std::function<void(MPI_Request*)> post;       // Collective, non-blocking form (operations)
  std::function<void()> after;                  // run once the posted collective is complete
  std::function<void(MPI_Request*)> post_next;  // then a second non-blocking collective (or none)
  // Send / Recv:
  const void* send_buf = nullptr;
  void* recv_buf = nullptr;
  int count = 0;
  MPI_Datatype type = MPI_BYTE;
  int peer = 0;
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  // Trace:
  bool record = false;
  traces::Span span;
  std::string what;  // "all_reduce seq 12 on dp[...]": for watchdog and error messages
  double watchdog_s = 300;
  uint64_t flight_id = 0;  // its FlightRecorder record (0: none)

  void complete(std::exception_ptr err = nullptr) { completion_.complete(std::move(err)); }
  void wait() override {
    if (!completion_.wait_for(watchdog_s)) {
      std::ostringstream msg;
      msg << "watchdog: " << what << " not complete after " << watchdog_s
          << " s (runtime.watchdog_s); a rank is missing from this operation or issued "
             "operations in another order";
      // Dump the flight records (trace file and stderr) before the caller aborts the job.
      profiler::FlightRecorder::instance().dump(msg.str(), true);
      throw InternalError(msg.str());
    }
  }
  bool done() const override { return completion_.done(); }

 private:
  Completion completion_;
};

// The process's communication thread and its queue.
class Engine {
 public:
  static Engine& instance() {
    static Engine e;
    return e;
  }

  // Starts the thread (which initialises MPI) and waits until MPI is up. Idempotent.
  void start() {
    std::unique_lock lock(mu_);
    if (started_) return;
    started_ = true;
    thread_ = std::thread([this] { loop(); });
    cv_.wait(lock, [&] { return init_done_; });
    if (init_error_) std::rethrow_exception(init_error_);
  }

  // Finalises MPI and joins the thread (at process exit).
  void stop() {
    {
      std::lock_guard lock(mu_);
      if (!started_ || stopping_) return;
      stopping_ = true;
    }
    auto t = std::make_shared<Task>();
    t->kind = Task::Kind::Stop;
    submit(t);
    if (thread_.joinable()) thread_.join();
  }

  ~Engine() {
    try {
      stop();
    } catch (...) {
    }
  }

  void submit(const std::shared_ptr<Task>& t) {
    {
      std::lock_guard lock(mu_);
      if (finalized_) {
        t->complete(std::make_exception_ptr(
            InternalError("MPI communicator used after MPI_Finalize (process exiting)")));
        return;
      }
      queue_.push_back(t);
    }
    cv_.notify_one();
  }

  // Runs `fn` on the communication thread and waits for it (setup calls such as MPI_Comm_split).
  void call(std::function<void()> fn) {
    auto t = std::make_shared<Task>();
    t->kind = Task::Kind::Collective;
    t->run = std::move(fn);
    t->what = "communicator setup";
    t->watchdog_s = watchdog_s_;
    submit(t);
    t->wait();
  }

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  double watchdog_s() const { return watchdog_s_; }
  const FaultInjection& faults() const { return faults_; }
  void set_faults(const FaultInjection& f) { faults_ = f; }
  void set_watchdog_s(double s) { watchdog_s_ = s; }
  profiler::Recorder* recorder() const { return recorder_.load(std::memory_order_acquire); }
  void set_recorder(profiler::Recorder* r) { recorder_.store(r, std::memory_order_release); }

 private:
  Engine() = default;

  void loop() {
    profiler::Recorder::set_thread_stream(profiler::kCommStream);
    if (const char* v = std::getenv("ORRERY_COMM_POLL_US"))
      poll_sleep_us_ = std::max(0, std::atoi(v));
    try {
      int provided = 0;
      ORRERY_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
      // Errors come back as codes and become exceptions in the waiting thread.
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
      MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
      MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
    } catch (...) {
      std::lock_guard lock(mu_);
      init_error_ = std::current_exception();
      init_done_ = true;
      cv_.notify_all();
      return;
    }
    {
      std::lock_guard lock(mu_);
      init_done_ = true;
    }
    cv_.notify_all();

    auto& in_flight = in_flight_;
    std::shared_ptr<Task> fence;  // waiting for in_flight to drain
    for (;;) {
      std::shared_ptr<Task> t;
      {
        std::unique_lock lock(mu_);
        if (queue_.empty() || fence) {
          if (in_flight.empty() && !fence) {
            cv_.wait(lock, [&] { return !queue_.empty(); });
          } else {
            // Posted transfers progress only inside MPI calls: poll, briefly yielding the core.
            lock.unlock();
            progress(in_flight);
            if (fence && in_flight.empty()) {
              fence->complete();
              fence.reset();
            }
            std::this_thread::sleep_for(std::chrono::microseconds(20));
            continue;
          }
        }
        t = queue_.front();
        queue_.pop_front();
      }
      switch (t->kind) {
        case Task::Kind::Stop:
          while (!in_flight.empty()) progress(in_flight);
          MPI_Finalize();
          {
            std::lock_guard lock(mu_);
            finalized_ = true;
            for (auto& late : queue_) {
              late->complete(std::make_exception_ptr(
                  InternalError("MPI communicator used after MPI_Finalize (process exiting)")));
            }
            queue_.clear();
          }
          t->complete();
          return;
        case Task::Kind::Fence:
          if (in_flight.empty()) {
            t->complete();
          } else {
            fence = t;
          }
          break;
        case Task::Kind::Send:
        case Task::Kind::Recv:
          post(t);
          if (!t->done()) in_flight.push_back(t);
          break;
        case Task::Kind::Collective:
          run_collective(t);
          break;
      }
      if (!in_flight.empty()) progress(in_flight);
    }
  }

  void finish(const std::shared_ptr<Task>& t, std::exception_ptr err) {
    if (t->flight_id && !err) {
      profiler::FlightRecorder::instance().completed(t->flight_id, profiler::steady_now_ns());
    }
    if (t->record && !err) {
      t->span.end_ns = profiler::steady_now_ns();
      if (auto* rec = recorder()) rec->record(t->span);
    }
    t->complete(std::move(err));
  }

  void run_collective(const std::shared_ptr<Task>& t) {
    t->span.start_ns = profiler::steady_now_ns();
    if (t->flight_id) profiler::FlightRecorder::instance().started(t->flight_id, t->span.start_ns);
    std::exception_ptr err;
    try {
      if (t->post) {
        MPI_Request req = MPI_REQUEST_NULL;
        t->post(&req);
        wait_polling(req, t->what);
        if (t->after) t->after();
        if (t->post_next) {
          req = MPI_REQUEST_NULL;
          t->post_next(&req);
          wait_polling(req, t->what);
        }
      } else {
        t->run();
      }
    } catch (...) {
      err = std::current_exception();
    }
    finish(t, err);
  }

  // Completes `req`, progressing posted sends/receives meanwhile; sleeps between polls (see top).
  void wait_polling(MPI_Request& req, const std::string& what) {
    constexpr int kSpinPolls = 64;
    int flag = 0;
    for (int polls = 0;; ++polls) {
      const int rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) throw InternalError(what + ": " + mpi_error_string(rc));
      if (flag) return;
      if (!in_flight_.empty()) progress(in_flight_);
      if (poll_sleep_us_ > 0 && polls >= kSpinPolls) {
        std::this_thread::sleep_for(std::chrono::microseconds(poll_sleep_us_));
      }
    }
  }

  void post(const std::shared_ptr<Task>& t) {
    t->span.start_ns = profiler::steady_now_ns();
    if (t->flight_id) profiler::FlightRecorder::instance().started(t->flight_id, t->span.start_ns);
    try {
      if (t->kind == Task::Kind::Send) {
        ORRERY_MPI_CHECK(
            MPI_Isend(t->send_buf, t->count, t->type, t->peer, 0, t->comm, &t->request));
      } else {
        ORRERY_MPI_CHECK(
            MPI_Irecv(t->recv_buf, t->count, t->type, t->peer, 0, t->comm, &t->request));
      }
    } catch (...) {
      finish(t, std::current_exception());
    }
  }

  void progress(std::vector<std::shared_ptr<Task>>& in_flight) {
    for (size_t i = 0; i < in_flight.size();) {
      auto& t = in_flight[i];
      int flag = 0;
      const int rc = MPI_Test(&t->request, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS || flag) {
        finish(t, rc == MPI_SUCCESS ? nullptr
                                    : std::make_exception_ptr(
                                          InternalError(t->what + ": " + mpi_error_string(rc))));
        in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Task>> queue_;
  std::thread thread_;
  bool started_ = false;
  bool stopping_ = false;
  bool init_done_ = false;
  bool finalized_ = false;
  std::exception_ptr init_error_;
  int world_rank_ = 0;
  int world_size_ = 1;
  double watchdog_s_ = 300;
  FaultInjection faults_;
  std::atomic<profiler::Recorder*> recorder_{nullptr};
  std::vector<std::shared_ptr<Task>> in_flight_;  // posted sends and receives (comm thread only)
  int poll_sleep_us_ = 50;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, traces::CommunicatorInfo info, bool owns)
      : comm_(comm), info_(std::move(info)), owns_(owns) {
    Engine::instance().call([&] {
      MPI_Comm_rank(comm_, &rank_);
      MPI_Comm_size(comm_, &size_);
    });
  }
  ~MpiCommunicator() override {
    if (!owns_) return;
    try {
      synchronize();
      MPI_Comm c = comm_;
      Engine::instance().call([&] { MPI_Comm_free(&c); });
    } catch (...) {
      // A communicator torn down after a failure: the job is ending anyway.
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const traces::CommunicatorInfo& info() const override { return info_; }

  Handle all_reduce(void* data, size_t count, DType dtype, ReduceOp op,
                    const OpLabel& label) override {
    const int n = checked_count(count);
    auto t = make_task(CollOp::AllReduce, label, count * dtype_size(dtype), -1, dtype);
    const int size = size_;
    MPI_Comm comm = comm_;
    t->post = [=](MPI_Request* req) {
      ORRERY_MPI_CHECK(
          MPI_Iallreduce(MPI_IN_PLACE, data, n, mpi_type(dtype), mpi_op(op, dtype), comm, req));
    };
    if (op == ReduceOp::Avg) t->after = [=] { divide_in_place(data, count, dtype, size); };
    return submit(t);
  }

  Handle reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op,
                        const OpLabel& label) override {
    const int n = checked_count(recv_count);
    checked_count(recv_count * static_cast<size_t>(size_));
    auto t =
        make_task(CollOp::ReduceScatter, label, recv_count * size_ * dtype_size(dtype), -1, dtype);
    const int size = size_;
    MPI_Comm comm = comm_;
    t->post = [=](MPI_Request* req) {
      ORRERY_MPI_CHECK(
          MPI_Ireduce_scatter_block(send, recv, n, mpi_type(dtype), mpi_op(op, dtype), comm, req));
    };
    if (op == ReduceOp::Avg) t->after = [=] { divide_in_place(recv, recv_count, dtype, size); };
    return submit(t);
  }

  Handle all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                    const OpLabel& label) override {
    const int n = checked_count(send_count);
    checked_count(send_count * static_cast<size_t>(size_));
    auto t = make_task(CollOp::AllGather, label, send_count * size_ * dtype_size(dtype), -1, dtype);
    MPI_Comm comm = comm_;
    const int my_rank = rank_;
    const size_t block_bytes = send_count * dtype_size(dtype);
    t->post = [=](MPI_Request* req) {
      // In place when the caller passes its own block of `recv` as `send`.
      const bool in_place = send == static_cast<const uint8_t*>(recv) + block_bytes * my_rank;
      ORRERY_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, mpi_type(dtype), recv, n,
                                      mpi_type(dtype), comm, req));
    };
    return submit(t);
  }

  // Counts first (MPI_Ialltoall of `groups` int64 per peer), then the data (MPI_Ialltoallv of
  // the per-peer totals), one task: the span covers both.
  Handle all_to_all_v(const void* send, const int64_t* send_counts, std::size_t groups, void* recv,
                      int64_t* recv_counts, std::size_t recv_capacity, DType dtype,
                      const OpLabel& label) override {
    const auto peers = static_cast<std::size_t>(size_);
    std::size_t sent = 0;
    for (std::size_t i = 0; i < peers * groups; ++i)
      sent += static_cast<std::size_t>(send_counts[i]);
    checked_count(sent);
    const int ng = checked_count(groups);
    auto t = make_task(CollOp::AllToAll, label, sent * dtype_size(dtype), -1, dtype);
    struct Plan {
      std::vector<int> scount, sdispl, rcount, rdispl;
    };
    auto plan = std::make_shared<Plan>();
    MPI_Comm comm = comm_;
    const std::string what = "all_to_all_v on " + info_.name;
    t->post = [=](MPI_Request* req) {
      ORRERY_MPI_CHECK(
          MPI_Ialltoall(send_counts, ng, MPI_INT64_T, recv_counts, ng, MPI_INT64_T, comm, req));
    };
    t->after = [=] {
      const AllToAllPlan p =
          all_to_all_plan(send_counts, recv_counts, peers, groups, recv_capacity, what);
      if (p.received > INT32_MAX) {
        throw InternalError(what + ": more than MPI's " + std::to_string(INT32_MAX) + " elements");
      }
      auto ints = [](const std::vector<int64_t>& v) {
        return std::vector<int>(v.begin(), v.end());
      };
      plan->scount = ints(p.send_count);
      plan->sdispl = ints(p.send_offset);
      plan->rcount = ints(p.recv_count);
      plan->rdispl = ints(p.recv_offset);
    };
    t->post_next = [=](MPI_Request* req) {
      const MPI_Datatype type = mpi_type(dtype);
      ORRERY_MPI_CHECK(MPI_Ialltoallv(send, plan->scount.data(), plan->sdispl.data(), type, recv,
                                      plan->rcount.data(), plan->rdispl.data(), type, comm, req));
    };
    return submit(t);
  }

  Handle broadcast(void* data, size_t count, DType dtype, int root, const OpLabel& label) override {
    const int n = checked_count(count);
    check_peer(root);
    auto t =
        make_task(CollOp::Broadcast, label, count * dtype_size(dtype), global_rank(root), dtype);
    MPI_Comm comm = comm_;
    t->post = [=](MPI_Request* req) {
      ORRERY_MPI_CHECK(MPI_Ibcast(data, n, mpi_type(dtype), root, comm, req));
    };
    return submit(t);
  }

  Handle send(const void* data, size_t count, DType dtype, int peer,
              const OpLabel& label) override {
    check_peer(peer);
    auto t = make_task(CollOp::Send, label, count * dtype_size(dtype), global_rank(peer), dtype);
    t->kind = Task::Kind::Send;
    t->send_buf = data;
    t->count = checked_count(count);
    t->type = mpi_type(dtype);
    t->peer = peer;
    t->comm = comm_;
    return submit(t);
  }

  Handle recv(void* data, size_t count, DType dtype, int peer, const OpLabel& label) override {
    check_peer(peer);
    auto t = make_task(CollOp::Recv, label, count * dtype_size(dtype), global_rank(peer), dtype);
    t->kind = Task::Kind::Recv;
    t->recv_buf = data;
    t->count = checked_count(count);
    t->type = mpi_type(dtype);
    t->peer = peer;
    t->comm = comm_;
    return submit(t);
  }

  Handle barrier(const OpLabel& label) override {
    auto t = make_task(CollOp::Barrier, label, 0, -1);
    MPI_Comm comm = comm_;
    t->post = [=](MPI_Request* req) { ORRERY_MPI_CHECK(MPI_Ibarrier(comm, req)); };
    return submit(t);
  }

  void synchronize() override {
    auto t = std::make_shared<Task>();
    t->kind = Task::Kind::Fence;
    t->what = "synchronize on " + info_.name;
    t->watchdog_s = Engine::instance().watchdog_s();
    Engine::instance().submit(t);
    t->wait();
  }

  std::unique_ptr<Communicator> split(int color, int key, CommKind kind,
                                      const std::string& name) override {
    const int ordinal = ++splits_;
    MPI_Comm out = MPI_COMM_NULL;
    std::vector<int> members;
    const MPI_Comm parent = comm_;
    Engine::instance().call([&] {
      ORRERY_MPI_CHECK(MPI_Comm_split(parent, color < 0 ? MPI_UNDEFINED : color, key, &out));
      if (out == MPI_COMM_NULL) return;
      MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN);
      // Member global ranks, from the groups (local, no communication).
      MPI_Group world_group, group;
      MPI_Comm_group(MPI_COMM_WORLD, &world_group);
      MPI_Comm_group(out, &group);
      int n = 0;
      MPI_Group_size(group, &n);
      std::vector<int> local(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) local[static_cast<size_t>(i)] = i;
      members.resize(static_cast<size_t>(n));
      MPI_Group_translate_ranks(group, n, local.data(), world_group, members.data());
      MPI_Group_free(&group);
      MPI_Group_free(&world_group);
    });
    if (out == MPI_COMM_NULL) return nullptr;
    traces::CommunicatorInfo info;
    // The same id on every member and distinct between groups: the split's ordinal on its parent
    // (every member issues the parent's splits in the same order) and the group's lowest global
    // rank (which only one group of a split can have).
    int min_rank = INT_MAX;
    for (int r : members) min_rank = std::min(min_rank, r);
    const int64_t id =
        (static_cast<int64_t>(info_.id) * 97 + ordinal) * Engine::instance().world_size() +
        min_rank;
    if (id > INT32_MAX) throw InternalError("communicator ids exhausted (splits nested too deep)");
    info.id = static_cast<int32_t>(id);
    info.kind = kind;
    info.name = name;
    info.ranks.assign(members.begin(), members.end());
    auto c = std::make_unique<MpiCommunicator>(out, std::move(info), true);
    if (auto* rec = Engine::instance().recorder()) rec->add_communicator(c->info());
    return c;
  }

  void set_recorder(profiler::Recorder* rec) override {
    Engine::instance().set_recorder(rec);
    if (rec) rec->add_communicator(info_);
  }

  [[noreturn]] void abort(int code) override {
    flush_for_exit(profiler::RankState::Failed, "exit " + std::to_string(code));
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  void check_peer(int peer) const {
    if (peer < 0 || peer >= size_) {
      throw InternalError("MPI communicator " + info_.name + ": peer " + std::to_string(peer) +
                          " out of range for " + std::to_string(size_) + " ranks");
    }
  }

  std::shared_ptr<Task> make_task(CollOp op, const OpLabel& label, size_t bytes, int peer_global,
                                  DType dtype = DType::U8) {
    auto t = std::make_shared<Task>();
    const int64_t seq = seq_++;
    // Flight record, with the test-only faults of WorldOptions::faults applied.
    const FaultInjection& f = Engine::instance().faults();
    const int me = Engine::instance().world_rank();
    const bool collective = op != CollOp::Send && op != CollOp::Recv;
    bool record_flight = true;
    if (collective && label.step == f.step && !fault_fired_) {
      if (me == f.sleep_rank && f.sleep_ms > 0) {
        fault_fired_ = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(f.sleep_ms));
      } else if (me == f.skip_collective_rank) {
        fault_fired_ = withheld_ = true;
        record_flight = false;  // the rank never issues it
      } else if (me == f.size_mismatch_rank) {
        fault_fired_ = withheld_ = true;
        bytes = bytes * 2 + dtype_size(dtype);
      } else if (me == f.wrong_op_rank) {
        fault_fired_ = withheld_ = true;
        op = op == CollOp::AllGather ? CollOp::AllReduce : CollOp::AllGather;
      }
    }
    if (record_flight) {
      t->flight_id = schedule_flight_record(info_.id, seq, op, bytes, static_cast<int32_t>(dtype),
                                            peer_global, label.step);
    }
    t->watchdog_s = Engine::instance().watchdog_s();
    t->what = std::string(traces::to_string(op)) + " seq " + std::to_string(seq) + " on " +
              info_.name + " (" + std::to_string(bytes) + " bytes)";
    profiler::Recorder* rec = Engine::instance().recorder();
    if (rec && rec->enabled()) {
      t->record = true;
      const int32_t stream = comm_stream_of(info_.kind, op);
      rec->ensure_stream(stream, model::names::stream_name(stream));
      t->span = comm_op_span(*rec, stream, op, label, bytes, info_.id, peer_global, seq);
    }
    return t;
  }

  Handle submit(const std::shared_ptr<Task>& t) {
    // After an injected fault this rank's operations never reach MPI (whose behaviour on
    // mismatched collectives is undefined): the others hang deterministically until the watchdog.
    if (withheld_) return Handle(t);
    Engine::instance().submit(t);
    return Handle(t);
  }

  MPI_Comm comm_;
  traces::CommunicatorInfo info_;
  bool owns_;
  int rank_ = 0;
  int size_ = 1;
  int64_t seq_ = 0;
  int splits_ = 0;
  inline static bool fault_fired_ = false;  // per process: each fault fires once
  inline static bool withheld_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_world_communicator(const WorldOptions& opt) {
  Engine& e = Engine::instance();
  e.set_watchdog_s(opt.watchdog_s);
  e.set_faults(opt.faults);
  e.start();
  profiler::FlightRecorder::instance().set_rank(e.world_rank());
  install_stop_handlers();  // after MPI_Init, so that ours are the handlers in place
  // MPI_Finalize on the communication thread when the process exits normally.
  static const bool registered = [] {
    std::atexit([] { Engine::instance().stop(); });
    return true;
  }();
  (void)registered;
  traces::CommunicatorInfo info;
  info.id = 0;
  info.kind = CommKind::World;
  info.name = "world";
  for (int r = 0; r < e.world_size(); ++r) info.ranks.push_back(r);
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, std::move(info), false);
}

}  // namespace orrery::runtime
