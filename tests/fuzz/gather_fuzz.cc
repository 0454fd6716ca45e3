// SPDX-License-Identifier: Apache-2.0
// Fuzz target for the UCX lane's gather-read request (wire/gather.h), as the
// target's handler decodes it. Accepted: the whole input is one well-formed
// request, which re-encodes to the same bytes. Refused: anything else; then
// peek_gather_address must agree with the definition of "names a read"
// (enough bytes and the gather magic) and read the same fields. For every
// accepted request, gather_runs_fit must agree with a reference computed in
// 128 bits, for region lengths and limits at the edges. A crash, an
// over-read under ASan or a disagreement is a bug.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_target.h"
#include "wire/gather.h"

namespace kvxfer::fuzz {
namespace {

__extension__ typedef unsigned __int128 u128;  // __extension__: no -Wpedantic warning

using internal::ucx::GatherRequest;
using internal::ucx::GatherRun;

bool reference_fit(const GatherRequest& r, std::uint64_t region_len, std::uint64_t limit,
                   std::uint64_t* total) {
  u128 sum = 0;
  for (std::size_t i = 0; i < r.run_count(); ++i) {
    const GatherRun run = r.run(i);
    if (run.length == 0) return false;
    if (static_cast<u128>(run.offset) + run.length > region_len) return false;
    sum += run.length;
  }
  if (sum > limit) return false;
  *total = static_cast<std::uint64_t>(sum);
  return true;
}

void checked_fit(const GatherRequest& r, std::uint64_t region_len, std::uint64_t limit) {
  std::uint64_t got = 0;
  std::uint64_t want = 0;
  const bool fits = internal::ucx::gather_runs_fit(r, region_len, limit, &got);
  if (fits != reference_fit(r, region_len, limit, &want)) std::abort();
  if (fits && got != want) std::abort();
}

std::uint32_t load_u32(const std::uint8_t* at) { return wire::load_le<std::uint32_t>(at); }

}  // namespace

bool accepts(std::span<const std::uint8_t> input) {
  using namespace internal::ucx;
  GatherRequest r;
  if (!decode_gather_request(input, &r)) {
    GatherAddress a;
    const bool names = input.size() >= kGatherAddressLen && load_u32(input.data()) == kGatherMagic;
    if (peek_gather_address(input, &a) != names) std::abort();
    if (names && (a.slot != load_u32(input.data() + 24) || a.chunk != load_u32(input.data() + 28) ||
                  a.sequence != wire::load_le<std::uint64_t>(input.data() + 16))) {
      std::abort();
    }
    return false;
  }
  const std::size_t count = r.run_count();
  if (count == 0 || count > kMaxGatherRuns || input.size() != gather_request_len(count)) {
    std::abort();
  }
  std::vector<std::uint8_t> again(gather_request_len(count));
  put_gather_fixed(again.data(), static_cast<std::uint16_t>(count), r.token, r.sequence, r.slot,
                   r.chunk, r.lineage, r.epoch);
  std::uint64_t sum = 0;  // wraps on purpose: one of the limits tried below
  std::uint64_t region = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const GatherRun run = r.run(i);
    put_gather_run(again.data(), i, run.offset, run.length);
    sum += run.length;
    if (run.offset + run.length > region) region = run.offset + run.length;
  }
  if (std::memcmp(again.data(), input.data(), input.size()) != 0) std::abort();
  // A request that decodes also names its read.
  GatherAddress a;
  if (!peek_gather_address(input, &a) || a.slot != r.slot || a.chunk != r.chunk ||
      a.sequence != r.sequence) {
    std::abort();
  }
  for (const std::uint64_t region_len :
       {std::uint64_t{1} << 30, region, region - 1, ~std::uint64_t{0}}) {
    for (const std::uint64_t limit : {kMaxGatherBytes, sum, sum - 1, ~std::uint64_t{0}}) {
      checked_fit(r, region_len, limit);
    }
  }
  return true;
}

}  // namespace kvxfer::fuzz
