// SPDX-License-Identifier: Apache-2.0
#include "demo.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>
#include "bench_config.h"
#include "kvxfer/transport.h"
#include "lane_counts.h"
#include "pattern.h"
#include "pool.h"
#include "pretouch_wait.h"
#include "target_process.h"

namespace kvxfer::tools {

// Spawns a target, writes `blocks` random blocks into it (each remote block
// once), verifies every one on the target, then writes the same blocks again
// and verifies them again, and prints both passes: the first meets pools no
// transfer has touched (a server's first transfers after start-up), the
// second the steady state. Each pass has a Transport of its own, since the
// target's check ends its region's writes.
int run_demo(const DemoArgs& a) {
  if (a.block_len == 0 || a.pool_bytes < a.block_len) {
    throw std::invalid_argument("--block-len must be > 0 and at most --pool");
  }
  const std::uint64_t num_blocks = a.pool_bytes / a.block_len;
  if (a.blocks == 0 || a.blocks > num_blocks) {
    throw std::invalid_argument(fmt::format("--blocks must be in [1, {}]", num_blocks));
  }
  const std::uint64_t batch = std::min(a.batch, a.blocks);
  const std::uint64_t seed = a.seed != 0 ? a.seed : std::random_device{}();

  fmt::print(
      "kvxfer demo: target + initiator, {} MiB pools of {} blocks x {} bytes, two passes "
      "over the same {} blocks\n",
      a.pool_bytes >> 20, num_blocks, a.block_len, a.blocks);
  auto target =
      TargetProcess::spawn({"target", "--tls", a.tls, "--region", std::to_string(a.pool_bytes)});
  const std::string fingerprint = config_fingerprint(bench_config_fields(a.tls));
  Pool pool(a.pool_bytes);

  std::mt19937_64 rng(seed);
  std::vector<std::int64_t> remote_order(num_blocks);
  std::iota(remote_order.begin(), remote_order.end(), 0);
  std::shuffle(remote_order.begin(), remote_order.end(), rng);
  std::vector<std::int64_t> local_order(num_blocks);
  std::iota(local_order.begin(), local_order.end(), 0);
  std::shuffle(local_order.begin(), local_order.end(), rng);

  struct Pass {
    double seconds = 0;
    std::uint64_t failed = 0;
    std::uint64_t good = 0;
    std::uint64_t bad = 0;
    std::string lane;  // what the initiator's counters say carried it
    bool clean = false;
    double settle_s = 0;  // open + registration until both pools' pre-touch finished
    [[nodiscard]] bool ok(std::uint64_t blocks) const {
      return bad == 0 && failed == 0 && good == blocks && clean;
    }
  };
  // One pass: our blocks, patterned with `pass_seed`, into the target's.
  const auto run_pass = [&](std::uint64_t pass_seed) {
    Pass p;
    fill_blocks(pool.data(), a.block_len, num_blocks, pass_seed);
    // The target's open() returns once its pool's pre-touch is done; ours
    // is waited for here: a server meets its first transfers after its
    // start-up, and settle_s says how long after.
    const auto settle_start = std::chrono::steady_clock::now();
    const TargetGeometry& g = target->open(a.block_len, a.pool_bytes, fingerprint);
    Transport transport(fmt::format("initiator-{}", ::getpid()),
                        Region{pool.data(), num_blocks, a.block_len}, bench_options(a.tls));
    transport.add_remote_peer("target", g.metadata, g.base, g.num_blocks, g.block_len);
    static_cast<void>(wait_for_pretouch(transport));
    p.settle_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - settle_start).count();
    std::vector<std::pair<std::int64_t, std::int64_t>> written;  // (remote, local)
    written.reserve(a.blocks);
    std::uint64_t next = 0;
    std::uint64_t inflight = 0;
    const auto start = std::chrono::steady_clock::now();
    while (next < a.blocks || inflight > 0) {
      while (next < a.blocks && inflight < static_cast<std::uint64_t>(a.depth)) {
        const std::uint64_t n = std::min(batch, a.blocks - next);
        std::span<const std::int64_t> local(local_order.data() + next, n);
        std::span<const std::int64_t> remote(remote_order.data() + next, n);
        if (!transport.write_blocks("target", local, remote)) {
          throw std::runtime_error("write_blocks failed");
        }
        for (std::uint64_t i = 0; i < n; ++i) written.emplace_back(remote[i], local[i]);
        next += n;
        ++inflight;
      }
      const PollResult r = transport.poll("target");
      inflight -= r.done.size() + r.failed.size();
      p.failed += r.failed.size();
      if (r.peer_fault) throw std::runtime_error("peer faulted: " + *r.peer_fault);
    }
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    p.lane = lane_seen(lane_transfers(transport.stats().engine_counters));
    transport.close();
    std::tie(p.good, p.bad) = target->verify(pass_seed, written);
    p.clean = transport.stats().live == HandleCounts{};
    target->close_region();
    return p;
  };
  const Pass first = run_pass(seed);
  // Other bytes into the same blocks: the check tells the passes apart.
  const Pass second = run_pass(mix64(seed ^ 0x5eedu));

  const std::uint64_t bytes = a.blocks * a.block_len;
  const std::string ucx_tls = ucx_tls_for(a.tls).empty() ? "(UCX default)" : ucx_tls_for(a.tls);
  const std::string lane =
      first.lane == second.lane ? first.lane : first.lane + ", then " + second.lane;
  if (lane.empty()) {
    fmt::print("lane       none counted a transfer\n");
  } else if (lane == "ucx") {
    fmt::print("lane       ucx (its transports: UCX_TLS={})\n", ucx_tls);
  } else {
    fmt::print(
        "lane       {} (the initiator's counters; UCX_TLS={} applies to the ucx lane "
        "only)\n",
        lane, ucx_tls);
  }
  fmt::print("blocks     {} per pass\n", a.blocks);
  fmt::print("bytes      {} per pass\n", bytes);
  const auto print_pass = [&](const char* name, const Pass& p) {
    const double gbps = static_cast<double>(bytes) / p.seconds / 1e9;
    // Only bytes that verified have a throughput.
    fmt::print(
        "{:<10} {} GB/s, {:.0f} blocks/s, {:.4f} s; verified {} ({} of {} blocks byte for "
        "byte, {} wrong, {} failed)\n",
        name, p.ok(a.blocks) ? fmt::format("{:.2f}", gbps) : std::string("-"),
        static_cast<double>(a.blocks) / p.seconds, p.seconds, p.ok(a.blocks) ? "yes" : "NO", p.good,
        a.blocks, p.bad, p.failed);
  };
  print_pass("first", first);
  print_pass("second", second);
  fmt::print(
      "           first: into pools no transfer had touched, as a server's first "
      "transfers after start-up, once both pools' registration pre-touch had finished "
      "({:.2f} s after the registrations began; KVXFER_PRETOUCH=off skips it); second: the "
      "same blocks again (the steady state)\n",
      first.settle_s);
  fmt::print("closed     live handles after close: {}\n",
             first.clean && second.clean ? "0" : "LEAKED");
  const int target_status = target->quit();
  return first.ok(a.blocks) && second.ok(a.blocks) && target_status == 0 ? 0 : 1;
}

}  // namespace kvxfer::tools
