// The kvxfer command: demo, info, and the target side of multi-process runs.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "kvxfer/transport.h"
#include "pattern.h"
#include "pool.h"
#include "target_process.h"

namespace kvxfer::tools {

// "sm" is shorthand for UCX_TLS=sm,self; "" keeps UCX's own choice.
std::map<std::string, std::string> engine_config_for(const std::string& tls) {
  if (tls.empty()) return {};
  if (tls == "sm") return {{"TLS", "sm,self"}};
  return {{"TLS", tls}};
}

namespace {

struct DemoArgs {
  std::uint64_t pool_bytes = 1ull << 30;
  std::uint64_t block_len = 64 << 10;
  std::uint64_t blocks = 4096;
  std::uint64_t batch = 64;
  int depth = 4;
  std::uint64_t seed = 0;
  std::string tls = "sm,self";
};

// Spawns a target, writes `blocks` random blocks into it (each remote block
// once), verifies every one on the target, and prints the figures.
int run_demo(const DemoArgs& a) {
  if (a.block_len == 0 || a.pool_bytes < a.block_len) {
    throw CLI::ValidationError("--block-len must be > 0 and at most --pool");
  }
  const std::uint64_t num_blocks = a.pool_bytes / a.block_len;
  if (a.blocks == 0 || a.blocks > num_blocks) {
    throw CLI::ValidationError(fmt::format("--blocks must be in [1, {}]", num_blocks));
  }
  const std::uint64_t batch = std::min(a.batch, a.blocks);
  const std::uint64_t seed = a.seed != 0 ? a.seed : std::random_device{}();
  const auto engine_config = engine_config_for(a.tls);

  std::vector<std::string> target_args{"target", "--pool", std::to_string(a.pool_bytes),
                                       "--block-len", std::to_string(a.block_len)};
  if (!a.tls.empty()) {
    target_args.push_back("--tls");
    target_args.push_back(a.tls);
  }
  fmt::print("kvxfer demo: target + initiator, {} MiB pools of {} blocks x {} bytes, UCX_TLS={}\n",
             a.pool_bytes >> 20, num_blocks, a.block_len, a.tls.empty() ? "(default)" : a.tls);
  TargetProcess target(target_args);

  Pool pool(a.pool_bytes);
  for (std::uint64_t i = 0; i < num_blocks; ++i) {
    fill_block(pool.data() + i * a.block_len, a.block_len, seed, i);
  }
  Options options;
  options.engine_config = engine_config;
  Transport transport(fmt::format("initiator-{}", ::getpid()),
                      Region{pool.data(), num_blocks, a.block_len}, options);
  const auto& g = target.geometry();
  transport.add_remote_peer("target", g.metadata, g.base, g.num_blocks, g.block_len);

  std::mt19937_64 rng(seed);
  std::vector<std::int64_t> remote_order(num_blocks);
  std::iota(remote_order.begin(), remote_order.end(), 0);
  std::shuffle(remote_order.begin(), remote_order.end(), rng);
  std::vector<std::int64_t> local_order(num_blocks);
  std::iota(local_order.begin(), local_order.end(), 0);
  std::shuffle(local_order.begin(), local_order.end(), rng);

  std::vector<std::pair<std::int64_t, std::int64_t>> written;  // (remote, local)
  written.reserve(a.blocks);
  std::uint64_t next = 0;
  std::uint64_t inflight = 0;
  std::uint64_t failed = 0;
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
    failed += r.failed.size();
    if (r.peer_fault) throw std::runtime_error("peer faulted: " + *r.peer_fault);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto [good, bad] = target.verify(seed, written);
  const double bytes = static_cast<double>(a.blocks * a.block_len);
  fmt::print("blocks     {}\n", a.blocks);
  fmt::print("bytes      {}\n", a.blocks * a.block_len);
  fmt::print("seconds    {:.4f}\n", seconds);
  fmt::print("GB/s       {:.2f}\n", bytes / seconds / 1e9);
  fmt::print("blocks/s   {:.0f}\n", static_cast<double>(a.blocks) / seconds);
  fmt::print("failed     {}\n", failed);
  fmt::print("verified   {} ({} of {} blocks byte for byte, {} wrong)\n",
             bad == 0 && failed == 0 && good == a.blocks ? "yes" : "NO", good, a.blocks, bad);
  transport.close();
  const Stats s = transport.stats();
  const bool clean = s.live == HandleCounts{};
  fmt::print("closed     live handles after close: {}\n", clean ? "0" : "LEAKED");
  const int target_status = target.quit();
  return bad == 0 && failed == 0 && good == a.blocks && clean && target_status == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvxfer::tools

int main(int argc, char** argv) {
  using namespace kvxfer::tools;
  CLI::App app{"kvxfer: one-sided WRITEs of KV-cache blocks between processes"};
  app.require_subcommand(1);

  DemoArgs demo;
  auto* demo_cmd = app.add_subcommand("demo", "write random blocks into a target process and verify them");
  demo_cmd->add_option("--pool", demo.pool_bytes, "pool size per side (e.g. 1G)")
      ->transform(CLI::AsSizeValue(false));
  demo_cmd->add_option("--block-len", demo.block_len, "block length (e.g. 64K)")
      ->transform(CLI::AsSizeValue(false));
  demo_cmd->add_option("--blocks", demo.blocks, "blocks to write (each remote block once)");
  demo_cmd->add_option("--batch", demo.batch, "blocks per write_blocks call");
  demo_cmd->add_option("--depth", demo.depth, "writes in flight")->check(CLI::PositiveNumber);
  demo_cmd->add_option("--seed", demo.seed, "random seed (0: random)");
  demo_cmd->add_option("--tls", demo.tls, "UCX_TLS for both sides: sm, tcp, or a UCX_TLS string");

  std::uint64_t target_pool = 1ull << 30;
  std::uint64_t target_block_len = 64 << 10;
  std::string target_tls;
  auto* target_cmd = app.add_subcommand("target", "serve a pool to an initiator over stdin/stdout");
  target_cmd->group("");  // internal: spawned by demo and bench
  target_cmd->add_option("--pool", target_pool)->transform(CLI::AsSizeValue(false));
  target_cmd->add_option("--block-len", target_block_len)->transform(CLI::AsSizeValue(false));
  target_cmd->add_option("--tls", target_tls);

  auto* info_cmd = app.add_subcommand("info", "print versions");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*demo_cmd) return run_demo(demo);
    if (*target_cmd) {
      return run_target(target_pool, target_block_len, engine_config_for(target_tls));
    }
    if (*info_cmd) {
      fmt::print("{}\n", kvxfer::version());
      return 0;
    }
  } catch (const CLI::Error& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "kvxfer: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
