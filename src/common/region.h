// SPDX-License-Identifier: Apache-2.0
// The one check of a pool's geometry, for our own pool and for the regions
// peers describe in their metadata: num_blocks x block_len bytes from base
// must be non-empty and fit in the 64-bit address space.
#pragma once

#include <cstdint>
#include <limits>

namespace kvxfer::internal {

[[nodiscard]] constexpr bool region_is_valid(std::uint64_t base, std::uint64_t num_blocks,
                                             std::uint64_t block_len) noexcept {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  if (num_blocks == 0 || block_len == 0 || num_blocks > kMax / block_len) return false;
  return base <= kMax - num_blocks * block_len;
}

}  // namespace kvxfer::internal
