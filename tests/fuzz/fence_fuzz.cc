// SPDX-License-Identifier: Apache-2.0
// Fuzz target for the UCX lane's fence (wire/fence.h), the first message an
// initiator sends on every endpoint. Accepted: exactly one well-formed fence
// (nonzero lineage, gen and epoch), which re-encodes to the same bytes.
// Refused: anything else, and then the output is left alone. A crash, an
// over-read or a mismatch is a bug.
#include <cstdlib>
#include <cstring>

#include "fuzz_target.h"
#include "wire/fence.h"

namespace kvxfer::fuzz {

bool accepts(std::span<const std::uint8_t> input) {
  using namespace internal::ucx;
  const Fence sentinel{1, 2, 3, 4};
  Fence f = sentinel;
  if (!decode_fence(input, &f)) {
    if (f.token != sentinel.token || f.lineage != sentinel.lineage || f.gen != sentinel.gen ||
        f.epoch != sentinel.epoch) {
      std::abort();
    }
    return false;
  }
  if (input.size() != kFenceLen || f.lineage == 0 || f.gen == 0 || f.epoch == 0) std::abort();
  std::uint8_t again[kFenceLen];
  encode_fence(again, f);
  if (std::memcmp(again, input.data(), kFenceLen) != 0) std::abort();
  return true;
}

}  // namespace kvxfer::fuzz
