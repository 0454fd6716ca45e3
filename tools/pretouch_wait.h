// SPDX-License-Identifier: Apache-2.0
// Waiting for a transport's pre-touch of its pool (KVXFER_PRETOUCH,
// docs/performance.md "First pass"): a server registers its pool at start-up
// and meets its first transfers later; the bench and the demo model that by
// letting the registration's background touch finish before they time a
// first pass, and say how long it took.
#pragma once

#include <chrono>
#include <thread>

#include "kvxfer/transport.h"

namespace kvxfer::tools {

// Seconds until `transport`'s pre-touch finished (0 when it has none, or it
// was done); gives up after `limit`.
inline double wait_for_pretouch(const Transport& transport,
                                std::chrono::seconds limit = std::chrono::seconds(120)) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const auto counters = transport.stats().engine_counters;
    const auto it = counters.find("pretouch_running");
    const auto waited = std::chrono::steady_clock::now() - start;
    if (it == counters.end() || it->second == 0 || waited > limit) {
      return std::chrono::duration<double>(waited).count();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace kvxfer::tools
