// SPDX-License-Identifier: Apache-2.0
// Fuzz target for notification acks (wire/notify.h), which a target sends
// back to the initiator once it queued (or refused) a notification.
// Accepted: exactly one well-formed ack, which re-encodes to the same bytes
// and decodes again to an equal ack. Refused: anything else, and then the
// output is left alone. A crash, an over-read or a mismatch is a bug.
#include <cstdlib>
#include <cstring>

#include "fuzz_target.h"
#include "wire/notify.h"

namespace kvxfer::fuzz {

bool accepts(std::span<const std::uint8_t> input) {
  using namespace internal::ucx;
  const NotifyAck sentinel{1, 2, 3};
  NotifyAck a = sentinel;
  if (!decode_ack(input, &a)) {
    if (a.slot != sentinel.slot || a.sequence != sentinel.sequence || a.status != sentinel.status) {
      std::abort();
    }
    return false;
  }
  std::uint8_t again[kAckLen];
  encode_ack(again, a);
  if (input.size() != kAckLen || std::memcmp(again, input.data(), kAckLen) != 0) std::abort();
  NotifyAck b;
  if (!decode_ack(std::span<const std::uint8_t>(again, kAckLen), &b)) std::abort();
  if (b.slot != a.slot || b.sequence != a.sequence || b.status != a.status) std::abort();
  return true;
}

}  // namespace kvxfer::fuzz
