// SPDX-License-Identifier: Apache-2.0
// Failures leave nothing behind: a release that fails keeps its handle
// counted until close() gives it back; a post that fails part-way leaves no
// WRITE reading the caller's blocks; a teardown that waits in the engine
// (a frozen peer) holds up no other peer's write or poll.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string_view>
#include <thread>

#include "agents.h"

namespace kvxfer::unit {
namespace {

using namespace std::chrono_literals;
using FailureCleanupTest = LoopbackTest;

// --- A release that fails -------------------------------------------------

TEST_F(FailureCleanupTest, ReleaseThatFailsInPollStaysCountedAndIsRetriedAtClose) {
  const TransferId id = posted("b", {0}, {0});
  plan().fail_next_releases(Status::kBackend);

  EXPECT_EQ(poll("b").done, ids({id}));

  // Reported and forgotten, but the engine still holds the handle.
  EXPECT_EQ(a.transport.stats().inflight, 0u);
  EXPECT_EQ(live().transfers, 1u);
  a.transport.close();
  EXPECT_EQ(a.transport.stats().live, HandleCounts{});
}

TEST_F(FailureCleanupTest, ReleaseThatFailsInCancelStaysCountedAndIsRetriedAtClose) {
  plan().hold_next();
  const TransferId id = posted("b", {0}, {0});
  plan().fail_next_releases(Status::kBackend);

  EXPECT_TRUE(cancel({id}, CancelMode::kImmediate).empty());

  EXPECT_EQ(a.transport.stats().inflight, 0u);
  EXPECT_EQ(live().transfers, 1u);
  a.transport.close();
  EXPECT_EQ(a.transport.stats().live, HandleCounts{});
  EXPECT_TRUE(untouched(b));  // the held WRITE was cancelled by the teardown
}

TEST_F(FailureCleanupTest, ReleaseThatFailsWhenAPeerIsRemovedIsRetriedAtClose) {
  plan().hold_next();
  (void)posted("b", {0}, {0});
  plan().fail_next_releases(Status::kBackend);

  a.transport.remove_remote_peer("b");

  EXPECT_EQ(live().peers, 1u);  // "c" only
  EXPECT_EQ(live().transfers, 1u);
  a.transport.close();
  EXPECT_EQ(a.transport.stats().live, HandleCounts{});
}

TEST_F(FailureCleanupTest, HandleThatCannotBeReleasedEvenAtCloseStaysCounted) {
  (void)posted("b", {0}, {0});
  // Once when close() releases it, once more when close() retries.
  plan().fail_next_releases(Status::kBackend, 2);

  a.transport.close();

  // A leak shows: the engine reports the handle it still holds.
  const HandleCounts after = a.transport.stats().live;
  EXPECT_EQ(after.transfers, 1u);
  EXPECT_EQ(after.peers, 0u);
  EXPECT_EQ(after.memory_registrations, 0u);
}

// --- A post that fails part-way -------------------------------------------

TEST_F(FailureCleanupTest, PostThatFailsPartWayReturnsNulloptWithNothingLeftInFlight) {
  plan().fail_next_posts_partway(Status::kBackend, /*started=*/2);

  EXPECT_FALSE(write("b", {0, 1, 2, 3}, {4, 5, 6, 7}).has_value());

  // The issued blocks landed before write_blocks returned; the rest never will.
  EXPECT_TRUE(landed(b, 4, 0));
  EXPECT_TRUE(landed(b, 5, 1));
  EXPECT_TRUE(b.pool.block_all(6, 0));
  EXPECT_TRUE(b.pool.block_all(7, 0));
  EXPECT_EQ(live().transfers, 0u);
  EXPECT_EQ(live().requests, 0u);
  EXPECT_EQ(peer("b").post_failures, 1u);
}

TEST_F(FailureCleanupTest, HeldPostThatFailsPartWayNeverReadsTheCallersBlocksAfterwards) {
  const TransferId earlier = posted("b", {9}, {9});
  ASSERT_EQ(poll("b").done, ids({earlier}));
  plan().hold_next();
  plan().fail_next_posts_partway(Status::kBackend, /*started=*/2);

  EXPECT_FALSE(write("b", {0, 1, 2, 3}, {0, 1, 2, 3}).has_value());
  EXPECT_EQ(live().requests, 0u);

  // The caller reuses its blocks at once; whatever the failed post had
  // issued must not carry the new bytes anywhere, now or later.
  a.pool.fill(0xEE);
  plan().land(earlier + 1);  // the id the failed post was given
  (void)poll();
  a.transport.close();
  for (std::int64_t block = 0; block < 4; ++block) {
    EXPECT_TRUE(b.pool.block_all(block, 0)) << "block " << block;
  }
}

// --- A teardown that waits ------------------------------------------------

// Pauses the engine's disconnects until open() (or destruction). After 10 s
// it opens by itself and says so (forced_open): a call that had to wait for
// the paused teardown shows as that, and the test fails instead of hanging.
class DisconnectGate {
 public:
  explicit DisconnectGate(loopback::FaultPlan& plan) : plan_(plan) {
    plan_.pause_disconnects();
    watchdog_ = std::thread([this, opened = opened_.get_future()] {
      if (opened.wait_for(10s) == std::future_status::timeout) forced_open_ = true;
      plan_.resume_disconnects();
    });
  }
  ~DisconnectGate() { open(); }
  DisconnectGate(const DisconnectGate&) = delete;
  DisconnectGate& operator=(const DisconnectGate&) = delete;

  void open() {
    if (!watchdog_.joinable()) return;
    opened_.set_value();
    watchdog_.join();
  }
  [[nodiscard]] bool forced_open() const { return forced_open_.load(); }

 private:
  loopback::FaultPlan& plan_;
  std::promise<void> opened_;
  std::atomic<bool> forced_open_{false};
  std::thread watchdog_;
};

// Waits until `peer_id` is no longer among the transport's peers (or the
// gate gave up).
void wait_until_gone(const Transport& transport, std::string_view peer_id,
                     const DisconnectGate& gate) {
  while (has_peer(transport, peer_id) && !gate.forced_open()) {
    std::this_thread::sleep_for(1ms);
  }
}

TEST_F(FailureCleanupTest, RemovalWaitingInTheEngineHoldsUpNoOtherPeer) {
  DisconnectGate gate(plan());
  std::atomic<bool> removed{false};
  std::thread remover([&] {
    a.transport.remove_remote_peer("b");
    removed = true;
  });

  // "b" leaves the tables before its teardown waits in the engine.
  wait_until_gone(a.transport, "b", gate);
  const auto id = write("c", {0}, {0});
  const PollResult result = poll("c");
  const bool served_while_paused = !gate.forced_open() && !removed.load();

  gate.open();
  remover.join();
  EXPECT_TRUE(served_while_paused) << "the removal held the transport until its disconnect ended";
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(result.done, ids({*id}));
  EXPECT_TRUE(landed(c, 0, 0));
  EXPECT_FALSE(has_peer(a.transport, "b"));
  EXPECT_EQ(live().peers, 1u);
}

TEST_F(FailureCleanupTest, ReRegistrationWaitingOnTheOldTeardownHoldsUpNoOtherPeer) {
  DisconnectGate gate(plan());
  std::atomic<bool> readded{false};
  std::thread readder([&] {
    add_peer(a.transport, "b", b.transport);
    readded = true;
  });

  wait_until_gone(a.transport, "b", gate);
  const auto id = write("c", {0}, {0});
  const PollResult result = poll("c");
  const bool served_while_paused = !gate.forced_open() && !readded.load();

  gate.open();
  readder.join();
  EXPECT_TRUE(served_while_paused)
      << "the re-registration held the transport until the old teardown ended";
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(result.done, ids({*id}));
  ASSERT_TRUE(has_peer(a.transport, "b"));
  EXPECT_EQ(live().peers, 2u);
  const TransferId again = posted("b", {1}, {1});
  EXPECT_EQ(poll("b").done, ids({again}));
  EXPECT_TRUE(landed(b, 1, 1));
}

TEST_F(FailureCleanupTest, SupersededRegistrationWaitingInTheEngineHoldsUpNoOtherPeer) {
  // "d" is removed while its registration connects: the registration worker
  // then releases what it connected, and that disconnect waits in the
  // engine (a peer that froze meanwhile).
  Agent d("agent-d");
  plan().set_connect_delay_ms(100);
  DisconnectGate gate(plan());
  std::future<void> registering = add_peer_async(a.transport, "d", d.transport);
  a.transport.remove_remote_peer("d");

  // Connected ("b", "c" and the superseded "d"), then found superseded.
  while (live().peers < 3 && !gate.forced_open()) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(50ms);
  const auto id = write("c", {0}, {0});
  const PollResult result = poll("c");
  const bool served_while_paused =
      !gate.forced_open() && registering.wait_for(0s) == std::future_status::timeout;

  gate.open();
  EXPECT_THROW(registering.get(), SupersededError);
  EXPECT_TRUE(served_while_paused)
      << "the superseded registration held the transport until its disconnect ended";
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(result.done, ids({*id}));
  EXPECT_TRUE(landed(c, 0, 0));
  EXPECT_FALSE(has_peer(a.transport, "d"));
  EXPECT_EQ(live().peers, 2u);
}

TEST_F(FailureCleanupTest, CloseWaitsForARemovalStillDisconnecting) {
  DisconnectGate gate(plan());
  std::thread remover([&] { a.transport.remove_remote_peer("b"); });
  wait_until_gone(a.transport, "b", gate);

  std::future<void> closing = std::async(std::launch::async, [&] { a.transport.close(); });

  // close() does not shut the engine down under a disconnect still running.
  EXPECT_EQ(closing.wait_for(200ms), std::future_status::timeout);
  gate.open();
  remover.join();
  closing.get();
  EXPECT_EQ(a.transport.stats().live, HandleCounts{});
}

// close() runs the engine's shutdown (a real engine drains for up to
// seconds) without the transport's lock: every call made meanwhile answers
// at once, the ones that need an open transport by throwing.
TEST_F(FailureCleanupTest, CloseDrainingInTheEngineHoldsUpNoOtherCall) {
  a.transport.remove_remote_peer("b");
  a.transport.remove_remote_peer("c");
  DisconnectGate gate(plan());
  std::atomic<bool> closed{false};
  std::thread closer([&] {
    a.transport.close();
    closed = true;
  });
  // Closing: calls that need an open transport throw from now on. With no
  // peer left, close() has nothing else to wait for on its way to the
  // engine's (paused) shutdown.
  bool throwing = false;
  while (!throwing && !gate.forced_open()) {
    try {
      (void)a.transport.peers();
      (void)a.transport.poll();
      std::this_thread::sleep_for(1ms);
    } catch (const std::logic_error&) {
      throwing = true;
    }
  }
  std::this_thread::sleep_for(100ms);
  EXPECT_THROW((void)a.transport.poll(), std::logic_error);
  EXPECT_THROW((void)a.transport.get_notifications(), std::logic_error);
  const Stats stats = a.transport.stats();
  const Metrics metrics = a.transport.metrics();
  const bool still_closing = !a.transport.closed();
  const bool served_while_paused = !gate.forced_open() && !closed.load();

  gate.open();
  closer.join();
  EXPECT_TRUE(throwing);
  EXPECT_TRUE(still_closing) << "close() ended before its shutdown was let go";
  EXPECT_TRUE(served_while_paused) << "close() held the transport while the engine drained";
  EXPECT_EQ(stats.live.peers, 0u);
  EXPECT_EQ(metrics.peers_registered, 0u);
  EXPECT_TRUE(a.transport.closed());
  EXPECT_EQ(a.transport.stats().live, HandleCounts{});
}

}  // namespace
}  // namespace kvxfer::unit
