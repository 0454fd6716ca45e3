// SPDX-License-Identifier: Apache-2.0
// Behaviour 8: cancel(kImmediate) forgets transfers at once; cancel(kWait)
// releases only those that can no longer land and returns the rest.
// Cancelling never stops a WRITE already posted.
#include <gtest/gtest.h>

#include "agents.h"

namespace kvxfer::unit {
namespace {

using CancelTest = LoopbackTest;

TEST_F(CancelTest, ImmediateCancelReturnsNothingAndReleasesTheTransfer) {
  plan().hold_next();
  const TransferId id = posted("b", {0}, {0});
  EXPECT_TRUE(cancel({id}, CancelMode::kImmediate).empty());
  EXPECT_EQ(live().transfers, 0u);
  EXPECT_EQ(a.transport.stats().inflight, 0u);
  EXPECT_EQ(peer("b").inflight, 0u);
}

TEST_F(CancelTest, ImmediatelyCancelledTransferIsNeverReported) {
  const TransferId done = posted("b", {0}, {0});
  plan().hold_next();
  const TransferId held = posted("b", {1}, {1});
  (void)cancel({done, held}, CancelMode::kImmediate);
  plan().land(held);
  EXPECT_TRUE(poll("b").empty());
  EXPECT_TRUE(poll().empty());
}

TEST_F(CancelTest, ImmediatelyCancelledWriteStillLands) {
  plan().hold_next();
  const TransferId id = posted("b", {4}, {5});
  (void)cancel({id}, CancelMode::kImmediate);
  // The engine keeps the request a posted WRITE needs until it finishes.
  EXPECT_EQ(live().requests, 1u);
  EXPECT_TRUE(untouched(b));

  plan().land(id);

  EXPECT_TRUE(landed(b, 5, 4));
  EXPECT_EQ(live().requests, 0u);
}

TEST_F(CancelTest, WaitCancelReturnsATransferStillInProgress) {
  plan().hold_next();
  const TransferId id = posted("b", {0}, {0});
  EXPECT_EQ(cancel({id}, CancelMode::kWait), ids({id}));
  EXPECT_EQ(peer("b").inflight, 1u);
  EXPECT_EQ(live().transfers, 1u);
}

TEST_F(CancelTest, TransferKeptByWaitCancelIsReportedWhenItLands) {
  plan().hold_next();
  const TransferId id = posted("b", {0}, {0});
  (void)cancel({id}, CancelMode::kWait);
  plan().land(id);
  EXPECT_EQ(poll("b").done, ids({id}));
  EXPECT_TRUE(landed(b, 0, 0));
}

TEST_F(CancelTest, WaitCancelReleasesADoneTransfer) {
  const TransferId id = posted("b", {0}, {0});
  EXPECT_TRUE(cancel({id}, CancelMode::kWait).empty());
  EXPECT_EQ(live().transfers, 0u);
  EXPECT_TRUE(poll("b").empty());
}

TEST_F(CancelTest, WaitCancelReleasesAFailedTransfer) {
  const TransferId id = posted("b", {0}, {0});
  plan().finish_with(id, Status::kBackend);
  EXPECT_TRUE(cancel({id}, CancelMode::kWait).empty());
  EXPECT_EQ(live().transfers, 0u);
  EXPECT_TRUE(poll("b").empty());
}

TEST_F(CancelTest, WaitCancelCheckErrorFaultsThePeerAndKeepsTheTransfer) {
  const TransferId id = posted("b", {0}, {0});
  plan().fail_checks(id, Status::kBackend);
  EXPECT_EQ(cancel({id}, CancelMode::kWait), ids({id}));
  EXPECT_EQ(live().transfers, 1u);
  const auto fault = poll("b").peer_fault;
  ASSERT_TRUE(fault.has_value());
  EXPECT_NE(fault->find("BACKEND"), std::string::npos) << *fault;
}

TEST_F(CancelTest, WaitCancelRemoteDisconnectCheckErrorDropsTheTransfer) {
  const TransferId id = posted("b", {0}, {0});
  plan().fail_checks(id, Status::kRemoteDisconnect);
  EXPECT_TRUE(cancel({id}, CancelMode::kWait).empty());
  EXPECT_EQ(live().transfers, 0u);
  EXPECT_EQ(peer("b").inflight, 0u);
  const PollResult result = poll("b");
  EXPECT_TRUE(result.failed.empty());
  ASSERT_TRUE(result.peer_fault.has_value());
  EXPECT_NE(result.peer_fault->find("REMOTE_DISCONNECT"), std::string::npos) << *result.peer_fault;
}

TEST_F(CancelTest, WaitCancelKeepsAndReturnsATransferWhoseReleaseFails) {
  const TransferId id = posted("b", {0}, {0});
  plan().fail_next_releases(Status::kBackend);
  EXPECT_EQ(cancel({id}, CancelMode::kWait), ids({id}));
  EXPECT_EQ(live().transfers, 1u);
  EXPECT_EQ(peer("b").inflight, 1u);
  // Still tracked: a later poll drains it.
  EXPECT_EQ(poll("b").done, ids({id}));
  EXPECT_EQ(live().transfers, 0u);
}

TEST_F(CancelTest, CancelIgnoresUnknownIds) {
  const TransferId id = posted("b", {0}, {0});
  EXPECT_TRUE(cancel({id + 1000}, CancelMode::kImmediate).empty());
  EXPECT_TRUE(cancel({id + 1000}, CancelMode::kWait).empty());
  EXPECT_EQ(peer("b").inflight, 1u);
  EXPECT_EQ(poll("b").done, ids({id}));
  // An id already drained is unknown too.
  EXPECT_TRUE(cancel({id}, CancelMode::kWait).empty());
}

TEST_F(CancelTest, CancelLeavesOtherTransfersAlone) {
  const TransferId cancelled = posted("b", {0}, {0});
  const TransferId kept_b = posted("b", {1}, {1});
  const TransferId kept_c = posted("c", {2}, {2});
  (void)cancel({cancelled}, CancelMode::kImmediate);
  EXPECT_EQ(poll("b").done, ids({kept_b}));
  EXPECT_EQ(poll("c").done, ids({kept_c}));
}

}  // namespace
}  // namespace kvxfer::unit
