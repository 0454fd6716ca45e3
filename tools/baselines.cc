// SPDX-License-Identifier: Apache-2.0
#include "baselines.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "iperf.h"
#include "spinner.h"

namespace kvxfer::tools {
namespace {

using Clock = std::chrono::steady_clock;

// GB/s of one timed raw stream of `bytes` from `source` into the target's
// pool.
double raw_stream_gbps(TargetProcess& target, const std::string& host, const Pool& source,
                       std::uint64_t bytes) {
  const double seconds = target.raw_stream(host, source.data(), source.size(), bytes);
  return static_cast<double>(bytes) / seconds / 1e9;
}

}  // namespace

unsigned memcpy_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

double memcpy_gbps(const Schedule& schedule, std::uint64_t block_len, std::uint64_t num_blocks,
                   const std::uint8_t* src, std::uint8_t* dst, unsigned threads) {
  const std::uint64_t slice = (num_blocks + threads - 1) / threads;
  const auto copy = [&](unsigned t) {
    for (std::uint64_t w = 0; w < schedule.writes(); ++w) {
      const auto local = schedule.local(w);
      const auto remote = schedule.remote(w);
      for (std::size_t i = 0; i < local.size(); ++i) {
        if (threads > 1 && static_cast<std::uint64_t>(remote[i]) / slice != t) continue;
        std::memcpy(dst + static_cast<std::uint64_t>(remote[i]) * block_len,
                    src + static_cast<std::uint64_t>(local[i]) * block_len, block_len);
      }
    }
  };
  Clock::time_point start;
  if (threads == 1) {
    start = Clock::now();
    copy(0);
  } else {
    // Every thread started and waiting before the clock starts.
    std::atomic<unsigned> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> workers;
    workers.reserve(threads);
    for (unsigned t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        copy(t);
      });
    }
    while (ready.load() < threads) std::this_thread::yield();
    start = Clock::now();
    go.store(true, std::memory_order_release);
    for (auto& t : workers) t.join();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return static_cast<double>(schedule.writes() * schedule.batch() * block_len) / seconds / 1e9;
}

void run_tcp_baselines(const BenchArgs& args, TargetProcess& target, const std::string& host,
                       const Pool& source, BenchReport& report) {
  if (!args.iperf3) {
    report.iperf3.error = "skipped (--no-iperf3)";
  } else if (!args.peer.empty()) {
    report.iperf3.error =
        "skipped: iperf3 runs on loopback, and the target is on another host (--peer)";
  } else {
    if (!args.quiet) {
      fmt::print(stderr,
                 "  running iperf3 (one connection, 1 MiB writes, loopback, {} s; then again "
                 "beside a spinning thread) ...\n",
                 args.iperf3_seconds);
    }
    IperfRequest request;
    request.seconds = args.iperf3_seconds;
    request.timeout = std::chrono::seconds(args.iperf3_seconds + 30);
    report.iperf3 = run_iperf3(request);
    report.iperf3_spinner = run_iperf3_beside_spinner(request);
  }
  if (!args.raw_tcp) return;
  if (!args.quiet) fmt::print(stderr, "  running the raw TCP stream baseline ...\n");
  try {
    // First one untimed stream of the whole pool, so that the timed one
    // sends (and lands on) pages that were all sent before: on some VMs a
    // first pass over pages never sent runs several times slower (0.3-0.5
    // GB/s against 2-4 GB/s on loopback), which no transfer of a case meets
    // in its timed part either.
    report.raw_tcp_warm_bytes = source.size();
    target.raw_stream(host, source.data(), source.size(), report.raw_tcp_warm_bytes);
    report.raw_tcp_gbps = raw_stream_gbps(target, host, source, args.raw_tcp_bytes);
    report.raw_tcp_bytes = args.raw_tcp_bytes;
    // The same timed stream (no warm pass: the pages were sent) with one
    // thread of ours spinning beside it, as the caller spins in poll()
    // during a case.
    const Spinner spinner;
    report.raw_tcp_spinner_gbps = raw_stream_gbps(target, host, source, args.raw_tcp_bytes);
  } catch (const std::exception& e) {
    report.raw_tcp_error = e.what();
  }
}

}  // namespace kvxfer::tools
