// SPDX-License-Identifier: Apache-2.0
// The libFuzzer entry point of every target: the decision itself is
// kvxfer::fuzz::accepts (fuzz_target.h), which the corpus replay also calls.
#include <cstddef>
#include <cstdint>

#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  (void)kvxfer::fuzz::accepts(std::span<const std::uint8_t>(data, size));
  return 0;
}
