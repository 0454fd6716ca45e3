// SPDX-License-Identifier: Apache-2.0
// The library's logger: spdlog logger "kvxfer", created on first use. Every
// layer may write to it and none owns it. Users set its level and sink through
// the public kvxfer/log.h; nothing outside src/ includes this header.
// Only fmt's core is included here, not spdlog (log.cc holds the logger):
// spdlog's headers cost a second of compile time in every file that logs.
#pragma once

#include <fmt/core.h>

#include <optional>
#include <string_view>
#include <utility>

#include "kvxfer/log.h"

namespace kvxfer::internal {

// Formats a record only when its level is on. Thread-safe.
class Log {
 public:
  template <typename... Args>
  void trace(fmt::format_string<Args...> format, Args&&... args) {
    emit(LogLevel::kTrace, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void debug(fmt::format_string<Args...> format, Args&&... args) {
    emit(LogLevel::kDebug, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void info(fmt::format_string<Args...> format, Args&&... args) {
    emit(LogLevel::kInfo, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void warn(fmt::format_string<Args...> format, Args&&... args) {
    emit(LogLevel::kWarn, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void error(fmt::format_string<Args...> format, Args&&... args) {
    emit(LogLevel::kError, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void critical(fmt::format_string<Args...> format, Args&&... args) {
    emit(LogLevel::kCritical, format, std::forward<Args>(args)...);
  }

  [[nodiscard]] bool should_log(LogLevel level) const noexcept;
  // One formatted record, at `level`, whatever the logger's level is.
  void write(LogLevel level, std::string_view message);

 private:
  template <typename... Args>
  void emit(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
    if (!should_log(level)) return;
    write(level, fmt::vformat(format, fmt::make_format_args(args...)));
  }
};

// Never null; thread-safe.
Log& log();

// The level a KVXFER_LOG_LEVEL value names ("trace", "debug", "info", "warn"
// or "warning", "error" or "err", "critical", "off"), or nothing when it names
// none of them.
[[nodiscard]] std::optional<LogLevel> parse_log_level(std::string_view text);

}  // namespace kvxfer::internal
