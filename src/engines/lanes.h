// SPDX-License-Identifier: Apache-2.0
// What the two lanes behind backend "UCX" share (lanes.cc holds the engine
// that owns them and decides which lane a peer gets): the tag at the start of
// every transfer handle, by which that engine dispatches without a lookup, and
// the walk over runs of consecutive blocks. Includes nothing from UCX or core.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace kvxfer::internal {

enum class Lane : std::uint8_t { kCma, kUcx, kNone };

// The first part of every transfer a lane hands out: XferHandle is a pointer
// to it, so one load tells which lane owns the handle.
struct LaneXfer {
  explicit LaneXfer(Lane owner) : lane(owner) {}
  const Lane lane;
};

// Calls f(local_first, remote_first, count) once per run of blocks that are
// consecutive on both sides; stops early when f returns false.
template <typename F>
bool for_each_run(std::span<const std::int64_t> local, std::span<const std::int64_t> remote,
                  F&& f) {
  const std::size_t n = local.size();
  std::size_t i = 0;
  while (i < n) {
    std::size_t j = i + 1;
    while (j < n && local[j] == local[j - 1] + 1 && remote[j] == remote[j - 1] + 1) ++j;
    if (!f(local[i], remote[i], static_cast<std::uint64_t>(j - i))) return false;
    i = j;
  }
  return true;
}

// A run of blocks consecutive on both sides: local..local+count-1 to
// remote..remote+count-1.
struct BlockRun {
  std::int64_t local = 0;
  std::int64_t remote = 0;
  std::uint64_t count = 0;
};

// Writes the runs of (local, remote) to `out` (room for local.size() runs)
// and returns how many there are: one pass, one store per run.
inline std::size_t encode_runs(std::span<const std::int64_t> local,
                               std::span<const std::int64_t> remote, BlockRun* out) {
  BlockRun* at = out;
  for_each_run(local, remote, [&at](std::int64_t l, std::int64_t r, std::uint64_t count) {
    *at++ = BlockRun{l, r, count};
    return true;
  });
  return static_cast<std::size_t>(at - out);
}

inline std::uint64_t random_u64() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ static_cast<std::uint64_t>(rd());
}

}  // namespace kvxfer::internal
