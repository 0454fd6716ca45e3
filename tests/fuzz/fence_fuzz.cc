// libFuzzer target for the UCX lane's fence (wire/fence.h): any input either
// decodes to a fence that re-encodes to the same bytes (with a nonzero
// lineage, gen and epoch), or is refused and leaves the output alone.
// Anything else (a crash, an over-read under ASan, a disagreement) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "wire/fence.h"

using namespace kvxfer::internal::ucx;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  const Fence sentinel{1, 2, 3, 4};
  Fence f = sentinel;
  if (!decode_fence(bytes, &f)) {
    if (f.token != sentinel.token || f.lineage != sentinel.lineage || f.gen != sentinel.gen ||
        f.epoch != sentinel.epoch) {
      std::abort();
    }
    return 0;
  }
  if (size != kFenceLen || f.lineage == 0 || f.gen == 0 || f.epoch == 0) std::abort();
  std::uint8_t again[kFenceLen];
  encode_fence(again, f);
  if (std::memcmp(again, data, kFenceLen) != 0) std::abort();
  return 0;
}
