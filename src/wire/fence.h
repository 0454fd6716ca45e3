// SPDX-License-Identifier: Apache-2.0
// The fence: the first message an initiator's UCX lane sends on every new
// endpoint to a target, before any scatter write (wire/scatter.h).
//
// An initiator keeps, per target (remote agent name, remote token), a random
// 64-bit `lineage` for the life of its lane, and counts its registrations of
// that target (`gen` 1, 2, 3...). Each registration also draws a random,
// nonzero 64-bit `epoch`. The fence tells the target: from now on, writes of
// this lineage count only if they carry this epoch. The target keeps the
// newest {gen, epoch} per lineage; a write whose lineage is unknown or whose
// epoch is not the stored one is refused and nothing of it is written. Active
// messages on one endpoint arrive in order and the target's handlers run one
// at a time, so every message of an older registration is either applied
// before the newer fence or refused after it: it can never land on top of
// bytes a newer registration already reported written. gen orders fences
// (an old fence still in a dead connection must not win over a newer one);
// the random epoch is what proves a write belongs to the registration.
//
// Layout (little-endian), version 1, exactly kFenceLen bytes:
//   u32 magic "KVXF" | u16 version | u16 zero
//   | u64 target token | u64 lineage | u64 gen | u64 epoch
// Target token: the target's cookie epoch (from its metadata), so a fence
// meant for an earlier engine in the same process is ignored. Lineage, gen
// and epoch are nonzero.
#pragma once

#include <cstdint>
#include <span>

#include "wire/bytes.h"

namespace kvxfer::internal::ucx {

// Active message id (next to kScatterAmId and kScatterAckAmId).
inline constexpr unsigned kFenceAmId = 9;

inline constexpr std::uint32_t kFenceMagic = 0x4658564b;  // "KVXF" as bytes
inline constexpr std::uint16_t kFenceVersion = 1;
inline constexpr std::size_t kFenceLen = 40;
// How many initiator lineages a target remembers; past that, the least
// recently fenced is forgotten (its writes are refused from then on).
inline constexpr std::size_t kMaxFences = 4096;

struct Fence {
  std::uint64_t token = 0;
  std::uint64_t lineage = 0;
  std::uint64_t gen = 0;
  std::uint64_t epoch = 0;
};

// Writes a fence in place at `out` (kFenceLen bytes).
inline void encode_fence(std::uint8_t* out, const Fence& fence) {
  wire::ByteWriter w(std::span(out, kFenceLen));
  w.u32(kFenceMagic);
  w.u16(kFenceVersion);
  w.u16(0);
  w.u64(fence.token);
  w.u64(fence.lineage);
  w.u64(fence.gen);
  w.u64(fence.epoch);
}

// False unless `bytes` is exactly one well-formed version-1 fence with a
// nonzero lineage, gen and epoch. On failure *out is left alone.
[[nodiscard]] inline bool decode_fence(std::span<const std::uint8_t> bytes, Fence* out) {
  if (bytes.size() != kFenceLen) return false;
  wire::ByteReader in(bytes);
  const auto magic = in.u32();
  const auto version = in.u16();
  const auto reserved = in.u16();
  const auto token = in.u64();
  const auto lineage = in.u64();
  const auto gen = in.u64();
  const auto epoch = in.u64();
  if (!in.ok() || !in.at_end() || *magic != kFenceMagic || *version != kFenceVersion ||
      *reserved != 0) {
    return false;
  }
  if (*lineage == 0 || *gen == 0 || *epoch == 0) return false;
  out->token = *token;
  out->lineage = *lineage;
  out->gen = *gen;
  out->epoch = *epoch;
  return true;
}

}  // namespace kvxfer::internal::ucx
