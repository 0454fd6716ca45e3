// SPDX-License-Identifier: Apache-2.0
// What the tcp lane counts (its tcp_* engine counters, docs/metrics.md) and
// how often it logs what peers make it do. Counters are atomics any thread
// adds to; a RateLimit belongs to one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace kvxfer::internal::tcp {

using Clock = std::chrono::steady_clock;

struct Counters {
  std::atomic<std::uint64_t> writes{0};
  std::atomic<std::uint64_t> reads{0};
  std::atomic<std::uint64_t> notifications_sent{0};
  std::atomic<std::uint64_t> bytes_sent{0};
  std::atomic<std::uint64_t> bytes_received{0};
  std::atomic<std::uint64_t> frames_received{0};
  std::atomic<std::uint64_t> connections_accepted{0};
  std::atomic<std::uint64_t> refused_token{0};
  std::atomic<std::uint64_t> refused_frame{0};
  std::atomic<std::uint64_t> refused_runs{0};
  std::atomic<std::uint64_t> refused_stale_fence{0};
  std::atomic<std::uint64_t> refused_full{0};
  std::atomic<std::uint64_t> refused_notify{0};
  std::atomic<std::uint64_t> refused_identity{0};
  std::atomic<std::uint64_t> fences_superseded{0};
};

inline void bump(std::atomic<std::uint64_t>& counter, std::uint64_t by = 1) {
  counter.fetch_add(by, std::memory_order_relaxed);
}

// At most five log lines a second for what peers can make us log as often
// as they like (refused frames and hellos); the counters count every one.
class RateLimit {
 public:
  bool allow() {
    const auto now = Clock::now();
    if (now - window_ > std::chrono::seconds(1)) {
      window_ = now;
      in_window_ = 0;
    }
    return ++in_window_ <= 5;
  }

 private:
  Clock::time_point window_{};
  int in_window_ = 0;
};

}  // namespace kvxfer::internal::tcp
