// collective_instances and match_p2p on hand-built spans: exact groups and pairs, with input out of
// order, members missing, sparse sequence numbers, sends without their receive and the options.
#include <gtest/gtest.h>

#include <vector>

#include "orrery/traces/collective_instances.hpp"

namespace orrery::traces {
namespace {

Span coll(int32_t rank, int32_t comm, int64_t seq, int64_t start = 0) {
  Span s;
  s.rank = rank;
  s.kind = SpanKind::Collective;
  s.op = CollOp::AllReduce;
  s.comm = comm;
  s.seq = seq;
  s.start_ns = start;
  s.end_ns = start + 10;
  return s;
}

Span p2p(CollOp op, int32_t rank, int32_t peer, int32_t comm, int64_t start, int64_t bytes = 8,
         int64_t seq = -1) {
  Span s;
  s.rank = rank;
  s.kind = SpanKind::P2P;
  s.op = op;
  s.peer = peer;
  s.comm = comm;
  s.start_ns = start;
  s.end_ns = start + 10;
  s.bytes = bytes;
  s.seq = seq;
  return s;
}

struct Group {
  int32_t comm;
  int64_t seq;
  std::vector<uint32_t> members;
  bool operator==(const Group&) const = default;
};

std::vector<Group> groups(const std::vector<CollectiveInstance>& v) {
  std::vector<Group> out;
  for (const auto& g : v) out.push_back({g.comm, g.seq, g.members});
  return out;
}

std::vector<std::pair<uint32_t, uint32_t>> pairs(const std::vector<P2pMatch>& v) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (const auto& m : v) out.emplace_back(m.send, m.recv);
  return out;
}

TEST(CollectiveInstances, GroupsByCommAndSeqInRankOrder) {
  const std::vector<Span> spans = {
      coll(2, 1, 0),  // 0
      coll(0, 1, 1),  // 1
      coll(1, 0, 0),  // 2
      coll(0, 1, 0),  // 3
      coll(1, 1, 0),  // 4
      coll(0, 0, 0),  // 5
      coll(1, 1, 1),  // 6
      coll(2, 1, 1),  // 7
  };
  const std::vector<Group> want = {{0, 0, {5, 2}}, {1, 0, {3, 4, 0}}, {1, 1, {1, 6, 7}}};
  EXPECT_EQ(groups(collective_instances(spans)), want);
}

TEST(CollectiveInstances, MissingMembersAndOtherSpansAreLeftOut) {
  std::vector<Span> spans = {coll(0, 0, 0), coll(1, 0, 0), coll(0, 0, 1)};
  spans.push_back(coll(1, -1, 1));  // 3: no communicator
  spans.push_back(coll(1, 0, -1));  // 4: no sequence number
  Span compute = coll(1, 0, 1);     // 5: not a collective
  compute.kind = SpanKind::Compute;
  spans.push_back(compute);
  spans.push_back(p2p(CollOp::Send, 0, 1, 0, 0));  // 6
  const std::vector<Group> want = {{0, 0, {0, 1}}, {0, 1, {2}}};
  EXPECT_EQ(groups(collective_instances(spans)), want);

  // Without require_comm, comm -1 forms its own group (before comm 0).
  CollectiveOptions any;
  any.require_comm = false;
  const std::vector<Group> with_none = {{-1, 1, {3}}, {0, 0, {0, 1}}, {0, 1, {2}}};
  EXPECT_EQ(groups(collective_instances(spans, any)), with_none);
}

TEST(CollectiveInstances, SameRankTwiceKeepsSpanOrder) {
  const std::vector<Span> spans = {coll(1, 0, 0, 5), coll(0, 0, 0, 9), coll(1, 0, 0, 1)};
  const std::vector<Group> want = {{0, 0, {1, 0, 2}}};
  EXPECT_EQ(groups(collective_instances(spans)), want);
}

TEST(CollectiveInstances, SparseSequenceNumbersFallBackToASort) {
  const int64_t big = int64_t(1) << 40;
  const std::vector<Span> spans = {coll(1, 0, big), coll(0, 0, 7), coll(0, 0, big),
                                   coll(1, 3, 2),   coll(1, 0, 7), coll(0, 3, 2)};
  const std::vector<Group> want = {{0, 7, {1, 4}}, {0, big, {2, 0}}, {3, 2, {5, 3}}};
  EXPECT_EQ(groups(collective_instances(spans)), want);
}

TEST(CollectiveInstances, FilterDropsMembers) {
  std::vector<Span> spans = {coll(0, 0, 0), coll(1, 0, 0), coll(0, 0, 1), coll(1, 0, 1)};
  spans[2].step = spans[3].step = 1;
  spans[1].step = 1;
  CollectiveOptions opt;
  opt.keep = [](const Span& s) { return s.step >= 1; };
  const std::vector<Group> want = {{0, 0, {1}}, {0, 1, {2, 3}}};
  EXPECT_EQ(groups(collective_instances(spans, opt)), want);
  EXPECT_TRUE(collective_instances({}).empty());
}

TEST(MatchP2p, KthSendMeetsKthReceiveByStart) {
  const std::vector<Span> spans = {
      p2p(CollOp::Recv, 1, 0, 0, 50),  // 0: 1 <- 0, second by start
      p2p(CollOp::Send, 0, 1, 0, 40),  // 1: 0 -> 1, second
      p2p(CollOp::Send, 0, 1, 0, 10),  // 2: 0 -> 1, first
      p2p(CollOp::Recv, 1, 0, 0, 20),  // 3: 1 <- 0, first
      p2p(CollOp::Send, 1, 0, 0, 5),   // 4: 1 -> 0
      p2p(CollOp::Recv, 0, 1, 0, 6),   // 5: 0 <- 1
      p2p(CollOp::Send, 0, 1, 2, 7),   // 6: 0 -> 1 on comm 2: no receive, unmatched
      p2p(CollOp::Send, 0, 1, 0, 90),  // 7: 0 -> 1, third: no third receive
      p2p(CollOp::Recv, 0, 2, 0, 1),   // 8: 0 <- 2: no send
  };
  const std::vector<std::pair<uint32_t, uint32_t>> want = {{2, 3}, {1, 0}, {4, 5}};
  EXPECT_EQ(pairs(match_p2p(spans)), want);
}

TEST(MatchP2p, SpansWithoutPeerOrCommAreLeftOut) {
  std::vector<Span> spans = {p2p(CollOp::Send, 0, 1, -1, 0), p2p(CollOp::Recv, 1, 0, -1, 1),
                             p2p(CollOp::Send, 0, -1, 0, 2), p2p(CollOp::Recv, 1, 0, 0, 3)};
  EXPECT_TRUE(match_p2p(spans).empty());
  P2pOptions any;
  any.require_comm = false;
  const std::vector<std::pair<uint32_t, uint32_t>> want = {{0, 1}};
  EXPECT_EQ(pairs(match_p2p(spans, any)), want);
}

TEST(MatchP2p, OrdersAndBytes) {
  // Two sends 0 -> 1 of different sizes, issued (seq) in the opposite order of their starts, on
  // two streams.
  std::vector<Span> spans = {
      p2p(CollOp::Send, 0, 1, 0, 100, 8, 1),   // 0
      p2p(CollOp::Send, 0, 1, 0, 200, 16, 0),  // 1
      p2p(CollOp::Recv, 1, 0, 0, 110, 8, 1),   // 2
      p2p(CollOp::Recv, 1, 0, 0, 210, 16, 0),  // 3
  };
  spans[0].stream = 1;
  spans[3].stream = 1;
  using Pairs = std::vector<std::pair<uint32_t, uint32_t>>;
  EXPECT_EQ(pairs(match_p2p(spans)), (Pairs{{0, 2}, {1, 3}}));
  P2pOptions seq;
  seq.order = P2pOrder::Seq;
  EXPECT_EQ(pairs(match_p2p(spans, seq)), (Pairs{{1, 3}, {0, 2}}));
  P2pOptions stream;
  stream.order = P2pOrder::Stream;
  EXPECT_EQ(pairs(match_p2p(spans, stream)), (Pairs{{1, 2}, {0, 3}}));
  // By bytes: each size is a flow of its own, sorted by size; with starts reversed on the receiver
  // the sizes still pair up.
  std::swap(spans[2].start_ns, spans[3].start_ns);
  P2pOptions bytes;
  bytes.by_bytes = true;
  EXPECT_EQ(pairs(match_p2p(spans, bytes)), (Pairs{{0, 2}, {1, 3}}));
  EXPECT_EQ(pairs(match_p2p(spans)), (Pairs{{0, 3}, {1, 2}}));
}

TEST(MatchP2p, FilterChangesTheCount) {
  std::vector<Span> spans = {p2p(CollOp::Send, 0, 1, 0, 0), p2p(CollOp::Send, 0, 1, 0, 10),
                             p2p(CollOp::Recv, 1, 0, 0, 15)};
  spans[0].step = -1;  // a warm-up send whose receive the trace lost
  spans[1].step = spans[2].step = 0;
  using Pairs = std::vector<std::pair<uint32_t, uint32_t>>;
  EXPECT_EQ(pairs(match_p2p(spans)), (Pairs{{0, 2}}));
  P2pOptions counted;
  counted.keep = [](const Span& s) { return s.step >= 0; };
  EXPECT_EQ(pairs(match_p2p(spans, counted)), (Pairs{{1, 2}}));
}

}  // namespace
}  // namespace orrery::traces
