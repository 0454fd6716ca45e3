// SPDX-License-Identifier: Apache-2.0
// The initiator's side of `kvxfer bench`: its pools, and one case at a time
// against a target process. bench_initiator.cc holds what surrounds a case
// (connecting, the warm passes and the timed first pass, the checks and the
// verification);
// bench_cases.cc the cases themselves (throughput, reg). Reads BenchArgs,
// writes CaseResults; the report and its baselines are the caller's.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench.h"
#include "kvxfer/metrics.h"
#include "kvxfer/transport.h"
#include "perftest.h"
#include "pool.h"
#include "target_process.h"

namespace kvxfer::tools {

class BenchInitiator {
 public:
  BenchInitiator(const BenchArgs& args, std::string fingerprint)
      : args_(args), fingerprint_(std::move(fingerprint)) {}

  // Runs one case against `target`, with KVXFER_LANES=lane on this side
  // ("" leaves it to the configuration); the target must run the same.
  // Throws ChannelError when the target is gone (no later case can run
  // either); any other failure is the case's error.
  CaseResult run(const CaseSpec& spec, const std::string& lane, bool encrypt,
                 TargetProcess& target);

  // The initiator's metrics of every case that ran transfers, taken at its end.
  [[nodiscard]] const std::vector<Metrics>& metrics() const { return metrics_; }
  // The targets warm_pools() streamed into, and the bytes each took.
  [[nodiscard]] std::size_t warmed_targets() const { return warmed_.size(); }
  [[nodiscard]] std::uint64_t warm_bytes() { return warmed_.empty() ? 0 : source().size(); }
  // How the pass went ("a plain TCP stream", "process_vm_writev"), and the
  // first pass's GB/s: what a first copy into fresh pages costs here.
  [[nodiscard]] const std::string& warm_kind() const { return warm_kind_; }
  [[nodiscard]] double warm_gbps() const { return warm_gbps_; }
  // Where a plain TCP stream reaches the target: loopback for a spawned one.
  [[nodiscard]] std::string stream_host() const;
  // The pool every case writes from (reads into), made at its first use.
  Pool& source();

 private:
  // The peer name of the target in every case's Transport.
  static constexpr const char* kPeer = "target";
  // A case with no completion for this long has stalled: the bench reports
  // it instead of hanging.
  static constexpr auto kStallTimeout = std::chrono::seconds(60);
  // Bytes checked per case (and per first pass) at most: 128 blocks of 2 MiB.
  static constexpr std::uint64_t kMaxVerifyBytes = 256ull << 20;

  // bench_cases.cc: the cases.
  void run_throughput(CaseResult& result);
  void run_reg(CaseResult& result);

  // bench_initiator.cc: what surrounds a case.
  [[nodiscard]] Options transport_options(std::uint64_t transfers = 0) const;
  std::unique_ptr<Transport> connect(CaseResult& result, std::uint64_t transfers = 0);
  void warm_pools(const CaseSpec& spec);
  [[nodiscard]] bool runs_first_pass(const CaseSpec& spec, std::uint64_t num_blocks) const;
  void first_pass(CaseResult& result, std::uint64_t seed);
  double write_every_block(const CaseSpec& spec, std::uint64_t num_blocks, Transport& transport,
                           std::uint64_t count, bool read = false);
  void write_into(pid_t pid, std::uintptr_t base, std::uint64_t len);
  void warm_mapping(CaseResult& result, Transport& transport, std::uint64_t count);
  void check_counts(CaseResult& result, Transport& transport, std::uint64_t done,
                    std::uint64_t failed, std::uint64_t bytes_each);
  void check_lane(CaseResult& result, Transport& transport, std::uint64_t posted);
  void finish(CaseResult& result, Transport& transport,
              const std::vector<std::pair<std::int64_t, std::int64_t>>& to_verify,
              std::uint64_t seed, bool after_reads);
  // Polls until `ids` are all reported (done or failed); false, with
  // *error said, on a failure, a fault or a stall.
  static bool wait_all(Transport& transport, std::vector<TransferId> ids, std::string* error);

  [[nodiscard]] bool reading() const { return args_.op == "read"; }
  // With --lane both, a case runs twice: its agents (the metrics' labels)
  // are told apart by lane.
  [[nodiscard]] std::string agent_suffix() const {
    return std::string(args_.lane == "both" && !lane_.empty() ? "-" + lane_ : "") +
           (args_.encrypt == "both" && encrypt_ ? "-tls" : "");
  }
  Pool& memcpy_target();
  // After a poll that reported nothing. Spinning is what a serving loop with
  // nothing else to do does; on a machine with few cores it takes a core
  // from the engine's own threads, which yield and sleep give back.
  void idle_wait() const { poll_idle(args_.poll_wait, args_.poll_sleep_us); }

  const BenchArgs& args_;
  const std::string fingerprint_;
  TargetProcess* target_ = nullptr;  // of the case running
  std::string lane_;                 // of the case running
  bool encrypt_ = false;             // of the case running (--encrypt)
  // ucx_perftest per case (name/block_len), run once for every lane.
  std::map<std::string, PerftestResult> perftest_runs_;
  std::vector<const TargetProcess*> warmed_;   // by warm_pools()
  std::vector<const TargetProcess*> touched_;  // by a case's transfers
  std::string warm_kind_;
  double warm_gbps_ = 0;
  std::unique_ptr<Pool> source_;
  std::unique_ptr<Pool> memcpy_target_;
  std::vector<Metrics> metrics_;
};

}  // namespace kvxfer::tools
