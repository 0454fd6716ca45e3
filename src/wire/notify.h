// SPDX-License-Identifier: Apache-2.0
// Notifications on the UCX lane: the message an initiator sends a target
// once every byte of a transfer is in place (or on its own, for
// send_notification), acked like a scatter write (wire/scatter.h's ack:
// slot, sequence, status) once the target has queued it.
//
// Layout (little-endian), version 1:
//   header: u32 magic "KVXN" | u16 version | u16 name length
//           | u64 target token | u64 sequence | u32 slot | u32 zero
//           | u64 lineage | u64 epoch | name (the sender's agent name)
//   payload: the message, 1..kMaxNotificationBytes bytes.
// Token, sequence, slot, lineage and epoch mean what they mean for a
// scatter write: the target takes a notification only while its
// registration is the newest fenced for its lineage, so one from a removed
// (or replaced) registration is refused, never delivered. The name is only a
// label for get_notifications(); the target trusts nothing else in it.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "wire/bytes.h"

namespace kvxfer::internal::ucx {

// Active message id (after the gather ids 10 and 11).
inline constexpr unsigned kNotifyAmId = 12;

inline constexpr std::uint32_t kNotifyMagic = 0x4e58564b;  // "KVXN" as bytes
inline constexpr std::uint16_t kNotifyVersion = 1;
inline constexpr std::size_t kNotifyFixedLen = 48;
inline constexpr std::size_t kMaxNotifyName = 256;

struct NotifyHeader {
  std::uint64_t token = 0;
  std::uint64_t sequence = 0;
  std::uint32_t slot = 0;
  std::uint64_t lineage = 0;
  std::uint64_t epoch = 0;
  std::string_view name;  // points into the decoded bytes
};

inline constexpr std::size_t notify_header_len(std::size_t name_len) {
  return kNotifyFixedLen + name_len;
}

// Writes a header in place at `out` (notify_header_len(h.name.size()) bytes;
// the name is 1..kMaxNotifyName bytes, the caller's to ensure).
inline void encode_notify_header(std::uint8_t* out, const NotifyHeader& h) {
  wire::ByteWriter w(std::span(out, notify_header_len(h.name.size())));
  w.u32(kNotifyMagic);
  w.u16(kNotifyVersion);
  w.u16(static_cast<std::uint16_t>(h.name.size()));
  w.u64(h.token);
  w.u64(h.sequence);
  w.u32(h.slot);
  w.u32(0);
  w.u64(h.lineage);
  w.u64(h.epoch);
  w.raw(wire::byte_view(h.name));
}

// False unless `bytes` is exactly one well-formed version-1 header with a
// name of 1..kMaxNotifyName bytes.
[[nodiscard]] inline bool decode_notify_header(std::span<const std::uint8_t> bytes,
                                               NotifyHeader* out) {
  if (bytes.size() < kNotifyFixedLen) return false;
  wire::ByteReader in(bytes);
  const auto magic = in.u32();
  const auto version = in.u16();
  const auto name_len = in.u16();
  const auto token = in.u64();
  const auto sequence = in.u64();
  const auto slot = in.u32();
  const auto reserved = in.u32();
  const auto lineage = in.u64();
  const auto epoch = in.u64();
  if (!in.ok() || *magic != kNotifyMagic || *version != kNotifyVersion || *reserved != 0) {
    return false;
  }
  if (*name_len == 0 || *name_len > kMaxNotifyName || in.remaining() != *name_len) return false;
  out->token = *token;
  out->sequence = *sequence;
  out->slot = *slot;
  out->lineage = *lineage;
  out->epoch = *epoch;
  const auto name = bytes.subspan(kNotifyFixedLen);
  out->name = std::string_view(reinterpret_cast<const char*>(name.data()), name.size());
  return true;
}

}  // namespace kvxfer::internal::ucx
