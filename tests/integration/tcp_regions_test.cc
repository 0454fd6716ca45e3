// SPDX-License-Identifier: Apache-2.0
// Regions besides the pool on the tcp lane (backend UCX, KVXFER_LANES=tcp),
// as NIXL's agents use them: transports with no pool and several regions,
// writes and reads between them checked byte for byte, a target that
// deregistered a region refusing what its peers still send into it, and the
// pool (write_blocks) beside regions.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kvxfer/transport.h"
#include "support/region_agent.h"

namespace kvxfer::it {
namespace {

constexpr std::size_t kRegionLen = 64 * 1024;

Options tcp_options() {
  Options options;
  options.engine_config = {{"KVXFER_LANES", "tcp"}};
  return options;
}

std::uint64_t addr_of(const std::vector<std::uint8_t>& bytes, std::size_t offset = 0) {
  return reinterpret_cast<std::uintptr_t>(bytes.data()) + offset;
}

bool all_zero(const std::vector<std::uint8_t>& bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t b) { return b == 0; });
}

// A transport on the tcp lane with `regions` registered buffers of
// kRegionLen bytes (a pattern when `seed` is nonzero, else zeros) and a pool
// of `blocks` blocks of kBlockLen (none when 0) (support/region_agent.h).
struct RegionAgent : test::RegionAgent {
  static constexpr std::uint64_t kBlockLen = 4096;

  RegionAgent(const std::string& name, int regions, std::uint8_t seed, std::uint64_t blocks = 0)
      : test::RegionAgent(name, {.regions = regions,
                                 .region_len = kRegionLen,
                                 .seed = seed,
                                 .options = tcp_options(),
                                 .own_pool_blocks = blocks,
                                 .own_block_len = kBlockLen}) {}
};

using test::outcome;

class TcpRegionsTest : public ::testing::Test {
 protected:
  TcpRegionsTest() : a("a", 2, 5), b("b", 3, 0) {
    a.transport.add_remote_peer("b", b.transport.agent_metadata());
    b.transport.add_remote_peer("a", a.transport.agent_metadata());
  }
  RegionAgent a;
  RegionAgent b;
};

TEST_F(TcpRegionsTest, TheTcpLaneCarriesPeersWithRegionsAndNoPool) {
  EXPECT_EQ(a.transport.peer_regions("b").size(), 3u);
  EXPECT_EQ(b.transport.peer_regions("a").size(), 2u);
  EXPECT_EQ(a.transport.num_blocks(), 0u);
}

TEST_F(TcpRegionsTest, AWriteAcrossRegionsLandsByteForByteAndNothingElse) {
  // From a's regions 0 and 1 into b's regions 2, 0 and 1; the first two
  // descriptors are adjacent locally but not remotely.
  const std::vector<MemDesc> local{{addr_of(a.buffers[0], 0), 100},
                                   {addr_of(a.buffers[0], 100), 5000},
                                   {addr_of(a.buffers[1], kRegionLen - 96), 96}};
  const std::vector<MemDesc> remote{{addr_of(b.buffers[2], 10), 100},
                                    {addr_of(b.buffers[0], 3000), 5000},
                                    {addr_of(b.buffers[1], 0), 96}};
  const DescList l = a.transport.prepare(local);
  const DescList r = a.transport.prepare(remote, "b");
  const std::vector<std::uint8_t> note{'o', 'k'};
  const auto id = a.transport.transfer(TransferOp::kWrite, "b", l, r, note);
  ASSERT_TRUE(id);
  ASSERT_EQ(outcome(a.transport, "b", *id), std::optional<bool>(true));
  std::vector<std::vector<std::uint8_t>> want(3, std::vector<std::uint8_t>(kRegionLen, 0));
  std::copy_n(a.buffers[0].begin(), 100, want[2].begin() + 10);
  std::copy_n(a.buffers[0].begin() + 100, 5000, want[0].begin() + 3000);
  std::copy_n(a.buffers[1].end() - 96, 96, want[1].begin());
  EXPECT_EQ(b.buffers, want);
  const auto notes = b.transport.get_notifications();
  ASSERT_EQ(notes.count("a"), 1u);
  EXPECT_EQ(notes.at("a").at(0), note);
}

TEST_F(TcpRegionsTest, AReadAcrossRegionsBringsThePeersBytesIntoOurRegions) {
  std::vector<MemDesc> theirs;
  std::vector<MemDesc> ours;
  for (std::size_t k = 0; k < 8; ++k) {
    theirs.push_back({addr_of(a.buffers[k % 2], k * 4096 + 7), 4000});
    ours.push_back({addr_of(b.buffers[k % 3], k * 4096 + 1), 4000});
  }
  const DescList l = b.transport.prepare(ours);
  const DescList r = b.transport.prepare(theirs, "a");
  const std::vector<std::int64_t> li{7, 0, 3, 4};
  const std::vector<std::int64_t> ri{1, 4, 6, 5};
  const auto id = b.transport.transfer(TransferOp::kRead, "a", l, li, r, ri);
  ASSERT_TRUE(id);
  ASSERT_EQ(outcome(b.transport, "a", *id), std::optional<bool>(true));
  std::vector<std::vector<std::uint8_t>> want(3, std::vector<std::uint8_t>(kRegionLen, 0));
  for (std::size_t i = 0; i < li.size(); ++i) {
    const auto from = static_cast<std::size_t>(ri[i]);
    const auto to = static_cast<std::size_t>(li[i]);
    std::copy_n(a.buffers[from % 2].begin() + static_cast<std::ptrdiff_t>(from * 4096 + 7), 4000,
                want[to % 3].begin() + static_cast<std::ptrdiff_t>(to * 4096 + 1));
  }
  EXPECT_EQ(b.buffers, want);
}

TEST_F(TcpRegionsTest, ATargetThatDeregisteredARegionRefusesWritesIntoIt) {
  const DescList l = a.transport.prepare(std::vector<MemDesc>{{addr_of(a.buffers[0]), 4096}});
  const DescList r =
      a.transport.prepare(std::vector<MemDesc>{{addr_of(b.buffers[1], 512), 4096}}, "b");
  b.transport.deregister_memory(b.ids[1]);
  // a still holds b's metadata that lists the region: b's lane refuses the
  // run at its own table, and nothing lands.
  const auto id = a.transport.transfer(TransferOp::kWrite, "b", l, r);
  if (id) {
    EXPECT_EQ(outcome(a.transport, "b", *id), std::optional<bool>(false));
  }
  EXPECT_TRUE(all_zero(b.buffers[1]));
  EXPECT_GE(b.transport.stats().engine_counters.at("tcp_refused_runs"), 1u);
}

TEST_F(TcpRegionsTest, ARegionRegisteredAgainUnderANewIdTakesWritesAfterANewRegistration) {
  b.transport.deregister_memory(b.ids[0]);
  const RegionId again = b.transport.register_memory(b.buffers[0].data(), kRegionLen);
  EXPECT_NE(again, b.ids[0]);
  a.transport.add_remote_peer("b", b.transport.agent_metadata());
  const DescList l = a.transport.prepare(std::vector<MemDesc>{{addr_of(a.buffers[1], 64), 256}});
  const DescList r =
      a.transport.prepare(std::vector<MemDesc>{{addr_of(b.buffers[0], 1024), 256}}, "b");
  const auto id = a.transport.transfer(TransferOp::kWrite, "b", l, r);
  ASSERT_TRUE(id);
  ASSERT_EQ(outcome(a.transport, "b", *id), std::optional<bool>(true));
  EXPECT_TRUE(std::equal(a.buffers[1].begin() + 64, a.buffers[1].begin() + 320,
                         b.buffers[0].begin() + 1024));
}

TEST(TcpRegionsPoolTest, WriteBlocksStillWorksBesideRegions) {
  RegionAgent a("a", 1, 9, 8);
  RegionAgent b("b", 2, 0, 8);
  for (std::size_t i = 0; i < a.pool.size(); ++i) a.pool[i] = static_cast<std::uint8_t>(i % 253);
  a.transport.add_remote_peer("b", b.transport.agent_metadata());
  // Blocks 1, 2 into b's 5, 6 (one run), and 0 into 3.
  const std::vector<std::int64_t> from{1, 2, 0};
  const std::vector<std::int64_t> to{5, 6, 3};
  const auto blocks = a.transport.write_blocks("b", from, to);
  ASSERT_TRUE(blocks);
  ASSERT_EQ(outcome(a.transport, "b", *blocks), std::optional<bool>(true));
  // And descriptors between a region of a's and b's pool, and a's pool and
  // a region of b's.
  constexpr std::uint64_t kBlock = RegionAgent::kBlockLen;
  const DescList l = a.transport.prepare(std::vector<MemDesc>{
      {addr_of(a.buffers[0], 100), 300}, {addr_of(a.pool, 7 * kBlock), kBlock}});
  const DescList r =
      a.transport.prepare(std::vector<MemDesc>{{addr_of(b.pool, 7 * kBlock + 5), 300},
                                               {addr_of(b.buffers[1], 9), kBlock}},
                          "b");
  const auto descs = a.transport.transfer(TransferOp::kWrite, "b", l, r);
  ASSERT_TRUE(descs);
  ASSERT_EQ(outcome(a.transport, "b", *descs), std::optional<bool>(true));

  std::vector<std::uint8_t> want(b.pool.size(), 0);
  for (std::size_t i = 0; i < from.size(); ++i) {
    std::copy_n(a.pool.begin() + static_cast<std::ptrdiff_t>(from[i] * kBlock), kBlock,
                want.begin() + static_cast<std::ptrdiff_t>(to[i] * kBlock));
  }
  std::copy_n(a.buffers[0].begin() + 100, 300, want.begin() + 7 * kBlock + 5);
  EXPECT_EQ(b.pool, want);
  std::vector<std::uint8_t> region(kRegionLen, 0);
  std::copy_n(a.pool.begin() + 7 * kBlock, kBlock, region.begin() + 9);
  EXPECT_EQ(b.buffers[1], region);
  EXPECT_TRUE(all_zero(b.buffers[0]));
}

}  // namespace
}  // namespace kvxfer::it
