// SPDX-License-Identifier: Apache-2.0
// Notifications: the message an initiator sends a target once every byte of
// a transfer is in place (or alone, for send_notification). The UCX lane
// sends it as an active message, which the target acks once it queued (or
// refused) it; the same-host lane sends the same header in a datagram.
//
// Layout (little-endian), version 1:
//   header: u32 magic "KVXN" | u16 version | u16 name length
//           | u64 target token | u64 sequence | u32 slot | u32 zero
//           | u64 lineage | u64 epoch | name (the sender's agent name)
//   payload: the message, 1..kMaxNotificationBytes bytes.
//   ack:    u32 magic "KVXA" | u32 slot | u64 sequence | i32 status | u32 zero
// The UCX lane's target takes a notification only while its (lineage,
// epoch) is the newest fenced for its lineage and it arrives on the
// endpoint that fence came on (wire/fence.h), so one from a removed or
// replaced registration is refused, never delivered; it labels it with the
// fence's name, not this one. Slot and sequence name the initiator's
// transfer: the ack echoes them, and it counts only on the endpoint the
// transfer went out on, with the transfer's unguessable sequence.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "wire/bytes.h"

namespace kvxfer::wire {

// Active message ids (small: UCX sizes its handler table by the largest id).
inline constexpr unsigned kNotifyAckAmId = 8;
inline constexpr unsigned kNotifyAmId = 12;

inline constexpr std::uint32_t kNotifyMagic = 0x4e58564b;  // "KVXN" as bytes
inline constexpr std::uint16_t kNotifyVersion = 1;
inline constexpr std::size_t kNotifyFixedLen = 48;
inline constexpr std::size_t kMaxNotifyName = 256;
inline constexpr std::uint32_t kAckMagic = 0x4158564b;  // "KVXA" as bytes
inline constexpr std::size_t kAckLen = 24;

struct NotifyHeader {
  std::uint64_t token = 0;
  std::uint64_t sequence = 0;
  std::uint32_t slot = 0;
  std::uint64_t lineage = 0;
  std::uint64_t epoch = 0;
  std::string_view name;  // points into the decoded bytes
};

struct NotifyAck {
  std::uint32_t slot = 0;
  std::uint64_t sequence = 0;
  std::int32_t status = 0;
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

// Writes an ack in place at `out` (kAckLen bytes).
inline void encode_ack(std::uint8_t* out, const NotifyAck& ack) {
  wire::ByteWriter w(std::span(out, kAckLen));
  w.u32(kAckMagic);
  w.u32(ack.slot);
  w.u64(ack.sequence);
  w.i32(ack.status);
  w.u32(0);
}

// False unless `bytes` is exactly one well-formed ack.
[[nodiscard]] inline bool decode_ack(std::span<const std::uint8_t> bytes, NotifyAck* out) {
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

}  // namespace kvxfer::wire
