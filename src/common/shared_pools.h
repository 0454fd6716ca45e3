// SPDX-License-Identifier: Apache-2.0
// Which memory of this process is a kvxfer::SharedPool (include/kvxfer/
// shared_pool.h): the registry SharedPool keeps, for the same-host lane to
// tell peers how to map our pool.
#pragma once

#include <cstdint>

namespace kvxfer::internal {

// A descriptor of the memfd behind a pool, and where in it the pool starts.
struct SharedPoolFile {
  int fd = -1;  // owned by the caller
  std::uint64_t offset = 0;
};

// When [base, base + bytes) lies inside one live SharedPool: a duplicate of
// its memfd (close-on-exec, the caller's to close) and the pool's offset in
// it. Otherwise fd = -1. O(number of live SharedPools).
[[nodiscard]] SharedPoolFile find_shared_pool(const void* base, std::uint64_t bytes);

// The name SharedPool gives its memfds, as /proc/<pid>/maps shows it.
inline constexpr const char* kSharedPoolName = "kvxfer-pool";

}  // namespace kvxfer::internal
