// SPDX-License-Identifier: Apache-2.0
#include "peers_bench.h"

#include <dirent.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench.h"
#include "bench_config.h"
#include "kvxfer/loopback.h"
#include "kvxfer/transport.h"
#include "machine.h"
#include "pool.h"
#include "target_process.h"

namespace kvxfer::tools {
namespace {

using Clock = std::chrono::steady_clock;

std::int64_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t size = 0;
  std::int64_t resident = 0;
  statm >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

std::int64_t open_fds() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  std::int64_t n = 0;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(dir);
  return n - 1;  // the directory's own fd
}

struct Usage {
  std::int64_t heap = heap_in_use();
  std::int64_t rss = rss_bytes();
  std::int64_t fds = open_fds();
};

struct Checkpoint {
  int peers = 0;
  Timing add;              // add_remote_peer calls since the last checkpoint
  double heap_per_peer = 0;  // bytes, growth since no peer / peers
  double rss_per_peer = 0;
  double fds_per_peer = 0;
  Timing poll;  // poll(peer) with transfers in flight
  std::uint64_t polls_in_flight = 0;  // in-flight transfers summed over the timed polls
};

nlohmann::json to_json(const Timing& t) {
  return {{"count", t.count}, {"mean_us", t.mean_us}, {"p50_us", t.p50_us},
          {"p99_us", t.p99_us}, {"max_us", t.max_us}};
}

nlohmann::json to_json(const Checkpoint& c) {
  return {{"peers", c.peers},
          {"add_remote_peer", to_json(c.add)},
          {"heap_bytes_per_peer", c.heap_per_peer},
          {"rss_bytes_per_peer", c.rss_per_peer},
          {"fds_per_peer", c.fds_per_peer},
          {"poll_peer", to_json(c.poll)},
          {"mean_in_flight", c.poll.count == 0 ? 0.0
                                               : static_cast<double>(c.polls_in_flight) /
                                                     static_cast<double>(c.poll.count)}};
}

// Times `reps` scoped polls of `peer`, keeping `depth` one-block writes to
// it in flight (reposted as they finish; on the loopback engine they are
// held, so they stay in flight).
Timing time_polls(Transport& t, const std::string& peer, std::uint64_t remote_blocks, int reps,
                  int depth, std::uint64_t& in_flight_sum,
                  std::chrono::milliseconds drain = std::chrono::seconds(10)) {
  std::vector<double> samples;
  samples.reserve(static_cast<std::size_t>(reps));
  int inflight = 0;
  std::vector<TransferId> posted;
  std::int64_t next = 0;
  const auto post = [&] {
    const std::int64_t local = next % 16;
    const std::int64_t remote = next % static_cast<std::int64_t>(remote_blocks);
    ++next;
    if (auto id = t.write_blocks(peer, std::span<const std::int64_t>(&local, 1),
                                 std::span<const std::int64_t>(&remote, 1))) {
      posted.push_back(*id);
      ++inflight;
    }
  };
  for (int i = 0; i < reps; ++i) {
    while (inflight < depth) post();
    in_flight_sum += static_cast<std::uint64_t>(inflight);
    const auto start = Clock::now();
    const PollResult r = t.poll(peer);
    samples.push_back(micros(Clock::now() - start));
    inflight -= static_cast<int>(r.done.size() + r.failed.size());
    if (r.peer_fault) throw std::runtime_error("peer " + peer + " faulted: " + *r.peer_fault);
  }
  // Drain what is left (held loopback writes never finish: cancelled).
  const auto deadline = Clock::now() + drain;
  while (inflight > 0 && Clock::now() < deadline) {
    const PollResult r = t.poll(peer);
    inflight -= static_cast<int>(r.done.size() + r.failed.size());
  }
  if (inflight > 0) (void)t.cancel(posted);
  return Timing::of(std::move(samples));
}

std::vector<int> sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  if (!v.empty() && v.front() < 1) throw std::invalid_argument("peer counts must be >= 1");
  return v;
}

// The loopback engine: a few in-process targets, each registered under many
// peer ids (a peer id is what the initiator keeps per peer).
std::vector<Checkpoint> run_loopback(const PeersArgs& a, const std::vector<int>& points) {
  constexpr int kTargets = 8;
  constexpr std::uint64_t kBlocks = 16;
  Options options;
  options.backends = {"LOOPBACK"};
  std::vector<std::unique_ptr<Pool>> pools;
  std::vector<std::unique_ptr<Transport>> targets;
  for (int i = 0; i < kTargets; ++i) {
    pools.push_back(std::make_unique<Pool>(kBlocks * a.block_len));
    targets.push_back(std::make_unique<Transport>(
        fmt::format("peers-target-{}", i), Region{pools.back()->data(), kBlocks, a.block_len},
        options));
  }
  Pool local(kBlocks * a.block_len);
  Transport initiator("peers-initiator", Region{local.data(), kBlocks, a.block_len}, options);
  std::vector<std::vector<std::uint8_t>> metadata;
  for (auto& t : targets) metadata.push_back(t->agent_metadata());

  std::vector<Checkpoint> out;
  const Usage base;
  int registered = 0;
  for (const int point : points) {
    std::vector<double> adds;
    for (; registered < point; ++registered) {
      const int target = registered % kTargets;
      const auto start = Clock::now();
      initiator.add_remote_peer(fmt::format("peer-{}", registered), metadata[target],
                                targets[target]->base_addr(), kBlocks, a.block_len);
      adds.push_back(micros(Clock::now() - start));
    }
    const Usage now;
    Checkpoint c;
    c.peers = point;
    c.add = Timing::of(std::move(adds));
    c.heap_per_peer = static_cast<double>(now.heap - base.heap) / point;
    c.rss_per_peer = static_cast<double>(now.rss - base.rss) / point;
    c.fds_per_peer = static_cast<double>(now.fds - base.fds) / point;
    // Four held writes on each of up to 8 other peers, so the engine has
    // transfers in flight beyond the polled peer's.
    const int others = std::min(point - 1, 8);
    initiator.fault_plan()->hold_next(4 * others + 4);
    std::vector<TransferId> held;
    for (int p = 1; p <= others; ++p) {
      for (std::int64_t b = 0; b < 4; ++b) {
        if (auto id = initiator.write_blocks(fmt::format("peer-{}", p * (point / (others + 1))),
                                             std::span<const std::int64_t>(&b, 1),
                                             std::span<const std::int64_t>(&b, 1))) {
          held.push_back(*id);
        }
      }
    }
    c.poll = time_polls(initiator, "peer-0", kBlocks, a.poll_reps, 4, c.polls_in_flight,
                        std::chrono::milliseconds(0));
    (void)initiator.cancel(held);
    out.push_back(c);
  }
  initiator.close();
  return out;
}

// UCX over TCP against real target processes.
std::vector<Checkpoint> run_tcp(const PeersArgs& a, const std::vector<int>& points) {
  const std::string tls = "tcp";
  const int max_targets = points.back();
  std::vector<std::unique_ptr<TargetProcess>> targets;
  const std::string fingerprint = config_fingerprint(bench_config_fields(tls));
  for (int i = 0; i < max_targets; ++i) {
    targets.push_back(TargetProcess::spawn(
        {"target", "--tls", tls, "--region", std::to_string(a.region)}));
    targets.back()->open(a.block_len, a.region, fingerprint);
    if (!a.quiet) fmt::print(stderr, "\rpeers: {} of {} targets up", i + 1, max_targets);
  }
  if (!a.quiet) fmt::print(stderr, "\n");
  constexpr std::uint64_t kBlocks = 16;
  Pool local(kBlocks * a.block_len);
  const Options options = bench_options(tls);
  std::vector<Checkpoint> out;
  {
    Transport initiator(fmt::format("peers-initiator-{}", ::getpid()),
                        Region{local.data(), kBlocks, a.block_len}, options);
    const Usage base;
    int registered = 0;
    for (const int point : points) {
      std::vector<double> adds;
      for (; registered < point; ++registered) {
        const TargetGeometry& g = targets[static_cast<std::size_t>(registered)]->geometry();
        const auto start = Clock::now();
        initiator.add_remote_peer(fmt::format("peer-{}", registered), g.metadata, g.base,
                                  g.num_blocks, g.block_len);
        adds.push_back(micros(Clock::now() - start));
      }
      const Usage now;
      Checkpoint c;
      c.peers = point;
      c.add = Timing::of(std::move(adds));
      c.heap_per_peer = static_cast<double>(now.heap - base.heap) / point;
      c.rss_per_peer = static_cast<double>(now.rss - base.rss) / point;
      c.fds_per_peer = static_cast<double>(now.fds - base.fds) / point;
      c.poll = time_polls(initiator, "peer-0", targets[0]->geometry().num_blocks, a.poll_reps, 4,
                          c.polls_in_flight);
      out.push_back(c);
    }
    // One write to every peer, waited for, before the close: it finishes
    // each endpoint's wireup. A target whose reply to a wireup is still
    // pending when the initiator goes away trips a UCX 1.13 assertion
    // ("got REP message", see ucx_worker.cc) and aborts.
    for (int p = 0; p < registered; ++p) {
      const std::string peer = fmt::format("peer-{}", p);
      std::uint64_t ignored = 0;
      (void)time_polls(initiator, peer, kBlocks, 1, 1, ignored);
    }
    initiator.close();
  }
  int failed = 0;
  for (auto& t : targets) failed += t->quit() != 0 ? 1 : 0;
  if (failed > 0) fmt::print(stderr, "peers: {} of {} targets exited non-zero\n", failed, targets.size());
  return out;
}

void print_table(const std::string& engine, const std::vector<Checkpoint>& rows) {
  fmt::print("{:<9} {:>6} {:>10} {:>10} {:>12} {:>12} {:>8} {:>10} {:>10} {:>8}\n", "engine",
             "peers", "add p50us", "add p99us", "heap B/peer", "rss B/peer", "fd/peer",
             "poll p50us", "poll p99us", "inflight");
  for (const auto& c : rows) {
    fmt::print("{:<9} {:>6} {:>10.1f} {:>10.1f} {:>12.0f} {:>12.0f} {:>8.2f} {:>10.2f} {:>10.2f} "
               "{:>8.1f}\n",
               engine, c.peers, c.add.p50_us, c.add.p99_us, c.heap_per_peer, c.rss_per_peer,
               c.fds_per_peer, c.poll.p50_us, c.poll.p99_us,
               c.poll.count == 0 ? 0.0 : static_cast<double>(c.polls_in_flight) / c.poll.count);
  }
}

void plot(const std::string& png, const std::vector<Checkpoint>& lb,
          const std::vector<Checkpoint>& tcp) {
  const std::string dat = png + ".dat";
  {
    std::ofstream f(dat);
    f << "# peers add_p50 add_p99 poll_p50 poll_p99\n";
    for (const auto* rows : {&lb, &tcp}) {
      for (const auto& c : *rows) {
        f << c.peers << ' ' << c.add.p50_us << ' ' << c.add.p99_us << ' ' << c.poll.p50_us
          << ' ' << c.poll.p99_us << '\n';
      }
      f << "\n\n";
    }
  }
  const std::string gp = png + ".gp";
  {
    std::ofstream f(gp);
    f << "set terminal pngcairo size 900,540\n"
      << "set output '" << png << "'\n"
      << "set title 'kvxfer: cost against registered peers'\n"
      << "set logscale xy\nset xlabel 'registered peers'\nset ylabel 'microseconds'\n"
      << "set key outside right\nset grid\n"
      << "plot '" << dat << "' index 0 using 1:2 with linespoints title 'loopback add p50', "
      << "'' index 0 using 1:4 with linespoints title 'loopback poll(peer) p50', "
      << "'' index 0 using 1:5 with linespoints title 'loopback poll(peer) p99'";
    if (!tcp.empty()) {
      f << ", '' index 1 using 1:2 with linespoints title 'tcp add p50', "
        << "'' index 1 using 1:4 with linespoints title 'tcp poll(peer) p50', "
        << "'' index 1 using 1:5 with linespoints title 'tcp poll(peer) p99'";
    }
    f << "\n";
  }
  if (std::system(("gnuplot '" + gp + "'").c_str()) != 0) {
    fmt::print(stderr, "peers: gnuplot failed (is it installed?); data in {}\n", dat);
  }
}

}  // namespace

int run_peers_bench(const PeersArgs& a) {
  const auto lb_points = sorted(a.loopback);
  const auto tcp_points = sorted(a.tcp);
  std::vector<Checkpoint> lb;
  std::vector<Checkpoint> tcp;
  if (!lb_points.empty()) {
    lb = run_loopback(a, lb_points);
    print_table("loopback", lb);
  }
  if (!tcp_points.empty()) {
    tcp = run_tcp(a, tcp_points);
    print_table("tcp", tcp);
  }
  if (!a.json_path.empty()) {
    nlohmann::json j;
    j["kvxfer"] = std::string(version());
    j["region"] = a.region;
    j["block_len"] = a.block_len;
    j["loopback"] = nlohmann::json::array();
    for (const auto& c : lb) j["loopback"].push_back(to_json(c));
    j["tcp"] = nlohmann::json::array();
    for (const auto& c : tcp) j["tcp"].push_back(to_json(c));
    std::ofstream(a.json_path) << j.dump(2) << '\n';
  }
  if (!a.plot_path.empty()) plot(a.plot_path, lb, tcp);
  return 0;
}

}  // namespace kvxfer::tools
