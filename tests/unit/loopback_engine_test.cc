// SPDX-License-Identifier: Apache-2.0
// The loopback engine as a product feature: in-process peers, memcpy WRITEs,
// and a fault plan that scripts what real engines do wrong.
#include <gtest/gtest.h>

#include <chrono>

#include "agents.h"

namespace kvxfer::unit {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using LoopbackEngineTest = LoopbackTest;

TEST_F(LoopbackEngineTest, EveryLoopbackTransportHasItsOwnFaultPlan) {
  EXPECT_NE(a.transport.fault_plan(), nullptr);
  EXPECT_NE(a.transport.fault_plan(), b.transport.fault_plan());
  b.plan().fail_next_posts(Status::kBackend);  // b's plan, not a's
  EXPECT_TRUE(write("b", {0}, {0}).has_value());
}

TEST_F(LoopbackEngineTest, HeldWriteWritesNothingUntilItLands) {
  plan().hold_next();
  const TransferId id = posted("b", {1}, {2});
  EXPECT_TRUE(untouched(b));
  EXPECT_EQ(live().requests, 1u);
  plan().land(id);
  EXPECT_TRUE(landed(b, 2, 1));
  EXPECT_EQ(live().requests, 0u);
}

TEST_F(LoopbackEngineTest, HoldNextHoldsExactlyThatManyWrites) {
  plan().hold_next(2);
  (void)posted("b", {0}, {0});
  (void)posted("b", {1}, {1});
  (void)posted("b", {2}, {2});
  EXPECT_TRUE(b.pool.block_all(0, 0));
  EXPECT_TRUE(b.pool.block_all(1, 0));
  EXPECT_TRUE(landed(b, 2, 2));
  EXPECT_EQ(live().requests, 2u);
}

TEST_F(LoopbackEngineTest, FailNextPostsFailsExactlyThatManyPosts) {
  plan().fail_next_posts(Status::kBackend, 2);
  EXPECT_FALSE(write("b", {0}, {0}).has_value());
  EXPECT_FALSE(write("c", {0}, {0}).has_value());
  EXPECT_TRUE(write("b", {0}, {0}).has_value());
}

TEST_F(LoopbackEngineTest, HeldWriteThatFinishesFailedNeverLands) {
  plan().hold_next();
  const TransferId id = posted("b", {0}, {0});
  plan().finish_with(id, Status::kBackend);
  EXPECT_EQ(poll("b").failed, ids({id}));
  plan().land(id);
  EXPECT_TRUE(untouched(b));
  EXPECT_EQ(live().requests, 0u);
}

TEST_F(LoopbackEngineTest, RemovingAPeerEndsItsHeldWrites) {
  plan().hold_next();
  const TransferId id = posted("b", {0}, {0});
  a.transport.remove_remote_peer("b");
  EXPECT_EQ(live().requests, 0u);
  plan().land(id);
  EXPECT_TRUE(untouched(b));
}

TEST_F(LoopbackEngineTest, HeldWriteToAClosedTargetNeverTouchesItsPool) {
  plan().hold_next();
  const TransferId id = posted("b", {0}, {0});
  b.transport.close();
  b.pool.fill(0xEE);
  plan().land(id);
  EXPECT_TRUE(b.pool.all(0xEE));
  EXPECT_EQ(poll("b").failed, ids({id}));
}

TEST_F(LoopbackEngineTest, ReconnectUndoesDisconnect) {
  plan().disconnect("agent-b");
  ASSERT_FALSE(write("b", {0}, {0}).has_value());
  plan().reconnect("agent-b");
  // The failed post faulted the registration; a new one reaches the agent.
  a.transport.remove_remote_peer("b");
  add_peer(a.transport, "b", b.transport);
  const TransferId id = posted("b", {3}, {4});
  EXPECT_TRUE(landed(b, 4, 3));
  EXPECT_EQ(poll("b").done, ids({id}));
}

TEST_F(LoopbackEngineTest, RegisteringADisconnectedAgentFails) {
  Agent d{"agent-d"};
  plan().disconnect("agent-d");
  EXPECT_THROW(add_peer(a.transport, "d", d.transport), std::runtime_error);
  EXPECT_FALSE(has_peer(a.transport, "d"));
}

TEST_F(LoopbackEngineTest, FailNextConnectsFailsExactlyThatManyRegistrations) {
  Agent d{"agent-d"};
  plan().fail_next_connects(Status::kBackend, 2);
  EXPECT_THROW(add_peer(a.transport, "d", d.transport), std::runtime_error);
  EXPECT_THROW(add_peer(a.transport, "d", d.transport), std::runtime_error);
  EXPECT_NO_THROW(add_peer(a.transport, "d", d.transport));
}

TEST_F(LoopbackEngineTest, ConnectDelayDelaysRegistration) {
  Agent d{"agent-d"};
  plan().set_connect_delay_ms(60);
  const auto start = Clock::now();
  add_peer(a.transport, "d", d.transport);
  EXPECT_GE(Clock::now() - start, milliseconds(60));
}

TEST_F(LoopbackEngineTest, FailedReleaseKeepsTheHandleLive) {
  const TransferId id = posted("b", {0}, {0});
  plan().fail_next_releases(Status::kBackend);
  EXPECT_EQ(cancel({id}, CancelMode::kWait), ids({id}));
  EXPECT_EQ(live().transfers, 1u);
}

TEST_F(LoopbackEngineTest, CheckCountCountsStateChecks) {
  const std::uint64_t before = plan().check_count();
  (void)posted("b", {0}, {0});
  (void)posted("c", {0}, {0});
  (void)poll();
  EXPECT_EQ(plan().check_count() - before, 2u);
}

TEST_F(LoopbackEngineTest, MetadataOfAClosedAgentNeverReachesANewOne) {
  Agent d{"agent-d"};
  const std::vector<std::uint8_t> old_metadata = d.transport.agent_metadata();
  const std::uintptr_t old_base = d.transport.base_addr();
  d.transport.close();
  Agent d2{"agent-d"};  // same name, new agent
  EXPECT_THROW(a.transport.add_remote_peer("d", old_metadata, old_base, kNumBlocks, kBlockLen),
               std::runtime_error);
  EXPECT_FALSE(has_peer(a.transport, "d"));
  add_peer(a.transport, "d", d2.transport);
  ASSERT_TRUE(write("d", {5}, {6}).has_value());
  EXPECT_TRUE(landed(d2, 6, 5));
  EXPECT_TRUE(d.pool.all(0));
}

TEST(LoopbackEngineTwoWayTest, TwoAgentsWriteIntoEachOther) {
  Agent x{"agent-x"};
  Agent y{"agent-y"};
  x.pool.fill_pattern(5);
  y.pool.fill_pattern(9);
  add_peer(x.transport, "y", y.transport);
  add_peer(y.transport, "x", x.transport);
  // x writes its block 0 into y's block 1; y writes its block 2 into x's 3.
  const auto x_block0 = std::vector<std::uint8_t>(x.pool.block(0).begin(), x.pool.block(0).end());
  const auto y_block2 = std::vector<std::uint8_t>(y.pool.block(2).begin(), y.pool.block(2).end());
  ASSERT_TRUE(write(x.transport, "y", {0}, {1}).has_value());
  ASSERT_TRUE(write(y.transport, "x", {2}, {3}).has_value());
  EXPECT_TRUE(std::ranges::equal(y.pool.block(1), x_block0));
  EXPECT_TRUE(std::ranges::equal(x.pool.block(3), y_block2));
}

}  // namespace
}  // namespace kvxfer::unit
