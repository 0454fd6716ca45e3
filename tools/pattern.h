// SPDX-License-Identifier: Apache-2.0
// Deterministic block contents, so a target can check a written block
// without being sent its bytes: block `i` of a pool filled with `seed` holds
// words derived from (seed, i, word index).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kvxfer::tools {

inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline void fill_block(std::uint8_t* block, std::size_t block_len, std::uint64_t seed,
                       std::uint64_t index) {
  const std::uint64_t base = mix64(seed ^ mix64(index));
  std::size_t off = 0;
  for (std::uint64_t w = 0; off + 8 <= block_len; ++w, off += 8) {
    const std::uint64_t v = base + w * 0x9E3779B97F4A7C15ull;
    std::memcpy(block + off, &v, 8);
  }
  for (; off < block_len; ++off) block[off] = static_cast<std::uint8_t>(base >> (off % 8));
}

// Blocks [0, count) of a pool of `block_len`-byte blocks, each with its
// pattern for `seed`.
inline void fill_blocks(std::uint8_t* pool, std::size_t block_len, std::uint64_t count,
                        std::uint64_t seed) {
  for (std::uint64_t i = 0; i < count; ++i) fill_block(pool + i * block_len, block_len, seed, i);
}

inline bool block_matches(const std::uint8_t* block, std::size_t block_len, std::uint64_t seed,
                          std::uint64_t index) {
  const std::uint64_t base = mix64(seed ^ mix64(index));
  std::size_t off = 0;
  for (std::uint64_t w = 0; off + 8 <= block_len; ++w, off += 8) {
    const std::uint64_t v = base + w * 0x9E3779B97F4A7C15ull;
    if (std::memcmp(block + off, &v, 8) != 0) return false;
  }
  for (; off < block_len; ++off) {
    if (block[off] != static_cast<std::uint8_t>(base >> (off % 8))) return false;
  }
  return true;
}

}  // namespace kvxfer::tools
