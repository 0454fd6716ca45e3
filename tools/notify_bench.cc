// SPDX-License-Identifier: Apache-2.0
#include "notify_bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

#include "bench_config.h"
#include "kvxfer/transport.h"
#include "notify_probe.h"
#include "pattern.h"
#include "pool.h"
#include "target_process.h"

namespace kvxfer::tools {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr const char* kPeer = "target";
constexpr auto kWaitLimit = std::chrono::seconds(60);
// Untimed notifications first: over TCP, UCX connects lanes lazily.
constexpr std::uint64_t kWarmUp = 16;

struct ModeResult {
  std::string mode;
  std::uint64_t done = 0;
  std::uint64_t failed = 0;
  Timing call;  // write_blocks / send_notification
  TargetProcess::NotesTaken taken;
  std::string error;

  [[nodiscard]] bool good(std::uint64_t count) const {
    return error.empty() && failed == 0 && done == count && taken.got == count && taken.bad == 0 &&
           taken.out_of_order == 0;
  }
};

// Posts `count` notifications, each after a one-block write (with_data)
// or alone, and waits for each before the next.
ModeResult run_mode(const BenchArgs& args, TargetProcess& target, Transport& transport,
                    bool with_data, std::uint64_t count, std::uint64_t seed,
                    std::uint64_t local_blocks) {
  ModeResult r;
  r.mode = with_data ? "write+notify" : "notify";
  target.notes_begin(count, seed);
  std::vector<double> call_us;
  call_us.reserve(count);
  std::array<std::uint8_t, NotifyProbe::kLen> message{};
  for (std::uint64_t i = 0; i < count; ++i) {
    NotifyProbe probe;
    probe.seq = i;
    if (with_data) {
      probe.local = static_cast<std::int64_t>(i % local_blocks);
      probe.remote = static_cast<std::int64_t>(i);  // each target block once
    }
    const std::int64_t local = probe.local;
    const std::int64_t remote = probe.remote;
    probe.posted_ns = monotonic_ns();
    probe.encode(message.data());
    const auto t0 = Clock::now();
    const auto id = with_data ? transport.write_blocks(kPeer, std::span(&local, 1),
                                                       std::span(&remote, 1), message)
                              : transport.send_notification(kPeer, message);
    call_us.push_back(micros(Clock::now() - t0));
    if (!id) {
      r.error = fmt::format("notification {} failed to post", i);
      break;
    }
    const auto deadline = Clock::now() + kWaitLimit;
    for (;;) {
      const PollResult p = transport.poll(kPeer);
      r.done += p.done.size();
      r.failed += p.failed.size();
      if (!p.done.empty() || !p.failed.empty()) break;
      if (p.peer_fault) {
        r.error = "peer faulted: " + *p.peer_fault;
        break;
      }
      if (Clock::now() > deadline) {
        r.error = fmt::format("notification {} was not done after {} s", i, kWaitLimit.count());
        break;
      }
      poll_idle(args.poll_wait, args.poll_sleep_us);
    }
    if (!r.error.empty()) break;
  }
  r.call = Timing::of(std::move(call_us));
  r.taken = target.notes_taken();  // the target stops waiting on its own
  return r;
}

void print(const std::vector<ModeResult>& modes, std::uint64_t count, const std::string& tls,
           std::uint64_t block_len) {
  fmt::print("kvxfer bench --op notify: UCX_TLS={}, {} per mode, one in flight, {} KiB blocks\n",
             tls.empty() ? "(UCX default)" : tls, count, block_len >> 10);
  fmt::print("{:<13} {:>9} | {:>28} | {:>20} | {:>4} {:>12}\n", "", "", "post -> delivered (us)",
             "post call (us)", "", "");
  fmt::print("{:<13} {:>9} | {:>8} {:>9} {:>9} | {:>9} {:>10} | {:>4} {:>12}\n", "mode",
             "delivered", "p50", "p99", "max", "p50", "p99", "bad", "out of order");
  for (const ModeResult& m : modes) {
    fmt::print("{:<13} {:>9} | {:>8.1f} {:>9.1f} {:>9.1f} | {:>9.1f} {:>10.1f} | {:>4} {:>12}\n",
               m.mode, m.taken.got, m.taken.p50_us, m.taken.p99_us, m.taken.max_us, m.call.p50_us,
               m.call.p99_us, m.taken.bad, m.taken.out_of_order);
    if (!m.error.empty()) fmt::print("  {}: {}\n", m.mode, m.error);
    if (m.failed != 0) fmt::print("  {}: {} transfers failed\n", m.mode, m.failed);
  }
}

void write_json(const std::vector<ModeResult>& modes, std::uint64_t count, const std::string& tls,
                std::uint64_t block_len, const std::string& path) {
  json out = {{"op", "notify"}, {"ucx_tls", tls}, {"count", count}, {"block_len", block_len}};
  json list = json::array();
  for (const ModeResult& m : modes) {
    list.push_back({{"mode", m.mode},
                    {"delivered", m.taken.got},
                    {"bad", m.taken.bad},
                    {"out_of_order", m.taken.out_of_order},
                    {"failed", m.failed},
                    {"error", m.error.empty() ? json(nullptr) : json(m.error)},
                    {"latency_us",
                     {{"p50", m.taken.p50_us},
                      {"p99", m.taken.p99_us},
                      {"max", m.taken.max_us},
                      {"mean", m.taken.mean_us}}},
                    {"post_call_us", {{"p50", m.call.p50_us}, {"p99", m.call.p99_us}}}});
  }
  out["modes"] = std::move(list);
  std::ofstream(path) << out.dump(2) << '\n';
}

}  // namespace

int run_notify_bench(const BenchArgs& args) {
  if (!args.peer.empty()) {
    throw std::invalid_argument(
        "--op notify times each delivery on this machine's clock: it spawns its own target "
        "(no --peer)");
  }
  const std::uint64_t count = args.notifications;
  const std::uint64_t block_len = args.block_len.value_or(64 << 10);
  if (count == 0 || count > 1'000'000) {
    throw std::invalid_argument("--notifications must be in [1, 1000000]");
  }
  const std::uint64_t region = count * block_len;
  if (block_len == 0 || region / count != block_len || region > args.region) {
    throw std::invalid_argument(
        fmt::format("--notifications {} blocks of {} bytes do not fit --region {}", count,
                    block_len, args.region));
  }
  const std::uint64_t seed = args.seed != 0 ? args.seed : (std::random_device{}() | 1);
  auto target =
      TargetProcess::spawn(target_command(args.tls, region, args.target_engine));
  const TargetGeometry& g =
      target->open(block_len, region, config_fingerprint(bench_config_fields(args.tls)));
  const std::uint64_t local_blocks = std::min<std::uint64_t>(count, 1024);
  Pool source(local_blocks * block_len);
  for (std::uint64_t i = 0; i < local_blocks; ++i) {
    fill_block(source.data() + i * block_len, block_len, seed, i);
  }
  std::vector<ModeResult> modes;
  {
    Transport transport(fmt::format("bench-notifier-{}", ::getpid()),
                        Region{source.data(), local_blocks, block_len},
                        bench_transport_options(args));
    transport.add_remote_peer(kPeer, g.metadata, g.base, g.num_blocks, g.block_len);
    if (!args.quiet) fmt::print(stderr, "  warming up ...\n");
    const ModeResult warm = run_mode(args, *target, transport, false, kWarmUp, seed, local_blocks);
    if (!warm.good(kWarmUp)) {
      throw std::runtime_error("warm-up: " +
                               (warm.error.empty() ? "notifications lost" : warm.error));
    }
    for (const bool with_data : {true, false}) {
      if (!args.quiet)
        fmt::print(stderr, "  running {} ...\n", with_data ? "write+notify" : "notify");
      modes.push_back(run_mode(args, *target, transport, with_data, count, seed, local_blocks));
    }
  }
  target->close_region();
  const int target_status = target->quit();
  if (target_status != 0 && !args.quiet) {
    fmt::print(stderr, "kvxfer bench: the target exited with status {}\n", target_status);
  }
  print(modes, count, ucx_tls_for(args.tls), block_len);
  if (!args.json_path.empty())
    write_json(modes, count, ucx_tls_for(args.tls), block_len, args.json_path);
  bool good = true;
  for (const ModeResult& m : modes) good = good && m.good(count);
  return good ? 0 : 1;
}

}  // namespace kvxfer::tools
