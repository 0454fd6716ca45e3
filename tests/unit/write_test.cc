// SPDX-License-Identifier: Apache-2.0
// Behaviour 4: write_blocks copies each local block to its remote block; an
// unknown peer or a failed post returns nothing, and a failed post counts
// against the peer.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <set>

#include "agents.h"
#include "log_capture.h"

namespace kvxfer::unit {
namespace {

using WriteTest = LoopbackTest;

TEST_F(WriteTest, WriteCopiesEachLocalBlockToItsRemoteBlock) {
  const auto id = write("b", {0, 5, 2, 31}, {9, 1, 30, 4});
  ASSERT_TRUE(id.has_value());
  EXPECT_TRUE(landed(b, 9, 0));
  EXPECT_TRUE(landed(b, 1, 5));
  EXPECT_TRUE(landed(b, 30, 2));
  EXPECT_TRUE(landed(b, 4, 31));
}

TEST_F(WriteTest, WriteTouchesNoOtherBlock) {
  ASSERT_TRUE(write("b", {3}, {7}).has_value());
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(kNumBlocks); ++i) {
    if (i != 7) {
      EXPECT_TRUE(b.pool.block_all(i, 0)) << "block " << i;
    }
  }
  EXPECT_TRUE(untouched(c));
}

TEST_F(WriteTest, WriteWithInt32IndicesCopiesTheSameBlocks) {
  const std::vector<std::int32_t> local{6, 7};
  const std::vector<std::int32_t> remote{11, 12};
  const auto id = a.transport.write_blocks("b", std::span<const std::int32_t>(local),
                                           std::span<const std::int32_t>(remote));
  ASSERT_TRUE(id.has_value());
  EXPECT_TRUE(landed(b, 11, 6));
  EXPECT_TRUE(landed(b, 12, 7));
  EXPECT_EQ(poll("b").done, ids({*id}));
}

TEST_F(WriteTest, TransferIdsAreUniqueAcrossWritesAndPeers) {
  std::set<TransferId> seen;
  for (int i = 0; i < 100; ++i) {
    const std::int64_t block = i % 32;
    seen.insert(posted(i % 2 == 0 ? "b" : "c", {block}, {block}));
    if (i % 10 == 0) (void)poll();  // drained ids must not come back either
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST_F(WriteTest, WriteToUnknownPeerReturnsNothing) {
  EXPECT_FALSE(write("zulu", {0}, {0}).has_value());
  EXPECT_TRUE(untouched(b));
  EXPECT_TRUE(untouched(c));
  EXPECT_EQ(a.transport.stats().inflight, 0u);
  EXPECT_EQ(live().transfers, 0u);
}

TEST_F(WriteTest, WriteToUnknownPeerWarnsNamingTheKnownPeers) {
  Agent d{"agent-d"};
  add_peer(a.transport, "peer-bravo", d.transport);
  LogCapture log;
  ASSERT_FALSE(write("peer-zulu", {0}, {0}).has_value());
  EXPECT_TRUE(log.contains(spdlog::level::warn, {"peer-zulu", "peer-bravo"}));
}

TEST_F(WriteTest, FailedPostReturnsNothingAndWritesNothing) {
  plan().fail_next_posts(Status::kBackend);
  EXPECT_FALSE(write("b", {0}, {0}).has_value());
  EXPECT_TRUE(untouched(b));
}

TEST_F(WriteTest, FailedPostLeavesNoTransferBehind) {
  plan().fail_next_posts(Status::kBackend);
  ASSERT_FALSE(write("b", {0}, {0}).has_value());
  EXPECT_EQ(live().transfers, 0u);
  EXPECT_EQ(live().requests, 0u);
  EXPECT_EQ(a.transport.stats().inflight, 0u);
  EXPECT_TRUE(poll().empty());
}

TEST_F(WriteTest, FailedPostCountsOneStrikeAgainstThePeer) {
  plan().fail_next_posts(Status::kBackend);
  ASSERT_FALSE(write("b", {0}, {0}).has_value());
  const PeerStats stats = peer("b");
  EXPECT_EQ(stats.post_failures, 1u);
  EXPECT_EQ(stats.strikes, 1);
  EXPECT_FALSE(stats.fault.has_value());
  EXPECT_EQ(peer("c").strikes, 0);
}

TEST_F(WriteTest, PostFailingWithRemoteDisconnectFaultsThePeerAtOnce) {
  plan().fail_next_posts(Status::kRemoteDisconnect);
  ASSERT_FALSE(write("b", {0}, {0}).has_value());
  const auto fault = poll("b").peer_fault;
  ASSERT_TRUE(fault.has_value());
  EXPECT_NE(fault->find("REMOTE_DISCONNECT"), std::string::npos) << *fault;
}

TEST_F(WriteTest, PostFailingWithNotFoundFaultsThePeerAtOnce) {
  plan().fail_next_posts(Status::kNotFound);
  ASSERT_FALSE(write("b", {0}, {0}).has_value());
  const auto fault = poll("b").peer_fault;
  ASSERT_TRUE(fault.has_value());
  EXPECT_NE(fault->find("NOT_FOUND"), std::string::npos) << *fault;
}

TEST_F(WriteTest, WriteToDisconnectedPeerFailsAndFaultsIt) {
  plan().disconnect("agent-b");
  EXPECT_FALSE(write("b", {0}, {0}).has_value());
  EXPECT_TRUE(untouched(b));
  const auto fault = poll("b").peer_fault;
  ASSERT_TRUE(fault.has_value());
  EXPECT_NE(fault->find("REMOTE_DISCONNECT"), std::string::npos) << *fault;
  // Other peers are unaffected.
  EXPECT_TRUE(write("c", {0}, {0}).has_value());
}

TEST_F(WriteTest, WriteToClosedTargetNeverTouchesItsPool) {
  b.transport.close();
  b.pool.fill(0xEE);  // the memory is the owner's again
  EXPECT_FALSE(write("b", {0, 1}, {0, 1}).has_value());
  EXPECT_TRUE(b.pool.all(0xEE));
  const auto fault = poll("b").peer_fault;
  ASSERT_TRUE(fault.has_value());
  EXPECT_NE(fault->find("REMOTE_DISCONNECT"), std::string::npos) << *fault;
}

}  // namespace
}  // namespace kvxfer::unit
