// SPDX-License-Identifier: Apache-2.0
// core/pairs.h: one pass over a transfer's pairs copies them, checks both
// ranges and cuts them into the runs the lanes post; runs_ascend tells a
// list that names no block twice without looking at its indices again.
#include "core/pairs.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace kvxfer::internal {
namespace {

struct Copied {
  PairsCopy result;
  std::vector<std::int64_t> local;
  std::vector<std::int64_t> remote;
  std::vector<BlockRun> runs;
};

template <typename Int>
Copied copy(const std::vector<Int>& local, const std::vector<Int>& remote, std::uint64_t nl,
            std::uint64_t nr) {
  Copied c;
  c.result = copy_pairs(std::span<const Int>(local), std::span<const Int>(remote), nl, nr,
                        c.local, c.remote, c.runs);
  c.runs.resize(c.result.runs);
  return c;
}

TEST(PairsTest, RunsAreConsecutiveOnBothSidesAndTheCopyIsExact) {
  const std::vector<std::int64_t> local{0, 1, 2, 7, 8, 3, 4, 5};
  const std::vector<std::int64_t> remote{10, 11, 12, 13, 14, 20, 21, 30};
  const Copied c = copy(local, remote, 16, 32);
  EXPECT_TRUE(c.result.local_ok);
  EXPECT_TRUE(c.result.remote_ok);
  EXPECT_EQ(c.local, local);
  EXPECT_EQ(c.remote, remote);
  // 2 -> 7 breaks the local side; 14 -> 20 the remote side; 21 -> 30 too.
  const std::vector<BlockRun> want{{0, 10, 3}, {7, 13, 2}, {3, 20, 2}, {5, 30, 1}};
  EXPECT_EQ(c.runs, want);
}

TEST(PairsTest, TheRunsAreThoseOfEncodeRuns) {
  std::vector<std::int64_t> local;
  std::vector<std::int64_t> remote;
  std::uint64_t x = 12345;
  for (int i = 0; i < 5000; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const bool step = (x >> 60) < 12;  // mostly consecutive, sometimes a jump
    local.push_back(step && !local.empty() ? local.back() + 1 : static_cast<std::int64_t>(x % 997));
    remote.push_back(step && !remote.empty() ? remote.back() + 1
                                             : static_cast<std::int64_t>((x >> 20) % 991));
  }
  const Copied c = copy(local, remote, 1 << 20, 1 << 20);
  std::vector<BlockRun> want(local.size());
  want.resize(encode_runs(local, remote, want.data()));
  EXPECT_EQ(c.runs, want);
}

TEST(PairsTest, EachSidesRangeIsCheckedOnItsOwn) {
  EXPECT_FALSE(copy<std::int64_t>({0, 16}, {0, 1}, 16, 32).result.local_ok);
  EXPECT_TRUE(copy<std::int64_t>({0, 16}, {0, 1}, 16, 32).result.remote_ok);
  EXPECT_FALSE(copy<std::int64_t>({0, 1}, {0, -1}, 16, 32).result.remote_ok);
  EXPECT_TRUE(copy<std::int64_t>({0, 1}, {0, -1}, 16, 32).result.local_ok);
  EXPECT_FALSE(copy<std::int32_t>({-5}, {0}, 16, 32).result.local_ok);
  // No blocks: nothing is in range.
  EXPECT_FALSE(copy<std::int64_t>({0}, {0}, 0, 32).result.local_ok);
}

TEST(PairsTest, TheLargestIndicesAreRefusedWithoutOverflow) {
  // The step from the previous index is taken unsigned: no overflow (UBSan
  // would report one), and indices past 2^63 fail the range check.
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  const Copied c = copy<std::int64_t>({kMax - 1, kMax, kMin}, {kMax - 1, kMax, kMin},
                                      ~std::uint64_t{0}, ~std::uint64_t{0});
  EXPECT_FALSE(c.result.local_ok);
  EXPECT_FALSE(c.result.remote_ok);
  EXPECT_EQ(c.runs.front(), (BlockRun{kMax - 1, kMax - 1, 3}));
}

TEST(PairsTest, Int32IndicesAreWidened) {
  const Copied c = copy<std::int32_t>({5, 6, 7}, {1, 2, 3}, 16, 16);
  EXPECT_EQ(c.local, (std::vector<std::int64_t>{5, 6, 7}));
  EXPECT_EQ(c.runs, (std::vector<BlockRun>{{5, 1, 3}}));
}

TEST(PairsTest, RunsAscendOnlyWhenNoBlockOfThatSideComesTwice) {
  const std::vector<BlockRun> ascending{{9, 0, 2}, {0, 2, 3}, {4, 8, 1}};
  EXPECT_TRUE(runs_ascend(ascending, /*remote=*/true));
  EXPECT_FALSE(runs_ascend(ascending, /*remote=*/false));  // 9, 10 then 0
  // Touching is fine, overlapping is not.
  EXPECT_TRUE(runs_ascend(std::vector<BlockRun>{{0, 0, 2}, {2, 2, 2}}, true));
  EXPECT_FALSE(runs_ascend(std::vector<BlockRun>{{0, 0, 3}, {2, 2, 2}}, true));
  EXPECT_TRUE(runs_ascend({}, true));
}

}  // namespace
}  // namespace kvxfer::internal
