// SPDX-License-Identifier: Apache-2.0
// The library's logger and the public kvxfer/log.h on top of it. Belongs to
// no layer: every layer writes to it, users set its level and sink. Uses
// spdlog and nothing else of kvxfer's.
#include "common/log.h"

#include <spdlog/sinks/sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kvxfer {
namespace {

constexpr LogLevel kDefaultLevel = LogLevel::kWarn;

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

// The logger's one sink: hands each record to the user's sink when one is
// set, else to the default sinks (stderr). It takes no lock around the call:
// a user sink that waits for something (the Python bridge waits for the GIL)
// while holding a logger lock would deadlock against a thread that holds that
// something and logs.
class ForwardingSink final : public spdlog::sinks::sink {
 public:
  explicit ForwardingSink(std::vector<spdlog::sink_ptr> defaults)
      : defaults_(std::move(defaults)) {}

  void set_user_sink(LogSink user) {
    user_.store(user ? std::make_shared<const LogSink>(std::move(user)) : nullptr);
  }

  void log(const spdlog::details::log_msg& msg) override {
    // Our own reference: a concurrent set_log_sink cannot destroy the sink
    // while this record is in it.
    if (const std::shared_ptr<const LogSink> user = user_.load()) {
      (*user)(from_spdlog(msg.level), std::string_view(msg.payload.data(), msg.payload.size()));
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

}  // namespace kvxfer
