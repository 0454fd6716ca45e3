// SPDX-License-Identifier: Apache-2.0
// Behaviour 9: close() stops the registration worker, releases every
// transfer and peer and deregisters the pool; it is idempotent, and the
// transport refuses every later call with std::logic_error.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "agents.h"

namespace kvxfer::unit {
namespace {

using std::chrono::milliseconds;
using CloseTest = LoopbackTest;

TEST_F(CloseTest, CloseReleasesEveryHandle) {
  (void)posted("b", {0}, {0});  // done, never polled
  plan().hold_next(2);
  (void)posted("b", {1}, {1});  // in flight
  const TransferId abandoned = posted("c", {2}, {2});
  (void)cancel({abandoned}, CancelMode::kImmediate);  // released, still landing
  const HandleCounts before = live();
  ASSERT_EQ(before.memory_registrations, 1u);
  ASSERT_EQ(before.peers, 2u);
  ASSERT_EQ(before.remote_keys, 2u);
  ASSERT_EQ(before.transfers, 2u);
  ASSERT_EQ(before.requests, 2u);

  a.transport.close();

  const Stats after = a.transport.stats();
  EXPECT_EQ(after.live, HandleCounts{});
  EXPECT_EQ(after.inflight, 0u);
  EXPECT_TRUE(after.peers.empty());
}

TEST_F(CloseTest, CloseReleasesEveryHandleEvenWhenAReleaseFails) {
  (void)posted("b", {0}, {0});
  plan().fail_next_releases(Status::kBackend);
  a.transport.close();
  EXPECT_EQ(a.transport.stats().live, HandleCounts{});
}

TEST_F(CloseTest, CloseIsIdempotent) {
  a.transport.close();
  EXPECT_NO_THROW(a.transport.close());
  EXPECT_TRUE(a.transport.closed());
  EXPECT_EQ(a.transport.stats().live, HandleCounts{});
}

TEST_F(CloseTest, ClosedTransportIsNotAvailable) {
  EXPECT_FALSE(a.transport.closed());
  a.transport.close();
  EXPECT_TRUE(a.transport.closed());
  EXPECT_FALSE(a.transport.available());
}

TEST_F(CloseTest, EveryCallAfterCloseThrowsLogicError) {
  const std::vector<std::uint8_t> metadata = b.transport.agent_metadata();
  a.transport.close();

  const std::vector<std::int64_t> idx64{0};
  const std::vector<std::int32_t> idx32{0};
  const std::vector<TransferId> some{1};
  Transport& t = a.transport;
  EXPECT_THROW((void)t.write_blocks("b", std::span<const std::int64_t>(idx64),
                                    std::span<const std::int64_t>(idx64)),
               std::logic_error);
  EXPECT_THROW((void)t.write_blocks("b", std::span<const std::int32_t>(idx32),
                                    std::span<const std::int32_t>(idx32)),
               std::logic_error);
  EXPECT_THROW((void)t.poll(), std::logic_error);
  EXPECT_THROW((void)t.poll("b"), std::logic_error);
  EXPECT_THROW((void)t.cancel(some, CancelMode::kImmediate), std::logic_error);
  EXPECT_THROW((void)t.cancel(some, CancelMode::kWait), std::logic_error);
  EXPECT_THROW(t.add_remote_peer("b", metadata, b.transport.base_addr(), kNumBlocks, kBlockLen),
               std::logic_error);
  EXPECT_THROW(
      (void)t.add_remote_peer_async("b", metadata, b.transport.base_addr(), kNumBlocks, kBlockLen),
      std::logic_error);
  EXPECT_THROW(t.remove_remote_peer("b"), std::logic_error);
  EXPECT_THROW((void)t.agent_metadata(), std::logic_error);
}

TEST_F(CloseTest, CloseLetsARunningRegistrationFinishAndPublishesNothing) {
  Agent d{"agent-d"};
  plan().set_connect_delay_ms(200);
  std::future<void> running = add_peer_async(a.transport, "d", d.transport);
  std::this_thread::sleep_for(milliseconds(50));  // the worker is connecting now

  a.transport.close();

  // close() waited for it: its outcome is already decided.
  ASSERT_EQ(running.wait_for(milliseconds(0)), std::future_status::ready);
  EXPECT_ANY_THROW(running.get());
  EXPECT_EQ(a.transport.stats().live, HandleCounts{});
}

TEST_F(CloseTest, CloseFailsRegistrationsThatNeverRan) {
  Agent d{"agent-d"};
  Agent e{"agent-e"};
  plan().set_connect_delay_ms(100);
  std::future<void> running = add_peer_async(a.transport, "d", d.transport);
  std::future<void> queued = add_peer_async(a.transport, "e", e.transport);

  a.transport.close();

  ASSERT_EQ(queued.wait_for(milliseconds(0)), std::future_status::ready);
  EXPECT_ANY_THROW(queued.get());
  EXPECT_EQ(a.transport.stats().live, HandleCounts{});
}

TEST_F(CloseTest, ClosedTargetsPeersSeeRemoteDisconnect) {
  const TransferId id = posted("b", {0}, {0});
  b.transport.close();
  EXPECT_EQ(b.transport.stats().live, HandleCounts{});
  const PollResult result = poll("b");
  EXPECT_EQ(result.failed, ids({id}));
  ASSERT_TRUE(result.peer_fault.has_value());
  EXPECT_NE(result.peer_fault->find("REMOTE_DISCONNECT"), std::string::npos);
}

TEST(CloseOnDestructionTest, DestroyedTransportCanNoLongerBeRegistered) {
  Agent b{"agent-b"};
  std::vector<std::uint8_t> metadata;
  std::uintptr_t base = 0;
  {
    Agent a{"agent-a"};
    add_peer(a.transport, "b", b.transport);
    a.plan().hold_next();
    ASSERT_TRUE(write(a.transport, "b", {0}, {0}).has_value());
    metadata = a.transport.agent_metadata();
    base = a.transport.base_addr();
  }
  // Its registration went with it: the metadata reaches nothing any more.
  Agent c{"agent-c"};
  EXPECT_THROW(c.transport.add_remote_peer("a", metadata, base, kNumBlocks, kBlockLen),
               std::runtime_error);
  EXPECT_FALSE(has_peer(c.transport, "a"));
  EXPECT_TRUE(b.pool.all(0));
}

}  // namespace
}  // namespace kvxfer::unit
