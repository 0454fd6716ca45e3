// Scatter writes: the UCX lane's way to move many small runs of blocks in a
// few messages instead of one put each.
//
// Over TCP, UCX 1.13 emulates every ucp_put_nbx with an active message that
// the target's worker copies out: a write of 1024 random 4 KiB blocks is 1024
// messages, 1024 send() calls and 1024 receive-side dispatches. A scatter
// write carries up to kMaxScatterRuns runs (and about a chunk of bytes) in one
// active message: the runs' (offset, length) pairs in the message header and
// their bytes, gathered from the local pool by UCX (an iov datatype), as the
// payload. The target's handler checks every run against its registered
// region, copies the bytes into place and answers with an ack; the initiator
// counts a transfer done when every one of its messages was acked.
//
// Layouts (little-endian):
//   write header: u32 magic "KVXS" | u16 version | u16 run count
//                 | u64 region token | u64 sequence | u32 slot | u32 zero
//                 | run count x (u64 offset into the region | u64 length)
//   ack header:   u32 magic "KVXA" | u32 slot | u64 sequence | i32 status
//                 | u32 zero
// The token is the target's cookie epoch (from its metadata), so a message
// meant for an earlier engine in the same process is refused. Slot and
// sequence name the initiator's transfer; the target only echoes them.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>

namespace kvxfer::internal::ucx {

static_assert(std::endian::native == std::endian::little,
              "scatter headers are encoded with the host's byte order");

// Active message ids (small: UCX sizes its handler table by the largest id).
inline constexpr unsigned kScatterAmId = 7;
inline constexpr unsigned kScatterAckAmId = 8;

inline constexpr std::uint32_t kScatterMagic = 0x5358564b;  // "KVXS" as bytes
inline constexpr std::uint32_t kAckMagic = 0x4158564b;      // "KVXA" as bytes
inline constexpr std::uint16_t kScatterVersion = 1;
inline constexpr std::size_t kScatterFixedLen = 32;
inline constexpr std::size_t kScatterRunLen = 16;
inline constexpr std::size_t kMaxScatterRuns = 1024;
inline constexpr std::size_t kAckLen = 24;

struct ScatterRun {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

struct ScatterHeader {
  std::uint64_t token = 0;
  std::uint64_t sequence = 0;
  std::uint32_t slot = 0;
  std::span<const std::uint8_t> runs;  // run count x kScatterRunLen bytes

  [[nodiscard]] std::size_t run_count() const { return runs.size() / kScatterRunLen; }
  [[nodiscard]] ScatterRun run(std::size_t i) const {
    ScatterRun r;
    std::memcpy(&r.offset, runs.data() + i * kScatterRunLen, 8);
    std::memcpy(&r.length, runs.data() + i * kScatterRunLen + 8, 8);
    return r;
  }
};

struct ScatterAck {
  std::uint32_t slot = 0;
  std::uint64_t sequence = 0;
  std::int32_t status = 0;
};

namespace scatter_detail {
template <typename T>
inline void store(std::uint8_t* at, T value) {
  std::memcpy(at, &value, sizeof(T));
}
template <typename T>
inline T load(const std::uint8_t* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}
}  // namespace scatter_detail

inline constexpr std::size_t scatter_header_len(std::size_t runs) {
  return kScatterFixedLen + runs * kScatterRunLen;
}

// Writes the fixed part at `out` (kScatterFixedLen bytes); the runs follow
// through put_scatter_run.
inline void put_scatter_fixed(std::uint8_t* out, std::uint16_t run_count, std::uint64_t token,
                              std::uint64_t sequence, std::uint32_t slot) {
  using scatter_detail::store;
  store(out, kScatterMagic);
  store(out + 4, kScatterVersion);
  store(out + 6, run_count);
  store(out + 8, token);
  store(out + 16, sequence);
  store(out + 24, slot);
  store(out + 28, std::uint32_t{0});
}

inline void put_scatter_run(std::uint8_t* header, std::size_t index, std::uint64_t offset,
                            std::uint64_t length) {
  std::uint8_t* at = header + kScatterFixedLen + index * kScatterRunLen;
  scatter_detail::store(at, offset);
  scatter_detail::store(at + 8, length);
}

// False unless `bytes` is exactly one well-formed version-1 write header.
// The runs are not checked against any region here: see scatter_runs_fit.
[[nodiscard]] inline bool decode_scatter_header(std::span<const std::uint8_t> bytes,
                                                ScatterHeader* out) {
  using scatter_detail::load;
  if (bytes.size() < kScatterFixedLen) return false;
  const std::uint8_t* p = bytes.data();
  if (load<std::uint32_t>(p) != kScatterMagic) return false;
  if (load<std::uint16_t>(p + 4) != kScatterVersion) return false;
  const std::size_t count = load<std::uint16_t>(p + 6);
  if (count == 0 || count > kMaxScatterRuns) return false;
  if (bytes.size() != scatter_header_len(count)) return false;
  if (load<std::uint32_t>(p + 28) != 0) return false;
  out->token = load<std::uint64_t>(p + 8);
  out->sequence = load<std::uint64_t>(p + 16);
  out->slot = load<std::uint32_t>(p + 24);
  out->runs = bytes.subspan(kScatterFixedLen);
  return true;
}

// True when every run lies inside a region of `region_len` bytes, no run is
// empty, and the runs' lengths add up to exactly `payload_len`.
[[nodiscard]] inline bool scatter_runs_fit(const ScatterHeader& header, std::uint64_t region_len,
                                           std::uint64_t payload_len) {
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < header.run_count(); ++i) {
    const ScatterRun r = header.run(i);
    if (r.length == 0 || r.length > region_len || r.offset > region_len - r.length) return false;
    if (r.length > payload_len - total) return false;  // also guards the sum's overflow
    total += r.length;
  }
  return total == payload_len;
}

inline void encode_ack(std::uint8_t* out, const ScatterAck& ack) {
  using scatter_detail::store;
  store(out, kAckMagic);
  store(out + 4, ack.slot);
  store(out + 8, ack.sequence);
  store(out + 16, ack.status);
  store(out + 20, std::uint32_t{0});
}

[[nodiscard]] inline bool decode_ack(std::span<const std::uint8_t> bytes, ScatterAck* out) {
  using scatter_detail::load;
  if (bytes.size() != kAckLen) return false;
  const std::uint8_t* p = bytes.data();
  if (load<std::uint32_t>(p) != kAckMagic || load<std::uint32_t>(p + 20) != 0) return false;
  out->slot = load<std::uint32_t>(p + 4);
  out->sequence = load<std::uint64_t>(p + 8);
  out->status = load<std::int32_t>(p + 16);
  return true;
}

}  // namespace kvxfer::internal::ucx
