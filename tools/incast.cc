// SPDX-License-Identifier: Apache-2.0
// Incast (fan.h): N `kvxfer initiator` processes, each one writer
// (fan_writer.h) into its own range of one target, driven by the bench over
// their stdin and stdout: the bench's side and the initiator's. Touches only
// those processes, their channels and the target.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>
#include <stdexcept>

#include "bench_config.h"
#include "channel.h"
#include "fan.h"
#include "kvxfer/transport.h"
#include "pattern.h"
#include "pool.h"
#include "subprocess.h"

namespace kvxfer::tools {
namespace {

constexpr Millis kReplyTimeout{120'000};
constexpr Millis kWriteTimeout{30'000};

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

struct Initiator {
  std::unique_ptr<Subprocess> child;
  std::unique_ptr<LineChannel> channel;
};

}  // namespace

FanRow run_incast(const FanParams& p, int n, TargetProcess& target) {
  return fan_row("incast", n, [&](FanRow& row) {
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
      all_good =
          tally_verified(row, fmt::format("initiator {}", i), pairs.size(), good, bad) && all_good;
    }
    target.close_region();
    row.verified = all_good;
  });
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
    // The bench's own options, from what it sent.
    BenchArgs sent;
    sent.tls = tls;
    sent.engine = parse_engine_word(m.text("engine"));
    const std::uint64_t num_threads = m.number("num_threads");
    if (num_threads < 1 || num_threads > 1024) throw ChannelError("bad SETUP num_threads");
    sent.num_threads = static_cast<int>(num_threads);
    sent.progress_thread = m.number("progress_thread") != 0;
    const Options options = bench_transport_options(sent);
    Pool pool(local_region);
    fill_blocks(pool.data(), block_len, local_blocks, seed);
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
