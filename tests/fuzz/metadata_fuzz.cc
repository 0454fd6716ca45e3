// SPDX-License-Identifier: Apache-2.0
// Fuzz target for the metadata decoder (wire/metadata.h): accepted inputs
// decode to metadata that re-encodes to the same bytes; refused ones throw
// std::invalid_argument. Anything else (a crash, an over-read under ASan, a
// different exception, a mismatch) is a bug.
#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include "fuzz_target.h"
#include "wire/metadata.h"

namespace kvxfer::fuzz {

bool accepts(std::span<const std::uint8_t> input) {
  wire::AgentMetadata m;
  try {
    m = wire::decode(input);
  } catch (const std::invalid_argument&) {
    return false;
  }
  const auto again = wire::encode(m);
  if (!std::ranges::equal(again, input)) std::abort();
  return true;
}

}  // namespace kvxfer::fuzz
