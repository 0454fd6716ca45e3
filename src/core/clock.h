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

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

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
  if (g_tick_calibration.tsc) return __rdtsc();
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

// A tick reading as a steady_clock time (the stall rule, telemetry records).
[[nodiscard]] inline std::chrono::steady_clock::time_point to_steady(Ticks t) noexcept {
  const TickCalibration& c = g_tick_calibration;
  const double ns = (static_cast<double>(t) - static_cast<double>(c.ticks0)) * c.ns_per_tick;
  return c.steady0 + std::chrono::nanoseconds(std::llround(ns));
}

}  // namespace kvxfer::internal
