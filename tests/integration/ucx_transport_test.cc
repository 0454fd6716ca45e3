// SPDX-License-Identifier: Apache-2.0
// Real WRITEs between processes through the public Transport API and the UCX
// engine, over shared memory (UCX_TLS=sm,self) and over TCP (UCX_TLS=tcp),
// and over shared memory into targets whose pool is a kvxfer::SharedPool
// (mapped by the initiator: "shared").
// Every target is a kvxfer_it_target process that checks the bytes itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "it_lanes.h"
#include "it_support.h"
#include "kvxfer/transport.h"

namespace kvxfer::it {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Outcome {
  std::set<TransferId> done;
  std::set<TransferId> failed;
  std::optional<std::string> fault;
};

// An initiator: a UCX transport over a pool of the pattern of generation 1.
class Initiator {
 public:
  Initiator(const std::string& tls, std::uint64_t num_blocks, std::uint64_t block_len,
            bool progress_thread = true)
      : pool_(num_blocks, block_len), transport_(make(tls, pool_, progress_thread)) {}

  static constexpr std::uint64_t kGen = 1;

  Transport& transport() { return transport_; }

  void add(const std::string& peer_id, const TargetProcess& target) {
    transport_.add_remote_peer(peer_id, target.metadata(), target.base_addr(), target.num_blocks(),
                               target.block_len());
  }

  std::optional<TransferId> write(const std::string& peer_id,
                                  const std::vector<std::int64_t>& local,
                                  const std::vector<std::int64_t>& remote) {
    return transport_.write_blocks(peer_id, std::span<const std::int64_t>(local),
                                   std::span<const std::int64_t>(remote));
  }

  // Polls `peer_id` until every id in `ids` is reported or `timeout` passes.
  Outcome wait(const std::string& peer_id, const std::set<TransferId>& ids,
               std::chrono::milliseconds timeout = 30s) {
    Outcome out;
    const auto deadline = Clock::now() + timeout;
    while (out.done.size() + out.failed.size() < ids.size() && Clock::now() < deadline) {
      collect(peer_id, out);
      std::this_thread::sleep_for(100us);
    }
    return out;
  }

  void collect(const std::string& peer_id, Outcome& out) {
    PollResult r = transport_.poll(peer_id);
    out.done.insert(r.done.begin(), r.done.end());
    out.failed.insert(r.failed.begin(), r.failed.end());
    if (r.peer_fault) out.fault = r.peer_fault;
  }

  std::uint64_t inflight(const std::string& peer_id) {
    for (const PeerStats& p : transport_.stats().peers) {
      if (p.peer_id == peer_id) return p.inflight;
    }
    return 0;
  }

 private:
  static Transport make(const std::string& tls, MappedPool& pool, bool progress_thread) {
    pool.fill_generation(kGen);
    Options options;
    options.backends = {"UCX"};
    options.progress_thread = progress_thread;
    options.engine_config = with_tls({}, tls);
    return Transport("initiator", Region{pool.base(), pool.num_blocks(), pool.block_len()},
                     options);
  }

  MappedPool pool_;
  Transport transport_;
};

// What an initiator saw of a peer that went down.
struct Teardown {
  Outcome outcome;
  std::set<TransferId> posted_after_kill;
  Clock::duration elapsed{};
};

class UcxTransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  // "shared": over shared memory, into targets whose pool is a SharedPool,
  // which the initiator maps (the same-host lane's memcpy path).
  [[nodiscard]] bool shared() const { return GetParam() == "shared"; }
  [[nodiscard]] std::string tls() const { return shared() ? "sm,self" : GetParam(); }

  TargetOptions target(std::string name, std::uint64_t num_blocks, std::uint64_t block_len) const {
    TargetOptions t;
    t.name = std::move(name);
    t.num_blocks = num_blocks;
    t.block_len = block_len;
    t.tls = tls();
    t.shared_pool = shared();
    return t;
  }

  // Writes `rounds` batches of `batch` random blocks and has the target
  // check every block of every batch.
  void write_random_and_verify(std::uint64_t num_blocks, std::uint64_t block_len, std::size_t batch,
                               int rounds) {
    TargetProcess t(target("target", num_blocks, block_len));
    Initiator a(tls(), num_blocks, block_len);
    a.add("t", t);
    const auto counters = a.transport().stats().engine_counters;
    EXPECT_EQ(counters.contains("cma_mapped_peers") ? counters.at("cma_mapped_peers") : 0,
              shared() ? 1u : 0u)
        << "the target's pool was " << (shared() ? "not " : "") << "mapped";
    std::mt19937_64 rng(42);
    for (int round = 0; round < rounds; ++round) {
      const auto local = random_sample(rng, num_blocks, batch);
      const auto remote = random_sample(rng, num_blocks, batch);
      const auto id = a.write("t", local, remote);
      ASSERT_TRUE(id.has_value());
      const Outcome out = a.wait("t", {*id});
      ASSERT_EQ(out.done, std::set<TransferId>{*id}) << "round " << round;
      EXPECT_EQ(t.verify(Initiator::kGen, local, remote), "ok") << "round " << round;
    }
  }
};

TEST_P(UcxTransportTest, RandomBlocksOf64KiBLandByteForByte) {
  write_random_and_verify(/*num_blocks=*/64, /*block_len=*/64 * 1024, /*batch=*/16, /*rounds=*/4);
}

TEST_P(UcxTransportTest, RandomBlocksOf2MiBLandByteForByte) {
  write_random_and_verify(/*num_blocks=*/24, /*block_len=*/2 * 1024 * 1024, /*batch=*/16,
                          /*rounds=*/2);
}

TEST_P(UcxTransportTest, RandomBlocksOf4KiBLandByteForByte) {
  write_random_and_verify(/*num_blocks=*/2048, /*block_len=*/4096, /*batch=*/1024, /*rounds=*/2);
}

TEST_P(UcxTransportTest, RunsOfConsecutiveBlocksLandByteForByte) {
  TargetProcess t(target("target", 256, 16 * 1024));
  Initiator a(tls(), 256, 16 * 1024);
  a.add("t", t);
  // Three runs on both sides, one run only on the local side.
  const std::vector<std::int64_t> local = {0, 1, 2, 3, 10, 11, 40, 41, 42, 100, 101};
  const std::vector<std::int64_t> remote = {200, 201, 202, 203, 50, 51, 7, 8, 9, 30, 90};
  const auto id = a.write("t", local, remote);
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(a.wait("t", {*id}).done, std::set<TransferId>{*id});
  EXPECT_EQ(t.verify(Initiator::kGen, local, remote), "ok");
}

TEST_P(UcxTransportTest, ManyWritesInFlightAllLand) {
  constexpr std::uint64_t kBlocks = 512;
  constexpr std::size_t kPerWrite = 4;
  TargetProcess t(target("target", kBlocks, 16 * 1024));
  Initiator a(tls(), kBlocks, 16 * 1024);
  a.add("t", t);
  std::mt19937_64 rng(7);
  // Every write goes to its own remote blocks, so all can be checked at the end.
  const auto remote_all = random_sample(rng, kBlocks, kBlocks);
  std::vector<std::int64_t> local_all;
  std::set<TransferId> ids;
  for (std::size_t w = 0; w < kBlocks / kPerWrite; ++w) {
    const auto local = random_sample(rng, kBlocks, kPerWrite);
    const std::vector<std::int64_t> remote(
        remote_all.begin() + static_cast<std::ptrdiff_t>(w * kPerWrite),
        remote_all.begin() + static_cast<std::ptrdiff_t>((w + 1) * kPerWrite));
    const auto id = a.write("t", local, remote);
    ASSERT_TRUE(id.has_value());
    ids.insert(*id);
    local_all.insert(local_all.end(), local.begin(), local.end());
  }
  const Outcome out = a.wait("t", ids);
  EXPECT_EQ(out.done, ids);
  EXPECT_TRUE(out.failed.empty());
  EXPECT_EQ(t.verify(Initiator::kGen, local_all, remote_all), "ok");
  EXPECT_EQ(a.transport().stats().live.transfers, 0u);
}

TEST_P(UcxTransportTest, TwoTargetsInThreeProcessesEachGetTheirBlocks) {
  TargetProcess b(target("target-b", 128, 32 * 1024));
  TargetProcess c(target("target-c", 128, 32 * 1024));
  Initiator a(tls(), 128, 32 * 1024);
  a.add("b", b);
  a.add("c", c);
  std::mt19937_64 rng(11);
  std::vector<std::int64_t> lb, rb, lc, rc;
  std::set<TransferId> ids_b, ids_c;
  const auto remote_b = random_sample(rng, 128, 128);
  const auto remote_c = random_sample(rng, 128, 128);
  for (std::size_t w = 0; w < 16; ++w) {
    const auto local = random_sample(rng, 128, 8);
    const std::vector<std::int64_t> to_b(remote_b.begin() + static_cast<std::ptrdiff_t>(w * 8),
                                         remote_b.begin() + static_cast<std::ptrdiff_t>(w * 8 + 8));
    const std::vector<std::int64_t> to_c(remote_c.begin() + static_cast<std::ptrdiff_t>(w * 8),
                                         remote_c.begin() + static_cast<std::ptrdiff_t>(w * 8 + 8));
    const auto idb = a.write("b", local, to_b);
    const auto idc = a.write("c", local, to_c);
    ASSERT_TRUE(idb && idc);
    ids_b.insert(*idb);
    ids_c.insert(*idc);
    lb.insert(lb.end(), local.begin(), local.end());
    rb.insert(rb.end(), to_b.begin(), to_b.end());
    lc.insert(lc.end(), local.begin(), local.end());
    rc.insert(rc.end(), to_c.begin(), to_c.end());
  }
  EXPECT_EQ(a.wait("b", ids_b).done, ids_b);
  EXPECT_EQ(a.wait("c", ids_c).done, ids_c);
  EXPECT_EQ(b.verify(Initiator::kGen, lb, rb), "ok");
  EXPECT_EQ(c.verify(Initiator::kGen, lc, rc), "ok");
}

// Streams writes (several in flight), SIGKILLs the target, and keeps
// writing and polling until the peer is faulted and nothing is in flight.
// Returns what the initiator saw.
Teardown kill_mid_stream(Initiator& a, TargetProcess& t, std::uint64_t num_blocks) {
  Teardown result;
  std::mt19937_64 rng(3);
  std::set<TransferId> posted;
  Outcome& out = result.outcome;
  auto post_one = [&]() -> std::optional<TransferId> {
    const auto local = random_sample(rng, num_blocks, 16);
    const auto remote = random_sample(rng, num_blocks, 16);
    const auto id = a.write("t", local, remote);
    if (id) posted.insert(*id);
    return id;
  };
  // Warm up: some writes land before the kill.
  while (out.done.size() < 20) {
    while (posted.size() - out.done.size() - out.failed.size() < 8) {
      if (!post_one()) ADD_FAILURE() << "post failed before the kill";
    }
    a.collect("t", out);
  }
  for (int i = 0; i < 8; ++i) post_one();

  const auto killed_at = Clock::now();
  t.kill9();
  const auto deadline = killed_at + 10s;
  while (Clock::now() < deadline) {
    a.collect("t", out);
    if (out.fault && a.inflight("t") == 0) break;
    if (!out.fault && posted.size() - out.done.size() - out.failed.size() < 8) {
      if (const auto id = post_one()) result.posted_after_kill.insert(*id);
    }
    std::this_thread::sleep_for(200us);
  }
  result.elapsed = Clock::now() - killed_at;
  // Everything posted was reported once, as done or failed.
  std::set<TransferId> reported = out.done;
  reported.insert(out.failed.begin(), out.failed.end());
  EXPECT_EQ(reported, posted);
  for (const TransferId id : out.done) EXPECT_EQ(out.failed.count(id), 0u) << id;
  return result;
}

TEST_P(UcxTransportTest, SigkilledTargetFaultsPeerAndFailsInflightWithin5s) {
  constexpr std::uint64_t kBlocks = 128;
  TargetProcess t(target("target", kBlocks, 64 * 1024));
  Initiator a(tls(), kBlocks, 64 * 1024);
  a.add("t", t);
  const auto seen = kill_mid_stream(a, t, kBlocks);
  ASSERT_TRUE(seen.outcome.fault.has_value());
  EXPECT_NE(seen.outcome.fault->find("REMOTE_DISCONNECT"), std::string::npos)
      << *seen.outcome.fault;
  EXPECT_EQ(a.inflight("t"), 0u);
  EXPECT_LT(seen.elapsed, 5s);
  // Nothing written after the target died can be reported as landed.
  for (const TransferId id : seen.posted_after_kill) {
    EXPECT_EQ(seen.outcome.done.count(id), 0u) << "transfer " << id << " posted after the kill";
  }
  // Removing the dead peer gives back every handle it held.
  a.transport().remove_remote_peer("t");
  const HandleCounts live = a.transport().stats().live;
  EXPECT_EQ(live.peers, 0u);
  EXPECT_EQ(live.remote_keys, 0u);
  EXPECT_EQ(live.transfers, 0u);
  EXPECT_EQ(live.requests, 0u);
}

TEST_P(UcxTransportTest, RestartedTargetRegisteredAgainTakesWrites) {
  constexpr std::uint64_t kBlocks = 128;
  auto t = std::make_unique<TargetProcess>(target("target", kBlocks, 64 * 1024));
  Initiator a(tls(), kBlocks, 64 * 1024);
  a.add("t", *t);
  const auto seen = kill_mid_stream(a, *t, kBlocks);
  ASSERT_TRUE(seen.outcome.fault.has_value());

  t = std::make_unique<TargetProcess>(target("target", kBlocks, 64 * 1024));
  a.add("t", *t);  // re-registration replaces the faulted one
  std::mt19937_64 rng(5);
  const auto local = random_sample(rng, kBlocks, 16);
  const auto remote = random_sample(rng, kBlocks, 16);
  const auto id = a.write("t", local, remote);
  ASSERT_TRUE(id.has_value());
  const Outcome out = a.wait("t", {*id});
  EXPECT_EQ(out.done, std::set<TransferId>{*id});
  EXPECT_FALSE(out.fault.has_value());
  EXPECT_EQ(t->verify(Initiator::kGen, local, remote), "ok");
}

TEST_P(UcxTransportTest, TargetThatClosedItsTransportIsNeverWrittenAgain) {
  constexpr std::uint64_t kBlocks = 64;
  TargetProcess t(target("target", kBlocks, 64 * 1024));
  Initiator a(tls(), kBlocks, 64 * 1024);
  a.add("t", t);
  std::mt19937_64 rng(9);
  const auto first = a.write("t", random_sample(rng, kBlocks, 8), random_sample(rng, kBlocks, 8));
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ(a.wait("t", {*first}).done, std::set<TransferId>{*first});

  // The process lives on with its pool mapped; only its transport is gone.
  ASSERT_EQ(t.request("close"), "closed");
  const std::string sum_after_close = t.request("checksum");
  Outcome out;
  const auto deadline = Clock::now() + 5s;
  std::set<TransferId> posted;
  while (!out.fault && Clock::now() < deadline) {
    if (posted.size() - out.done.size() - out.failed.size() < 4) {
      if (const auto id =
              a.write("t", random_sample(rng, kBlocks, 8), random_sample(rng, kBlocks, 8))) {
        posted.insert(*id);
      }
    }
    a.collect("t", out);
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(out.fault.has_value());
  EXPECT_NE(out.fault->find("REMOTE_DISCONNECT"), std::string::npos) << *out.fault;
  EXPECT_TRUE(out.done.empty());
  EXPECT_EQ(t.request("checksum"), sum_after_close);
}

TEST_P(UcxTransportTest, InitiatorWithoutProgressThreadCompletesThroughPoll) {
  TargetProcess t(target("target", 64, 64 * 1024));
  Initiator a(tls(), 64, 64 * 1024, /*progress_thread=*/false);
  a.add("t", t);
  std::mt19937_64 rng(13);
  std::set<TransferId> ids;
  std::vector<std::int64_t> local_all;
  const auto remote_all = random_sample(rng, 64, 64);
  for (std::size_t w = 0; w < 8; ++w) {
    const auto local = random_sample(rng, 64, 8);
    const std::vector<std::int64_t> remote(
        remote_all.begin() + static_cast<std::ptrdiff_t>(w * 8),
        remote_all.begin() + static_cast<std::ptrdiff_t>(w * 8 + 8));
    const auto id = a.write("t", local, remote);
    ASSERT_TRUE(id.has_value());
    ids.insert(*id);
    local_all.insert(local_all.end(), local.begin(), local.end());
  }
  EXPECT_EQ(a.wait("t", ids).done, ids);
  EXPECT_EQ(t.verify(Initiator::kGen, local_all, remote_all), "ok");
}

TEST_P(UcxTransportTest, EveryHandleIsGivenBackWhenPeersAreRemoved) {
  TargetProcess t(target("target", 64, 64 * 1024));
  Initiator a(tls(), 64, 64 * 1024);
  a.add("t", t);
  std::mt19937_64 rng(17);
  std::set<TransferId> ids;
  for (int w = 0; w < 16; ++w) {
    const auto id = a.write("t", random_sample(rng, 64, 8), random_sample(rng, 64, 8));
    ASSERT_TRUE(id.has_value());
    ids.insert(*id);
  }
  // Forgotten at once: their WRITEs still finish inside the engine.
  const std::vector<TransferId> forget(ids.begin(), ids.end());
  EXPECT_TRUE(a.transport().cancel(forget, CancelMode::kImmediate).empty());
  a.transport().remove_remote_peer("t");
  const HandleCounts live = a.transport().stats().live;
  EXPECT_EQ(live.memory_registrations, 1u);
  EXPECT_EQ(live.peers, 0u);
  EXPECT_EQ(live.remote_keys, 0u);
  EXPECT_EQ(live.transfers, 0u);
  EXPECT_EQ(live.requests, 0u);
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxTransportTest,
                         ::testing::Values("sm,self", "tcp", "shared", "ucx"),
                         [](const ::testing::TestParamInfo<std::string>& tls) {
                           return tls.param == "sm,self" ? std::string("sm") : tls.param;
                         });

}  // namespace
}  // namespace kvxfer::it
