// SPDX-License-Identifier: Apache-2.0
// The UCX engine's part of an agent's metadata: how to reach the agent's
// worker, its packed rkey, and what it accepts. The agent sends it inside
// the checked metadata framing (wire/metadata.h); it is still parsed as
// hostile, since a peer built from other sources can put anything inside:
// wire/bytes.h's bounds-checked reader, a length limit per field, nothing
// may follow.
//
// Layout (little-endian), version 6:
//   u32 magic "KVXU" | u16 version | u16 flags
//   u64 pid namespace device | u64 pid namespace inode
//   u64 cookie address | u64 cookie epoch
//   u32 length, worker address bytes | u32 length, packed rkey bytes
//   | u32 notify fd (the same-host lane's notification socket, a descriptor
//     number in the agent's process, or kNoNotifyFd)
//   | u64 tcp token | 32 bytes tcp key | u16 tcp port
//   | u16 address count (0..kMaxTcpAddresses)
//   | per address: u8 family (4 or 6) | 16 bytes (an IPv4 address in the
//     first 4, the rest zero)
//   | u32 region key count (0..kMaxRegionKeys)
//   | per region key: u64 region id | u64 base | u64 length
//     | u32 length, packed rkey bytes (1..kMaxRegionRkey)
// The tcp part says where the agent's tcp lane listens (port 0: it has none),
// the token a connection must present first, and the public half of the
// lane's X25519 identity (common/identity.h), from which its handshakes
// derive their keys and a target tells a registered peer's connection from
// anyone else's (engines/tcp/). The region keys are the UCX lane's: for each
// region the agent registered besides its pool, its id, where it lies and
// the rkey of its UCX registration, in increasing id order (so no id
// twice), none the pool's (slot 0), none empty or wrapping the address
// space, their rkeys kMaxRegionKeyBytes at most in all. Nothing may follow.
// Versions 1 to 3 (no tcp part, or no tcp key) are refused, and so is
// version 4: the same layout as 5, but its tcp lane speaks frames of version
// 2 (wire/tcp_frame.h), whose hellos a recording could replay and whose
// frames nothing authenticated. Version 5 (no region keys) is refused: its
// UCX lane carried the pool only, and a peer of it listing regions could
// not be served by ours.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "wire/bytes.h"

namespace kvxfer::wire {

inline constexpr std::uint32_t kBlobMagic = 0x5558564b;  // "KVXU" as bytes
inline constexpr std::uint16_t kBlobVersion = 6;
inline constexpr std::uint32_t kNoNotifyFd = 0xffffffff;
// Worker addresses and packed rkeys are a few hundred bytes; anything much
// larger is not one.
inline constexpr std::uint32_t kMaxBlobField = 64 * 1024;
inline constexpr std::size_t kMaxTcpAddresses = 16;
// The UCX lane's region keys: how many, how long each packed rkey may be
// (a few dozen bytes per transport), and their bytes in all, so that a
// blob with every key fits the metadata's kMaxBlobLen (1 MiB) with room.
inline constexpr std::size_t kMaxRegionKeys = 4096;
inline constexpr std::size_t kMaxRegionRkey = 1024;
inline constexpr std::size_t kMaxRegionKeyBytes = 512 * 1024;

enum BlobFlags : std::uint16_t {
  // The agent takes same-host writes through process_vm_writev (its UCX_TLS
  // allows shared memory).
  kBlobAcceptsCma = 1u << 0,
  // Bits 1 and 2 are unused (they were messages the UCX lane no longer
  // sends); a blob may set them.
  // The agent has an RDMA device UCX can use (the ucx lane serves peers
  // that have one too).
  kBlobHasRdma = 1u << 3,
};

// An address of the agent's tcp lane: IPv4 (family 4, the first 4 bytes)
// or IPv6 (family 6), network byte order as the socket API keeps them.
struct TcpAddress {
  std::uint8_t family = 4;
  std::array<std::uint8_t, 16> bytes{};
  friend bool operator==(const TcpAddress&, const TcpAddress&) = default;
};

// A region of the agent's besides its pool, as its UCX lane registered it:
// the agent's id for it (engine.h's MemRegion), where it lies, and the
// packed rkey a peer unpacks to put and get there. The rkey is the blob's
// own copy.
struct RegionKey {
  std::uint64_t id = 0;
  std::uint64_t base = 0;
  std::uint64_t len = 0;
  std::vector<std::uint8_t> rkey;
  friend bool operator==(const RegionKey&, const RegionKey&) = default;
};

struct PeerBlob {
  std::uint16_t flags = 0;
  std::uint64_t pidns_dev = 0;
  std::uint64_t pidns_ino = 0;
  // A word in the agent's memory that holds `cookie_epoch` while its engine
  // is up: reading it back proves the pid still is that agent.
  std::uint64_t cookie_addr = 0;
  std::uint64_t cookie_epoch = 0;
  std::span<const std::uint8_t> worker_address;  // views into the decoded bytes
  std::span<const std::uint8_t> rkey;
  std::uint32_t notify_fd = kNoNotifyFd;
  std::uint64_t tcp_token = 0;
  std::array<std::uint8_t, 32> tcp_key{};
  std::uint16_t tcp_port = 0;
  std::vector<TcpAddress> tcp_addresses;
  std::vector<RegionKey> region_keys;  // increasing id
};

inline std::vector<std::uint8_t> encode_blob(const PeerBlob& blob) {
  std::vector<std::uint8_t> out;
  out.reserve(96 + blob.worker_address.size() + blob.rkey.size() + 17 * blob.tcp_addresses.size());
  wire::ByteWriter w(out);
  w.u32(kBlobMagic);
  w.u16(kBlobVersion);
  w.u16(blob.flags);
  w.u64(blob.pidns_dev);
  w.u64(blob.pidns_ino);
  w.u64(blob.cookie_addr);
  w.u64(blob.cookie_epoch);
  w.prefixed(blob.worker_address);
  w.prefixed(blob.rkey);
  w.u32(blob.notify_fd);
  w.u64(blob.tcp_token);
  w.raw(blob.tcp_key);
  w.u16(blob.tcp_port);
  w.u16(static_cast<std::uint16_t>(blob.tcp_addresses.size()));
  for (const TcpAddress& a : blob.tcp_addresses) {
    w.u8(a.family);
    w.raw(a.bytes);
  }
  w.u32(static_cast<std::uint32_t>(blob.region_keys.size()));
  for (const RegionKey& k : blob.region_keys) {
    w.u64(k.id);
    w.u64(k.base);
    w.u64(k.len);
    w.prefixed(k.rkey);
  }
  return out;
}

// Reads the region keys that end a blob into *out: false unless they keep
// every bound above. Copies each rkey after its bounds are checked.
[[nodiscard]] inline bool decode_region_keys(wire::ByteReader& in, std::vector<RegionKey>* out) {
  const auto count = in.u32();
  if (!count || *count > kMaxRegionKeys) return false;
  std::vector<RegionKey> keys(*count);
  std::size_t rkey_bytes = 0;
  std::uint64_t last_id = 0;
  for (RegionKey& k : keys) {
    const auto id = in.u64();
    const auto base = in.u64();
    const auto len = in.u64();
    const auto rkey = in.prefixed(kMaxRegionRkey);
    if (!in.ok() || static_cast<std::uint32_t>(*id) == 0 || *id <= last_id || *len == 0 ||
        *base > ~std::uint64_t{0} - *len || rkey->empty() ||
        (rkey_bytes += rkey->size()) > kMaxRegionKeyBytes) {
      return false;
    }
    last_id = *id;
    k.id = *id;
    k.base = *base;
    k.len = *len;
    k.rkey.assign(rkey->begin(), rkey->end());
  }
  *out = std::move(keys);
  return true;
}

// False when `bytes` is not a well-formed version-6 blob: among others, an
// address family other than 4 or 6, an IPv4 address with bytes past its
// first 4, more than kMaxTcpAddresses addresses, addresses with port 0, or
// region keys out of order or past their bounds.
// On success the spans in *out point into `bytes`; on failure *out is left
// alone.
[[nodiscard]] inline bool decode_blob(std::span<const std::uint8_t> bytes, PeerBlob* out) {
  wire::ByteReader in(bytes);
  const auto magic = in.u32();
  const auto version = in.u16();
  const auto flags = in.u16();
  const auto pidns_dev = in.u64();
  const auto pidns_ino = in.u64();
  const auto cookie_addr = in.u64();
  const auto cookie_epoch = in.u64();
  const auto worker_address = in.prefixed(kMaxBlobField);
  const auto rkey = in.prefixed(kMaxBlobField);
  const auto notify_fd = in.u32();
  const auto tcp_token = in.u64();
  const auto tcp_key = in.take(32);
  const auto tcp_port = in.u16();
  const auto address_count = in.u16();
  if (!in.ok() || *magic != kBlobMagic || *version != kBlobVersion ||
      *address_count > kMaxTcpAddresses || (*tcp_port == 0 && *address_count != 0)) {
    return false;
  }
  std::vector<TcpAddress> addresses(*address_count);
  for (TcpAddress& a : addresses) {
    const auto family = in.u8();
    const auto raw = in.take(16);
    if (!in.ok() || (*family != 4 && *family != 6)) return false;
    std::copy(raw->begin(), raw->end(), a.bytes.begin());
    a.family = *family;
    if (a.family == 4 &&
        std::any_of(a.bytes.begin() + 4, a.bytes.end(), [](std::uint8_t b) { return b != 0; })) {
      return false;
    }
  }
  std::vector<RegionKey> region_keys;
  // ok(): every read above succeeded.
  if (!in.ok() || !decode_region_keys(in, &region_keys) || !in.at_end()) return false;
  out->flags = *flags;
  out->pidns_dev = *pidns_dev;
  out->pidns_ino = *pidns_ino;
  out->cookie_addr = *cookie_addr;
  out->cookie_epoch = *cookie_epoch;
  out->worker_address = *worker_address;
  out->rkey = *rkey;
  out->notify_fd = *notify_fd;
  out->tcp_token = *tcp_token;
  std::copy(tcp_key->begin(), tcp_key->end(), out->tcp_key.begin());
  out->tcp_port = *tcp_port;
  out->tcp_addresses = std::move(addresses);
  out->region_keys = std::move(region_keys);
  return true;
}

}  // namespace kvxfer::wire
