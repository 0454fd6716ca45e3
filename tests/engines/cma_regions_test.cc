// SPDX-License-Identifier: Apache-2.0
// Regions on the same-host lane (engines/cma/cma_regions.cc), lane to lane in
// this process, with no pool on either side: a removal of ours returns only
// once no chunk of ours touches the region (queued ones dropped), a
// target's withdrawal fails a transfer at its next chunk, and a target's
// removal returns only once no peer's chunk can still land in the region
// (the fence table, engines/cma/cma_fence.h), without waiting on a peer
// that died or for ever on one that froze.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
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
  explicit RegionPair(std::size_t bytes = kLen, int copiers = 1)
      : len(bytes),
        theirs(pattern(bytes)),
        ours(bytes, 0),
        target("target", Region{}, 1),
        source("source", Region{}, copiers, CopyPolicy{.caller_slice = 0}) {}

  ::testing::AssertionResult connect() {
    std::string why;
    if (target.add_region(MemRegion{kId, addr(theirs), len}, &why) != Status::kSuccess ||
        source.add_region(MemRegion{kId, addr(ours), len}, &why) != Status::kSuccess) {
      return ::testing::AssertionFailure() << "add_region: " << why;
    }
    return connect_source(source, ::getpid());
  }

  // Connects `lane` (ours, or a child's) to the target, which runs in `pid`.
  ::testing::AssertionResult connect_source(CmaLane& lane, pid_t pid) {
    std::string why;
    RemoteRegion remote;
    remote.agent_name = "target";
    remote.pid = static_cast<std::uint32_t>(pid);
    remote.regions = {MemRegion{kId, addr(theirs), len}};
    const Status st = test::connect_lane(lane, target, remote, &peer, &why, /*notify=*/false);
    if (st == Status::kSuccess) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << status_name(st) << ": " << why;
  }

  static std::uint64_t addr(const std::vector<std::uint8_t>& v) {
    return reinterpret_cast<std::uintptr_t>(v.data());
  }

  Status post(TransferOp op, XferHandle* out) { return post_from(source, op, out); }
  Status post_from(CmaLane& lane, TransferOp op, XferHandle* out) {
    const ByteRun run{0, 0, len, static_cast<std::uint32_t>(kId), 0};
    return lane.post(lane_peer(peer), Post{op, 1, std::span(&run, 1), len, {}, false}, out);
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

  std::size_t len;
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

// Between a chunk's checks and its copy, the copier sleeps: every chunk a
// removal meets is one that already passed its checks.
void sleep_in_chunk(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<const int*>(ms)));
}

// The window the fence closes: peers' writes into the target's region run
// all along, each chunk pausing between its checks and its copy; once the
// target's remove_region returns, the target takes the memory back and
// writes its own pattern, and not one byte of it changes afterwards.
TEST(CmaRegions, NoChunkOfAPeerLandsInARegionAfterTheTargetRemovedIt) {
  constexpr std::size_t kSmall = std::size_t{8} << 20;  // 8 chunks: refilled in a moment
  RegionPair p(kSmall, /*copiers=*/8);
  std::swap(p.theirs, p.ours);  // we write our pattern into their zeros
  ASSERT_TRUE(p.connect());
  int pause_ms = 20;
  p.source.set_chunk_hook(sleep_in_chunk, &pause_ms);
  std::atomic<bool> stop{false};
  std::atomic<int> writes{0};
  std::thread writer([&] {
    while (!stop.load()) {
      XferHandle xfer{};
      if (p.post(TransferOp::kWrite, &xfer) != Status::kSuccess) break;
      const Status state = p.finish(xfer);
      writes.fetch_add(1);
      if (state != Status::kSuccess) break;  // the region was withdrawn
    }
  });
  std::this_thread::sleep_for(50ms);  // chunks copying, others paused after their checks
  ASSERT_EQ(p.target.remove_region(kId), Status::kSuccess);
  // The memory is the target's own again.
  std::memset(p.theirs.data(), 0xa5, p.theirs.size());
  std::this_thread::sleep_for(4 * std::chrono::milliseconds(pause_ms));
  const auto changed =
      std::count_if(p.theirs.begin(), p.theirs.end(), [](std::uint8_t b) { return b != 0xa5; });
  stop.store(true);
  writer.join();
  EXPECT_EQ(changed, 0) << "bytes of a peer's chunk landed after remove_region returned";
  EXPECT_GE(writes.load(), 1);
}

// A peer killed while it holds its mark (between its checks and its copy)
// never takes the mark back: the target finds its process gone (a zombie
// its parent has not reaped yet) and the removal returns at once, long
// before CopyPolicy::kHolderWait, with the region untouched.
TEST(CmaRegions, ARemovalDoesNotWaitForAPeerKilledMidChunk) {
  RegionPair p(std::size_t{4} << 20);
  std::swap(p.theirs, p.ours);
  const std::vector<std::uint8_t> before = p.theirs;
  std::string why;
  ASSERT_EQ(p.target.add_region(MemRegion{kId, RegionPair::addr(p.theirs), p.len}, &why),
            Status::kSuccess);
  // The child writes into us: allow it where Yama limits ptrace to
  // descendants (elsewhere the call fails harmlessly).
  static_cast<void>(::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0));
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // One chunk, which stops for good once it holds its mark.
    CmaLane lane("child", Region{}, 1, CopyPolicy{.caller_slice = 0});
    XferHandle xfer{};
    if (lane.add_region(MemRegion{kId, RegionPair::addr(p.ours), p.len}, &why) !=
            Status::kSuccess ||
        !p.connect_source(lane, parent)) {
      ::_exit(2);
    }
    lane.set_chunk_hook(
        [](void* fd) {
          static_cast<void>(::write(*static_cast<int*>(fd), "m", 1));
          for (;;) ::pause();
        },
        &ready[1]);
    if (p.post_from(lane, TransferOp::kWrite, &xfer) != Status::kSuccess) ::_exit(3);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  pollfd marked{ready[0], POLLIN, 0};
  ASSERT_EQ(::poll(&marked, 1, 10000), 1) << "the child never reached its copy";
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  const auto start = std::chrono::steady_clock::now();
  const Status removed = p.target.remove_region(kId);
  const auto took = std::chrono::steady_clock::now() - start;
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  EXPECT_EQ(removed, Status::kSuccess);
  EXPECT_LT(took, CopyPolicy::kHolderWait / 4);
  EXPECT_TRUE(p.theirs == before);
}

// A live peer that holds its mark past CopyPolicy::kHolderWait (frozen)
// does not hold the removal for ever: it fails, after that long, and the
// peer's chunk, let go afterwards, is its own transfer's to fail or land.
TEST(CmaRegions, ARemovalGivesUpOnAPeerFrozenMidChunk) {
  RegionPair p(std::size_t{1} << 20);
  std::swap(p.theirs, p.ours);
  ASSERT_TRUE(p.connect());
  struct Gate {
    std::atomic<bool> in{false};
    std::atomic<bool> open{false};
  } gate;
  p.source.set_chunk_hook(
      [](void* arg) {
        auto* g = static_cast<Gate*>(arg);
        g->in.store(true);
        while (!g->open.load()) std::this_thread::sleep_for(1ms);
      },
      &gate);
  XferHandle xfer{};
  ASSERT_EQ(p.post(TransferOp::kWrite, &xfer), Status::kSuccess);
  while (!gate.in.load()) std::this_thread::sleep_for(1ms);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(p.target.remove_region(kId), Status::kBackend);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, CopyPolicy::kHolderWait);
  EXPECT_LT(took, CopyPolicy::kHolderWait * 2);
  gate.open.store(true);
  static_cast<void>(p.finish(xfer));
}

}  // namespace
}  // namespace kvxfer::internal::cma
