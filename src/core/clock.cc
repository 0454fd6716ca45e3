// The calibration of the hot path's clock (clock.h): whether the TSC may be
// used, and its rate against steady_clock, measured once at load.
#include "core/clock.h"

#include <fstream>
#include <string>

namespace kvxfer::internal {
namespace {

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
  // The rate over 2 ms of steady_clock: a 40 ns read at each end is an
  // error of 0.004%.
  const auto s0 = std::chrono::steady_clock::now();
  const Ticks t0 = __rdtsc();
  auto s1 = s0;
  while (s1 - s0 < std::chrono::milliseconds(2)) s1 = std::chrono::steady_clock::now();
  const Ticks t1 = __rdtsc();
  if (t1 <= t0) return c;
  c.tsc = true;
  c.ns_per_tick =
      static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(s1 - s0).count()) /
      static_cast<double>(t1 - t0);
  c.steady0 = s1;
  c.ticks0 = t1;
#endif
  return c;
}

}  // namespace

const TickCalibration g_tick_calibration = calibrate();

}  // namespace kvxfer::internal
