// SPDX-License-Identifier: Apache-2.0
// Fuzz target for the UCX lane's fence (wire/fence.h), the first message an
// initiator sends on every endpoint. Accepted: exactly one well-formed
// version-2 fence (nonzero lineage, gen and epoch, a name of
// 1..kMaxFenceName bytes inside the input), which re-encodes to the same
// bytes. Refused: anything else, and then the output is left alone. A crash,
// an over-read or a mismatch is a bug.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_target.h"
#include "wire/fence.h"

namespace kvxfer::fuzz {

bool accepts(std::span<const std::uint8_t> input) {

  const wire::Fence sentinel{1, 2, 3, 4, "sentinel"};
  wire::Fence f = sentinel;
  if (!wire::decode_fence(input, &f)) {
    if (f.token != sentinel.token || f.lineage != sentinel.lineage || f.gen != sentinel.gen ||
        f.epoch != sentinel.epoch || f.name != sentinel.name) {
      std::abort();
    }
    return false;
  }
  if (f.lineage == 0 || f.gen == 0 || f.epoch == 0 || f.name.empty() ||
      f.name.size() > wire::kMaxFenceName || input.size() != wire::fence_len(f.name.size())) {
    std::abort();
  }
  // The name lies inside the input.
  const auto* first = reinterpret_cast<const std::uint8_t*>(f.name.data());
  if (first < input.data() || first + f.name.size() > input.data() + input.size()) std::abort();
  std::vector<std::uint8_t> again(input.size());
  wire::encode_fence(again.data(), f);
  if (std::memcmp(again.data(), input.data(), input.size()) != 0) std::abort();
  return true;
}

}  // namespace kvxfer::fuzz
