// SPDX-License-Identifier: Apache-2.0
// Fuzz target for the UCX engine's blob (wire/ucx_blob.h), which a peer
// sends inside its metadata: accepted inputs decode to a version-6 blob
// whose tcp part keeps its bounds (at most wire::kMaxTcpAddresses addresses, each
// of family 4 or 6, an IPv4 one zero past its 4 bytes, none without a port)
// and whose region keys keep theirs (at most wire::kMaxRegionKeys, in
// increasing id order, none of slot 0, none empty or wrapping, each rkey
// 1..wire::kMaxRegionRkey bytes, wire::kMaxRegionKeyBytes in all), and that
// re-encodes to the same bytes and decodes again to an equal blob;
// every other input is refused, the output left alone. Anything else (a
// crash, an over-read under ASan, a mismatch) is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_target.h"
#include "wire/peer_blob.h"

namespace {

using namespace kvxfer;

bool same_bytes(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) {
  return std::ranges::equal(a, b);
}

bool same_blob(const wire::PeerBlob& a, const wire::PeerBlob& b) {
  return a.flags == b.flags && a.pidns_dev == b.pidns_dev && a.pidns_ino == b.pidns_ino &&
         a.cookie_addr == b.cookie_addr && a.cookie_epoch == b.cookie_epoch &&
         same_bytes(a.worker_address, b.worker_address) && same_bytes(a.rkey, b.rkey) &&
         a.notify_fd == b.notify_fd && a.tcp_token == b.tcp_token && a.tcp_port == b.tcp_port &&
         a.tcp_addresses == b.tcp_addresses && a.region_keys == b.region_keys;
}

bool region_keys_in_bounds(const wire::PeerBlob& blob) {
  if (blob.region_keys.size() > wire::kMaxRegionKeys) return false;
  std::uint64_t last = 0;
  std::size_t bytes = 0;
  for (const wire::RegionKey& k : blob.region_keys) {
    if (static_cast<std::uint32_t>(k.id) == 0 || k.id <= last || k.len == 0 ||
        k.base > ~std::uint64_t{0} - k.len || k.rkey.empty() ||
        k.rkey.size() > wire::kMaxRegionRkey) {
      return false;
    }
    last = k.id;
    bytes += k.rkey.size();
  }
  return bytes <= wire::kMaxRegionKeyBytes;
}

bool tcp_part_in_bounds(const wire::PeerBlob& blob) {
  if (blob.tcp_addresses.size() > wire::kMaxTcpAddresses) return false;
  if (blob.tcp_port == 0 && !blob.tcp_addresses.empty()) return false;
  for (const wire::TcpAddress& a : blob.tcp_addresses) {
    if (a.family != 4 && a.family != 6) return false;
    if (a.family == 4 &&
        !std::all_of(a.bytes.begin() + 4, a.bytes.end(), [](std::uint8_t b) { return b == 0; })) {
      return false;
    }
  }
  return true;
}

// The decoded fields' views must lie inside the input.
bool inside(std::span<const std::uint8_t> field, std::span<const std::uint8_t> bytes) {
  if (field.empty()) return true;
  return field.data() >= bytes.data() && field.data() + field.size() <= bytes.data() + bytes.size();
}

}  // namespace

namespace kvxfer::fuzz {

bool accepts(std::span<const std::uint8_t> bytes) {

  wire::PeerBlob blob;
  blob.flags = 0x7777;
  blob.tcp_port = 0x6666;
  if (!wire::decode_blob(bytes, &blob)) {
    if (blob.flags != 0x7777 || blob.tcp_port != 0x6666 || !blob.tcp_addresses.empty() ||
        !blob.region_keys.empty())
      __builtin_trap();
    return false;
  }
  if (!inside(blob.worker_address, bytes) || !inside(blob.rkey, bytes)) __builtin_trap();
  if (blob.worker_address.size() > wire::kMaxBlobField || blob.rkey.size() > wire::kMaxBlobField)
    __builtin_trap();
  if (!tcp_part_in_bounds(blob) || !region_keys_in_bounds(blob)) __builtin_trap();
  const auto again = wire::encode_blob(blob);
  if (!same_bytes(again, bytes)) __builtin_trap();
  wire::PeerBlob twice;
  if (!wire::decode_blob(again, &twice) || !same_blob(blob, twice)) __builtin_trap();
  return true;
}

}  // namespace kvxfer::fuzz
