// SPDX-License-Identifier: Apache-2.0
// Fuzz target for gather-read replies (wire/gather.h), which a target's
// handler sends back to the initiator. Accepted: exactly one well-formed
// reply header (a refusal announcing no bytes), which re-encodes to the same
// bytes and decodes again to an equal reply. Refused: anything else. A
// crash, an over-read or a mismatch is a bug.
#include <cstdlib>
#include <cstring>

#include "fuzz_target.h"
#include "wire/gather.h"

namespace kvxfer::fuzz {

bool accepts(std::span<const std::uint8_t> input) {
  using namespace internal::ucx;
  GatherReply a;
  if (!decode_gather_reply(input, &a)) return false;
  if (input.size() != kGatherReplyLen || (a.status != 0 && a.length != 0)) std::abort();
  std::uint8_t again[kGatherReplyLen];
  encode_gather_reply(again, a);
  if (std::memcmp(again, input.data(), kGatherReplyLen) != 0) std::abort();
  GatherReply b;
  if (!decode_gather_reply(std::span<const std::uint8_t>(again, kGatherReplyLen), &b)) {
    std::abort();
  }
  if (b.slot != a.slot || b.chunk != a.chunk || b.sequence != a.sequence || b.status != a.status ||
      b.length != a.length) {
    std::abort();
  }
  return true;
}

}  // namespace kvxfer::fuzz
