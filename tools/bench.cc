// SPDX-License-Identifier: Apache-2.0
#include "bench.h"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>

#include "baselines.h"
#include "bench_config.h"
#include "bench_initiator.h"
#include "kvxfer/ucx_tls.h"
#include "machine.h"
#include "report.h"
#include "target_process.h"

namespace kvxfer::tools {
namespace {

// The machine's CPU gaps: how long to read the clock, the shortest gap.
constexpr auto kCpuGapsSpin = std::chrono::milliseconds(500);
constexpr auto kCpuGapsThreshold = std::chrono::microseconds(10);

CaseSpec resolve(const BenchArgs& args, const std::string& name, bool quarter) {
  const auto& cases = reference_cases();
  const auto it =
      std::find_if(cases.begin(), cases.end(), [&](const CaseSpec& c) { return c.name == name; });
  if (it == cases.end()) {
    throw std::invalid_argument("unknown case '" + name +
                                "' (cases: big, layer, small, runs, reg)");
  }
  CaseSpec spec = *it;
  if (quarter) spec.total /= 4;
  if (args.block_len) spec.block_len = *args.block_len;
  if (!spec.is_reg()) {
    if (args.batch) spec.batch = *args.batch;
    if (args.depth) spec.depth = *args.depth;
    if (args.pattern) spec.pattern = Pattern::parse(*args.pattern);
    if (args.total) spec.total = *args.total;
  }
  return spec;
}

// The header's account of the lanes.
std::string lanes_text(const BenchArgs& args, const std::vector<std::string>& lanes) {
  if (lanes.size() == 2) {
    return fmt::format(
        "lanes tcp and ucx, side by side (each case with {}=tcp, then with "
        "{}=ucx, {}=on and 1M tcp segments, on both sides)",
        kLanesKey, kLanesKey, kRmaKey);
  }
  if (!lanes.front().empty()) {
    return fmt::format(
        "lane {} ({}={}{} on both sides{})", lanes.front(), kLanesKey, lanes.front(),
        lanes.front() == "ucx" ? fmt::format(", {}=on and 1M tcp segments", kRmaKey) : "",
        args.peer.empty() ? ""
                          : fmt::format("; the remote target must run --lane {}", lanes.front()));
  }
  if (const char* env = std::getenv(kLanesKey); env != nullptr) {
    return fmt::format("lanes as the environment's {}={}", kLanesKey, env);
  }
  if (const auto it = args.engine.find(kLanesKey); it != args.engine.end()) {
    return fmt::format("lanes as --engine {}={}", kLanesKey, it->second);
  }
  return fmt::format("lane: the library's choice ({} unset)", kLanesKey);
}

// What one target serves: a lane, with the tcp lane's encryption on or off.
struct Leg {
  std::string lane;
  bool encrypt = false;
};

std::vector<Leg> bench_legs(const std::vector<std::string>& lanes, const std::string& encrypt) {
  std::vector<Leg> legs;
  for (const std::string& lane : lanes) {
    if (encrypt != "on") legs.push_back({lane, false});
    if (encrypt != "off") legs.push_back({lane, true});
  }
  return legs;
}

// Throws std::invalid_argument for options that do not go together.
void check_args(const BenchArgs& args, const std::string& ucx_tls) {
  const bool tcp_only = kvxfer::ucx_tls_is_tcp_only(ucx_tls);
  if (args.op != "write" && args.op != "read") {
    throw std::invalid_argument(fmt::format("--op {}: use write or read", args.op));
  }
  if (args.encrypt != "off" && args.encrypt != "on" && args.encrypt != "both") {
    throw std::invalid_argument(fmt::format("--encrypt {}: use off, on or both", args.encrypt));
  }
  if (args.encrypt == "both" && !args.peer.empty()) {
    throw std::invalid_argument(
        "--encrypt both spawns a target per setting: not with --peer (run once with --encrypt off "
        "and once with --encrypt on, the remote target started with the same "
        "KVXFER_TCP_ENCRYPT)");
  }
  if (args.lane.empty()) return;
  if (args.lane != "tcp" && args.lane != "ucx" && args.lane != "both") {
    throw std::invalid_argument(fmt::format("--lane {}: use tcp, ucx or both", args.lane));
  }
  if (!tcp_only) {
    throw std::invalid_argument(
        fmt::format("--lane {} is for TCP runs (UCX_TLS={} is not TCP only): use --tls tcp",
                    args.lane, ucx_tls.empty() ? "(UCX default)" : ucx_tls));
  }
  if (args.engine.contains(kLanesKey) || args.target_engine.contains(kLanesKey)) {
    throw std::invalid_argument(fmt::format(
        "--lane sets {} on both sides: leave it out of --engine and --target-engine", kLanesKey));
  }
  if (args.lane == "both" && !args.peer.empty()) {
    throw std::invalid_argument(
        "--lane both spawns a target per lane: not with --peer (run once with --lane tcp and "
        "once with --lane ucx, the remote target started with the same --lane)");
  }
}

}  // namespace

std::vector<std::string> bench_lanes(const BenchArgs& args) {
  if (args.lane == "both") return {"tcp", "ucx"};
  if (!args.lane.empty()) return {args.lane};
  // Not given: a TCP run names the tcp lane, unless --engine or
  // --target-engine already set KVXFER_LANES themselves.
  const bool configured = args.engine.contains(kLanesKey) || args.target_engine.contains(kLanesKey);
  if (kvxfer::ucx_tls_is_tcp_only(ucx_tls_for(args.tls)) && !configured) return {"tcp"};
  return {""};
}

Options bench_transport_options(const BenchArgs& args, const std::string& lane) {
  Options options = bench_options(args.tls);
  add_lane_config(options.engine_config, lane);
  for (const auto& [key, value] : args.engine) options.engine_config[key] = value;
  options.progress_thread = args.progress_thread;
  options.num_threads = args.num_threads;
  return options;
}

void poll_idle(const std::string& mode, int sleep_us) {
  if (mode == "yield") {
    ::sched_yield();
  } else if (mode == "sleep") {
    ::usleep(static_cast<useconds_t>(sleep_us));
  }
}

int run_bench(const BenchArgs& args) {
  BenchReport report;
  report.args = args;
  if (report.args.seed == 0) report.args.seed = std::random_device{}() | 1;
  report.ucx_tls = ucx_tls_for(args.tls);
  report.fingerprint = config_fingerprint(bench_config_fields(args.tls));
  const bool tcp_only = kvxfer::ucx_tls_is_tcp_only(report.ucx_tls);
  // TCP-only runs move a quarter of the reference total by default.
  const bool quarter = tcp_only && !args.total;
  std::vector<CaseSpec> specs;
  for (const auto& name : args.cases) specs.push_back(resolve(args, name, quarter));
  if (specs.empty()) throw std::invalid_argument("--cases selects no case");

  check_args(args, report.ucx_tls);
  report.lanes = bench_lanes(args);
  if (!report.lanes.front().empty()) {
    // The environment wins over engine_config: ours would override the
    // lane asked for, here and in every target spawned.
    if (const char* env = std::getenv(kLanesKey); env != nullptr) {
      if (!args.quiet) {
        fmt::print(stderr, "kvxfer bench: {}={} in the environment is ignored: --lane sets it\n",
                   kLanesKey, env);
      }
      ::unsetenv(kLanesKey);
    }
  }

  // One target per lane: a target runs only the lanes its KVXFER_LANES
  // names (the UCX lane only with an RDMA device or KVXFER_RMA=on). The
  // first now, the others when their lane's first case runs: a fresh target
  // gives up on a first command that takes over 10 s to come.
  // With --encrypt both, one per lane and setting, each lane off then on.
  const std::vector<Leg> legs = bench_legs(report.lanes, args.encrypt);
  std::vector<std::unique_ptr<TargetProcess>> targets(legs.size());
  const auto spawn_target = [&](std::size_t i) {
    std::map<std::string, std::string> engine = args.target_engine;
    add_lane_config(engine, legs[i].lane);
    if (args.encrypt != "off") engine[kEncryptKey] = legs[i].encrypt ? "on" : "off";
    targets[i] = TargetProcess::spawn(target_command(args.tls, args.region, engine));
  };
  if (args.peer.empty()) {
    spawn_target(0);
    report.target = targets.size() > 1 ? "spawned on this machine, one per lane and encryption"
                                       : "spawned on this machine";
  } else {
    targets.clear();
    targets.push_back(TargetProcess::connect(HostPort::parse(args.peer)));
    report.target = args.peer;
  }
  report.target_version = targets.front()->version();
  report.cpus = machine_info().cpus;
  if (!args.quiet) {
    fmt::print(
        stderr,
        "kvxfer bench: {}s, the ucx lane's UCX_TLS={}, {}, {} MiB regions, target {} (kvxfer "
        "{}){}; the table names the lane each case's bytes went over\n",
        args.op, report.ucx_tls.empty() ? "(UCX default)" : report.ucx_tls,
        lanes_text(args, report.lanes), args.region >> 20, report.target, report.target_version,
        quarter ? ", TCP only: a quarter of each reference total" : "");
  }

  // What the machine takes from a running thread, for reading the call
  // percentiles below: half a second, with the target idle.
  report.cpu_gaps = measure_cpu_gaps(kCpuGapsSpin, kCpuGapsThreshold);

  BenchInitiator initiator(report.args, report.fingerprint);
  std::vector<bool> lost(targets.size(), false);
  for (const CaseSpec& spec : specs) {
    for (std::size_t i = 0; i < legs.size(); ++i) {
      const std::string& lane = legs[i].lane;
      if (!args.quiet) {
        if (legs.size() > 1) {
          fmt::print(stderr, "  running {} on the {} lane{} ...\n", spec.name, lane,
                     legs[i].encrypt ? ", encrypted" : "");
        } else {
          fmt::print(stderr, "  running {} ...\n", spec.name);
        }
      }
      try {
        if (targets[i] == nullptr) spawn_target(i);
        report.cases.push_back(initiator.run(spec, lane, legs[i].encrypt, *targets[i]));
      } catch (const std::exception& e) {
        // The target is gone: no later case can run either.
        CaseResult gone;
        gone.spec = spec;
        gone.lane = lane;
        gone.encrypted = legs[i].encrypt;
        gone.error = std::string("lost the target: ") + e.what();
        report.cases.push_back(std::move(gone));
        lost[i] = true;
        break;
      }
    }
    if (std::find(lost.begin(), lost.end(), true) != lost.end()) break;
  }
  report.pool_huge_bytes = initiator.source().huge_bytes();
  report.warmed_targets = initiator.warmed_targets();
  report.warm_bytes = initiator.warm_bytes();
  report.warm_kind = initiator.warm_kind();
  report.warm_gbps = initiator.warm_gbps();
  if (tcp_only && !lost.front()) {
    run_tcp_baselines(args, *targets.front(), initiator.stream_host(), initiator.source(), report);
  }
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] == nullptr) continue;
    const int target_status = targets[i]->quit();
    if (target_status != 0 && !args.quiet) {
      fmt::print(stderr, "kvxfer bench: the target{} exited with status {}\n",
                 targets.size() > 1 ? fmt::format(" of the {} lane{}", legs[i].lane,
                                                  legs[i].encrypt ? ", encrypted" : "")
                                    : "",
                 target_status);
    }
  }

  print_table(report, stdout);
  if (!args.json_path.empty()) write_json(report, args.json_path);
  if (!args.metrics_path.empty()) write_metrics(initiator.metrics(), args.metrics_path);
  if (!args.plot_path.empty()) {
    if (const std::string error = write_plot(report, args.plot_path); !error.empty()) {
      fmt::print(stderr, "kvxfer bench: no plot: {}\n", error);
      return 1;
    }
  }
  return report.all_verified() ? 0 : 1;
}

}  // namespace kvxfer::tools
