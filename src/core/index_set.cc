// SPDX-License-Identifier: Apache-2.0
#include "core/index_set.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace kvxfer::internal {
namespace {

template <typename Int>
void check_range_of(std::span<const Int> idxs, std::uint64_t num_blocks, const char* what) {
  for (std::size_t i = 0; i < idxs.size(); ++i) {
    const auto v = static_cast<std::int64_t>(idxs[i]);
    if (v < 0 || static_cast<std::uint64_t>(v) >= num_blocks) {
      throw std::invalid_argument(
          fmt::format("{}[{}] = {} is out of range [0, {})", what, i, v, num_blocks));
    }
  }
}

// v lies in [0, n) exactly when neither v nor (n - 1 - v) has its top bit
// set (n <= 2^63): OR both into an accumulator and read its top bit once at
// the end. Straight-line, so the compiler copies and checks several indices
// per instruction.
template <typename Int>
bool copy_in_range_of(std::span<const Int> from, std::vector<std::int64_t>& to,
                      std::uint64_t num_blocks) {
  constexpr std::uint64_t kTop = std::uint64_t{1} << 63;
  const std::uint64_t last = std::min(num_blocks, kTop) - 1;  // wraps to all ones for 0
  to.resize(from.size());
  const Int* const src = from.data();
  std::int64_t* const dst = to.data();
  std::uint64_t acc = 0;
  for (std::size_t i = 0; i < from.size(); ++i) {
    const auto v = static_cast<std::int64_t>(src[i]);
    dst[i] = v;
    acc |= static_cast<std::uint64_t>(v) | (last - static_cast<std::uint64_t>(v));
  }
  return (acc & kTop) == 0;
}

template <typename Int>
void check_no_duplicates_of(std::span<const Int> idxs, IndexSet& seen, const char* what) {
  // A strictly increasing list (the common case) has no duplicates.
  bool increasing = true;
  for (std::size_t i = 1; i < idxs.size() && increasing; ++i) increasing = idxs[i - 1] < idxs[i];
  if (increasing) return;
  // Few runs that do not overlap: no repeat. Overlapping ones fall through
  // to the per-index check, which names the first repeat.
  if (seen.runs_disjoint(idxs) == std::optional<bool>(true)) return;
  seen.reset(idxs.size());
  for (const Int r : idxs) {
    if (!seen.insert(r)) {
      throw std::invalid_argument(fmt::format("{} repeats block {} within one write", what, r));
    }
  }
}

}  // namespace

void check_range(std::span<const std::int64_t> idxs, std::uint64_t num_blocks, const char* what) {
  check_range_of(idxs, num_blocks, what);
}

void check_range(std::span<const std::int32_t> idxs, std::uint64_t num_blocks, const char* what) {
  check_range_of(idxs, num_blocks, what);
}

bool copy_in_range(std::span<const std::int64_t> from, std::vector<std::int64_t>& to,
                   std::uint64_t num_blocks) {
  return copy_in_range_of(from, to, num_blocks);
}

bool copy_in_range(std::span<const std::int32_t> from, std::vector<std::int64_t>& to,
                   std::uint64_t num_blocks) {
  return copy_in_range_of(from, to, num_blocks);
}

void check_no_duplicates(std::span<const std::int64_t> idxs, IndexSet& seen, const char* what) {
  check_no_duplicates_of(idxs, seen, what);
}

void check_no_duplicates(std::span<const std::int32_t> idxs, IndexSet& seen, const char* what) {
  check_no_duplicates_of(idxs, seen, what);
}

void check_no_duplicates(std::span<const std::int64_t> idxs, std::uint64_t num_blocks,
                         IndexSet& seen, const char* what) {
  if (num_blocks > IndexSet::kBitmapMaxBlocks) {
    check_no_duplicates_of(idxs, seen, what);
    return;
  }
  // A strictly increasing list (the common case) has no duplicates.
  bool increasing = true;
  for (std::size_t i = 1; i < idxs.size() && increasing; ++i) increasing = idxs[i - 1] < idxs[i];
  if (increasing) return;
  if (seen.runs_disjoint(idxs) == std::optional<bool>(true)) return;
  if (const std::int64_t repeat = seen.first_repeat_in_bitmap(idxs, num_blocks); repeat >= 0) {
    throw std::invalid_argument(fmt::format("{} repeats block {} within one write", what, repeat));
  }
}

void IndexSet::reset(std::size_t n) {
  std::size_t capacity = 16;
  while (capacity < 2 * n) capacity *= 2;
  if (capacity > slots_.size()) {
    slots_.assign(capacity, Slot{});
    stamp_ = 0;
  }
  mask_ = slots_.size() - 1;
  if (++stamp_ == 0) {  // wrapped: old stamps could collide
    std::fill(slots_.begin(), slots_.end(), Slot{});
    stamp_ = 1;
  }
}

}  // namespace kvxfer::internal
