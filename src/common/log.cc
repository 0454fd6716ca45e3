// SPDX-License-Identifier: Apache-2.0
// The library's logger and the public kvxfer/log.h on top of it. Belongs to
// no layer: every layer writes to it, users set its level and sink. Uses
// spdlog and, of kvxfer's, only the annotated mutex.
#include "common/log.h"

#include <fmt/format.h>
#include <pthread.h>
#include <spdlog/sinks/sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace kvxfer {
namespace {

using internal::Mutex;
using internal::MutexLock;

constexpr LogLevel kDefaultLevel = LogLevel::kWarn;
// Records waiting for a user's sink; past this, records are dropped and
// counted, never waited for: a sink that stalls must not stall the caller.
constexpr std::size_t kMaxQueuedRecords = 4096;
// How long the process's exit waits for records still queued.
constexpr auto kExitFlushTimeout = std::chrono::seconds(1);

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return spdlog::level::trace;
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kCritical:
      return spdlog::level::critical;
    case LogLevel::kOff:
      break;
  }
  return spdlog::level::off;
}

LogLevel from_spdlog(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
      return LogLevel::kTrace;
    case spdlog::level::debug:
      return LogLevel::kDebug;
    case spdlog::level::info:
      return LogLevel::kInfo;
    case spdlog::level::warn:
      return LogLevel::kWarn;
    case spdlog::level::err:
      return LogLevel::kError;
    case spdlog::level::critical:
      return LogLevel::kCritical;
    default:
      return LogLevel::kOff;
  }
}

// A user's sink runs on one thread of ours, never on the thread that logged:
// that thread may hold the transport's lock or the UCX driver's turn, and a
// user's sink may wait (the Python bridge waits for the GIL) or call into a
// Transport. Records are queued in the order they were logged and handed to
// the sink in that order; when the sink falls behind by kMaxQueuedRecords,
// further records are dropped, and the sink is told how many once it
// catches up. The thread starts with the first record and lives as long as
// the process (a child of fork() starts its own).
class Delivery {
 public:
  Delivery() {
    ::pthread_atfork([] { instance().before_fork(); }, [] { instance().after_fork(false); },
                     [] { instance().after_fork(true); });
  }

  static Delivery& instance() {
    // Never destroyed: the thread may still run while static objects go.
    static Delivery* const delivery = new Delivery;
    return *delivery;
  }

  void push(const std::shared_ptr<const LogSink>& sink, LogLevel level, std::string_view text)
      EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      ++offered_;
      if (queue_.size() >= kMaxQueuedRecords) {
        ++dropped_;
        dropped_sink_ = sink;
        return;
      }
      queue_.push_back(Record{sink, level, std::string(text)});
      if (!running_) start();
    }
    queued_.notify_one();
  }

  // Waits until every record offered before the call was handed to its
  // sink (or dropped and reported), or `timeout` passed.
  bool flush(std::chrono::nanoseconds timeout) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    const std::uint64_t target = offered_;
    // A sink that flushes would wait for itself.
    if (running_ && std::this_thread::get_id() == thread_id_) return handled_ >= target;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (handled_ < target) {
      if (!lock.wait_until(handled_cv_, deadline)) return handled_ >= target;
    }
    return true;
  }

 private:
  struct Record {
    std::shared_ptr<const LogSink> sink;  // the sink set when it was logged
    LogLevel level;
    std::string text;
  };

  void start() REQUIRES(mu_) {
    try {
      std::thread thread([this] { run(); });
      thread_id_ = thread.get_id();
      thread.detach();
      running_ = true;
    } catch (const std::exception& e) {
      // No thread: the queued records wait for the next record to try again.
      std::fprintf(stderr, "kvxfer: cannot start the log thread: %s\n", e.what());
      return;
    }
    static const bool flushes_at_exit =
        std::atexit([] { static_cast<void>(instance().flush(kExitFlushTimeout)); }) == 0;
    static_cast<void>(flushes_at_exit);
  }

  void run() EXCLUDES(mu_) {
    static_cast<void>(::pthread_setname_np(::pthread_self(), "kvxfer-log"));
    std::deque<Record> batch;
    MutexLock lock(mu_);
    for (;;) {
      while (queue_.empty() && dropped_ == 0) lock.wait(queued_);
      batch.swap(queue_);
      // Dropped while the queue was full, so after every record in it.
      const std::uint64_t dropped = std::exchange(dropped_, 0);
      const std::shared_ptr<const LogSink> dropped_sink = std::move(dropped_sink_);
      lock.unlock();
      for (const Record& r : batch) deliver(*r.sink, r.level, r.text);
      if (dropped > 0) {
        deliver(*dropped_sink, LogLevel::kWarn,
                fmt::format("kvxfer: {} log record(s) dropped: the log sink fell {} records behind",
                            dropped, kMaxQueuedRecords));
      }
      const std::uint64_t handled = batch.size() + dropped;
      batch.clear();  // the sinks' last references go outside the lock
      lock.lock();
      handled_ += handled;
      handled_cv_.notify_all();
    }
  }

  static void deliver(const LogSink& sink, LogLevel level, const std::string& text) {
    try {
      sink(level, text);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvxfer: the log sink threw: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "kvxfer: the log sink threw\n");
    }
  }

  // fork() copies the queue's lock in whatever state: it is taken across
  // the fork, so the child's copy is consistent. The child has no log
  // thread; the parent's records stay the parent's to deliver.
  void before_fork() NO_THREAD_SAFETY_ANALYSIS { mu_.lock(); }
  void after_fork(bool child) NO_THREAD_SAFETY_ANALYSIS {
    if (child) {
      queue_.clear();
      dropped_ = 0;
      dropped_sink_.reset();
      handled_ = offered_;
      running_ = false;
      thread_id_ = std::thread::id();
    }
    mu_.unlock();
  }

  Mutex mu_;
  std::condition_variable queued_;      // the thread waits for records
  std::condition_variable handled_cv_;  // flush() waits for the thread
  std::deque<Record> queue_ GUARDED_BY(mu_);
  std::uint64_t offered_ GUARDED_BY(mu_) = 0;  // records logged, dropped ones included
  std::uint64_t handled_ GUARDED_BY(mu_) = 0;  // handed to their sink, or dropped and reported
  std::uint64_t dropped_ GUARDED_BY(mu_) = 0;  // since the last report
  std::shared_ptr<const LogSink> dropped_sink_ GUARDED_BY(mu_);
  bool running_ GUARDED_BY(mu_) = false;
  std::thread::id thread_id_ GUARDED_BY(mu_);
};

// The logger's one sink: queues each record for the user's sink when one is
// set (Delivery), else hands it to the default sinks (stderr) at once.
class ForwardingSink final : public spdlog::sinks::sink {
 public:
  explicit ForwardingSink(std::vector<spdlog::sink_ptr> defaults)
      : defaults_(std::move(defaults)) {}

  void set_user_sink(LogSink user) {
    user_.store(user ? std::make_shared<const LogSink>(std::move(user)) : nullptr);
  }

  void log(const spdlog::details::log_msg& msg) override {
    // The record holds its own reference to the sink set when it was
    // logged: a later set_log_sink cannot destroy it before the record is in.
    if (const std::shared_ptr<const LogSink> user = user_.load()) {
      Delivery::instance().push(user, from_spdlog(msg.level),
                                std::string_view(msg.payload.data(), msg.payload.size()));
      return;
    }
    for (const spdlog::sink_ptr& fallback : defaults_) {
      if (fallback->should_log(msg.level)) fallback->log(msg);
    }
  }

  void flush() override {
    for (const spdlog::sink_ptr& fallback : defaults_) fallback->flush();
  }
  void set_pattern(const std::string& pattern) override {
    for (const spdlog::sink_ptr& fallback : defaults_) fallback->set_pattern(pattern);
  }
  void set_formatter(std::unique_ptr<spdlog::formatter> formatter) override {
    for (const spdlog::sink_ptr& fallback : defaults_) fallback->set_formatter(formatter->clone());
  }

 private:
  const std::vector<spdlog::sink_ptr> defaults_;
  std::atomic<std::shared_ptr<const LogSink>> user_;
};

struct Logger {
  std::shared_ptr<spdlog::logger> logger;
  std::shared_ptr<ForwardingSink> sink;
};

Logger make_logger() {
  if (auto existing = spdlog::get("kvxfer")) {
    // Someone registered "kvxfer" first: its sinks become the defaults.
    auto sink = std::make_shared<ForwardingSink>(existing->sinks());
    existing->sinks().assign(1, sink);
    return {std::move(existing), std::move(sink)};
  }
  auto sink = std::make_shared<ForwardingSink>(
      std::vector<spdlog::sink_ptr>{std::make_shared<spdlog::sinks::stderr_color_sink_mt>()});
  auto created = std::make_shared<spdlog::logger>("kvxfer", sink);
  // Registers it, with spdlog's global pattern, as stderr_color_mt would.
  spdlog::initialize_logger(created);
  created->set_level(to_spdlog(kDefaultLevel));
  if (const char* value = std::getenv("KVXFER_LOG_LEVEL")) {
    if (const std::optional<LogLevel> level = internal::parse_log_level(value)) {
      created->set_level(to_spdlog(*level));
    } else {
      created->warn(
          "KVXFER_LOG_LEVEL={} is not a level (trace, debug, info, warn, error, critical, off); "
          "logging at warn",
          value);
    }
  }
  return {std::move(created), std::move(sink)};
}

Logger& logger() {
  static Logger instance = make_logger();
  return instance;
}

}  // namespace

namespace internal {

bool Log::should_log(LogLevel level) const noexcept {
  return logger().logger->should_log(to_spdlog(level));
}

void Log::write(LogLevel level, std::string_view message) {
  logger().logger->log(to_spdlog(level), spdlog::string_view_t(message.data(), message.size()));
}

Log& log() {
  static Log instance;
  return instance;
}

std::optional<LogLevel> parse_log_level(std::string_view text) {
  // The names spdlog::level::from_str accepts; it turns any other text into
  // "off", which silenced the library on a typo.
  if (text == "trace") return LogLevel::kTrace;
  if (text == "debug") return LogLevel::kDebug;
  if (text == "info") return LogLevel::kInfo;
  if (text == "warn" || text == "warning") return LogLevel::kWarn;
  if (text == "error" || text == "err") return LogLevel::kError;
  if (text == "critical") return LogLevel::kCritical;
  if (text == "off") return LogLevel::kOff;
  return std::nullopt;
}

}  // namespace internal

void set_log_level(LogLevel level) { logger().logger->set_level(to_spdlog(level)); }

LogLevel log_level() { return from_spdlog(logger().logger->level()); }

void set_log_sink(LogSink sink) { logger().sink->set_user_sink(std::move(sink)); }

bool flush_log(std::chrono::milliseconds timeout) { return Delivery::instance().flush(timeout); }

}  // namespace kvxfer
