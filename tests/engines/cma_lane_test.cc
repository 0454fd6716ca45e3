// SPDX-License-Identifier: Apache-2.0
// The same-host lane (engines/cma/cma_lane.h) writing into this very
// process: a progress() call copies at most kDefaultCallerSlice (cma_config.h) on
// the caller's thread, however large the write, and the bytes land.
#include "engines/cma/cma_lane.h"
#include "lane_calls.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <string>
#include <thread>
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

// Two lanes of this process: `source` writes from its pool (src, a byte
// pattern) into `target`'s (dst, zeros) once connect() succeeded.
struct LanePair {
  LanePair(std::uint64_t count, std::uint64_t len, int source_threads = 1,
           const CopyPolicy& source_policy = {})
      : src(pattern(count * len)),
        dst(count * len, 0),
        target("target", Region{dst.data(), count, len}, 1),
        source("source", Region{src.data(), count, len}, source_threads, source_policy),
        count_(count),
        len_(len) {}

  [[nodiscard]] std::uint64_t len() const { return len_; }

  static std::vector<std::uint8_t> pattern(std::size_t n) {
    std::vector<std::uint8_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(i * 131 + 7);
    return v;
  }

  ::testing::AssertionResult connect() {
    RemoteRegion remote;
    remote.agent_name = "target";
    remote.base_addr = reinterpret_cast<std::uintptr_t>(dst.data());
    remote.num_blocks = count_;
    remote.block_len = len_;
    remote.pid = static_cast<std::uint32_t>(::getpid());
    std::string why;
    const Status st = test::connect_lane(source, target, remote, &peer, &why);
    if (st == Status::kSuccess) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << status_name(st) << ": " << why;
  }

  // Drives `xfer` to its end from this thread, releases it, and returns its
  // final state (kBackend when a check or the release fails).
  Status finish(XferHandle xfer) {
    Status state = Status::kInProgress;
    while (state == Status::kInProgress) {
      source.progress();
      if (source.check(xfer, &state) != Status::kSuccess) return Status::kBackend;
    }
    return source.release(xfer) == Status::kSuccess ? state : Status::kBackend;
  }

  std::vector<std::uint8_t> src;
  std::vector<std::uint8_t> dst;
  CmaLane target;
  CmaLane source;
  PeerHandle peer{};

 private:
  std::uint64_t count_;
  std::uint64_t len_;
};

TEST(CmaLane, ProgressCopiesAtMostOneCallerSlice) {
  LanePair lanes(kBlocks, kBlockLen);
  ASSERT_TRUE(lanes.connect());
  CmaLane& source = lanes.source;
  std::vector<std::int64_t> blocks(kBlocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  // The copier may take a whole write before the caller gets to it, so write
  // until a progress() call has copied something (the first write almost
  // always suffices).
  for (int attempt = 0; attempt < 50 && counters_of(source)["cma_caller_slices"] == 0; ++attempt) {
    std::fill(lanes.dst.begin(), lanes.dst.end(), 0);
    XferHandle xfer{};
    ASSERT_EQ(test::post_write(source, lanes.len(), lanes.peer, 1, blocks, blocks, &xfer), Status::kSuccess);
    ASSERT_EQ(lanes.finish(xfer), Status::kSuccess);
    ASSERT_EQ(lanes.dst, lanes.src);
  }
  const auto counters = counters_of(source);
  EXPECT_GT(counters.at("cma_caller_slices"), 0u);
  EXPECT_GT(counters.at("cma_caller_slice_max_bytes"), 0u);
  EXPECT_LE(counters.at("cma_caller_slice_max_bytes"), kDefaultCallerSlice);
  EXPECT_EQ(test::disconnect_lane(source, lanes.peer), Status::kSuccess);
}

// KVXFER_CMA_SLICE=0: progress() never copies on the caller's thread; the
// copiers land every byte, once.
TEST(CmaLane, WithNoCallerSliceTheCopiersCopyEverything) {
  CopyPolicy policy;
  policy.caller_slice = 0;
  LanePair lanes(kBlocks, kBlockLen, 1, policy);
  ASSERT_TRUE(lanes.connect());
  CmaLane& source = lanes.source;
  std::vector<std::int64_t> blocks(kBlocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::fill(lanes.dst.begin(), lanes.dst.end(), 0);
    XferHandle xfer{};
    ASSERT_EQ(test::post_write(source, lanes.len(), lanes.peer, 1, blocks, blocks, &xfer), Status::kSuccess);
    ASSERT_EQ(lanes.finish(xfer), Status::kSuccess);
    ASSERT_EQ(lanes.dst, lanes.src);
  }
  const auto counters = counters_of(source);
  EXPECT_EQ(counters.at("cma_caller_slices"), 0u);
  EXPECT_EQ(counters.at("cma_bytes"), 3 * kBlocks * kBlockLen);
  EXPECT_EQ(test::disconnect_lane(source, lanes.peer), Status::kSuccess);
}

// The caller claims from the back of a write, whole iovecs or the tail of
// one, while the copier claims from its front. With runs whose lengths are
// no multiple of the caller's slice, every written block lands exactly, and
// no byte outside them is touched.
TEST(CmaLane, CallerSlicesFromTheBackOfIrregularRunsLandExactly) {
  constexpr std::uint64_t kLen = std::uint64_t{40} << 10;  // 2.5 caller slices
  constexpr std::uint64_t kCount = 256;
  LanePair lanes(kCount, kLen);
  ASSERT_TRUE(lanes.connect());
  CmaLane& source = lanes.source;
  // Runs of 1, 2, 3, 5, 7, 11, 13 and 40 blocks (the last one longer than
  // a copier's chunk), each written 9 blocks further along in the target,
  // with a gap of one block between runs.
  std::vector<std::int64_t> local;
  std::vector<std::int64_t> remote_blocks;
  std::int64_t at = 0;
  for (const std::int64_t run : {1, 2, 3, 5, 7, 11, 13, 40}) {
    for (std::int64_t i = 0; i < run; ++i) {
      local.push_back(at + i);
      remote_blocks.push_back(at + i + 9);
    }
    at += run + 1;
  }
  ASSERT_LT(static_cast<std::uint64_t>(at + 9), kCount);
  std::vector<std::uint8_t> want(lanes.dst.size(), 0);
  for (std::size_t i = 0; i < local.size(); ++i) {
    std::copy_n(lanes.src.begin() + static_cast<std::ptrdiff_t>(local[i] * kLen), kLen,
                want.begin() + static_cast<std::ptrdiff_t>(remote_blocks[i] * kLen));
  }
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::fill(lanes.dst.begin(), lanes.dst.end(), 0);
    const std::uint64_t before = counters_of(source)["cma_bytes"];
    XferHandle xfer{};
    ASSERT_EQ(test::post_write(source, lanes.len(), lanes.peer, 1, local, remote_blocks, &xfer), Status::kSuccess);
    ASSERT_EQ(lanes.finish(xfer), Status::kSuccess);
    ASSERT_TRUE(lanes.dst == want) << "attempt " << attempt;
    // Each byte was copied once: none twice by the copier and the caller.
    ASSERT_EQ(counters_of(source)["cma_bytes"] - before, local.size() * kLen)
        << "attempt " << attempt;
  }
  const auto counters = counters_of(source);
  EXPECT_GT(counters.at("cma_caller_slices"), 0u);
  EXPECT_LE(counters.at("cma_caller_slice_max_bytes"), kDefaultCallerSlice);
  EXPECT_EQ(test::disconnect_lane(source, lanes.peer), Status::kSuccess);
}

// READs in flight together, their destinations disjoint, each split between
// two copiers (from the front) and a caller polling back to back (from the
// back, in tails of iovecs): every block lands in our pool exactly, nothing
// else of it is touched, and each byte is copied once (cma_bytes; under
// ThreadSanitizer, which sees process_vm_readv write our pool, a chunk
// copied by two threads would also be reported as a race).
TEST(CmaLane, ReadsInFlightTogetherLandEachByteOnceWhoeverCopiesThem) {
  constexpr std::uint64_t kLen = std::uint64_t{40} << 10;  // 2.5 caller slices
  constexpr std::uint64_t kCount = 512;
  constexpr int kReads = 4;
  LanePair lanes(kCount, kLen, /*source_threads=*/2);
  // The target's pool holds the pattern (copied in: the lanes registered
  // the vectors' storage); ours starts empty.
  const std::vector<std::uint8_t> theirs = LanePair::pattern(lanes.dst.size());
  std::copy(theirs.begin(), theirs.end(), lanes.dst.begin());
  ASSERT_TRUE(lanes.connect());
  CmaLane& source = lanes.source;
  // Read r takes runs of 1, 2, 3, 5, 7, 11, 13 and 40 blocks of the target
  // from block 100 * r into our blocks from 120 * r, reversed run by run
  // (so runs differ on the two sides), one block apart.
  std::vector<std::vector<std::int64_t>> local(kReads);
  std::vector<std::vector<std::int64_t>> remote(kReads);
  std::vector<std::uint8_t> want(lanes.src.size(), 0);
  std::uint64_t total = 0;
  for (int r = 0; r < kReads; ++r) {
    std::int64_t at = 0;
    for (const std::int64_t run : {1, 2, 3, 5, 7, 11, 13, 40}) {
      for (std::int64_t i = 0; i < run; ++i) {
        remote[r].push_back(100 * r + at + i);
        local[r].push_back(120 * r + at + (run - 1 - i));
      }
      at += run + 1;
    }
    ASSERT_LE(120 * r + at, 120 * (r + 1));
    for (std::size_t i = 0; i < local[r].size(); ++i) {
      std::copy_n(lanes.dst.begin() + static_cast<std::ptrdiff_t>(remote[r][i] * kLen), kLen,
                  want.begin() + static_cast<std::ptrdiff_t>(local[r][i] * kLen));
    }
    total += local[r].size() * kLen;
  }
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::fill(lanes.src.begin(), lanes.src.end(), 0);
    const std::uint64_t before = counters_of(source)["cma_bytes"];
    std::vector<XferHandle> xfers(kReads);
    for (int r = 0; r < kReads; ++r) {
      ASSERT_EQ(test::post_read(source, lanes.len(), lanes.peer, static_cast<TransferId>(r + 1), local[r], remote[r],
                                 &xfers[static_cast<std::size_t>(r)]),
                Status::kSuccess);
    }
    for (int r = 0; r < kReads; ++r) {
      ASSERT_EQ(lanes.finish(xfers[static_cast<std::size_t>(r)]), Status::kSuccess);
    }
    ASSERT_TRUE(lanes.src == want) << "attempt " << attempt;
    ASSERT_EQ(counters_of(source)["cma_bytes"] - before, total) << "attempt " << attempt;
  }
  const auto counters = counters_of(source);
  EXPECT_GT(counters.at("cma_caller_slices"), 0u) << "no poll copied a slice of a read";
  EXPECT_EQ(counters.at("cma_reads"), 20u * kReads);
  EXPECT_EQ(test::disconnect_lane(source, lanes.peer), Status::kSuccess);
}

// A caller that comes back to progress() after pauses (a scheduler thread
// between steps) gets its write done all the same: every byte lands, once,
// whoever copies it (the caller's thread or a copier). Nothing here depends
// on how long the pauses are.
TEST(CmaLane, ACallerThatPausesBetweenPollsGetsItsWriteCopiedOnce) {
  constexpr std::uint64_t kLen = std::uint64_t{1} << 20;
  constexpr std::uint64_t kCount = 16;
  LanePair lanes(kCount, kLen);
  ASSERT_TRUE(lanes.connect());
  CmaLane& source = lanes.source;
  std::vector<std::int64_t> blocks(kCount);
  std::iota(blocks.begin(), blocks.end(), 0);
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::fill(lanes.dst.begin(), lanes.dst.end(), std::uint8_t{0});
    const std::uint64_t before = counters_of(source)["cma_bytes"];
    XferHandle xfer{};
    ASSERT_EQ(test::post_write(source, lanes.len(), lanes.peer, 1, blocks, blocks, &xfer), Status::kSuccess);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    source.progress();  // after a pause
    source.progress();  // at once
    ASSERT_EQ(lanes.finish(xfer), Status::kSuccess) << "attempt " << attempt;
    ASSERT_TRUE(lanes.dst == lanes.src) << "attempt " << attempt;
    EXPECT_EQ(counters_of(source)["cma_bytes"] - before, kCount * kLen) << "attempt " << attempt;
  }
  EXPECT_EQ(counters_of(source)["cma_writes"], 3u);
  EXPECT_EQ(test::disconnect_lane(source, lanes.peer), Status::kSuccess);
}

// A write with a notification, and one alone, through the lane's socket
// (duplicated with pidfd_getfd: here from this very process). The message
// comes after the bytes; a datagram nobody of ours wrote is dropped.
TEST(CmaLane, NotificationsReachTheTargetAfterTheirBytes) {
  LanePair lanes(kBlocks, kBlockLen);
  ASSERT_GE(lanes.target.notify_fd(), 0);
  ASSERT_TRUE(lanes.connect());
  CmaLane& source = lanes.source;
  CmaLane& target = lanes.target;
  const PeerHandle peer = lanes.peer;
  const std::vector<std::uint8_t> note{'h', 'i'};
  const std::vector<std::int64_t> blocks{3, 4};
  XferHandle xfer{};
  ASSERT_EQ(test::post_write(source, lanes.len(), peer, 1, blocks, blocks, &xfer, note), Status::kSuccess);
  ASSERT_EQ(lanes.finish(xfer), Status::kSuccess);
  ASSERT_EQ(test::post_notify(source, peer, 2, std::vector<std::uint8_t>{'!'}, &xfer), Status::kSuccess);
  ASSERT_EQ(lanes.finish(xfer), Status::kSuccess);
  // Not ours: dropped.
  const std::uint8_t junk[3] = {1, 2, 3};
  ASSERT_EQ(::send(target.notify_fd(), junk, sizeof(junk), MSG_DONTWAIT), 3);

  std::vector<Notification> got;
  target.take_notifications(&got);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].agent, "source");
  EXPECT_EQ(got[0].bytes, note);
  EXPECT_EQ(got[1].bytes, std::vector<std::uint8_t>{'!'});
  EXPECT_EQ(lanes.dst[3 * kBlockLen], lanes.src[3 * kBlockLen]);
  EXPECT_EQ(lanes.dst[5 * kBlockLen], 0);
  std::map<std::string, std::uint64_t> counters;
  target.add_counters(counters);
  EXPECT_EQ(counters.at("cma_notifications_received"), 2u);
  EXPECT_EQ(counters.at("cma_notifications_refused"), 1u);
  got.clear();
  target.take_notifications(&got);
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(test::disconnect_lane(source, peer), Status::kSuccess);
}

}  // namespace
}  // namespace kvxfer::internal::cma
