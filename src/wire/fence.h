// SPDX-License-Identifier: Apache-2.0
// The fence: the first message an initiator's UCX lane sends on every new
// endpoint to a target, before any notification (wire/notify.h).
//
// An initiator keeps, per target (remote agent name, remote token), a random
// 64-bit `lineage` for the life of its lane, and counts its registrations of
// that target (`gen` 1, 2, 3...). Each registration also draws a random,
// nonzero 64-bit `epoch`. The fence tells the target: from now on, messages
// of this lineage count only if they carry this epoch and arrive on the
// endpoint this fence arrived on. The target keeps the newest {gen, epoch,
// endpoint, name} per lineage; a notification whose lineage is unknown, whose
// epoch is not the stored one, or that arrives on another endpoint is
// refused. gen orders fences (an old fence still in a dead connection must
// not win over a newer one); the random epoch is what proves a message
// belongs to the registration. The name is the sender's agent name, which
// the target gives every notification of the endpoint: a notification does
// not name its sender itself.
//
// Fences order messages, not puts: a put is one-sided, carried out by the
// target's NIC (or, over UCX's tcp, its worker) without any handler of ours
// (docs/reliability.md, "The ucx lane").
//
// Layout (little-endian), version 2, kFenceFixedLen + name bytes:
//   u32 magic "KVXF" | u16 version | u16 name length
//   | u64 target token | u64 lineage | u64 gen | u64 epoch | name
// Target token: the target's cookie epoch (from its metadata), so a fence
// meant for an earlier engine in the same process is ignored. Lineage, gen
// and epoch are nonzero; the name has 1..kMaxFenceName bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "wire/bytes.h"

namespace kvxfer::wire {

// Active message id (next to kNotifyAmId and kNotifyAckAmId).
inline constexpr unsigned kFenceAmId = 9;

inline constexpr std::uint32_t kFenceMagic = 0x4658564b;  // "KVXF" as bytes
inline constexpr std::uint16_t kFenceVersion = 2;
inline constexpr std::size_t kFenceFixedLen = 40;
inline constexpr std::size_t kMaxFenceName = 256;
// How many initiator lineages a target remembers. A full table refuses new
// lineages; it forgets only one that has been silent a long while with no
// reply in flight, never one that still talks (engines/fence_table.h).
inline constexpr std::size_t kMaxFences = 4096;

struct Fence {
  std::uint64_t token = 0;
  std::uint64_t lineage = 0;
  std::uint64_t gen = 0;
  std::uint64_t epoch = 0;
  std::string_view name;  // points into the decoded bytes
};

inline constexpr std::size_t fence_len(std::size_t name_len) { return kFenceFixedLen + name_len; }

// Writes a fence in place at `out` (fence_len(fence.name.size()) bytes; the
// name is 1..kMaxFenceName bytes, the caller's to ensure).
inline void encode_fence(std::uint8_t* out, const Fence& fence) {
  wire::ByteWriter w(std::span(out, fence_len(fence.name.size())));
  w.u32(kFenceMagic);
  w.u16(kFenceVersion);
  w.u16(static_cast<std::uint16_t>(fence.name.size()));
  w.u64(fence.token);
  w.u64(fence.lineage);
  w.u64(fence.gen);
  w.u64(fence.epoch);
  w.raw(wire::byte_view(fence.name));
}

// False unless `bytes` is exactly one well-formed version-2 fence with a
// nonzero lineage, gen and epoch and a name of 1..kMaxFenceName bytes. On
// failure *out is left alone.
[[nodiscard]] inline bool decode_fence(std::span<const std::uint8_t> bytes, Fence* out) {
  if (bytes.size() < kFenceFixedLen) return false;
  wire::ByteReader in(bytes);
  const auto magic = in.u32();
  const auto version = in.u16();
  const auto name_len = in.u16();
  const auto token = in.u64();
  const auto lineage = in.u64();
  const auto gen = in.u64();
  const auto epoch = in.u64();
  if (!in.ok() || *magic != kFenceMagic || *version != kFenceVersion) return false;
  if (*name_len == 0 || *name_len > kMaxFenceName || in.remaining() != *name_len) return false;
  if (*lineage == 0 || *gen == 0 || *epoch == 0) return false;
  out->token = *token;
  out->lineage = *lineage;
  out->gen = *gen;
  out->epoch = *epoch;
  const auto name = bytes.subspan(kFenceFixedLen);
  out->name = std::string_view(reinterpret_cast<const char*>(name.data()), name.size());
  return true;
}

}  // namespace kvxfer::wire
