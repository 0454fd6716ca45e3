// SPDX-License-Identifier: Apache-2.0
// The frames of the tcp lane (engines/tcp/): what one kvxfer process sends
// another over a TCP connection of its own. Every frame starts with the same
// fixed header, decoded and bounded here before anything else of the frame
// is read:
//
//   u32 magic "KVXT" | u8 version | u8 type | u16 flags
//   | u32 count | u32 status | u64 seq | u64 length          (kFieldsLen)
//   | 16 bytes tag                                          (kHeaderLen)
//
// The tag authenticates the frame: computed with the connection's key for
// its direction over the fields, the frame's body and the frame's number in
// its direction (engines/tcp/tcp_handshake.h); the lane checks it before it
// acts on the frame and closes the connection when it fails. Only the two
// frames that make the keys carry no tag (all zero): the challenge and the
// hello. A write's or a reply's payload is not covered by any tag.
//
// then, by type (initiator -> target unless said otherwise):
//   kChallenge target -> initiator, the first bytes of every connection the
//              target accepts, sent before it reads anything: everything
//              zero but the type; body: kNonceLen random bytes, fresh for
//              this connection.
//   kHello     the initiator's first frame, nothing else is read before it:
//              count = name length (1..kMaxName), length = 0, flags kEncrypt
//              when the initiator encrypts (both ends then go on in TLS 1.3
//              after the welcome: engines/tcp/tcp_tls.h);
//              body u64 target token | u64 lineage | u64 gen | u64 epoch
//              | 32 bytes initiator key | kNonceLen bytes initiator nonce
//              | name | kHelloProofLen bytes proof. The token is the
//              target's (from its metadata); lineage, gen and epoch fence
//              the connection (engines/tcp/tcp_lane.h); the key is the
//              initiator's public identity key and the proof, derived over
//              the challenge and the hello up to it with the secret of the
//              initiator's key and the target's, proves that the initiator
//              holds its private half and that the hello is this
//              connection's, not a recorded one.
//   kWelcome   target -> initiator, the answer to a hello that carried the
//              target's token, the first tagged frame: status kStatusOk,
//              welcomed; any other status, refused (why: kStatusNotYours,
//              kStatusStaleFence, kStatusTableFull, kStatusUnproven,
//              kStatusEncryption), and the target closes the connection
//              after it. A hello without the
//              token gets no answer.
//   kWrite     count = runs (1..kMaxRuns), length = payload bytes (the sum of
//              the runs' lengths); body: the runs (wire/runs.h: each names
//              one of the target's regions by its id, 0 its pool), then the
//              payload, received straight into those regions. flags
//              kMore: more frames of this transfer follow (only the last is
//              acked); kNotifyFollows: a kNotify frame with the same seq
//              follows, and it is acked instead.
//   kNotify    count = 0, length = message bytes (1..kMaxMessage);
//              body: the message. Sent after its transfer's data, on the same
//              connection, so it arrives after the bytes by construction.
//   kReadReq   count = runs of the TARGET's regions to send back, length =
//              their total; flags kMore as for writes.
//   kAck       target -> initiator: seq, status (0: done), nothing follows.
//   kReadData  target -> initiator: seq, status, length = payload bytes (the
//              request's total when status is 0, else 0); the payload
//              follows, received straight into the reader's regions.
// A decoder never trusts a length it did not bound: runs are checked against
// the receiver's own regions (wire::runs_in_regions) before a payload byte
// is read.
//
// Version 3 added the tag, the challenge and the hello's nonce and proof
// (version 2's hello carried a MAC a recorded hello replayed); version 4
// added the region id to every run (version 3's runs were all in the pool).
// Frames of another version are refused.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "wire/bytes.h"
#include "wire/runs.h"

namespace kvxfer::wire {

inline constexpr std::uint32_t kFrameMagic = 0x5458564b;  // "KVXT" as bytes
inline constexpr std::uint8_t kFrameVersion = 4;
// A header: its fields, then its tag.
inline constexpr std::size_t kFieldsLen = 32;
inline constexpr std::size_t kTagLen = 16;
inline constexpr std::size_t kHeaderLen = kFieldsLen + kTagLen;
// A challenge's body, and the nonce in a hello.
inline constexpr std::size_t kNonceLen = 32;
// A hello's body: kHelloFixedLen bytes, the name, then kHelloProofLen.
inline constexpr std::size_t kHelloFixedLen = 64 + kNonceLen;
inline constexpr std::size_t kHelloProofLen = 32;
inline constexpr std::size_t kMaxName = 256;
// Runs per frame: one readv/sendmsg's worth of iovecs (IOV_MAX is 1024).
// A transfer with more runs is several frames.
inline constexpr std::size_t kMaxRuns = 1000;
// The longest notification message (kvxfer::kMaxNotificationBytes; the
// lane checks that the two agree, so this header needs nothing outside
// src/wire).
inline constexpr std::size_t kMaxMessage = 4096;

enum class FrameType : std::uint8_t {
  kHello = 1,
  kWelcome = 2,
  kWrite = 3,
  kNotify = 4,
  kReadReq = 5,
  kAck = 6,
  kReadData = 7,
  kChallenge = 8,
};

enum FrameFlags : std::uint16_t {
  kMore = 1u << 0,
  kNotifyFollows = 1u << 1,
  // A hello's only flag: the initiator runs with encryption on
  // (KVXFER_TCP_ENCRYPT=on). Its header is in the hello's proof, so it
  // cannot be changed on the way.
  kEncrypt = 1u << 2,
};

// A kAck's, kReadData's or kWelcome's status.
enum WireStatus : std::uint32_t {
  kStatusOk = 0,
  // The frame's runs do not lie in the target's regions they name (an
  // unknown or removed region, or past its end), or its payload does not
  // match them: nothing of it was written, and the target closes the
  // connection after this answer.
  kStatusRefused = 1,
  // The target's queue holds as many of this sender's notifications as it
  // keeps (the message is dropped, the sender's transfer fails).
  kStatusQueueFull = 2,
  // The target registered a peer of the connection's name with another
  // identity key: the notification is dropped, and the target closes the
  // connection after this answer.
  kStatusNotYours = 3,
  // Welcome only, each a refused hello: a newer registration of the same
  // initiator replaced this one; the target's room for initiators (or for
  // this registration's connections) is full, and it refuses rather than
  // forgets; the hello's proof does not prove its key for this connection.
  kStatusStaleFence = 4,
  kStatusTableFull = 5,
  kStatusUnproven = 6,
  // Welcome only: the hello's kEncrypt flag is not the target's setting
  // (one side runs KVXFER_TCP_ENCRYPT=on, the other off).
  kStatusEncryption = 7,
};

struct FrameHeader {
  FrameType type = FrameType::kHello;
  std::uint16_t flags = 0;
  std::uint32_t count = 0;
  std::uint32_t status = 0;
  std::uint64_t seq = 0;
  std::uint64_t length = 0;
};

struct Hello {
  Hello() = default;
  // The fences and name; the key is set apart (and the MAC is the lane's).
  Hello(std::uint64_t token_in, std::uint64_t lineage_in, std::uint64_t gen_in,
        std::uint64_t epoch_in, std::string_view name_in)
      : token(token_in), lineage(lineage_in), gen(gen_in), epoch(epoch_in), name(name_in) {}
  std::uint64_t token = 0;
  std::uint64_t lineage = 0;
  std::uint64_t gen = 0;
  std::uint64_t epoch = 0;
  std::string_view name;                      // a view into the decoded bytes
  std::array<std::uint8_t, 32> key{};         // the initiator's public identity key
  std::array<std::uint8_t, kNonceLen> nonce{};  // the initiator's, fresh per connection
  std::span<const std::uint8_t> proof;        // decoded: a view of the body's proof
};

// Writes a header's fields in place (kHeaderLen bytes at `out`), its tag
// zero: a sender then writes the tag (header_tag) unless the frame is a
// challenge or a hello.
inline void encode_header(std::uint8_t* out, const FrameHeader& h) {
  std::fill(out + kFieldsLen, out + kHeaderLen, std::uint8_t{0});
  wire::ByteWriter w(std::span(out, kFieldsLen));
  w.u32(kFrameMagic);
  w.u8(kFrameVersion);
  w.u8(static_cast<std::uint8_t>(h.type));
  w.u16(h.flags);
  w.u32(h.count);
  w.u32(h.status);
  w.u64(h.seq);
  w.u64(h.length);
}

// A header's parts: the fields its tag covers, and the tag.
[[nodiscard]] inline std::span<const std::uint8_t, kFieldsLen> header_fields(
    std::span<const std::uint8_t, kHeaderLen> header) {
  return header.first<kFieldsLen>();
}
[[nodiscard]] inline std::span<const std::uint8_t, kTagLen> header_tag(
    std::span<const std::uint8_t, kHeaderLen> header) {
  return header.last<kTagLen>();
}
// Where a sender writes a header's tag.
[[nodiscard]] inline std::span<std::uint8_t, kTagLen> tag_slot(
    std::span<std::uint8_t, kHeaderLen> header) {
  return header.last<kTagLen>();
}

// The bytes that follow a header before any payload: the challenge's nonce,
// the hello's fixed part, name and proof, a write's or read request's runs, a
// notification's message. A tag covers them.
[[nodiscard]] inline std::size_t body_len(const FrameHeader& h) {
  switch (h.type) {
    case FrameType::kChallenge:
      return kNonceLen;
    case FrameType::kHello:
      return kHelloFixedLen + h.count + kHelloProofLen;
    case FrameType::kWrite:
    case FrameType::kReadReq:
      return h.count * wire::kRunLen;
    case FrameType::kNotify:
      return h.length;
    default:
      return 0;
  }
}

// False unless `bytes` (kHeaderLen of them) is a header of a known type whose
// counts and lengths are within this format's bounds: a challenge all zero
// but its type, a hello's name 1..kMaxName and seq 0 (the two with a zero
// tag), a write's or read request's runs 1..kMaxRuns with a nonzero length,
// a notification's message 1..kMaxMessage, nothing else carrying a count;
// only writes and read requests carry flags, and only their own (a write
// never both kMore and kNotifyFollows), and a hello kEncrypt; a welcome is
// all zero but its status. Any other tag decodes: whether it is right is
// the lane's to check (it holds the keys). A payload's length is checked
// against the runs later, by the lane, and body_len() means something only
// for a header this accepted.
[[nodiscard]] inline bool decode_header(std::span<const std::uint8_t> bytes, FrameHeader* out) {
  if (bytes.size() != kHeaderLen) return false;
  wire::ByteReader in(bytes);
  const auto magic = in.u32();
  const auto version = in.u8();
  const auto type = in.u8();
  const auto flags = in.u16();
  const auto count = in.u32();
  const auto status = in.u32();
  const auto seq = in.u64();
  const auto length = in.u64();
  const auto tag = in.take(kTagLen);
  if (!in.ok() || *magic != kFrameMagic || *version != kFrameVersion) return false;
  const bool no_tag =
      std::all_of(tag->begin(), tag->end(), [](std::uint8_t b) { return b == 0; });
  FrameHeader h;
  h.type = static_cast<FrameType>(*type);
  h.flags = *flags;
  h.count = *count;
  h.status = *status;
  h.seq = *seq;
  h.length = *length;
  bool ok = false;
  switch (h.type) {
    case FrameType::kChallenge:
      ok = h.count == 0 && h.length == 0 && h.flags == 0 && h.status == 0 && h.seq == 0 && no_tag;
      break;
    case FrameType::kHello:
      ok = h.count >= 1 && h.count <= kMaxName && h.length == 0 && (h.flags & ~kEncrypt) == 0 &&
           h.status == 0 && h.seq == 0 && no_tag;
      break;
    case FrameType::kWelcome:
      ok = h.count == 0 && h.length == 0 && h.flags == 0;
      break;
    case FrameType::kWrite:
      ok = h.count >= 1 && h.count <= kMaxRuns && h.length > 0 && h.status == 0 &&
           (h.flags & ~(kMore | kNotifyFollows)) == 0 &&
           (h.flags & (kMore | kNotifyFollows)) != (kMore | kNotifyFollows);
      break;
    case FrameType::kReadReq:
      ok = h.count >= 1 && h.count <= kMaxRuns && h.length > 0 && h.status == 0 &&
           (h.flags & ~kMore) == 0;
      break;
    case FrameType::kNotify:
      ok =
          h.count == 0 && h.length >= 1 && h.length <= kMaxMessage && h.flags == 0 && h.status == 0;
      break;
    case FrameType::kAck:
      ok = h.count == 0 && h.length == 0 && h.flags == 0;
      break;
    case FrameType::kReadData:
      ok = h.count == 0 && h.flags == 0 && (h.status == 0 || h.length == 0);
      break;
  }
  if (!ok) return false;
  *out = h;
  return true;
}

// Writes a hello's body but its proof (kHelloFixedLen + name bytes at `out`,
// followed by kHelloProofLen bytes the caller fills with the proof over
// these); the caller keeps the name 1..kMaxName bytes.
inline void encode_hello_body(std::uint8_t* out, const Hello& hello) {
  wire::ByteWriter w(std::span(out, kHelloFixedLen + hello.name.size()));
  w.u64(hello.token);
  w.u64(hello.lineage);
  w.u64(hello.gen);
  w.u64(hello.epoch);
  w.raw(hello.key);
  w.raw(hello.nonce);
  w.raw(wire::byte_view(hello.name));
}

// The part of a hello's body its proof covers (with its header and the
// challenge): all of it but the proof.
[[nodiscard]] inline std::span<const std::uint8_t> hello_proven_part(
    std::span<const std::uint8_t> body) {
  return body.size() < kHelloProofLen ? body.first(0) : body.first(body.size() - kHelloProofLen);
}

// False unless `body` is a hello's body whose name is `name_len` bytes and
// whose lineage, gen and epoch are nonzero. *out's name and proof view
// `body`; the proof is the lane's to check.
[[nodiscard]] inline bool decode_hello_body(std::span<const std::uint8_t> body,
                                            std::size_t name_len, Hello* out) {
  if (name_len > kMaxName || body.size() != kHelloFixedLen + name_len + kHelloProofLen) {
    return false;
  }
  wire::ByteReader in(body);
  const auto token = in.u64();
  const auto lineage = in.u64();
  const auto gen = in.u64();
  const auto epoch = in.u64();
  const auto key = in.take(32);
  const auto nonce = in.take(kNonceLen);
  const auto name = in.take(name_len);
  const auto proof = in.take(kHelloProofLen);
  if (!in.ok() || *lineage == 0 || *gen == 0 || *epoch == 0) return false;
  out->token = *token;
  out->lineage = *lineage;
  out->gen = *gen;
  out->epoch = *epoch;
  std::copy(key->begin(), key->end(), out->key.begin());
  std::copy(nonce->begin(), nonce->end(), out->nonce.begin());
  out->name = std::string_view(reinterpret_cast<const char*>(name->data()), name->size());
  out->proof = *proof;
  return true;
}

// Writes a challenge frame (kHeaderLen + kNonceLen bytes at `out`).
inline void encode_challenge(std::uint8_t* out, std::span<const std::uint8_t, kNonceLen> nonce) {
  encode_header(out, FrameHeader{FrameType::kChallenge, 0, 0, 0, 0, 0});
  std::copy(nonce.begin(), nonce.end(), out + kHeaderLen);
}

// False unless `frame` is exactly a challenge frame; its nonce into *out.
[[nodiscard]] inline bool decode_challenge(std::span<const std::uint8_t> frame,
                                           std::array<std::uint8_t, kNonceLen>* out) {
  FrameHeader h;
  if (frame.size() != kHeaderLen + kNonceLen ||
      !decode_header(frame.first(kHeaderLen), &h) || h.type != FrameType::kChallenge) {
    return false;
  }
  std::copy(frame.begin() + kHeaderLen, frame.end(), out->begin());
  return true;
}

// True when a write's or read request's runs (body_len(h) bytes) all lie in
// the regions they name (`region_len` as for runs_in_regions) and add up to
// exactly h.length.
template <typename RegionLen>
[[nodiscard]] bool runs_fit(const FrameHeader& h, std::span<const std::uint8_t> runs,
                            RegionLen&& region_len) {
  if (h.type != FrameType::kWrite && h.type != FrameType::kReadReq) return false;
  if (runs.size() != body_len(h) || runs.empty()) return false;
  std::uint64_t total = 0;
  return wire::runs_in_regions(wire::RunList{runs}, region_len, h.length, &total) &&
         total == h.length;
}

}  // namespace kvxfer::wire
