// SPDX-License-Identifier: Apache-2.0
// kvxfer's log: how much the library says and where it goes. The library
// logs through one logger; by default records go to stderr at level warn, or
// at the level KVXFER_LOG_LEVEL names (trace, debug, info, warn, error,
// critical, off), read when the library first logs.
#pragma once

#include <functional>
#include <string_view>

namespace kvxfer {

enum class LogLevel {
  kTrace,
  kDebug,
  kInfo,
  kWarn,
  kError,
  kCritical,
  kOff,
};

// Records below `level` are dropped before they are formatted. Thread-safe;
// takes effect for records started after it returns.
void set_log_level(LogLevel level);
[[nodiscard]] LogLevel log_level();

// Receives each record's level and message (the text alone: no time stamp,
// no logger name). `message` is valid only during the call.
using LogSink = std::function<void(LogLevel level, std::string_view message)>;

// Sends every record to `sink` instead of stderr; nullptr restores stderr.
//
// Threading: records come from any thread (a caller's, the registration
// worker, an engine's progress or copier threads), and the sink may be called
// from several threads at once: the logger takes no lock of its own around
// the call, so a sink that needs one brings its own, and a sink that must
// wait for something else (an interpreter lock, say) cannot deadlock against
// the logger. A record may be emitted while a Transport holds its internal
// lock, so a sink must not call into a Transport, and must not wait for
// anything a thread calling into a Transport may hold while it waits: the
// Python module releases the GIL around every such call for this reason.
//
// A record already on its way when set_log_sink returns may still reach the
// previous sink, which stays alive (its std::function is not destroyed) until
// that call returns.
void set_log_sink(LogSink sink);

}  // namespace kvxfer
