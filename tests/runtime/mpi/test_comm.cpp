// The MPI communicator on 2 and 4 ranks: every collective against its closed form, point-to-point in
// both directions at once, sub-communicators, many operations in flight, and the spans recorded.
// Collectives come first in each test and assertions after, so a failing rank never leaves the
// others waiting.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <numeric>
#include <set>
#include <vector>

#include "mpi_env.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::runtime {
namespace {

using testing::world;

TEST(MpiComm, WorldIsTheLaunchersWorld) {
  ASSERT_TRUE(started_by_launcher());
  EXPECT_EQ(world().size(), launcher_world_size());
  EXPECT_EQ(world().rank(), launcher_world_rank());
  EXPECT_EQ(world().id(), 0);
  EXPECT_EQ(world().info().ranks.size(), static_cast<size_t>(world().size()));
}

TEST(MpiComm, AllReduceSumAvgMaxMin) {
  const int n = world().size(), r = world().rank();
  const size_t count = 1000;
  std::vector<float> sum(count), avg(count);
  std::vector<double> mx(count), mn(count);
  for (size_t i = 0; i < count; ++i) {
    sum[i] = avg[i] = static_cast<float>(r + i);
    mx[i] = mn[i] = static_cast<double>(r) * (i % 2 ? 1 : -1);
  }
  auto h1 = world().all_reduce(sum.data(), count, DType::F32, ReduceOp::Sum);
  auto h2 = world().all_reduce(avg.data(), count, DType::F32, ReduceOp::Avg);
  auto h3 = world().all_reduce(mx.data(), count, DType::F64, ReduceOp::Max);
  auto h4 = world().all_reduce(mn.data(), count, DType::F64, ReduceOp::Min);
  h4.wait();  // completion is in issue order, so the others are done too
  EXPECT_TRUE(h1.done() && h2.done() && h3.done());
  h1.wait();
  h2.wait();
  h3.wait();
  const double ranks_sum = n * (n - 1) / 2.0;
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(sum[i], static_cast<float>(n * i + ranks_sum)) << i;
    ASSERT_FLOAT_EQ(avg[i], static_cast<float>(i + ranks_sum / n)) << i;
    ASSERT_EQ(mx[i], i % 2 ? n - 1 : 0.0) << i;
    ASSERT_EQ(mn[i], i % 2 ? 0.0 : -(n - 1.0)) << i;
  }
}

TEST(MpiComm, ReduceScatterAllGatherBroadcast) {
  const int n = world().size(), r = world().rank();
  const size_t block = 7;
  std::vector<int64_t> send(block * n), rs(block);
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<int64_t>(i) * (r + 1);
  world().reduce_scatter(send.data(), rs.data(), block, DType::I64, ReduceOp::Sum).wait();

  std::vector<int32_t> mine(block), gathered(block * n);
  for (size_t i = 0; i < block; ++i) mine[i] = 100 * r + static_cast<int32_t>(i);
  world().all_gather(mine.data(), gathered.data(), block, DType::I32).wait();

  // In place: this rank's block of the output is the input.
  std::vector<int32_t> inplace(block * n, -1);
  for (size_t i = 0; i < block; ++i) inplace[r * block + i] = 100 * r + static_cast<int32_t>(i);
  world().all_gather(inplace.data() + r * block, inplace.data(), block, DType::I32).wait();

  const int root = n - 1;
  std::vector<double> b(5, r == root ? 3.25 : 0.0);
  world().broadcast(b.data(), b.size(), DType::F64, root).wait();

  const int64_t rank_factor = n * (n + 1) / 2;  // sum of (q + 1) over ranks q
  for (size_t i = 0; i < block; ++i) {
    EXPECT_EQ(rs[i], static_cast<int64_t>(r * block + i) * rank_factor) << i;
  }
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < block; ++i) {
      EXPECT_EQ(gathered[q * block + i], 100 * q + static_cast<int32_t>(i));
      EXPECT_EQ(inplace[q * block + i], 100 * q + static_cast<int32_t>(i));
    }
  }
  for (double x : b) EXPECT_EQ(x, 3.25);
}

TEST(MpiComm, SendRecvBothDirectionsAtOnce) {
  // Every rank sends a large message to both neighbours before receiving: with blocking sends this
  // deadlocks; posted non-blocking on the communication thread it must not.
  const int n = world().size(), r = world().rank();
  const size_t count = 1 << 20;  // 4 MiB, above any eager limit
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<float> to_next(count, static_cast<float>(r)), to_prev(count, static_cast<float>(-r));
  std::vector<float> from_prev(count, -1), from_next(count, -1);
  auto s1 = world().send(to_next.data(), count, DType::F32, next);
  auto s2 = world().send(to_prev.data(), count, DType::F32, prev);
  auto r1 = world().recv(from_prev.data(), count, DType::F32, prev);
  auto r2 = world().recv(from_next.data(), count, DType::F32, next);
  s1.wait();
  s2.wait();
  r1.wait();
  r2.wait();
  world().synchronize();
  if (n == 2) {
    // prev == next: messages between one pair match in issue order.
    EXPECT_EQ(from_prev[0], static_cast<float>(prev));
    EXPECT_EQ(from_next[count - 1], static_cast<float>(-next));
  } else {
    EXPECT_EQ(from_prev[0], static_cast<float>(prev));
    EXPECT_EQ(from_prev[count - 1], static_cast<float>(prev));
    EXPECT_EQ(from_next[0], static_cast<float>(-next));
  }
}

TEST(MpiComm, SplitIntoGroups) {
  const int n = world().size(), r = world().rank();
  // Two groups: even and odd world ranks, ordered by descending world rank.
  auto sub = world().split(r % 2, -r, traces::CommKind::DP, r % 2 ? "odd" : "even");
  ASSERT_NE(sub, nullptr);
  int32_t value = r;
  sub->all_reduce(&value, 1, DType::I32, ReduceOp::Sum).wait();
  // Every rank learns every rank's sub-communicator id.
  std::vector<int32_t> ids(n);
  int32_t my_id = sub->id();
  world().all_gather(&my_id, ids.data(), 1, DType::I32).wait();
  // A rank that opts out gets no communicator.
  auto none = world().split(r == 0 ? 0 : -1, 0, traces::CommKind::Other, "only0");

  int expect_sum = 0, expect_size = 0;
  for (int q = r % 2; q < n; q += 2) {
    expect_sum += q;
    ++expect_size;
  }
  EXPECT_EQ(sub->size(), expect_size);
  EXPECT_EQ(value, expect_sum);
  EXPECT_EQ(sub->info().kind, traces::CommKind::DP);
  // Ordered by key = -rank: the highest world rank of the group is rank 0 of the sub-communicator.
  const auto& members = sub->info().ranks;
  ASSERT_EQ(members.size(), static_cast<size_t>(expect_size));
  for (size_t i = 1; i < members.size(); ++i) EXPECT_GT(members[i - 1], members[i]);
  EXPECT_EQ(sub->global_rank(sub->rank()), r);
  for (int q = 0; q < n; ++q) {
    EXPECT_NE(ids[q], 0) << "a sub-communicator has the world's id";
    if (q % 2 == r % 2) {
      EXPECT_EQ(ids[q], my_id);
    } else {
      EXPECT_NE(ids[q], my_id);
    }
  }
  EXPECT_EQ(none == nullptr, r != 0);
}

TEST(MpiComm, ManyOperationsInFlight) {
  const int n = world().size();
  const int ops = 64;
  std::vector<std::vector<float>> bufs(ops, std::vector<float>(257));
  std::vector<Handle> hs;
  for (int k = 0; k < ops; ++k) {
    std::fill(bufs[k].begin(), bufs[k].end(), static_cast<float>(k));
    hs.push_back(world().all_reduce(bufs[k].data(), bufs[k].size(), DType::F32, ReduceOp::Sum));
  }
  for (auto& h : hs) h.wait();
  for (int k = 0; k < ops; ++k) {
    EXPECT_EQ(bufs[k][0], static_cast<float>(k * n));
    EXPECT_EQ(bufs[k][256], static_cast<float>(k * n));
  }
}

TEST(MpiComm, OperationsAreRecordedAsSpans) {
  const int n = world().size(), r = world().rank();
  const std::string path = ::testing::TempDir() + "orrery_mpi_comm_" + std::to_string(::getppid()) +
                           "_rank" + std::to_string(r) + ".db";
  {
    traces::TraceWriter writer(path);
    profiler::Recorder rec(&writer, r);
    world().set_recorder(&rec);
    auto sub = world().split(0, r, traces::CommKind::DP, "dp");
    std::vector<float> buf(1024, 1.0f);
    std::vector<float> gathered(1024 * n);
    world().all_reduce(buf.data(), buf.size(), DType::F32, ReduceOp::Sum,
                       OpLabel{"grads", 3, 1, 2}).wait();
    sub->all_reduce(buf.data(), 10, DType::F32, ReduceOp::Sum).wait();
    world().all_gather(buf.data(), gathered.data(), buf.size(), DType::F32).wait();
    world().barrier().wait();
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    world().send(buf.data(), 16, DType::F32, next).wait();
    world().recv(buf.data(), 16, DType::F32, prev).wait();
    world().synchronize();
    world().set_recorder(nullptr);
    rec.flush();
    writer.close();
  }
  traces::Trace t = traces::load_trace(path);
  std::remove(path.c_str());
  std::vector<traces::Span> spans = t.spans;
  std::sort(spans.begin(), spans.end(),
            [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  ASSERT_EQ(spans.size(), 6u);
  for (const auto& s : spans) {
    EXPECT_EQ(s.rank, r);
    EXPECT_EQ(s.stream, profiler::kCommStream);
    EXPECT_LE(s.start_ns, s.end_ns);
  }
  EXPECT_EQ(t.name_of(spans[0]), "grads");
  EXPECT_EQ(spans[0].op, traces::CollOp::AllReduce);
  EXPECT_EQ(spans[0].kind, traces::SpanKind::Collective);
  EXPECT_EQ(spans[0].bytes, 4096);
  EXPECT_EQ(spans[0].step, 3);
  EXPECT_EQ(spans[0].micro_batch, 1);
  EXPECT_EQ(spans[0].layer, 2);
  EXPECT_EQ(spans[0].comm, 0);
  EXPECT_EQ(t.name_of(spans[1]), "all_reduce");
  EXPECT_NE(spans[1].comm, 0);
  EXPECT_EQ(spans[1].seq, 0);  // the first operation of the new communicator
  EXPECT_EQ(spans[1].bytes, 40);
  EXPECT_EQ(spans[2].op, traces::CollOp::AllGather);
  EXPECT_EQ(spans[2].bytes, 4096 * n);  // nccl-tests' size: the gathered total
  EXPECT_EQ(spans[2].seq, spans[0].seq + 1);
  EXPECT_EQ(spans[3].op, traces::CollOp::Barrier);
  EXPECT_EQ(spans[3].seq, spans[0].seq + 2);
  // Send and receive are posted together and may complete in either order.
  std::set<traces::CollOp> p2p{spans[4].op, spans[5].op};
  EXPECT_EQ(p2p, (std::set<traces::CollOp>{traces::CollOp::Send, traces::CollOp::Recv}));
  for (int i = 4; i < 6; ++i) {
    EXPECT_EQ(spans[i].kind, traces::SpanKind::P2P);
    EXPECT_EQ(spans[i].bytes, 64);
    EXPECT_EQ(spans[i].peer, spans[i].op == traces::CollOp::Send ? (r + 1) % n : (r + n - 1) % n);
  }
  // The communicators made it into the trace, the dp group with its members.
  bool found_dp = false;
  for (const auto& c : t.comms) {
    if (c.kind == traces::CommKind::DP) {
      found_dp = true;
      EXPECT_EQ(c.ranks.size(), static_cast<size_t>(n));
    }
  }
  EXPECT_TRUE(found_dp);
}

}  // namespace
}  // namespace orrery::runtime
