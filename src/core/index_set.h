// The caller's block indices, checked before anything is posted: each index
// in range, and no remote block named twice in one write. Pure functions of
// the indices; touches nothing else.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvxfer::internal {

// Throws std::invalid_argument naming the first index outside [0, num_blocks),
// e.g. "remote_idxs[2] = 37 is out of range [0, 32)". `what` names the list.
void check_range(std::span<const std::int64_t> idxs, std::uint64_t num_blocks, const char* what);
void check_range(std::span<const std::int32_t> idxs, std::uint64_t num_blocks, const char* what);

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

  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  std::uint64_t stamp_ = 0;
};

// Two pairs writing one remote block would race, so a write may not name a
// remote block twice. Throws std::invalid_argument naming the first repeated
// block, e.g. "remote_idxs repeats block 5 within one write". `seen` is
// scratch storage reused across calls.
void check_no_duplicates(std::span<const std::int64_t> idxs, IndexSet& seen, const char* what);
void check_no_duplicates(std::span<const std::int32_t> idxs, IndexSet& seen, const char* what);

}  // namespace kvxfer::internal
