// SPDX-License-Identifier: Apache-2.0
// The same-host cookie's declaration: what a UCX engine writes at the start
// of its cookie page (engines/cma/cma_cookie.h) when it starts, and what a
// same-host peer reads back with process_vm_readv at connect to learn which
// pool the target registered. The bytes come from another process, so they
// are decoded like any other peer bytes: bounds-checked, versioned, and
// refused unless they describe a pool that fits the address space.
//
// Layout (little-endian), version 2, exactly kCookieLen bytes:
//   u64 epoch | u32 magic "KVXC" | u16 version | u16 zero
//   | u64 pool base | u64 num_blocks | u64 block_len
//   | u32 pool fd | u32 cookie fd | u64 pool offset
// The epoch comes first and stays there in every version: peers read only
// those 8 bytes before every chunk they copy (read_cookie), and a retired
// page reads epoch 0. The epoch is random and nonzero; the pool is
// non-empty and ends inside the 64-bit address space (common/region.h).
// Pool fd and offset (version 2): the target's descriptor of the memfd its
// pool lies in (a kvxfer::SharedPool) and where in it, for a same-host peer
// to duplicate and map; kNoFd (and offset 0) when the pool is other
// memory. Cookie fd: the descriptor of this page's own memfd (kNoFd:
// none), which a peer that mapped the pool maps too, to read the epoch
// before each chunk without a system call. Both are the target's word
// only: a peer maps a descriptor only after checking it against the
// target's own mappings (cma_mapping.h).
#pragma once

#include <cstdint>
#include <span>

#include "common/region.h"
#include "wire/bytes.h"

namespace kvxfer::wire {

inline constexpr std::uint32_t kCookieMagic = 0x4358564b;  // "KVXC" as bytes
inline constexpr std::uint16_t kCookieVersion = 2;
inline constexpr std::size_t kCookieLen = 56;
// No descriptor (pool fd, cookie fd).
inline constexpr std::uint32_t kNoFd = 0xffffffff;
// The largest descriptor number a declaration may name (a Linux fd is an int).
inline constexpr std::uint32_t kMaxFd = 0x7fffffff;
// Where the epoch lies in the declaration, and how long it is.
inline constexpr std::size_t kCookieEpochAt = 0;
inline constexpr std::size_t kCookieEpochLen = sizeof(std::uint64_t);

struct CookieDeclaration {
  std::uint64_t epoch = 0;
  std::uint64_t base_addr = 0;
  std::uint64_t num_blocks = 0;
  std::uint64_t block_len = 0;
  std::uint32_t pool_fd = kNoFd;    // at most kMaxFd, or kNoFd
  std::uint64_t pool_offset = 0;    // 0 when pool_fd is kNoFd
  std::uint32_t cookie_fd = kNoFd;  // at most kMaxFd, or kNoFd
};

// Writes a declaration in place at `out` (kCookieLen bytes).
inline void encode_cookie(std::uint8_t* out, const CookieDeclaration& d) {
  ByteWriter w(std::span(out, kCookieLen));
  w.u64(d.epoch);
  w.u32(kCookieMagic);
  w.u16(kCookieVersion);
  w.u16(0);
  w.u64(d.base_addr);
  w.u64(d.num_blocks);
  w.u64(d.block_len);
  w.u32(d.pool_fd);
  w.u32(d.cookie_fd);
  w.u64(d.pool_offset);
}

// False unless `bytes` is exactly one well-formed version-2 declaration with
// a nonzero epoch, a valid pool (non-empty, no overflow of base + size), and
// either no pool fd (offset 0) or an fd number of at most kMaxFd, and a
// cookie fd of at most kMaxFd or none.
// On failure *out is left alone.
[[nodiscard]] inline bool decode_cookie(std::span<const std::uint8_t> bytes,
                                        CookieDeclaration* out) {
  if (bytes.size() != kCookieLen) return false;
  ByteReader in(bytes);
  const auto epoch = in.u64();
  const auto magic = in.u32();
  const auto version = in.u16();
  const auto reserved = in.u16();
  const auto base = in.u64();
  const auto num_blocks = in.u64();
  const auto block_len = in.u64();
  const auto pool_fd = in.u32();
  const auto cookie_fd = in.u32();
  const auto pool_offset = in.u64();
  if (!in.ok() || !in.at_end() || *magic != kCookieMagic || *version != kCookieVersion ||
      *reserved != 0) {
    return false;
  }
  if (*epoch == 0 || !internal::region_is_valid(*base, *num_blocks, *block_len)) return false;
  if (*pool_fd == kNoFd ? *pool_offset != 0 : *pool_fd > kMaxFd) return false;
  if (*cookie_fd != kNoFd && *cookie_fd > kMaxFd) return false;
  out->epoch = *epoch;
  out->base_addr = *base;
  out->num_blocks = *num_blocks;
  out->block_len = *block_len;
  out->pool_fd = *pool_fd;
  out->pool_offset = *pool_offset;
  out->cookie_fd = *cookie_fd;
  return true;
}

}  // namespace kvxfer::wire
