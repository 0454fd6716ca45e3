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

inline std::uint64_t random_u64() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ static_cast<std::uint64_t>(rd());
}

}  // namespace kvxfer::internal
