// SPDX-License-Identifier: Apache-2.0
// Behaviour 5: poll(peer) checks and drains only that peer's transfers, at a
// cost of that peer's in-flight; poll() drains every peer; finished handles
// are released.
#include <gtest/gtest.h>

#include "agents.h"

namespace kvxfer::unit {
namespace {

using PollTest = LoopbackTest;

TEST_F(PollTest, ScopedPollReportsOnlyThatPeersTransfers) {
  const TransferId to_b = posted("b", {0}, {0});
  (void)posted("c", {1}, {1});
  const PollResult result = poll("b");
  EXPECT_EQ(result.done, ids({to_b}));
  EXPECT_TRUE(result.failed.empty());
  EXPECT_FALSE(result.peer_fault.has_value());
}

TEST_F(PollTest, ScopedPollLeavesOtherPeersCompletionsForTheirOwnPoll) {
  (void)posted("b", {0}, {0});
  const TransferId to_c = posted("c", {1}, {1});
  (void)poll("b");
  EXPECT_EQ(peer("c").inflight, 1u);
  EXPECT_EQ(poll("c").done, ids({to_c}));
}

TEST_F(PollTest, ScopedPollChecksOnlyThatPeersTransfers) {
  plan().hold_next(50);
  for (std::int64_t i = 0; i < 50; ++i) (void)posted("c", {i % 32}, {i % 32});
  const TransferId to_b = posted("b", {0}, {0});

  const std::uint64_t before = plan().check_count();
  EXPECT_EQ(poll("b").done, ids({to_b}));
  EXPECT_EQ(plan().check_count() - before, 1u);
}

TEST_F(PollTest, UnscopedPollReportsEveryPeer) {
  const TransferId to_b = posted("b", {0}, {0});
  const TransferId to_c = posted("c", {1}, {1});
  const PollResult result = poll();
  std::vector<TransferId> done = result.done;
  std::sort(done.begin(), done.end());
  std::vector<TransferId> want{to_b, to_c};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(done, want);
  EXPECT_FALSE(result.peer_fault.has_value());
}

TEST_F(PollTest, DoneTransferIsReportedOnce) {
  const TransferId id = posted("b", {0}, {0});
  EXPECT_EQ(poll("b").done, ids({id}));
  EXPECT_TRUE(poll("b").empty());
  EXPECT_TRUE(poll().empty());
}

TEST_F(PollTest, PollReleasesDoneHandles) {
  (void)posted("b", {0}, {0});
  (void)posted("b", {1}, {1});
  ASSERT_EQ(live().transfers, 2u);
  (void)poll("b");
  EXPECT_EQ(live().transfers, 0u);
  EXPECT_EQ(a.transport.stats().inflight, 0u);
}

TEST_F(PollTest, PollReleasesFailedHandles) {
  const TransferId id = posted("b", {0}, {0});
  plan().finish_with(id, Status::kBackend);
  EXPECT_EQ(poll("b").failed, ids({id}));
  EXPECT_EQ(live().transfers, 0u);
  EXPECT_EQ(a.transport.stats().inflight, 0u);
}

TEST_F(PollTest, PollWithNothingInFlightIsEmpty) {
  EXPECT_EQ(poll(), PollResult{});
  EXPECT_EQ(poll("b"), PollResult{});
  EXPECT_TRUE(poll("b").empty());
}

TEST_F(PollTest, PollOfUnknownPeerIsEmpty) {
  (void)posted("b", {0}, {0});
  EXPECT_EQ(poll("nobody"), PollResult{});
  EXPECT_EQ(peer("b").inflight, 1u);
}

TEST_F(PollTest, PeerStatsCountDoneTransfersAndBytes) {
  (void)posted("b", {0, 1, 2}, {0, 1, 2});
  (void)posted("b", {3}, {3});
  (void)poll("b");
  const PeerStats stats = peer("b");
  EXPECT_EQ(stats.transfers_done, 2u);
  EXPECT_EQ(stats.bytes_done, 4 * kBlockLen);
  EXPECT_EQ(stats.transfers_failed, 0u);
  EXPECT_EQ(stats.inflight, 0u);
}

}  // namespace
}  // namespace kvxfer::unit
