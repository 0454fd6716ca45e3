// SPDX-License-Identifier: Apache-2.0
// The kvxfer command: bench, demo, info, and the target side of
// multi-process runs. A user of the library: it touches the public API
// (include/kvxfer/) and, header-only, src/common/ucx_tls.h; nothing else in src/.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "bench.h"
#include "bench_config.h"
#include "demo.h"
#include "fan.h"
#include "info.h"
#include "kvxfer/transport.h"
#include "lane_counts.h"
#include "machine.h"
#include "notify_bench.h"
#include "pattern.h"
#include "peers_bench.h"
#include "pool.h"
#include "pretouch_wait.h"
#include "startup.h"
#include "target_process.h"

namespace kvxfer::tools {
namespace {

// --ucx KEY=VALUE (with or without the UCX_ prefix) becomes UCX_KEY=VALUE in
// our environment, before any UCX context exists: transport knobs (e.g.
// TCP_TX_SEG_SIZE) are not UCP context settings, so Options::engine_config
// cannot carry them, and the environment also reaches a spawned target and
// ucx_perftest.
std::map<std::string, std::string> apply_ucx_knobs(const std::vector<std::string>& items) {
  std::map<std::string, std::string> knobs;
  for (const auto& item : items) {
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw CLI::ValidationError("--ucx", "expected KEY=VALUE, got '" + item + "'");
    }
    std::string key = item.substr(0, eq);
    if (key.rfind("UCX_", 0) == 0) key.erase(0, 4);
    if (key == "TLS") throw CLI::ValidationError("--ucx", "set the transports with --tls");
    knobs[key] = item.substr(eq + 1);
    ::setenv(("UCX_" + key).c_str(), knobs[key].c_str(), 1);
  }
  return knobs;
}

// --engine / --target-engine KEY=VALUE items: engine_config entries.
std::map<std::string, std::string> parse_knobs(const std::string& option,
                                               const std::vector<std::string>& items) {
  std::map<std::string, std::string> knobs;
  for (const auto& item : items) {
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw CLI::ValidationError(option, "expected KEY=VALUE, got '" + item + "'");
    }
    knobs[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return knobs;
}

}  // namespace
}  // namespace kvxfer::tools

int main(int argc, char** argv) {
  using namespace kvxfer::tools;
  // A peer that goes away is an error to report, not a signal that kills us.
  ::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"kvxfer: one-sided WRITEs of KV-cache blocks between processes"};
  app.require_subcommand(1);
  std::string log_level;
  app.add_option("--log-level", log_level,
                 "library log level (trace, debug, info, warn, error, off); default warn")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "err", "error", "critical", "off"}));

  // --- bench ---
  BenchArgs bench;
  std::string role = "initiator";
  std::string listen;
  int sessions = 0;
  std::vector<std::string> ucx_knobs;
  bool no_progress_thread = false;
  bool no_perftest = false;
  bool no_raw_tcp = false;
  auto* bench_cmd = app.add_subcommand(
      "bench", "measure the reference workloads against memcpy and ucx_perftest");
  bench_cmd->add_option("--cases", bench.cases, "cases to run: big,layer,small,runs,reg")
      ->delimiter(',')
      ->allow_extra_args(false)
      ->check(CLI::IsMember({"big", "layer", "small", "runs", "reg"}));
  auto* tls_option =
      bench_cmd->add_option("--tls", bench.tls, "UCX transports: sm, tcp, or a UCX_TLS string")
          ->capture_default_str();
  bench_cmd
      ->add_option(
          "--lane", bench.lane,
          "TCP runs: the kvxfer lane that carries the transfers, set as KVXFER_LANES on both "
          "sides and checked after each case against the initiator's lane counters (a case on "
          "another lane fails): tcp (kvxfer's own TCP lane; the default with --tls tcp), ucx "
          "(the UCX lane's puts and gets over UCX_TLS=tcp, with KVXFER_RMA=on and 1M tcp "
          "segments), or both (every "
          "case on the tcp lane, then on the ucx lane, a target each, with a tcp/ucx column). "
          "Implies --tls tcp when --tls is not given. With --role target: the lane this target "
          "runs (tcp or ucx)")
      ->check(CLI::IsMember({"tcp", "ucx", "both"}));
  bench_cmd
      ->add_option("--encrypt", bench.encrypt,
                   "the tcp lane's encryption, KVXFER_TCP_ENCRYPT on both sides: off, on (TLS "
                   "1.3), or both (every case with encryption off, then on, a target each)")
      ->check(CLI::IsMember({"off", "on", "both"}))
      ->capture_default_str();
  bench_cmd
      ->add_option("--op", bench.op,
                   "write (write_blocks into the target, checked there), read (read_blocks "
                   "from the target's pool, checked here), or notify (post-to-delivery latency "
                   "of notifications, after a write and alone)")
      ->check(CLI::IsMember({"write", "read", "notify"}))
      ->capture_default_str();
  bench_cmd
      ->add_option("--api", bench.api,
                   "blocks (write_blocks/read_blocks) or nixl (the same blocks as descriptor "
                   "lists prepared once, posted with Transport::transfer: NIXL's path)")
      ->check(CLI::IsMember({"blocks", "nixl"}))
      ->capture_default_str();
  bench_cmd
      ->add_option("--notifications", bench.notifications,
                   "--op notify: notifications per mode, one in flight")
      ->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  bench_cmd->add_option("--block-len", bench.block_len, "block length for every case (e.g. 64K)")
      ->transform(CLI::AsSizeValue(false));
  bench_cmd->add_option("--batch", bench.batch, "blocks per write_blocks call");
  bench_cmd->add_option("--depth", bench.depth, "writes kept in flight")
      ->check(CLI::PositiveNumber);
  bench_cmd->add_option("--pattern", bench.pattern, "random | runs:K");
  bench_cmd->add_option("--total", bench.total, "payload bytes per case (e.g. 8G)")
      ->transform(CLI::AsSizeValue(false));
  bench_cmd->add_option("--region", bench.region, "region size of each side")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  bench_cmd->add_option("--json", bench.json_path, "write every figure to FILE");
  bench_cmd->add_flag("--telemetry", bench.telemetry,
                      "record every transfer (Options::telemetry) and check the records "
                      "against the transfers poll() reported");
  bench_cmd->add_option("--metrics", bench.metrics_path,
                        "write the initiator's metrics (Prometheus text) to FILE at the end");
  bench_cmd->add_option("--plot", bench.plot_path, "draw GB/s per case to FILE.png (gnuplot)");
  bench_cmd->add_flag("--quiet,-q", bench.quiet, "no progress or status lines on stderr");
  bench_cmd->add_option("--peer", bench.peer, "HOST:PORT of a target started with --role target");
  bench_cmd->add_option("--role", role, "initiator (default) or target")
      ->check(CLI::IsMember({"initiator", "target"}));
  bench_cmd->add_option("--listen", listen, "HOST:PORT a target listens on (port 0: any)");
  bench_cmd->add_option("--sessions", sessions,
                        "target: serve N initiators, then exit (0: forever)");
  bench_cmd
      ->add_option("--ucx", ucx_knobs,
                   "UCX knob KEY=VALUE, set as UCX_KEY in the environment of both sides "
                   "and ucx_perftest (e.g. TCP_TX_SEG_SIZE=64K); repeatable")
      ->allow_extra_args(false);
  std::vector<std::string> engine_knobs;
  bench_cmd
      ->add_option("--engine", engine_knobs,
                   "initiator engine_config (each, with --initiators) KEY=VALUE, e.g. "
                   "KVXFER_CMA_SLICE=64K or KVXFER_RMA=on; repeatable")
      ->allow_extra_args(false);
  std::vector<std::string> target_engine_knobs;
  bench_cmd
      ->add_option("--target-engine", target_engine_knobs,
                   "engine_config KEY=VALUE of every target the bench spawns (with --role "
                   "target: of this target), e.g. KVXFER_CMA_SLICE=64K; repeatable")
      ->allow_extra_args(false);
  bench_cmd->add_flag(
      "--no-progress-thread", no_progress_thread,
      "initiator (each, with --initiators): no UCX progress thread (it polls anyway)");
  bench_cmd
      ->add_option("--num-threads", bench.num_threads,
                   "Options::num_threads of the initiator (each, with --initiators)")
      ->check(CLI::PositiveNumber);
  std::string poll_wait = "spin";
  bench_cmd
      ->add_option("--poll-wait", poll_wait,
                   "after an empty poll: spin, yield, or sleep:MICROSECONDS")
      ->capture_default_str();
  bench_cmd->add_flag("--no-perftest", no_perftest, "skip the ucx_perftest baseline");
  std::string pool_kind = "private";
  bench_cmd
      ->add_option("--pool", pool_kind,
                   "pools of every side: private (anonymous memory), shared "
                   "(kvxfer::SharedPool, which same-host peers map and copy into with memcpy) "
                   "or huge (anonymous memory on transparent huge pages)")
      ->check(CLI::IsMember({"private", "shared", "huge"}))
      ->capture_default_str();
  bench_cmd
      ->add_option(
          "--targets", bench.targets,
          "fan-out: one initiator writing round-robin to N target processes (e.g. 1,2,4,8)")
      ->delimiter(',')
      ->allow_extra_args(false);
  bench_cmd
      ->add_option("--initiators", bench.initiators,
                   "incast: N initiator processes writing into one target (e.g. 1,2,4)")
      ->delimiter(',')
      ->allow_extra_args(false);
  bench_cmd->add_flag("--no-raw-tcp", no_raw_tcp,
                      "skip the raw TCP stream baseline (runs with --tls tcp only): one plain "
                      "TCP connection between the two processes' pools, timed after an untimed "
                      "pass over the whole pool, and compared with iperf3 (agrees within 10%, "
                      "or is not used as a baseline)");
  bench_cmd
      ->add_option("--raw-tcp-bytes", bench.raw_tcp_bytes,
                   "bytes of the raw TCP stream baseline (timed part)")
      ->transform(CLI::AsSizeValue(false));
  bool no_warm_pass = false;
  bench_cmd->add_flag("--no-warm-pass", no_warm_pass,
                      "skip each write or read case's timed first pass (every block written "
                      "once into the target's pool, or read once from it, before the steady "
                      "state: the 1st GB/s column) and, when a reg case is a target's first, the "
                      "untimed pass of the "
                      "initiator's whole pool into the target's (a plain TCP stream with --tls "
                      "tcp, else process_vm_writev): on some VMs a first pass over pages never "
                      "sent runs several times slower, and without these only the first case and "
                      "lane to meet a pool would pay it, inside its steady state. With --pool "
                      "shared, also skip each write case's untimed write of every block through "
                      "the initiator's new mapping of the target's pool");
  bool no_iperf3 = false;
  bench_cmd->add_flag("--no-iperf3", no_iperf3,
                      "skip the iperf3 baseline (runs with --tls tcp and a spawned target only): "
                      "`iperf3 -c 127.0.0.1 -J` against `iperf3 -s -1`, one connection on "
                      "loopback, when iperf3 is on PATH; each case's GB/s is quoted as a "
                      "multiple of it (x iperf3, JSON vs_iperf3 and iperf3_gbps)");
  bench_cmd
      ->add_option("--iperf3-seconds", bench.iperf3_seconds, "seconds of the iperf3 baseline (-t)")
      ->check(CLI::Range(1, 60))
      ->capture_default_str();
  bench_cmd
      ->add_option("--perftest-timeout", bench.perftest_timeout_s,
                   "seconds before a ucx_perftest pair is killed")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  bench_cmd
      ->add_option("--verify-blocks", bench.verify_blocks,
                   "blocks checked byte for byte per case, at most")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  bench_cmd->add_option("--reg-reps", bench.reg_reps, "registrations timed by the reg case")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  bench_cmd->add_option("--seed", bench.seed, "random seed (0: random)");

  // --- demo ---
  DemoArgs demo;
  auto* demo_cmd =
      app.add_subcommand("demo", "write random blocks into a target process and verify them");
  demo_cmd->add_option("--pool", demo.pool_bytes, "pool size per side (e.g. 1G)")
      ->transform(CLI::AsSizeValue(false));
  demo_cmd->add_option("--block-len", demo.block_len, "block length (e.g. 64K)")
      ->transform(CLI::AsSizeValue(false));
  demo_cmd->add_option("--blocks", demo.blocks, "blocks to write (each remote block once)");
  demo_cmd->add_option("--batch", demo.batch, "blocks per write_blocks call");
  demo_cmd->add_option("--depth", demo.depth, "writes in flight")->check(CLI::PositiveNumber);
  demo_cmd->add_option("--seed", demo.seed, "random seed (0: random)");
  demo_cmd->add_option("--tls", demo.tls, "UCX_TLS for both sides: sm, tcp, or a UCX_TLS string");

  // --- target (internal: spawned by demo and bench, speaks on stdin/stdout) ---
  TargetConfig target;
  auto* initiator_cmd =
      app.add_subcommand("initiator", "one incast writer, driven by `kvxfer bench --initiators`");
  initiator_cmd->group("");
  auto* target_cmd = app.add_subcommand("target", "serve a pool to an initiator over stdin/stdout");
  target_cmd->group("");
  target_cmd->add_option("--tls", target.tls);
  target_cmd->add_option("--region", target.max_region)->transform(CLI::AsSizeValue(false));
  target_cmd->add_option("--block-len", target.block_len)->transform(CLI::AsSizeValue(false));
  std::vector<std::string> target_knobs;
  target_cmd->add_option("--engine", target_knobs)->allow_extra_args(false);

  // --- peers and startup (issue 11) ---
  PeersArgs peers;
  auto* peers_cmd = app.add_subcommand("peers", "cost of many registered peers (loopback, TCP)");
  peers_cmd->add_option("--loopback", peers.loopback, "loopback peer checkpoints (e.g. 1,64,1000)")
      ->delimiter(',');
  peers_cmd->add_option("--tcp", peers.tcp, "TCP target process checkpoints (e.g. 1,8,64)")
      ->delimiter(',');
  peers_cmd->add_option("--region", peers.region, "each target's pool (e.g. 64M)")
      ->transform(CLI::AsSizeValue(false));
  peers_cmd->add_option("--poll-reps", peers.poll_reps, "timed polls per checkpoint")
      ->check(CLI::PositiveNumber);
  peers_cmd->add_option("--json", peers.json_path, "write every figure to FILE");
  peers_cmd->add_option("--plot", peers.plot_path, "draw cost against peers to FILE.png");
  peers_cmd->add_flag("--quiet,-q", peers.quiet, "no progress lines on stderr");
  StartupArgs startup;
  auto* startup_cmd = app.add_subcommand("startup", "where Transport construction time goes");
  startup_cmd->add_option("--region", startup.region, "pool size (e.g. 1G)")
      ->transform(CLI::AsSizeValue(false));
  startup_cmd->add_option("--tls", startup.tls, "sm, tcp, a UCX_TLS string, or '' (UCX default)");
  startup_cmd->add_option("--reps", startup.reps, "timed runs after the first")
      ->check(CLI::PositiveNumber);
  startup_cmd->add_option("--json", startup.json_path, "write every figure to FILE");

  auto* info_cmd = app.add_subcommand(
      "info", "print the kvxfer and UCX versions, UCX transports, and the lanes this host runs");

  CLI11_PARSE(app, argc, argv);
  // The library reads its log level when its logger is first made; a
  // spawned target inherits it.
  if (!log_level.empty()) ::setenv("KVXFER_LOG_LEVEL", log_level.c_str(), 1);
  try {
    if (*bench_cmd) {
      bench.ucx = apply_ucx_knobs(ucx_knobs);
      bench.engine = parse_knobs("--engine", engine_knobs);
      bench.target_engine = parse_knobs("--target-engine", target_engine_knobs);
      bench.progress_thread = !no_progress_thread;
      // Through the environment, so that every target and initiator the
      // bench starts makes the same kind of pool (tools/pool.h).
      ::setenv(kPoolEnv, pool_kind.c_str(), 1);
      bench.perftest = !no_perftest;
      bench.raw_tcp = !no_raw_tcp;
      bench.iperf3 = !no_iperf3;
      bench.warm_pass = !no_warm_pass;
      // A lane is a TCP run's setting: --lane alone means --tls tcp.
      if (!bench.lane.empty() && tls_option->count() == 0) bench.tls = "tcp";
      if (poll_wait.rfind("sleep:", 0) == 0) {
        bench.poll_wait = "sleep";
        bench.poll_sleep_us = std::stoi(poll_wait.substr(6));
      } else if (poll_wait == "spin" || poll_wait == "yield") {
        bench.poll_wait = poll_wait;
      } else {
        throw CLI::ValidationError("--poll-wait", "spin, yield or sleep:MICROSECONDS");
      }
      if (role == "target") {
        if (listen.empty()) throw CLI::ValidationError("--role target needs --listen HOST:PORT");
        if (!bench.peer.empty()) throw CLI::ValidationError("--peer is for the initiator");
        TargetConfig config;
        config.tls = bench.tls;
        config.max_region = bench.region;
        config.block_len = bench.block_len.value_or(0);
        config.engine = bench.target_engine;
        if (bench.lane == "both") {
          throw CLI::ValidationError("--lane", "a target runs one lane: tcp or ucx");
        }
        if (!bench.lane.empty()) {
          if (config.engine.contains(kLanesKey)) {
            throw CLI::ValidationError("--lane", "sets KVXFER_LANES: not in --target-engine too");
          }
          add_lane_config(config.engine, bench.lane);
          // The environment wins over engine_config.
          ::unsetenv(kLanesKey);
        }
        if (bench.encrypt == "both") throw CLI::ValidationError("--encrypt", "a target: on or off");
        if (bench.encrypt == "on") config.engine[kEncryptKey] = "on";
        return run_target_listener(HostPort::parse(listen), config, sessions);
      }
      if (!listen.empty()) throw CLI::ValidationError("--listen needs --role target");
      if (bench.encrypt != "off" &&
          (bench.op == "notify" || !bench.targets.empty() || !bench.initiators.empty())) {
        // Fan-out, incast and notify: KVXFER_TCP_ENCRYPT on every side, as
        // --engine and --target-engine would set it; one setting a run.
        if (bench.encrypt == "both") {
          throw CLI::ValidationError("--encrypt",
                                     "both runs the reference cases only: with --op notify, "
                                     "--targets or --initiators, run once with off and once with on");
        }
        bench.engine[kEncryptKey] = "on";
        bench.target_engine[kEncryptKey] = "on";
      }
      if (!bench.lane.empty() &&
          (bench.op == "notify" || !bench.targets.empty() || !bench.initiators.empty())) {
        throw CLI::ValidationError("--lane",
                                   "runs the reference cases only: not with --op "
                                   "notify, --targets or --initiators");
      }
      if (bench.op == "notify") {
        if (!bench.targets.empty() || !bench.initiators.empty())
          throw CLI::ValidationError("--op notify: no --targets/--initiators");
        return run_notify_bench(bench);
      }
      if (!bench.targets.empty() || !bench.initiators.empty()) {
        if (bench.op != "write")
          throw CLI::ValidationError("--targets/--initiators run writes only: no --op read");
        if (!bench.peer.empty())
          throw CLI::ValidationError("--targets/--initiators spawn their own targets: no --peer");
        return run_fan(bench);
      }
      return run_bench(bench);
    }
    if (*demo_cmd) return run_demo(demo);
    if (*target_cmd) {
      target.engine = parse_knobs("--engine", target_knobs);
      return run_target(target);
    }
    if (*initiator_cmd) return run_initiator();
    if (*info_cmd) {
      const int status = run_info();
      print_lanes();
      return status;
    }
    if (*peers_cmd) return run_peers_bench(peers);
    if (*startup_cmd) return run_startup(startup);
  } catch (const CLI::Error& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "kvxfer: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
