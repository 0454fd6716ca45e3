// SPDX-License-Identifier: Apache-2.0
// Mapping a same-host peer's SharedPool (engines/cma/cma_mapping.h), with
// this very process as the peer: what the peer's cookie declares is mapped
// only when the kernel agrees it is the sealed memfd behind the declared
// pool; and a CmaLane whose target pool is a SharedPool copies through the
// mapping, landing exactly the bytes process_vm_writev would.
#include "engines/cma/cma_mapping.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "common/shared_pools.h"
#include "engines/cma/cma_cookie.h"
#include "engines/cma/cma_lane.h"
#include "lane_calls.h"
#include "kvxfer/shared_pool.h"

namespace kvxfer::internal::cma {
namespace {

constexpr std::uint64_t kBlocks = 16;
constexpr std::uint64_t kBlockLen = 64 * 1024;
constexpr std::uint64_t kPoolBytes = kBlocks * kBlockLen;

// What a target's cookie would declare for `pool` (a SharedPool's memory at
// `offset` into it), naming descriptor `fd`.
Declaration declare(const void* base, int fd, std::uint64_t offset,
                    std::uint64_t num_blocks = kBlocks) {
  Declaration d;
  d.epoch = 1;
  d.base_addr = reinterpret_cast<std::uintptr_t>(base);
  d.num_blocks = num_blocks;
  d.block_len = kBlockLen;
  d.pool_fd = static_cast<std::uint32_t>(fd);
  d.pool_offset = offset;
  return d;
}

// A SharedPool's descriptor, as the target's engine would publish it.
struct Published {
  explicit Published(const SharedPool& pool) : file(find_shared_pool(pool.data(), kPoolBytes)) {}
  ~Published() {
    if (file.fd >= 0) ::close(file.fd);
  }
  SharedPoolFile file;
};

Status try_map(const Declaration& d, PeerPoolMapping* out, std::string* why) {
  return map_peer_pool(::getpid(), d, 0, false, out, why);
}

TEST(PeerPoolMapping, ASharedPoolIsMappedAndItsBytesAreThePools) {
  SharedPool pool(kPoolBytes);
  Published published(pool);
  ASSERT_GE(published.file.fd, 0);
  PeerPoolMapping mapping;
  std::string why;
  ASSERT_EQ(try_map(declare(pool.data(), published.file.fd, 0), &mapping, &why), Status::kSuccess)
      << why;
  ASSERT_TRUE(mapping.mapped());
  const auto base = reinterpret_cast<std::uintptr_t>(pool.data());
  std::uint8_t* const last = mapping.at(base + kPoolBytes - 8);
  std::memcpy(last, "kvxfer!", 8);
  EXPECT_EQ(std::memcmp(static_cast<std::uint8_t*>(pool.data()) + kPoolBytes - 8, "kvxfer!", 8), 0);
  EXPECT_NE(last, static_cast<std::uint8_t*>(pool.data()) + kPoolBytes - 8)
      << "a mapping of its own, not the target's address";
}

TEST(PeerPoolMapping, APopulatedMappingHoldsThePoolsBytesToo) {
  SharedPool pool(kPoolBytes);
  std::memset(pool.data(), 0x3c, kPoolBytes);
  Published published(pool);
  PeerPoolMapping mapping;
  std::string why;
  ASSERT_EQ(map_peer_pool(::getpid(), declare(pool.data(), published.file.fd, 0), 0, true, &mapping,
                          &why),
            Status::kSuccess)
      << why;
  const auto base = reinterpret_cast<std::uintptr_t>(pool.data());
  EXPECT_EQ(*mapping.at(base + kPoolBytes / 2), 0x3c);
}

TEST(PeerPoolMapping, APoolAtAnOffsetThatIsNotAPageIsMappedAtThatOffset) {
  SharedPool pool(kPoolBytes + 8192);
  auto* const region = static_cast<std::uint8_t*>(pool.data()) + 4100;
  SharedPoolFile file = find_shared_pool(region, kPoolBytes);
  ASSERT_GE(file.fd, 0);
  ASSERT_EQ(file.offset, 4100u);
  PeerPoolMapping mapping;
  std::string why;
  const Status st = try_map(declare(region, file.fd, file.offset), &mapping, &why);
  ::close(file.fd);
  ASSERT_EQ(st, Status::kSuccess) << why;
  const auto base = reinterpret_cast<std::uintptr_t>(region);
  *mapping.at(base) = 0x5a;
  *mapping.at(base + kPoolBytes - 1) = 0x6b;
  EXPECT_EQ(region[0], 0x5a);
  EXPECT_EQ(region[kPoolBytes - 1], 0x6b);
}

TEST(PeerPoolMapping, AnUnsealedMemfdIsRefused) {
  const int fd = ::memfd_create("kvxfer-pool", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kPoolBytes), 0);
  void* base = ::mmap(nullptr, kPoolBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(base, MAP_FAILED);
  PeerPoolMapping mapping;
  std::string why;
  EXPECT_EQ(try_map(declare(base, fd, 0), &mapping, &why), Status::kMismatch);
  EXPECT_NE(why.find("sealed"), std::string::npos) << why;
  EXPECT_FALSE(mapping.mapped());
  ::munmap(base, kPoolBytes);
  ::close(fd);
}

TEST(PeerPoolMapping, AWriteSealedMemfdIsRefused) {
  const int fd = ::memfd_create("kvxfer-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kPoolBytes), 0);
  void* base = ::mmap(nullptr, kPoolBytes, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(base, MAP_FAILED);
  ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_FUTURE_WRITE), 0);
  PeerPoolMapping mapping;
  std::string why;
  EXPECT_EQ(try_map(declare(base, fd, 0), &mapping, &why), Status::kMismatch);
  EXPECT_FALSE(mapping.mapped());
  ::munmap(base, kPoolBytes);
  ::close(fd);
}

TEST(PeerPoolMapping, ASharedPoolThatIsNotTheDeclaredPoolIsRefused) {
  SharedPool pool(kPoolBytes);
  Published published(pool);
  std::vector<std::uint8_t> other(kPoolBytes);  // the declared pool: anonymous memory
  PeerPoolMapping mapping;
  std::string why;
  EXPECT_EQ(try_map(declare(other.data(), published.file.fd, 0), &mapping, &why),
            Status::kMismatch);
  EXPECT_FALSE(mapping.mapped());
  SharedPool second(kPoolBytes);  // another SharedPool: another file
  EXPECT_EQ(try_map(declare(second.data(), published.file.fd, 0), &mapping, &why),
            Status::kMismatch);
  EXPECT_FALSE(mapping.mapped());
}

TEST(PeerPoolMapping, AnOffsetThatIsNotThePoolsIsRefused) {
  SharedPool pool(kPoolBytes + 4096);
  Published published(pool);
  PeerPoolMapping mapping;
  std::string why;
  EXPECT_EQ(try_map(declare(pool.data(), published.file.fd, 4096), &mapping, &why),
            Status::kMismatch);
  EXPECT_FALSE(mapping.mapped());
}

TEST(PeerPoolMapping, APoolLargerThanItsFileIsRefused) {
  SharedPool pool(kPoolBytes);
  Published published(pool);
  PeerPoolMapping mapping;
  std::string why;
  EXPECT_EQ(try_map(declare(pool.data(), published.file.fd, 0, kBlocks * 4), &mapping, &why),
            Status::kMismatch);
  EXPECT_FALSE(mapping.mapped());
}

TEST(PeerPoolMapping, ADescriptorThatIsNoFileIsRefused) {
  SharedPool pool(kPoolBytes);
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  PeerPoolMapping mapping;
  std::string why;
  EXPECT_EQ(try_map(declare(pool.data(), pair[0], 0), &mapping, &why), Status::kMismatch);
  EXPECT_FALSE(mapping.mapped());
  ::close(pair[0]);
  ::close(pair[1]);
}

TEST(PeerPoolMapping, ADescriptorThatIsNotOpenIsRefused) {
  SharedPool pool(kPoolBytes);
  PeerPoolMapping mapping;
  std::string why;
  EXPECT_EQ(try_map(declare(pool.data(), 1 << 20, 0), &mapping, &why), Status::kNotAllowed);
  EXPECT_FALSE(mapping.mapped());
}

// A real cookie over a SharedPool declares both descriptors: the pool and
// the cookie page are mapped, and the mapped page shows the epoch, then 0
// once the cookie is retired.
TEST(PeerPoolMapping, TheCookiePageIsMappedWithThePoolAndShowsItsRetirement) {
  SharedPool pool(kPoolBytes);
  Published published(pool);
  Cookie cookie(Region{pool.data(), kBlocks, kBlockLen},
                static_cast<std::uint32_t>(published.file.fd), 0);
  Declaration declared;
  int err = 0;
  ASSERT_EQ(read_declaration(::getpid(), cookie.addr(), &declared, &err), Status::kSuccess);
  ASSERT_NE(declared.cookie_fd, wire::kNoFd);
  PeerPoolMapping mapping;
  std::string why;
  ASSERT_EQ(map_peer_pool(::getpid(), declared, cookie.addr(), false, &mapping, &why),
            Status::kSuccess)
      << why;
  ASSERT_TRUE(mapping.cookie_mapped()) << why;
  EXPECT_EQ(mapping.cookie_epoch(), cookie.epoch());
  cookie.retire();
  EXPECT_EQ(mapping.cookie_epoch(), 0u);
}

// A cookie descriptor that names another file (here the pool's) maps the
// pool alone; the lane then reads the epoch through the pid.
TEST(PeerPoolMapping, ACookieDescriptorThatIsNotTheCookiePageIsNotMapped) {
  SharedPool pool(kPoolBytes);
  Published published(pool);
  Cookie cookie(Region{pool.data(), kBlocks, kBlockLen},
                static_cast<std::uint32_t>(published.file.fd), 0);
  Declaration declared;
  int err = 0;
  ASSERT_EQ(read_declaration(::getpid(), cookie.addr(), &declared, &err), Status::kSuccess);
  declared.cookie_fd = declared.pool_fd;
  PeerPoolMapping mapping;
  std::string why;
  ASSERT_EQ(map_peer_pool(::getpid(), declared, cookie.addr(), false, &mapping, &why),
            Status::kSuccess);
  EXPECT_TRUE(mapping.mapped());
  EXPECT_FALSE(mapping.cookie_mapped());
  EXPECT_NE(why.find("cookie"), std::string::npos) << why;
}

// ---------------------------------------------------------------------------
// The lane over a mapped pool
// ---------------------------------------------------------------------------

std::map<std::string, std::uint64_t> counters_of(const CmaLane& lane) {
  std::map<std::string, std::uint64_t> counters;
  lane.add_counters(counters);
  return counters;
}

RemoteRegion remote_of(const void* base) {
  RemoteRegion remote;
  remote.agent_name = "target";
  remote.base_addr = reinterpret_cast<std::uintptr_t>(base);
  remote.num_blocks = kBlocks;
  remote.block_len = kBlockLen;
  remote.pid = static_cast<std::uint32_t>(::getpid());
  return remote;
}

Status run(CmaLane& lane, PeerHandle peer, bool read, std::span<const std::int64_t> local,
           std::span<const std::int64_t> remote) {
  XferHandle xfer{};
  const Status posted = read ? test::post_read(lane, kBlockLen, peer, 1, local, remote, &xfer)
                             : test::post_write(lane, kBlockLen, peer, 1, local, remote, &xfer);
  if (posted != Status::kSuccess) return posted;
  Status state = Status::kInProgress;
  while (state == Status::kInProgress) {
    lane.progress();
    if (const Status st = lane.check(xfer, &state); st != Status::kSuccess) return st;
  }
  static_cast<void>(lane.release(xfer));
  return state;
}

class MappedLane : public ::testing::TestWithParam<bool> {};

// With mapping on (true) the lane maps the target's SharedPool; off, it
// writes with process_vm_writev. The same bytes land either way.
TEST_P(MappedLane, WritesAndReadsLandByteForByte) {
  const bool map = GetParam();
  SharedPool target_pool(kPoolBytes);
  std::vector<std::uint8_t> ours(kPoolBytes);
  for (std::size_t i = 0; i < ours.size(); ++i) ours[i] = static_cast<std::uint8_t>(i * 37 + 11);
  CmaLane target("target", Region{target_pool.data(), kBlocks, kBlockLen}, 1);
  CmaLane source("source", Region{ours.data(), kBlocks, kBlockLen}, 1);
  source.set_map_peer_pools(map, false);
  PeerHandle peer{};
  std::string why;
  ASSERT_EQ(test::connect_lane(source, target, remote_of(target_pool.data()), &peer, &why, false),
            Status::kSuccess)
      << why;
  EXPECT_EQ(counters_of(source).at("cma_mapped_peers"), map ? 1u : 0u);

  // Our block i into the target's block kBlocks-1-i.
  std::vector<std::int64_t> local(kBlocks);
  std::vector<std::int64_t> remote(kBlocks);
  std::iota(local.begin(), local.end(), 0);
  for (std::uint64_t i = 0; i < kBlocks; ++i) {
    remote[i] = static_cast<std::int64_t>(kBlocks - 1 - i);
  }
  ASSERT_EQ(run(source, peer, false, local, remote), Status::kSuccess);
  const auto* theirs = static_cast<const std::uint8_t*>(target_pool.data());
  for (std::uint64_t i = 0; i < kBlocks; ++i) {
    ASSERT_EQ(
        std::memcmp(theirs + (kBlocks - 1 - i) * kBlockLen, ours.data() + i * kBlockLen, kBlockLen),
        0)
        << "block " << i;
  }
  // And back: their block kBlocks-1-i into our block i, after ours changed.
  const std::vector<std::uint8_t> expected = ours;
  std::fill(ours.begin(), ours.end(), 0);
  ASSERT_EQ(run(source, peer, true, local, remote), Status::kSuccess);
  EXPECT_EQ(ours, expected);
  EXPECT_EQ(test::disconnect_lane(source, peer), Status::kSuccess);
}

INSTANTIATE_TEST_SUITE_P(MapOnAndOff, MappedLane, ::testing::Bool(),
                         [](const auto& param) { return param.param ? "Mapped" : "ProcessVm"; });

// A target whose pool is not a SharedPool offers nothing to map.
TEST(MappedLaneTest, APrivatePoolIsNotMapped) {
  std::vector<std::uint8_t> target_pool(kPoolBytes);
  std::vector<std::uint8_t> ours(kPoolBytes, 1);
  CmaLane target("target", Region{target_pool.data(), kBlocks, kBlockLen}, 1);
  CmaLane source("source", Region{ours.data(), kBlocks, kBlockLen}, 1);
  PeerHandle peer{};
  std::string why;
  ASSERT_EQ(test::connect_lane(source, target, remote_of(target_pool.data()), &peer, &why, false),
            Status::kSuccess)
      << why;
  EXPECT_EQ(counters_of(source).at("cma_mapped_peers"), 0u);
  EXPECT_EQ(test::disconnect_lane(source, peer), Status::kSuccess);
}

// A target that retired its engine is gone for a mapped copy too: the
// bytes may reach the memfd (our mapping keeps it), but the transfer fails.
TEST(MappedLaneTest, ATargetThatShutDownFailsTheTransfer) {
  SharedPool target_pool(kPoolBytes);
  std::vector<std::uint8_t> ours(kPoolBytes, 9);
  CmaLane target("target", Region{target_pool.data(), kBlocks, kBlockLen}, 1);
  CmaLane source("source", Region{ours.data(), kBlocks, kBlockLen}, 1);
  PeerHandle peer{};
  std::string why;
  ASSERT_EQ(test::connect_lane(source, target, remote_of(target_pool.data()), &peer, &why, false),
            Status::kSuccess)
      << why;
  ASSERT_EQ(counters_of(source).at("cma_mapped_peers"), 1u);
  target.stop(StopStage::kRelease);
  std::vector<std::int64_t> blocks(kBlocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  EXPECT_EQ(run(source, peer, false, blocks, blocks), Status::kRemoteDisconnect);
  EXPECT_EQ(test::disconnect_lane(source, peer), Status::kSuccess);
}

}  // namespace
}  // namespace kvxfer::internal::cma
