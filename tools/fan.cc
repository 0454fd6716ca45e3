// SPDX-License-Identifier: Apache-2.0
#include "fan.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <stdexcept>

#include "bench_config.h"
#include "channel.h"
#include "iperf.h"
#include "kvxfer/transport.h"
#include "kvxfer/ucx_tls.h"
#include "pattern.h"
#include "pool.h"

namespace kvxfer::tools {
namespace {

using json = nlohmann::json;

// --- fan-out ---------------------------------------------------------------

FanRow run_fanout(const BenchArgs& args, const FanParams& p, int n,
                  std::vector<std::unique_ptr<TargetProcess>>& targets, Pool& source) {
  return fan_row("fan-out", n, [&](FanRow& row) {
    const std::uint64_t local_blocks = p.region / p.block_len;
    const std::uint64_t seed = mix64(p.seed ^ static_cast<std::uint64_t>(n));
    fill_blocks(source.data(), p.block_len, local_blocks, seed);
    std::vector<TargetGeometry> geometry;
    for (int i = 0; i < n; ++i)
      geometry.push_back(
          targets[static_cast<std::size_t>(i)]->open(p.block_len, p.region, p.fingerprint));
    Transport transport(fmt::format("bench-fan-{}-{}", ::getpid(), n),
                        Region{source.data(), local_blocks, p.block_len},
                        bench_transport_options(args));
    std::vector<Spread> spreads;
    spreads.reserve(static_cast<std::size_t>(n));
    const std::uint64_t writes = std::max<std::uint64_t>(1, p.total / (p.batch * p.block_len));
    std::vector<Job> jobs;
    for (int i = 0; i < n; ++i) {
      const TargetGeometry& g = geometry[static_cast<std::size_t>(i)];
      const std::string peer = fmt::format("target-{}", i);
      transport.add_remote_peer(peer, g.metadata, g.base, g.num_blocks, g.block_len);
      spreads.emplace_back(0, g.num_blocks, local_blocks, p.batch,
                           seed + static_cast<std::uint64_t>(i));
      if (spreads.back().cycle() <= static_cast<std::uint64_t>(p.depth)) {
        throw std::invalid_argument(
            "each target's region must hold more than depth x batch blocks");
      }
    }
    for (int i = 0; i < n; ++i) {
      Job j;
      j.peer = fmt::format("target-{}", i);
      j.spread = &spreads[static_cast<std::size_t>(i)];
      // Round-robin: writes split evenly, the first ones taking the remainder.
      j.writes = writes / static_cast<std::uint64_t>(n) +
                 (static_cast<std::uint64_t>(i) < writes % static_cast<std::uint64_t>(n) ? 1 : 0);
      jobs.push_back(j);
    }
    warm_up(transport, jobs);
    const DriveResult r = drive(transport, jobs, p.depth, p.block_len, p.wait);
    transport.close();
    row.error = r.error;
    if (row.error.empty() && transport.stats().live != HandleCounts{}) {
      row.error = "live handles left after close()";
    }
    if (row.error.empty() && r.failed > 0) row.error = fmt::format("{} writes failed", r.failed);
    row.gbps = static_cast<double>(r.bytes) / r.seconds() / 1e9;
    row.write_call = r.write_call;
    row.poll_call = r.poll_call;
    // Each target's share of the run's bytes over the run's time (all run together).
    for (const Job& j : jobs)
      row.each_gbps.push_back(static_cast<double>(j.ok_bytes) / r.seconds() / 1e9);
    row.slowest_share = share_of_slowest(row.each_gbps);
    bool all_good = row.error.empty();
    for (int i = 0; i < n; ++i) {
      auto& target = *targets[static_cast<std::size_t>(i)];
      const auto pairs = spreads[static_cast<std::size_t>(i)].landed(
          jobs[static_cast<std::size_t>(i)].writes, kVerifyBlocks);
      const auto [good, bad] = target.verify(seed, pairs);
      target.close_region();
      all_good =
          tally_verified(row, fmt::format("target {}", i), pairs.size(), good, bad) && all_good;
    }
    row.verified = all_good;
  });
}

// --- the table and the JSON ------------------------------------------------

std::string triple(const Timing& t) {
  const auto f = [](double us) {
    return us < 100 ? fmt::format("{:.1f}", us) : fmt::format("{:.0f}", us);
  };
  return t.count == 0 ? "-" : fmt::format("{}/{}/{}", f(t.p50_us), f(t.p99_us), f(t.max_us));
}

void print_rows(const std::vector<FanRow>& rows, const FanParams& p, std::FILE* out) {
  fmt::print(out,
             "fan-out: one initiator -> N targets, round-robin, scoped polls; incast: N initiator "
             "processes -> one target. {} blocks x {}, depth {}, UCX_TLS={}, poll wait {}{}\n",
             p.block_len >= (1 << 20) ? fmt::format("{} MiB", p.block_len >> 20)
                                      : fmt::format("{} KiB", p.block_len >> 10),
             p.batch, p.depth, ucx_tls_for(p.tls), p.wait.name(),
             p.engine.contains(kEncryptKey) && p.engine.at(kEncryptKey) == "on"
                 ? ", the tcp lane encrypted (KVXFER_TCP_ENCRYPT=on)"
                 : "");
  const bool raw = std::any_of(rows.begin(), rows.end(), [](const FanRow& r) {
    return r.raw_gbps.has_value() || !r.raw_error.empty();
  });
  const auto fixed2 = [](const std::optional<double>& v) {
    return v ? fmt::format("{:.2f}", *v) : std::string("-");
  };
  fmt::print(out, "{:<8} {:>3} {:>7} {:>7} {:>8} {:>20} {:>20}  {:<22}{}\n", "run", "N", "GB/s",
             "x N=1", "slowest", "write µs p50/99/max", "poll µs p50/99/max", "verified",
             raw ? fmt::format(" {:>8} {:>9}", "raw GB/s", "raw x N=1") : "");
  for (const FanRow& r : rows) {
    fmt::print(out, "{:<8} {:>3} {:>7.2f} {:>7} {:>8.2f} {:>20} {:>20}  {:<22}{}\n", r.experiment,
               r.n, r.gbps, fixed2(r.ratio), r.slowest_share, triple(r.write_call),
               triple(r.poll_call),
               r.verified ? fmt::format("yes ({} blocks)", r.verified_blocks) : "NO",
               raw ? fmt::format(" {:>8} {:>9}", fixed2(r.raw_gbps), fixed2(r.raw_ratio)) : "");
  }
  for (const FanRow& r : rows) {
    if (!r.error.empty()) fmt::print(out, "{} N={}: {}\n", r.experiment, r.n, r.error);
    if (!r.raw_error.empty()) {
      fmt::print(out, "{} N={}: no raw-stream figure: {}\n", r.experiment, r.n, r.raw_error);
    }
  }
  if (raw) {
    fmt::print(out,
               "raw: iperf3 on loopback, 1 MiB writes, right after each row: fan-out N pairs at "
               "once (N streams to N processes), incast one client with N streams (-P N) into one "
               "server\n");
  }
  fmt::print(out,
             "slowest: the slowest target's (fan-out) or initiator's (incast) GB/s over the mean "
             "of all of them (1.00: an even share)\n");
  std::fflush(out);
}

json timing_json(const Timing& t) {
  return {{"count", t.count}, {"p50_us", t.p50_us}, {"p99_us", t.p99_us}, {"max_us", t.max_us}};
}

void write_rows_json(const std::vector<FanRow>& rows, const FanParams& p, const BenchArgs& args,
                     const std::string& path) {
  json out = json::array();
  for (const FanRow& r : rows) {
    out.push_back({{"experiment", r.experiment},
                   {"n", r.n},
                   {"gbps", r.gbps},
                   {"ratio_to_1", r.ratio ? json(*r.ratio) : json(nullptr)},
                   {"each_gbps", r.each_gbps},
                   {"slowest_share", r.slowest_share},
                   {"write_call", timing_json(r.write_call)},
                   {"poll_call", timing_json(r.poll_call)},
                   {"verified", r.verified},
                   {"verified_blocks", r.verified_blocks},
                   {"raw_gbps", r.raw_gbps ? json(*r.raw_gbps) : json(nullptr)},
                   {"raw_ratio_to_1", r.raw_ratio ? json(*r.raw_ratio) : json(nullptr)},
                   {"error", r.error.empty() ? json(nullptr) : json(r.error)}});
  }
  const json doc = {{"tls", p.tls},
                    {"ucx_tls", ucx_tls_for(p.tls)},
                    {"block_len", p.block_len},
                    {"batch", p.batch},
                    {"depth", p.depth},
                    {"poll_wait", p.wait.name()},
                    {"pool", pool_kind()},
                    {"engine_config", args.engine},
                    {"target_engine_config", args.target_engine},
                    {"total_bytes", p.total},
                    {"region_bytes", p.region},
                    {"runs", out}};
  std::ofstream f(path);
  f << doc.dump(2) << '\n';
  if (!f) throw std::runtime_error("cannot write " + path);
}

}  // namespace

FanRow fan_row(const char* experiment, int n, const std::function<void(FanRow&)>& run) {
  FanRow row;
  row.experiment = experiment;
  row.n = n;
  try {
    run(row);
  } catch (const ChannelError&) {
    throw;
  } catch (const std::exception& e) {
    row.error = e.what();
  }
  return row;
}

bool tally_verified(FanRow& row, const std::string& whose, std::size_t checked, std::uint64_t good,
                    std::uint64_t bad) {
  row.verified_blocks += good;
  if (bad == 0 && good == checked && checked > 0) return true;
  if (row.error.empty()) {
    row.error = fmt::format("{}: {} of {} blocks checked hold wrong bytes", whose, bad, good + bad);
  }
  return false;
}

double share_of_slowest(const std::vector<double>& each) {
  if (each.empty()) return 0;
  const double mean =
      std::accumulate(each.begin(), each.end(), 0.0) / static_cast<double>(each.size());
  return mean > 0 ? *std::min_element(each.begin(), each.end()) / mean : 0;
}

// --- entry point -----------------------------------------------------------

int run_fan(const BenchArgs& args) {
  FanParams p;
  p.tls = args.tls;
  p.block_len = args.block_len.value_or(64 << 10);
  p.batch = args.batch.value_or(64);
  p.depth = args.depth.value_or(8);
  const bool tcp = kvxfer::ucx_tls_is_tcp_only(ucx_tls_for(args.tls));
  p.total = args.total.value_or(tcp ? (2ull << 30) : (4ull << 30));
  p.region = std::min(args.region, kMaxFanRegion);
  p.seed = args.seed != 0 ? args.seed : (std::random_device{}() | 1);
  p.fingerprint = config_fingerprint(bench_config_fields(args.tls));
  p.wait.mode = args.poll_wait;
  p.wait.sleep_us = args.poll_sleep_us;
  p.engine = args.engine;
  p.num_threads = args.num_threads;
  p.progress_thread = args.progress_thread;
  if (p.block_len == 0 || p.block_len > p.region)
    throw std::invalid_argument("bad --block-len for --region");
  for (const int n : args.targets)
    if (n < 1 || n > 64) throw std::invalid_argument("--targets: each N in 1..64");
  for (const int n : args.initiators)
    if (n < 1 || n > 64) throw std::invalid_argument("--initiators: each N in 1..64");

  std::vector<FanRow> rows;
  const std::vector<std::string> target_args =
      target_command(args.tls, p.region, args.target_engine);
  if (!args.targets.empty()) {
    const int most = *std::max_element(args.targets.begin(), args.targets.end());
    if (!args.quiet) fmt::print(stderr, "kvxfer bench: fan-out, spawning {} targets ...\n", most);
    std::vector<std::unique_ptr<TargetProcess>> targets;
    for (int i = 0; i < most; ++i) targets.push_back(TargetProcess::spawn(target_args));
    Pool source(p.region);
    for (const int n : args.targets) {
      if (!args.quiet) fmt::print(stderr, "  fan-out N={} ...\n", n);
      rows.push_back(run_fanout(args, p, n, targets, source));
    }
    for (auto& t : targets) t->quit();
  }
  if (!args.initiators.empty()) {
    auto target = TargetProcess::spawn(target_args);
    for (const int n : args.initiators) {
      if (!args.quiet) fmt::print(stderr, "  incast N={} ...\n", n);
      rows.push_back(run_incast(p, n, *target));
    }
    target->quit();
  }
  if (tcp && args.iperf3 && args.peer.empty()) {
    for (FanRow& r : rows) {
      if (!args.quiet)
        fmt::print(stderr, "  {} N={}: raw streams (iperf3) ...\n", r.experiment, r.n);
      IperfRequest request;
      request.seconds = args.iperf3_seconds;
      request.timeout = std::chrono::seconds(args.iperf3_seconds + 30);
      IperfResult raw;
      if (r.experiment == "incast") {
        request.streams = r.n;
        raw = run_iperf3(request);
      } else {
        raw = run_iperf3_pairs(request, r.n);
      }
      r.raw_gbps = raw.gbps;
      r.raw_error = raw.gbps ? std::string() : raw.error;
    }
  }
  for (FanRow& r : rows) {
    for (const FanRow& base : rows) {
      if (base.experiment == r.experiment && base.n == 1 && base.gbps > 0)
        r.ratio = r.gbps / base.gbps;
      if (base.experiment == r.experiment && base.n == 1 && base.raw_gbps && r.raw_gbps &&
          *base.raw_gbps > 0)
        r.raw_ratio = *r.raw_gbps / *base.raw_gbps;
    }
  }
  print_rows(rows, p, stdout);
  if (!args.json_path.empty()) write_rows_json(rows, p, args, args.json_path);
  return std::all_of(rows.begin(), rows.end(), [](const FanRow& r) { return r.verified; }) ? 0 : 1;
}

}  // namespace kvxfer::tools
