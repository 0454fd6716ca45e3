// SPDX-License-Identifier: Apache-2.0
// The loopback engine's part of an agent's metadata: which pool in this
// process the agent registered, and the cookie that proves it is still that
// pool. Sent inside the checked metadata framing (wire/metadata.h), and
// still parsed as if hostile, with wire/bytes.h's bounds-checked reader: it
// must be exactly kLoopbackBlobLen bytes.
//
// Layout (little-endian): 4 bytes magic "KVLB" | u64 pool key | u64 cookie
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "wire/bytes.h"

namespace kvxfer::wire {

inline constexpr std::uint8_t kLoopbackBlobMagic[4] = {'K', 'V', 'L', 'B'};
inline constexpr std::size_t kLoopbackBlobLen =
    sizeof(kLoopbackBlobMagic) + 2 * sizeof(std::uint64_t);

struct LoopbackBlob {
  std::uint64_t key = 0;     // the pool's key in this process's registry
  std::uint64_t cookie = 0;  // random per pool: a reused key is not the same pool
};

inline std::vector<std::uint8_t> encode_loopback_blob(const LoopbackBlob& blob) {
  std::vector<std::uint8_t> out;
  out.reserve(kLoopbackBlobLen);
  ByteWriter w(out);
  w.raw(kLoopbackBlobMagic);
  w.u64(blob.key);
  w.u64(blob.cookie);
  return out;
}

// False unless `bytes` is exactly one loopback blob; *out is written only on
// success.
[[nodiscard]] inline bool decode_loopback_blob(std::span<const std::uint8_t> bytes,
                                               LoopbackBlob* out) {
  ByteReader in(bytes);
  const auto magic = in.take(sizeof(kLoopbackBlobMagic));
  const auto key = in.u64();
  const auto cookie = in.u64();
  if (!in.ok() || !in.at_end() || !std::ranges::equal(*magic, kLoopbackBlobMagic)) return false;
  out->key = *key;
  out->cookie = *cookie;
  return true;
}

}  // namespace kvxfer::wire
