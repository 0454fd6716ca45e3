// SPDX-License-Identifier: Apache-2.0
// `kvxfer bench --targets N,..` (fan-out: one initiator writing round-robin
// to N target processes, scoped polls) and `--initiators N,..` (incast: N
// initiator processes writing disjoint ranges of one target), issue 11.
// Every run is verified byte for byte on the targets. Built on the bench's
// target processes (target_process.h); the initiators of an incast run are
// this executable's hidden `initiator` subcommand.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bench.h"

namespace kvxfer::tools {

// Which blocks write w moves, for a writer that owns remote blocks
// [first, first + count) of a target: the owned blocks, shuffled once, are
// written `batch` at a time in order and over again; local blocks likewise
// from a shuffled local pool. Writes w and w' touch the same remote blocks
// only when w = w' mod (count / batch); transfers complete in any order, so
// the writer posts w only once w - cycle() has ended, and then the last write
// of every block is known.
class Spread {
 public:
  Spread(std::uint64_t first, std::uint64_t count, std::uint64_t local_blocks, std::uint64_t batch,
         std::uint64_t seed);
  [[nodiscard]] std::uint64_t batch() const { return batch_; }
  // Writes that cycle through every owned block once.
  [[nodiscard]] std::uint64_t cycle() const { return count_ / batch_; }
  void write(std::uint64_t w, std::span<std::int64_t> local, std::span<std::int64_t> remote) const;
  // (remote, local) of up to `max` owned blocks after `writes` writes, from
  // the blocks' last writes.
  [[nodiscard]] std::vector<std::pair<std::int64_t, std::int64_t>> landed(std::uint64_t writes,
                                                                          std::uint64_t max) const;

 private:
  std::uint64_t first_;
  std::uint64_t count_;  // a multiple of batch_
  std::uint64_t batch_;
  std::vector<std::int64_t> remote_perm_;
  std::vector<std::int64_t> local_perm_;
};

// What one writer's loop measured.
struct DriveResult {
  std::uint64_t bytes = 0;
  std::uint64_t failed = 0;
  std::int64_t start_ns = 0;  // CLOCK_MONOTONIC, comparable across processes
  std::int64_t end_ns = 0;
  Timing write_call;
  Timing poll_call;
  std::string error;
  [[nodiscard]] double seconds() const { return static_cast<double>(end_ns - start_ns) / 1e9; }
};

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

// Runs the experiments args.targets / args.initiators ask for, prints the
// table (and the JSON with --json). 0 when every run verified.
int run_fan(const BenchArgs& args);

// The hidden `kvxfer initiator` subcommand: one incast writer, driven over
// stdin/stdout by run_fan.
int run_initiator();

}  // namespace kvxfer::tools
