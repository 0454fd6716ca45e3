// SPDX-License-Identifier: Apache-2.0
// kvxfer/log.h: the level users set is the level the library logs at; a sink
// set with set_log_sink receives every record at or above it, nullptr sends
// records back to stderr; an unrecognised KVXFER_LOG_LEVEL is named in a
// warning and leaves the default level.
#include "kvxfer/log.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/log.h"

namespace kvxfer::unit {
namespace {

struct Record {
  LogLevel level;
  std::string message;
  bool operator==(const Record&) const = default;
};

// Installs a recording sink for the test and restores the default sink and
// the level afterwards.
class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_level_ = log_level();
    set_log_sink([this](LogLevel level, std::string_view message) {
      std::lock_guard lock(mu_);
      records_.push_back({level, std::string(message)});
    });
  }
  void TearDown() override {
    set_log_sink(nullptr);
    set_log_level(saved_level_);
  }

  std::vector<Record> records() {
    std::lock_guard lock(mu_);
    return records_;
  }

 private:
  LogLevel saved_level_ = LogLevel::kWarn;
  std::mutex mu_;
  std::vector<Record> records_;
};

TEST_F(LogTest, LogLevelReportsTheLevelSet) {
  for (const LogLevel level : {LogLevel::kTrace, LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn,
                               LogLevel::kError, LogLevel::kCritical, LogLevel::kOff}) {
    set_log_level(level);
    EXPECT_EQ(log_level(), level);
  }
}

TEST_F(LogTest, SinkReceivesEachRecordsLevelAndMessage) {
  set_log_level(LogLevel::kDebug);
  internal::log().debug("peer={} registered", "b");
  internal::log().error("releasing transfer_id={} failed", 7);
  EXPECT_EQ(records(), (std::vector<Record>{{LogLevel::kDebug, "peer=b registered"},
                                            {LogLevel::kError, "releasing transfer_id=7 failed"}}));
}

TEST_F(LogTest, RecordsBelowTheLevelNeverReachTheSink) {
  set_log_level(LogLevel::kWarn);
  internal::log().info("quiet");
  internal::log().warn("loud");
  EXPECT_EQ(records(), (std::vector<Record>{{LogLevel::kWarn, "loud"}}));
}

TEST_F(LogTest, LevelOffSilencesEverything) {
  set_log_level(LogLevel::kOff);
  internal::log().critical("nobody hears this");
  EXPECT_TRUE(records().empty());
}

TEST_F(LogTest, NullSinkSendsRecordsBackToStderr) {
  set_log_level(LogLevel::kWarn);
  set_log_sink(nullptr);
  ::testing::internal::CaptureStderr();
  internal::log().warn("back on stderr");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("back on stderr"), std::string::npos) << err;
  EXPECT_TRUE(records().empty());
}

TEST_F(LogTest, ANewSinkReplacesThePreviousOne) {
  set_log_level(LogLevel::kWarn);
  std::vector<std::string> second;
  set_log_sink([&second](LogLevel, std::string_view message) { second.emplace_back(message); });
  internal::log().warn("only to the second");
  EXPECT_TRUE(records().empty());
  EXPECT_EQ(second, std::vector<std::string>{"only to the second"});
}

TEST_F(LogTest, TheLoggerHoldsNoLockWhileTheSinkRuns) {
  // Two threads are inside the sink at once: a sink that waits (for the GIL,
  // say) cannot block another thread's record behind a logger lock.
  std::mutex mu;
  std::condition_variable cv;
  int inside = 0;
  int met = 0;  // calls that saw the other one inside too
  set_log_sink([&](LogLevel, std::string_view) {
    std::unique_lock lock(mu);
    ++inside;
    cv.notify_all();
    if (cv.wait_for(lock, std::chrono::seconds(10), [&] { return inside == 2; })) ++met;
  });
  set_log_level(LogLevel::kWarn);
  std::thread other([] { internal::log().warn("from another thread"); });
  internal::log().warn("from this thread");
  other.join();
  EXPECT_EQ(met, 2);
}

TEST(LogLevelNameTest, KnowsTheNamesSpdlogAccepted) {
  using internal::parse_log_level;
  EXPECT_EQ(parse_log_level("trace"), LogLevel::kTrace);
  EXPECT_EQ(parse_log_level("debug"), LogLevel::kDebug);
  EXPECT_EQ(parse_log_level("info"), LogLevel::kInfo);
  EXPECT_EQ(parse_log_level("warn"), LogLevel::kWarn);
  EXPECT_EQ(parse_log_level("warning"), LogLevel::kWarn);
  EXPECT_EQ(parse_log_level("error"), LogLevel::kError);
  EXPECT_EQ(parse_log_level("err"), LogLevel::kError);
  EXPECT_EQ(parse_log_level("critical"), LogLevel::kCritical);
  EXPECT_EQ(parse_log_level("off"), LogLevel::kOff);
}

TEST(LogLevelNameTest, RejectsAnythingElse) {
  EXPECT_EQ(internal::parse_log_level("verbose"), std::nullopt);
  EXPECT_EQ(internal::parse_log_level(""), std::nullopt);
  EXPECT_EQ(internal::parse_log_level("debug "), std::nullopt);
}

TEST(LogEnvironmentTest, UnrecognisedLevelIsNamedInAWarningAndTheDefaultKept) {
  // The logger reads KVXFER_LOG_LEVEL once, when first used; "threadsafe"
  // death tests re-run this binary, so the child's logger starts fresh.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ::setenv("KVXFER_LOG_LEVEL", "loud", 1);
        std::exit(log_level() == LogLevel::kWarn ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "KVXFER_LOG_LEVEL=loud is not a level");
}

}  // namespace
}  // namespace kvxfer::unit
