// SPDX-License-Identifier: Apache-2.0
// Stall detection: a transfer left in progress past stall_timeout faults its
// peer ("STALLED") but stays in flight, since its WRITE may still land.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "agents.h"

namespace kvxfer::unit {
namespace {

Options stall_options(std::chrono::milliseconds timeout) {
  Options options = loopback_options();
  options.stall_timeout = timeout;
  return options;
}

class StallTest : public ::testing::Test {
 protected:
  StallTest() {
    a.pool.fill_pattern(1);
    add_peer(a.transport, "b", b.transport);
  }
  Agent b{"agent-b"};
  Agent a{"agent-a", stall_options(std::chrono::milliseconds(50))};
};

TEST_F(StallTest, TransferInFlightPastTheTimeoutFaultsItsPeer) {
  a.plan().hold_next();
  const auto id = write(a.transport, "b", {1}, {2});
  ASSERT_TRUE(id);
  EXPECT_FALSE(a.transport.poll("b").peer_fault);

  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  const PollResult r = a.transport.poll("b");

  ASSERT_TRUE(r.peer_fault);
  EXPECT_NE(r.peer_fault->find("STALLED"), std::string::npos) << *r.peer_fault;
  EXPECT_NE(r.peer_fault->find(std::to_string(*id)), std::string::npos) << *r.peer_fault;
  EXPECT_TRUE(r.done.empty());
  EXPECT_TRUE(r.failed.empty());
  EXPECT_EQ(peer_stats(a.transport, "b").inflight, 1u);
}

TEST_F(StallTest, StalledTransferIsStillReportedWhenItLands) {
  a.plan().hold_next();
  const auto id = write(a.transport, "b", {1}, {2});
  ASSERT_TRUE(id);
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  ASSERT_TRUE(a.transport.poll("b").peer_fault);

  a.plan().land(*id);
  const PollResult r = a.transport.poll("b");

  EXPECT_EQ(r.done, ids({*id}));
  EXPECT_TRUE(r.peer_fault);  // the fault sticks until the peer is removed
}

TEST_F(StallTest, RemovingAStalledPeerDrainsItsTransfer) {
  a.plan().hold_next();
  ASSERT_TRUE(write(a.transport, "b", {1}, {2}));
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  ASSERT_TRUE(a.transport.poll("b").peer_fault);

  a.transport.remove_remote_peer("b");

  EXPECT_EQ(a.transport.stats().inflight, 0u);
  EXPECT_EQ(a.transport.stats().live.transfers, 0u);
}

TEST(StallDisabledTest, ZeroTimeoutNeverFaults) {
  Agent b{"agent-b"};
  Agent a{"agent-a", stall_options(std::chrono::milliseconds(0))};
  add_peer(a.transport, "b", b.transport);
  a.plan().hold_next();
  ASSERT_TRUE(write(a.transport, "b", {1}, {2}));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(a.transport.poll("b").peer_fault);
}

TEST(StallDefaultTest, DefaultTimeoutIsThirtySeconds) {
  EXPECT_EQ(Options{}.stall_timeout, std::chrono::seconds(30));
}

}  // namespace
}  // namespace kvxfer::unit
