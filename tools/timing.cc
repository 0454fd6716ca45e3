// SPDX-License-Identifier: Apache-2.0
#include "timing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvxfer::tools {

Timing Timing::of(std::vector<double> micros) {
  Timing t;
  t.count = micros.size();
  if (micros.empty()) return t;
  std::sort(micros.begin(), micros.end());
  t.mean_us = std::accumulate(micros.begin(), micros.end(), 0.0) / static_cast<double>(t.count);
  auto rank = [&](double q) {
    const auto i = static_cast<std::size_t>(q * static_cast<double>(t.count - 1) + 0.5);
    return micros[std::min(i, micros.size() - 1)];
  };
  t.p50_us = rank(0.50);
  t.p99_us = rank(0.99);
  t.max_us = micros.back();
  return t;
}

namespace {
constexpr double kLinearStepUs = 0.1;
constexpr std::size_t kLinearBuckets = 1000;  // up to 100 µs
constexpr double kGrowth = 1.02;
constexpr std::size_t kLogBuckets = 700;  // 100 µs * 1.02^700: over 10^8 µs
}  // namespace

LatencyHistogram::LatencyHistogram() : counts_(kLinearBuckets + kLogBuckets, 0) {}

std::size_t LatencyHistogram::bucket(double micros) {
  if (!(micros > 0)) return 0;
  if (micros < kLinearStepUs * kLinearBuckets) {
    return static_cast<std::size_t>(micros / kLinearStepUs);
  }
  const double above = std::log(micros / (kLinearStepUs * kLinearBuckets)) / std::log(kGrowth);
  return std::min(kLinearBuckets + static_cast<std::size_t>(above),
                  kLinearBuckets + kLogBuckets - 1);
}

double LatencyHistogram::upper(std::size_t b) {
  if (b < kLinearBuckets) return kLinearStepUs * static_cast<double>(b + 1);
  return kLinearStepUs * kLinearBuckets *
         std::pow(kGrowth, static_cast<double>(b - kLinearBuckets + 1));
}

void LatencyHistogram::add(double micros) {
  ++counts_[bucket(micros)];
  ++count_;
  sum_ += micros;
  max_ = std::max(max_, micros);
}

Timing LatencyHistogram::timing() const {
  Timing t;
  t.count = count_;
  if (count_ == 0) return t;
  t.mean_us = sum_ / static_cast<double>(count_);
  t.max_us = max_;
  auto rank = [&](double q) {
    const auto target = static_cast<std::uint64_t>(q * static_cast<double>(count_ - 1)) + 1;
    std::uint64_t seen = 0;
    for (std::size_t b = 0; b < counts_.size(); ++b) {
      seen += counts_[b];
      if (seen >= target) return std::min(upper(b), max_);
    }
    return max_;
  };
  t.p50_us = rank(0.50);
  t.p99_us = rank(0.99);
  return t;
}

}  // namespace kvxfer::tools
