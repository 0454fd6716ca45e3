// SPDX-License-Identifier: Apache-2.0
// Fuzz target for the tcp lane's frames (wire/tcp_frame.h), which a peer
// sends over a connection of its own: input = a 48-byte header (fields and
// tag) | the body it announces (body_len) | anything (a write's payload, the
// next frame; not read). Accepted: the header decodes, the body is all
// there, and it passes its check: a challenge decodes (decode_challenge), a
// hello's body decodes with the header's name length, a write's or read
// request's runs fit the receiver's regions (runs_fit: a pool of kPool
// bytes, id 0, and one region of kRegion bytes, id kRegionId); a notification's
// message and the frames without a body have nothing more to check (a tag
// is the lane's to verify, with keys a decoder does not have). Refused:
// anything else, and then the output is left alone. Checked on the way: a
// decoded header keeps its type's bounds, a challenge's or hello's tag is
// zero, the fields re-encode to the same bytes, and runs_fit agrees with a
// reference that cannot overflow for three region tables (those regions;
// every id 2^64 - 1 bytes; and the pool alone, of the header's seq bytes, a
// size the input chooses). A crash, an over-read or a mismatch is a bug.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "fuzz_target.h"
#include "wire/tcp_frame.h"

namespace {

using namespace kvxfer;

__extension__ typedef unsigned __int128 u128;  // __extension__: no -Wpedantic warning

// The receiver's regions for the verdict (make_seeds.cc writes its seeds
// against the same ones): its pool (id 0) and one region besides (slot 1,
// generation 1).
constexpr std::uint64_t kPool = 1 << 20;
constexpr std::uint64_t kRegionId = (std::uint64_t{1} << 32) | 1;
constexpr std::uint64_t kRegion = 1 << 16;
constexpr std::uint64_t kMaxU64 = ~0ull;
// The most body a frame can announce: a hello's, a write's or a notification's.
constexpr std::size_t kMaxBody =
    std::max({wire::kHelloFixedLen + wire::kMaxName + wire::kHelloProofLen,
              std::size_t{wire::kMaxRuns * kvxfer::wire::kRunLen}, wire::kMaxMessage,
              wire::kNonceLen});

bool same(const wire::FrameHeader& a, const wire::FrameHeader& b) {
  return a.type == b.type && a.flags == b.flags && a.count == b.count && a.status == b.status &&
         a.seq == b.seq && a.length == b.length;
}

// The bounds tcp_frame.h's comments give each type, written out apart from
// decode_header.
bool in_bounds(const wire::FrameHeader& h) {
  const bool no_flags = h.flags == 0;
  switch (h.type) {
    case wire::FrameType::kChallenge:
      return h.count == 0 && h.length == 0 && no_flags && h.status == 0 && h.seq == 0;
    case wire::FrameType::kHello:
      return h.count >= 1 && h.count <= wire::kMaxName && h.length == 0 &&
             (no_flags || h.flags == wire::kEncrypt) && h.status == 0 && h.seq == 0;
    case wire::FrameType::kWelcome:
      return h.count == 0 && h.length == 0 && no_flags;
    case wire::FrameType::kWrite:
      return h.count >= 1 && h.count <= wire::kMaxRuns && h.length != 0 && h.status == 0 &&
             (h.flags == 0 || h.flags == wire::kMore || h.flags == wire::kNotifyFollows);
    case wire::FrameType::kReadReq:
      return h.count >= 1 && h.count <= wire::kMaxRuns && h.length != 0 && h.status == 0 &&
             (h.flags == 0 || h.flags == wire::kMore);
    case wire::FrameType::kNotify:
      return h.count == 0 && h.length >= 1 && h.length <= wire::kMaxMessage && no_flags &&
             h.status == 0;
    case wire::FrameType::kAck:
      return h.count == 0 && h.length == 0 && no_flags;
    case wire::FrameType::kReadData:
      return h.count == 0 && no_flags && (h.status == wire::kStatusOk || h.length == 0);
  }
  return false;
}

// Whether `runs` (h.count of them) lie in the regions they name (`len_of`,
// 0 for none), none empty, adding up to h.length: in 128 bits, where
// nothing wraps.
template <typename LenOf>
bool reference_fit(const wire::FrameHeader& h, std::span<const std::uint8_t> runs, LenOf len_of) {
  if (runs.size() != std::size_t{h.count} * kvxfer::wire::kRunLen) return false;
  const kvxfer::wire::RunList list{runs};
  u128 total = 0;
  for (std::size_t i = 0; i < list.run_count(); ++i) {
    const kvxfer::wire::Run r = list.run(i);
    if (r.length == 0 || static_cast<u128>(r.offset) + r.length > len_of(r.region)) return false;
    total += r.length;
  }
  return total == h.length;
}

// runs_fit, checked against the reference; a disagreement aborts.
template <typename LenOf>
bool checked_fit(const wire::FrameHeader& h, std::span<const std::uint8_t> runs, LenOf len_of) {
  const bool fits = runs_fit(h, runs, len_of);
  if (fits != reference_fit(h, runs, len_of)) std::abort();
  return fits;
}

bool hello_fits(const wire::FrameHeader& h, std::span<const std::uint8_t> body) {
  const wire::Hello sentinel{1, 2, 3, 4, "sentinel"};
  wire::Hello hello = sentinel;
  if (!wire::decode_hello_body(body, h.count, &hello)) {
    if (hello.token != sentinel.token || hello.lineage != sentinel.lineage ||
        hello.gen != sentinel.gen || hello.epoch != sentinel.epoch || hello.name != sentinel.name) {
      std::abort();
    }
    return false;
  }
  if (hello.lineage == 0 || hello.gen == 0 || hello.epoch == 0 || hello.name.size() != h.count) {
    std::abort();
  }
  // The name follows the fixed part and the proof ends the body, both views
  // of it; everything before the proof re-encodes to the same bytes.
  const auto* first = reinterpret_cast<const std::uint8_t*>(hello.name.data());
  if (first != body.data() + wire::kHelloFixedLen) std::abort();
  if (hello.proof.size() != wire::kHelloProofLen ||
      hello.proof.data() != body.data() + body.size() - wire::kHelloProofLen) {
    std::abort();
  }
  const auto signed_part = wire::hello_proven_part(body);
  std::vector<std::uint8_t> again(signed_part.size());
  wire::encode_hello_body(again.data(), hello);
  if (std::memcmp(again.data(), signed_part.data(), signed_part.size()) != 0) std::abort();
  return true;
}

bool runs_fit_regions(const wire::FrameHeader& h, std::span<const std::uint8_t> runs) {
  // Sizes where a sum or an end would wrap in 64 bits, and one the input
  // picks; only the receiver's regions decide.
  const auto huge = [](std::uint64_t) { return kMaxU64; };
  (void)checked_fit(h, runs, huge);
  (void)checked_fit(h, runs, [&h](std::uint64_t id) { return id == 0 ? h.seq : 0; });
  // Runs one byte short are never the runs the header counts.
  if (runs_fit(h, runs.first(runs.size() - 1), huge)) std::abort();
  return checked_fit(h, runs, [](std::uint64_t id) -> std::uint64_t {
    return id == 0 ? kPool : id == kRegionId ? kRegion : 0;
  });
}

}  // namespace

namespace kvxfer::fuzz {

bool accepts(std::span<const std::uint8_t> input) {
  if (input.size() < wire::kHeaderLen) return false;
  const auto bytes = input.first(wire::kHeaderLen);
  wire::FrameHeader sentinel;
  sentinel.type = wire::FrameType::kReadData;
  sentinel.flags = 9;
  sentinel.count = 9;
  sentinel.status = 9;
  sentinel.seq = 9;
  sentinel.length = 9;
  wire::FrameHeader h = sentinel;
  if (!wire::decode_header(bytes, &h)) {
    if (!same(h, sentinel)) std::abort();
    return false;
  }
  if (!in_bounds(h)) std::abort();
  // The fields re-encode to the same bytes; the tag is zero where the type
  // carries none (encode_header writes it zero).
  std::uint8_t again[wire::kHeaderLen];
  wire::encode_header(again, h);
  const bool untagged = h.type == wire::FrameType::kChallenge || h.type == wire::FrameType::kHello;
  if (std::memcmp(again, bytes.data(), untagged ? wire::kHeaderLen : wire::kFieldsLen) != 0) {
    std::abort();
  }

  // A decoded header never announces more body than a frame can have.
  const std::size_t body = body_len(h);
  if (body > kMaxBody) std::abort();
  const auto rest = input.subspan(wire::kHeaderLen);
  if (rest.size() < body) return false;
  const auto body_bytes = rest.first(body);
  switch (h.type) {
    case wire::FrameType::kChallenge: {
      std::array<std::uint8_t, wire::kNonceLen> nonce{};
      const auto frame = input.first(wire::kHeaderLen + body);
      if (!wire::decode_challenge(frame, &nonce) ||
          std::memcmp(nonce.data(), body_bytes.data(), nonce.size()) != 0) {
        std::abort();
      }
      return true;
    }
    case wire::FrameType::kHello:
      return hello_fits(h, body_bytes);
    case wire::FrameType::kWrite:
    case wire::FrameType::kReadReq:
      return runs_fit_regions(h, body_bytes);
    default:
      return true;
  }
}

}  // namespace kvxfer::fuzz
