// SPDX-License-Identifier: Apache-2.0
// The one table of engine counter names: for each, whether it counts or
// is a level (gauge), and whether it is public (an operator acts on it:
// refusals and rejections, the lane mix, bytes, fences, notifications) or
// unstable (how the lanes tune themselves; for debugging). Public names are
// API (docs/metrics.md): add one here only with its doc line. A counter an
// engine reports that is not here is unstable.
#include <algorithm>
#include <iterator>

#include "kvxfer/metrics.h"

namespace kvxfer {
namespace {

constexpr EngineCounterKind kCounter = EngineCounterKind::kCounter;
constexpr EngineCounterKind kGauge = EngineCounterKind::kGauge;
constexpr bool kPublic = true;
constexpr bool kUnstable = false;

// Sorted by name (engine_counter_info searches it).
constexpr EngineCounterInfo kEngineCounters[] = {
    // The same-host lane (engines/cma/).
    {"cma_bytes", kCounter, kPublic},
    {"cma_caller_slice_max_bytes", kGauge, kUnstable},  // largest caller slice
    {"cma_caller_slices", kCounter, kUnstable},
    {"cma_mapped_peers", kCounter, kPublic},  // peers whose pool was mapped
    {"cma_notifications_received", kCounter, kPublic},
    {"cma_notifications_refused", kCounter, kPublic},
    {"cma_notifications_sent", kCounter, kPublic},
    {"cma_reads", kCounter, kPublic},
    {"cma_writes", kCounter, kPublic},
    // The tcp lane (engines/tcp/). Bytes are wire bytes, frame headers included.
    {"tcp_bytes_received", kCounter, kPublic},
    {"tcp_bytes_sent", kCounter, kPublic},
    {"tcp_connections_accepted", kCounter, kUnstable},
    {"tcp_fences_superseded", kCounter, kPublic},
    {"tcp_frames_received", kCounter, kUnstable},
    {"tcp_notifications_sent", kCounter, kPublic},
    {"tcp_reads", kCounter, kPublic},
    {"tcp_refused_frame", kCounter, kPublic},
    {"tcp_refused_full", kCounter, kPublic},
    {"tcp_refused_identity", kCounter, kPublic},
    {"tcp_refused_notify", kCounter, kPublic},
    {"tcp_refused_runs", kCounter, kPublic},
    {"tcp_refused_stale_fence", kCounter, kPublic},
    {"tcp_refused_token", kCounter, kPublic},
    {"tcp_writes", kCounter, kPublic},
    // The UCX lane (engines/ucx/): puts and gets over RDMA.
    {"ucx_acks_ignored", kCounter, kUnstable},     // late acks, dropped
    {"ucx_driver_overlaps", kCounter, kUnstable},  // debug check: stays 0
    {"ucx_fences_received", kCounter, kPublic},
    {"ucx_fences_refused", kCounter, kPublic},
    {"ucx_gets", kCounter, kUnstable},  // gets per read: runs
    {"ucx_notifications_received", kCounter, kPublic},
    {"ucx_notifications_refused", kCounter, kPublic},
    {"ucx_notifications_sent", kCounter, kPublic},
    {"ucx_progress_wakes", kCounter, kUnstable},
    {"ucx_puts", kCounter, kUnstable},  // puts per write: runs
    {"ucx_reads", kCounter, kPublic},
    {"ucx_writes", kCounter, kPublic},
};

constexpr bool sorted_by_name() {
  for (std::size_t i = 1; i < std::size(kEngineCounters); ++i) {
    if (!(kEngineCounters[i - 1].name < kEngineCounters[i].name)) return false;
  }
  return true;
}
static_assert(sorted_by_name(), "kEngineCounters must be sorted by name, each name once");

}  // namespace

std::span<const EngineCounterInfo> engine_counter_table() noexcept { return kEngineCounters; }

EngineCounterInfo engine_counter_info(std::string_view name) noexcept {
  const auto* it = std::lower_bound(
      std::begin(kEngineCounters), std::end(kEngineCounters), name,
      [](const EngineCounterInfo& info, std::string_view n) { return info.name < n; });
  if (it != std::end(kEngineCounters) && it->name == name) return *it;
  return EngineCounterInfo{name, kCounter, kUnstable};
}

}  // namespace kvxfer
