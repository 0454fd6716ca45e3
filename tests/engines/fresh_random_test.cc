// SPDX-License-Identifier: Apache-2.0
// fresh_random (common/random.h): the lanes' sequences, lineages and
// epochs. Drawn from getrandom in batches per thread; never 0, never
// repeated in practice, and a forked child never replays the values its
// parent draws next.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "common/random.h"

namespace kvxfer::internal {
namespace {

TEST(FreshRandomTest, NeverZeroAndNoRepeatsAcrossManyBatches) {
  std::set<std::uint64_t> seen;
  for (int i = 0; i < 10'000; ++i) {
    const std::uint64_t v = fresh_random();
    ASSERT_NE(v, 0u);
    ASSERT_TRUE(seen.insert(v).second) << "repeated after " << i << " draws";
  }
}

TEST(FreshRandomTest, ThreadsDrawTheirOwnValues) {
  std::array<std::vector<std::uint64_t>, 2> drawn;
  std::vector<std::thread> threads;
  for (auto& out : drawn) {
    threads.emplace_back([&out] {
      for (int i = 0; i < 1'000; ++i) out.push_back(fresh_random());
    });
  }
  for (auto& t : threads) t.join();
  std::set<std::uint64_t> all(drawn[0].begin(), drawn[0].end());
  all.insert(drawn[1].begin(), drawn[1].end());
  EXPECT_EQ(all.size(), 2'000u);
}

TEST(FreshRandomTest, AForkedChildDoesNotReplayItsParentsNextValues) {
  static_cast<void>(fresh_random());  // this thread's batch is now part used
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::array<std::uint64_t, 4> values{};
    for (auto& v : values) v = fresh_random();
    const auto n = ::write(fds[1], values.data(), sizeof(values));
    ::_exit(n == static_cast<ssize_t>(sizeof(values)) ? 0 : 1);
  }
  ::close(fds[1]);
  std::array<std::uint64_t, 4> ours{};
  for (auto& v : ours) v = fresh_random();
  std::array<std::uint64_t, 4> theirs{};
  ASSERT_EQ(::read(fds[0], theirs.data(), sizeof(theirs)), static_cast<ssize_t>(sizeof(theirs)));
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (const std::uint64_t v : theirs) {
    for (const std::uint64_t w : ours) EXPECT_NE(v, w);
  }
}

}  // namespace
}  // namespace kvxfer::internal
