// SPDX-License-Identifier: Apache-2.0
// Per-transfer telemetry (opt-in with Options::telemetry): a record of every
// transfer that finished, read with Transport::telemetry().
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvxfer/metrics.h"

namespace kvxfer {

using TransferId = std::uint64_t;

enum class TransferResult : std::uint8_t {
  kDone,       // poll() reported it done
  kFailed,     // poll() reported it failed
  kCancelled,  // cancelled, or dropped with its peer (removed, re-registered, closed)
};
// "done", "failed", "cancelled".
[[nodiscard]] std::string_view result_name(TransferResult result) noexcept;

struct TransferRecord {
  TransferId id = 0;
  std::string peer;
  TransferOp op = TransferOp::kWrite;
  std::uint64_t blocks = 0;
  std::uint64_t bytes = 0;
  // steady_clock: the start of the call that posted it, and of the call
  // that finished it (the poll that reported it, the cancel...).
  std::chrono::steady_clock::time_point posted;
  std::chrono::steady_clock::time_point completed;
  TransferResult result = TransferResult::kDone;
  // The engine's lane for the peer ("ucx", "cma"), "" when it has none.
  std::string lane;
};

struct Telemetry {
  // Oldest first.
  std::vector<TransferRecord> records;
  // Records the ring dropped (the oldest first) since the last call because
  // it was full.
  std::uint64_t dropped = 0;
};

}  // namespace kvxfer
