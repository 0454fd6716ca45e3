// SPDX-License-Identifier: Apache-2.0
// The one judge of peers, decision by decision: a failure is a strike, the
// strike limit faults, peer-scope statuses fault at once, a success clears
// strikes, a failed check faults, a stalled transfer faults, and the first
// cause sticks.
#include "core/peer_policy.h"

#include <gtest/gtest.h>

#include <chrono>
#include <initializer_list>

#include "log_capture.h"

namespace kvxfer::internal {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using TimePoint = std::chrono::steady_clock::time_point;

constexpr std::initializer_list<Status> kEveryStatus = {
    Status::kInProgress,   Status::kSuccess,  Status::kNotPosted,    Status::kInvalidParam,
    Status::kBackend,      Status::kNotFound, Status::kMismatch,     Status::kNotAllowed,
    Status::kRepostActive, Status::kUnknown,  Status::kNotSupported, Status::kRemoteDisconnect,
    Status::kCanceled,     Status::kStalled,
};

class PeerPolicyTest : public ::testing::Test {
 protected:
  PeerPolicy policy{"agent-a", 3, milliseconds(1500)};
  Standing peer;
};

TEST_F(PeerPolicyTest, FailureBelowTheLimitIsOneStrike) {
  policy.record_failure(peer, "b", Status::kBackend, "state BACKEND");
  policy.record_failure(peer, "b", Status::kBackend, "state BACKEND");
  EXPECT_EQ(peer.strikes, 2);
  EXPECT_FALSE(peer.fault.has_value());
}

TEST_F(PeerPolicyTest, FailureReachingTheLimitFaultsNamingCountAndLastCause) {
  policy.record_failure(peer, "b", Status::kBackend, "state BACKEND");
  policy.record_failure(peer, "b", Status::kBackend, "state BACKEND");
  policy.record_failure(peer, "b", Status::kCanceled, "post CANCELED");
  EXPECT_EQ(peer.strikes, 3);
  EXPECT_EQ(peer.fault, "3 consecutive transfer failures (last: post CANCELED)");
}

TEST_F(PeerPolicyTest, StrikeLimitOfOneFaultsOnTheFirstFailure) {
  const PeerPolicy strict{"agent-a", 1, milliseconds(0)};
  strict.record_failure(peer, "b", Status::kBackend, "state BACKEND");
  EXPECT_EQ(peer.fault, "1 consecutive transfer failures (last: state BACKEND)");
}

TEST_F(PeerPolicyTest, RemoteDisconnectFaultsAtOnceWithoutAStrike) {
  policy.record_failure(peer, "b", Status::kRemoteDisconnect, "post REMOTE_DISCONNECT");
  EXPECT_EQ(peer.strikes, 0);
  EXPECT_EQ(peer.fault, "REMOTE_DISCONNECT");
}

TEST_F(PeerPolicyTest, NotFoundFaultsAtOnceWithoutAStrike) {
  policy.record_failure(peer, "b", Status::kNotFound, "state NOT_FOUND");
  EXPECT_EQ(peer.strikes, 0);
  EXPECT_EQ(peer.fault, "NOT_FOUND");
}

TEST_F(PeerPolicyTest, SuccessClearsStrikes) {
  policy.record_failure(peer, "b", Status::kBackend, "state BACKEND");
  policy.record_failure(peer, "b", Status::kBackend, "state BACKEND");
  policy.record_success(peer);
  EXPECT_EQ(peer.strikes, 0);
  policy.record_failure(peer, "b", Status::kBackend, "state BACKEND");
  policy.record_failure(peer, "b", Status::kBackend, "state BACKEND");
  EXPECT_FALSE(peer.fault.has_value());
}

TEST_F(PeerPolicyTest, SuccessDoesNotClearAFault) {
  policy.record_failure(peer, "b", Status::kRemoteDisconnect, "post REMOTE_DISCONNECT");
  policy.record_success(peer);
  EXPECT_EQ(peer.fault, "REMOTE_DISCONNECT");
}

TEST_F(PeerPolicyTest, FirstFaultCauseSticks) {
  policy.set_fault(peer, "b", FaultCause::kStrikeLimit, "first");
  policy.record_failure(peer, "b", Status::kRemoteDisconnect, "post REMOTE_DISCONNECT");
  policy.record_check_failure(peer, "b", Status::kBackend);
  policy.set_fault(peer, "b", FaultCause::kStrikeLimit, "third");
  EXPECT_EQ(peer.fault, "first");
}

TEST_F(PeerPolicyTest, FaultIsLoggedOnceNamingPeerAndCause) {
  unit::LogCapture log;
  policy.set_fault(peer, "b", FaultCause::kStrikeLimit, "first");
  policy.set_fault(peer, "b", FaultCause::kStrikeLimit, "second");
  EXPECT_TRUE(
      log.contains(spdlog::level::warn, {"kvxfer agent-a", "peer=b", "judged unusable", "first"}));
  EXPECT_EQ(log.count(spdlog::level::warn), 1u);
}

TEST_F(PeerPolicyTest, FailedCheckFaultsAtOnceWithoutAStrike) {
  policy.record_check_failure(peer, "b", Status::kBackend);
  EXPECT_EQ(peer.strikes, 0);
  EXPECT_EQ(peer.fault, "state check failed: BACKEND");
}

TEST_F(PeerPolicyTest, FailedCheckWithAPeerScopeStatusFaultsWithItsName) {
  policy.record_check_failure(peer, "b", Status::kRemoteDisconnect);
  EXPECT_EQ(peer.fault, "REMOTE_DISCONNECT");
}

TEST_F(PeerPolicyTest, TransferYoungerThanTheStallTimeoutDoesNotFault) {
  const TimePoint posted{seconds(100)};
  EXPECT_FALSE(policy.check_stall(peer, "b", 7, posted, posted + milliseconds(1499)));
  EXPECT_FALSE(peer.fault.has_value());
}

TEST_F(PeerPolicyTest, TransferAtTheStallTimeoutFaultsItsPeerNamingIt) {
  const TimePoint posted{seconds(100)};
  EXPECT_TRUE(policy.check_stall(peer, "b", 7, posted, posted + milliseconds(1500)));
  EXPECT_EQ(peer.fault, "STALLED: transfer_id=7 in flight for 1.5 s (stall_timeout 1.5 s)");
  EXPECT_EQ(peer.strikes, 0);
}

TEST_F(PeerPolicyTest, StallOfAFaultedPeerKeepsTheFirstCause) {
  policy.set_fault(peer, "b", FaultCause::kStrikeLimit, "first");
  const TimePoint posted{seconds(100)};
  EXPECT_FALSE(policy.check_stall(peer, "b", 7, posted, posted + seconds(60)));
  EXPECT_EQ(peer.fault, "first");
}

TEST_F(PeerPolicyTest, ZeroStallTimeoutNeverFaults) {
  const PeerPolicy unwatched{"agent-a", 3, milliseconds(0)};
  EXPECT_FALSE(unwatched.watches_stalls());
  EXPECT_TRUE(policy.watches_stalls());
  const TimePoint posted{seconds(100)};
  EXPECT_FALSE(unwatched.check_stall(peer, "b", 7, posted, posted + seconds(3600)));
  EXPECT_FALSE(peer.fault.has_value());
}

TEST(StatusScopeTest, OnlyRemoteDisconnectAndNotFoundArePeerScope) {
  for (const Status s : kEveryStatus) {
    EXPECT_EQ(is_peer_scope(s), s == Status::kRemoteDisconnect || s == Status::kNotFound)
        << status_name(s);
  }
}

TEST(StatusScopeTest, OnlyRemoteDisconnectIsATerminalCheckError) {
  for (const Status s : kEveryStatus) {
    EXPECT_EQ(is_terminal_check_error(s), s == Status::kRemoteDisconnect) << status_name(s);
  }
}

}  // namespace
}  // namespace kvxfer::internal
