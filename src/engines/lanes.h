// SPDX-License-Identifier: Apache-2.0
// The tag at the start of every transfer handle of the two lanes behind
// backend "UCX", by which the engine that owns them (lanes.cc, which also
// decides which lane a peer gets) dispatches without a lookup. Includes
// nothing from UCX or core.
#pragma once

#include <cstdint>

namespace kvxfer::internal {

enum class Lane : std::uint8_t { kCma, kUcx, kTcp, kNone };

// The first part of every transfer a lane hands out: XferHandle is a pointer
// to it, so one load tells which lane owns the handle.
struct LaneXfer {
  explicit LaneXfer(Lane owner) : lane(owner) {}
  const Lane lane;
};

}  // namespace kvxfer::internal
