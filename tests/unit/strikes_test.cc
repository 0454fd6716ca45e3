// SPDX-License-Identifier: Apache-2.0
// Behaviour 7: a transfer failure is one strike, a success in the same poll
// batch clears the peer's strikes, the strike limit faults the peer;
// peer-scope failures fault it at once; the first fault cause sticks.
#include <gtest/gtest.h>

#include "agents.h"

namespace kvxfer::unit {
namespace {

class StrikesTest : public LoopbackTest {
 protected:
  // One transfer to `peer_id` that finishes in the failed state `state`,
  // drained by a scoped poll.
  void fail_one(const std::string& peer_id, Status state = Status::kBackend) {
    const TransferId id = posted(peer_id, {0}, {0});
    plan().finish_with(id, state);
    ASSERT_EQ(poll(peer_id).failed, ids({id}));
  }
};

TEST_F(StrikesTest, TransferFailureIsOneStrike) {
  fail_one("b");
  EXPECT_EQ(peer("b").strikes, 1);
  EXPECT_FALSE(peer("b").fault.has_value());
}

TEST_F(StrikesTest, FailuresBelowTheStrikeLimitDoNotFault) {
  fail_one("b");
  fail_one("b");
  EXPECT_EQ(peer("b").strikes, 2);
  EXPECT_FALSE(poll("b").peer_fault.has_value());
}

TEST_F(StrikesTest, StrikeLimitFaultsThePeerNamingTheLastFailure) {
  fail_one("b");
  fail_one("b");
  fail_one("b");
  const auto fault = poll("b").peer_fault;
  ASSERT_TRUE(fault.has_value());
  EXPECT_NE(fault->find("3 consecutive transfer failures (last: "), std::string::npos) << *fault;
  EXPECT_NE(fault->find("BACKEND"), std::string::npos) << *fault;
}

TEST_F(StrikesTest, PostFailuresCountTowardsTheStrikeLimit) {
  plan().fail_next_posts(Status::kBackend, 3);
  for (int i = 0; i < 3; ++i) ASSERT_FALSE(write("b", {0}, {0}).has_value());
  const auto fault = poll("b").peer_fault;
  ASSERT_TRUE(fault.has_value());
  EXPECT_NE(fault->find("3 consecutive transfer failures"), std::string::npos) << *fault;
}

TEST_F(StrikesTest, SuccessInTheSamePollBatchClearsStrikes) {
  fail_one("b");
  fail_one("b");
  const TransferId failing = posted("b", {0}, {0});
  const TransferId succeeding = posted("b", {1}, {1});
  plan().finish_with(failing, Status::kBackend);

  const PollResult result = poll("b");

  EXPECT_EQ(result.failed, ids({failing}));
  EXPECT_EQ(result.done, ids({succeeding}));
  // The success sits "between" the earlier failures and this one.
  EXPECT_EQ(peer("b").strikes, 1);
  EXPECT_FALSE(result.peer_fault.has_value());
}

TEST_F(StrikesTest, SuccessBeforeTheFailureInTheSameBatchStillClearsStrikes) {
  fail_one("b");
  fail_one("b");
  const TransferId succeeding = posted("b", {1}, {1});
  const TransferId failing = posted("b", {0}, {0});
  plan().finish_with(failing, Status::kBackend);
  const PollResult result = poll("b");
  EXPECT_EQ(result.done, ids({succeeding}));
  EXPECT_EQ(peer("b").strikes, 1);
  EXPECT_FALSE(result.peer_fault.has_value());
}

TEST_F(StrikesTest, SuccessInALaterPollClearsStrikes) {
  fail_one("b");
  fail_one("b");
  (void)posted("b", {1}, {1});
  (void)poll("b");
  EXPECT_EQ(peer("b").strikes, 0);
  fail_one("b");
  fail_one("b");
  EXPECT_FALSE(poll("b").peer_fault.has_value());
}

TEST_F(StrikesTest, SuccessOfAnotherPeerDoesNotClearStrikes) {
  fail_one("b");
  fail_one("b");
  const TransferId failing = posted("b", {0}, {0});
  plan().finish_with(failing, Status::kBackend);
  (void)posted("c", {1}, {1});
  (void)poll();  // one batch holding c's success and b's failure
  EXPECT_TRUE(peer("b").fault.has_value());
  EXPECT_EQ(peer("c").strikes, 0);
}

TEST_F(StrikesTest, StrikesAreCountedPerPeer) {
  fail_one("b");
  fail_one("b");
  fail_one("c");
  EXPECT_EQ(peer("b").strikes, 2);
  EXPECT_EQ(peer("c").strikes, 1);
}

TEST(StrikeLimitTest, StrikeLimitIsConfigurable) {
  Agent b{"agent-b"};
  Agent a{"agent-a", loopback_options(5)};
  add_peer(a.transport, "b", b.transport);
  for (int i = 0; i < 5; ++i) {
    const auto id = write(a.transport, "b", {0}, {0});
    ASSERT_TRUE(id.has_value());
    a.plan().finish_with(*id, Status::kBackend);
    const PollResult result = a.transport.poll("b");
    if (i < 4) {
      EXPECT_FALSE(result.peer_fault.has_value()) << "after " << i + 1 << " failures";
    } else {
      ASSERT_TRUE(result.peer_fault.has_value());
      EXPECT_NE(result.peer_fault->find("5 consecutive transfer failures"), std::string::npos)
          << *result.peer_fault;
    }
  }
}

TEST_F(StrikesTest, RemoteDisconnectFailedStateFaultsThePeerAtOnce) {
  fail_one("b", Status::kRemoteDisconnect);
  const auto fault = poll("b").peer_fault;
  ASSERT_TRUE(fault.has_value());
  EXPECT_NE(fault->find("REMOTE_DISCONNECT"), std::string::npos) << *fault;
}

TEST_F(StrikesTest, NotFoundFailedStateFaultsThePeerAtOnce) {
  fail_one("b", Status::kNotFound);
  const auto fault = poll("b").peer_fault;
  ASSERT_TRUE(fault.has_value());
  EXPECT_NE(fault->find("NOT_FOUND"), std::string::npos) << *fault;
}

TEST_F(StrikesTest, FirstFaultCauseSticks) {
  // Posted before the first fault (a faulted peer takes no new transfers),
  // failing one by one after it.
  const std::vector<Status> states{Status::kRemoteDisconnect, Status::kNotFound, Status::kBackend,
                                   Status::kBackend, Status::kBackend};
  std::vector<TransferId> posted_ids;
  plan().hold_next(static_cast<int>(states.size()));
  for (std::size_t i = 0; i < states.size(); ++i) {
    posted_ids.push_back(posted("b", {static_cast<std::int64_t>(i)}, {0}));
  }
  for (std::size_t i = 0; i < states.size(); ++i) {
    plan().finish_with(posted_ids[i], states[i]);
    ASSERT_EQ(poll("b").failed, ids({posted_ids[i]}));
  }
  const auto fault = poll("b").peer_fault;
  ASSERT_TRUE(fault.has_value());
  EXPECT_NE(fault->find("REMOTE_DISCONNECT"), std::string::npos) << *fault;
  EXPECT_EQ(fault->find("NOT_FOUND"), std::string::npos) << *fault;
  EXPECT_EQ(fault->find("consecutive"), std::string::npos) << *fault;
}

TEST_F(StrikesTest, FaultIsReportedByEveryScopedPollUntilRemoval) {
  fail_one("b", Status::kRemoteDisconnect);
  const auto first = poll("b").peer_fault;
  ASSERT_TRUE(first.has_value());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(poll("b").peer_fault, first);
  EXPECT_EQ(peer("b").fault, first);
  a.transport.remove_remote_peer("b");
  EXPECT_FALSE(poll("b").peer_fault.has_value());
}

TEST_F(StrikesTest, FaultIsReportedOnlyForItsOwnPeer) {
  fail_one("b", Status::kRemoteDisconnect);
  EXPECT_FALSE(poll("c").peer_fault.has_value());
  EXPECT_FALSE(poll().peer_fault.has_value());
}

}  // namespace
}  // namespace kvxfer::unit
