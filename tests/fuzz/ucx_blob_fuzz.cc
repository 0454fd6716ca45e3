// SPDX-License-Identifier: Apache-2.0
// Fuzz target for the UCX engine's blob (wire/ucx_blob.h), which a peer
// sends inside its metadata: accepted inputs decode to a blob that
// re-encodes to the same bytes and decodes again to an equal blob; every
// other input is refused. Anything else (a crash, an over-read under ASan, a
// mismatch) is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_target.h"
#include "wire/ucx_blob.h"

namespace {

using namespace kvxfer::internal::ucx;

bool same_bytes(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) {
  return std::ranges::equal(a, b);
}

bool same_blob(const Blob& a, const Blob& b) {
  return a.flags == b.flags && a.pidns_dev == b.pidns_dev && a.pidns_ino == b.pidns_ino &&
         a.cookie_addr == b.cookie_addr && a.cookie_epoch == b.cookie_epoch &&
         same_bytes(a.worker_address, b.worker_address) && same_bytes(a.rkey, b.rkey) &&
         a.notify_fd == b.notify_fd;
}

// The decoded fields' views must lie inside the input.
bool inside(std::span<const std::uint8_t> field, std::span<const std::uint8_t> bytes) {
  if (field.empty()) return true;
  return field.data() >= bytes.data() && field.data() + field.size() <= bytes.data() + bytes.size();
}

}  // namespace

namespace kvxfer::fuzz {

bool accepts(std::span<const std::uint8_t> bytes) {
  using namespace internal::ucx;
  Blob blob;
  if (!decode_blob(bytes, &blob)) return false;
  if (!inside(blob.worker_address, bytes) || !inside(blob.rkey, bytes)) __builtin_trap();
  if (blob.worker_address.size() > kMaxBlobField || blob.rkey.size() > kMaxBlobField)
    __builtin_trap();
  const auto again = encode_blob(blob);
  if (!same_bytes(again, bytes)) __builtin_trap();
  Blob twice;
  if (!decode_blob(again, &twice) || !same_blob(blob, twice)) __builtin_trap();
  return true;
}

}  // namespace kvxfer::fuzz
