// SPDX-License-Identifier: Apache-2.0
// Fuzz target for the same-host cookie's declaration (wire/cookie.h), the
// bytes a peer reads from a target's cookie page at connect. Accepted:
// exactly one well-formed declaration (nonzero epoch, a non-empty pool that
// ends inside the address space, no pool fd or one that is an int, the same
// for the cookie fd), which
// re-encodes to the same bytes.
// Refused: anything else, and then the output is left alone. A crash, an
// over-read or a mismatch is a bug.
#include <cstdlib>
#include <cstring>

#include "common/region.h"
#include "fuzz_target.h"
#include "wire/cookie.h"

namespace kvxfer::fuzz {

bool accepts(std::span<const std::uint8_t> input) {
  using namespace wire;
  const CookieDeclaration sentinel{1, 2, 3, 4, 5, 6, 7};
  CookieDeclaration d = sentinel;
  if (!decode_cookie(input, &d)) {
    if (d.epoch != sentinel.epoch || d.base_addr != sentinel.base_addr ||
        d.num_blocks != sentinel.num_blocks || d.block_len != sentinel.block_len ||
        d.pool_fd != sentinel.pool_fd || d.pool_offset != sentinel.pool_offset ||
        d.cookie_fd != sentinel.cookie_fd) {
      std::abort();
    }
    return false;
  }
  const bool no_pool = d.base_addr == 0 && d.num_blocks == 0 && d.block_len == 0;
  if (input.size() != kCookieLen || d.epoch == 0 ||
      (!no_pool && !internal::region_is_valid(d.base_addr, d.num_blocks, d.block_len))) {
    std::abort();
  }
  // A descriptor is an int, and there is no offset without one, nor one
  // without a pool.
  if (d.pool_fd == kNoFd ? d.pool_offset != 0 : (d.pool_fd > kMaxFd || no_pool)) std::abort();
  // A table stays inside the address space.
  if (d.table_slots > kCookieMaxSlots || d.table_addr % 8 != 0 ||
      d.table_addr > ~std::uint64_t{0} - std::uint64_t{d.table_slots} * kRegionEntryLen) {
    std::abort();
  }
  if (d.cookie_fd != kNoFd && d.cookie_fd > kMaxFd) std::abort();
  // The epoch read_cookie reads alone is the declaration's.
  if (load_le<std::uint64_t>(input.data() + kCookieEpochAt) != d.epoch) std::abort();
  std::uint8_t again[kCookieLen];
  encode_cookie(again, d);
  if (std::memcmp(again, input.data(), kCookieLen) != 0) std::abort();
  return true;
}

}  // namespace kvxfer::fuzz
