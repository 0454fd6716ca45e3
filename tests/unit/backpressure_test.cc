// SPDX-License-Identifier: Apache-2.0
// Back-pressure: a peer holds at most kMaxInflightPerPeer transfers in
// flight, and a faulted peer takes none until it is removed. Past either,
// posts return nothing without a strike, and are counted.
#include <gtest/gtest.h>

#include "agents.h"

namespace kvxfer::unit {
namespace {

class BackpressureTest : public LoopbackTest {};

TEST_F(BackpressureTest, APeerAtItsInFlightLimitRefusesPostsWithoutAStrike) {
  plan().hold_next(static_cast<int>(kMaxInflightPerPeer));
  for (std::uint64_t i = 0; i < kMaxInflightPerPeer; ++i) {
    ASSERT_TRUE(write("b", {0}, {0}).has_value()) << i;
  }
  EXPECT_FALSE(write("b", {0}, {0}).has_value());
  EXPECT_FALSE(write("b", {1}, {1}).has_value());
  const PeerStats b_stats = peer("b");
  EXPECT_EQ(b_stats.inflight, kMaxInflightPerPeer);
  EXPECT_EQ(b_stats.posts_refused, 2u);
  EXPECT_EQ(b_stats.post_failures, 0u);
  EXPECT_EQ(b_stats.strikes, 0);
  EXPECT_FALSE(b_stats.fault.has_value());
  // Another peer is not held back.
  const TransferId to_c = posted("c", {2}, {2});
  EXPECT_EQ(poll("c").done, ids({to_c}));
}

TEST_F(BackpressureTest, APeerTakesPostsAgainOnceItsTransfersFinish) {
  plan().hold_next(static_cast<int>(kMaxInflightPerPeer));
  std::vector<TransferId> held;
  for (std::uint64_t i = 0; i < kMaxInflightPerPeer; ++i) held.push_back(posted("b", {0}, {0}));
  ASSERT_FALSE(write("b", {0}, {0}).has_value());
  plan().land(held.front());
  EXPECT_EQ(poll("b").done, ids({held.front()}));
  EXPECT_TRUE(write("b", {0}, {0}).has_value());
  EXPECT_EQ(peer("b").posts_refused, 1u);
}

TEST_F(BackpressureTest, AFaultedPeerTakesNoNewTransfersUntilItIsRemoved) {
  plan().fail_next_posts(Status::kRemoteDisconnect);
  ASSERT_FALSE(write("b", {0}, {0}).has_value());
  ASSERT_TRUE(peer("b").fault.has_value());
  // Refused without being posted: the plan would let these land.
  EXPECT_FALSE(write("b", {1}, {1}).has_value());
  EXPECT_FALSE(a.transport.send_notification("b", std::vector<std::uint8_t>{1}).has_value());
  EXPECT_TRUE(untouched(b));
  const PeerStats b_stats = peer("b");
  EXPECT_EQ(b_stats.post_failures, 1u);
  EXPECT_EQ(b_stats.posts_refused, 2u);
  // A new registration takes transfers again.
  a.transport.remove_remote_peer("b");
  add_peer(a.transport, "b", b.transport);
  const TransferId id = posted("b", {1}, {1});
  EXPECT_EQ(poll("b").done, ids({id}));
  EXPECT_TRUE(landed(b, 1, 1));
}

}  // namespace
}  // namespace kvxfer::unit
