// SPDX-License-Identifier: Apache-2.0
// kvxfer/log.h: the level users set is the level the library logs at; a sink
// set with set_log_sink receives every record at or above it, in order, on
// the library's log thread (so under none of its locks: a sink may call into
// a Transport, and a sink that stalls stalls no caller: records are dropped
// and counted instead); nullptr sends records back to stderr; an
// unrecognised KVXFER_LOG_LEVEL is named in a warning and leaves the default
// level.
#include "kvxfer/log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agents.h"
#include "common/log.h"

namespace kvxfer::unit {
namespace {

using namespace std::chrono_literals;

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
    // Records still queued for this fixture's sink reach it first.
    EXPECT_TRUE(flush_log());
    set_log_sink(nullptr);
    set_log_level(saved_level_);
  }

  // What the sink received of every record logged so far.
  std::vector<Record> records() {
    EXPECT_TRUE(flush_log());
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

TEST_F(LogTest, ARecordReachesTheSinkSetWhenItWasLogged) {
  set_log_level(LogLevel::kWarn);
  internal::log().warn("to the first");
  std::vector<std::string> second;
  set_log_sink([&second](LogLevel, std::string_view message) { second.emplace_back(message); });
  internal::log().warn("to the second");
  EXPECT_TRUE(flush_log());
  EXPECT_EQ(records(), (std::vector<Record>{{LogLevel::kWarn, "to the first"}}));
  EXPECT_EQ(second, std::vector<std::string>{"to the second"});
}

TEST_F(LogTest, TheSinkRunsOnTheLogThreadInTheOrderRecordsWereLogged) {
  std::vector<std::string> got;
  std::thread::id sink_thread;
  set_log_sink([&](LogLevel, std::string_view message) {
    sink_thread = std::this_thread::get_id();
    got.emplace_back(message);
  });
  set_log_level(LogLevel::kWarn);
  std::vector<std::string> logged;
  for (int i = 0; i < 1000; ++i) {
    logged.push_back("record " + std::to_string(i));
    internal::log().warn("{}", logged.back());
  }
  ASSERT_TRUE(flush_log());
  EXPECT_EQ(got, logged);
  EXPECT_NE(sink_thread, std::this_thread::get_id());
}

TEST_F(LogTest, FlushFromTheSinkDoesNotWaitForItself) {
  std::promise<std::chrono::steady_clock::duration> took;
  set_log_sink([&took](LogLevel, std::string_view) {
    const auto start = std::chrono::steady_clock::now();
    static_cast<void>(flush_log(10s));
    took.set_value(std::chrono::steady_clock::now() - start);
  });
  set_log_level(LogLevel::kWarn);
  internal::log().warn("flushes from inside");
  auto future = took.get_future();
  ASSERT_EQ(future.wait_for(5s), std::future_status::ready);
  EXPECT_LT(future.get(), 1s);
}

// A sink that stands still until open() (or 10 s, so that a test that
// waits for a call it holds up fails rather than hangs). What it received
// lives as long as the sink does.
class StalledSink {
 public:
  ~StalledSink() { open(); }
  void open() {
    std::lock_guard lock(state_->mu);
    if (!state_->opened) {
      state_->opened = true;
      state_->opening.set_value();
    }
  }
  [[nodiscard]] LogSink sink() const {
    return [state = state_, gate = state_->gate](LogLevel, std::string_view message) {
      static_cast<void>(gate.wait_for(10s));
      std::lock_guard lock(state->mu);
      state->messages.emplace_back(message);
    };
  }
  [[nodiscard]] std::vector<std::string> messages() const {
    std::lock_guard lock(state_->mu);
    return state_->messages;
  }

 private:
  struct State {
    std::mutex mu;
    std::promise<void> opening;
    std::shared_future<void> gate = opening.get_future().share();
    bool opened = false;
    std::vector<std::string> messages;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// How many records a sink was told it lost ("kvxfer: N log record(s)
// dropped ...", each such note counted), and how many others it received.
std::pair<std::size_t, std::size_t> dropped_and_received(const std::vector<std::string>& messages) {
  std::size_t dropped = 0;
  std::size_t received = 0;
  for (const std::string& m : messages) {
    if (m.find("log record(s) dropped") != std::string::npos) {
      dropped += std::stoul(m.substr(m.find(' ') + 1));
    } else {
      ++received;
    }
  }
  return {dropped, received};
}

TEST_F(LogTest, ASinkThatStallsDoesNotStallWriteBlocksAndIsToldWhatItLost) {
  set_log_level(LogLevel::kWarn);
  Agent a("agent-a");
  StalledSink stalled;
  set_log_sink(stalled.sink());
  // Each write to a peer nobody registered is refused with a warning, logged
  // under the transport's lock; far more warnings than the queue holds.
  constexpr int kWrites = 10000;
  auto writing = std::async(std::launch::async, [&a] {
    int refused = 0;
    for (int i = 0; i < kWrites; ++i) refused += write(a.transport, "nobody", {0}, {0}) ? 0 : 1;
    return refused;
  });
  const bool wrote_while_stalled = writing.wait_for(5s) == std::future_status::ready;
  stalled.open();
  EXPECT_EQ(writing.get(), kWrites);
  EXPECT_TRUE(wrote_while_stalled) << "write_blocks waited for the log sink";

  ASSERT_TRUE(flush_log());
  const std::vector<std::string> messages = stalled.messages();
  const auto [dropped, received] = dropped_and_received(messages);
  EXPECT_GT(dropped, 0u);
  EXPECT_EQ(dropped + received, static_cast<std::size_t>(kWrites));
  ASSERT_FALSE(messages.empty());
  // The notice follows every record that filled the queue (4,096) when the
  // first was dropped. Records logged after the queue drained again may
  // follow it: under load the log thread starts late, takes a full queue,
  // and the writer refills it while the sink stalls.
  const auto notice = std::find_if(messages.begin(), messages.end(), [](const std::string& m) {
    return m.find("log record(s) dropped") != std::string::npos;
  });
  ASSERT_NE(notice, messages.end());
  EXPECT_GE(notice - messages.begin(), 4096);
}

TEST_F(LogTest, ASinkThatCallsIntoTheTransportDoesNotDeadlock) {
  // The sink calls into the transport whose call logged the record, as a
  // sink that reports the transport's state along with a warning would. A
  // sink run on the logging thread, under the transport's lock, deadlocks:
  // the child process is then ended by its alarm.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ::alarm(20);
        Agent a("agent-a");
        Agent b("agent-b");
        add_peer(a.transport, "b", b.transport);
        std::atomic<int> calls{0};
        set_log_sink([&](LogLevel, std::string_view) {
          (void)a.transport.stats();
          (void)a.transport.poll("b");
          ++calls;
        });
        set_log_level(LogLevel::kWarn);
        for (int i = 0; i < 10; ++i) (void)write(a.transport, "nobody", {0}, {0});
        const bool flushed = flush_log(10s);
        std::_Exit(flushed && calls.load() == 10 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
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
