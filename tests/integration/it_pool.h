// SPDX-License-Identifier: Apache-2.0
// The byte pattern both sides of the multi-process UCX tests agree on, and the
// mmap'd pool they register.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvxfer/shared_pool.h"

namespace kvxfer::it {

// The content block `index` holds in generation `gen`: never all zero, and
// different for every (gen, index, word).
inline std::uint64_t pattern_word(std::uint64_t gen, std::uint64_t index, std::uint64_t word) {
  std::uint64_t x = gen * 0x9e3779b97f4a7c15ULL ^ index * 0xbf58476d1ce4e5b9ULL ^ word;
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x | 1;
}

inline void fill_block(std::uint8_t* block, std::uint64_t block_len, std::uint64_t gen,
                       std::uint64_t index) {
  for (std::uint64_t w = 0; w * 8 < block_len; ++w) {
    const std::uint64_t v = pattern_word(gen, index, w);
    std::memcpy(block + w * 8, &v, std::min<std::uint64_t>(8, block_len - w * 8));
  }
}

// Reads of bytes a one-sided WRITE put there. The WRITE is ordered before the
// read only through the initiator (a socket, another process, a pipe), which
// ThreadSanitizer cannot see, so these reads are not instrumented (and stay
// clear of the memcmp interceptor). The same as KVXFER_NO_TSAN
// (common/sanitizers.h), spelled here because kvxfer_it_target is built on
// the public API alone, without src/.
#if defined(__SANITIZE_THREAD__)
#define KVXFER_IT_NO_TSAN __attribute__((no_sanitize_thread, noinline))
#else
#define KVXFER_IT_NO_TSAN
#endif

// Writes of a pool a peer then READs: the read (by the peer's request,
// answered on our progress thread) is ordered after them only through the
// peer, so they are not instrumented either.
KVXFER_IT_NO_TSAN inline void fill_block_for_readers(std::uint8_t* block, std::uint64_t block_len,
                                                     std::uint64_t gen, std::uint64_t index) {
  for (std::uint64_t w = 0; w * 8 < block_len; ++w) {
    const std::uint64_t v = pattern_word(gen, index, w);
    for (std::uint64_t b = 0; b < 8 && w * 8 + b < block_len; ++b) {
      block[w * 8 + b] = static_cast<std::uint8_t>(v >> (8 * b));
    }
  }
}

KVXFER_IT_NO_TSAN inline bool bytes_equal(const std::uint8_t* a, const std::uint8_t* b,
                                          std::uint64_t len) {
  for (std::uint64_t i = 0; i < len; ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

// Offset of the first byte of `block` that differs from the pattern, or -1.
KVXFER_IT_NO_TSAN inline std::int64_t first_mismatch(const std::uint8_t* block,
                                                     std::uint64_t block_len, std::uint64_t gen,
                                                     std::uint64_t index) {
  for (std::uint64_t w = 0; w * 8 < block_len; ++w) {
    const std::uint64_t v = pattern_word(gen, index, w);
    const std::uint64_t n = std::min<std::uint64_t>(8, block_len - w * 8);
    for (std::uint64_t b = 0; b < n; ++b) {
      if (block[w * 8 + b] != static_cast<std::uint8_t>(v >> (8 * b))) {
        return static_cast<std::int64_t>(w * 8);
      }
    }
  }
  return -1;
}

// What a guard region holds: bytes nobody registered, so any change there
// is a WRITE that escaped its pool.
inline constexpr std::uint8_t kGuardByte = 0xA5;

// Page-aligned, zeroed, every page touched; unmapped on destruction. With
// `guard_len` > 0 the same mapping continues past the pool with that many
// bytes of kGuardByte, which are not part of the pool. With `shared`, the
// mapping is a kvxfer::SharedPool (same-host peers map it), guard included.
class MappedPool {
 public:
  MappedPool(std::uint64_t num_blocks, std::uint64_t block_len, std::uint64_t guard_len = 0,
             bool shared = false)
      : num_blocks_(num_blocks),
        block_len_(block_len),
        len_(num_blocks * block_len),
        guard_len_(guard_len) {
    if (shared) {
      shared_ = std::make_unique<SharedPool>(len_ + guard_len_);
      base_ = static_cast<std::uint8_t*>(shared_->data());
    } else {
      void* p = ::mmap(nullptr, len_ + guard_len_, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::runtime_error("mmap of the pool failed");
      base_ = static_cast<std::uint8_t*>(p);
    }
    std::memset(base_, 0, len_);
    std::memset(base_ + len_, kGuardByte, guard_len_);
  }
  ~MappedPool() {
    if (!shared_) ::munmap(base_, len_ + guard_len_);
  }
  MappedPool(const MappedPool&) = delete;
  MappedPool& operator=(const MappedPool&) = delete;

  [[nodiscard]] std::uint8_t* block(std::uint64_t index) const {
    return base_ + index * block_len_;
  }
  [[nodiscard]] std::uint8_t* base() const { return base_; }
  [[nodiscard]] std::uint64_t num_blocks() const { return num_blocks_; }
  [[nodiscard]] std::uint64_t block_len() const { return block_len_; }
  [[nodiscard]] std::uint64_t len() const { return len_; }

  // Offset into the guard of its first byte that is not kGuardByte, or -1.
  KVXFER_IT_NO_TSAN std::int64_t guard_mismatch() const {
    for (std::uint64_t i = 0; i < guard_len_; ++i) {
      if (base_[len_ + i] != kGuardByte) return static_cast<std::int64_t>(i);
    }
    return -1;
  }

  void fill_generation(std::uint64_t gen) {
    for (std::uint64_t i = 0; i < num_blocks_; ++i) fill_block(block(i), block_len_, gen, i);
  }
  // The same, for a pool peers read while this process's engine runs.
  void fill_generation_for_readers(std::uint64_t gen) {
    for (std::uint64_t i = 0; i < num_blocks_; ++i) {
      fill_block_for_readers(block(i), block_len_, gen, i);
    }
  }

 private:
  std::uint64_t num_blocks_;
  std::uint64_t block_len_;
  std::uint64_t len_;
  std::uint64_t guard_len_;
  std::unique_ptr<SharedPool> shared_;
  std::uint8_t* base_ = nullptr;
};

inline std::string to_hex(const std::vector<std::uint8_t>& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const std::uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

inline std::vector<std::uint8_t> from_hex(const std::string& hex) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw std::invalid_argument("bad hex digit");
  };
  if (hex.size() % 2 != 0) throw std::invalid_argument("odd hex length");
  std::vector<std::uint8_t> out(hex.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::uint8_t>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  }
  return out;
}

// `count` distinct indices in [0, n), in random order: no two neighbours
// are adjacent blocks except by chance.
inline std::vector<std::int64_t> random_sample(std::mt19937_64& rng, std::uint64_t n,
                                               std::size_t count) {
  std::vector<std::int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(count);
  return all;
}

}  // namespace kvxfer::it
