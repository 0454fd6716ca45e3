// SPDX-License-Identifier: Apache-2.0
// Behaviour 6: done -> done, in progress -> stays, any other state -> failed.
// A state check that itself fails faults the peer once; only a remote
// disconnect ends the transfer, because any other check error says nothing
// about a WRITE that may still be landing.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include "agents.h"
#include "log_capture.h"

namespace kvxfer::unit {
namespace {

using StateTest = LoopbackTest;

TEST_F(StateTest, DoneStateIsReportedDone) {
  const TransferId id = posted("b", {0}, {0});
  const PollResult result = poll("b");
  EXPECT_EQ(result.done, ids({id}));
  EXPECT_TRUE(result.failed.empty());
}

TEST_F(StateTest, InProgressTransferStaysInFlightUntilItLands) {
  plan().hold_next();
  const TransferId id = posted("b", {2}, {3});
  EXPECT_TRUE(poll("b").empty());
  EXPECT_EQ(peer("b").inflight, 1u);
  EXPECT_EQ(live().transfers, 1u);
  EXPECT_TRUE(untouched(b));

  plan().land(id);

  EXPECT_TRUE(landed(b, 3, 2));
  EXPECT_EQ(poll("b").done, ids({id}));
}

TEST_F(StateTest, FailedStateIsReportedFailed) {
  const TransferId id = posted("b", {0}, {0});
  plan().finish_with(id, Status::kBackend);
  const PollResult result = poll("b");
  EXPECT_EQ(result.failed, ids({id}));
  EXPECT_TRUE(result.done.empty());
  EXPECT_EQ(peer("b").transfers_failed, 1u);
}

TEST_F(StateTest, EveryStateOtherThanDoneOrInProgressIsFailed) {
  const std::vector<Status> states{Status::kNotPosted, Status::kInvalidParam, Status::kBackend,
                                   Status::kMismatch,  Status::kNotAllowed,   Status::kRepostActive,
                                   Status::kUnknown,   Status::kNotSupported, Status::kCanceled,
                                   Status::kStalled};
  // All posted first: the strikes fault the peer partway, and a faulted peer
  // takes no new transfers.
  std::vector<TransferId> posted_ids;
  plan().hold_next(static_cast<int>(states.size()));
  for (std::size_t i = 0; i < states.size(); ++i) {
    posted_ids.push_back(posted("b", {static_cast<std::int64_t>(i % 8)}, {0}));
  }
  for (std::size_t i = 0; i < states.size(); ++i) {
    plan().finish_with(posted_ids[i], states[i]);
    EXPECT_EQ(poll("b").failed, ids({posted_ids[i]})) << status_name(states[i]);
  }
}

TEST_F(StateTest, CheckErrorFaultsThePeer) {
  const TransferId id = posted("b", {0}, {0});
  plan().fail_checks(id, Status::kBackend);
  const auto fault = poll("b").peer_fault;
  ASSERT_TRUE(fault.has_value());
  EXPECT_NE(fault->find("BACKEND"), std::string::npos) << *fault;
  EXPECT_FALSE(peer("c").fault.has_value());
}

TEST_F(StateTest, CheckErrorKeepsTheTransferInFlight) {
  const TransferId id = posted("b", {0}, {0});
  plan().fail_checks(id, Status::kBackend);
  const PollResult result = poll("b");
  EXPECT_TRUE(result.done.empty());
  EXPECT_TRUE(result.failed.empty());
  EXPECT_EQ(peer("b").inflight, 1u);
  EXPECT_EQ(live().transfers, 1u);
}

TEST_F(StateTest, NotFoundCheckErrorKeepsTheTransferInFlight) {
  // The peer-scope NOT_FOUND still says nothing about the WRITE itself.
  const TransferId id = posted("b", {0}, {0});
  plan().fail_checks(id, Status::kNotFound);
  const PollResult result = poll("b");
  EXPECT_TRUE(result.done.empty());
  EXPECT_TRUE(result.failed.empty());
  ASSERT_TRUE(result.peer_fault.has_value());
  EXPECT_NE(result.peer_fault->find("NOT_FOUND"), std::string::npos) << *result.peer_fault;
  EXPECT_EQ(peer("b").inflight, 1u);
}

TEST_F(StateTest, TransferKeptAfterACheckErrorIsReportedOnceItsCheckRecovers) {
  const TransferId id = posted("b", {0}, {0});
  plan().fail_checks(id, Status::kBackend);
  (void)poll("b");
  plan().clear_check_error(id);
  EXPECT_EQ(poll("b").done, ids({id}));
  EXPECT_EQ(live().transfers, 0u);
}

TEST_F(StateTest, RepeatedCheckErrorChargesThePeerOnce) {
  // A struck transfer that later fails adds no strike on top of the fault.
  const TransferId id = posted("b", {0}, {0});
  plan().fail_checks(id, Status::kBackend);
  (void)poll("b");
  (void)poll("b");
  plan().clear_check_error(id);
  plan().finish_with(id, Status::kBackend);
  EXPECT_EQ(poll("b").failed, ids({id}));
  EXPECT_EQ(peer("b").strikes, 0);
}

TEST_F(StateTest, RepeatedCheckErrorWarnsOnceThenLogsAtDebug) {
  const TransferId id = posted("b", {0}, {0});
  plan().fail_checks(id, Status::kBackend);
  LogCapture log;
  (void)poll("b");
  EXPECT_GE(log.count(spdlog::level::warn), 1u);
  log.clear();
  (void)poll("b");
  (void)poll("b");
  EXPECT_EQ(log.count(spdlog::level::warn), 0u);
  EXPECT_GE(log.count(spdlog::level::debug), 2u);
}

TEST_F(StateTest, RemoteDisconnectCheckErrorEndsTheTransfer) {
  const TransferId id = posted("b", {0}, {0});
  plan().fail_checks(id, Status::kRemoteDisconnect);
  const PollResult result = poll("b");
  EXPECT_EQ(result.failed, ids({id}));
  ASSERT_TRUE(result.peer_fault.has_value());
  EXPECT_NE(result.peer_fault->find("REMOTE_DISCONNECT"), std::string::npos) << *result.peer_fault;
  EXPECT_EQ(live().transfers, 0u);
  EXPECT_EQ(peer("b").inflight, 0u);
}

TEST_F(StateTest, TransfersOfADisconnectedPeerFailAtTheirNextCheck) {
  plan().hold_next();
  const TransferId held = posted("b", {0}, {0});
  const TransferId done = posted("b", {1}, {1});
  plan().disconnect("agent-b");
  const PollResult result = poll("b");
  std::vector<TransferId> failed = result.failed;
  std::sort(failed.begin(), failed.end());
  EXPECT_EQ(failed, (std::vector<TransferId>{std::min(held, done), std::max(held, done)}));
  EXPECT_TRUE(result.done.empty());
  ASSERT_TRUE(result.peer_fault.has_value());
  EXPECT_NE(result.peer_fault->find("REMOTE_DISCONNECT"), std::string::npos);
  EXPECT_EQ(live().transfers, 0u);
}

TEST_F(StateTest, TransfersToAClosedTargetFailWithRemoteDisconnect) {
  const TransferId id = posted("b", {0}, {0});
  b.transport.close();
  const PollResult result = poll("b");
  EXPECT_EQ(result.failed, ids({id}));
  ASSERT_TRUE(result.peer_fault.has_value());
  EXPECT_NE(result.peer_fault->find("REMOTE_DISCONNECT"), std::string::npos);
}

}  // namespace
}  // namespace kvxfer::unit
