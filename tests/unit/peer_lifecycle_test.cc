// SPDX-License-Identifier: Apache-2.0
// Behaviour 3: re-adding a peer tears the old registration down first;
// removing one releases its handles, clears its strikes and fault, and drains
// only its in-flight transfers.
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

TEST_F(PeerLifecycleTest, ReAddingAPeerDrainsTheOldRegistrationsTransfers) {
  plan().hold_next();
  const TransferId old_id = posted("b", {0}, {0});
  add_peer(a.transport, "b", b.transport);
  EXPECT_EQ(peer("b").inflight, 0u);
  EXPECT_EQ(live().transfers, 0u);
  plan().land(old_id);
  EXPECT_TRUE(poll("b").empty());
  EXPECT_TRUE(poll().empty());
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
