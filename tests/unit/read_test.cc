// SPDX-License-Identifier: Apache-2.0
// READ: read_blocks copies the peer's blocks into ours. The mirror of
// write_blocks: the same ids, checks (the blocks written are ours, so a local
// block may not be named twice), poll, cancel, strikes, faults, stall rule,
// purge on remove and close; and the loopback fault plan scripts reads as it
// scripts writes.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "agents.h"

namespace kvxfer::unit {
namespace {

Options read_options(std::chrono::milliseconds stall = std::chrono::milliseconds(30000)) {
  Options options = loopback_options();
  options.stall_timeout = stall;
  return options;
}

// Initiator "agent-a" (zeroed, so every byte a read brings shows) reading
// from "agent-b" (patterned), registered as peer "b".
class ReadTest : public ::testing::Test {
 protected:
  ReadTest() {
    b.pool.fill_pattern(7);
    add_peer(a.transport, "b", b.transport);
  }

  [[nodiscard]] std::optional<TransferId> read(const std::vector<std::int64_t>& local,
                                               const std::vector<std::int64_t>& remote) {
    return a.transport.read_blocks("b", std::span<const std::int64_t>(local),
                                   std::span<const std::int64_t>(remote));
  }
  [[nodiscard]] TransferId posted(const std::vector<std::int64_t>& local,
                                  const std::vector<std::int64_t>& remote) {
    const auto id = read(local, remote);
    if (!id) throw std::runtime_error("read_blocks returned nullopt where a post was expected");
    return *id;
  }
  // True when our block `local` holds the peer's block `remote`.
  [[nodiscard]] bool brought(std::int64_t local, std::int64_t remote) const {
    const auto want = b.pool.block(remote);
    const auto got = a.pool.block(local);
    return std::equal(want.begin(), want.end(), got.begin(), got.end());
  }
  [[nodiscard]] loopback::FaultPlan& plan() { return a.plan(); }

  Agent b{"agent-b"};
  Agent a{"agent-a", read_options()};
};

TEST_F(ReadTest, ReadBringsThePeersBlocksIntoOurs) {
  const TransferId id = posted({3, 4, 9}, {10, 2, 2});
  EXPECT_EQ(a.transport.poll("b").done, ids({id}));
  EXPECT_TRUE(brought(3, 10));
  EXPECT_TRUE(brought(4, 2));
  EXPECT_TRUE(brought(9, 2));  // one remote block may be read into two of ours
  for (std::int64_t i : {0, 1, 2, 5, 6, 7, 8, 10}) EXPECT_TRUE(a.pool.block_all(i, 0)) << i;
  EXPECT_FALSE(b.pool.all(0));  // the peer's pool is only read
}

TEST_F(ReadTest, Int32IndicesReadToo) {
  const std::vector<std::int32_t> local{0, 1};
  const std::vector<std::int32_t> remote{31, 30};
  const auto id = a.transport.read_blocks("b", std::span<const std::int32_t>(local),
                                          std::span<const std::int32_t>(remote));
  ASSERT_TRUE(id);
  EXPECT_EQ(a.transport.poll("b").done, ids({*id}));
  EXPECT_TRUE(brought(0, 31));
  EXPECT_TRUE(brought(1, 30));
}

TEST_F(ReadTest, ReadsAndWritesDrawIdsFromOneSequence) {
  const auto w1 = write(a.transport, "b", {0}, {20});
  const TransferId r = posted({1}, {1});
  const auto w2 = write(a.transport, "b", {2}, {21});
  ASSERT_TRUE(w1 && w2);
  EXPECT_EQ(r, *w1 + 1);
  EXPECT_EQ(*w2, r + 1);
  EXPECT_EQ(a.transport.poll().done, ids({*w1, r, *w2}));
}

TEST_F(ReadTest, StatsCountReadsApart) {
  (void)posted({0, 1}, {0, 1});
  (void)write(a.transport, "b", {2}, {2});
  (void)a.transport.poll("b");
  const PeerStats s = peer_stats(a.transport, "b");
  EXPECT_EQ(s.transfers_done, 2u);
  EXPECT_EQ(s.reads_done, 1u);
  EXPECT_EQ(s.read_bytes_done, 2 * kBlockLen);
  EXPECT_EQ(s.bytes_done, 3 * kBlockLen);
}

TEST_F(ReadTest, ALocalBlockNamedTwiceIsRefusedAndNothingIsRead) {
  EXPECT_THROW((void)read({5, 5}, {1, 2}), std::invalid_argument);
  EXPECT_TRUE(a.pool.all(0));
  EXPECT_EQ(peer_stats(a.transport, "b").post_failures, 0u);
  EXPECT_EQ(peer_stats(a.transport, "b").strikes, 0);
}

TEST_F(ReadTest, BadIndicesThrowBeforeAnythingIsPosted) {
  EXPECT_THROW((void)read({static_cast<std::int64_t>(kNumBlocks)}, {0}), std::invalid_argument);
  EXPECT_THROW((void)read({0}, {static_cast<std::int64_t>(kNumBlocks)}), std::invalid_argument);
  EXPECT_THROW((void)read({-1}, {0}), std::invalid_argument);
  EXPECT_THROW((void)read({0, 1}, {0}), std::invalid_argument);
  EXPECT_THROW((void)read({}, {}), std::invalid_argument);
  EXPECT_TRUE(a.pool.all(0));
  EXPECT_EQ(a.transport.stats().inflight, 0u);
  EXPECT_EQ(peer_stats(a.transport, "b").strikes, 0);
}

TEST_F(ReadTest, UnknownPeerIsNulloptWithoutAStrike) {
  const std::vector<std::int64_t> one{0};
  EXPECT_FALSE(a.transport.read_blocks("nobody", one, one));
  EXPECT_EQ(peer_stats(a.transport, "b").strikes, 0);
}

TEST_F(ReadTest, ReadAfterCloseThrows) {
  a.transport.close();
  EXPECT_THROW((void)read({0}, {0}), std::logic_error);
}

TEST_F(ReadTest, FailedPostIsNulloptAndAStrike) {
  plan().fail_next_posts(Status::kBackend);
  EXPECT_FALSE(read({0}, {0}));
  const PeerStats s = peer_stats(a.transport, "b");
  EXPECT_EQ(s.post_failures, 1u);
  EXPECT_EQ(s.strikes, 1);
  EXPECT_TRUE(a.pool.all(0));
}

TEST_F(ReadTest, ConsecutiveFailedReadsFaultThePeer) {
  for (int i = 0; i < 3; ++i) {
    const TransferId id = posted({i}, {i});
    plan().finish_with(id, Status::kBackend);
    EXPECT_EQ(a.transport.poll("b").failed, ids({id}));
  }
  const PeerStats s = peer_stats(a.transport, "b");
  ASSERT_TRUE(s.fault);
  EXPECT_NE(s.fault->find("BACKEND"), std::string::npos) << *s.fault;
}

TEST_F(ReadTest, ADisconnectedPeerFaultsAtOnce) {
  plan().hold_next();
  const TransferId id = posted({0}, {0});
  plan().disconnect("agent-b");
  const PollResult r = a.transport.poll("b");
  EXPECT_EQ(r.failed, ids({id}));
  ASSERT_TRUE(r.peer_fault);
  EXPECT_NE(r.peer_fault->find("REMOTE_DISCONNECT"), std::string::npos) << *r.peer_fault;
}

TEST_F(ReadTest, HeldReadLandsWhenReleasedByThePlan) {
  plan().hold_next();
  const TransferId id = posted({6}, {7});
  EXPECT_TRUE(a.transport.poll("b").empty());
  EXPECT_TRUE(a.pool.all(0));
  plan().land(id);
  EXPECT_EQ(a.transport.poll("b").done, ids({id}));
  EXPECT_TRUE(brought(6, 7));
}

TEST_F(ReadTest, WaitCancelKeepsAReadInFlightUntilItEnds) {
  plan().hold_next();
  const TransferId id = posted({6}, {7});
  EXPECT_EQ(a.transport.cancel(ids({id}), CancelMode::kWait), ids({id}));
  plan().land(id);
  EXPECT_TRUE(a.transport.cancel(ids({id}), CancelMode::kWait).empty());
  EXPECT_TRUE(brought(6, 7));
  EXPECT_EQ(a.transport.stats().live.transfers, 0u);
}

TEST_F(ReadTest, ImmediateCancelStopsAReadNotYetLanded) {
  plan().hold_next();
  const TransferId id = posted({6}, {7});
  EXPECT_TRUE(a.transport.cancel(ids({id}), CancelMode::kImmediate).empty());
  // Unlike a WRITE, nothing of a cancelled READ is kept: no request left.
  EXPECT_EQ(a.transport.stats().live.requests, 0u);
  plan().land(id);
  EXPECT_TRUE(a.pool.all(0));
  EXPECT_TRUE(a.transport.poll().empty());
}

TEST_F(ReadTest, RemovingThePeerEndsItsReadsAndNothingLandsLater) {
  plan().hold_next();
  const TransferId id = posted({6}, {7});
  a.transport.remove_remote_peer("b");
  plan().land(id);
  EXPECT_TRUE(a.pool.all(0));
  // Reported once, failed: nothing of it reached our pool.
  const PollResult reported = a.transport.poll();
  EXPECT_EQ(reported.failed, std::vector<TransferId>{id});
  EXPECT_TRUE(reported.done.empty());
  EXPECT_TRUE(a.transport.poll().empty());
  EXPECT_EQ(a.transport.stats().live, HandleCounts{.memory_registrations = 1});
}

TEST_F(ReadTest, CloseWithReadsInFlightLeaksNothing) {
  plan().hold_next(2);
  (void)posted({0}, {0});
  (void)posted({1}, {1});
  a.transport.close();
  EXPECT_EQ(a.transport.stats().live, HandleCounts{});
}

class ReadStallTest : public ::testing::Test {
 protected:
  ReadStallTest() { add_peer(a.transport, "b", b.transport); }
  Agent b{"agent-b"};
  Agent a{"agent-a", read_options(std::chrono::milliseconds(50))};
};

TEST_F(ReadStallTest, AReadInFlightPastTheTimeoutFaultsItsPeer) {
  a.plan().hold_next();
  const std::vector<std::int64_t> one{1};
  const auto id = a.transport.read_blocks("b", one, one);
  ASSERT_TRUE(id);
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  const PollResult r = a.transport.poll("b");
  ASSERT_TRUE(r.peer_fault);
  EXPECT_NE(r.peer_fault->find("STALLED"), std::string::npos) << *r.peer_fault;
}

}  // namespace
}  // namespace kvxfer::unit
