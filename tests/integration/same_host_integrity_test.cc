// SPDX-License-Identifier: Apache-2.0
// Nothing outside the target's pool, from our own side, on the same-host lane
// (process_vm_writev): every target here maps a guard region right after its
// pool, in the same mapping, and never registers it; a WRITE that escaped the
// pool would land there, so "guard ok" from the target is the verdict.
//  - indices the caller changes while write_blocks reads them;
//  - metadata whose base or geometry is not what the target registered;
//  - copies still running when the peer is removed.
// The first and last also with the target's pool in a SharedPool, which the
// initiator maps and copies into with memcpy.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/sanitizers.h"
#include "it_support.h"
#include "kvxfer/transport.h"
#include "wire/cookie.h"
#include "wire/metadata.h"
#include "wire/peer_blob.h"

namespace kvxfer::it {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr bool kThreadSanitizer = internal::kUnderThreadSanitizer;

constexpr std::uint64_t kGen = 1;

// A UCX transport over `pool` with shared memory allowed, so that a target
// on this host gets the same-host lane.
Transport make_initiator(MappedPool& pool, const std::string& name = "initiator",
                         const std::map<std::string, std::string>& engine_config = {}) {
  pool.fill_generation(kGen);
  Options options;
  options.backends = {"UCX"};
  options.engine_config = engine_config;
  options.engine_config["TLS"] = "sm,self";
  return Transport(name, Region{pool.base(), pool.num_blocks(), pool.block_len()}, options);
}

TargetOptions guarded_target(std::uint64_t num_blocks, std::uint64_t block_len,
                             std::uint64_t guard_bytes, bool shared_pool = false) {
  TargetOptions t;
  t.num_blocks = num_blocks;
  t.block_len = block_len;
  t.guard_bytes = guard_bytes;
  t.shared_pool = shared_pool;
  return t;
}

std::uint64_t mapped_peers(const Transport& transport) {
  const auto counters = transport.stats().engine_counters;
  const auto it = counters.find("cma_mapped_peers");
  return it == counters.end() ? 0 : it->second;
}

// Polls `peer_id` until nothing of it is in flight (or 30 s pass).
void drain(Transport& transport, const std::string& peer_id) {
  const auto deadline = Clock::now() + 30s;
  for (;;) {
    (void)transport.poll(peer_id);
    std::uint64_t inflight = 0;
    for (const PeerStats& p : transport.stats().peers) {
      if (p.peer_id == peer_id) inflight = p.inflight;
    }
    if (inflight == 0 || Clock::now() > deadline) return;
    std::this_thread::sleep_for(200us);
  }
}

std::uint64_t cma_writes(const Transport& transport) {
  const auto counters = transport.stats().engine_counters;
  const auto it = counters.find("cma_writes");
  return it == counters.end() ? 0 : it->second;
}

// ---------------------------------------------------------------------------
// A: indices changed under write_blocks
// ---------------------------------------------------------------------------

// Spins for a while that varies with k (0 to about a microsecond).
void hold(std::uint64_t k) {
  for (std::uint64_t i = (k * 2654435761u) % 1024; i > 0; --i) {
    std::atomic_signal_fence(std::memory_order_seq_cst);
  }
}

// One thread flips the last remote index between a valid block and one past
// the pool while this one loops write_blocks: every write is refused (the
// caller's mistake) or posts the indices that were checked.
// With `shared`, the target's pool (guard included) is a SharedPool that the
// initiator maps: the guard then lies in the very file it maps from.
void remote_index_changed_during_writes(bool shared) {
  constexpr std::uint64_t kBlocks = 64;
  constexpr std::uint64_t kBlockLen = 4096;
  constexpr std::uint64_t kGuardBlocks = 8;
  TargetProcess target(guarded_target(kBlocks, kBlockLen, kGuardBlocks * kBlockLen, shared));
  MappedPool pool(kBlocks, kBlockLen);
  Transport initiator = make_initiator(pool);
  initiator.add_remote_peer("t", target.metadata(), target.base_addr(), target.num_blocks(),
                            target.block_len());
  EXPECT_EQ(mapped_peers(initiator), shared ? 1u : 0u);

  constexpr std::size_t kPerWrite = 16;
  std::vector<std::int64_t> local(kPerWrite);
  std::vector<std::int64_t> remote(kPerWrite);
  for (std::size_t i = 0; i < kPerWrite; ++i) {
    local[i] = static_cast<std::int64_t>(i);
    remote[i] = static_cast<std::int64_t>(kBlocks - kPerWrite + i);
  }
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> flips{0};
  std::thread flipper([&] {
    std::atomic_ref<std::int64_t> last(remote.back());
    const std::int64_t valid = last.load();
    // Each value is held for a varying while, from nothing to about a
    // write's length, so some flips fall between any two reads of it.
    for (std::uint64_t k = 0; !stop.load(std::memory_order_relaxed); ++k) {
      last.store(static_cast<std::int64_t>(kBlocks + k % kGuardBlocks), std::memory_order_relaxed);
      hold(k);
      last.store(valid, std::memory_order_relaxed);
      hold(k * 7);
      flips.fetch_add(1, std::memory_order_relaxed);
    }
  });
  while (flips.load() == 0) std::this_thread::yield();

  std::uint64_t posted = 0;
  std::uint64_t refused = 0;
  std::uint64_t not_posted = 0;
  const auto deadline = Clock::now() + 2500ms;
  for (std::uint64_t n = 0; Clock::now() < deadline || n < 1000; ++n) {
    try {
      const auto id = initiator.write_blocks("t", std::span<const std::int64_t>(local),
                                             std::span<const std::int64_t>(remote));
      ++(id ? posted : not_posted);
    } catch (const std::invalid_argument&) {
      ++refused;
    }
    (void)initiator.poll("t");
  }
  stop = true;
  flipper.join();
  drain(initiator, "t");

  EXPECT_EQ(target.request("guard"), "guard ok")
      << posted << " writes posted, " << refused << " refused";
  EXPECT_EQ(not_posted, 0u);
  EXPECT_GT(cma_writes(initiator), 0u) << "the writes did not take the same-host lane";
}

TEST(SameHostIntegrityTest, RemoteIndexChangedDuringWritesNeverWritesPastThePool) {
  if (kThreadSanitizer) GTEST_SKIP() << "the test races index reads on purpose";
  remote_index_changed_during_writes(false);
}

TEST(SameHostIntegrityTest, RemoteIndexChangedDuringWritesNeverWritesPastAMappedPool) {
  if (kThreadSanitizer) GTEST_SKIP() << "the test races index reads on purpose";
  remote_index_changed_during_writes(true);
}

// ---------------------------------------------------------------------------
// B: metadata that does not describe the pool the target registered
// ---------------------------------------------------------------------------

class ForgedMetadataTest : public ::testing::Test {
 protected:
  static constexpr std::uint64_t kBlocks = 64;
  static constexpr std::uint64_t kBlockLen = 4096;
  // As large as the pool, so that any geometry below aims into it.
  static constexpr std::uint64_t kGuardBytes = kBlocks * kBlockLen;

  ForgedMetadataTest() : target_(guarded_target(kBlocks, kBlockLen, kGuardBytes)) {}

  // The target's real metadata with `change` applied, re-encoded.
  template <typename F>
  wire::AgentMetadata forged(F change) const {
    wire::AgentMetadata m = wire::decode(target_.metadata());
    change(m);
    return m;
  }

  // Registers `m` with an initiator whose blocks are `block_len` long; if
  // that is accepted, writes `local` -> `remote` the way the forged geometry
  // allows. The registration must be refused, and the guard stay untouched.
  void expect_refused(const wire::AgentMetadata& m, std::uint64_t block_len,
                      std::int64_t remote_block) {
    MappedPool pool(kBlocks, block_len);
    Transport initiator = make_initiator(pool);
    const std::vector<std::uint8_t> bytes = wire::encode(m);
    bool accepted = false;
    try {
      initiator.add_remote_peer("t", bytes, m.base_addr, m.num_blocks, m.block_len);
      accepted = true;
    } catch (const std::runtime_error& e) {
      // Refused at connect, saying what the target registered.
      EXPECT_NE(std::string(e.what()).find("the target registered"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(accepted) << "metadata with base " << m.base_addr << ", " << m.num_blocks
                           << " blocks of " << m.block_len << " was accepted";
    if (accepted) {
      const std::vector<std::int64_t> local{0};
      const std::vector<std::int64_t> remote{remote_block};
      const auto id = initiator.write_blocks("t", std::span<const std::int64_t>(local),
                                             std::span<const std::int64_t>(remote));
      if (id) drain(initiator, "t");
    }
    EXPECT_EQ(target_.request("guard"), "guard ok");
    EXPECT_TRUE(initiator.peers().empty());
  }

  TargetProcess target_;
};

TEST_F(ForgedMetadataTest, BaseMovedPastThePoolEndIsRefused) {
  const auto m = forged([](wire::AgentMetadata& x) { x.base_addr += kBlocks * kBlockLen; });
  expect_refused(m, kBlockLen, 0);
}

TEST_F(ForgedMetadataTest, BaseMovedByOneBlockIsRefused) {
  const auto m = forged([](wire::AgentMetadata& x) { x.base_addr += kBlockLen; });
  expect_refused(m, kBlockLen, kBlocks - 1);
}

TEST_F(ForgedMetadataTest, MoreBlocksThanRegisteredIsRefused) {
  const auto m = forged([](wire::AgentMetadata& x) { x.num_blocks += 8; });
  expect_refused(m, kBlockLen, kBlocks + 7);
}

TEST_F(ForgedMetadataTest, FewerBlocksThanRegisteredIsRefused) {
  // Harmless for the bytes, but not what the target registered either.
  const auto m = forged([](wire::AgentMetadata& x) { x.num_blocks -= 8; });
  expect_refused(m, kBlockLen, 0);
}

TEST_F(ForgedMetadataTest, LongerBlocksThanRegisteredAreRefused) {
  const auto m = forged([](wire::AgentMetadata& x) { x.block_len *= 2; });
  expect_refused(m, kBlockLen * 2, kBlocks - 1);
}

TEST_F(ForgedMetadataTest, TheRealMetadataIsAccepted) {
  MappedPool pool(kBlocks, kBlockLen);
  Transport initiator = make_initiator(pool);
  initiator.add_remote_peer("t", target_.metadata(), target_.base_addr(), kBlocks, kBlockLen);
  const std::vector<std::int64_t> local{3};
  const std::vector<std::int64_t> remote{kBlocks - 1};
  const auto id = initiator.write_blocks("t", std::span<const std::int64_t>(local),
                                         std::span<const std::int64_t>(remote));
  ASSERT_TRUE(id.has_value());
  drain(initiator, "t");
  EXPECT_EQ(target_.verify(kGen, local, remote), "ok");
  EXPECT_EQ(target_.request("guard"), "guard ok");
  EXPECT_GT(cma_writes(initiator), 0u) << "the write did not take the same-host lane";
}

// The caller's slices (engine_config KVXFER_CMA_SLICE, here 12 KiB, which
// divides neither the 40 KiB blocks nor the 1 MiB iovecs) are tails of the
// write's last iovec: every block lands whole, and nothing past the pool.
TEST(SameHostIntegrityTest, CallerSlicesOfTheSizeAskedLandEveryBlockAndNothingPastThePool) {
  constexpr std::uint64_t kBlocks = 64;
  constexpr std::uint64_t kBlockLen = 40 << 10;
  constexpr std::uint64_t kSlice = 12 << 10;
  TargetProcess target(guarded_target(kBlocks, kBlockLen, 8 * kBlockLen));
  MappedPool pool(kBlocks, kBlockLen);
  Transport initiator = make_initiator(pool, "initiator", {{"KVXFER_CMA_SLICE", "12K"}});
  initiator.add_remote_peer("t", target.metadata(), target.base_addr(), kBlocks, kBlockLen);
  // Groups of 8 blocks in reverse order into the target's blocks in order
  // (its last block the pool's last), with two targets swapped: runs of 1
  // to 8 blocks.
  std::vector<std::int64_t> local(kBlocks);
  std::vector<std::int64_t> remote(kBlocks);
  for (std::size_t i = 0; i < kBlocks; ++i) {
    local[i] =
        static_cast<std::int64_t>(kBlocks - 1 - i) / 8 * 8 + static_cast<std::int64_t>(i % 8);
    remote[i] = static_cast<std::int64_t>(i);
  }
  std::swap(remote[0], remote[6]);
  std::uint64_t slices = 0;
  for (int attempt = 0; attempt < 20 && slices == 0; ++attempt) {
    const auto id = initiator.write_blocks("t", std::span<const std::int64_t>(local),
                                           std::span<const std::int64_t>(remote));
    ASSERT_TRUE(id.has_value());
    for (bool done = false; !done;) {
      const PollResult r = initiator.poll("t");
      ASSERT_TRUE(r.failed.empty());
      done = !r.done.empty();
    }
    slices = initiator.stats().engine_counters.at("cma_caller_slices");
  }
  EXPECT_EQ(target.verify(kGen, local, remote), "ok");
  EXPECT_EQ(target.request("guard"), "guard ok");
  EXPECT_GT(slices, 0u) << "no poll() copied a slice";
  EXPECT_LE(initiator.stats().engine_counters.at("cma_caller_slice_max_bytes"), kSlice);
}

// A registered peer writes a well-formed cookie declaration (wire/cookie.h:
// an epoch, then a pool that starts at the target's guard) into a block of
// the target's pool; metadata then names that block as the cookie page and
// the guard as the pool. The declaration decodes and matches the metadata,
// but the page is not a cookie page (not the one-page memfd a Cookie maps):
// refused.
TEST_F(ForgedMetadataTest, ACookieForgedInsideThePoolIsRefused) {
  constexpr std::int64_t kFakeBlock = 5;
  constexpr std::uint64_t kFakeEpoch = 0x6b7678666f726765;
  const std::uint64_t guard_base = target_.base_addr() + kBlocks * kBlockLen;
  {
    MappedPool pool(kBlocks, kBlockLen);
    Transport writer = make_initiator(pool, "writer");
    wire::encode_cookie(pool.block(0),
                        wire::CookieDeclaration{kFakeEpoch, guard_base, kBlocks, kBlockLen});
    writer.add_remote_peer("t", target_.metadata(), target_.base_addr(), kBlocks, kBlockLen);
    const std::vector<std::int64_t> local{0};
    const std::vector<std::int64_t> remote{kFakeBlock};
    ASSERT_TRUE(writer
                    .write_blocks("t", std::span<const std::int64_t>(local),
                                  std::span<const std::int64_t>(remote))
                    .has_value());
    drain(writer, "t");
    ASSERT_EQ(writer.stats().peers.at(0).transfers_done, 1u);
  }
  wire::AgentMetadata m = wire::decode(target_.metadata());
  wire::PeerBlob blob;
  ASSERT_TRUE(wire::decode_blob(m.engine_blob, &blob));
  blob.cookie_addr = target_.base_addr() + kFakeBlock * kBlockLen;
  blob.cookie_epoch = kFakeEpoch;
  // Re-encode while the blob's views still point into m.engine_blob.
  std::vector<std::uint8_t> forged_blob = wire::encode_blob(blob);
  m.engine_blob = std::move(forged_blob);
  m.base_addr = guard_base;

  MappedPool pool(kBlocks, kBlockLen);
  Transport initiator = make_initiator(pool);
  bool accepted = false;
  try {
    initiator.add_remote_peer("t", wire::encode(m), m.base_addr, m.num_blocks, m.block_len);
    accepted = true;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not a cookie page"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(accepted) << "a declaration written into the pool was taken for a cookie";
  if (accepted) {
    const std::vector<std::int64_t> local{0};
    const std::vector<std::int64_t> remote{0};
    const auto id = initiator.write_blocks("t", std::span<const std::int64_t>(local),
                                           std::span<const std::int64_t>(remote));
    if (id) drain(initiator, "t");
  }
  EXPECT_EQ(target_.request("guard"), "guard ok");
}

// ---------------------------------------------------------------------------
// C: removal with copies in flight
// ---------------------------------------------------------------------------

// Many large writes are queued when the peer is removed. After
// remove_remote_peer returns, the initiator rewrites its pool twice (new
// generations), so a copy still running or started later would land bytes
// the target never held before the removal: its pool must not change
// between two snapshots, and no block may hold either new generation.
void no_byte_lands_after_remove_returns(bool shared) {
  constexpr std::uint64_t kBlocks = 64;
  constexpr std::uint64_t kBlockLen = 1024 * 1024;
  TargetProcess target(guarded_target(kBlocks, kBlockLen, kBlockLen, shared));
  MappedPool pool(kBlocks, kBlockLen);
  Transport initiator = make_initiator(pool);
  initiator.add_remote_peer("t", target.metadata(), target.base_addr(), kBlocks, kBlockLen);
  EXPECT_EQ(mapped_peers(initiator), shared ? 1u : 0u);

  std::vector<std::int64_t> all(kBlocks);
  for (std::uint64_t i = 0; i < kBlocks; ++i) all[i] = static_cast<std::int64_t>(i);
  for (int i = 0; i < 128; ++i) {  // 8 GiB of copying: seconds of it
    ASSERT_TRUE(initiator
                    .write_blocks("t", std::span<const std::int64_t>(all),
                                  std::span<const std::int64_t>(all))
                    .has_value());
  }
  const std::uint64_t requests_before = initiator.stats().live.requests;
  initiator.remove_remote_peer("t");
  const HandleCounts after = initiator.stats().live;
  pool.fill_generation(kGen + 1);
  const std::string first = target.request("checksum");
  pool.fill_generation(kGen + 2);
  std::this_thread::sleep_for(500ms);
  const std::string second = target.request("checksum");

  EXPECT_GT(requests_before, 0u) << "no copy was in flight when the peer was removed";
  EXPECT_EQ(after.requests, 0u) << "copies still queued or running after remove returned";
  EXPECT_EQ(after.transfers, 0u);
  EXPECT_EQ(first, second) << "the target's pool changed after remove_remote_peer returned";
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(kBlocks); ++i) {
    for (const std::uint64_t gen : {kGen + 1, kGen + 2}) {
      EXPECT_NE(target.verify(gen, {i}, {i}), "ok")
          << "block " << i << " holds what the initiator wrote after the removal";
    }
  }
  EXPECT_EQ(target.request("guard"), "guard ok");
}

TEST(SameHostIntegrityTest, NoByteLandsAfterRemoveReturns) {
  no_byte_lands_after_remove_returns(false);
}

// The mapping outlives nothing: once remove returns, no copy goes through it.
TEST(SameHostIntegrityTest, NoByteLandsInAMappedPoolAfterRemoveReturns) {
  no_byte_lands_after_remove_returns(true);
}

}  // namespace
}  // namespace kvxfer::it
