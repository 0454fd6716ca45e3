// SPDX-License-Identifier: Apache-2.0
// The calibration of the hot path's clock (clock.h): whether the TSC may be
// used, and its rate against steady_clock, measured once at load.
#include "telemetry/clock.h"

#include <fstream>
#include <string>

namespace kvxfer::internal {
namespace {

Ticks read_ticks() noexcept {
#if defined(__x86_64__)
  return __builtin_ia32_rdtsc();
#else
  return 0;
#endif
}

// A TSC reading with a steady_clock reading either side of it; the
// tightest of a few tries, so a preemption between the reads is not kept.
TickAnchor bracketed(bool tsc) noexcept {
  TickAnchor best;
  auto best_width = std::chrono::steady_clock::duration::max();
  for (int i = 0; i < 8; ++i) {
    const auto before = std::chrono::steady_clock::now();
    const Ticks t = tsc ? read_ticks() : 0;
    const auto after = std::chrono::steady_clock::now();
    if (after - before < best_width) {
      best_width = after - before;
      best.ticks = t;
      best.steady = before + (after - before) / 2;
    }
    if (best_width < std::chrono::nanoseconds(200)) break;
  }
  return best;
}

TickCalibration calibrate() {
  TickCalibration c;
  c.steady0 = std::chrono::steady_clock::now();
  c.ticks0 = static_cast<Ticks>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(c.steady0.time_since_epoch()).count());
#if defined(__x86_64__)
  // Only where the kernel trusts the TSC as its own clock: then it is
  // invariant and synchronized across cores (a migrated thread reads the
  // same counter).
  std::string source;
  std::ifstream("/sys/devices/system/clocksource/clocksource0/current_clocksource") >> source;
  if (source != "tsc") return c;
  // The rate over 250 us between two tight brackets (each under 200 ns
  // wide when not preempted, so within about 0.2%: histogram buckets are
  // powers of two); to_steady() refines it over the process's life. Every
  // process that loads the library pays this spin once, so it stays short.
  const TickAnchor a = bracketed(true);
  while (std::chrono::steady_clock::now() - a.steady < std::chrono::microseconds(250)) {
  }
  const TickAnchor b = bracketed(true);
  if (b.ticks <= a.ticks || b.steady <= a.steady) return c;
  c.tsc = true;
  c.ns_per_tick =
      static_cast<double>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(b.steady - a.steady).count()) /
      static_cast<double>(b.ticks - a.ticks);
  c.steady0 = a.steady;
  c.ticks0 = a.ticks;
#endif
  return c;
}

}  // namespace

const TickCalibration g_tick_calibration = calibrate();

TickAnchor tick_anchor() noexcept {
  if (g_tick_calibration.tsc) return bracketed(true);
  TickAnchor now;
  now.steady = std::chrono::steady_clock::now();
  now.ticks = static_cast<Ticks>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.steady.time_since_epoch()).count());
  return now;
}

std::chrono::steady_clock::time_point to_steady(Ticks t, const TickAnchor& now) noexcept {
  const TickCalibration& c = g_tick_calibration;
  if (!c.tsc) return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(t));
  // The rate since load, once that span is long enough to beat the 250 us
  // calibration.
  double ns_per_tick = c.ns_per_tick;
  const auto span = now.steady - c.steady0;
  if (span > std::chrono::milliseconds(100) && now.ticks > c.ticks0) {
    ns_per_tick =
        static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(span).count()) /
        static_cast<double>(now.ticks - c.ticks0);
  }
  const double back = (static_cast<double>(now.ticks) - static_cast<double>(t)) * ns_per_tick;
  return now.steady - std::chrono::nanoseconds(std::llround(back));
}

}  // namespace kvxfer::internal
