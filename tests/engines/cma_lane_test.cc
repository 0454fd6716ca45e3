// The same-host lane (engines/cma/cma_lane.h) writing into this very
// process: a progress() call copies at most CmaLane::kCallerSliceBytes on
// the caller's thread, however large the write, and the bytes land.
#include "engines/cma/cma_lane.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <string>
#include <vector>

namespace kvxfer::internal::cma {
namespace {

constexpr std::uint64_t kBlocks = 64;
constexpr std::uint64_t kBlockLen = std::uint64_t{256} << 10;  // one run of 16 MiB

std::map<std::string, std::uint64_t> counters_of(const CmaLane& lane) {
  std::map<std::string, std::uint64_t> counters;
  lane.add_counters(counters);
  return counters;
}

TEST(CmaLane, ProgressCopiesAtMostOneCallerSlice) {
  std::vector<std::uint8_t> src(kBlocks * kBlockLen);
  std::vector<std::uint8_t> dst(kBlocks * kBlockLen);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>(i * 131 + 7);
  const Region src_region{src.data(), kBlocks, kBlockLen};
  const Region dst_region{dst.data(), kBlocks, kBlockLen};
  CmaLane target("target", dst_region, 1);
  CmaLane source("source", src_region, 1);

  RemoteRegion remote;
  remote.agent_name = "target";
  remote.base_addr = reinterpret_cast<std::uintptr_t>(dst.data());
  remote.num_blocks = kBlocks;
  remote.block_len = kBlockLen;
  remote.pid = static_cast<std::uint32_t>(::getpid());
  PeerHandle peer{};
  std::string why;
  ASSERT_EQ(source.connect(remote, target.cookie_addr(), target.cookie_epoch(), &peer, &why),
            Status::kSuccess)
      << why;

  std::vector<std::int64_t> blocks(kBlocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  // The copier may take a whole write before the caller gets to it, so write
  // until a progress() call has copied something (the first write almost
  // always suffices).
  for (int attempt = 0; attempt < 50 && counters_of(source)["cma_caller_slices"] == 0; ++attempt) {
    std::fill(dst.begin(), dst.end(), 0);
    XferHandle xfer{};
    ASSERT_EQ(source.post_write(peer, 1, blocks, blocks, &xfer), Status::kSuccess);
    Status state = Status::kInProgress;
    while (state == Status::kInProgress) {
      source.progress();
      ASSERT_EQ(source.check(xfer, &state), Status::kSuccess);
    }
    ASSERT_EQ(state, Status::kSuccess);
    ASSERT_EQ(source.release(xfer), Status::kSuccess);
    ASSERT_EQ(dst, src);
  }
  const auto counters = counters_of(source);
  EXPECT_GT(counters.at("cma_caller_slices"), 0u);
  EXPECT_GT(counters.at("cma_caller_slice_max_bytes"), 0u);
  EXPECT_LE(counters.at("cma_caller_slice_max_bytes"), CmaLane::kCallerSliceBytes);
  EXPECT_EQ(source.disconnect(peer), Status::kSuccess);
}

}  // namespace
}  // namespace kvxfer::internal::cma
