// SPDX-License-Identifier: Apache-2.0
// kvxfer::Metrics: a snapshot of a transport's running totals, gauges and
// latency histograms (Transport::metrics()), and its Prometheus text form.
// Plain values: taking one copies, reading it touches nothing live.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvxfer {

// What a transfer does; metrics and telemetry records are kept per op.
enum class TransferOp : std::uint8_t { kWrite, kRead, kNotify };
inline constexpr std::size_t kNumTransferOps = 3;
// "write", "read", "notify": the `op` label.
[[nodiscard]] std::string_view op_name(TransferOp op) noexcept;

// Why a peer's registration was faulted: the `cause` label. The full cause
// (PeerStats::fault) starts with the same words where the core has them.
enum class FaultCause : std::uint8_t {
  kRemoteDisconnect,  // REMOTE_DISCONNECT: the endpoint is gone
  kNotFound,          // NOT_FOUND: the peer's registration is gone
  kStalled,           // STALLED: a transfer in progress past stall_timeout
  kStrikeLimit,       // STRIKE_LIMIT: strike_limit consecutive failures
  kCheckFailed,       // CHECK_FAILED: a transfer's state check itself failed
};
inline constexpr std::size_t kNumFaultCauses = 5;
[[nodiscard]] std::string_view fault_cause_name(FaultCause cause) noexcept;

// Counts per bucket of durations: fixed log-scale upper bounds of 1 µs
// times 2^i for i in 0..kBuckets-1 (1 µs to about 8.4 s), then one bucket
// above the largest bound. Buckets hold their own counts, not cumulative
// ones (the Prometheus text makes them cumulative).
struct LatencyHistogram {
  static constexpr std::size_t kBuckets = 24;
  [[nodiscard]] static constexpr double upper_bound_seconds(std::size_t i) noexcept {
    return 1e-6 * static_cast<double>(std::uint64_t{1} << i);
  }
  std::array<std::uint64_t, kBuckets + 1> counts{};
  std::uint64_t count = 0;  // the sum of counts
  double sum_seconds = 0;
};

// Per op: transfers reported done or failed by poll(), and the bytes of
// the done ones (a notification carries no block bytes).
struct OpCounters {
  std::uint64_t bytes_done = 0;
  std::uint64_t transfers_done = 0;
  std::uint64_t transfers_failed = 0;
};

struct PeerMetrics {
  std::string peer_id;
  // Counters of this registration (a new registration starts at zero).
  std::array<OpCounters, kNumTransferOps> ops{};
  std::uint64_t post_failures = 0;
  std::uint64_t posts_refused = 0;  // back-pressure or a faulted peer, no strike
  std::uint64_t strikes_total = 0;  // strikes given, ever (reset by nothing)
  // This registration's fault: at most one, by cause.
  std::array<std::uint64_t, kNumFaultCauses> faults{};
  // Gauges.
  std::uint64_t inflight = 0;
  int strikes = 0;  // consecutive failures now
  bool faulted = false;
};

struct Metrics {
  std::string agent;
  // Since the transport was made, removed peers' included.
  std::array<OpCounters, kNumTransferOps> ops{};
  std::uint64_t post_failures = 0;
  std::uint64_t posts_refused = 0;
  std::uint64_t strikes_total = 0;
  std::array<std::uint64_t, kNumFaultCauses> faults{};  // each fault once, when it happens
  // Gauges.
  std::uint64_t inflight = 0;
  std::uint64_t peers_registered = 0;
  std::uint64_t registrations_pending = 0;
  // Stats::engine_counters.
  std::map<std::string, std::uint64_t> engine_counters;
  // Post to done, as seen by the poll() that reports it (done transfers only).
  std::array<LatencyHistogram, kNumTransferOps> transfer_latency{};
  // The whole public call, failed and throwing calls included.
  LatencyHistogram write_blocks_duration;
  LatencyHistogram poll_duration;
  std::vector<PeerMetrics> peers;  // sorted by peer_id
};

// How an engine counter (Stats::engine_counters, Metrics::engine_counters)
// becomes a metric, declared for every name in one table
// (src/telemetry/engine_counters.cc). A public counter is its own family,
// kvxfer_engine_<name>_total (a gauge: kvxfer_engine_<name>), a name kept
// as API. An unstable one (tuning, debugging) is one sample of the single
// family kvxfer_engine_unstable{counter="<name>"}, and may change or go
// away in any release.
enum class EngineCounterKind : std::uint8_t { kCounter, kGauge };
struct EngineCounterInfo {
  std::string_view name;
  EngineCounterKind kind = EngineCounterKind::kCounter;
  bool is_public = false;
};

// Every declared engine counter, sorted by name.
[[nodiscard]] std::span<const EngineCounterInfo> engine_counter_table() noexcept;
// The declaration of `name`; a name the table does not declare is an
// unstable counter (so a new debugging counter never becomes API by
// accident).
[[nodiscard]] EngineCounterInfo engine_counter_info(std::string_view name) noexcept;

// The Prometheus text exposition format (version 0.0.4) of one or more
// transports' metrics, each family once with # HELP and # TYPE; names
// kvxfer_*, labels agent, peer, op, cause, counter.
[[nodiscard]] std::string prometheus_text(std::span<const Metrics> transports);
[[nodiscard]] std::string prometheus_text(const Metrics& transport);

}  // namespace kvxfer
