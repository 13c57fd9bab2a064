// The all-to-all layout every communicator's all_to_all_v uses (comm.hpp's all_to_all_plan: MPI's
// and NCCL's; the NCCL one runs only on several GPUs, so its device-independent part is checked
// here): per-peer counts and offsets from the (peer, group) counts, and the refusals.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/runtime/comm.hpp"

namespace orrery::runtime {
namespace {

// 3 peers x 2 groups: peer p's blocks are counts[2p], counts[2p+1].
TEST(MoeAllToAllPlan, PerPeerCountsAndOffsetsArePackedPeerByPeer) {
  const std::vector<int64_t> send = {1, 2, 0, 0, 5, 3}, recv = {4, 0, 2, 2, 0, 1};
  const AllToAllPlan p = all_to_all_plan(send.data(), recv.data(), 3, 2, 9, "test");
  EXPECT_EQ(p.send_count, (std::vector<int64_t>{3, 0, 8}));
  EXPECT_EQ(p.send_offset, (std::vector<int64_t>{0, 3, 3}));
  EXPECT_EQ(p.recv_count, (std::vector<int64_t>{4, 4, 1}));
  EXPECT_EQ(p.recv_offset, (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(p.sent, 11);
  EXPECT_EQ(p.received, 9);
}

TEST(MoeAllToAllPlan, MoreThanTheReceiveBufferOrANegativeCountIsRefused) {
  const std::vector<int64_t> send = {1, 1}, recv = {3, 4};
  try {
    all_to_all_plan(send.data(), recv.data(), 2, 1, 6, "all_to_all_v on ep");
    ADD_FAILURE() << "7 elements into a buffer of 6 were accepted";
  } catch (const InternalError& e) {
    EXPECT_EQ(std::string(e.what()),
              "all_to_all_v on ep: more than the receive buffer's 6 elements");
  }
  EXPECT_NO_THROW(all_to_all_plan(send.data(), recv.data(), 2, 1, 7, "exact fit"));
  const std::vector<int64_t> negative = {1, -1};
  EXPECT_THROW(all_to_all_plan(negative.data(), recv.data(), 2, 1, 7, "negative"), InternalError);
}

TEST(MoeAllToAllPlan, NoPeersOrNoGroupsMoveNothing) {
  const AllToAllPlan none = all_to_all_plan(nullptr, nullptr, 0, 2, 0, "none");
  EXPECT_TRUE(none.send_count.empty());
  EXPECT_EQ(none.sent, 0);
  const AllToAllPlan empty = all_to_all_plan(nullptr, nullptr, 2, 0, 0, "empty");
  EXPECT_EQ(empty.recv_count, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(empty.received, 0);
}

}  // namespace
}  // namespace orrery::runtime
