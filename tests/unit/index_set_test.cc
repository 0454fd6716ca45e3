// SPDX-License-Identifier: Apache-2.0
// The caller's indices, checked before anything is posted: the range check
// names the offending index and value; the duplicate check finds every
// repeat, none that is not one, and stays O(n) per write over reused storage.
#include "core/index_set.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvxfer::internal {

// Reaches into the set's storage: a stamp near its wrap, and how many slots
// still hold an entry from some earlier write.
class IndexSetTestPeer {
 public:
  static void set_stamp(IndexSet& set, std::uint64_t stamp) { set.stamp_ = stamp; }
  static std::size_t stale_slots(const IndexSet& set) {
    std::size_t n = 0;
    for (const auto& slot : set.slots_) n += slot.stamp != 0 && slot.stamp != set.stamp_;
    return n;
  }
};

namespace {

// The message check_range throws for `idxs`, or "" when it accepts them.
template <typename Int>
std::string range_error(const std::vector<Int>& idxs, std::uint64_t num_blocks, const char* what) {
  try {
    check_range(std::span<const Int>(idxs), num_blocks, what);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

template <typename Int>
std::string duplicate_error(const std::vector<Int>& idxs, IndexSet& seen) {
  try {
    check_no_duplicates(std::span<const Int>(idxs), seen, "remote_idxs");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(IndexSetTest, SecondInsertOfAnIndexIsADuplicate) {
  IndexSet set;
  set.reset(3);
  EXPECT_TRUE(set.insert(5));
  EXPECT_TRUE(set.insert(9));
  EXPECT_FALSE(set.insert(5));
  EXPECT_FALSE(set.insert(9));
}

TEST(IndexSetTest, DistinctIndicesAreNeverDuplicates) {
  IndexSet set;
  set.reset(3000);
  for (std::int64_t i = 0; i < 1000; ++i) EXPECT_TRUE(set.insert(i)) << i;
  // Multiples of a large power of two land on few hash slots: long probes.
  for (std::int64_t i = 1; i <= 1000; ++i) EXPECT_TRUE(set.insert(i << 32)) << i;
  for (std::int64_t i = 1; i <= 1000; ++i) EXPECT_TRUE(set.insert(-i)) << -i;
}

TEST(IndexSetTest, ResetForgetsEveryEarlierIndex) {
  IndexSet set;
  for (int round = 0; round < 100; ++round) {
    set.reset(64);
    for (std::int64_t i = 0; i < 64; ++i) EXPECT_TRUE(set.insert(i)) << round << " " << i;
  }
}

TEST(IndexSetTest, ResetClearsNoSlotsAndKeepsItsStorage) {
  IndexSet set;
  set.reset(100);
  const std::size_t capacity = set.capacity();
  for (std::int64_t i = 0; i < 100; ++i) ASSERT_TRUE(set.insert(i));

  set.reset(100);

  // O(1): the old entries are still in their slots, only outdated.
  EXPECT_EQ(IndexSetTestPeer::stale_slots(set), 100u);
  EXPECT_EQ(set.capacity(), capacity);
  for (std::int64_t i = 0; i < 100; ++i) EXPECT_TRUE(set.insert(i)) << i;
  set.reset(10);
  EXPECT_EQ(set.capacity(), capacity);
}

TEST(IndexSetTest, StampWrapForgetsEntriesOfTheFirstStamp) {
  IndexSet set;
  set.reset(4);  // stamp 1
  ASSERT_TRUE(set.insert(7));
  IndexSetTestPeer::set_stamp(set, std::numeric_limits<std::uint64_t>::max());

  set.reset(4);  // the stamp wraps back to 1, the stamp 7 was inserted under

  EXPECT_TRUE(set.insert(7));
  EXPECT_FALSE(set.insert(7));
}

TEST(IndexSetTest, GrowsForAWriteLargerThanAnyBefore) {
  IndexSet set;
  set.reset(4);
  EXPECT_EQ(set.capacity(), 16u);
  ASSERT_TRUE(set.insert(3));

  set.reset(1000);

  EXPECT_GE(set.capacity(), 2000u);
  for (std::int64_t i = 0; i < 1000; ++i) EXPECT_TRUE(set.insert(i)) << i;
  for (std::int64_t i = 0; i < 1000; ++i) EXPECT_FALSE(set.insert(i)) << i;
}

TEST(CheckRangeTest, IndicesInRangeAreAccepted) {
  EXPECT_EQ(range_error<std::int64_t>({0, 5, 31}, 32, "local_idxs"), "");
  EXPECT_EQ(range_error<std::int32_t>({31, 0}, 32, "local_idxs"), "");
}

TEST(CheckRangeTest, IndexPastTheEndNamesItsPositionAndValue) {
  EXPECT_EQ(range_error<std::int64_t>({0, 1, 37}, 32, "remote_idxs"),
            "remote_idxs[2] = 37 is out of range [0, 32)");
  EXPECT_EQ(range_error<std::int64_t>({32}, 32, "local_idxs"),
            "local_idxs[0] = 32 is out of range [0, 32)");
}

TEST(CheckRangeTest, NegativeIndexNamesItsPositionAndValue) {
  EXPECT_EQ(range_error<std::int64_t>({4, -1}, 32, "local_idxs"),
            "local_idxs[1] = -1 is out of range [0, 32)");
  EXPECT_EQ(range_error<std::int32_t>({-7}, 32, "remote_idxs"),
            "remote_idxs[0] = -7 is out of range [0, 32)");
}

// copy_in_range copies every index whatever it finds, and its answer agrees
// with check_range at each edge of the range and of the integer types.
template <typename Int>
bool copied_in_range(const std::vector<Int>& idxs, std::uint64_t num_blocks) {
  std::vector<std::int64_t> to(3, 99);  // holds stale entries before the copy
  const bool ok = copy_in_range(std::span<const Int>(idxs), to, num_blocks);
  EXPECT_EQ(to, std::vector<std::int64_t>(idxs.begin(), idxs.end()));
  EXPECT_EQ(ok, range_error(idxs, num_blocks, "local_idxs").empty());
  return ok;
}

TEST(CopyInRangeTest, CopiesTheListAndFindsAnIndexOutsideTheRangeAnywhereInIt) {
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  EXPECT_TRUE(copied_in_range<std::int64_t>({0, 5, 31}, 32));
  EXPECT_TRUE(copied_in_range<std::int64_t>({}, 32));
  EXPECT_FALSE(copied_in_range<std::int64_t>({32}, 32));
  EXPECT_FALSE(copied_in_range<std::int64_t>({-1}, 32));
  EXPECT_FALSE(copied_in_range<std::int64_t>({kMin}, 32));
  EXPECT_FALSE(copied_in_range<std::int64_t>({kMax}, 32));
  EXPECT_FALSE(copied_in_range<std::int64_t>({0}, 0));
  EXPECT_TRUE(copied_in_range<std::int64_t>({kMax - 1}, std::uint64_t{1} << 63));
  EXPECT_TRUE(copied_in_range<std::int64_t>({kMax}, ~std::uint64_t{0}));
  EXPECT_FALSE(copied_in_range<std::int64_t>({-1}, ~std::uint64_t{0}));
  EXPECT_TRUE(copied_in_range<std::int32_t>({std::numeric_limits<std::int32_t>::max()},
                                            std::uint64_t{1} << 31));
  EXPECT_FALSE(copied_in_range<std::int32_t>({std::numeric_limits<std::int32_t>::min()}, 32));
  // One bad index at every position of a long list (the vectorized body,
  // and the scalar tail after it), with good ones all around.
  for (std::size_t at = 0; at < 67; ++at) {
    for (const std::int64_t bad : {std::int64_t{64}, std::int64_t{-1}, kMin, kMax}) {
      std::vector<std::int64_t> idxs(67);
      for (std::size_t i = 0; i < idxs.size(); ++i) idxs[i] = static_cast<std::int64_t>(i % 64);
      idxs[at] = bad;
      EXPECT_FALSE(copied_in_range(idxs, 64)) << "bad " << bad << " at " << at;
    }
  }
}

TEST(CheckNoDuplicatesTest, RepeatedBlockIsNamed) {
  IndexSet seen;
  EXPECT_EQ(duplicate_error<std::int64_t>({5, 9, 5}, seen),
            "remote_idxs repeats block 5 within one write");
  EXPECT_EQ(duplicate_error<std::int32_t>({2, 1, 1}, seen),
            "remote_idxs repeats block 1 within one write");
}

TEST(CheckNoDuplicatesTest, UnorderedDistinctBlocksAreAccepted) {
  IndexSet seen;
  EXPECT_EQ(duplicate_error<std::int64_t>({9, 5, 7, 0}, seen), "");
  EXPECT_EQ(duplicate_error<std::int64_t>({9, 5, 7, 0}, seen), "");
}

std::string bitmap_duplicate_error(const std::vector<std::int64_t>& idxs, std::uint64_t num_blocks,
                                   IndexSet& seen) {
  try {
    check_no_duplicates(std::span<const std::int64_t>(idxs), num_blocks, seen, "remote_idxs");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(CheckNoDuplicatesTest, BitmapFindsRepeatsAndIsZeroAgainAfterEveryCall) {
  IndexSet seen;
  EXPECT_EQ(bitmap_duplicate_error({5, 9, 5}, 200, seen),
            "remote_idxs repeats block 5 within one write");
  EXPECT_EQ(bitmap_duplicate_error({199, 0, 64, 63, 1, 0}, 200, seen),
            "remote_idxs repeats block 0 within one write");
  ASSERT_EQ(seen.bitmap().size(), 4u);  // 200 bits in 64-bit words
  for (const std::uint64_t word : seen.bitmap()) EXPECT_EQ(word, 0u);
  // Nothing of the failed calls is remembered.
  EXPECT_EQ(bitmap_duplicate_error({9, 5, 199, 0, 64, 63}, 200, seen), "");
  for (const std::uint64_t word : seen.bitmap()) EXPECT_EQ(word, 0u);
  EXPECT_EQ(seen.capacity(), 0u);  // the hash set was not used
}

TEST(CheckNoDuplicatesTest, PoolsPastTheBitmapLimitUseTheHashSet) {
  IndexSet seen;
  const std::uint64_t huge = IndexSet::kBitmapMaxBlocks + 1;
  EXPECT_EQ(bitmap_duplicate_error({7, 3, 7}, huge, seen),
            "remote_idxs repeats block 7 within one write");
  EXPECT_EQ(bitmap_duplicate_error({7, 3, 8}, huge, seen), "");
  EXPECT_TRUE(seen.bitmap().empty());
  EXPECT_GT(seen.capacity(), 0u);
}

TEST(CheckNoDuplicatesTest, IncreasingListNeedsNoSet) {
  IndexSet seen;
  EXPECT_EQ(duplicate_error<std::int64_t>({0, 1, 2, 40, 41}, seen), "");
  EXPECT_EQ(seen.capacity(), 0u);
}

// first..last inclusive, appended to `out`.
void append_run(std::vector<std::int64_t>& out, std::int64_t first, std::int64_t last) {
  for (std::int64_t i = first; i <= last; ++i) out.push_back(i);
}

TEST(CheckNoDuplicatesTest, RunsThatDoNotOverlapNeedNeitherSetNorBitmap) {
  std::vector<std::int64_t> idxs;
  append_run(idxs, 32, 47);
  append_run(idxs, 0, 15);
  append_run(idxs, 64, 79);
  append_run(idxs, 16, 31);  // touches both neighbours, overlaps neither
  IndexSet seen;
  EXPECT_EQ(duplicate_error(idxs, seen), "");
  EXPECT_EQ(bitmap_duplicate_error(idxs, 200, seen), "");
  EXPECT_EQ(seen.capacity(), 0u);
  EXPECT_TRUE(seen.bitmap().empty());
  const std::vector<std::int32_t> narrow(idxs.begin(), idxs.end());
  EXPECT_EQ(duplicate_error(narrow, seen), "");
  EXPECT_EQ(seen.runs_disjoint(std::span<const std::int64_t>(idxs)), std::optional<bool>(true));
}

TEST(CheckNoDuplicatesTest, OverlappingRunsNameTheFirstRepeatInListOrder) {
  std::vector<std::int64_t> idxs;
  append_run(idxs, 32, 47);
  append_run(idxs, 0, 15);
  append_run(idxs, 44, 59);  // 44..47 again
  IndexSet seen;
  EXPECT_EQ(seen.runs_disjoint(std::span<const std::int64_t>(idxs)), std::optional<bool>(false));
  EXPECT_EQ(duplicate_error(idxs, seen), "remote_idxs repeats block 44 within one write");
  EXPECT_EQ(bitmap_duplicate_error(idxs, 200, seen),
            "remote_idxs repeats block 44 within one write");
  for (const std::uint64_t word : seen.bitmap()) EXPECT_EQ(word, 0u);
  // The same run twice.
  std::vector<std::int64_t> twice;
  append_run(twice, 8, 23);
  append_run(twice, 8, 23);
  EXPECT_EQ(bitmap_duplicate_error(twice, 200, seen),
            "remote_idxs repeats block 8 within one write");
}

TEST(CheckNoDuplicatesTest, ListsOfShortRunsGoToThePerIndexCheck) {
  IndexSet seen;
  // More than one run per kRunsCheckMinLen indices: no verdict from runs.
  const std::vector<std::int64_t> scattered = {9,  5,  7,  0, 3,  11, 2,  30,
                                               31, 20, 21, 1, 40, 13, 17, 6};
  EXPECT_EQ(seen.runs_disjoint(std::span<const std::int64_t>(scattered)), std::nullopt);
  EXPECT_EQ(duplicate_error(scattered, seen), "");
  EXPECT_GT(seen.capacity(), 0u);  // the hash set did the check
  std::vector<std::int64_t> repeat = scattered;
  repeat.push_back(31);
  EXPECT_EQ(bitmap_duplicate_error(repeat, 200, seen),
            "remote_idxs repeats block 31 within one write");
}

}  // namespace
}  // namespace kvxfer::internal
