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

  const wire::NotifyAck sentinel{1, 2, 3};
  wire::NotifyAck a = sentinel;
  if (!wire::decode_ack(input, &a)) {
    if (a.slot != sentinel.slot || a.sequence != sentinel.sequence || a.status != sentinel.status) {
      std::abort();
    }
    return false;
  }
  std::uint8_t again[wire::kAckLen];
  wire::encode_ack(again, a);
  if (input.size() != wire::kAckLen || std::memcmp(again, input.data(), wire::kAckLen) != 0) std::abort();
  wire::NotifyAck b;
  if (!wire::decode_ack(std::span<const std::uint8_t>(again, wire::kAckLen), &b)) std::abort();
  if (b.slot != a.slot || b.sequence != a.sequence || b.status != a.status) std::abort();
  return true;
}

}  // namespace kvxfer::fuzz
