// SPDX-License-Identifier: Apache-2.0
// Runs of a peer's region, as the tcp lane's write and read-request frames
// (wire/tcp_frame.h) carry them after their header: run count x (u64 offset
// into the target's region | u64 length), little-endian. One definition of
// the run layout and of the check that every run lies inside the region.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "wire/bytes.h"

namespace kvxfer::wire {

inline constexpr std::size_t kRunLen = 16;

struct Run {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

// The runs part of a decoded header, read in place. The decoder checked that
// `runs` holds run_count() whole runs.
struct RunList {
  std::span<const std::uint8_t> runs;  // run count x kRunLen bytes

  [[nodiscard]] std::size_t run_count() const { return runs.size() / kRunLen; }
  // Per run per message: two plain loads, no bounds check (i < run_count()
  // is the caller's).
  [[nodiscard]] Run run(std::size_t i) const {
    const std::uint8_t* at = runs.data() + i * kRunLen;
    return {load_le<std::uint64_t>(at), load_le<std::uint64_t>(at + 8)};
  }
};

// Writes one run at `at` (kRunLen bytes of the caller's header).
inline void put_run_at(std::uint8_t* at, std::uint64_t offset, std::uint64_t length) {
  store_le<std::uint64_t>(at, offset);
  store_le<std::uint64_t>(at + 8, length);
}

// True when every run lies inside a region of `region_len` bytes, no run is
// empty, and the runs add up to at most `limit` bytes; then *total is that
// sum. On false *total is left alone.
[[nodiscard]] inline bool runs_in_region(const RunList& list, std::uint64_t region_len,
                                         std::uint64_t limit, std::uint64_t* total) {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < list.run_count(); ++i) {
    const Run r = list.run(i);
    if (r.length == 0 || r.length > region_len || r.offset > region_len - r.length) return false;
    if (r.length > limit - sum) return false;  // also guards the sum's overflow
    sum += r.length;
  }
  *total = sum;
  return true;
}

}  // namespace kvxfer::wire
