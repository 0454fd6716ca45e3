// SPDX-License-Identifier: Apache-2.0
// src/telemetry/: what a transport measures of itself (the hot path's clock,
// latency histograms, the telemetry ring, metrics as text). Uses the public
// metrics and telemetry types only; the core keeps the live counters.
//
// Metrics as text: the names of ops and fault causes, and the Prometheus
// text exposition format of Transport::metrics() snapshots. Reads only the
// public snapshot; the live counters are kept in transfers.cc and
// peer_policy.cc.
#include "kvxfer/metrics.h"

#include <fmt/format.h>

#include <cstdint>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "kvxfer/telemetry.h"

namespace kvxfer {

std::string_view op_name(TransferOp op) noexcept {
  switch (op) {
    case TransferOp::kWrite:
      return "write";
    case TransferOp::kRead:
      return "read";
    case TransferOp::kNotify:
      return "notify";
  }
  return "unknown";
}

std::string_view fault_cause_name(FaultCause cause) noexcept {
  switch (cause) {
    case FaultCause::kRemoteDisconnect:
      return "REMOTE_DISCONNECT";
    case FaultCause::kNotFound:
      return "NOT_FOUND";
    case FaultCause::kStalled:
      return "STALLED";
    case FaultCause::kStrikeLimit:
      return "STRIKE_LIMIT";
    case FaultCause::kCheckFailed:
      return "CHECK_FAILED";
  }
  return "UNKNOWN";
}

namespace {

// A label value: backslash, double quote and newline escaped.
void append_escaped(std::string& out, std::string_view value) {
  for (const char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
}

// A metric name part from an engine counter's name: [a-zA-Z0-9_] kept,
// anything else becomes '_'.
std::string name_part(std::string_view name) {
  std::string out(name);
  for (char& c : out) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!ok) c = '_';
  }
  return out;
}

struct Label {
  std::string_view name;
  std::string_view value;
};

class Writer {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    fmt::format_to(std::back_inserter(out_), "# HELP {} {}\n# TYPE {} {}\n", name, help, name,
                   type);
  }

  void sample(std::string_view name, std::initializer_list<Label> labels, std::uint64_t value,
              std::string_view le = {}) {
    begin(name, labels, le);
    fmt::format_to(std::back_inserter(out_), " {}\n", value);
  }
  void sample(std::string_view name, std::initializer_list<Label> labels, double value) {
    begin(name, labels, {});
    fmt::format_to(std::back_inserter(out_), " {}\n", value);
  }

  void histogram(std::string_view name, std::initializer_list<Label> labels,
                 const LatencyHistogram& h) {
    const std::string bucket = fmt::format("{}_bucket", name);
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < LatencyHistogram::kBuckets; ++i) {
      cumulative += h.counts[i];
      sample(bucket, labels, cumulative,
             fmt::format("{}", LatencyHistogram::upper_bound_seconds(i)));
    }
    cumulative += h.counts[LatencyHistogram::kBuckets];
    sample(bucket, labels, cumulative, "+Inf");
    sample(fmt::format("{}_sum", name), labels, h.sum_seconds);
    sample(fmt::format("{}_count", name), labels, cumulative);
  }

  std::string take() { return std::move(out_); }

 private:
  void begin(std::string_view name, std::initializer_list<Label> labels, std::string_view le) {
    out_ += name;
    out_ += '{';
    bool first = true;
    auto label = [&](std::string_view n, std::string_view v) {
      if (!first) out_ += ',';
      first = false;
      out_ += n;
      out_ += "=\"";
      append_escaped(out_, v);
      out_ += '"';
    };
    for (const Label& l : labels) label(l.name, l.value);
    if (!le.empty()) label("le", le);
    out_ += '}';
  }

  std::string out_;
};

constexpr TransferOp kOps[] = {TransferOp::kWrite, TransferOp::kRead, TransferOp::kNotify};
constexpr FaultCause kCauses[] = {FaultCause::kRemoteDisconnect, FaultCause::kNotFound,
                                  FaultCause::kStalled, FaultCause::kStrikeLimit,
                                  FaultCause::kCheckFailed};

// One family per op-counter field, over every transport (and, for the peer
// families, every peer).
template <typename Field>
void op_family(Writer& w, std::span<const Metrics> ts, std::string_view name, std::string_view help,
               Field field) {
  w.family(name, "counter", help);
  for (const Metrics& m : ts) {
    for (const TransferOp op : kOps) {
      w.sample(name, {{"agent", m.agent}, {"op", op_name(op)}},
               field(m.ops[static_cast<std::size_t>(op)]));
    }
  }
}

template <typename Field>
void peer_op_family(Writer& w, std::span<const Metrics> ts, std::string_view name,
                    std::string_view help, Field field) {
  w.family(name, "counter", help);
  for (const Metrics& m : ts) {
    for (const PeerMetrics& p : m.peers) {
      for (const TransferOp op : kOps) {
        w.sample(name, {{"agent", m.agent}, {"peer", p.peer_id}, {"op", op_name(op)}},
                 field(p.ops[static_cast<std::size_t>(op)]));
      }
    }
  }
}

// One family of one sample per transport.
template <typename Value>
void agent_family(Writer& w, std::span<const Metrics> ts, std::string_view name,
                  std::string_view type, std::string_view help, Value value) {
  w.family(name, type, help);
  for (const Metrics& m : ts) w.sample(name, {{"agent", m.agent}}, value(m));
}

// One family of one sample per peer of every transport.
template <typename Value>
void peer_family(Writer& w, std::span<const Metrics> ts, std::string_view name,
                 std::string_view type, std::string_view help, Value value) {
  w.family(name, type, help);
  for (const Metrics& m : ts) {
    for (const PeerMetrics& p : m.peers) {
      w.sample(name, {{"agent", m.agent}, {"peer", p.peer_id}}, value(p));
    }
  }
}

// The transport's own counts: transfers and bytes by op, posts, strikes,
// faults by cause, and what is in flight or pending now.
void transport_families(Writer& w, std::span<const Metrics> ts) {
  op_family(w, ts, "kvxfer_transfers_done_total", "Transfers poll() reported done.",
            [](const OpCounters& c) { return c.transfers_done; });
  op_family(w, ts, "kvxfer_transfers_failed_total", "Transfers poll() reported failed.",
            [](const OpCounters& c) { return c.transfers_failed; });
  op_family(w, ts, "kvxfer_bytes_done_total", "Block bytes of the transfers reported done.",
            [](const OpCounters& c) { return c.bytes_done; });
  agent_family(w, ts, "kvxfer_post_failures_total", "counter",
               "Posts that failed (nothing was sent).",
               [](const Metrics& m) { return m.post_failures; });
  agent_family(w, ts, "kvxfer_posts_refused_total", "counter",
               "Posts refused without a strike: a peer at its in-flight limit, or faulted.",
               [](const Metrics& m) { return m.posts_refused; });
  agent_family(w, ts, "kvxfer_strikes_total", "counter",
               "Strikes given to peers (consecutive failures).",
               [](const Metrics& m) { return m.strikes_total; });
  w.family("kvxfer_faults_total", "counter", "Peer registrations faulted, by cause.");
  for (const Metrics& m : ts) {
    for (const FaultCause c : kCauses) {
      w.sample("kvxfer_faults_total", {{"agent", m.agent}, {"cause", fault_cause_name(c)}},
               m.faults[static_cast<std::size_t>(c)]);
    }
  }
  agent_family(w, ts, "kvxfer_inflight_transfers", "gauge", "Transfers posted and not yet drained.",
               [](const Metrics& m) { return m.inflight; });
  agent_family(w, ts, "kvxfer_peers_registered", "gauge", "Peers with a published registration.",
               [](const Metrics& m) { return m.peers_registered; });
  agent_family(w, ts, "kvxfer_registrations_pending", "gauge",
               "Asynchronous registrations queued or running.",
               [](const Metrics& m) { return m.registrations_pending; });
}

// Engine counters, as their declaration (engine_counters.cc) says: a
// public one is its own family, the unstable ones share one. That family
// is untyped: it mixes counts and levels, and promises neither.
void engine_families(Writer& w, std::span<const Metrics> ts) {
  std::map<std::string, std::pair<std::string, bool>> public_names;  // -> (metric, gauge)
  std::set<std::string> unstable_names;
  for (const Metrics& m : ts) {
    for (const auto& [counter, value] : m.engine_counters) {
      const EngineCounterInfo info = engine_counter_info(counter);
      if (!info.is_public) {
        unstable_names.insert(counter);
        continue;
      }
      const bool gauge = info.kind == EngineCounterKind::kGauge;
      public_names.try_emplace(
          counter, fmt::format("kvxfer_engine_{}{}", name_part(counter), gauge ? "" : "_total"),
          gauge);
    }
  }
  for (const auto& [counter, family] : public_names) {
    const auto& [name, gauge] = family;
    w.family(name, gauge ? "gauge" : "counter", fmt::format("The engine's {}.", counter));
    for (const Metrics& m : ts) {
      if (auto it = m.engine_counters.find(counter); it != m.engine_counters.end()) {
        w.sample(name, {{"agent", m.agent}}, it->second);
      }
    }
  }
  if (unstable_names.empty()) return;
  w.family("kvxfer_engine_unstable", "untyped",
           "Engine counters for tuning and debugging, by name (label counter): unstable, any "
           "may change meaning or go away in any release.");
  for (const std::string& counter : unstable_names) {
    for (const Metrics& m : ts) {
      if (auto it = m.engine_counters.find(counter); it != m.engine_counters.end()) {
        w.sample("kvxfer_engine_unstable", {{"agent", m.agent}, {"counter", counter}}, it->second);
      }
    }
  }
}

// Latency histograms: each transfer's, and the calls' own durations.
void latency_families(Writer& w, std::span<const Metrics> ts) {
  w.family("kvxfer_transfer_latency_seconds", "histogram",
           "Post to done, as seen by the poll() that reports the transfer.");
  for (const Metrics& m : ts) {
    for (const TransferOp op : kOps) {
      w.histogram("kvxfer_transfer_latency_seconds", {{"agent", m.agent}, {"op", op_name(op)}},
                  m.transfer_latency[static_cast<std::size_t>(op)]);
    }
  }
  w.family("kvxfer_write_blocks_duration_seconds", "histogram", "Duration of write_blocks calls.");
  for (const Metrics& m : ts) {
    w.histogram("kvxfer_write_blocks_duration_seconds", {{"agent", m.agent}},
                m.write_blocks_duration);
  }
  w.family("kvxfer_poll_duration_seconds", "histogram", "Duration of poll calls.");
  for (const Metrics& m : ts) {
    w.histogram("kvxfer_poll_duration_seconds", {{"agent", m.agent}}, m.poll_duration);
  }
}

// Each peer's counts and state, as the transport keeps them.
void peer_families(Writer& w, std::span<const Metrics> ts) {
  peer_op_family(w, ts, "kvxfer_peer_transfers_done_total",
                 "Transfers to the peer's current registration reported done.",
                 [](const OpCounters& c) { return c.transfers_done; });
  peer_op_family(w, ts, "kvxfer_peer_transfers_failed_total",
                 "Transfers to the peer's current registration reported failed.",
                 [](const OpCounters& c) { return c.transfers_failed; });
  peer_op_family(w, ts, "kvxfer_peer_bytes_done_total",
                 "Block bytes of the peer's transfers reported done.",
                 [](const OpCounters& c) { return c.bytes_done; });
  peer_family(w, ts, "kvxfer_peer_post_failures_total", "counter", "Failed posts to the peer.",
              [](const PeerMetrics& p) { return p.post_failures; });
  peer_family(w, ts, "kvxfer_peer_posts_refused_total", "counter",
              "Posts to the peer refused without a strike (in-flight limit, fault).",
              [](const PeerMetrics& p) { return p.posts_refused; });
  peer_family(w, ts, "kvxfer_peer_strikes_total", "counter", "Strikes given to the peer.",
              [](const PeerMetrics& p) { return p.strikes_total; });
  w.family("kvxfer_peer_faults_total", "counter",
           "The peer's registration faulted, by cause (at most one).");
  for (const Metrics& m : ts) {
    for (const PeerMetrics& p : m.peers) {
      for (const FaultCause c : kCauses) {
        w.sample("kvxfer_peer_faults_total",
                 {{"agent", m.agent}, {"peer", p.peer_id}, {"cause", fault_cause_name(c)}},
                 p.faults[static_cast<std::size_t>(c)]);
      }
    }
  }
  peer_family(w, ts, "kvxfer_peer_inflight_transfers", "gauge", "The peer's transfers in flight.",
              [](const PeerMetrics& p) { return p.inflight; });
  peer_family(w, ts, "kvxfer_peer_current_strikes", "gauge", "The peer's consecutive failures now.",
              [](const PeerMetrics& p) { return static_cast<std::uint64_t>(p.strikes); });
  peer_family(w, ts, "kvxfer_peer_faulted", "gauge", "1 once the peer's registration is faulted.",
              [](const PeerMetrics& p) { return std::uint64_t{p.faulted ? 1u : 0u}; });
}

}  // namespace

std::string prometheus_text(std::span<const Metrics> ts) {
  Writer w;
  transport_families(w, ts);
  engine_families(w, ts);
  latency_families(w, ts);
  peer_families(w, ts);
  return w.take();
}

std::string prometheus_text(const Metrics& transport) {
  return prometheus_text(std::span<const Metrics>(&transport, 1));
}

std::string_view result_name(TransferResult result) noexcept {
  switch (result) {
    case TransferResult::kDone:
      return "done";
    case TransferResult::kFailed:
      return "failed";
    case TransferResult::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

}  // namespace kvxfer
