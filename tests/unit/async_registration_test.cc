// SPDX-License-Identifier: Apache-2.0
// Behaviour 2: async registration runs on one worker; a registration that
// finishes under a stale generation is released, fails with SupersededError
// and never becomes visible.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "agents.h"

namespace kvxfer::unit {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

class AsyncRegistrationTest : public ::testing::Test {
 protected:
  AsyncRegistrationTest() { a.pool.fill_pattern(1); }
  Agent b{"agent-b"};
  Agent c{"agent-c"};
  Agent d{"agent-d"};
  Agent a{"agent-a"};
};

TEST_F(AsyncRegistrationTest, AsyncRegistrationPublishesThePeerWhenItCompletes) {
  std::future<void> done = add_peer_async(a.transport, "b", b.transport);
  done.get();
  EXPECT_TRUE(has_peer(a.transport, "b"));
  ASSERT_TRUE(write(a.transport, "b", {3}, {5}).has_value());
  EXPECT_FALSE(b.pool.block_all(5, 0));
}

TEST_F(AsyncRegistrationTest, RemovalDuringAsyncRegistrationSupersedesIt) {
  a.plan().set_connect_delay_ms(200);
  std::future<void> done = add_peer_async(a.transport, "b", b.transport);
  a.transport.remove_remote_peer("b");

  EXPECT_THROW(done.get(), SupersededError);
  EXPECT_FALSE(has_peer(a.transport, "b"));
  EXPECT_FALSE(write(a.transport, "b", {0}, {0}).has_value());
  EXPECT_TRUE(b.pool.all(0));
}

TEST_F(AsyncRegistrationTest, SupersededRegistrationReleasesWhatItBuilt) {
  a.plan().set_connect_delay_ms(200);
  std::future<void> done = add_peer_async(a.transport, "b", b.transport);
  a.transport.remove_remote_peer("b");
  EXPECT_THROW(done.get(), SupersededError);

  const HandleCounts live = a.transport.stats().live;
  EXPECT_EQ(live.peers, 0u);
  EXPECT_EQ(live.remote_keys, 0u);
}

TEST_F(AsyncRegistrationTest, SecondAsyncRegistrationSupersedesTheFirst) {
  a.plan().set_connect_delay_ms(100);
  // Same peer id, two targets: only the later registration may win.
  std::future<void> first = add_peer_async(a.transport, "p", b.transport);
  std::future<void> second = add_peer_async(a.transport, "p", c.transport);

  EXPECT_THROW(first.get(), SupersededError);
  EXPECT_NO_THROW(second.get());
  EXPECT_EQ(a.transport.stats().live.peers, 1u);
  ASSERT_TRUE(write(a.transport, "p", {1}, {2}).has_value());
  EXPECT_FALSE(c.pool.block_all(2, 0));
  EXPECT_TRUE(b.pool.all(0));
}

TEST_F(AsyncRegistrationTest, SynchronousRegistrationSupersedesAnAsyncOneInFlight) {
  a.plan().set_connect_delay_ms(150);
  std::future<void> async_one = add_peer_async(a.transport, "p", b.transport);
  std::this_thread::sleep_for(milliseconds(20));  // let the worker start connecting
  add_peer(a.transport, "p", c.transport);

  EXPECT_THROW(async_one.get(), SupersededError);
  EXPECT_EQ(a.transport.stats().live.peers, 1u);
  ASSERT_TRUE(write(a.transport, "p", {1}, {2}).has_value());
  EXPECT_FALSE(c.pool.block_all(2, 0));
  EXPECT_TRUE(b.pool.all(0));
}

TEST_F(AsyncRegistrationTest, AsyncRegistrationsRunOneAtATime) {
  a.plan().set_connect_delay_ms(100);
  const auto start = Clock::now();
  std::future<void> fb = add_peer_async(a.transport, "b", b.transport);
  std::future<void> fc = add_peer_async(a.transport, "c", c.transport);
  std::future<void> fd = add_peer_async(a.transport, "d", d.transport);
  EXPECT_GE(a.transport.stats().registrations_pending, 1u);

  fb.get();
  fc.get();
  fd.get();
  // Three 100 ms connects on one worker cannot overlap.
  EXPECT_GE(Clock::now() - start, milliseconds(290));
  EXPECT_EQ(a.transport.peers(), (std::vector<std::string>{"b", "c", "d"}));
}

TEST_F(AsyncRegistrationTest, RegistrationsPendingDropsToZeroWhenAllFinish) {
  a.plan().set_connect_delay_ms(50);
  std::future<void> fb = add_peer_async(a.transport, "b", b.transport);
  std::future<void> fc = add_peer_async(a.transport, "c", c.transport);
  EXPECT_GE(a.transport.stats().registrations_pending, 1u);
  fb.get();
  fc.get();
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while (a.transport.stats().registrations_pending != 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_EQ(a.transport.stats().registrations_pending, 0u);
}

TEST_F(AsyncRegistrationTest, FailedAsyncConnectFailsTheFutureAndPublishesNothing) {
  a.plan().fail_next_connects(Status::kBackend);
  std::future<void> done = add_peer_async(a.transport, "b", b.transport);
  try {
    done.get();
    ADD_FAILURE() << "a failed connect must fail the future";
  } catch (const SupersededError&) {
    ADD_FAILURE() << "a failed connect is not a superseded registration";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("BACKEND"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(has_peer(a.transport, "b"));
  EXPECT_EQ(a.transport.stats().live.peers, 0u);
}

TEST_F(AsyncRegistrationTest, FailedSynchronousConnectThrowsRuntimeError) {
  a.plan().fail_next_connects(Status::kNotFound);
  EXPECT_THROW(add_peer(a.transport, "b", b.transport), std::runtime_error);
  EXPECT_FALSE(has_peer(a.transport, "b"));
  EXPECT_EQ(a.transport.stats().live.peers, 0u);
  // The fault plan failed exactly one connect.
  EXPECT_NO_THROW(add_peer(a.transport, "b", b.transport));
}

}  // namespace
}  // namespace kvxfer::unit
