// SPDX-License-Identifier: Apache-2.0
// `kvxfer bench --targets N,..` (fan-out: one initiator writing round-robin
// to N target processes, scoped polls) and `--initiators N,..` (incast: N
// initiator processes writing disjoint ranges of one target), issue 11.
// Every run is verified byte for byte on the targets. fan.cc runs both
// experiments and reports them, with fan-out's writer in this process;
// incast.cc runs the incast writers, this executable's hidden `initiator`
// subcommand; fan_writer.h is the writer both use. Built on the bench's
// target processes (target_process.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench.h"
#include "fan_writer.h"
#include "target_process.h"

namespace kvxfer::tools {

struct FanRow {
  std::string experiment;  // "fan-out" | "incast"
  int n = 0;
  double gbps = 0;                // aggregate
  std::optional<double> ratio;    // to n = 1
  std::vector<double> each_gbps;  // per target (fan-out) or per initiator (incast)
  double slowest_share = 0;       // slowest / mean of each_gbps
  Timing write_call;              // fan-out: the initiator's; incast: the worst initiator's p99
  Timing poll_call;
  std::uint64_t verified_blocks = 0;
  bool verified = false;
  std::string error;
  // TCP runs: N raw streams measured the same way, right after the row
  // (fan-out: N iperf3 pairs at once, N streams to N processes; incast:
  // one iperf3 client with N streams into one server), and their ratio to
  // N = 1: the machine's own limit beside kvxfer's.
  std::optional<double> raw_gbps;
  std::optional<double> raw_ratio;
  std::string raw_error;
};

// Each target's region (and the initiators' pools) at most this: eight
// targets of 1 GiB would be slow to touch and crowd a small machine.
inline constexpr std::uint64_t kMaxFanRegion = 256ull << 20;
// Blocks checked per target (fan-out) or per initiator (incast).
inline constexpr std::uint64_t kVerifyBlocks = 512;

// What every run of one `kvxfer bench --targets/--initiators` shares.
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

// The row of one run of `experiment` with N = n: what `run` fills in, or the
// error it threw. A ChannelError (a target lost) goes on up.
FanRow fan_row(const char* experiment, int n, const std::function<void(FanRow&)>& run);

// Counts one writer's checked blocks into `row`: true when all `checked` of
// them hold their bytes, else false with `whose` named in the row's error
// (when it has none yet).
bool tally_verified(FanRow& row, const std::string& whose, std::size_t checked, std::uint64_t good,
                    std::uint64_t bad);

// The slowest of `each` over their mean (1.00: an even share).
double share_of_slowest(const std::vector<double>& each);

// incast.cc: one incast run, n initiator processes writing into `target`.
FanRow run_incast(const FanParams& p, int n, TargetProcess& target);

// table (and the JSON with --json). 0 when every run verified.
int run_fan(const BenchArgs& args);

// The hidden `kvxfer initiator` subcommand: one incast writer, driven over
// stdin/stdout by run_fan.
int run_initiator();

}  // namespace kvxfer::tools
