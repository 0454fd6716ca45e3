// SPDX-License-Identifier: Apache-2.0
// Regions besides the pool on the UCX lane (backend UCX, KVXFER_LANES=ucx
// over UCX's tcp transport with KVXFER_RMA=on), as NIXL's agents use them:
// transports with no pool and several regions, writes and reads between
// them checked byte for byte, a region added later reached after a new
// registration, metadata that disagrees with the peer's keys refused, the
// pool (write_blocks) beside regions; and at the engine, runs outside the
// peer's regions refused at post (the only check there is: puts and gets
// are one-sided) and a removal of ours that returns only once no get of
// ours lands in the region.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine.h"
#include "engine_agent.h"
#include "kvxfer/transport.h"
#include "support/region_agent.h"
#include "wire/metadata.h"
#include "wire/peer_blob.h"

namespace kvxfer::it {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t kRegionLen = 64 * 1024;

std::map<std::string, std::string> ucx_lane() {
  return {{"TLS", "tcp"}, {"KVXFER_LANES", "ucx"}, {"KVXFER_RMA", "on"}};
}

Options ucx_options() {
  Options options;
  options.engine_config = ucx_lane();
  return options;
}

std::uint64_t addr_of(const std::vector<std::uint8_t>& bytes, std::size_t offset = 0) {
  return reinterpret_cast<std::uintptr_t>(bytes.data()) + offset;
}

bool all_zero(const std::vector<std::uint8_t>& bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t b) { return b == 0; });
}

void fill(std::vector<std::uint8_t>& b, std::uint8_t seed, std::size_t r) {
  for (std::size_t i = 0; i < b.size(); ++i) {
    b[i] = static_cast<std::uint8_t>(1 + (seed * 31 + i * 7 + r * 13) % 251);
  }
}

// A transport on the UCX lane with `regions` registered buffers of
// kRegionLen bytes (a pattern when `seed` is nonzero, else zeros) and a pool
// of `blocks` blocks of kBlockLen (none when 0) (support/region_agent.h).
struct RegionAgent : test::RegionAgent {
  static constexpr std::uint64_t kBlockLen = 4096;

  RegionAgent(const std::string& name, int regions, std::uint8_t seed, std::uint64_t blocks = 0)
      : test::RegionAgent(name, {.regions = regions,
                                 .region_len = kRegionLen,
                                 .seed = seed,
                                 .options = ucx_options(),
                                 .own_pool_blocks = blocks,
                                 .own_block_len = kBlockLen}) {}
};

using test::outcome;

// a registers b, one way only: two engines in one process that register
// each other over UCX 1.13's tcp transport can abort in UCX
// (ucp_ep.inl:215, remote_ep_id) when they close right after.
class UcxRegionsTest : public ::testing::Test {
 protected:
  UcxRegionsTest() : a("a", 2, 5), b("b", 3, 0) {
    a.transport.add_remote_peer("b", b.transport.agent_metadata());
  }
  std::uint64_t counter(Transport& t, const std::string& name) {
    return t.stats().engine_counters.at(name);
  }
  RegionAgent a;
  RegionAgent b;
  RegionAgent c{"c", 3, 0};  // a reader of a's regions, when a test needs one
};

TEST_F(UcxRegionsTest, TheUcxLaneCarriesPeersWithRegionsAndNoPool) {
  EXPECT_EQ(a.transport.peer_regions("b").size(), 3u);
  EXPECT_EQ(a.transport.num_blocks(), 0u);
  // One UCX registration per region, and one rkey per region of the peer's.
  EXPECT_EQ(a.transport.stats().live.memory_registrations, 2u);
  EXPECT_EQ(a.transport.stats().live.remote_keys, 3u);
}

// The keys published are those of the regions registered when the
// metadata is taken.
std::vector<std::uint64_t> key_ids(Transport& t) {
  const wire::AgentMetadata m = wire::decode(t.agent_metadata());
  wire::PeerBlob blob;
  EXPECT_TRUE(wire::decode_blob(m.engine_blob, &blob));
  std::vector<std::uint64_t> ids;
  for (const wire::RegionKey& k : blob.region_keys) ids.push_back(k.id);
  return ids;
}

TEST_F(UcxRegionsTest, TheBlobListsAKeyForEachRegionRegisteredNow) {
  EXPECT_EQ(key_ids(b.transport), (std::vector<std::uint64_t>{b.ids[0], b.ids[1], b.ids[2]}));
  b.transport.deregister_memory(b.ids[1]);
  EXPECT_EQ(key_ids(b.transport), (std::vector<std::uint64_t>{b.ids[0], b.ids[2]}));
  const RegionId again = b.transport.register_memory(b.buffers[1].data(), kRegionLen);
  auto want = std::vector<std::uint64_t>{b.ids[0], b.ids[2], again};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(key_ids(b.transport), want);
}

TEST_F(UcxRegionsTest, AWriteAcrossRegionsLandsByteForByteAndNothingElse) {
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
  EXPECT_EQ(counter(a.transport, "ucx_writes"), 1u);
  EXPECT_EQ(counter(a.transport, "ucx_puts"), 3u);
}

TEST_F(UcxRegionsTest, AReadAcrossRegionsBringsThePeersBytesIntoOurRegions) {
  // c reads from a into its 3 zeroed regions.
  c.transport.add_remote_peer("a", a.transport.agent_metadata());
  std::vector<MemDesc> theirs;
  std::vector<MemDesc> ours;
  for (std::size_t k = 0; k < 8; ++k) {
    theirs.push_back({addr_of(a.buffers[k % 2], k * 4096 + 7), 4000});
    ours.push_back({addr_of(c.buffers[k % 3], k * 4096 + 1), 4000});
  }
  const DescList l = c.transport.prepare(ours);
  const DescList r = c.transport.prepare(theirs, "a");
  const std::vector<std::int64_t> li{7, 0, 3, 4};
  const std::vector<std::int64_t> ri{1, 4, 6, 5};
  const auto id = c.transport.transfer(TransferOp::kRead, "a", l, li, r, ri);
  ASSERT_TRUE(id);
  ASSERT_EQ(outcome(c.transport, "a", *id), std::optional<bool>(true));
  std::vector<std::vector<std::uint8_t>> want(3, std::vector<std::uint8_t>(kRegionLen, 0));
  for (std::size_t i = 0; i < li.size(); ++i) {
    const auto from = static_cast<std::size_t>(ri[i]);
    const auto to = static_cast<std::size_t>(li[i]);
    std::copy_n(a.buffers[from % 2].begin() + static_cast<std::ptrdiff_t>(from * 4096 + 7), 4000,
                want[to % 3].begin() + static_cast<std::ptrdiff_t>(to * 4096 + 1));
  }
  EXPECT_EQ(c.buffers, want);
  EXPECT_EQ(counter(c.transport, "ucx_gets"), 4u);
}

TEST_F(UcxRegionsTest, ARegionTheTargetAddsLaterIsReachedOnceItsMetadataIsTakenAgain) {
  std::vector<std::uint8_t> later(kRegionLen, 0);
  const RegionId later_id = b.transport.register_memory(later.data(), later.size());
  // a knows b's regions from the metadata it registered: not this one.
  const std::vector<MemDesc> there{{addr_of(later, 512), 256}};
  EXPECT_THROW(static_cast<void>(a.transport.prepare(there, "b")), std::invalid_argument);
  a.transport.add_remote_peer("b", b.transport.agent_metadata());
  const DescList l = a.transport.prepare(std::vector<MemDesc>{{addr_of(a.buffers[1], 64), 256}});
  const DescList r = a.transport.prepare(there, "b");
  const auto id = a.transport.transfer(TransferOp::kWrite, "b", l, r);
  ASSERT_TRUE(id);
  ASSERT_EQ(outcome(a.transport, "b", *id), std::optional<bool>(true));
  EXPECT_TRUE(
      std::equal(a.buffers[1].begin() + 64, a.buffers[1].begin() + 320, later.begin() + 512));
  b.transport.deregister_memory(later_id);
}

TEST_F(UcxRegionsTest, MetadataWhoseRegionDisagreesWithThePeersKeyIsRefused) {
  // The control plane hands a's metadata with a region grown past what a's
  // UCX lane registered (and published a key for): refused at registration.
  wire::AgentMetadata m = wire::decode(a.transport.agent_metadata());
  ASSERT_EQ(m.regions.size(), 2u);
  m.regions[1].len += 4096;
  EXPECT_THROW(c.transport.add_remote_peer("a2", wire::encode(m)), std::runtime_error);
  // And a region a never registered.
  m = wire::decode(a.transport.agent_metadata());
  m.regions.push_back({m.regions.back().id + 1, m.regions.back().addr + kRegionLen * 4, 4096});
  EXPECT_THROW(c.transport.add_remote_peer("a3", wire::encode(m)), std::runtime_error);
}

TEST_F(UcxRegionsTest, ARegionWithATransferInFlightIsDeregisteredOnlyOnceItEnded) {
  // As on every lane, the core refuses while a transfer between regions is
  // in flight; once it ended the region goes, and with it c's key for it.
  c.transport.add_remote_peer("a", a.transport.agent_metadata());
  const DescList l = c.transport.prepare(std::vector<MemDesc>{{addr_of(c.buffers[0]), kRegionLen}});
  const DescList r =
      c.transport.prepare(std::vector<MemDesc>{{addr_of(a.buffers[0]), kRegionLen}}, "a");
  const auto id = c.transport.transfer(TransferOp::kRead, "a", l, r);
  ASSERT_TRUE(id);
  bool refused = false;
  try {
    c.transport.deregister_memory(c.ids[0]);
  } catch (const std::logic_error&) {
    refused = true;
  }
  ASSERT_EQ(outcome(c.transport, "a", *id), std::optional<bool>(true));
  if (refused) c.transport.deregister_memory(c.ids[0]);
  EXPECT_EQ(c.buffers[0], a.buffers[0]);
  EXPECT_EQ(c.transport.stats().live.memory_registrations, 2u);
  EXPECT_EQ(c.transport.regions().size(), 2u);
}

TEST(UcxRegionsPoolTest, WriteBlocksStillWorksBesideRegions) {
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
  EXPECT_EQ(a.transport.stats().engine_counters.at("ucx_puts"), 2u);
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

// Two UCX engines with no pool, one region each (slot 1), the source
// connected to the target: posts of runs the core would never build.
struct EnginePair {
  static constexpr std::uint64_t kId = (std::uint64_t{1} << 32) | 1;

  explicit EnginePair(std::size_t len)
      : theirs(len, 0), ours(len, 0), target(make("target")), source(make("source")) {
    fill(theirs, 3, 0);
  }
  std::unique_ptr<internal::Engine> make(const std::string& name) {
    return internal::make_ucx_engine(internal::EngineConfig{name, Region{}, &options});
  }
  ~EnginePair() {
    if (peer != 0) static_cast<void>(source->disconnect(peer));
    source->shutdown();
    target->shutdown();
  }

  ::testing::AssertionResult connect() {
    std::string why;
    if (target->add_region({kId, addr_of(theirs), theirs.size()}, &why) != Status::kSuccess ||
        source->add_region({kId, addr_of(ours), ours.size()}, &why) != Status::kSuccess) {
      return ::testing::AssertionFailure() << "add_region: " << why;
    }
    internal::RemoteRegion remote;
    remote.agent_name = "target";
    remote.pid = static_cast<std::uint32_t>(::getpid());
    remote.boot_id = boot_id();
    remote.regions = {internal::MemRegion{kId, addr_of(theirs), theirs.size()}};
    const Status st = source->connect(target->local_blob(), remote, &peer, &why);
    if (st == Status::kSuccess) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << status_name(st) << ": " << why;
  }

  Status post(TransferOp op, const internal::ByteRun& run, internal::XferHandle* out) {
    return source->post(peer, internal::Post{op, 1, std::span(&run, 1), run.len, {}, false}, out);
  }

  std::vector<std::uint8_t> theirs;
  std::vector<std::uint8_t> ours;
  Options options = [] {
    Options o;
    o.engine_config = ucx_lane();
    return o;
  }();
  std::unique_ptr<internal::Engine> target;
  std::unique_ptr<internal::Engine> source;
  internal::PeerHandle peer = 0;
};

TEST(UcxRegionsEngineTest, ARunOutsideThePeersRegionIsRefusedAtPostAndNothingMoves) {
  EnginePair p(kRegionLen);
  std::swap(p.theirs, p.ours);  // we write our pattern into their zeros
  ASSERT_TRUE(p.connect());
  constexpr auto kSlot = static_cast<std::uint32_t>(EnginePair::kId);
  for (const internal::ByteRun run : {
           internal::ByteRun{0, kRegionLen - 100, 101, kSlot, 0},       // one byte past its end
           internal::ByteRun{0, ~std::uint64_t{0} - 10, 64, kSlot, 0},  // offset wraps
           internal::ByteRun{0, 0, 64, kSlot, 1},                       // no such region
           internal::ByteRun{kRegionLen - 10, 0, 64, kSlot, 0},         // past ours
           internal::ByteRun{0, 0, 64, kSlot + 1, 0},                   // not a region of ours
           internal::ByteRun{0, 0, 64, 0, 0},                           // our pool: none
       }) {
    internal::XferHandle xfer = 0;
    EXPECT_EQ(p.post(TransferOp::kWrite, run, &xfer), Status::kInvalidParam)
        << run.local << " " << run.remote << " " << run.len;
    EXPECT_EQ(xfer, 0u);
  }
  EXPECT_EQ(p.source->counters().at("ucx_refused_runs"), 6u);
  EXPECT_EQ(p.source->counters().at("ucx_puts"), 0u);
  EXPECT_EQ(p.source->live().transfers, 0u);
  // The last byte fits.
  internal::XferHandle xfer = 0;
  ASSERT_EQ(p.post(TransferOp::kWrite, {0, kRegionLen - 100, 100, kSlot, 0}, &xfer),
            Status::kSuccess);
  EXPECT_EQ(wait_state(*p.source, xfer), std::make_pair(Status::kSuccess, Status::kSuccess));
  EXPECT_EQ(p.source->release(xfer), Status::kSuccess);
  EXPECT_TRUE(std::equal(p.ours.begin(), p.ours.begin() + 100, p.theirs.end() - 100));
  EXPECT_TRUE(std::all_of(p.theirs.begin(), p.theirs.end() - 100, [](auto b) { return b == 0; }));
}

// A READ into our region, removed while its gets are in flight:
// remove_region returns once the read ended, and from its return on not one
// byte of the region changes. Posts that name it are refused from then on.
TEST(UcxRegionsEngineTest, RemovingOurRegionMidReadReturnsOnlyOnceNoByteLandsAnyMore) {
  constexpr std::size_t kLen = std::size_t{64} << 20;
  EnginePair p(kLen);
  ASSERT_TRUE(p.connect());
  const internal::ByteRun run{0, 0, kLen, static_cast<std::uint32_t>(EnginePair::kId), 0};
  internal::XferHandle xfer = 0;
  ASSERT_EQ(p.post(TransferOp::kRead, run, &xfer), Status::kSuccess);
  ASSERT_EQ(p.source->remove_region(EnginePair::kId), Status::kSuccess);
  Status state = Status::kInProgress;
  ASSERT_EQ(p.source->check(xfer, &state), Status::kSuccess);
  EXPECT_NE(state, Status::kInProgress) << "remove_region returned with the read in flight";
  const std::vector<std::uint8_t> at_return = p.ours;
  std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(p.ours == at_return) << "bytes landed in our region after remove_region returned";
  EXPECT_EQ(p.source->release(xfer), Status::kSuccess);
  // Done (its gets were posted before the removal) or cancelled (still
  // queued): either way nothing more lands.
  EXPECT_TRUE(state == Status::kSuccess || state == Status::kCanceled) << status_name(state);
  if (state == Status::kSuccess) {
    EXPECT_TRUE(p.ours == p.theirs);
  }
  internal::XferHandle again = 0;
  EXPECT_EQ(p.post(TransferOp::kRead, run, &again), Status::kInvalidParam);
  EXPECT_EQ(p.source->live().memory_registrations, 0u);
}

}  // namespace
}  // namespace kvxfer::it
