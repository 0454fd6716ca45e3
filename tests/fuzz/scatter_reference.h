// SPDX-License-Identifier: Apache-2.0
// What the scatter targets compare scatter_runs_fit with: the definition of
// "fits", computed in 128 bits so nothing wraps.
#pragma once

#include <cstdint>
#include <cstdlib>

#include "wire/scatter.h"

namespace kvxfer::fuzz {

__extension__ typedef unsigned __int128 u128;  // __extension__: no -Wpedantic warning

inline bool reference_fit(const internal::ucx::ScatterHeader& h, std::uint64_t region_len,
                          std::uint64_t payload_len) {
  u128 total = 0;
  for (std::size_t i = 0; i < h.run_count(); ++i) {
    const internal::ucx::ScatterRun r = h.run(i);
    if (r.length == 0) return false;
    if (static_cast<u128>(r.offset) + r.length > region_len) return false;
    total += r.length;
  }
  return total == payload_len;
}

// scatter_runs_fit, checked against the reference; a disagreement aborts.
inline bool checked_fit(const internal::ucx::ScatterHeader& h, std::uint64_t region_len,
                        std::uint64_t payload_len) {
  const bool fits = internal::ucx::scatter_runs_fit(h, region_len, payload_len);
  if (fits != reference_fit(h, region_len, payload_len)) std::abort();
  return fits;
}

}  // namespace kvxfer::fuzz
