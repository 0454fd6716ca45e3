// SPDX-License-Identifier: Apache-2.0
// Gather reads: the UCX lane's READ, the mirror of scatter writes
// (wire/scatter.h) for hosts where UCX has no RMA (and so no get).
//
// The initiator asks with a request that carries only runs of the target's
// region (no payload); the target's handler checks every run against its
// registered region and answers with one reply whose payload is the runs'
// bytes in order, sent by UCX straight from the target's pool (an iov
// datatype). The initiator copies a reply into its own pool only when it
// names a chunk of a read still awaited, came through the endpoint of the
// peer that read was sent to, and carries exactly the bytes that chunk asked
// for.
//
// Layouts (little-endian):
//   request: u32 magic "KVXG" | u16 version (1) | u16 run count
//            | u64 target token | u64 sequence | u32 slot | u32 chunk index
//            | u64 lineage | u64 epoch
//            | run count x (u64 offset into the target's region | u64 length)
//   reply:   u32 magic "KVXR" | u16 version (1) | u16 zero
//            | u32 slot | u32 chunk index | u64 sequence | i32 status
//            | u32 zero | u64 byte length
//            payload: byte length bytes, only when status is 0 (UCS_OK)
// Token, sequence, slot, lineage and epoch mean what they mean for a scatter
// write: the target serves a read only for its own token and while the
// (lineage, epoch) is the newest it was fenced to (wire/fence.h), so a read
// posted on a removed registration is refused. The chunk index names one
// request of a read (a read of more than a chunk of bytes, or of more runs
// than one header holds, is several requests); the target only echoes it.
// The first 32 bytes of a request (magic to chunk index) keep this layout in
// every version, so that a target can refuse a request it cannot read to the
// read that sent it instead of leaving that read waiting.
//
// Both are read with wire/bytes.h's reader after one exact-length check; a
// request's runs are then checked by gather_runs_fit before a byte is read
// from the pool.
#pragma once

#include <cstdint>
#include <span>

#include "wire/bytes.h"
#include "wire/runs.h"

namespace kvxfer::internal::ucx {

// Active message ids (next to kScatterAmId 7, kScatterAckAmId 8, kFenceAmId 9).
inline constexpr unsigned kGatherAmId = 10;
inline constexpr unsigned kGatherReplyAmId = 11;

inline constexpr std::uint32_t kGatherMagic = 0x4758564b;       // "KVXG" as bytes
inline constexpr std::uint32_t kGatherReplyMagic = 0x5258564b;  // "KVXR" as bytes
inline constexpr std::uint16_t kGatherVersion = 1;
inline constexpr std::size_t kGatherFixedLen = 48;
// What peek_gather_address reads: magic to chunk index.
inline constexpr std::size_t kGatherAddressLen = 32;
inline constexpr std::size_t kGatherRunLen = wire::kRunLen;
inline constexpr std::size_t kMaxGatherRuns = 1024;
inline constexpr std::size_t kGatherReplyLen = 40;
// The most bytes one request may ask for: the largest chunk an initiator
// can be configured to (KVXFER_SCATTER_CHUNK, ucx_config.h).
inline constexpr std::uint64_t kMaxGatherBytes = std::uint64_t{64} << 20;

using GatherRun = wire::Run;

// The runs (RunList) follow the fixed part.
struct GatherRequest : wire::RunList {
  std::uint64_t token = 0;
  std::uint64_t sequence = 0;
  std::uint32_t slot = 0;
  std::uint32_t chunk = 0;
  std::uint64_t lineage = 0;
  std::uint64_t epoch = 0;
};

// Which read (and which of its requests) a message names.
struct GatherAddress {
  std::uint32_t slot = 0;
  std::uint32_t chunk = 0;
  std::uint64_t sequence = 0;
};

struct GatherReply {
  std::uint32_t slot = 0;
  std::uint32_t chunk = 0;
  std::uint64_t sequence = 0;
  std::int32_t status = 0;
  std::uint64_t length = 0;  // payload bytes; 0 unless status is 0
};

inline constexpr std::size_t gather_request_len(std::size_t runs) {
  return kGatherFixedLen + runs * kGatherRunLen;
}

// Writes the fixed part in place at `out` (kGatherFixedLen bytes of the
// caller's preallocated header); the runs follow through put_gather_run.
inline void put_gather_fixed(std::uint8_t* out, std::uint16_t run_count, std::uint64_t token,
                             std::uint64_t sequence, std::uint32_t slot, std::uint32_t chunk,
                             std::uint64_t lineage, std::uint64_t epoch) {
  wire::ByteWriter w(std::span(out, kGatherFixedLen));
  w.u32(kGatherMagic);
  w.u16(kGatherVersion);
  w.u16(run_count);
  w.u64(token);
  w.u64(sequence);
  w.u32(slot);
  w.u32(chunk);
  w.u64(lineage);
  w.u64(epoch);
}

inline void put_gather_run(std::uint8_t* header, std::size_t index, std::uint64_t offset,
                           std::uint64_t length) {
  wire::put_run(header, kGatherFixedLen, index, offset, length);
}

// False unless `bytes` is exactly one well-formed version-1 request. The
// runs are not checked against any region here: see gather_runs_fit.
[[nodiscard]] inline bool decode_gather_request(std::span<const std::uint8_t> bytes,
                                                GatherRequest* out) {
  if (bytes.size() < kGatherFixedLen) return false;
  wire::ByteReader in(bytes);
  const auto magic = in.u32();
  const auto version = in.u16();
  const auto count = in.u16();
  const auto token = in.u64();
  const auto sequence = in.u64();
  const auto slot = in.u32();
  const auto chunk = in.u32();
  const auto lineage = in.u64();
  const auto epoch = in.u64();
  if (!in.ok() || *magic != kGatherMagic || *version != kGatherVersion) return false;
  if (*count == 0 || *count > kMaxGatherRuns) return false;
  if (in.remaining() != std::size_t{*count} * kGatherRunLen) return false;
  out->token = *token;
  out->sequence = *sequence;
  out->slot = *slot;
  out->chunk = *chunk;
  out->lineage = *lineage;
  out->epoch = *epoch;
  out->runs = bytes.subspan(kGatherFixedLen);
  return true;
}

// For a request decode_gather_request refused: true when it still names a
// read (at least kGatherAddressLen bytes, gather magic, any version), so
// the target can answer it with a refusal. On false *out is left alone.
[[nodiscard]] inline bool peek_gather_address(std::span<const std::uint8_t> bytes,
                                              GatherAddress* out) {
  if (bytes.size() < kGatherAddressLen) return false;
  wire::ByteReader in(bytes);
  const auto magic = in.u32();
  [[maybe_unused]] const auto version = in.u16();
  [[maybe_unused]] const auto count = in.u16();
  [[maybe_unused]] const auto token = in.u64();
  const auto sequence = in.u64();
  const auto slot = in.u32();
  const auto chunk = in.u32();
  if (!in.ok() || *magic != kGatherMagic) return false;
  out->slot = *slot;
  out->chunk = *chunk;
  out->sequence = *sequence;
  return true;
}

// wire::runs_in_region for a request: every run inside the region, none
// empty, at most `limit` bytes in all (then *total).
[[nodiscard]] inline bool gather_runs_fit(const GatherRequest& request, std::uint64_t region_len,
                                          std::uint64_t limit, std::uint64_t* total) {
  return wire::runs_in_region(request, region_len, limit, total);
}

// Writes a reply header in place at `out` (kGatherReplyLen bytes).
inline void encode_gather_reply(std::uint8_t* out, const GatherReply& reply) {
  wire::ByteWriter w(std::span(out, kGatherReplyLen));
  w.u32(kGatherReplyMagic);
  w.u16(kGatherVersion);
  w.u16(0);
  w.u32(reply.slot);
  w.u32(reply.chunk);
  w.u64(reply.sequence);
  w.i32(reply.status);
  w.u32(0);
  w.u64(reply.length);
}

// False unless `bytes` is exactly one well-formed version-1 reply header; a
// refusal (nonzero status) must announce no bytes.
[[nodiscard]] inline bool decode_gather_reply(std::span<const std::uint8_t> bytes,
                                              GatherReply* out) {
  if (bytes.size() != kGatherReplyLen) return false;
  wire::ByteReader in(bytes);
  const auto magic = in.u32();
  const auto version = in.u16();
  const auto reserved = in.u16();
  const auto slot = in.u32();
  const auto chunk = in.u32();
  const auto sequence = in.u64();
  const auto status = in.i32();
  const auto reserved2 = in.u32();
  const auto length = in.u64();
  if (!in.ok() || !in.at_end() || *magic != kGatherReplyMagic || *version != kGatherVersion ||
      *reserved != 0 || *reserved2 != 0) {
    return false;
  }
  if (*status != 0 && *length != 0) return false;
  out->slot = *slot;
  out->chunk = *chunk;
  out->sequence = *sequence;
  out->status = *status;
  out->length = *length;
  return true;
}

}  // namespace kvxfer::internal::ucx
