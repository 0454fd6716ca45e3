// libFuzzer target for the loopback engine's blob (wire/loopback_blob.h),
// which a peer sends inside its metadata: any input either decodes to a blob
// that re-encodes to the same bytes and decodes again to an equal blob, or is
// refused. Anything else (a crash, an over-read under ASan, a mismatch) is a
// bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "wire/loopback_blob.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kvxfer::wire;
  const std::span<const std::uint8_t> bytes(data, size);
  LoopbackBlob blob;
  if (!decode_loopback_blob(bytes, &blob)) return 0;
  if (size != kLoopbackBlobLen) __builtin_trap();
  const auto again = encode_loopback_blob(blob);
  if (!std::ranges::equal(again, bytes)) __builtin_trap();
  LoopbackBlob twice;
  if (!decode_loopback_blob(again, &twice) || twice.key != blob.key || twice.cookie != blob.cookie)
    __builtin_trap();
  return 0;
}
