// SPDX-License-Identifier: Apache-2.0
// kvxfer::SharedPool (include/kvxfer/shared_pool.h): zeroed, page-aligned
// memory in a sealed memfd, which the registry finds for a Transport whose
// region lies inside it, and forgets once the pool is gone.
#include "kvxfer/shared_pool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "common/shared_pools.h"

namespace kvxfer {
namespace {

using internal::find_shared_pool;

// Closes what find_shared_pool handed out; true when it found the pool.
bool found(const void* base, std::uint64_t bytes, std::uint64_t* offset = nullptr) {
  const internal::SharedPoolFile file = find_shared_pool(base, bytes);
  if (file.fd < 0) return false;
  if (offset != nullptr) *offset = file.offset;
  ::close(file.fd);
  return true;
}

TEST(SharedPool, IsZeroedPageAlignedAndWritable) {
  SharedPool pool(10000);
  ASSERT_NE(pool.data(), nullptr);
  EXPECT_EQ(pool.size(), 10000u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(pool.data()) % 4096, 0u);
  auto* bytes = static_cast<std::uint8_t*>(pool.data());
  for (std::size_t i = 0; i < pool.size(); ++i) ASSERT_EQ(bytes[i], 0) << i;
  bytes[pool.size() - 1] = 0x7f;
  EXPECT_EQ(bytes[pool.size() - 1], 0x7f);
}

TEST(SharedPool, ZeroBytesIsRefused) { EXPECT_THROW(SharedPool(0), std::invalid_argument); }

TEST(SharedPool, TheRegistryFindsRegionsInsideItOnly) {
  SharedPool pool(1 << 20);
  auto* base = static_cast<std::uint8_t*>(pool.data());
  std::uint64_t offset = 1;
  EXPECT_TRUE(found(base, 1 << 20, &offset));
  EXPECT_EQ(offset, 0u);
  EXPECT_TRUE(found(base + 4100, 4096, &offset));
  EXPECT_EQ(offset, 4100u);
  EXPECT_FALSE(found(base + 4096, 1 << 20)) << "runs past the pool's end";
  EXPECT_FALSE(found(base - 4096, 8192)) << "starts before the pool";
  int elsewhere = 0;
  EXPECT_FALSE(found(&elsewhere, sizeof(elsewhere)));
}

TEST(SharedPool, ItsMemfdIsSealedAgainstShrinkingAndGrowing) {
  SharedPool pool(1 << 16);
  const internal::SharedPoolFile file = find_shared_pool(pool.data(), pool.size());
  ASSERT_GE(file.fd, 0);
  const int seals = ::fcntl(file.fd, F_GET_SEALS);
  EXPECT_NE(seals & F_SEAL_SHRINK, 0);
  EXPECT_NE(seals & F_SEAL_GROW, 0);
  EXPECT_NE(seals & F_SEAL_SEAL, 0);
  EXPECT_NE(::ftruncate(file.fd, 0), 0);
  EXPECT_NE(::fcntl(file.fd, F_GETFD) & FD_CLOEXEC, 0);
  ::close(file.fd);
}

TEST(SharedPool, AFreedPoolIsForgottenAndAMovedOneKept) {
  const void* base = nullptr;
  {
    SharedPool first(1 << 16);
    base = first.data();
    SharedPool second = std::move(first);
    EXPECT_EQ(first.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
    EXPECT_EQ(second.data(), base);
    EXPECT_TRUE(found(base, 1 << 16));
  }
  EXPECT_FALSE(found(base, 1 << 16));
}

}  // namespace
}  // namespace kvxfer
