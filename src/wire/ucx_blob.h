// The UCX engine's part of an agent's metadata. The wire layer wraps it in
// its own checked framing; this framing is still parsed defensively, since a
// peer built from other sources can put anything inside.
//
// Layout (little-endian), version 1:
//   u32 magic "KVXU" | u16 version | u16 flags
//   u64 pid namespace device | u64 pid namespace inode
//   u64 cookie address | u64 cookie epoch
//   u32 length, worker address bytes | u32 length, packed rkey bytes
// Nothing may follow.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace kvxfer::internal::ucx {

inline constexpr std::uint32_t kBlobMagic = 0x5558564b;  // "KVXU" as bytes
inline constexpr std::uint16_t kBlobVersion = 1;
// Worker addresses and packed rkeys are a few hundred bytes; anything much
// larger is not one.
inline constexpr std::uint32_t kMaxBlobField = 64 * 1024;

enum BlobFlags : std::uint16_t {
  // The agent takes same-host writes through process_vm_writev (its UCX_TLS
  // allows shared memory).
  kBlobAcceptsCma = 1u << 0,
  // The agent's worker takes scatter-write active messages (wire/scatter.h).
  kBlobAcceptsScatter = 1u << 1,
};

struct Blob {
  std::uint16_t flags = 0;
  std::uint64_t pidns_dev = 0;
  std::uint64_t pidns_ino = 0;
  // A word in the agent's memory that holds `cookie_epoch` while its engine
  // is up: reading it back proves the pid still is that agent.
  std::uint64_t cookie_addr = 0;
  std::uint64_t cookie_epoch = 0;
  std::span<const std::uint8_t> worker_address;  // views into the decoded bytes
  std::span<const std::uint8_t> rkey;
};

namespace blob_detail {

template <typename T>
void put(std::vector<std::uint8_t>& out, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<std::uint8_t>(static_cast<std::uint64_t>(value) >> (8 * i)));
  }
}

class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}

  template <typename T>
  bool get(T* value) {
    if (bytes_.size() - pos_ < sizeof(T)) return false;
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      v |= static_cast<std::uint64_t>(bytes_[pos_ + i]) << (8 * i);
    }
    pos_ += sizeof(T);
    *value = static_cast<T>(v);
    return true;
  }

  bool get_bytes(std::span<const std::uint8_t>* value) {
    std::uint32_t len = 0;
    if (!get(&len) || len > kMaxBlobField || bytes_.size() - pos_ < len) return false;
    *value = bytes_.subspan(pos_, len);
    pos_ += len;
    return true;
  }

  [[nodiscard]] bool at_end() const { return pos_ == bytes_.size(); }

 private:
  std::span<const std::uint8_t> bytes_;
  std::size_t pos_ = 0;
};

}  // namespace blob_detail

inline std::vector<std::uint8_t> encode_blob(const Blob& blob) {
  using blob_detail::put;
  std::vector<std::uint8_t> out;
  out.reserve(48 + blob.worker_address.size() + blob.rkey.size());
  put(out, kBlobMagic);
  put(out, kBlobVersion);
  put(out, blob.flags);
  put(out, blob.pidns_dev);
  put(out, blob.pidns_ino);
  put(out, blob.cookie_addr);
  put(out, blob.cookie_epoch);
  put(out, static_cast<std::uint32_t>(blob.worker_address.size()));
  out.insert(out.end(), blob.worker_address.begin(), blob.worker_address.end());
  put(out, static_cast<std::uint32_t>(blob.rkey.size()));
  out.insert(out.end(), blob.rkey.begin(), blob.rkey.end());
  return out;
}

// False when `bytes` is not a well-formed version-1 blob. On success the
// spans in *out point into `bytes`.
[[nodiscard]] inline bool decode_blob(std::span<const std::uint8_t> bytes, Blob* out) {
  blob_detail::Reader in(bytes);
  std::uint32_t magic = 0;
  std::uint16_t version = 0;
  Blob b;
  if (!in.get(&magic) || magic != kBlobMagic) return false;
  if (!in.get(&version) || version != kBlobVersion) return false;
  if (!in.get(&b.flags) || !in.get(&b.pidns_dev) || !in.get(&b.pidns_ino) ||
      !in.get(&b.cookie_addr) || !in.get(&b.cookie_epoch)) {
    return false;
  }
  if (!in.get_bytes(&b.worker_address) || !in.get_bytes(&b.rkey) || !in.at_end()) return false;
  *out = b;
  return true;
}

}  // namespace kvxfer::internal::ucx
