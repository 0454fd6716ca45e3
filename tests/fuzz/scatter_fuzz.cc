// SPDX-License-Identifier: Apache-2.0
// Fuzz target for the UCX lane's scatter-write header (wire/scatter.h), as
// the target's handler decodes it. Accepted: the whole input is one
// well-formed write header, which re-encodes to the same bytes. Refused:
// anything else. For every accepted header, scatter_runs_fit must agree with
// a slow reference that cannot overflow, for region and payload lengths at
// the edges. Anything else (a crash, an over-read under ASan, a
// disagreement) is a bug. Whether the runs fit a given region is
// scatter_fit's verdict; acks are ack_fuzz's.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_target.h"
#include "scatter_reference.h"
#include "wire/scatter.h"

namespace kvxfer::fuzz {

bool accepts(std::span<const std::uint8_t> input) {
  using namespace internal::ucx;
  ScatterHeader h;
  if (!decode_scatter_header(input, &h)) return false;
  const std::size_t count = h.run_count();
  if (count == 0 || count > kMaxScatterRuns || h.runs.size() != count * kScatterRunLen)
    std::abort();
  if (input.size() != scatter_header_len(count)) std::abort();

  std::vector<std::uint8_t> again(scatter_header_len(count));
  put_scatter_fixed(again.data(), static_cast<std::uint16_t>(count), h.token, h.sequence, h.slot,
                    h.lineage, h.epoch);
  std::uint64_t sum = 0;  // wraps on purpose: one of the payloads tried below
  std::uint64_t region = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const ScatterRun r = h.run(i);
    put_scatter_run(again.data(), i, r.offset, r.length);
    sum += r.length;
    if (r.offset + r.length > region) region = r.offset + r.length;
  }
  if (std::memcmp(again.data(), input.data(), input.size()) != 0) std::abort();

  for (const std::uint64_t r : {std::uint64_t{1} << 30, region, region - 1, ~std::uint64_t{0}}) {
    for (const std::uint64_t p : {std::uint64_t{1} << 20, sum, sum - 1, sum + 1}) {
      (void)checked_fit(h, r, p);
    }
  }
  return true;
}

}  // namespace kvxfer::fuzz
