// SPDX-License-Identifier: Apache-2.0
// Fuzz target for scatter acks (wire/scatter.h), which a target's handler
// sends back to the initiator. Accepted: exactly one well-formed ack, which
// re-encodes to the same bytes and decodes again to an equal ack. Refused:
// anything else. A crash, an over-read or a mismatch is a bug.
#include <cstdlib>
#include <cstring>

#include "fuzz_target.h"
#include "wire/scatter.h"

namespace kvxfer::fuzz {

bool accepts(std::span<const std::uint8_t> input) {
  using namespace internal::ucx;
  ScatterAck a;
  if (!decode_ack(input, &a)) return false;
  std::uint8_t again[kAckLen];
  encode_ack(again, a);
  if (input.size() != kAckLen || std::memcmp(again, input.data(), kAckLen) != 0) std::abort();
  ScatterAck b;
  if (!decode_ack(std::span<const std::uint8_t>(again, kAckLen), &b)) std::abort();
  if (b.slot != a.slot || b.sequence != a.sequence || b.status != a.status) std::abort();
  return true;
}

}  // namespace kvxfer::fuzz
