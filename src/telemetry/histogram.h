// SPDX-License-Identifier: Apache-2.0
// A latency histogram the hot path updates without a lock of its own or an
// allocation: a fixed array of relaxed atomic counters over the public
// LatencyHistogram's log-scale buckets. Readers take a snapshot that may be
// a few updates behind, never torn within one counter.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstdint>

#include "kvxfer/metrics.h"

namespace kvxfer::internal {

class AtomicHistogram {
 public:
  static constexpr std::size_t kBuckets = LatencyHistogram::kBuckets;

  // The bucket of a duration: the first i with ns <= 1000 * 2^i, or
  // kBuckets past the largest bound.
  [[nodiscard]] static constexpr std::size_t bucket_of(std::uint64_t ns) noexcept {
    const std::uint64_t us = (ns + 999) / 1000;  // rounded up
    const auto i = us <= 1 ? std::size_t{0} : static_cast<std::size_t>(std::bit_width(us - 1));
    return i < kBuckets ? i : kBuckets;
  }

  // Counts a duration. Callers are serialized (they hold the transport's
  // mutex), so each counter is a plain load and store, no locked
  // instruction; a reader on another thread needs no lock.
  void record_serialized(std::uint64_t ns) noexcept {
    auto& count = counts_[bucket_of(ns)];
    count.store(count.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    sum_ns_.store(sum_ns_.load(std::memory_order_relaxed) + ns, std::memory_order_relaxed);
  }

  [[nodiscard]] LatencyHistogram snapshot() const noexcept {
    LatencyHistogram h;
    for (std::size_t i = 0; i <= kBuckets; ++i) {
      h.counts[i] = counts_[i].load(std::memory_order_relaxed);
      h.count += h.counts[i];
    }
    h.sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
    return h;
  }

 private:
  std::array<std::atomic<std::uint64_t>, kBuckets + 1> counts_{};
  std::atomic<std::uint64_t> sum_ns_{0};
};

static_assert(AtomicHistogram::bucket_of(0) == 0);
static_assert(AtomicHistogram::bucket_of(1000) == 0);
static_assert(AtomicHistogram::bucket_of(1001) == 1);
static_assert(AtomicHistogram::bucket_of(2000) == 1);
static_assert(AtomicHistogram::bucket_of(2001) == 2);
static_assert(AtomicHistogram::bucket_of(std::uint64_t{1000} << 23) == 23);
static_assert(AtomicHistogram::bucket_of((std::uint64_t{1000} << 23) + 1) == 24);

}  // namespace kvxfer::internal
