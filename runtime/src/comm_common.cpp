// What every communicator shares (comm.hpp): the completion of an operation, the layout of an
// all_to_all_v, and an operation's trace span.
#include <chrono>

#include "orrery/common/error.hpp"
#include "orrery/model/names.hpp"
#include "orrery/profiler/flight_recorder.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/comm.hpp"

namespace orrery::runtime {

void Completion::complete(std::exception_ptr err) {
  {
    std::lock_guard lock(mu_);
    error_ = std::move(err);
    done_ = true;
  }
  cv_.notify_all();
}

bool Completion::wait_for(double limit_s) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::duration<double>(limit_s), [&] { return done_; }))
    return false;
  if (error_) std::rethrow_exception(error_);
  return true;
}

Handle Communicator::all_to_all_v(const void*, const int64_t*, std::size_t, void*, int64_t*,
                                  std::size_t, DType, const OpLabel&) {
  throw InputError("communicator " + info().name +
                   ": all_to_all_v (expert parallelism, parallel.ep > 1) is not implemented here");
}

AllToAllPlan all_to_all_plan(const int64_t* send_counts, const int64_t* recv_counts,
                             std::size_t peers, std::size_t groups, std::size_t recv_capacity,
                             const std::string& what) {
  AllToAllPlan p;
  for (auto* v : {&p.send_count, &p.send_offset, &p.recv_count, &p.recv_offset})
    v->assign(peers, 0);
  for (std::size_t q = 0; q < peers; ++q) {
    int64_t sc = 0, rc = 0;
    for (std::size_t g = 0; g < groups; ++g) {
      const int64_t s = send_counts[q * groups + g], r = recv_counts[q * groups + g];
      if (s < 0 || r < 0) throw InternalError(what + ": a negative element count");
      sc += s;
      rc += r;
    }
    p.send_offset[q] = p.sent;
    p.recv_offset[q] = p.received;
    p.send_count[q] = sc;
    p.recv_count[q] = rc;
    p.sent += sc;
    p.received += rc;
    if (p.received > static_cast<int64_t>(recv_capacity)) {
      throw InternalError(what + ": more than the receive buffer's " +
                          std::to_string(recv_capacity) + " elements");
    }
  }
  return p;
}

bool Completion::done() const {
  std::lock_guard lock(mu_);
  return done_;
}

int32_t comm_stream_of(traces::CommKind kind, traces::CollOp op) {
  namespace n = model::names;
  if (op == traces::CollOp::AllToAll) return n::kStreamEp;
  switch (kind) {
    case traces::CommKind::TP:
      return n::kStreamTp;
    case traces::CommKind::PP:
      return op == traces::CollOp::Recv ? n::kStreamPpRecv : n::kStreamPpSend;
    default:
      return n::kStreamDp;
  }
}

traces::Span comm_op_span(profiler::Recorder& rec, int32_t stream, traces::CollOp op,
                          const OpLabel& label, std::size_t bytes, int32_t comm,
                          int32_t peer_global, int64_t seq) {
  traces::Span s;
  s.stream = stream;
  s.kind = (op == traces::CollOp::Send || op == traces::CollOp::Recv)
               ? traces::SpanKind::P2P
               : traces::SpanKind::Collective;
  s.name = rec.intern(label.name.empty() ? traces::to_string(op) : label.name);
  s.step = label.step;
  s.micro_batch = label.micro_batch;
  s.layer = label.layer;
  s.bytes = static_cast<int64_t>(bytes);
  s.comm = comm;
  s.peer = peer_global;
  s.seq = seq;
  s.op = op;
  return s;
}

uint64_t schedule_flight_record(int32_t comm, int64_t seq, traces::CollOp op, std::size_t bytes,
                                int32_t dtype, int32_t peer_global, int32_t step) {
  profiler::FlightRecord fr;
  fr.comm = comm;
  fr.seq = seq;
  fr.op = op;
  fr.bytes = static_cast<int64_t>(bytes);
  fr.dtype = dtype;
  fr.peer = peer_global;
  fr.step = step;
  fr.scheduled_ns = profiler::steady_now_ns();
  return profiler::FlightRecorder::instance().scheduled(fr);
}

}  // namespace orrery::runtime
