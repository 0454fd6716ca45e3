// SPDX-License-Identifier: Apache-2.0
// Fuzz target for the scatter handler's decision on a message: input =
// u64 region length | u64 payload length | write header (wire/scatter.h).
// Accepted: the header decodes and its runs fit (scatter_runs_fit: every run
// non-empty and inside the region, the lengths adding up to the payload), so
// the handler would copy. Refused: anything else. scatter_runs_fit must agree
// with a slow reference that cannot overflow; a disagreement, a crash or an
// over-read is a bug.
#include <cstring>

#include "fuzz_target.h"
#include "scatter_reference.h"
#include "wire/scatter.h"

namespace kvxfer::fuzz {

bool accepts(std::span<const std::uint8_t> input) {
  using namespace internal::ucx;
  if (input.size() < 16) return false;
  std::uint64_t region_len = 0;
  std::uint64_t payload_len = 0;
  std::memcpy(&region_len, input.data(), 8);
  std::memcpy(&payload_len, input.data() + 8, 8);
  ScatterHeader h;
  if (!decode_scatter_header(input.subspan(16), &h)) return false;
  return checked_fit(h, region_len, payload_len);
}

}  // namespace kvxfer::fuzz
