// The Communicator interface: collectives and point-to-point transfers between ranks, and
// sub-communicators for the data/tensor/pipeline-parallel groups.
//
// Implementations: MpiCommunicator (runtime/src/mpi/, CPUs, OpenMPI) and the single-rank
// LocalCommunicator (comm_local.cpp, a process without a launcher); an NCCL communicator fits the
// same interface:
//  - Buffers are raw pointers into the memory of the communicator's device (host memory for MPI,
//    device memory of its GPU for NCCL). Nothing here allocates or copies on the caller's behalf.
//  - Every operation is asynchronous: it is queued on the communicator's stream (MPI: one
//    communication thread per process, each operation recorded on its group's trace stream,
//    comm_stream_of below; NCCL: its CUDA stream) and returns a
//    Handle. Operations of one process run in the order they were issued, over all its
//    communicators, so every rank must issue the operations of a communicator in the same order
//    (the same rule as NCCL on one stream).
//  - The caller must not touch a buffer until the handle's wait() returns.
//  - Each operation is recorded (when a recorder is attached) as a span on its stream: kind
//    Collective or P2P, op, bytes (nccl-tests' size: the buffer for all-reduce/broadcast/send/recv,
//    the total for reduce-scatter/all-gather), communicator id, peer (global rank; the root for
//    broadcast), and the operation's sequence number in its communicator.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "orrery/traces/span.hpp"

namespace orrery::profiler {
class Recorder;
}

namespace orrery::runtime {

// BF16 and F16 are 16-bit patterns (half.hpp) on host memory: a Sum adds each pair in fp32 and
// rounds the sum back to the format, to nearest even (as NCCL's 16-bit sums); no Avg.
enum class DType : int32_t { F32 = 0, F64 = 1, I32 = 2, I64 = 3, U8 = 4, BF16 = 5, F16 = 6 };
size_t dtype_size(DType t);

enum class ReduceOp : int32_t { Sum = 0, Avg = 1, Max = 2, Min = 3 };

// Completion of an asynchronous operation.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation is complete; rethrows its error. A watchdog ends the wait with an
  // InternalError naming the operation when it takes longer than the communicator's timeout.
  virtual void wait() = 0;
  virtual bool done() const = 0;
};

class Handle {
 public:
  Handle() = default;
  explicit Handle(std::shared_ptr<Work> w) : work_(std::move(w)) {}
  void wait() {
    if (work_) work_->wait();
  }
  bool done() const { return !work_ || work_->done(); }
  bool valid() const { return work_ != nullptr; }

 private:
  std::shared_ptr<Work> work_;
};

// What the trace says about an operation besides its own parameters: a name (default: the op,
// e.g. "all_reduce") and the training context. The name is copied at issue time.
struct OpLabel {
  std::string_view name = {};
  int32_t step = -1;
  int32_t micro_batch = -1;
  int32_t layer = -1;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // rank within this communicator
  virtual int size() const = 0;
  // Trace identity: id (unique in the job, the same on every member), kind, name, member global
  // ranks in communicator-rank order.
  virtual const traces::CommunicatorInfo& info() const = 0;
  int32_t id() const { return info().id; }
  int global_rank(int r) const { return info().ranks.at(static_cast<size_t>(r)); }

  // In place: every rank ends with the reduction of everyone's `data` (Avg divides by size()).
  virtual Handle all_reduce(void* data, size_t count, DType dtype, ReduceOp op,
                            const OpLabel& label = {}) = 0;
  // `send` holds size()*recv_count elements; rank r receives the reduction of block r.
  virtual Handle reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                                ReduceOp op, const OpLabel& label = {}) = 0;
  // `recv` receives size()*send_count elements, block r from rank r.
  virtual Handle all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                            const OpLabel& label = {}) = 0;
  virtual Handle broadcast(void* data, size_t count, DType dtype, int root,
                           const OpLabel& label = {}) = 0;
  // Point-to-point; `peer` is a rank of this communicator. Matching is in issue order per pair.
  virtual Handle send(const void* data, size_t count, DType dtype, int peer,
                      const OpLabel& label = {}) = 0;
  virtual Handle recv(void* data, size_t count, DType dtype, int peer,
                      const OpLabel& label = {}) = 0;
  virtual Handle barrier(const OpLabel& label = {}) = 0;
  // Variable all-to-all with the sizes exchanged first (on MPI: MPI_Alltoall of the counts, then
  // MPI_Alltoallv of the data; model/moe.hpp's dispatch and combine). `send` holds, peer by peer,
  // `groups` blocks each: block (p, g) of send_counts[p·groups + g] elements ((size()·groups)
  // counts). On completion recv_counts[p·groups + g] is what peer p sent for group g and `recv`
  // holds the received blocks in the same (peer, group) order; more than recv_capacity elements
  // fail the operation. One CollOp::AllToAll span (stream comm.ep), bytes: the whole send buffer.
  // NCCL: the counts in one NCCL group of sends and receives, waited for on the host, then the
  // data in another (a send and a receive per peer); the host-staged CUDA communicator: the host's
  // on staged copies, only what arrived copied back. A communicator without it throws InputError.
  virtual Handle all_to_all_v(const void* send, const int64_t* send_counts, std::size_t groups,
                              void* recv, int64_t* recv_counts, std::size_t recv_capacity,
                              DType dtype, const OpLabel& label = {});

  // Blocks until every operation this process issued before the call is complete.
  virtual void synchronize() = 0;

  // Collective over this communicator: ranks passing the same `color` form a new communicator,
  // ordered by `key`. The result carries `kind` and `name` into the trace.
  virtual std::unique_ptr<Communicator> split(int color, int key, traces::CommKind kind,
                                              const std::string& name) = 0;

  // Where operations are recorded (nullptr: nowhere). Shared by the communicators of a process.
  virtual void set_recorder(profiler::Recorder* rec) = 0;

  // Ends the whole job at once with `code` (MPI_Abort): the way out when one rank fails and the
  // others would otherwise wait forever in a collective.
  [[noreturn]] virtual void abort(int code) = 0;
};

// Test-only fault injection (scenario keys faults.*, see scenarios/README.md): on the given global
// rank, the first collective of training step `step` is skipped, issued with another size or op
// (then, as after a skip, nothing more of that rank reaches MPI), or delayed by sleep_ms.
struct FaultInjection {
  int step = 0;
  int skip_collective_rank = -1;
  int size_mismatch_rank = -1;
  int wrong_op_rank = -1;
  int sleep_rank = -1;
  int sleep_ms = 0;
};

struct WorldOptions {
  double watchdog_s = 300.0;  // an operation not complete after this long fails its wait()
  FaultInjection faults;      // MPI communicator only
};

// True when this process was started by a launcher (mpirun, srun) with its rank and world size in
// the environment (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK, or SLURM_STEP_ID with SLURM_NTASKS).
bool started_by_launcher();
// The world size the launcher announced (1 when not started by one).
int launcher_world_size();
// The world rank the launcher announced (0 when not started by one).
int launcher_world_rank();

// Whether this build has the MPI communicator.
bool mpi_available();

// The world communicator of this process: MPI when started by a launcher and built with MPI
// (MPI is initialised on the communication thread), otherwise a single-rank communicator. Call it
// once per process. Throws InputError when a launcher started several ranks but the build has no
// MPI.
std::unique_ptr<Communicator> make_world_communicator(const WorldOptions& opt = {});
// A single-rank communicator, no MPI (tests, serial reference runs).
std::unique_ptr<Communicator> make_local_communicator();

// The completion state of one asynchronous operation, as the communicators' Work objects keep it
// (MPI, host-staged CUDA): complete() once from the thread that finished it; wait_for() blocks until
// then, false when `limit_s` passed first, and rethrows the operation's error.
class Completion {
 public:
  void complete(std::exception_ptr err = nullptr);
  bool wait_for(double limit_s);
  bool done() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// Registers a scheduled operation with the process's flight recorder (flight_recorder.hpp), as
// every communicator does before it issues one; returns the record's id.
uint64_t schedule_flight_record(int32_t comm, int64_t seq, traces::CollOp op, std::size_t bytes,
                                int32_t dtype, int32_t peer_global, int32_t step);

// The per-peer layout of an all_to_all_v (Communicator::all_to_all_v's (peer, group) counts over
// `peers` peers of `groups` groups each): each peer's element count and offset in the send and in
// the receive buffer, blocks packed peer by peer. Throws InternalError naming `what` when more than
// `recv_capacity` elements would arrive, or a count is negative.
struct AllToAllPlan {
  std::vector<int64_t> send_count, send_offset, recv_count, recv_offset;
  int64_t sent = 0, received = 0;  // totals
};
AllToAllPlan all_to_all_plan(const int64_t* send_counts, const int64_t* recv_counts,
                             std::size_t peers, std::size_t groups, std::size_t recv_capacity,
                             const std::string& what);

// The trace span of one communication operation, as every communicator records it (MPI, NCCL):
// Collective, or P2P for send and receive; named by the label, else by the op; on `stream`.
// The trace stream of an operation on a communicator of `kind` (model/names.hpp, the simulator's
// streams): tp -> comm.tp; pp receives -> comm.pp.recv, pp sends and collectives -> comm.pp.send;
// dp, world and the tied-embedding pair (kind Other) -> comm.dp; every all-to-all (the ep group's)
// -> comm.ep.
int32_t comm_stream_of(traces::CommKind kind, traces::CollOp op);

traces::Span comm_op_span(profiler::Recorder& rec, int32_t stream, traces::CollOp op,
                          const OpLabel& label, std::size_t bytes, int32_t comm,
                          int32_t peer_global, int64_t seq);

}  // namespace orrery::runtime
