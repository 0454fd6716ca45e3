// SPDX-License-Identifier: Apache-2.0
// Random 64-bit values from the system's random device, for what must not
// repeat across processes (cookie epochs, address hints, salts).
#pragma once

#include <cstdint>
#include <random>

namespace kvxfer::internal {

inline std::uint64_t random_u64() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ static_cast<std::uint64_t>(rd());
}

}  // namespace kvxfer::internal
