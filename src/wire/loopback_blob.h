// The loopback engine's part of an agent's metadata: which pool in this
// process the agent registered, and the cookie that proves it is still that
// pool. Sent inside the checked metadata framing (wire/metadata.h), and
// still parsed as if hostile: it must be exactly kLoopbackBlobLen bytes.
//
// Layout (little-endian): 4 bytes magic "KVLB" | u64 pool key | u64 cookie
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <span>
#include <vector>

namespace kvxfer::wire {

inline constexpr std::uint8_t kLoopbackBlobMagic[4] = {'K', 'V', 'L', 'B'};
inline constexpr std::size_t kLoopbackBlobLen =
    sizeof(kLoopbackBlobMagic) + 2 * sizeof(std::uint64_t);

struct LoopbackBlob {
  std::uint64_t key = 0;     // the pool's key in this process's registry
  std::uint64_t cookie = 0;  // random per pool: a reused key is not the same pool
};

namespace loopback_blob_detail {

inline void put_u64(std::vector<std::uint8_t>& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
}

inline std::uint64_t get_u64(const std::uint8_t* in) {
  std::uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= std::uint64_t{in[i]} << (8 * i);
  return value;
}

}  // namespace loopback_blob_detail

inline std::vector<std::uint8_t> encode_loopback_blob(const LoopbackBlob& blob) {
  std::vector<std::uint8_t> out(std::begin(kLoopbackBlobMagic), std::end(kLoopbackBlobMagic));
  out.reserve(kLoopbackBlobLen);
  loopback_blob_detail::put_u64(out, blob.key);
  loopback_blob_detail::put_u64(out, blob.cookie);
  return out;
}

// False unless `bytes` is exactly one loopback blob; *out is written only on
// success.
[[nodiscard]] inline bool decode_loopback_blob(std::span<const std::uint8_t> bytes,
                                               LoopbackBlob* out) {
  if (bytes.size() != kLoopbackBlobLen ||
      !std::equal(std::begin(kLoopbackBlobMagic), std::end(kLoopbackBlobMagic), bytes.begin())) {
    return false;
  }
  out->key = loopback_blob_detail::get_u64(bytes.data() + sizeof(kLoopbackBlobMagic));
  out->cookie = loopback_blob_detail::get_u64(bytes.data() + sizeof(kLoopbackBlobMagic) + 8);
  return true;
}

}  // namespace kvxfer::wire
