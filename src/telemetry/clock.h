// SPDX-License-Identifier: Apache-2.0
// The clock of the transport's hot path (post times, call durations,
// latencies): the CPU's time-stamp counter where Linux itself keeps time
// with it (clocksource "tsc": invariant and in step across cores), else
// steady_clock. Reading the counter costs a few ns; a steady_clock read
// costs 20-40 ns (more under a hypervisor), and write_blocks + poll needs
// four of them.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>

namespace kvxfer::internal {

using Ticks = std::uint64_t;

struct TickCalibration {
  bool tsc = false;          // ticks are TSC cycles; else steady_clock ns
  double ns_per_tick = 1.0;  // measured once, at load
  Ticks ticks0 = 0;          // the same instant on both clocks
  std::chrono::steady_clock::time_point steady0;
};

// Set up when the library is loaded.
extern const TickCalibration g_tick_calibration;

[[nodiscard]] inline Ticks ticks_now() noexcept {
#if defined(__x86_64__)
  // The builtin, not <x86intrin.h>'s __rdtsc: that header costs 1.3 s of
  // compile time in every file that includes this one.
  if (g_tick_calibration.tsc) return __builtin_ia32_rdtsc();
#endif
  return static_cast<Ticks>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now().time_since_epoch())
                                .count());
}

// Nanoseconds from `from` to `to`; 0 when `to` is earlier.
[[nodiscard]] inline std::uint64_t ticks_to_ns(Ticks from, Ticks to) noexcept {
  if (to <= from) return 0;
  return static_cast<std::uint64_t>(static_cast<double>(to - from) *
                                    g_tick_calibration.ns_per_tick);
}

// The same instant on both clocks, read as close together as a few tries
// allow (a preempted read is retried).
struct TickAnchor {
  Ticks ticks = 0;
  std::chrono::steady_clock::time_point steady;
};
[[nodiscard]] TickAnchor tick_anchor() noexcept;

// A tick reading as a steady_clock time (telemetry records), counted back
// from `now`, a fresh anchor, at the rate measured from load until `now`:
// a recent reading is off by its age times the rate's small error, never
// by the error accumulated since load.
[[nodiscard]] std::chrono::steady_clock::time_point to_steady(Ticks t,
                                                              const TickAnchor& now) noexcept;

}  // namespace kvxfer::internal
