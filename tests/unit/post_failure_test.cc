// SPDX-License-Identifier: Apache-2.0
// record_post_failure: a post the caller could not make (the drop-in's
// answer to bad indices) costs the peer what a failed post costs.
#include <gtest/gtest.h>

#include <string>

#include "agents.h"

namespace kvxfer::unit {
namespace {

using PostFailureTest = LoopbackTest;

TEST_F(PostFailureTest, CountsAsOneFailedPostAndOneStrike) {
  EXPECT_TRUE(a.transport.record_post_failure("b", "invalid indices"));
  EXPECT_EQ(peer("b").post_failures, 1u);
  EXPECT_EQ(peer("b").strikes, 1);
  EXPECT_EQ(peer("b").fault, std::nullopt);
  EXPECT_EQ(peer("c").strikes, 0);
}

TEST_F(PostFailureTest, StrikeLimitOfThemFaultsThePeerWithTheCause) {
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(a.transport.record_post_failure("b", "bad idx"));
  const PollResult r = poll("b");
  ASSERT_TRUE(r.peer_fault.has_value());
  EXPECT_NE(r.peer_fault->find("3 consecutive transfer failures (last: bad idx)"),
            std::string::npos)
      << *r.peer_fault;
}

TEST_F(PostFailureTest, ASuccessResetsItsStrikes) {
  EXPECT_TRUE(a.transport.record_post_failure("b", "bad idx"));
  EXPECT_TRUE(a.transport.record_post_failure("b", "bad idx"));
  const TransferId id = posted("b", {0}, {0});
  EXPECT_EQ(poll("b").done, ids({id}));
  EXPECT_EQ(peer("b").strikes, 0);
  EXPECT_TRUE(a.transport.record_post_failure("b", "bad idx"));
  EXPECT_EQ(poll("b").peer_fault, std::nullopt);
}

TEST_F(PostFailureTest, AnUnknownPeerIsNotCharged) {
  EXPECT_FALSE(a.transport.record_post_failure("nobody", "bad idx"));
  EXPECT_EQ(peer("b").post_failures, 0u);
  EXPECT_EQ(a.transport.stats().peers.size(), 2u);
}

TEST_F(PostFailureTest, AfterCloseItThrows) {
  a.transport.close();
  EXPECT_THROW((void)a.transport.record_post_failure("b", "bad idx"), std::logic_error);
}

}  // namespace
}  // namespace kvxfer::unit
