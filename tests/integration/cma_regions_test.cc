// SPDX-License-Identifier: Apache-2.0
// Regions besides the pool on the same-host lane (engines/cma/): two UCX
// transports of this process with only the cma lane (KVXFER_LANES=cma), so
// every byte moves with process_vm_writev/readv (or through a mapped
// SharedPool) and every check is the lane's own: the target's region table,
// read at connect and before every chunk.
//  - writes and reads across several regions land byte for byte, with no
//    pool on either side;
//  - metadata that lists a region the target never registered, or one at
//    another address, length or id, is refused at add_remote_peer;
//  - a region the target deregistered is not written: the transfer fails;
//  - write_blocks into the pool, mapped or not, still works beside regions.
// And the first three against a target process (kvxfer_it_target --no-pool).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "it_support.h"
#include "kvxfer/shared_pool.h"
#include "kvxfer/transport.h"
#include "support/region_agent.h"
#include "wire/metadata.h"

namespace kvxfer::it {
namespace {

constexpr std::size_t kRegionLen = 3 << 20;  // three copier chunks and more

Options cma_options() {
  Options options;
  options.backends = {"UCX"};
  options.engine_config = {{"KVXFER_LANES", "cma"}, {"TLS", "sm,self"}};
  return options;
}

std::uint64_t addr_of(const std::vector<std::uint8_t>& bytes, std::size_t offset = 0) {
  return reinterpret_cast<std::uintptr_t>(bytes.data()) + offset;
}

std::uint64_t counter(const Transport& t, const std::string& name) {
  const auto counters = t.stats().engine_counters;
  const auto it = counters.find(name);
  return it == counters.end() ? 0 : it->second;
}

// A transport on the same-host lane with the pool `theirs` (none by default) and
// `regions` buffers of kRegionLen bytes, each registered; a pattern of
// `seed` in them (0: zeros) (support/region_agent.h).
struct RegionAgent : test::RegionAgent {
  RegionAgent(std::string name, int regions, std::uint8_t seed, Region theirs = Region{})
      : test::RegionAgent(std::move(name), {.regions = regions,
                                            .region_len = kRegionLen,
                                            .seed = seed,
                                            .options = cma_options(),
                                            .pool = theirs}) {}
};

using test::finish;

// The same for transfers in flight together: one poll may report several
// of them, and reports each once. True when every one was done.
bool finish_all(Transport& t, const std::string& peer, std::vector<TransferId> ids) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool all_done = true;
  while (!ids.empty() && std::chrono::steady_clock::now() < deadline) {
    const PollResult r = t.poll(peer);
    for (const auto* list : {&r.done, &r.failed}) {
      for (const TransferId id : *list) {
        if (std::erase(ids, id) > 0 && list == &r.failed) all_done = false;
      }
    }
    if (!ids.empty()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return all_done && ids.empty();
}

bool all_zero(const std::vector<std::uint8_t>& bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t x) { return x == 0; });
}

TEST(CmaRegionsTest, WritesAndReadsAcrossRegionsLandByteForByteWithNoPool) {
  RegionAgent a("a", 3, 5);
  RegionAgent b("b", 3, 0);
  a.transport.add_remote_peer("b", b.transport.agent_metadata());
  // Two descriptors from a's region 0 (adjacent there) into b's regions 2
  // and 0, one of all of a's region 1 into b's region 1.
  const std::vector<MemDesc> local{{addr_of(a.buffers[0], 0), 1 << 20},
                                   {addr_of(a.buffers[0], 1 << 20), 100},
                                   {addr_of(a.buffers[1]), kRegionLen}};
  const std::vector<MemDesc> remote{{addr_of(b.buffers[2], 10), 1 << 20},
                                    {addr_of(b.buffers[0], 3000), 100},
                                    {addr_of(b.buffers[1]), kRegionLen}};
  const auto id = a.transport.transfer(TransferOp::kWrite, "b", a.transport.prepare(local),
                                       a.transport.prepare(remote, "b"));
  ASSERT_TRUE(id);
  ASSERT_TRUE(finish(a.transport, "b", *id));
  std::vector<std::vector<std::uint8_t>> want(3, std::vector<std::uint8_t>(kRegionLen, 0));
  std::copy_n(a.buffers[0].begin(), 1 << 20, want[2].begin() + 10);
  std::copy_n(a.buffers[0].begin() + (1 << 20), 100, want[0].begin() + 3000);
  want[1] = a.buffers[1];
  EXPECT_TRUE(b.buffers == want) << "the write did not land byte for byte";

  // And back: a reads b's region 2 into its region 2 (zeros until now).
  const std::vector<MemDesc> theirs{{addr_of(b.buffers[2]), kRegionLen}};
  const std::vector<MemDesc> ours{{addr_of(a.buffers[2]), kRegionLen}};
  const auto rid = a.transport.transfer(TransferOp::kRead, "b", a.transport.prepare(ours),
                                        a.transport.prepare(theirs, "b"));
  ASSERT_TRUE(rid);
  ASSERT_TRUE(finish(a.transport, "b", *rid));
  EXPECT_TRUE(a.buffers[2] == b.buffers[2]) << "the read did not land byte for byte";
  EXPECT_GT(counter(a.transport, "cma_writes"), 0u);
  EXPECT_GT(counter(a.transport, "cma_reads"), 0u);
}

class CmaForgedRegionsTest : public ::testing::Test {
 protected:
  CmaForgedRegionsTest() : b("b", 2, 0), stray(kRegionLen, 0) {}

  // b's metadata with `change` applied to its region list, registered with
  // a fresh initiator: must be refused, saying what the target registered.
  template <typename F>
  void expect_refused(F change) {
    wire::AgentMetadata m = wire::decode(b.transport.agent_metadata());
    change(m.regions);
    // Metadata lists regions by address (a list that is not sorted does not
    // decode at all, which would test nothing here).
    std::sort(m.regions.begin(), m.regions.end(),
              [](const auto& x, const auto& y) { return x.addr < y.addr; });
    RegionAgent a("a", 1, 5);
    bool accepted = false;
    try {
      a.transport.add_remote_peer("b", wire::encode(m));
      accepted = true;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("the target registered"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(accepted) << "forged region metadata was accepted";
    EXPECT_TRUE(a.transport.peers().empty());
    EXPECT_TRUE(all_zero(stray));
    for (const auto& buffer : b.buffers) EXPECT_TRUE(all_zero(buffer));
  }

  RegionAgent b;
  std::vector<std::uint8_t> stray;  // never registered by anyone
};

TEST_F(CmaForgedRegionsTest, ARegionTheTargetNeverRegisteredIsRefused) {
  expect_refused([this](auto& regions) {
    const std::uint32_t slot = 7;
    regions.push_back({(std::uint64_t{1} << 32) | slot, addr_of(stray), stray.size()});
  });
}

TEST_F(CmaForgedRegionsTest, ARegionMovedToAnotherAddressIsRefused) {
  expect_refused([](auto& regions) {
    regions[0].addr += 4096;
    regions[0].len -= 4096;
  });
}

TEST_F(CmaForgedRegionsTest, ARegionLongerThanRegisteredIsRefused) {
  // The last by address, so that it overlaps no other in the list.
  expect_refused([](auto& regions) { regions.back().len += 4096; });
}

TEST_F(CmaForgedRegionsTest, ARegionShorterThanRegisteredIsRefused) {
  expect_refused([](auto& regions) { regions[1].len -= 4096; });
}

TEST_F(CmaForgedRegionsTest, ARegionUnderAnotherGenerationIsRefused) {
  expect_refused([](auto& regions) { regions[0].id += std::uint64_t{1} << 32; });
}

TEST_F(CmaForgedRegionsTest, ARegionDeregisteredSinceTheMetadataWasTakenIsRefused) {
  const std::vector<std::uint8_t> old = b.transport.agent_metadata();
  b.transport.deregister_memory(b.ids[1]);
  RegionAgent a("a", 1, 5);
  EXPECT_THROW(a.transport.add_remote_peer("b", old), std::runtime_error);
  EXPECT_TRUE(a.transport.peers().empty());
}

TEST(CmaRegionsTest, ARegionTheTargetDeregisteredIsNotWritten) {
  RegionAgent a("a", 1, 5);
  RegionAgent b("b", 2, 0);
  a.transport.add_remote_peer("b", b.transport.agent_metadata());
  const DescList l = a.transport.prepare(std::vector<MemDesc>{{addr_of(a.buffers[0]), kRegionLen}});
  const DescList r1 =
      a.transport.prepare(std::vector<MemDesc>{{addr_of(b.buffers[1]), kRegionLen}}, "b");
  const DescList r0 =
      a.transport.prepare(std::vector<MemDesc>{{addr_of(b.buffers[0]), kRegionLen}}, "b");
  b.transport.deregister_memory(b.ids[1]);
  // a still holds b's old metadata: the lane finds the region withdrawn in
  // b's table before the first chunk, and the transfer fails.
  const auto id = a.transport.transfer(TransferOp::kWrite, "b", l, r1);
  if (id) {
    EXPECT_FALSE(finish(a.transport, "b", *id));
  }
  EXPECT_TRUE(all_zero(b.buffers[1])) << "bytes landed in a deregistered region";
  // The region b still has takes writes as before.
  const auto ok = a.transport.transfer(TransferOp::kWrite, "b", l, r0);
  ASSERT_TRUE(ok);
  EXPECT_TRUE(finish(a.transport, "b", *ok));
  EXPECT_TRUE(b.buffers[0] == a.buffers[0]);
}

// Pools beside regions: write_blocks into the pool and descriptors into the
// regions on one peer; with `shared`, the target's pool is a SharedPool the
// lane maps (write_blocks copies through the mapping, regions do not).
void pool_beside_regions(bool shared) {
  constexpr std::uint64_t kBlocks = 16;
  constexpr std::uint64_t kBlockLen = 64 * 1024;
  std::vector<std::uint8_t> a_pool(kBlocks * kBlockLen);
  for (std::size_t i = 0; i < a_pool.size(); ++i) a_pool[i] = static_cast<std::uint8_t>(i * 3 + 1);
  SharedPool b_shared(shared ? kBlocks * kBlockLen : 4096);
  std::vector<std::uint8_t> b_plain(kBlocks * kBlockLen, 0);
  auto* b_pool = shared ? static_cast<std::uint8_t*>(b_shared.data()) : b_plain.data();
  std::fill_n(b_pool, kBlocks * kBlockLen, 0);
  RegionAgent a("a", 1, 5, Region{a_pool.data(), kBlocks, kBlockLen});
  RegionAgent b("b", 2, 0, Region{b_pool, kBlocks, kBlockLen});
  a.transport.add_remote_peer("b", b.transport.agent_metadata());
  EXPECT_EQ(counter(a.transport, "cma_mapped_peers"), shared ? 1u : 0u);

  const std::vector<std::int64_t> blocks{0, 1, 7, 15};
  const auto w = a.transport.write_blocks("b", blocks, blocks);
  ASSERT_TRUE(w);
  const DescList l = a.transport.prepare(std::vector<MemDesc>{{addr_of(a.buffers[0]), kRegionLen}});
  const DescList r =
      a.transport.prepare(std::vector<MemDesc>{{addr_of(b.buffers[1]), kRegionLen}}, "b");
  const auto d = a.transport.transfer(TransferOp::kWrite, "b", l, r);
  ASSERT_TRUE(d);
  EXPECT_TRUE(finish_all(a.transport, "b", {*w, *d}));
  for (const std::int64_t blk : blocks) {
    const auto at = static_cast<std::size_t>(blk) * kBlockLen;
    EXPECT_TRUE(std::equal(a_pool.begin() + static_cast<std::ptrdiff_t>(at),
                           a_pool.begin() + static_cast<std::ptrdiff_t>(at + kBlockLen),
                           b_pool + at))
        << "block " << blk;
  }
  EXPECT_TRUE(std::all_of(b_pool + 2 * kBlockLen, b_pool + 7 * kBlockLen,
                          [](std::uint8_t x) { return x == 0; }));
  EXPECT_TRUE(b.buffers[1] == a.buffers[0]);
  EXPECT_TRUE(all_zero(b.buffers[0]));
}

TEST(CmaRegionsTest, WriteBlocksIntoThePoolWorksBesideRegions) { pool_beside_regions(false); }

TEST(CmaRegionsTest, WriteBlocksIntoAMappedSharedPoolWorksBesideRegions) {
  pool_beside_regions(true);
}

std::string sum_of(const std::vector<std::uint8_t>& bytes) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const std::uint8_t b : bytes) {
    h ^= b;
    h *= 0x100000001b3ULL;
  }
  return "sum " + std::to_string(h);
}

// A target process with no pool and three regions, the cma lane only.
class CmaRegionsProcessTest : public ::testing::Test {
 protected:
  CmaRegionsProcessTest() : target_(options()) {
    std::istringstream in(target_.request("regions 3 " + std::to_string(kRegionLen)));
    std::string word;
    std::string hex;
    in >> word >> hex;
    metadata_ = from_hex(hex);
    for (std::uint64_t addr = 0; in >> addr;) addrs_.push_back(addr);
  }

  static TargetOptions options() {
    TargetOptions t;
    t.no_pool = true;
    t.engine_config = {{"KVXFER_LANES", "cma"}};
    return t;
  }

  std::vector<MemDesc> theirs(std::size_t k) const { return {{addrs_.at(k), kRegionLen}}; }

  TargetProcess target_;
  std::vector<std::uint8_t> metadata_;
  std::vector<std::uint64_t> addrs_;
};

TEST_F(CmaRegionsProcessTest, WritesAndReadsAcrossItsRegionsLandByteForByte) {
  ASSERT_EQ(addrs_.size(), 3u);
  RegionAgent a("a", 3, 5);
  a.transport.add_remote_peer("t", metadata_);
  for (std::size_t k = 0; k < 2; ++k) {
    const auto id = a.transport.transfer(
        TransferOp::kWrite, "t",
        a.transport.prepare(std::vector<MemDesc>{{addr_of(a.buffers[k]), kRegionLen}}),
        a.transport.prepare(theirs(k), "t"));
    ASSERT_TRUE(id);
    ASSERT_TRUE(finish(a.transport, "t", *id));
    EXPECT_EQ(target_.request("rsum " + std::to_string(k)), sum_of(a.buffers[k])) << k;
  }
  EXPECT_GT(counter(a.transport, "cma_writes"), 0u) << "the writes did not take the cma lane";
  ASSERT_EQ(target_.request("rfill 2 9"), "filled");
  const auto rid = a.transport.transfer(
      TransferOp::kRead, "t",
      a.transport.prepare(std::vector<MemDesc>{{addr_of(a.buffers[2]), kRegionLen}}),
      a.transport.prepare(theirs(2), "t"));
  ASSERT_TRUE(rid);
  ASSERT_TRUE(finish(a.transport, "t", *rid));
  EXPECT_EQ(target_.request("rsum 2"), sum_of(a.buffers[2]));
}

TEST_F(CmaRegionsProcessTest, ARegionMovedInForgedMetadataIsRefused) {
  wire::AgentMetadata m = wire::decode(metadata_);
  m.regions.at(1).addr += 4096;
  m.regions.at(1).len -= 4096;
  RegionAgent a("a", 1, 5);
  EXPECT_THROW(a.transport.add_remote_peer("t", wire::encode(m)), std::runtime_error);
  EXPECT_TRUE(a.transport.peers().empty());
  EXPECT_EQ(target_.request("rsum 1"), sum_of(std::vector<std::uint8_t>(kRegionLen, 0)));
}

TEST_F(CmaRegionsProcessTest, ARegionItDeregisteredIsNotWritten) {
  RegionAgent a("a", 1, 5);
  a.transport.add_remote_peer("t", metadata_);
  const DescList l = a.transport.prepare(std::vector<MemDesc>{{addr_of(a.buffers[0]), kRegionLen}});
  const DescList r = a.transport.prepare(theirs(1), "t");
  const std::string before = target_.request("rsum 1");
  ASSERT_EQ(target_.request("dereg 1"), "dereg ok");
  const auto id = a.transport.transfer(TransferOp::kWrite, "t", l, r);
  if (id) {
    EXPECT_FALSE(finish(a.transport, "t", *id));
  }
  EXPECT_EQ(target_.request("rsum 1"), before) << "bytes landed in a deregistered region";
}

}  // namespace
}  // namespace kvxfer::it
