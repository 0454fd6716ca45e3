// SPDX-License-Identifier: Apache-2.0
// Options are checked when a Transport is made: every numeric option out of
// its range is refused with std::invalid_argument naming the option, before
// anything reads it (the policy and the engines take them as given).
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <functional>
#include <stdexcept>
#include <string>

#include "agents.h"

namespace kvxfer::unit {
namespace {

using std::chrono::milliseconds;

// The message of the invalid_argument a Transport with these options
// throws; "" (and a test failure) when it is made.
std::string refusal(const std::function<void(Options&)>& edit) {
  Options options = loopback_options();
  edit(options);
  Pool pool(kNumBlocks, kBlockLen);
  try {
    Transport t("agent-a", pool.region(), options);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "the options were accepted";
  return "";
}

void expect_accepted(const std::function<void(Options&)>& edit) {
  Options options = loopback_options();
  edit(options);
  Pool pool(kNumBlocks, kBlockLen);
  EXPECT_NO_THROW(Transport("agent-a", pool.region(), options));
}

TEST(OptionsTest, NumThreadsBelowOneIsRefusedByName) {
  for (const int bad : {0, -1, INT_MIN}) {
    EXPECT_NE(refusal([bad](Options& o) { o.num_threads = bad; }).find("num_threads"),
              std::string::npos)
        << bad;
  }
  expect_accepted([](Options& o) { o.num_threads = 1; });
  expect_accepted([](Options& o) { o.num_threads = INT_MAX; });
}

TEST(OptionsTest, StrikeLimitBelowOneIsRefusedByName) {
  for (const int bad : {0, -3, INT_MIN}) {
    EXPECT_NE(refusal([bad](Options& o) { o.strike_limit = bad; }).find("strike_limit"),
              std::string::npos)
        << bad;
  }
  expect_accepted([](Options& o) { o.strike_limit = 1; });
  expect_accepted([](Options& o) { o.strike_limit = INT_MAX; });
}

TEST(OptionsTest, NegativeStallTimeoutIsRefusedByName) {
  for (const milliseconds bad : {milliseconds(-1), milliseconds::min()}) {
    EXPECT_NE(refusal([bad](Options& o) { o.stall_timeout = bad; }).find("stall_timeout"),
              std::string::npos)
        << bad.count();
  }
}

TEST(OptionsTest, StallTimeoutBeyondAYearIsRefusedByName) {
  // Longer ones would overflow when added to clock times (max() does).
  for (const milliseconds bad : {kMaxStallTimeout + milliseconds(1), milliseconds::max()}) {
    EXPECT_NE(refusal([bad](Options& o) { o.stall_timeout = bad; }).find("stall_timeout"),
              std::string::npos)
        << bad.count();
  }
}

TEST(OptionsTest, StallTimeoutFromZeroToAYearIsAccepted) {
  expect_accepted([](Options& o) { o.stall_timeout = milliseconds(0); });
  expect_accepted([](Options& o) { o.stall_timeout = milliseconds(1); });
  expect_accepted([](Options& o) { o.stall_timeout = kMaxStallTimeout; });
}

TEST(OptionsTest, ALongestStallTimeoutNeverFaultsAFreshTransfer) {
  Options options = loopback_options();
  options.stall_timeout = kMaxStallTimeout;
  Agent b{"agent-b"};
  Agent a{"agent-a", options};
  add_peer(a.transport, "b", b.transport);
  a.plan().hold_next();
  const auto id = write(a.transport, "b", {0}, {0});
  ASSERT_TRUE(id.has_value());
  const PollResult r = a.transport.poll("b");
  EXPECT_TRUE(r.empty());
  EXPECT_EQ(peer_stats(a.transport, "b").fault, std::nullopt);
}

}  // namespace
}  // namespace kvxfer::unit
