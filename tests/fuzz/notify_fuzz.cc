// SPDX-License-Identifier: Apache-2.0
// Fuzz target for the UCX lane's notification header (wire/notify.h), which
// a target decodes from every notification a peer sends. Accepted: exactly
// one well-formed version-1 header with a name of 1..kMaxNotifyName bytes,
// which re-encodes to the same bytes. Refused: anything else, and then the
// output is left alone. A crash, an over-read or a mismatch is a bug.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_target.h"
#include "wire/notify.h"

namespace kvxfer::fuzz {

bool accepts(std::span<const std::uint8_t> input) {

  const wire::NotifyHeader sentinel{1, 2, 3, 4, 5, "sentinel"};
  wire::NotifyHeader h = sentinel;
  if (!wire::decode_notify_header(input, &h)) {
    if (h.token != sentinel.token || h.sequence != sentinel.sequence || h.slot != sentinel.slot ||
        h.lineage != sentinel.lineage || h.epoch != sentinel.epoch || h.name != sentinel.name) {
      std::abort();
    }
    return false;
  }
  if (h.name.empty() || h.name.size() > wire::kMaxNotifyName ||
      input.size() != wire::notify_header_len(h.name.size())) {
    std::abort();
  }
  // The name lies inside the input.
  const auto* first = reinterpret_cast<const std::uint8_t*>(h.name.data());
  if (first < input.data() || first + h.name.size() > input.data() + input.size()) std::abort();
  std::vector<std::uint8_t> again(input.size());
  wire::encode_notify_header(again.data(), h);
  if (std::memcmp(again.data(), input.data(), input.size()) != 0) std::abort();
  return true;
}

}  // namespace kvxfer::fuzz
