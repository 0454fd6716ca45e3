// SPDX-License-Identifier: Apache-2.0
// The same-host cookie's declaration: what a UCX engine writes at the start
// of its cookie page (engines/cma/cma_cookie.h) when it starts, and what a
// same-host peer reads back with process_vm_readv at connect to learn which
// pool the target registered. The bytes come from another process, so they
// are decoded like any other peer bytes: bounds-checked, versioned, and
// refused unless they describe a pool that fits the address space.
//
// Layout (little-endian), version 4, exactly kCookieLen bytes:
//   u64 epoch | u32 magic "KVXC" | u16 version | u16 zero
//   | u64 pool base | u64 num_blocks | u64 block_len
//   | u32 pool fd | u32 cookie fd | u64 pool offset
//   | u64 region table address | u32 region table slots | u32 fence fd
// The epoch comes first and stays there in every version: peers read only
// those 8 bytes before every chunk they copy (read_cookie), and a retired
// page reads epoch 0. The epoch is random and nonzero; the pool is either
// none (base, num_blocks and block_len all 0) or non-empty and ends inside
// the 64-bit address space (common/region.h).
// Pool fd and offset (version 2): the target's descriptor of the memfd its
// pool lies in (a kvxfer::SharedPool) and where in it, for a same-host peer
// to duplicate and map; kNoFd (and offset 0) when the pool is other
// memory or there is none. Cookie fd: the descriptor of this page's own
// memfd (kNoFd: none), which a peer that mapped the pool maps too, to read
// the epoch before each chunk without a system call. Both are the target's
// word only: a peer maps a descriptor only after checking it against the
// target's own mappings (cma_mapping.h).
// Region table (version 3): where the target declares its regions besides
// the pool, an array of `slots` entries of kRegionEntryLen bytes, entry i
// for the region whose id has slot i (slot 0, the pool's, stays empty: the
// pool is declared above). Address 8-aligned and 0 exactly when slots is 0.
// An entry (u64 seq | u64 id | u64 base | u64 len) is written seqlock-wise
// by its owner alone: seq odd while it changes, and a new even value after
// every change, so a peer that saw seq S with the region live knows the
// region is still the same while seq reads S. Live: seq even, len nonzero.
// Fence fd (version 4, in what was a reserved word): the target's
// descriptor of its fence table's memfd (kNoFd: none), by which its
// remove_region waits for the chunks peers are copying into the region
// (engines/cma/cma_fence.h). The table, kFenceLen bytes: kFenceRows rows
// from offset 0, one per initiating lane, each a u32 pid (0: free) and a
// u32 count of the marks the row holds; then from kFenceSlotsAt, per slot
// (the pool's, 0, included) a record of kFenceSlotLen bytes: u64 seq (a
// copy of the slot's table entry's seq, written before the entry settles)
// and a u32 mark count per row. Words the target and its peers share, read
// and written in place as atomics, never decoded: a peer can write any
// value there, and the target only waits on them, for a bounded time.
#pragma once

#include <cstdint>
#include <span>

#include "common/region.h"
#include "wire/bytes.h"

namespace kvxfer::wire {

inline constexpr std::uint32_t kCookieMagic = 0x4358564b;  // "KVXC" as bytes
inline constexpr std::uint16_t kCookieVersion = 4;
inline constexpr std::size_t kCookieLen = 72;
// The most region table slots a declaration may name (metadata's
// kMaxRegions), and one entry's length.
inline constexpr std::uint32_t kCookieMaxSlots = 65536;
inline constexpr std::size_t kRegionEntryLen = 32;
// The fence table: its rows, where its slot records start, one record's
// length (a u64 seq and a u32 per row), and its length.
inline constexpr std::uint32_t kFenceRows = 62;
inline constexpr std::size_t kFenceRowLen = 8;  // u32 pid | u32 marks held
inline constexpr std::size_t kFenceSlotsAt = 4096;
inline constexpr std::size_t kFenceSlotLen = 8 + 4 * std::size_t{kFenceRows};
static_assert(kFenceSlotLen == 256 && kFenceRows * kFenceRowLen <= kFenceSlotsAt);
inline constexpr std::size_t kFenceLen = kFenceSlotsAt + kFenceSlotLen * kCookieMaxSlots;
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
  std::uint64_t table_addr = 0;     // the region table (0: none)
  std::uint32_t table_slots = 0;    // its entries, at most kCookieMaxSlots
  std::uint32_t fence_fd = kNoFd;   // at most kMaxFd, or kNoFd
};

// One entry of the region table, decoded.
struct RegionEntry {
  std::uint64_t seq = 0;
  std::uint64_t id = 0;
  std::uint64_t base = 0;
  std::uint64_t len = 0;
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
  w.u64(d.table_addr);
  w.u32(d.table_slots);
  w.u32(d.fence_fd);
}

// Writes a region table entry at `out` (kRegionEntryLen bytes): golden
// tests and fuzz seeds. The owner writes its live table word by word
// (cma_cookie.cc), in the same layout.
inline void encode_region_entry(std::uint8_t* out, const RegionEntry& e) {
  ByteWriter w(std::span(out, kRegionEntryLen));
  w.u64(e.seq);
  w.u64(e.id);
  w.u64(e.base);
  w.u64(e.len);
}

// False unless `bytes` is exactly one entry that is settled (seq even) and
// either empty (len 0) or a region that ends inside the address space. On
// failure *out is left alone.
[[nodiscard]] inline bool decode_region_entry(std::span<const std::uint8_t> bytes,
                                              RegionEntry* out) {
  if (bytes.size() != kRegionEntryLen) return false;
  ByteReader in(bytes);
  const auto seq = in.u64();
  const auto id = in.u64();
  const auto base = in.u64();
  const auto len = in.u64();
  if (!in.ok() || !in.at_end() || *seq % 2 != 0) return false;
  if (*len != 0 && *base > ~std::uint64_t{0} - *len) return false;
  *out = RegionEntry{*seq, *id, *base, *len};
  return true;
}

// False unless `bytes` is exactly one well-formed version-4 declaration with
// a nonzero epoch, no pool or a valid one (non-empty, no overflow of base +
// size), either no pool fd (offset 0; always so with no pool) or an fd
// number of at most kMaxFd, cookie and fence fds of at most kMaxFd or none, and a
// region table of at most kCookieMaxSlots entries, 8-aligned, inside the
// address space (or none: address and slots 0).
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
  const auto table_addr = in.u64();
  const auto table_slots = in.u32();
  const auto fence_fd = in.u32();
  if (!in.ok() || !in.at_end() || *magic != kCookieMagic || *version != kCookieVersion ||
      *reserved != 0) {
    return false;
  }
  const bool no_pool = *base == 0 && *num_blocks == 0 && *block_len == 0;
  if (*epoch == 0 || (!no_pool && !internal::region_is_valid(*base, *num_blocks, *block_len))) {
    return false;
  }
  if (*pool_fd == kNoFd ? *pool_offset != 0 : (*pool_fd > kMaxFd || no_pool)) return false;
  if (*table_slots > kCookieMaxSlots || (*table_slots == 0) != (*table_addr == 0) ||
      *table_addr % 8 != 0 ||
      *table_addr > ~std::uint64_t{0} - std::uint64_t{*table_slots} * kRegionEntryLen) {
    return false;
  }
  if (*cookie_fd != kNoFd && *cookie_fd > kMaxFd) return false;
  if (*fence_fd != kNoFd && *fence_fd > kMaxFd) return false;
  out->epoch = *epoch;
  out->base_addr = *base;
  out->num_blocks = *num_blocks;
  out->block_len = *block_len;
  out->pool_fd = *pool_fd;
  out->pool_offset = *pool_offset;
  out->cookie_fd = *cookie_fd;
  out->table_addr = *table_addr;
  out->table_slots = *table_slots;
  out->fence_fd = *fence_fd;
  return true;
}

}  // namespace kvxfer::wire
