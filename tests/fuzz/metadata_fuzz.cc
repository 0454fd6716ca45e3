// libFuzzer target for the metadata decoder: any input either decodes to
// metadata that re-encodes to the same bytes, or is refused with
// std::invalid_argument. Anything else (a crash, an over-read under ASan, a
// different exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <stdexcept>

#include "wire/metadata.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  try {
    const auto m = kvxfer::wire::decode(bytes);
    const auto again = kvxfer::wire::encode(m);
    if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
