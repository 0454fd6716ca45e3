// SPDX-License-Identifier: Apache-2.0
// Call and delivery durations, summarized: percentiles of a list, or of a
// fixed-bucket histogram when there are too many to keep one by one.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvxfer::tools {

// A call's duration in µs, the unit of every Timing.
inline double micros(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

struct Timing {
  std::uint64_t count = 0;
  double mean_us = 0;
  double p50_us = 0;
  double p99_us = 0;
  double max_us = 0;
  static Timing of(std::vector<double> micros);
};

// Call durations too many to keep one by one (every poll of a case): fixed
// buckets, 0.1 µs wide up to 100 µs and 2% wider each beyond, so a
// percentile is within 0.1 µs or 2% of the truth. add() allocates nothing.
class LatencyHistogram {
 public:
  LatencyHistogram();
  void add(double micros);
  [[nodiscard]] Timing timing() const;

 private:
  static std::size_t bucket(double micros);
  static double upper(std::size_t bucket);
  std::vector<std::uint64_t> counts_;
  std::uint64_t count_ = 0;
  double sum_ = 0;
  double max_ = 0;
};

}  // namespace kvxfer::tools
