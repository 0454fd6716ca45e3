// SPDX-License-Identifier: Apache-2.0
// Regions and descriptors (register_memory, prepare, transfer) on the
// LOOPBACK engine: transports with no pool and several regions, as NIXL's
// agents are, bytes checked after every transfer, and every caller mistake
// refused with nothing moved.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "agents.h"
#include "support/region_agent.h"
#include "kvxfer/transport.h"

namespace kvxfer::unit {
namespace {

constexpr std::size_t kRegionLen = 4096;

std::uint64_t addr_of(const std::vector<std::uint8_t>& bytes, std::size_t offset = 0) {
  return reinterpret_cast<std::uintptr_t>(bytes.data()) + offset;
}

// A loopback transport with no pool and `regions` registered buffers of
// kRegionLen bytes (support/region_agent.h).
struct RegionAgent : test::RegionAgent {
  RegionAgent(std::string name, int regions, std::uint8_t seed)
      : test::RegionAgent(std::move(name), {.regions = regions,
                                            .region_len = kRegionLen,
                                            .seed = seed,
                                            .options = loopback_options()}) {}
};

using test::finish;

class RegionsTest : public ::testing::Test {
 protected:
  RegionsTest() : a("a", 2, 5), b("b", 3, 0) {
    a.transport.add_remote_peer("b", b.transport.agent_metadata());
    b.transport.add_remote_peer("a", a.transport.agent_metadata());
  }
  RegionAgent a;
  RegionAgent b;
};

TEST_F(RegionsTest, RegionsAreListedInTheMetadataAndSeenByThePeer) {
  const auto ours = b.transport.regions();
  ASSERT_EQ(ours.size(), 3u);
  EXPECT_EQ(a.transport.peer_regions("b"), ours);
  for (std::size_t i = 0; i < ours.size(); ++i) {
    EXPECT_NE(ours[i].id, 0u);
    EXPECT_EQ(ours[i].len, kRegionLen);
  }
  EXPECT_EQ(b.transport.num_blocks(), 0u);
}

TEST_F(RegionsTest, AWriteAcrossRegionsLandsByteForByteAndNothingElse) {
  // Two descriptors from a's region 0 into b's regions 2 and 0, one from
  // a's region 1 into b's region 1; the first two are adjacent locally.
  const std::vector<MemDesc> local{{addr_of(a.buffers[0], 0), 100},
                                   {addr_of(a.buffers[0], 100), 50},
                                   {addr_of(a.buffers[1], 4000), 96}};
  const std::vector<MemDesc> remote{{addr_of(b.buffers[2], 10), 100},
                                    {addr_of(b.buffers[0], 3000), 50},
                                    {addr_of(b.buffers[1], 0), 96}};
  const DescList l = a.transport.prepare(local);
  const DescList r = a.transport.prepare(remote, "b");
  const std::vector<std::uint8_t> note{'o', 'k'};
  const auto id = a.transport.transfer(TransferOp::kWrite, "b", l, r, note);
  ASSERT_TRUE(id);
  ASSERT_TRUE(finish(a.transport, "b", *id));
  std::vector<std::vector<std::uint8_t>> want(3, std::vector<std::uint8_t>(kRegionLen, 0));
  std::copy_n(a.buffers[0].begin(), 100, want[2].begin() + 10);
  std::copy_n(a.buffers[0].begin() + 100, 50, want[0].begin() + 3000);
  std::copy_n(a.buffers[1].begin() + 4000, 96, want[1].begin());
  EXPECT_EQ(b.buffers, want);
  const auto notes = b.transport.get_notifications();
  ASSERT_EQ(notes.count("a"), 1u);
  EXPECT_EQ(notes.at("a").at(0), note);
}

TEST_F(RegionsTest, AReadByIndexBringsThePeersBytesIntoOurRegions) {
  // b reads a's bytes: the lists are prepared once, transfers pick indices.
  std::vector<MemDesc> theirs;
  std::vector<MemDesc> ours;
  for (std::size_t k = 0; k < 8; ++k) {
    theirs.push_back({addr_of(a.buffers[k % 2], k * 256), 256});
    ours.push_back({addr_of(b.buffers[2], k * 256), 256});
  }
  const DescList l = b.transport.prepare(ours);
  const DescList r = b.transport.prepare(theirs, "a");
  const std::vector<std::int64_t> li{7, 0, 3};
  const std::vector<std::int64_t> ri{1, 4, 6};
  const auto id = b.transport.transfer(TransferOp::kRead, "a", l, li, r, ri);
  ASSERT_TRUE(id);
  ASSERT_TRUE(finish(b.transport, "a", *id));
  for (std::size_t i = 0; i < li.size(); ++i) {
    const MemDesc from = r.at(static_cast<std::size_t>(ri[i]));
    const auto& src = a.buffers[static_cast<std::size_t>(ri[i]) % 2];
    const std::size_t at = from.addr - addr_of(src);
    EXPECT_TRUE(std::equal(src.begin() + static_cast<std::ptrdiff_t>(at),
                           src.begin() + static_cast<std::ptrdiff_t>(at + 256),
                           b.buffers[2].begin() + li[i] * 256))
        << "pair " << i;
  }
  EXPECT_EQ(l.size(), 8u);
}

TEST_F(RegionsTest, DescriptorsOutsideOrAcrossRegionsAreRefusedAtPrepare) {
  // Past the end of a region, straddling two (adjacent or not), empty,
  // nowhere: each refused, naming the descriptor.
  EXPECT_THROW(static_cast<void>(a.transport.prepare(
                   std::vector<MemDesc>{{addr_of(b.buffers[0], kRegionLen - 8), 16}}, "b")),
               std::invalid_argument);
  EXPECT_THROW(static_cast<void>(
                   a.transport.prepare(std::vector<MemDesc>{{addr_of(a.buffers[0]), 0}})),
               std::invalid_argument);
  EXPECT_THROW(static_cast<void>(a.transport.prepare(std::vector<MemDesc>{{0x1000, 8}})),
               std::invalid_argument);
  try {
    static_cast<void>(a.transport.prepare(
        std::vector<MemDesc>{{addr_of(a.buffers[0]), 8}, {addr_of(a.buffers[1], 4090), 8}}));
    FAIL() << "a descriptor past its region was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("descriptor 1"), std::string::npos) << e.what();
  }
  // A peer's list checks the peer's regions, not ours.
  EXPECT_THROW(static_cast<void>(
                   a.transport.prepare(std::vector<MemDesc>{{addr_of(a.buffers[0]), 8}}, "b")),
               std::invalid_argument);
  EXPECT_THROW(static_cast<void>(a.transport.prepare(std::vector<MemDesc>{}, "nobody")),
               std::invalid_argument);
}

TEST_F(RegionsTest, MismatchedPairsAndBadIndicesAreRefusedWithNothingMoved) {
  const DescList l = a.transport.prepare(std::vector<MemDesc>{{addr_of(a.buffers[0]), 64}});
  const DescList r = a.transport.prepare(
      std::vector<MemDesc>{{addr_of(b.buffers[0]), 32}, {addr_of(b.buffers[1]), 64}}, "b");
  const std::vector<std::int64_t> zero{0};
  const std::vector<std::int64_t> one{1};
  const std::vector<std::int64_t> two{2};
  const std::vector<std::int64_t> minus{-1};
  EXPECT_THROW(static_cast<void>(a.transport.transfer(TransferOp::kWrite, "b", l, zero, r, zero)),
               std::invalid_argument);  // 64 bytes against 32
  EXPECT_THROW(static_cast<void>(a.transport.transfer(TransferOp::kWrite, "b", l, zero, r, two)),
               std::invalid_argument);
  EXPECT_THROW(static_cast<void>(a.transport.transfer(TransferOp::kWrite, "b", l, minus, r, one)),
               std::invalid_argument);
  EXPECT_THROW(static_cast<void>(a.transport.transfer(TransferOp::kWrite, "b", l, r)),
               std::invalid_argument);  // 1 against 2
  EXPECT_THROW(static_cast<void>(a.transport.transfer(TransferOp::kWrite, "b", r, zero, l, zero)),
               std::invalid_argument);  // the lists swapped
  EXPECT_THROW(static_cast<void>(a.transport.transfer(TransferOp::kNotify, "b", l, zero, r, one)),
               std::invalid_argument);
  for (const auto& buffer : b.buffers) {
    EXPECT_TRUE(std::all_of(buffer.begin(), buffer.end(), [](std::uint8_t x) { return x == 0; }));
  }
  const auto ok = a.transport.transfer(TransferOp::kWrite, "b", l, zero, r, one);
  ASSERT_TRUE(ok);
  EXPECT_TRUE(finish(a.transport, "b", *ok));
  EXPECT_EQ(a.transport.stats().peers.at(0).strikes, 0);
}

TEST_F(RegionsTest, AListPreparedForAnEarlierRegistrationIsRefused) {
  const DescList l = a.transport.prepare(std::vector<MemDesc>{{addr_of(a.buffers[0]), 64}});
  const DescList r = a.transport.prepare(std::vector<MemDesc>{{addr_of(b.buffers[0]), 64}}, "b");
  a.transport.add_remote_peer("b", b.transport.agent_metadata());
  EXPECT_THROW(static_cast<void>(a.transport.transfer(TransferOp::kWrite, "b", l, r)),
               std::invalid_argument);
  const DescList again =
      a.transport.prepare(std::vector<MemDesc>{{addr_of(b.buffers[0]), 64}}, "b");
  const auto id = a.transport.transfer(TransferOp::kWrite, "b", l, again);
  ASSERT_TRUE(id);
  EXPECT_TRUE(finish(a.transport, "b", *id));
}

TEST_F(RegionsTest, RegistrationRefusesOverlapsAndDeregistrationWaitsForTransfers) {
  EXPECT_THROW(static_cast<void>(a.transport.register_memory(a.buffers[0].data() + 8, 8)),
               std::invalid_argument);
  EXPECT_THROW(static_cast<void>(a.transport.register_memory(a.buffers[0].data() - 8, 16)),
               std::invalid_argument);
  EXPECT_THROW(static_cast<void>(a.transport.register_memory(nullptr, 8)), std::invalid_argument);
  EXPECT_THROW(static_cast<void>(a.transport.register_memory(a.buffers[0].data(), 0)),
               std::invalid_argument);
  EXPECT_THROW(a.transport.deregister_memory(0), std::invalid_argument);  // the pool's id
  EXPECT_THROW(a.transport.deregister_memory(a.ids[0] + (RegionId{1} << 32)),
               std::invalid_argument);

  const DescList l = a.transport.prepare(std::vector<MemDesc>{{addr_of(a.buffers[0]), 64}});
  const DescList r = a.transport.prepare(std::vector<MemDesc>{{addr_of(b.buffers[0]), 64}}, "b");
  const auto id = a.transport.transfer(TransferOp::kWrite, "b", l, r);
  ASSERT_TRUE(id);
  EXPECT_THROW(a.transport.deregister_memory(a.ids[0]), std::logic_error);
  ASSERT_TRUE(finish(a.transport, "b", *id));
  a.transport.deregister_memory(a.ids[0]);
  EXPECT_EQ(a.transport.regions().size(), 1u);
  EXPECT_THROW(static_cast<void>(a.transport.transfer(TransferOp::kWrite, "b", l, r)),
               std::invalid_argument);  // its local region is gone
  // The slot is used again under a new id.
  const RegionId again = a.transport.register_memory(a.buffers[0].data(), kRegionLen);
  EXPECT_NE(again, a.ids[0]);
  EXPECT_EQ(again & 0xffffffffu, a.ids[0] & 0xffffffffu);
}

TEST_F(RegionsTest, ATargetThatDeregisteredARegionRefusesWritesIntoIt) {
  const DescList l = a.transport.prepare(std::vector<MemDesc>{{addr_of(a.buffers[0]), 64}});
  const DescList r = a.transport.prepare(std::vector<MemDesc>{{addr_of(b.buffers[1]), 64}}, "b");
  b.transport.deregister_memory(b.ids[1]);
  // a still holds b's old metadata: the post is refused at the target's
  // table, counted as a failed post, and nothing lands.
  EXPECT_FALSE(a.transport.transfer(TransferOp::kWrite, "b", l, r));
  EXPECT_TRUE(std::all_of(b.buffers[1].begin(), b.buffers[1].end(),
                          [](std::uint8_t x) { return x == 0; }));
  EXPECT_EQ(a.transport.stats().peers.at(0).post_failures, 1u);
}

TEST_F(RegionsTest, AListOfRegionsTimesBlocksIsKeptAsOneRunPerRegion) {
  // b's 3 regions of 64 blocks of 64 bytes, as vLLM lists them, then the
  // same blocks in an order that breaks the stride, then repeats.
  constexpr std::uint64_t kBlock = 64;
  std::vector<MemDesc> grid;
  for (const auto& region : b.buffers) {
    for (std::uint64_t k = 0; k < kRegionLen / kBlock; ++k) grid.push_back({addr_of(region, k * kBlock), kBlock});
  }
  const DescList list = a.transport.prepare(grid, "b");
  EXPECT_EQ(list.size(), grid.size());
  EXPECT_EQ(list.runs(), 3u);
  for (std::size_t i = 0; i < grid.size(); ++i) ASSERT_EQ(list.at(i), grid[i]) << i;
  EXPECT_THROW(static_cast<void>(list.at(grid.size())), std::out_of_range);

  std::vector<MemDesc> odd{grid[5], grid[3], grid[3], grid[4], grid[70], {addr_of(b.buffers[1], 1), 7}};
  const DescList mixed = a.transport.prepare(odd, "b");
  EXPECT_EQ(mixed.size(), odd.size());
  for (std::size_t i = 0; i < odd.size(); ++i) ASSERT_EQ(mixed.at(i), odd[i]) << i;

  // Writes through the strided list by index land where the descriptors say.
  std::vector<MemDesc> ours;
  for (std::uint64_t k = 0; k < kRegionLen / kBlock; ++k) ours.push_back({addr_of(a.buffers[1], k * kBlock), kBlock});
  const DescList l = a.transport.prepare(ours);
  EXPECT_EQ(l.runs(), 1u);
  const std::vector<std::int64_t> li{0, 1, 2, 63, 10};
  const std::vector<std::int64_t> ri{191, 64, 65, 0, 127};
  const auto id = a.transport.transfer(TransferOp::kWrite, "b", l, li, list, ri);
  ASSERT_TRUE(id);
  ASSERT_TRUE(finish(a.transport, "b", *id));
  for (std::size_t i = 0; i < li.size(); ++i) {
    const MemDesc to = list.at(static_cast<std::size_t>(ri[i]));
    const auto r = static_cast<std::size_t>(ri[i]) / 64;
    const std::size_t at = to.addr - addr_of(b.buffers[r]);
    EXPECT_TRUE(std::equal(b.buffers[r].begin() + static_cast<std::ptrdiff_t>(at),
                           b.buffers[r].begin() + static_cast<std::ptrdiff_t>(at + kBlock),
                           a.buffers[1].begin() + li[i] * 64))
        << "pair " << i;
  }
}

TEST(RegionsPoolTest, ATransportWithAPoolCarriesDescriptorsIntoItToo) {
  Agent a("a");
  Agent b("b");
  a.pool.fill_pattern(3);
  a.transport.add_remote_peer("b", b.transport.agent_metadata());
  const DescList l = a.transport.prepare(std::vector<MemDesc>{
      {a.transport.base_addr() + kBlockLen, 2 * kBlockLen}});
  const DescList r = a.transport.prepare(
      std::vector<MemDesc>{{b.transport.base_addr() + 5 * kBlockLen, 2 * kBlockLen}}, "b");
  const auto id = a.transport.transfer(TransferOp::kWrite, "b", l, r);
  ASSERT_TRUE(id);
  ASSERT_TRUE(finish(a.transport, "b", *id));
  EXPECT_TRUE(std::ranges::equal(b.pool.block(5), a.pool.block(1)));
  EXPECT_TRUE(std::ranges::equal(b.pool.block(6), a.pool.block(2)));
  EXPECT_TRUE(b.pool.block_all(4, 0));
  EXPECT_TRUE(b.pool.block_all(7, 0));
  // And write_blocks still works beside it.
  const std::vector<std::int64_t> blocks{9};
  const auto w = a.transport.write_blocks("b", blocks, blocks);
  ASSERT_TRUE(w);
  EXPECT_TRUE(finish(a.transport, "b", *w));
  EXPECT_TRUE(std::ranges::equal(b.pool.block(9), a.pool.block(9)));
}

TEST(RegionsPoolTest, WriteBlocksToAPeerWithoutAPoolIsRefused) {
  Agent a("a");
  RegionAgent b("b", 1, 0);
  a.transport.add_remote_peer("b", b.transport.agent_metadata());
  const std::vector<std::int64_t> blocks{0};
  EXPECT_THROW(static_cast<void>(a.transport.write_blocks("b", blocks, blocks)),
               std::invalid_argument);
}

}  // namespace
}  // namespace kvxfer::unit
