// LocalCommunicator: the single-rank communicator of a process started without a launcher. Every
// collective over one rank is the identity (copies where the output is another buffer); send/recv
// to oneself are matched in issue order. Nothing is recorded: a one-rank collective moves no data.
#include <cstring>
#include <deque>
#include <mutex>

#include "orrery/common/error.hpp"
#include "orrery/runtime/comm.hpp"

namespace orrery::runtime {
namespace {

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool done() const override { return true; }
};

Handle done_handle() {
  static const auto w = std::make_shared<DoneWork>();
  return Handle(w);
}

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(int32_t id, traces::CommKind kind, std::string name) {
    info_.id = id;
    info_.kind = kind;
    info_.name = std::move(name);
    info_.ranks = {0};
  }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const traces::CommunicatorInfo& info() const override { return info_; }

  Handle all_reduce(void*, size_t, DType, ReduceOp, const OpLabel&) override {
    return done_handle();
  }
  Handle reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp,
                        const OpLabel&) override {
    if (send != recv) std::memmove(recv, send, recv_count * dtype_size(dtype));
    return done_handle();
  }
  Handle all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                    const OpLabel&) override {
    if (send != recv) std::memmove(recv, send, send_count * dtype_size(dtype));
    return done_handle();
  }
  Handle all_to_all_v(const void* send, const int64_t* send_counts, std::size_t groups, void* recv,
                      int64_t* recv_counts, std::size_t recv_capacity, DType dtype,
                      const OpLabel&) override {
    std::size_t total = 0;
    for (std::size_t g = 0; g < groups; ++g) {
      recv_counts[g] = send_counts[g];
      total += static_cast<std::size_t>(send_counts[g]);
    }
    if (total > recv_capacity) {
      throw InternalError("all_to_all_v on " + info_.name + ": " + std::to_string(total) +
                          " elements for a receive buffer of " + std::to_string(recv_capacity));
    }
    if (send != recv && total > 0) std::memmove(recv, send, total * dtype_size(dtype));
    return done_handle();
  }
  Handle broadcast(void*, size_t, DType, int root, const OpLabel&) override {
    check_peer(root);
    return done_handle();
  }
  // A send to oneself is kept until the matching recv (buffered, so the order send-then-recv works
  // without a second thread).
  Handle send(const void* data, size_t count, DType dtype, int peer, const OpLabel&) override {
    check_peer(peer);
    const auto* p = static_cast<const uint8_t*>(data);
    std::lock_guard lock(mu_);
    pending_.emplace_back(p, p + count * dtype_size(dtype));
    return done_handle();
  }
  Handle recv(void* data, size_t count, DType dtype, int peer, const OpLabel&) override {
    check_peer(peer);
    std::lock_guard lock(mu_);
    if (pending_.empty()) {
      throw InternalError("local communicator: recv from self with no matching send issued before");
    }
    auto msg = std::move(pending_.front());
    pending_.pop_front();
    if (msg.size() != count * dtype_size(dtype)) {
      throw InternalError("local communicator: recv size differs from the matching send");
    }
    std::memcpy(data, msg.data(), msg.size());
    return done_handle();
  }
  Handle barrier(const OpLabel&) override { return done_handle(); }
  void synchronize() override {}
  std::unique_ptr<Communicator> split(int, int, traces::CommKind kind,
                                      const std::string& name) override {
    return std::make_unique<LocalCommunicator>(++splits_, kind, name);
  }
  void set_recorder(profiler::Recorder*) override {}
  [[noreturn]] void abort(int code) override { std::_Exit(code); }

 private:
  void check_peer(int peer) const {
    if (peer != 0)
      throw InternalError("local communicator: peer " + std::to_string(peer) + " of 1 rank");
  }
  traces::CommunicatorInfo info_;
  int32_t splits_ = 0;
  std::mutex mu_;
  std::deque<std::vector<uint8_t>> pending_;
};

}  // namespace

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::F64:
    case DType::I64:
      return 8;
    case DType::U8:
      return 1;
    case DType::BF16:
    case DType::F16:
      return 2;
  }
  return 1;
}

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>(0, traces::CommKind::World, "world");
}

}  // namespace orrery::runtime
