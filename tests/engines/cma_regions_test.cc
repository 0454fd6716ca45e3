// SPDX-License-Identifier: Apache-2.0
// Regions on the same-host lane (engines/cma/cma_regions.cc), lane to lane in
// this process, with no pool on either side: a removal of ours returns only
// once no chunk of ours touches the region (queued ones dropped), and a
// target's withdrawal fails a transfer at its next chunk.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "engines/cma/cma_lane.h"
#include "lane_calls.h"

namespace kvxfer::internal::cma {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t kLen = std::size_t{64} << 20;          // 64 one-MiB chunks
constexpr std::uint64_t kId = (std::uint64_t{1} << 32) | 3;  // slot 3, generation 1

std::vector<std::uint8_t> pattern(std::size_t n) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(i * 131 + 7);
  return v;
}

// `source` connected to `target`, each with one region (no pool), no
// caller slices: one copier thread copies everything.
struct RegionPair {
  RegionPair()
      : theirs(pattern(kLen)),
        ours(kLen, 0),
        target("target", Region{}, 1),
        source("source", Region{}, 1, CopyPolicy{.caller_slice = 0}) {}

  ::testing::AssertionResult connect() {
    std::string why;
    if (target.add_region(MemRegion{kId, addr(theirs), kLen}, &why) != Status::kSuccess ||
        source.add_region(MemRegion{kId, addr(ours), kLen}, &why) != Status::kSuccess) {
      return ::testing::AssertionFailure() << "add_region: " << why;
    }
    RemoteRegion remote;
    remote.agent_name = "target";
    remote.pid = static_cast<std::uint32_t>(::getpid());
    remote.regions = {MemRegion{kId, addr(theirs), kLen}};
    const Status st = test::connect_lane(source, target, remote, &peer, &why);
    if (st == Status::kSuccess) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << status_name(st) << ": " << why;
  }

  static std::uint64_t addr(const std::vector<std::uint8_t>& v) {
    return reinterpret_cast<std::uintptr_t>(v.data());
  }

  Status post(TransferOp op, XferHandle* out) {
    const ByteRun run{0, 0, kLen, static_cast<std::uint32_t>(kId), 0};
    return source.post(lane_peer(peer), Post{op, 1, std::span(&run, 1), kLen, {}, false}, out);
  }

  Status finish(XferHandle xfer) {
    Status state = Status::kInProgress;
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (state == Status::kInProgress && std::chrono::steady_clock::now() < deadline) {
      const Status st = source.check(xfer, &state);
      if (st != Status::kSuccess) state = st;
      std::this_thread::sleep_for(100us);
    }
    EXPECT_EQ(source.release(xfer), Status::kSuccess);
    return state;
  }

  std::vector<std::uint8_t> theirs;
  std::vector<std::uint8_t> ours;
  CmaLane target;
  CmaLane source;
  PeerHandle peer{};
};

TEST(CmaRegions, AReadBetweenRegionsWithNoPoolLandsExactly) {
  RegionPair p;
  ASSERT_TRUE(p.connect());
  XferHandle xfer{};
  ASSERT_EQ(p.post(TransferOp::kRead, &xfer), Status::kSuccess);
  EXPECT_EQ(p.finish(xfer), Status::kSuccess);
  EXPECT_TRUE(p.ours == p.theirs);
}

// A READ into our region, removed while most of its chunks are queued:
// remove_region waits for the running chunk, drops the rest, and from its
// return on not one byte of the region changes; the transfer is cancelled.
TEST(CmaRegions, RemovingOurRegionMidReadStopsEveryByteBeforeItReturns) {
  RegionPair p;
  ASSERT_TRUE(p.connect());
  XferHandle xfer{};
  ASSERT_EQ(p.post(TransferOp::kRead, &xfer), Status::kSuccess);
  ASSERT_EQ(p.source.remove_region(kId), Status::kSuccess);
  const std::vector<std::uint8_t> at_return = p.ours;
  std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(p.ours == at_return) << "bytes landed in our region after remove_region returned";
  EXPECT_EQ(p.finish(xfer), Status::kCanceled);
  EXPECT_TRUE(p.ours == at_return);
  EXPECT_FALSE(p.ours == p.theirs) << "the read ended before the removal: nothing was tested";
}

// A WRITE into the target's region, which the target withdraws midway: the
// next chunk's check finds it withdrawn and the transfer fails; once it has
// ended, the region holds still.
TEST(CmaRegions, AWriteIntoARegionTheTargetWithdrawsMidwayFails) {
  RegionPair p;
  std::swap(p.theirs, p.ours);  // we write our pattern into their zeros
  ASSERT_TRUE(p.connect());
  XferHandle xfer{};
  ASSERT_EQ(p.post(TransferOp::kWrite, &xfer), Status::kSuccess);
  ASSERT_EQ(p.target.remove_region(kId), Status::kSuccess);
  const Status state = p.finish(xfer);
  EXPECT_NE(state, Status::kSuccess);
  const std::vector<std::uint8_t> at_end = p.theirs;
  std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(p.theirs == at_end);
  EXPECT_FALSE(p.theirs == p.ours) << "the write ended before the withdrawal: nothing was tested";
}

TEST(CmaRegions, AConnectToRegionsTheTargetDoesNotDeclareIsRefused) {
  RegionPair p;
  std::string why;
  ASSERT_EQ(p.target.add_region(MemRegion{kId, RegionPair::addr(p.theirs), kLen}, &why),
            Status::kSuccess);
  RemoteRegion remote;
  remote.agent_name = "target";
  remote.pid = static_cast<std::uint32_t>(::getpid());
  // The same slot under the next generation, and at its place a region of
  // another length.
  for (const MemRegion forged :
       {MemRegion{kId + (std::uint64_t{1} << 32), RegionPair::addr(p.theirs), kLen},
        MemRegion{kId, RegionPair::addr(p.theirs), kLen / 2}}) {
    remote.regions = {forged};
    EXPECT_EQ(test::connect_lane(p.source, p.target, remote, &p.peer, &why), Status::kMismatch);
    EXPECT_NE(why.find("the target registered"), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace kvxfer::internal::cma
