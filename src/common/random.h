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

// A fresh unguessable nonzero value, cheap enough per transfer: getrandom
// fills 32 at a time per thread (one call per value cost about 9% of a
// 4,096-block write here). Used values are wiped; a child made by fork()
// starts with none, so it never replays what its parent draws next.
std::uint64_t fresh_random();

}  // namespace kvxfer::internal
