// SPDX-License-Identifier: Apache-2.0
// Runs of a peer's regions, as the tcp lane's write and read-request frames
// (wire/tcp_frame.h) carry them after their header: run count x (u64 the
// target's region id | u64 offset into that region | u64 length),
// little-endian. One definition of the run layout and of the check that
// every run lies inside the region it names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "wire/bytes.h"

namespace kvxfer::wire {

inline constexpr std::size_t kRunLen = 24;

struct Run {
  std::uint64_t region = 0;  // the target's id for it (its pool: 0)
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

// The runs part of a decoded header, read in place. The decoder checked that
// `runs` holds run_count() whole runs.
struct RunList {
  std::span<const std::uint8_t> runs;  // run count x kRunLen bytes

  [[nodiscard]] std::size_t run_count() const { return runs.size() / kRunLen; }
  // Per run per message: three plain loads, no bounds check (i <
  // run_count() is the caller's).
  [[nodiscard]] Run run(std::size_t i) const {
    const std::uint8_t* at = runs.data() + i * kRunLen;
    return {load_le<std::uint64_t>(at), load_le<std::uint64_t>(at + 8),
            load_le<std::uint64_t>(at + 16)};
  }
};

// Writes one run at `at` (kRunLen bytes of the caller's header).
inline void put_run_at(std::uint8_t* at, std::uint64_t region, std::uint64_t offset,
                       std::uint64_t length) {
  store_le<std::uint64_t>(at, region);
  store_le<std::uint64_t>(at + 8, offset);
  store_le<std::uint64_t>(at + 16, length);
}

// True when every run lies inside the region it names, no run is empty, and
// the runs add up to at most `limit` bytes; then *total is that sum. On
// false *total is left alone. `region_len(id)` is the length of the
// receiver's live region `id`, 0 when it has none of that id (no region is
// empty), so an unknown or removed region fits nothing.
template <typename RegionLen>
[[nodiscard]] bool runs_in_regions(const RunList& list, RegionLen&& region_len, std::uint64_t limit,
                                   std::uint64_t* total) {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < list.run_count(); ++i) {
    const Run r = list.run(i);
    const std::uint64_t len = region_len(r.region);
    if (r.length == 0 || r.length > len || r.offset > len - r.length) return false;
    if (r.length > limit - sum) return false;  // also guards the sum's overflow
    sum += r.length;
  }
  *total = sum;
  return true;
}

}  // namespace kvxfer::wire
