// SPDX-License-Identifier: Apache-2.0
// The caller's block indices, checked before anything is posted: each index
// in range, and no remote block named twice in one write. Pure functions of
// the indices; touches nothing else.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace kvxfer::internal {

// Throws std::invalid_argument naming the first index outside [0, num_blocks),
// e.g. "remote_idxs[2] = 37 is out of range [0, 32)". `what` names the list.
void check_range(std::span<const std::int64_t> idxs, std::uint64_t num_blocks, const char* what);
void check_range(std::span<const std::int32_t> idxs, std::uint64_t num_blocks, const char* what);

// Copies a caller's indices into `to` (resized to match; it keeps its
// capacity) and says whether every copied index lies in [0, num_blocks):
// one pass over the caller's memory, with no branch per index, instead of a
// copy and then a check. On false, check_range over the copy names the first
// bad index. num_blocks above 2^63 is treated as 2^63.
bool copy_in_range(std::span<const std::int64_t> from, std::vector<std::int64_t>& to,
                   std::uint64_t num_blocks);
bool copy_in_range(std::span<const std::int32_t> from, std::vector<std::int64_t>& to,
                   std::uint64_t num_blocks);

// A set of block indices for one write's duplicate check: open addressing
// over reused storage, emptied in O(1) by bumping a stamp, so checking n
// indices costs O(n) and allocates only when a write is larger than any
// before it.
class IndexSet {
 public:
  // Returns false if `index` was already inserted since the last reset().
  bool insert(std::int64_t index) {
    std::size_t slot = hash(index);
    for (;;) {
      Slot& s = slots_[slot];
      if (s.stamp != stamp_) {
        s.stamp = stamp_;
        s.index = index;
        return true;
      }
      if (s.index == index) return false;
      slot = (slot + 1) & mask_;
    }
  }

  // Empties the set, sized for up to n inserts at a load of at most 1/2.
  void reset(std::size_t n);

  // How many slots the set holds (for tests: growth, and no growth on reuse).
  [[nodiscard]] std::size_t capacity() const noexcept { return slots_.size(); }

  // Duplicate check of indices already checked to lie in [0, num_blocks),
  // num_blocks <= kBitmapMaxBlocks: one bit per block of the pool instead of
  // a hash probe (about 1 ns per index instead of 6 here). Returns the index
  // of the first repeat, or -1. The bitmap is grown to the largest pool seen
  // (words of 64 bits, allocated only then) and all zero again on return.
  static constexpr std::uint64_t kBitmapMaxBlocks = std::uint64_t{1} << 22;  // 512 KiB of bits
  template <typename Int>
  std::int64_t first_repeat_in_bitmap(std::span<const Int> idxs, std::uint64_t num_blocks) {
    const std::size_t words = static_cast<std::size_t>((num_blocks + 63) / 64);
    if (bits_.size() < words) bits_.resize(words, 0);
    std::int64_t repeat = -1;
    std::size_t i = 0;
    for (; i < idxs.size(); ++i) {
      const auto v = static_cast<std::uint64_t>(idxs[i]);
      const std::uint64_t bit = std::uint64_t{1} << (v & 63);
      std::uint64_t& word = bits_[static_cast<std::size_t>(v >> 6)];
      if ((word & bit) != 0) {
        repeat = static_cast<std::int64_t>(v);
        break;
      }
      word |= bit;
    }
    // Every bit set above belongs to this call: zero their words.
    for (std::size_t k = 0; k < i; ++k)
      bits_[static_cast<std::size_t>(static_cast<std::uint64_t>(idxs[k]) >> 6)] = 0;
    return repeat;
  }
  // Whether a list made of few runs of consecutive indices (a long prompt's
  // blocks) has no index twice: runs that do not overlap, checked over the
  // runs, sorted, in O(R log R) instead of a probe per index. nullopt when
  // the list has more than one run per kRunsCheckMinLen indices (a random
  // list): then the per-index check is the cheaper one. Scratch storage is
  // reused, so it allocates only when a list has more runs than any before.
  static constexpr std::size_t kRunsCheckMinLen = 8;
  template <typename Int>
  std::optional<bool> runs_disjoint(std::span<const Int> idxs) {
    runs_.clear();
    const std::size_t most = idxs.size() / kRunsCheckMinLen;
    std::size_t start = 0;
    for (std::size_t i = 1; i <= idxs.size(); ++i) {
      if (i < idxs.size() &&
          static_cast<std::int64_t>(idxs[i]) == static_cast<std::int64_t>(idxs[i - 1]) + 1) {
        continue;
      }
      if (runs_.size() == most) return std::nullopt;
      runs_.push_back(
          Run{static_cast<std::int64_t>(idxs[start]), static_cast<std::int64_t>(idxs[i - 1])});
      start = i;
    }
    std::sort(runs_.begin(), runs_.end(),
              [](const Run& a, const Run& b) { return a.first < b.first; });
    for (std::size_t k = 1; k < runs_.size(); ++k) {
      if (runs_[k].first <= runs_[k - 1].last) return false;
    }
    return true;
  }

  // Words of the bitmap (for tests: it stays zero between calls).
  [[nodiscard]] const std::vector<std::uint64_t>& bitmap() const noexcept { return bits_; }

 private:
  friend class IndexSetTestPeer;

  struct Slot {
    std::uint64_t stamp = 0;
    std::int64_t index = 0;
  };
  [[nodiscard]] std::size_t hash(std::int64_t index) const {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(index) * 0x9E3779B97F4A7C15ull) >>
                                    32) &
           mask_;
  }

  struct Run {
    std::int64_t first = 0;
    std::int64_t last = 0;  // inclusive
  };

  std::vector<Slot> slots_;
  std::vector<std::uint64_t> bits_;
  std::vector<Run> runs_;
  std::size_t mask_ = 0;
  std::uint64_t stamp_ = 0;
};

// Two pairs writing one remote block would race, so a write may not name a
// remote block twice. Throws std::invalid_argument naming the first repeated
// block, e.g. "remote_idxs repeats block 5 within one write". `seen` is
// scratch storage reused across calls.
void check_no_duplicates(std::span<const std::int64_t> idxs, IndexSet& seen, const char* what);
void check_no_duplicates(std::span<const std::int32_t> idxs, IndexSet& seen, const char* what);
// The same for indices already checked to lie in [0, num_blocks): over a
// bitmap of the pool's blocks when it has at most IndexSet::kBitmapMaxBlocks,
// else as above.
void check_no_duplicates(std::span<const std::int64_t> idxs, std::uint64_t num_blocks,
                         IndexSet& seen, const char* what);

}  // namespace kvxfer::internal
