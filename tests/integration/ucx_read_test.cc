// SPDX-License-Identifier: Apache-2.0
// Real READs between processes through the public Transport API: the
// initiator pulls blocks of a kvxfer_it_target process (whose pool holds the
// pattern of generation kTargetGen) into its own pool and checks every byte
// itself, over shared memory (the same-host lane, process_vm_readv) and over
// TCP (the tcp lane, and the ucx lane's gets over UCX's tcp transport).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
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

constexpr std::uint64_t kOwnGen = 1;     // the initiator's pool before any read
constexpr std::uint64_t kTargetGen = 5;  // the target's pool

struct Outcome {
  std::set<TransferId> done;
  std::set<TransferId> failed;
  std::optional<std::string> fault;
};

class UcxReadTest : public ::testing::TestWithParam<std::string> {
 protected:
  [[nodiscard]] std::string tls() const { return GetParam(); }

  std::unique_ptr<TargetProcess> start_target(std::uint64_t num_blocks, std::uint64_t block_len) {
    TargetOptions t;
    t.name = "target";
    t.num_blocks = num_blocks;
    t.block_len = block_len;
    t.tls = tls();
    auto target = std::make_unique<TargetProcess>(t);
    EXPECT_EQ(target->request("fill " + std::to_string(kTargetGen)), "filled");
    return target;
  }

  void open(std::uint64_t num_blocks, std::uint64_t block_len) {
    pool_ = std::make_unique<MappedPool>(num_blocks, block_len);
    pool_->fill_generation(kOwnGen);
    Options options;
    options.backends = {"UCX"};
    options.engine_config = with_tls({}, tls());
    transport_ = std::make_unique<Transport>("initiator",
                                             Region{pool_->base(), num_blocks, block_len}, options);
  }

  void add(const TargetProcess& t) {
    transport_->add_remote_peer("t", t.metadata(), t.base_addr(), t.num_blocks(), t.block_len());
  }

  std::optional<TransferId> read(const std::vector<std::int64_t>& local,
                                 const std::vector<std::int64_t>& remote) {
    return transport_->read_blocks("t", std::span<const std::int64_t>(local),
                                   std::span<const std::int64_t>(remote));
  }

  void collect(Outcome& out) {
    PollResult r = transport_->poll("t");
    out.done.insert(r.done.begin(), r.done.end());
    out.failed.insert(r.failed.begin(), r.failed.end());
    if (r.peer_fault) out.fault = r.peer_fault;
  }

  Outcome wait(const std::set<TransferId>& ids, std::chrono::milliseconds timeout = 30s) {
    Outcome out;
    const auto deadline = Clock::now() + timeout;
    while (out.done.size() + out.failed.size() < ids.size() && Clock::now() < deadline) {
      collect(out);
      std::this_thread::sleep_for(100us);
    }
    return out;
  }

  // "ok" when our block local[i] holds the target's block remote[i] and every
  // block not in `local` still holds our own pattern.
  std::string check(const std::vector<std::int64_t>& local,
                    const std::vector<std::int64_t>& remote) const {
    std::vector<bool> read_into(pool_->num_blocks(), false);
    for (std::size_t i = 0; i < local.size(); ++i) {
      const auto l = static_cast<std::uint64_t>(local[i]);
      read_into[l] = true;
      const std::int64_t at = first_mismatch(pool_->block(l), pool_->block_len(), kTargetGen,
                                             static_cast<std::uint64_t>(remote[i]));
      if (at >= 0) {
        return "bad local=" + std::to_string(l) + " remote=" + std::to_string(remote[i]) +
               " offset=" + std::to_string(at);
      }
    }
    for (std::uint64_t l = 0; l < pool_->num_blocks(); ++l) {
      if (!read_into[l] && first_mismatch(pool_->block(l), pool_->block_len(), kOwnGen, l) >= 0) {
        return "block " + std::to_string(l) + " changed without being read into";
      }
    }
    return "ok";
  }

  void read_random_and_check(std::uint64_t num_blocks, std::uint64_t block_len, std::size_t batch) {
    auto t = start_target(num_blocks, block_len);
    open(num_blocks, block_len);
    add(*t);
    std::mt19937_64 rng(42);
    const auto local = random_sample(rng, num_blocks, batch);
    const auto remote = random_sample(rng, num_blocks, batch);
    const auto id = read(local, remote);
    ASSERT_TRUE(id.has_value());
    const Outcome out = wait({*id});
    ASSERT_EQ(out.done, std::set<TransferId>{*id});
    EXPECT_EQ(check(local, remote), "ok");
    // The lane the read took: process_vm_readv on this host, the tcp lane,
    // or gets on the ucx lane.
    const auto counters = transport_->stats().engine_counters;
    EXPECT_EQ(counters.at(lane_counter(tls(), "reads")), 1u);
  }

  std::unique_ptr<MappedPool> pool_;
  std::unique_ptr<Transport> transport_;  // declared after the pool: closed first
};

TEST_P(UcxReadTest, RandomBlocksOf64KiBAreReadByteForByte) {
  read_random_and_check(/*num_blocks=*/64, /*block_len=*/64 * 1024, /*batch=*/16);
}

TEST_P(UcxReadTest, RandomBlocksOf2MiBAreReadByteForByte) {
  read_random_and_check(/*num_blocks=*/24, /*block_len=*/2 * 1024 * 1024, /*batch=*/16);
}

TEST_P(UcxReadTest, RandomBlocksOf4KiBAreReadByteForByte) {
  read_random_and_check(/*num_blocks=*/2048, /*block_len=*/4096, /*batch=*/1024);
}

TEST_P(UcxReadTest, RunsOfConsecutiveBlocksAreReadByteForByte) {
  auto t = start_target(256, 16 * 1024);
  open(256, 16 * 1024);
  add(*t);
  const std::vector<std::int64_t> local = {0, 1, 2, 3, 10, 11, 40, 41, 42, 100, 101};
  const std::vector<std::int64_t> remote = {200, 201, 202, 203, 50, 51, 7, 8, 9, 30, 90};
  const auto id = read(local, remote);
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(wait({*id}).done, std::set<TransferId>{*id});
  EXPECT_EQ(check(local, remote), "ok");
}

TEST_P(UcxReadTest, ReadsAndWritesInFlightTogetherAllFinish) {
  constexpr std::uint64_t kBlocks = 256;
  auto t = start_target(kBlocks, 16 * 1024);
  open(kBlocks, 16 * 1024);
  add(*t);
  // Reads into our lower half from the target's lower half; writes from our
  // upper half into the target's upper half: no block is both read and
  // written.
  std::mt19937_64 rng(7);
  const auto local_all = random_sample(rng, kBlocks / 2, kBlocks / 2);
  std::vector<std::int64_t> remote_all = random_sample(rng, kBlocks / 2, kBlocks / 2);
  std::set<TransferId> ids;
  for (std::size_t w = 0; w < 16; ++w) {
    const std::vector<std::int64_t> l(local_all.begin() + static_cast<std::ptrdiff_t>(w * 8),
                                      local_all.begin() + static_cast<std::ptrdiff_t>(w * 8 + 8));
    const std::vector<std::int64_t> r(remote_all.begin() + static_cast<std::ptrdiff_t>(w * 8),
                                      remote_all.begin() + static_cast<std::ptrdiff_t>(w * 8 + 8));
    const auto rid = read(l, r);
    ASSERT_TRUE(rid.has_value());
    ids.insert(*rid);
    const std::vector<std::int64_t> up{static_cast<std::int64_t>(kBlocks / 2 + w)};
    const auto wid = transport_->write_blocks("t", std::span<const std::int64_t>(up),
                                              std::span<const std::int64_t>(up));
    ASSERT_TRUE(wid.has_value());
    ids.insert(*wid);
  }
  const Outcome out = wait(ids);
  EXPECT_EQ(out.done, ids);
  EXPECT_TRUE(out.failed.empty());
  EXPECT_EQ(check(local_all, remote_all), "ok");
  std::vector<std::int64_t> up;
  for (std::size_t w = 0; w < 16; ++w) up.push_back(static_cast<std::int64_t>(kBlocks / 2 + w));
  EXPECT_EQ(t->verify(kOwnGen, up, up), "ok");
  EXPECT_EQ(transport_->stats().live.transfers, 0u);
}

TEST_P(UcxReadTest, SigkilledTargetFailsReadsAndNothingReadAfterwardIsDone) {
  constexpr std::uint64_t kBlocks = 128;
  auto t = start_target(kBlocks, 64 * 1024);
  open(kBlocks, 64 * 1024);
  add(*t);
  std::mt19937_64 rng(3);
  std::set<TransferId> posted;
  std::set<TransferId> after_kill;
  Outcome out;
  // Reads in flight together never share a local block (two copies into one
  // block would race): each takes a free group of 16.
  std::map<TransferId, std::int64_t> group_of;
  std::set<std::int64_t> free_groups;
  for (std::int64_t g = 0; g < static_cast<std::int64_t>(kBlocks / 16); ++g) free_groups.insert(g);
  const auto settle = [&] {
    for (auto it = group_of.begin(); it != group_of.end();) {
      if (out.done.count(it->first) != 0 || out.failed.count(it->first) != 0) {
        free_groups.insert(it->second);
        it = group_of.erase(it);
      } else {
        ++it;
      }
    }
  };
  const auto post_one = [&]() -> std::optional<TransferId> {
    settle();
    if (free_groups.empty()) return std::nullopt;
    const std::int64_t g = *free_groups.begin();
    auto local = random_sample(rng, 16, 16);
    for (auto& l : local) l += g * 16;
    const auto id = read(local, random_sample(rng, kBlocks, 16));
    if (id) {
      posted.insert(*id);
      group_of[*id] = g;
      free_groups.erase(g);
    }
    return id;
  };
  while (out.done.size() < 10) {
    while (posted.size() - out.done.size() - out.failed.size() < 4) {
      if (!post_one()) ADD_FAILURE() << "post failed before the kill";
    }
    collect(out);
  }
  t->kill9();
  const auto deadline = Clock::now() + 10s;
  while (Clock::now() < deadline) {
    collect(out);
    if (out.fault && transport_->stats().inflight == 0) break;
    if (!out.fault && posted.size() - out.done.size() - out.failed.size() < 4) {
      if (const auto id = post_one()) after_kill.insert(*id);
    }
    std::this_thread::sleep_for(200us);
  }
  ASSERT_TRUE(out.fault.has_value());
  EXPECT_NE(out.fault->find("REMOTE_DISCONNECT"), std::string::npos) << *out.fault;
  std::set<TransferId> reported = out.done;
  reported.insert(out.failed.begin(), out.failed.end());
  EXPECT_EQ(reported, posted);
  for (const TransferId id : after_kill) EXPECT_EQ(out.done.count(id), 0u) << id;
  transport_->remove_remote_peer("t");
  const HandleCounts live = transport_->stats().live;
  EXPECT_EQ(live.peers, 0u);
  EXPECT_EQ(live.transfers, 0u);
  EXPECT_EQ(live.requests, 0u);
}

TEST_P(UcxReadTest, ATargetThatClosedItsTransportIsNeverRead) {
  constexpr std::uint64_t kBlocks = 64;
  auto t = start_target(kBlocks, 64 * 1024);
  open(kBlocks, 64 * 1024);
  add(*t);
  ASSERT_EQ(t->request("close"), "closed");  // the pool stays mapped
  std::mt19937_64 rng(9);
  Outcome out;
  std::set<TransferId> posted;
  const auto deadline = Clock::now() + 5s;
  while (!out.fault && Clock::now() < deadline) {
    if (posted.size() - out.done.size() - out.failed.size() < 4) {
      if (const auto id = read(random_sample(rng, kBlocks, 8), random_sample(rng, kBlocks, 8))) {
        posted.insert(*id);
      }
    }
    collect(out);
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(out.fault.has_value());
  EXPECT_TRUE(out.done.empty());
  // Not one byte of the closed pool reached ours.
  EXPECT_EQ(check({}, {}), "ok");
}

TEST_P(UcxReadTest, RemovingThePeerEndsItsReadsAndGivesEveryHandleBack) {
  constexpr std::uint64_t kBlocks = 64;
  auto t = start_target(kBlocks, 256 * 1024);
  open(kBlocks, 256 * 1024);
  add(*t);
  std::mt19937_64 rng(17);
  for (int w = 0; w < 8; ++w) {
    auto local = random_sample(rng, 8, 8);  // each read its own 8 local blocks
    for (auto& l : local) l += w * 8;
    ASSERT_TRUE(read(local, random_sample(rng, kBlocks, 8)));
  }
  transport_->remove_remote_peer("t");
  const HandleCounts live = transport_->stats().live;
  EXPECT_EQ(live.memory_registrations, 1u);
  EXPECT_EQ(live.peers, 0u);
  EXPECT_EQ(live.transfers, 0u);
  EXPECT_EQ(live.requests, 0u);
  // Whatever had landed stays; nothing lands from now on.
  std::vector<std::uint8_t> before(pool_->base(), pool_->base() + pool_->len());
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), pool_->base()));
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxReadTest, ::testing::Values("sm,self", "tcp", "ucx"),
                         [](const ::testing::TestParamInfo<std::string>& tls) {
                           return tls.param == "sm,self" ? std::string("sm") : tls.param;
                         });

}  // namespace
}  // namespace kvxfer::it
