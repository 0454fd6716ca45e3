// SPDX-License-Identifier: Apache-2.0
// The telemetry ring (Options::telemetry): a fixed number of per-transfer
// records, allocated once; a full ring drops its oldest record and counts
// it. Guarded by the transport's mutex. Filling a record allocates nothing:
// the peer's id is a shared string, the lane a static one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvxfer/telemetry.h"
#include "telemetry/clock.h"

namespace kvxfer::internal {

struct RingRecord {
  TransferId id = 0;
  std::shared_ptr<const std::string> peer;
  TransferOp op = TransferOp::kWrite;
  std::uint64_t blocks = 0;
  std::uint64_t bytes = 0;
  Ticks posted = 0;
  Ticks completed = 0;
  TransferResult result = TransferResult::kDone;
  const char* lane = "";
};

class TelemetryRing {
 public:
  explicit TelemetryRing(std::size_t capacity) : slots_(capacity) {}

  // The slot of the newest record, the oldest dropped first when full.
  RingRecord& push() noexcept {
    if (size_ == slots_.size()) {
      head_ = (head_ + 1) % slots_.size();
      --size_;
      ++dropped_;
    }
    RingRecord& slot = slots_[(head_ + size_) % slots_.size()];
    ++size_;
    return slot;
  }

  // Every record, oldest first, and the drops since the last take; empties
  // the ring.
  Telemetry take() {
    Telemetry out;
    out.records.reserve(size_);
    const TickAnchor now = tick_anchor();
    for (std::size_t i = 0; i < size_; ++i) {
      RingRecord& r = slots_[(head_ + i) % slots_.size()];
      TransferRecord& t = out.records.emplace_back();
      t.id = r.id;
      t.peer = r.peer ? *r.peer : std::string();
      t.op = r.op;
      t.blocks = r.blocks;
      t.bytes = r.bytes;
      t.posted = to_steady(r.posted, now);
      t.completed = to_steady(r.completed, now);
      t.result = r.result;
      t.lane = r.lane;
      r.peer.reset();
    }
    out.dropped = std::exchange(dropped_, 0);
    head_ = 0;
    size_ = 0;
    return out;
  }

 private:
  std::vector<RingRecord> slots_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
  std::uint64_t dropped_ = 0;
};

}  // namespace kvxfer::internal
