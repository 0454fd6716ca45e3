// SPDX-License-Identifier: Apache-2.0
// kvxfer's log: how much the library says and where it goes. The library
// logs through one logger; by default records go to stderr at level warn, or
// at the level KVXFER_LOG_LEVEL names (trace, debug, info, warn, error,
// critical, off), read when the library first logs.
#pragma once

#include <chrono>
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
// Threading: the sink runs on one thread of the library's own (named
// kvxfer-log), one record at a time, in the order the records were logged,
// never on the thread that logged them. So it runs under none of the
// library's locks: it may call into a Transport (stats(), poll(), ...) and
// may wait for anything (an interpreter lock, say) without stalling or
// deadlocking the thread that logged. Records wait in a bounded queue: a
// sink that falls behind by thousands of records makes the library drop
// records rather than wait, and then receives one warning that says how
// many it lost. Records therefore reach the sink a little after the call
// that logged them returns: flush_log() waits for them. Transport::close()
// and the process's exit wait (about a second at most) for records already
// logged.
//
// A record reaches the sink that was set when it was logged, also when
// set_log_sink has replaced that sink since; the sink (its std::function)
// stays alive until its last record is in.
void set_log_sink(LogSink sink);

// Waits until every record logged before the call has reached its sink (or
// was dropped and reported), for at most `timeout`. True when it has. From
// the sink itself it does not wait: it returns whether the queue is empty.
bool flush_log(std::chrono::milliseconds timeout = std::chrono::seconds(5));

}  // namespace kvxfer
