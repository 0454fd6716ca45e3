// SPDX-License-Identifier: Apache-2.0
// Metrics: Transport::metrics() and its Prometheus text, read back through a
// small parser of the exposition format and checked against a known number
// of transfers, against stats(), and against faults the fault plan scripts.
#include "kvxfer/metrics.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "agents.h"

namespace kvxfer::unit {
namespace {

// --- a parser of the text exposition format, strict enough to fail ------

using Labels = std::map<std::string, std::string>;

struct Sample {
  std::string name;
  Labels labels;
  double value = 0;
};

struct Exposition {
  std::map<std::string, std::string> types;  // family -> counter | gauge | histogram | untyped
  std::map<std::string, std::string> helps;
  std::vector<Sample> samples;

  // The one sample of `name` whose labels include every pair of `want`;
  // a test failure (and NaN) when there is none or more than one.
  [[nodiscard]] double value(const std::string& name, const Labels& want) const {
    const Sample* found = nullptr;
    int matches = 0;
    for (const Sample& s : samples) {
      if (s.name != name) continue;
      bool ok = true;
      for (const auto& [k, v] : want) {
        auto it = s.labels.find(k);
        if (it == s.labels.end() || it->second != v) ok = false;
      }
      if (ok) {
        found = &s;
        ++matches;
      }
    }
    if (matches != 1) {
      ADD_FAILURE() << matches << " samples of " << name << " match";
      return std::numeric_limits<double>::quiet_NaN();
    }
    return found->value;
  }
};

// Reads one label value after its opening quote, undoing the escapes.
std::string read_label_value(std::string_view line, std::size_t& pos) {
  std::string out;
  while (pos < line.size() && line[pos] != '"') {
    char c = line[pos++];
    if (c == '\\') {
      if (pos >= line.size()) throw std::runtime_error("dangling escape");
      const char e = line[pos++];
      if (e == 'n') {
        c = '\n';
      } else if (e == '\\' || e == '"') {
        c = e;
      } else {
        throw std::runtime_error("bad escape");
      }
    }
    out += c;
  }
  if (pos >= line.size()) throw std::runtime_error("unterminated label value");
  ++pos;  // the closing quote
  return out;
}

Exposition parse(const std::string& text) {
  Exposition e;
  std::istringstream in(text);
  std::string line;
  std::string family;  // the family of the last # TYPE
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line.starts_with("# HELP ")) {
      const auto rest = line.substr(7);
      const auto sp = rest.find(' ');
      if (sp == std::string::npos) throw std::runtime_error("HELP without text: " + line);
      if (e.helps.contains(rest.substr(0, sp))) throw std::runtime_error("HELP twice: " + line);
      e.helps[rest.substr(0, sp)] = rest.substr(sp + 1);
      continue;
    }
    if (line.starts_with("# TYPE ")) {
      std::istringstream words(line.substr(7));
      std::string name;
      std::string type;
      words >> name >> type;
      if (type != "counter" && type != "gauge" && type != "histogram" && type != "untyped") {
        throw std::runtime_error("bad type: " + line);
      }
      if (e.types.contains(name)) throw std::runtime_error("TYPE twice: " + line);
      if (!e.helps.contains(name)) throw std::runtime_error("TYPE before HELP: " + line);
      e.types[name] = type;
      family = name;
      continue;
    }
    if (line[0] == '#') continue;
    Sample s;
    std::size_t pos = line.find_first_of("{ ");
    if (pos == std::string::npos) throw std::runtime_error("no value: " + line);
    s.name = line.substr(0, pos);
    if (line[pos] == '{') {
      ++pos;
      while (line.at(pos) != '}') {
        const std::size_t eq = line.find('=', pos);
        if (eq == std::string::npos || line.at(eq + 1) != '"') {
          throw std::runtime_error("bad label: " + line);
        }
        const std::string key = line.substr(pos, eq - pos);
        pos = eq + 2;
        s.labels[key] = read_label_value(line, pos);
        if (line.at(pos) == ',') ++pos;
      }
      ++pos;
    }
    if (line.at(pos) != ' ') throw std::runtime_error("no space before value: " + line);
    const std::string value = line.substr(pos + 1);
    s.value = value == "+Inf" ? std::numeric_limits<double>::infinity() : std::stod(value);
    // Every sample belongs to the family typed last.
    const std::string_view n = s.name;
    const bool of_family =
        n == family ||
        (e.types[family] == "histogram" &&
         (n == family + "_bucket" || n == family + "_sum" || n == family + "_count"));
    if (!of_family) throw std::runtime_error("sample outside its family: " + line);
    e.samples.push_back(std::move(s));
  }
  return e;
}

// Checks the shape rules of the format the parser does not: counter names,
// cumulative buckets ending in +Inf equal to _count.
void expect_well_formed(const Exposition& e) {
  for (const auto& [name, type] : e.types) {
    if (type == "counter") {
      EXPECT_TRUE(name.ends_with("_total")) << name;
    }
    if (type != "histogram") continue;
    std::map<Labels, std::vector<std::pair<double, double>>> series;  // labels -> (le, count)
    std::map<Labels, double> counts;
    for (const Sample& s : e.samples) {
      Labels rest = s.labels;
      if (s.name == name + "_bucket") {
        const double le = rest.at("le") == "+Inf" ? std::numeric_limits<double>::infinity()
                                                  : std::stod(rest.at("le"));
        rest.erase("le");
        series[rest].emplace_back(le, s.value);
      } else if (s.name == name + "_count") {
        counts[rest] = s.value;
      }
    }
    EXPECT_FALSE(series.empty()) << name;
    for (const auto& [labels, buckets] : series) {
      for (std::size_t i = 1; i < buckets.size(); ++i) {
        EXPECT_LT(buckets[i - 1].first, buckets[i].first) << name;
        EXPECT_LE(buckets[i - 1].second, buckets[i].second) << name;
      }
      ASSERT_TRUE(std::isinf(buckets.back().first)) << name;
      EXPECT_EQ(buckets.back().second, counts.at(labels)) << name;
    }
  }
}

Exposition scrape(const Transport& t) {
  const std::string text = prometheus_text(t.metrics());
  Exposition e = parse(text);
  expect_well_formed(e);
  return e;
}

// Every call and transfer timed, so histogram counts are exact.
Options timed_options() {
  Options options = loopback_options();
  options.latency_sample_every = 1;
  return options;
}

class MetricsTest : public ::testing::Test {
 protected:
  MetricsTest() {
    a.pool.fill_pattern(1);
    add_peer(a.transport, "b", b.transport);
  }
  // Polls until every id is reported (done or failed).
  void drain(std::size_t expected) {
    std::size_t reported = 0;
    for (int i = 0; i < 1000 && reported < expected; ++i) {
      const PollResult r = a.transport.poll("b");
      ++polls;
      reported += r.done.size() + r.failed.size();
    }
    ASSERT_EQ(reported, expected);
  }
  Agent b{"agent-b"};
  Agent a{"agent-a", timed_options()};
  int polls = 0;
};

const Labels kA{{"agent", "agent-a"}};
Labels with(Labels labels, const std::string& k, const std::string& v) {
  labels[k] = v;
  return labels;
}

TEST_F(MetricsTest, CountsTransfersAndBytesByOp) {
  for (std::int64_t i = 0; i < 5; ++i) ASSERT_TRUE(write(a.transport, "b", {i, i + 5}, {i, i + 5}));
  const std::vector<std::int64_t> one{20};
  for (std::int64_t i = 0; i < 3; ++i) {
    const std::vector<std::int64_t> local{20 + i};
    const std::vector<std::int64_t> remote{i};
    ASSERT_TRUE(a.transport.read_blocks("b", std::span<const std::int64_t>(local),
                                        std::span<const std::int64_t>(remote)));
  }
  const std::vector<std::uint8_t> note{1, 2, 3};
  ASSERT_TRUE(a.transport.send_notification("b", note));
  drain(9);

  const Exposition e = scrape(a.transport);
  const Labels ab = with(kA, "peer", "b");
  EXPECT_EQ(e.value("kvxfer_transfers_done_total", with(kA, "op", "write")), 5);
  EXPECT_EQ(e.value("kvxfer_transfers_done_total", with(kA, "op", "read")), 3);
  EXPECT_EQ(e.value("kvxfer_transfers_done_total", with(kA, "op", "notify")), 1);
  EXPECT_EQ(e.value("kvxfer_bytes_done_total", with(kA, "op", "write")), 5 * 2 * kBlockLen);
  EXPECT_EQ(e.value("kvxfer_bytes_done_total", with(kA, "op", "read")), 3 * kBlockLen);
  EXPECT_EQ(e.value("kvxfer_bytes_done_total", with(kA, "op", "notify")), 0);
  EXPECT_EQ(e.value("kvxfer_transfers_failed_total", with(kA, "op", "write")), 0);
  EXPECT_EQ(e.value("kvxfer_peer_transfers_done_total", with(ab, "op", "write")), 5);
  EXPECT_EQ(e.value("kvxfer_peer_transfers_done_total", with(ab, "op", "read")), 3);
  EXPECT_EQ(e.value("kvxfer_peer_bytes_done_total", with(ab, "op", "write")), 5 * 2 * kBlockLen);

  // The same figures as stats().
  const PeerStats s = peer_stats(a.transport, "b");
  EXPECT_EQ(s.transfers_done, 9u);
  EXPECT_EQ(e.value("kvxfer_peer_transfers_done_total", with(ab, "op", "write")) +
                e.value("kvxfer_peer_transfers_done_total", with(ab, "op", "read")) +
                e.value("kvxfer_peer_transfers_done_total", with(ab, "op", "notify")),
            s.transfers_done);
  EXPECT_EQ(e.value("kvxfer_peer_bytes_done_total", with(ab, "op", "write")) +
                e.value("kvxfer_peer_bytes_done_total", with(ab, "op", "read")),
            s.bytes_done);
  EXPECT_EQ(e.value("kvxfer_peer_bytes_done_total", with(ab, "op", "read")), s.read_bytes_done);
}

TEST_F(MetricsTest, HistogramsCountEveryCallAndEveryDoneTransfer) {
  for (std::int64_t i = 0; i < 4; ++i) ASSERT_TRUE(write(a.transport, "b", {i}, {i}));
  // A write to an unknown peer is still a write_blocks call.
  EXPECT_FALSE(write(a.transport, "nobody", {1}, {1}));
  drain(4);

  const Exposition e = scrape(a.transport);
  EXPECT_EQ(e.value("kvxfer_write_blocks_duration_seconds_count", kA), 5);
  EXPECT_EQ(e.value("kvxfer_poll_duration_seconds_count", kA), polls);
  EXPECT_EQ(e.value("kvxfer_transfer_latency_seconds_count", with(kA, "op", "write")), 4);
  EXPECT_EQ(e.value("kvxfer_transfer_latency_seconds_count", with(kA, "op", "read")), 0);
  EXPECT_GT(e.value("kvxfer_write_blocks_duration_seconds_sum", kA), 0);
  EXPECT_LT(e.value("kvxfer_write_blocks_duration_seconds_sum", kA), 5.0);
  // Every loopback write lands well within 8 s: nothing above the largest bound.
  EXPECT_EQ(e.value("kvxfer_transfer_latency_seconds_bucket",
                    with(with(kA, "op", "write"), "le", "8.388608")),
            4);
}

TEST(MetricsSamplingTest, OneCallAndTransferInNIsTimedAndCountersStayExact) {
  Options options = loopback_options();
  options.latency_sample_every = 4;
  Agent b{"agent-b"};
  Agent a{"agent-a", options};
  add_peer(a.transport, "b", b.transport);
  int polls = 0;
  for (std::int64_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(write(a.transport, "b", {i}, {i}));
    while (a.transport.poll("b").done.empty()) ++polls;
    ++polls;
  }

  const Metrics m = a.transport.metrics();
  EXPECT_EQ(m.write_blocks_duration.count, 2u);  // calls 4 and 8
  EXPECT_EQ(m.poll_duration.count, static_cast<std::uint64_t>(polls / 4));
  EXPECT_EQ(m.transfer_latency[static_cast<std::size_t>(TransferOp::kWrite)].count, 2u);
  EXPECT_EQ(m.ops[static_cast<std::size_t>(TransferOp::kWrite)].transfers_done, 8u);
}

TEST(MetricsSamplingTest, ASampleRateBelowOneIsRefused) {
  Options options = loopback_options();
  options.latency_sample_every = 0;
  EXPECT_THROW(Agent("agent-a", options), std::invalid_argument);
}

TEST_F(MetricsTest, HistogramBucketsHoldDurationsByTheirUpperBound) {
  // A transfer held for 20 ms lands in the first bucket at or above 20 ms
  // (32.768 ms) and in none below 16.384 ms.
  a.plan().hold_next();
  const auto id = write(a.transport, "b", {1}, {1});
  ASSERT_TRUE(id);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  a.plan().land(*id);
  drain(1);

  const Metrics m = a.transport.metrics();
  const LatencyHistogram& h = m.transfer_latency[static_cast<std::size_t>(TransferOp::kWrite)];
  EXPECT_EQ(h.count, 1u);
  EXPECT_GE(h.sum_seconds, 0.020);
  const Exposition e = scrape(a.transport);
  const Labels w = with(kA, "op", "write");
  EXPECT_EQ(e.value("kvxfer_transfer_latency_seconds_bucket", with(w, "le", "0.016384")), 0);
  EXPECT_EQ(e.value("kvxfer_transfer_latency_seconds_bucket", with(w, "le", "+Inf")), 1);
}

TEST_F(MetricsTest, FailuresPostFailuresAndStrikesMatchStats) {
  const auto id = write(a.transport, "b", {1}, {1});
  ASSERT_TRUE(id);
  a.plan().finish_with(*id, Status::kBackend);
  drain(1);
  a.plan().fail_next_posts(Status::kBackend);
  EXPECT_FALSE(write(a.transport, "b", {2}, {2}));

  const Exposition e = scrape(a.transport);
  const PeerStats s = peer_stats(a.transport, "b");
  const Labels ab = with(kA, "peer", "b");
  EXPECT_EQ(e.value("kvxfer_transfers_failed_total", with(kA, "op", "write")), 1);
  EXPECT_EQ(e.value("kvxfer_peer_transfers_failed_total", with(ab, "op", "write")),
            s.transfers_failed);
  EXPECT_EQ(e.value("kvxfer_post_failures_total", kA), 1);
  EXPECT_EQ(e.value("kvxfer_peer_post_failures_total", ab), s.post_failures);
  EXPECT_EQ(e.value("kvxfer_strikes_total", kA), 2);
  EXPECT_EQ(e.value("kvxfer_peer_current_strikes", ab), s.strikes);
  EXPECT_EQ(e.value("kvxfer_peer_current_strikes", ab), 2);
  EXPECT_EQ(e.value("kvxfer_transfer_latency_seconds_count", with(kA, "op", "write")), 0);
}

TEST_F(MetricsTest, ARemoteDisconnectCountsOneFaultOnce) {
  a.plan().disconnect("agent-b");
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(write(a.transport, "b", {1}, {1}));
  (void)a.transport.poll("b");

  const Exposition e = scrape(a.transport);
  const Labels ab = with(kA, "peer", "b");
  EXPECT_EQ(e.value("kvxfer_faults_total", with(kA, "cause", "REMOTE_DISCONNECT")), 1);
  EXPECT_EQ(e.value("kvxfer_faults_total", with(kA, "cause", "STRIKE_LIMIT")), 0);
  EXPECT_EQ(e.value("kvxfer_peer_faults_total", with(ab, "cause", "REMOTE_DISCONNECT")), 1);
  EXPECT_EQ(e.value("kvxfer_peer_faulted", ab), 1);
  EXPECT_EQ(peer_stats(a.transport, "b").fault, std::optional<std::string>("REMOTE_DISCONNECT"));
  // The first post failed; the peer was faulted then, so the other two were
  // refused without being tried.
  EXPECT_EQ(e.value("kvxfer_post_failures_total", kA), 1);
  EXPECT_EQ(e.value("kvxfer_posts_refused_total", kA), 2);
  EXPECT_EQ(e.value("kvxfer_peer_posts_refused_total", ab), 2);
}

TEST_F(MetricsTest, StrikeLimitAndStallFaultsAreCountedByCauseAndOutliveThePeer) {
  a.plan().fail_next_posts(Status::kBackend, 3);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(write(a.transport, "b", {1}, {1}));
  a.transport.remove_remote_peer("b");
  add_peer(a.transport, "b", b.transport);

  Options stalling = timed_options();
  stalling.stall_timeout = std::chrono::milliseconds(30);
  Agent c{"agent-c", stalling};
  add_peer(c.transport, "b", b.transport);
  c.plan().hold_next();
  ASSERT_TRUE(write(c.transport, "b", {1}, {1}));
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(c.transport.poll("b").peer_fault);

  const Exposition ea = scrape(a.transport);
  EXPECT_EQ(ea.value("kvxfer_faults_total", with(kA, "cause", "STRIKE_LIMIT")), 1);
  // The new registration starts clean; the transport's totals keep the old one.
  EXPECT_EQ(
      ea.value("kvxfer_peer_faults_total", with(with(kA, "peer", "b"), "cause", "STRIKE_LIMIT")),
      0);
  EXPECT_EQ(ea.value("kvxfer_post_failures_total", kA), 3);
  const Labels kc{{"agent", "agent-c"}};
  const Exposition ec = scrape(c.transport);
  EXPECT_EQ(ec.value("kvxfer_faults_total", with(kc, "cause", "STALLED")), 1);
  EXPECT_EQ(ec.value("kvxfer_inflight_transfers", kc), 1);
}

TEST_F(MetricsTest, GaugesFollowTheTransport) {
  Agent c{"agent-c"};
  add_peer(a.transport, "c", c.transport);
  a.plan().hold_next(2);
  const auto x = write(a.transport, "b", {1}, {1});
  const auto y = write(a.transport, "c", {2}, {2});
  ASSERT_TRUE(x && y);

  Exposition e = scrape(a.transport);
  EXPECT_EQ(e.value("kvxfer_peers_registered", kA), 2);
  EXPECT_EQ(e.value("kvxfer_inflight_transfers", kA), 2);
  EXPECT_EQ(e.value("kvxfer_inflight_transfers", kA), a.transport.stats().inflight);
  EXPECT_EQ(e.value("kvxfer_peer_inflight_transfers", with(kA, "peer", "c")), 1);
  EXPECT_EQ(e.value("kvxfer_registrations_pending", kA), 0);

  a.plan().land(*x);
  a.plan().land(*y);
  drain(1);
  a.transport.remove_remote_peer("c");
  e = scrape(a.transport);
  EXPECT_EQ(e.value("kvxfer_peers_registered", kA), 1);
  EXPECT_EQ(e.value("kvxfer_inflight_transfers", kA), 0);
}

TEST_F(MetricsTest, LabelValuesAreEscaped) {
  const std::string odd = "we\"ird\\peer\nid";
  add_peer(a.transport, odd, b.transport);
  ASSERT_TRUE(write(a.transport, odd, {1}, {1}));
  for (int i = 0; i < 100 && a.transport.poll(odd).done.empty(); ++i) {
  }

  const Exposition e = scrape(a.transport);
  EXPECT_EQ(e.value("kvxfer_peer_transfers_done_total", with(with(kA, "peer", odd), "op", "write")),
            1);
}

TEST_F(MetricsTest, EveryFamilyOfSeveralTransportsIsTypedOnce) {
  const std::vector<Metrics> both{a.transport.metrics(), b.transport.metrics()};
  const Exposition e = parse(prometheus_text(both));  // throws on a family typed twice
  expect_well_formed(e);
  EXPECT_EQ(e.types.at("kvxfer_transfers_done_total"), "counter");
  EXPECT_EQ(e.types.at("kvxfer_inflight_transfers"), "gauge");
  EXPECT_EQ(e.types.at("kvxfer_poll_duration_seconds"), "histogram");
  EXPECT_EQ(e.value("kvxfer_peers_registered", kA), 1);
  EXPECT_EQ(e.value("kvxfer_peers_registered", {{"agent", "agent-b"}}), 0);
}

}  // namespace
}  // namespace kvxfer::unit

namespace kvxfer::unit {
namespace {

TEST(PrometheusTextTest, APublicEngineCounterKeepsItsOwnFamily) {
  Metrics m;
  m.agent = "x";
  m.engine_counters = {{"cma_writes", 5}, {"ucx_fences_refused", 2}};
  const Exposition e = parse(prometheus_text(m));
  expect_well_formed(e);
  EXPECT_EQ(e.types.at("kvxfer_engine_cma_writes_total"), "counter");
  EXPECT_EQ(e.value("kvxfer_engine_cma_writes_total", {{"agent", "x"}}), 5);
  EXPECT_EQ(e.types.at("kvxfer_engine_ucx_fences_refused_total"), "counter");
  EXPECT_EQ(e.value("kvxfer_engine_ucx_fences_refused_total", {{"agent", "x"}}), 2);
  EXPECT_FALSE(e.types.contains("kvxfer_engine_unstable"));
}

TEST(PrometheusTextTest, ATuningCounterIsNotItsOwnFamily) {
  Metrics m;
  m.agent = "x";
  m.engine_counters = {{"ucx_progress_wakes", 7}, {"cma_caller_slice_max_bytes", 65536}};
  const Exposition e = parse(prometheus_text(m));
  expect_well_formed(e);
  for (const auto& [family, type] : e.types) {
    EXPECT_EQ(family.find("progress_wakes"), std::string::npos) << family;
    EXPECT_EQ(family.find("caller_slice"), std::string::npos) << family;
  }
  EXPECT_EQ(e.types.at("kvxfer_engine_unstable"), "untyped");
  EXPECT_NE(e.helps.at("kvxfer_engine_unstable").find("unstable"), std::string::npos);
  EXPECT_EQ(e.value("kvxfer_engine_unstable", {{"agent", "x"}, {"counter", "ucx_progress_wakes"}}),
            7);
  EXPECT_EQ(e.value("kvxfer_engine_unstable",
                    {{"agent", "x"}, {"counter", "cma_caller_slice_max_bytes"}}),
            65536);
}

TEST(PrometheusTextTest, ACounterTheTableDoesNotDeclareIsUnstable) {
  EXPECT_FALSE(engine_counter_info("a_new_debug_counter").is_public);
  Metrics m;
  m.agent = "x";
  m.engine_counters = {{"a_new_debug_counter", 1}, {"odd-name.1", 2}};
  const Exposition e = parse(prometheus_text(m));
  expect_well_formed(e);
  EXPECT_FALSE(e.types.contains("kvxfer_engine_a_new_debug_counter_total"));
  EXPECT_EQ(e.value("kvxfer_engine_unstable", {{"agent", "x"}, {"counter", "a_new_debug_counter"}}),
            1);
  EXPECT_EQ(e.value("kvxfer_engine_unstable", {{"agent", "x"}, {"counter", "odd-name.1"}}), 2);
}

// Every name the table declares, exposed as declared: a public gauge is
// TYPE gauge without _total, a public counter TYPE counter with it, an
// unstable one a sample of kvxfer_engine_unstable only.
TEST(PrometheusTextTest, EveryDeclaredEngineCounterIsExposedAsDeclared) {
  Metrics m;
  m.agent = "x";
  ASSERT_FALSE(engine_counter_table().empty());
  for (const EngineCounterInfo& info : engine_counter_table()) {
    m.engine_counters[std::string(info.name)] = 3;
  }
  const Exposition e = parse(prometheus_text(m));
  expect_well_formed(e);
  for (const EngineCounterInfo& info : engine_counter_table()) {
    const std::string name(info.name);
    EXPECT_EQ(engine_counter_info(name).is_public, info.is_public) << name;
    EXPECT_EQ(engine_counter_info(name).kind, info.kind) << name;
    const std::string gauge = "kvxfer_engine_" + name;
    const std::string counter = gauge + "_total";
    if (!info.is_public) {
      EXPECT_FALSE(e.types.contains(gauge) || e.types.contains(counter)) << name;
      EXPECT_EQ(e.value("kvxfer_engine_unstable", {{"agent", "x"}, {"counter", name}}), 3);
    } else if (info.kind == EngineCounterKind::kGauge) {
      EXPECT_EQ(e.types.at(gauge), "gauge") << name;
      EXPECT_EQ(e.value(gauge, {{"agent", "x"}}), 3);
    } else {
      EXPECT_EQ(e.types.at(counter), "counter") << name;
      EXPECT_EQ(e.value(counter, {{"agent", "x"}}), 3);
    }
  }
}

}  // namespace
}  // namespace kvxfer::unit
