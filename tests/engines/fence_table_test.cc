// SPDX-License-Identifier: Apache-2.0
// FenceTable (engines/fence_table.h): the target's fences, one rule for the
// tcp and ucx lanes. A lineage is one identity's; an older registration is
// stale, a newer one replaces it; a full table refuses new lineages and
// forgets none early, except past its linger with nothing using it; an
// identity with room of its own gets a few lineages past the bound.
#include "engines/fence_table.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace kvxfer::internal {
namespace {

using Table = FenceTable<std::string, std::vector<int>>;
using Verdict = Table::Verdict;
using Clock = Table::Clock;
using std::chrono::seconds;

constexpr Table::Limits kLimits{/*max_lineages=*/3, /*own_room=*/2, /*linger=*/seconds(10)};

TEST(FenceTableTest, NewerReplacesOlderAndSameEpochJoinsAnythingElseIsStale) {
  Table t(kLimits);
  const auto now = Clock::now();
  auto p = t.present(7, 2, 100, "a", false, now);
  ASSERT_EQ(p.verdict, Verdict::kNew);
  p.entry->extra.push_back(1);
  EXPECT_EQ(t.present(7, 2, 100, "a", false, now).verdict, Verdict::kSame);
  EXPECT_EQ(t.present(7, 2, 101, "a", false, now).verdict,
            Verdict::kStale);  // same gen, other epoch
  EXPECT_EQ(t.present(7, 1, 100, "a", false, now).verdict, Verdict::kStale);  // older gen
  p = t.present(7, 3, 200, "a", false, now);
  ASSERT_EQ(p.verdict, Verdict::kNewer);
  EXPECT_EQ(p.entry->gen, 3u);
  EXPECT_EQ(p.entry->epoch, 200u);
  EXPECT_EQ(p.entry->extra, std::vector<int>{1});  // the older one's, for the lane to let go
  EXPECT_EQ(t.present(7, 2, 100, "a", false, now).verdict, Verdict::kStale);  // the replaced one
}

TEST(FenceTableTest, ALineageIsOneIdentitys) {
  Table t(kLimits);
  const auto now = Clock::now();
  ASSERT_EQ(t.present(7, 1, 100, "a", false, now).verdict, Verdict::kNew);
  EXPECT_EQ(t.present(7, 2, 200, "b", false, now).verdict, Verdict::kNotYours);
  EXPECT_EQ(t.find(7)->gen, 1u);  // untouched
  EXPECT_EQ(t.find(7)->identity, "a");
}

TEST(FenceTableTest, AFullTableRefusesNewLineagesAndForgetsNoneEarly) {
  Table t(kLimits);
  const auto now = Clock::now();
  for (std::uint64_t l = 1; l <= 3; ++l)
    ASSERT_EQ(t.present(l, 1, 1, "x", false, now).verdict, Verdict::kNew);
  EXPECT_EQ(t.present(4, 1, 1, "y", false, now + seconds(9)).verdict, Verdict::kFull);
  EXPECT_EQ(t.size(), 3u);
  // Known lineages still register newer registrations.
  EXPECT_EQ(t.present(2, 2, 2, "x", false, now + seconds(9)).verdict, Verdict::kNewer);
}

TEST(FenceTableTest, RoomOfItsOwnPastTheBoundPerIdentity) {
  Table t(kLimits);
  const auto now = Clock::now();
  for (std::uint64_t l = 1; l <= 3; ++l)
    ASSERT_EQ(t.present(l, 1, 1, "flood", false, now).verdict, Verdict::kNew);
  EXPECT_EQ(t.present(10, 1, 1, "reg", true, now).verdict, Verdict::kNew);
  EXPECT_EQ(t.present(11, 1, 1, "reg", true, now).verdict, Verdict::kNew);
  EXPECT_EQ(t.present(12, 1, 1, "reg", true, now).verdict, Verdict::kFull);  // its room is used up
  EXPECT_EQ(t.count_of("reg"), 2u);
  EXPECT_EQ(t.count_of("flood"), 3u);
}

TEST(FenceTableTest, AnEntryInUseIsNeverForgottenAnUnusedOneAfterItsLinger) {
  Table t(kLimits);
  const auto now = Clock::now();
  auto* busy = t.present(1, 1, 1, "a", false, now).entry;
  t.hold(*busy);
  ASSERT_NE(t.present(2, 1, 1, "b", false, now).entry, nullptr);
  t.expire(now + seconds(9));
  EXPECT_EQ(t.size(), 2u);  // not yet
  t.expire(now + seconds(11));
  EXPECT_NE(t.find(1), nullptr);  // held
  EXPECT_EQ(t.find(2), nullptr);  // unused past its linger
  EXPECT_EQ(t.count_of("b"), 0u);
  t.release(*busy, now + seconds(20));  // let go: its linger starts now
  t.expire(now + seconds(29));
  EXPECT_NE(t.find(1), nullptr);
  t.expire(now + seconds(31));
  EXPECT_EQ(t.find(1), nullptr);
  EXPECT_EQ(t.size(), 0u);
}

TEST(FenceTableTest, AFullTableMakesRoomFromEntriesPastTheirLingerOnly) {
  Table t(kLimits);
  const auto now = Clock::now();
  for (std::uint64_t l = 1; l <= 3; ++l) t.present(l, 1, 1, "x", false, now);
  t.hold(*t.find(1));
  t.touch(*t.find(2), now + seconds(5));
  // Lineage 3 is past its linger; 1 is held, 2 was heard from later.
  EXPECT_EQ(t.present(4, 1, 1, "y", false, now + seconds(11)).verdict, Verdict::kNew);
  EXPECT_EQ(t.find(3), nullptr);
  EXPECT_NE(t.find(1), nullptr);
  EXPECT_NE(t.find(2), nullptr);
  EXPECT_EQ(t.present(5, 1, 1, "y", false, now + seconds(12)).verdict, Verdict::kFull);
}

}  // namespace
}  // namespace kvxfer::internal
