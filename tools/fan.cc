// SPDX-License-Identifier: Apache-2.0
#include "fan.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
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
#include "subprocess.h"
#include "target_process.h"

namespace kvxfer::tools {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr auto kStallTimeout = std::chrono::seconds(60);
constexpr Millis kReplyTimeout{120'000};
constexpr Millis kWriteTimeout{30'000};
// Blocks checked per target (fan-out) or per initiator (incast).
constexpr std::uint64_t kVerifyBlocks = 512;
// Each target's region (and the initiators' pools) at most this: eight
// targets of 1 GiB would be slow to touch and crowd a small machine.
constexpr std::uint64_t kMaxFanRegion = 256ull << 20;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

void fill(Pool& pool, std::uint64_t block_len, std::uint64_t count, std::uint64_t seed) {
  for (std::uint64_t i = 0; i < count; ++i) {
    fill_block(pool.data() + i * block_len, block_len, seed, i);
  }
}

std::vector<std::int64_t> shuffled(std::uint64_t first, std::uint64_t count, std::uint64_t seed) {
  std::vector<std::int64_t> v(count);
  std::iota(v.begin(), v.end(), static_cast<std::int64_t>(first));
  std::mt19937_64 rng(seed);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

Options writer_options(const std::string& tls, const BenchArgs* args) {
  Options options;
  options.config_fields = bench_config_fields(tls);
  options.engine_config = engine_config_for(tls);
  if (args != nullptr) {
    for (const auto& [key, value] : args->engine) options.engine_config[key] = value;
    options.progress_thread = args->progress_thread;
    options.num_threads = args->num_threads;
  }
  return options;
}

// One writer's share of a run: a peer and the writes it gets.
struct Job {
  std::string peer;
  const Spread* spread = nullptr;
  std::uint64_t writes = 0;
  std::uint64_t next = 0;
  std::uint64_t done = 0;
  std::uint64_t ok_bytes = 0;
  // (id, write) of the writes in flight: transfers complete in any order,
  // so a write waits until the one before it on the same blocks has ended.
  std::vector<std::pair<TransferId, std::uint64_t>> flight;
  [[nodiscard]] bool may_post() const {
    if (next >= writes) return false;
    for (const auto& f : flight)
      if (next - f.second >= spread->cycle()) return false;  // f's blocks again
    return true;
  }
  void ended(const std::vector<TransferId>& ids) {
    for (const TransferId id : ids) {
      for (auto& f : flight) {
        if (f.first == id) {
          f = flight.back();
          flight.pop_back();
          break;
        }
      }
    }
  }
};

// What a writer does after a round of polls that reported nothing (--poll-wait).
struct PollWait {
  std::string mode = "spin";  // spin | yield | sleep
  int sleep_us = 0;
  void idle() const { poll_idle(mode, sleep_us); }
  [[nodiscard]] std::string name() const {
    return mode == "sleep" ? fmt::format("sleep:{}", sleep_us) : mode;
  }
};

// Posts the jobs' writes round-robin, at most `depth` in flight in all and
// never two on the same blocks at once, and polls each peer with writes in
// flight (scoped polls) until every write is reported.
DriveResult drive(Transport& transport, std::vector<Job>& jobs, int depth, std::uint64_t block_len,
                  const PollWait& wait) {
  DriveResult out;
  const std::uint64_t batch = jobs.front().spread->batch();
  std::vector<std::int64_t> local(batch);
  std::vector<std::int64_t> remote(batch);
  LatencyHistogram write_us;
  LatencyHistogram poll_us;
  std::uint64_t total = 0;
  for (Job& j : jobs) {
    total += j.writes;
    j.flight.reserve(static_cast<std::size_t>(depth));
  }
  std::uint64_t done = 0;
  int inflight = 0;
  std::size_t rr = 0;
  out.start_ns = now_ns();
  auto last_completion = Clock::now();
  while (done < total && out.error.empty()) {
    for (std::size_t idle = 0; inflight < depth && idle < jobs.size();) {
      Job& j = jobs[rr];
      rr = (rr + 1) % jobs.size();
      if (!j.may_post()) {
        ++idle;
        continue;
      }
      idle = 0;
      j.spread->write(j.next, local, remote);
      const auto t0 = Clock::now();
      const auto id = transport.write_blocks(j.peer, std::span<const std::int64_t>(local),
                                             std::span<const std::int64_t>(remote));
      write_us.add(micros(Clock::now() - t0));
      if (!id) {
        out.error = fmt::format("write_blocks to {} failed to post", j.peer);
        break;
      }
      j.flight.emplace_back(*id, j.next);
      ++j.next;
      ++inflight;
    }
    bool any = false;
    for (Job& j : jobs) {
      if (j.flight.empty()) continue;
      const auto p0 = Clock::now();
      const PollResult r = transport.poll(j.peer);
      poll_us.add(micros(Clock::now() - p0));
      j.ended(r.done);
      j.ended(r.failed);
      const auto n = static_cast<int>(r.done.size() + r.failed.size());
      inflight -= n;
      j.done += static_cast<std::uint64_t>(n);
      j.ok_bytes += r.done.size() * batch * block_len;
      done += static_cast<std::uint64_t>(n);
      out.failed += r.failed.size();
      any = any || n > 0;
      if (r.peer_fault) out.error = fmt::format("peer {} faulted: {}", j.peer, *r.peer_fault);
    }
    if (any) {
      last_completion = Clock::now();
      continue;
    }
    if (Clock::now() - last_completion > kStallTimeout) {
      out.error = fmt::format("stalled: no write completed for {} s", kStallTimeout.count());
    }
    wait.idle();
  }
  out.end_ns = now_ns();
  for (const Job& j : jobs) out.bytes += j.ok_bytes;
  out.write_call = write_us.timing();
  out.poll_call = poll_us.timing();
  return out;
}

// Untimed: write 0 of every job, landed, so that endpoint wire-up and first
// touches are not timed. (Write 0 comes again in the run, with the same
// bytes.)
void warm_up(Transport& transport, const std::vector<Job>& jobs) {
  const std::uint64_t batch = jobs.front().spread->batch();
  std::vector<std::int64_t> local(batch);
  std::vector<std::int64_t> remote(batch);
  for (const Job& j : jobs) {
    j.spread->write(0, local, remote);
    const auto id = transport.write_blocks(j.peer, std::span<const std::int64_t>(local),
                                           std::span<const std::int64_t>(remote));
    if (!id) throw std::runtime_error("warm-up write_blocks to " + j.peer + " failed to post");
    const auto deadline = Clock::now() + kStallTimeout;
    for (;;) {
      const PollResult r = transport.poll(j.peer);
      if (!r.failed.empty() || r.peer_fault)
        throw std::runtime_error("warm-up write to " + j.peer + " failed");
      if (!r.done.empty()) break;
      if (Clock::now() > deadline)
        throw std::runtime_error("warm-up write to " + j.peer + " stalled");
    }
  }
}

struct FanParams {
  std::string tls;
  std::uint64_t block_len = 64 << 10;
  std::uint64_t batch = 64;
  int depth = 8;
  std::uint64_t total = 0;
  std::uint64_t region = kMaxFanRegion;
  std::uint64_t seed = 1;
  std::string fingerprint;
  PollWait wait;
  // What the initiators the bench spawns for incast run with: --engine,
  // --num-threads and --no-progress-thread reach them as they reach a
  // fan-out's initiator.
  std::map<std::string, std::string> engine;
  int num_threads = 4;
  bool progress_thread = true;
};

// engine_config as one SETUP word: "KEY=VALUE" lines, hex.
std::string engine_word(const std::map<std::string, std::string>& engine) {
  std::string lines;
  for (const auto& [key, value] : engine) lines += key + "=" + value + "\n";
  return to_hex(std::vector<std::uint8_t>(lines.begin(), lines.end()));
}

std::map<std::string, std::string> parse_engine_word(const std::string& hex) {
  const std::vector<std::uint8_t> bytes = from_hex(hex);
  const std::string text(bytes.begin(), bytes.end());
  std::map<std::string, std::string> engine;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = text.find('\n', at);
    if (end == std::string::npos) throw ChannelError("bad SETUP engine");
    const std::string item = text.substr(at, end - at);
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) throw ChannelError("bad SETUP engine");
    engine[item.substr(0, eq)] = item.substr(eq + 1);
    at = end + 1;
  }
  return engine;
}

double share_of_slowest(const std::vector<double>& each) {
  if (each.empty()) return 0;
  const double mean =
      std::accumulate(each.begin(), each.end(), 0.0) / static_cast<double>(each.size());
  return mean > 0 ? *std::min_element(each.begin(), each.end()) / mean : 0;
}

// --- fan-out ---------------------------------------------------------------

FanRow run_fanout(const BenchArgs& args, const FanParams& p, int n,
                  std::vector<std::unique_ptr<TargetProcess>>& targets, Pool& source) {
  FanRow row;
  row.experiment = "fan-out";
  row.n = n;
  try {
    const std::uint64_t local_blocks = p.region / p.block_len;
    const std::uint64_t seed = mix64(p.seed ^ static_cast<std::uint64_t>(n));
    fill(source, p.block_len, local_blocks, seed);
    std::vector<TargetGeometry> geometry;
    for (int i = 0; i < n; ++i)
      geometry.push_back(
          targets[static_cast<std::size_t>(i)]->open(p.block_len, p.region, p.fingerprint));
    Transport transport(fmt::format("bench-fan-{}-{}", ::getpid(), n),
                        Region{source.data(), local_blocks, p.block_len},
                        writer_options(p.tls, &args));
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
      row.verified_blocks += good;
      if (bad > 0 || good != pairs.size() || pairs.empty()) {
        all_good = false;
        if (row.error.empty())
          row.error = fmt::format("target {}: {} of {} blocks checked hold wrong bytes", i, bad,
                                  good + bad);
      }
    }
    row.verified = all_good;
  } catch (const ChannelError&) {
    throw;
  } catch (const std::exception& e) {
    row.error = e.what();
  }
  return row;
}

// --- incast ----------------------------------------------------------------

struct Initiator {
  std::unique_ptr<Subprocess> child;
  std::unique_ptr<LineChannel> channel;
};

FanRow run_incast(const FanParams& p, int n, TargetProcess& target) {
  FanRow row;
  row.experiment = "incast";
  row.n = n;
  try {
    const TargetGeometry g = target.open(p.block_len, p.region, p.fingerprint);
    const std::uint64_t count = g.num_blocks / static_cast<std::uint64_t>(n) / p.batch * p.batch;
    if (count / p.batch <= static_cast<std::uint64_t>(p.depth)) {
      throw std::invalid_argument(
          "the target's region must hold more than N x depth x batch blocks");
    }
    // Every initiator moves the same bytes: the total of one fan-out run each
    // would overload the target for N = 8, so the total is shared.
    const std::uint64_t writes = std::max<std::uint64_t>(
        1, p.total / (p.batch * p.block_len) / static_cast<std::uint64_t>(n));
    const std::uint64_t local_region = p.region;
    std::vector<Initiator> inits;
    for (int i = 0; i < n; ++i) {
      SpawnOptions options;
      options.argv = {"/proc/self/exe", "initiator"};
      options.pipe_stdin = true;
      options.pipe_stdout = true;
      Initiator init;
      init.child = std::make_unique<Subprocess>(options);
      const int to = init.child->take_stdin();
      const int from = init.child->take_stdout();
      init.channel = std::make_unique<LineChannel>(
          from, to, fmt::format("initiator (pid {})", init.child->pid()));
      const Message hello = Message::parse(init.channel->read_line(kReplyTimeout));
      if (hello.word != "HELLO") throw ChannelError("an initiator did not say HELLO");
      inits.push_back(std::move(init));
    }
    const auto seed_of = [&](int i) {
      return mix64(p.seed ^ (0x1000u + static_cast<std::uint64_t>(i) * 7919u +
                             static_cast<std::uint64_t>(n)));
    };
    for (int i = 0; i < n; ++i) {
      inits[static_cast<std::size_t>(i)].channel->write_line(
          fmt::format("SETUP tls={} metadata={} base={} num_blocks={} block_len={} first={} "
                      "count={} batch={} depth={} writes={} seed={} local_region={} index={} "
                      "poll_wait={} poll_sleep_us={} num_threads={} progress_thread={} engine={}",
                      p.tls, to_hex(g.metadata), g.base, g.num_blocks, g.block_len,
                      static_cast<std::uint64_t>(i) * count, count, p.batch, p.depth, writes,
                      seed_of(i), local_region, i, p.wait.mode, p.wait.sleep_us, p.num_threads,
                      p.progress_thread ? 1 : 0, engine_word(p.engine)),
          kWriteTimeout);
    }
    for (auto& init : inits) {
      const std::string line = init.channel->read_line(kReplyTimeout);
      if (Message::parse(line).word != "READY") {
        throw std::runtime_error(fmt::format("{} did not get ready: {}", init.channel->peer_name(),
                                             line.substr(0, 200)));
      }
    }
    for (auto& init : inits) init.channel->write_line("GO", kWriteTimeout);
    std::int64_t start = std::numeric_limits<std::int64_t>::max();
    std::int64_t end = 0;
    std::uint64_t bytes = 0;
    std::vector<std::pair<std::uint64_t, double>> each;  // bytes, seconds
    for (auto& init : inits) {
      const Message m = Message::parse(init.channel->read_line(kReplyTimeout));
      if (m.word != "DONE") throw ChannelError(init.channel->peer_name() + " did not finish");
      if (m.number("ok") == 0 && row.error.empty()) {
        row.error = init.channel->peer_name() + " reported a failure (see its stderr)";
      }
      const auto s = static_cast<std::int64_t>(m.number("start_ns"));
      const auto e = static_cast<std::int64_t>(m.number("end_ns"));
      start = std::min(start, s);
      end = std::max(end, e);
      bytes += m.number("bytes");
      each.emplace_back(m.number("bytes"), static_cast<double>(e - s) / 1e9);
      const auto tenth = [&](const char* key) { return static_cast<double>(m.number(key)) / 10.0; };
      // The worst initiator's figures.
      if (tenth("write_p99") > row.write_call.p99_us) {
        row.write_call = Timing{m.number("writes"), 0, tenth("write_p50"), tenth("write_p99"),
                                tenth("write_max")};
      }
      if (tenth("poll_p99") > row.poll_call.p99_us) {
        row.poll_call =
            Timing{m.number("polls"), 0, tenth("poll_p50"), tenth("poll_p99"), tenth("poll_max")};
      }
    }
    for (auto& init : inits) {
      init.channel->write_line("QUIT", kWriteTimeout);
      if (const auto status = init.child->wait_for(Millis(30'000));
          status && *status != 0 && row.error.empty()) {
        row.error = fmt::format("{} exited with status {}", init.channel->peer_name(), *status);
      }
    }
    const double seconds = static_cast<double>(end - start) / 1e9;
    row.gbps = static_cast<double>(bytes) / seconds / 1e9;
    for (const auto& [b, s] : each) row.each_gbps.push_back(static_cast<double>(b) / s / 1e9);
    row.slowest_share = share_of_slowest(row.each_gbps);
    bool all_good = row.error.empty();
    const std::uint64_t local_blocks = local_region / p.block_len;
    for (int i = 0; i < n; ++i) {
      const Spread spread(static_cast<std::uint64_t>(i) * count, count, local_blocks, p.batch,
                          seed_of(i));
      const auto pairs = spread.landed(writes, kVerifyBlocks);
      const auto [good, bad] = target.verify(seed_of(i), pairs);
      row.verified_blocks += good;
      if (bad > 0 || good != pairs.size() || pairs.empty()) {
        all_good = false;
        if (row.error.empty())
          row.error = fmt::format("initiator {}: {} of {} blocks checked hold wrong bytes", i, bad,
                                  good + bad);
      }
    }
    target.close_region();
    row.verified = all_good;
  } catch (const ChannelError&) {
    throw;
  } catch (const std::exception& e) {
    row.error = e.what();
  }
  return row;
}

std::string triple(const Timing& t) {
  const auto f = [](double us) {
    return us < 100 ? fmt::format("{:.1f}", us) : fmt::format("{:.0f}", us);
  };
  return t.count == 0 ? "-" : fmt::format("{}/{}/{}", f(t.p50_us), f(t.p99_us), f(t.max_us));
}

void print_rows(const std::vector<FanRow>& rows, const FanParams& p, std::FILE* out) {
  fmt::print(out,
             "fan-out: one initiator -> N targets, round-robin, scoped polls; incast: N initiator "
             "processes -> one target. {} blocks x {}, depth {}, UCX_TLS={}, poll wait {}\n",
             p.block_len >= (1 << 20) ? fmt::format("{} MiB", p.block_len >> 20)
                                      : fmt::format("{} KiB", p.block_len >> 10),
             p.batch, p.depth, ucx_tls_for(p.tls), p.wait.name());
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

// --- Spread ----------------------------------------------------------------

Spread::Spread(std::uint64_t first, std::uint64_t count, std::uint64_t local_blocks,
               std::uint64_t batch, std::uint64_t seed)
    : first_(first), count_(count / batch * batch), batch_(batch) {
  if (batch == 0 || count_ == 0 || local_blocks == 0) {
    throw std::invalid_argument("a writer needs at least one batch of blocks");
  }
  remote_perm_ = shuffled(first_, count_, seed);
  local_perm_ = shuffled(0, local_blocks, mix64(seed));
}

void Spread::write(std::uint64_t w, std::span<std::int64_t> local,
                   std::span<std::int64_t> remote) const {
  const std::uint64_t at = (w % cycle()) * batch_;
  const std::uint64_t l = local_perm_.size();
  for (std::uint64_t j = 0; j < batch_; ++j) {
    remote[j] = remote_perm_[at + j];
    local[j] = local_perm_[(w * batch_ + j) % l];
  }
}

std::vector<std::pair<std::int64_t, std::int64_t>> Spread::landed(std::uint64_t writes,
                                                                  std::uint64_t max) const {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  const std::uint64_t c = cycle();
  const std::uint64_t l = local_perm_.size();
  // The last write of each batch slot k is the largest w < writes with w % c == k.
  for (std::uint64_t k = 0; k < c && k < writes && out.size() < max; ++k) {
    const std::uint64_t last = k + (writes - 1 - k) / c * c;
    for (std::uint64_t j = 0; j < batch_ && out.size() < max; ++j) {
      out.emplace_back(remote_perm_[k * batch_ + j], local_perm_[(last * batch_ + j) % l]);
    }
  }
  return out;
}

// --- entry points ----------------------------------------------------------

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
      if (!args.quiet) fmt::print(stderr, "  {} N={}: raw streams (iperf3) ...\n", r.experiment, r.n);
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

int run_initiator() {
  LineChannel channel(::dup(STDIN_FILENO), ::dup(STDOUT_FILENO), "bench (parent)");
  ::dup2(STDERR_FILENO, STDOUT_FILENO);  // stray output (UCX logs) stays out of the channel
  try {
    channel.write_line("HELLO kvxfer-initiator", kWriteTimeout);
    const Message m = Message::parse(channel.read_line(kReplyTimeout));
    if (m.word != "SETUP") throw ChannelError("expected SETUP");
    const std::string tls = m.text("tls");
    const std::uint64_t block_len = m.number("block_len");
    const std::uint64_t local_region = m.number("local_region");
    const std::uint64_t seed = m.number("seed");
    if (block_len == 0 || local_region < block_len || local_region > (64ull << 30)) {
      throw ChannelError("bad SETUP geometry");
    }
    const std::uint64_t local_blocks = local_region / block_len;
    Options options = writer_options(tls, nullptr);
    for (const auto& [key, value] : parse_engine_word(m.text("engine")))
      options.engine_config[key] = value;
    const std::uint64_t num_threads = m.number("num_threads");
    if (num_threads < 1 || num_threads > 1024) throw ChannelError("bad SETUP num_threads");
    options.num_threads = static_cast<int>(num_threads);
    options.progress_thread = m.number("progress_thread") != 0;
    Pool pool(local_region);
    fill(pool, block_len, local_blocks, seed);
    Transport transport(fmt::format("bench-incast-{}", ::getpid()),
                        Region{pool.data(), local_blocks, block_len}, options);
    transport.add_remote_peer("target", from_hex(m.text("metadata")), m.number("base"),
                              m.number("num_blocks"), block_len);
    const Spread spread(m.number("first"), m.number("count"), local_blocks, m.number("batch"),
                        seed);
    std::vector<Job> jobs(1);
    jobs[0].peer = "target";
    jobs[0].spread = &spread;
    jobs[0].writes = m.number("writes");
    warm_up(transport, jobs);
    channel.write_line("READY", kWriteTimeout);
    if (Message::parse(channel.read_line(kReplyTimeout)).word != "GO")
      throw ChannelError("expected GO");
    PollWait wait;
    wait.mode = m.text("poll_wait");
    wait.sleep_us = static_cast<int>(std::min<std::uint64_t>(m.number("poll_sleep_us"), 1'000'000));
    if (wait.mode != "spin" && wait.mode != "yield" && wait.mode != "sleep")
      throw ChannelError("bad SETUP poll_wait");
    const DriveResult r =
        drive(transport, jobs, static_cast<int>(m.number("depth")), block_len, wait);
    transport.close();
    const bool ok = r.error.empty() && r.failed == 0 && transport.stats().live == HandleCounts{};
    if (!ok)
      std::fprintf(stderr, "kvxfer initiator: %s (%llu failed)\n", r.error.c_str(),
                   static_cast<unsigned long long>(r.failed));
    const auto tenth = [](double us) { return static_cast<std::uint64_t>(us * 10.0 + 0.5); };
    channel.write_line(
        fmt::format("DONE ok={} bytes={} start_ns={} end_ns={} writes={} write_p50={} "
                    "write_p99={} write_max={} polls={} poll_p50={} poll_p99={} poll_max={}",
                    ok ? 1 : 0, r.bytes, r.start_ns, r.end_ns, r.write_call.count,
                    tenth(r.write_call.p50_us), tenth(r.write_call.p99_us),
                    tenth(r.write_call.max_us), r.poll_call.count, tenth(r.poll_call.p50_us),
                    tenth(r.poll_call.p99_us), tenth(r.poll_call.max_us)),
        kWriteTimeout);
    (void)channel.read_line(kReplyTimeout);  // QUIT
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvxfer initiator: %s\n", e.what());
    return 1;
  }
}

}  // namespace kvxfer::tools
