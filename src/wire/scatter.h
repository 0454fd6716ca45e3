// SPDX-License-Identifier: Apache-2.0
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
//   write header: u32 magic "KVXS" | u16 version (2) | u16 run count
//                 | u64 region token | u64 sequence | u32 slot | u32 zero
//                 | u64 lineage | u64 epoch
//                 | run count x (u64 offset into the region | u64 length)
//   ack header:   u32 magic "KVXA" | u32 slot | u64 sequence | i32 status
//                 | u32 zero
// The token is the target's cookie epoch (from its metadata), so a message
// meant for an earlier engine in the same process is refused. Slot and
// sequence name the initiator's transfer; the target only echoes them (the
// sequence is a fresh random number per write, so that no one but the
// target it was sent to can name it). Lineage and epoch name the
// initiator's registration of this target (wire/fence.h): the target applies
// a write only while that epoch is the newest it was fenced to for that
// lineage, so bytes still in an old connection are refused, never applied
// after a newer registration's writes. Version 1 (no lineage, epoch) is
// refused.
//
// The initiator's UCX lane sends write headers, the target's handler sends
// acks. Both are read with wire/bytes.h's reader after one exact-length
// check; a header's runs are then checked against the region by
// scatter_runs_fit before a byte is copied.
#pragma once

#include <cstdint>
#include <span>

#include "wire/bytes.h"
#include "wire/runs.h"

namespace kvxfer::internal::ucx {

// Active message ids (small: UCX sizes its handler table by the largest id).
inline constexpr unsigned kScatterAmId = 7;
inline constexpr unsigned kScatterAckAmId = 8;

inline constexpr std::uint32_t kScatterMagic = 0x5358564b;  // "KVXS" as bytes
inline constexpr std::uint32_t kAckMagic = 0x4158564b;      // "KVXA" as bytes
inline constexpr std::uint16_t kScatterVersion = 2;
inline constexpr std::size_t kScatterFixedLen = 48;
inline constexpr std::size_t kScatterRunLen = wire::kRunLen;
inline constexpr std::size_t kMaxScatterRuns = 1024;
inline constexpr std::size_t kAckLen = 24;

using ScatterRun = wire::Run;

// The runs (RunList) follow the fixed part.
struct ScatterHeader : wire::RunList {
  std::uint64_t token = 0;
  std::uint64_t sequence = 0;
  std::uint32_t slot = 0;
  std::uint64_t lineage = 0;
  std::uint64_t epoch = 0;
};

struct ScatterAck {
  std::uint32_t slot = 0;
  std::uint64_t sequence = 0;
  std::int32_t status = 0;
};

inline constexpr std::size_t scatter_header_len(std::size_t runs) {
  return kScatterFixedLen + runs * kScatterRunLen;
}

// Writes the fixed part in place at `out` (kScatterFixedLen bytes of the
// caller's preallocated header); the runs follow through put_scatter_run.
// The writer's sizes are all constants here, so its checks compile away.
inline void put_scatter_fixed(std::uint8_t* out, std::uint16_t run_count, std::uint64_t token,
                              std::uint64_t sequence, std::uint32_t slot, std::uint64_t lineage,
                              std::uint64_t epoch) {
  wire::ByteWriter w(std::span(out, kScatterFixedLen));
  w.u32(kScatterMagic);
  w.u16(kScatterVersion);
  w.u16(run_count);
  w.u64(token);
  w.u64(sequence);
  w.u32(slot);
  w.u32(0);
  w.u64(lineage);
  w.u64(epoch);
}

inline void put_scatter_run(std::uint8_t* header, std::size_t index, std::uint64_t offset,
                            std::uint64_t length) {
  wire::put_run(header, kScatterFixedLen, index, offset, length);
}

// False unless `bytes` is exactly one well-formed version-2 write header.
// The runs are not checked against any region here: see scatter_runs_fit.
[[nodiscard]] inline bool decode_scatter_header(std::span<const std::uint8_t> bytes,
                                                ScatterHeader* out) {
  // One length check up front; the reads below then cannot fail and the
  // compiler drops their checks (this runs once per message).
  if (bytes.size() < kScatterFixedLen) return false;
  wire::ByteReader in(bytes);
  const auto magic = in.u32();
  const auto version = in.u16();
  const auto count = in.u16();
  const auto token = in.u64();
  const auto sequence = in.u64();
  const auto slot = in.u32();
  const auto reserved = in.u32();
  const auto lineage = in.u64();
  const auto epoch = in.u64();
  if (!in.ok() || *magic != kScatterMagic || *version != kScatterVersion) return false;
  if (*count == 0 || *count > kMaxScatterRuns) return false;
  if (in.remaining() != std::size_t{*count} * kScatterRunLen) return false;
  if (*reserved != 0) return false;
  out->token = *token;
  out->sequence = *sequence;
  out->slot = *slot;
  out->lineage = *lineage;
  out->epoch = *epoch;
  out->runs = bytes.subspan(kScatterFixedLen);
  return true;
}

// True when every run lies inside a region of `region_len` bytes, no run is
// empty, and the runs' lengths add up to exactly `payload_len`.
[[nodiscard]] inline bool scatter_runs_fit(const ScatterHeader& header, std::uint64_t region_len,
                                           std::uint64_t payload_len) {
  std::uint64_t total = 0;
  return wire::runs_in_region(header, region_len, payload_len, &total) && total == payload_len;
}

// Writes an ack in place at `out` (kAckLen bytes).
inline void encode_ack(std::uint8_t* out, const ScatterAck& ack) {
  wire::ByteWriter w(std::span(out, kAckLen));
  w.u32(kAckMagic);
  w.u32(ack.slot);
  w.u64(ack.sequence);
  w.i32(ack.status);
  w.u32(0);
}

// False unless `bytes` is exactly one well-formed ack.
[[nodiscard]] inline bool decode_ack(std::span<const std::uint8_t> bytes, ScatterAck* out) {
  if (bytes.size() != kAckLen) return false;
  wire::ByteReader in(bytes);
  const auto magic = in.u32();
  const auto slot = in.u32();
  const auto sequence = in.u64();
  const auto status = in.i32();
  const auto reserved = in.u32();
  if (!in.ok() || *magic != kAckMagic || *reserved != 0) return false;
  out->slot = *slot;
  out->sequence = *sequence;
  out->status = *status;
  return true;
}

}  // namespace kvxfer::internal::ucx
