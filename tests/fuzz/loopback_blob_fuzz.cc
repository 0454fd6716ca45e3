// SPDX-License-Identifier: Apache-2.0
// Fuzz target for the loopback engine's blob (wire/loopback_blob.h),
// which a peer sends inside its metadata: accepted inputs decode to a blob
// that re-encodes to the same bytes and decodes again to an equal blob; every
// other input is refused. Anything else (a crash, an over-read under ASan, a
// mismatch) is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_target.h"
#include "wire/loopback_blob.h"

namespace kvxfer::fuzz {

bool accepts(std::span<const std::uint8_t> bytes) {
  using namespace kvxfer::wire;
  LoopbackBlob blob;
  if (!decode_loopback_blob(bytes, &blob)) return false;
  if (bytes.size() != kLoopbackBlobLen) __builtin_trap();
  const auto again = encode_loopback_blob(blob);
  if (!std::ranges::equal(again, bytes)) __builtin_trap();
  LoopbackBlob twice;
  if (!decode_loopback_blob(again, &twice) || twice.key != blob.key || twice.cookie != blob.cookie)
    __builtin_trap();
  return true;
}

}  // namespace kvxfer::fuzz
