// SPDX-License-Identifier: Apache-2.0
// Behaviour 3: re-adding a peer tears the old registration down first;
// removing one releases its handles, clears its strikes and fault, and
// settles only its in-flight transfers, whose ids the next poll of that peer
// id (or of every peer) reports: done if their bytes had landed, failed
// otherwise. Nothing of the old registration lands after that.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include "agents.h"
#include "log_capture.h"

namespace kvxfer::unit {
namespace {

using PeerLifecycleTest = LoopbackTest;

TEST_F(PeerLifecycleTest, ReAddingAPeerKeepsOneEndpointAndOneRemoteKey) {
  add_peer(a.transport, "b", b.transport);
  const HandleCounts counts = live();
  EXPECT_EQ(counts.peers, 2u);  // b (once) and c
  EXPECT_EQ(counts.remote_keys, 2u);
  EXPECT_EQ(a.transport.peers(), (std::vector<std::string>{"b", "c"}));
}

TEST_F(PeerLifecycleTest, ReAddingAPeerSendsItsWritesToTheNewRegistration) {
  Agent d{"agent-d"};
  add_peer(a.transport, "b", d.transport);  // "b" now names agent-d
  ASSERT_TRUE(write("b", {4}, {6}).has_value());
  EXPECT_TRUE(landed(d, 6, 4));
  EXPECT_TRUE(untouched(b));
}

TEST_F(PeerLifecycleTest, ReAddingAPeerSettlesTheOldRegistrationsTransfersForItsNextPoll) {
  plan().hold_next();
  const TransferId old_id = posted("b", {0}, {0});
  add_peer(a.transport, "b", b.transport);
  EXPECT_EQ(peer("b").inflight, 0u);
  EXPECT_EQ(live().transfers, 0u);
  plan().land(old_id);  // too late: its handle is gone with the registration
  // Its bytes had not landed when the registration went: failed, reported
  // once, by the new registration's poll.
  const TransferId new_id = posted("b", {1}, {1});
  const PollResult first = poll("b");
  EXPECT_EQ(first.failed, ids({old_id}));
  EXPECT_EQ(first.done, ids({new_id}));
  EXPECT_TRUE(poll("b").empty());
  EXPECT_TRUE(poll().empty());
  EXPECT_FALSE(landed(b, 0, 0));
}

TEST_F(PeerLifecycleTest, RemovingAPeerReleasesItsEndpointAndRemoteKey) {
  a.transport.remove_remote_peer("b");
  const HandleCounts counts = live();
  EXPECT_EQ(counts.peers, 1u);
  EXPECT_EQ(counts.remote_keys, 1u);
}

TEST_F(PeerLifecycleTest, RemovedPeerIsUnknown) {
  a.transport.remove_remote_peer("b");
  EXPECT_EQ(a.transport.peers(), std::vector<std::string>{"c"});
  EXPECT_FALSE(write("b", {0}, {0}).has_value());
  EXPECT_TRUE(untouched(b));
}

TEST_F(PeerLifecycleTest, RemovingAPeerDrainsItsInflightTransfers) {
  plan().hold_next(2);
  const TransferId first = posted("b", {0}, {0});
  const TransferId second = posted("b", {1}, {1});
  ASSERT_EQ(a.transport.stats().inflight, 2u);

  a.transport.remove_remote_peer("b");

  EXPECT_EQ(a.transport.stats().inflight, 0u);
  EXPECT_EQ(live().transfers, 0u);
  plan().land(first);
  plan().land(second);
  // Reported once, failed: their bytes had not landed at the removal.
  const PollResult reported = poll();
  EXPECT_EQ(reported.failed, ids({first, second}));
  EXPECT_TRUE(reported.done.empty());
  EXPECT_TRUE(poll().empty());
  EXPECT_TRUE(poll("b").empty());
}

TEST_F(PeerLifecycleTest, ATransferThatLandedBeforeTheRemovalIsReportedDone) {
  plan().hold_next();
  const TransferId held = posted("b", {0}, {0});
  const TransferId landed_id = posted("b", {1}, {1});  // lands in the post
  a.transport.remove_remote_peer("b");
  // The removed peer's id still covers them.
  const PollResult reported = poll("b");
  EXPECT_EQ(reported.done, ids({landed_id}));
  EXPECT_EQ(reported.failed, ids({held}));
  EXPECT_FALSE(reported.peer_fault.has_value());
  EXPECT_TRUE(poll("b").empty());
  EXPECT_TRUE(landed(b, 1, 1));
  const PeerStats* none = nullptr;
  for (const PeerStats& p : a.transport.stats().peers) {
    if (p.peer_id == "b") none = &p;
  }
  EXPECT_EQ(none, nullptr);
}

TEST_F(PeerLifecycleTest, ARemovedPeersTransfersAreNotAnotherPeersToReport) {
  plan().hold_next();
  const TransferId to_b = posted("b", {0}, {0});
  a.transport.remove_remote_peer("b");
  EXPECT_TRUE(poll("c").empty());
  EXPECT_EQ(poll("b").failed, ids({to_b}));
}

TEST_F(PeerLifecycleTest, CancellingARemovedPeersTransferForgetsIt) {
  plan().hold_next(2);
  const TransferId waited = posted("b", {0}, {0});
  const TransferId immediate = posted("b", {1}, {1});
  a.transport.remove_remote_peer("b");
  // Settled: neither can land any more, so neither is still in flight.
  const TransferId one[] = {waited};
  EXPECT_TRUE(a.transport.cancel(one, CancelMode::kWait).empty());
  const TransferId other[] = {immediate};
  EXPECT_TRUE(a.transport.cancel(other, CancelMode::kImmediate).empty());
  EXPECT_TRUE(poll().empty());
}

TEST_F(PeerLifecycleTest, RemovingAPeerLeavesOtherPeersTransfersUntouched) {
  plan().hold_next(2);
  (void)posted("b", {0}, {0});
  const TransferId to_c = posted("c", {1}, {1});

  a.transport.remove_remote_peer("b");

  EXPECT_EQ(peer("c").inflight, 1u);
  plan().land(to_c);
  EXPECT_EQ(poll("c").done, ids({to_c}));
  EXPECT_TRUE(landed(c, 1, 1));
}

TEST_F(PeerLifecycleTest, RemovingAPeerClearsItsFault) {
  plan().fail_next_posts(Status::kRemoteDisconnect);
  ASSERT_FALSE(write("b", {0}, {0}).has_value());
  ASSERT_TRUE(poll("b").peer_fault.has_value());

  a.transport.remove_remote_peer("b");
  add_peer(a.transport, "b", b.transport);

  EXPECT_FALSE(poll("b").peer_fault.has_value());
  EXPECT_FALSE(peer("b").fault.has_value());
}

TEST_F(PeerLifecycleTest, RemovingAPeerClearsItsStrikes) {
  plan().fail_next_posts(Status::kBackend, 2);
  ASSERT_FALSE(write("b", {0}, {0}).has_value());
  ASSERT_FALSE(write("b", {0}, {0}).has_value());
  ASSERT_EQ(peer("b").strikes, 2);

  a.transport.remove_remote_peer("b");
  add_peer(a.transport, "b", b.transport);
  EXPECT_EQ(peer("b").strikes, 0);

  // Had the two old strikes survived, this one would reach the limit.
  plan().fail_next_posts(Status::kBackend);
  ASSERT_FALSE(write("b", {0}, {0}).has_value());
  EXPECT_EQ(peer("b").strikes, 1);
  EXPECT_FALSE(poll("b").peer_fault.has_value());
}

TEST_F(PeerLifecycleTest, RemovalWhoseKeyReleaseFailsStillClosesTheEndpointAndLogsIt) {
  LogCapture log;
  plan().fail_next_disconnects(Status::kBackend);

  EXPECT_NO_THROW(a.transport.remove_remote_peer("b"));

  EXPECT_FALSE(has_peer(a.transport, "b"));
  const HandleCounts counts = live();
  EXPECT_EQ(counts.peers, 1u);
  EXPECT_EQ(counts.remote_keys, 1u);
  EXPECT_TRUE(log.contains(spdlog::level::warn, {"BACKEND"}));
  // Nothing stale is left behind: the peer can be registered again.
  add_peer(a.transport, "b", b.transport);
  ASSERT_TRUE(write("b", {2}, {3}).has_value());
  EXPECT_TRUE(landed(b, 3, 2));
}

TEST_F(PeerLifecycleTest, RemovingAnUnknownPeerChangesNothing) {
  EXPECT_NO_THROW(a.transport.remove_remote_peer("nobody"));
  EXPECT_EQ(a.transport.peers(), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(live().peers, 2u);
}

TEST_F(PeerLifecycleTest, RemovedPeerCanBeRegisteredAgain) {
  a.transport.remove_remote_peer("b");
  add_peer(a.transport, "b", b.transport);
  const TransferId id = posted("b", {7}, {8});
  EXPECT_TRUE(landed(b, 8, 7));
  EXPECT_EQ(poll("b").done, ids({id}));
}

}  // namespace
}  // namespace kvxfer::unit
