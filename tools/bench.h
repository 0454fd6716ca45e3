// SPDX-License-Identifier: Apache-2.0
// `kvxfer bench`: the reference workloads (docs/workloads.md)
// against a target process, beside the memcpy limit and ucx_perftest,
// measured in one run. bench.cc runs it: it checks the options, owns the
// targets (one per lane) and the environment's KVXFER_LANES, and hands each
// case to BenchInitiator (bench_initiator.h), the TCP baselines to
// baselines.h and the finished report to report.h.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "iperf.h"
#include "kvxfer/transport.h"
#include "machine.h"
#include "perftest.h"
#include "timing.h"
#include "workload.h"

namespace kvxfer::tools {

struct BenchArgs {
  std::vector<std::string> cases = {"big", "layer", "small", "runs", "reg"};
  std::string tls = "sm";  // sm | tcp | a UCX_TLS string
  // --lane: which kvxfer lane carries the transfers of a TCP run. "tcp"
  // (kvxfer's own TCP lane, KVXFER_LANES=tcp), "ucx" (the UCX lane's puts
  // and gets over UCX's tcp transport: KVXFER_LANES=ucx and KVXFER_RMA=on
  // with UCX_TLS=tcp), "both" (every
  // case on the tcp lane, then on the ucx lane, side by side), or "" (not
  // given: "tcp" when --tls is TCP-only, else the library's own choice).
  // Set on both sides (engine_config, add_lane_config) and checked after each
  // case against the initiator's lane counters.
  std::string lane;
  // --encrypt: the tcp lane's KVXFER_TCP_ENCRYPT, set on both sides: "off"
  // (the default: left as the configuration says), "on", or "both" (every
  // case with encryption off, then on, a target each, side by side).
  std::string encrypt = "off";
  // "write" (write_blocks into the target, verified there) or "read"
  // (read_blocks from the target's pool, verified here).
  std::string op = "write";
  // "blocks" (write_blocks/read_blocks) or "nixl": the same transfers
  // through descriptor lists prepared once (Transport::prepare and
  // transfer, the path NIXL's agent API takes), with the same checks.
  std::string api = "blocks";
  // Overrides of every selected case's workload figures.
  std::optional<std::uint64_t> block_len;
  std::optional<std::uint64_t> batch;
  std::optional<int> depth;
  std::optional<std::string> pattern;
  std::optional<std::uint64_t> total;
  std::uint64_t region = 1ull << 30;  // per side
  std::string json_path;
  std::string metrics_path;  // the initiators' metrics, Prometheus text
  // Options::telemetry on the initiator: every transfer's record, checked
  // against what the bench saw poll() report.
  bool telemetry = false;
  std::string plot_path;
  bool quiet = false;
  std::string peer;  // HOST:PORT of a listening target; "" spawns one here
  // --ucx KEY=VALUE knobs, set as UCX_KEY=VALUE in the environment, so they
  // reach every UCX component (transport knobs like TCP_TX_SEG_SIZE are not
  // UCP context settings), the spawned target and ucx_perftest alike.
  std::map<std::string, std::string> ucx;
  // --engine KEY=VALUE: extra Options::engine_config of the initiator
  // (kvxfer's KVXFER_* engine knobs, or UCP context settings).
  std::map<std::string, std::string> engine;
  // --target-engine KEY=VALUE: the same for every target the bench spawns
  // (or, with --role target, this target).
  std::map<std::string, std::string> target_engine;
  bool progress_thread = true;  // the initiator's; a target always runs one
  int num_threads = 4;
  // What the initiator does after a poll that reported nothing: spin (poll
  // again at once), yield (sched_yield), or sleep for poll_sleep_us.
  std::string poll_wait = "spin";
  int poll_sleep_us = 0;
  bool perftest = true;
  // --tls tcp only: the raw TCP stream baseline (raw_stream.h).
  bool raw_tcp = true;
  std::uint64_t raw_tcp_bytes = 1ull << 30;
  // --tls tcp only: the iperf3 baseline (iperf.h), one loopback connection
  // for iperf3_seconds, with a spawned target.
  bool iperf3 = true;
  int iperf3_seconds = 3;
  // Before a target's first case, one untimed pass of the initiator's whole
  // pool into the target's: a plain TCP stream for --tls tcp, else
  // process_vm_writev into a spawned target (BenchInitiator::warm_pools():
  // a first pass over pages never sent runs several times slower on some
  // VMs).
  bool warm_pass = true;
  int perftest_timeout_s = 60;
  std::uint64_t verify_blocks = 4096;  // most blocks checked per case
  int reg_reps = 20;
  std::uint64_t seed = 0;  // 0: random
  // Fan-out / incast (fan.h): when either is set, the bench runs only those.
  std::vector<int> targets;
  std::vector<int> initiators;
  // --op notify: notifications per mode (notify_bench.h).
  std::uint64_t notifications = 2000;
};

// The initiator's Options for these arguments: the bench's config fields,
// --tls, --engine, --no-progress-thread, --num-threads; and for a `lane`
// ("tcp" or "ucx"; "" leaves it out) engine_config KVXFER_LANES=lane (and
// for ucx KVXFER_RMA=on).
Options bench_transport_options(const BenchArgs& args, const std::string& lane = "");

// The lanes a bench run forces, one pass of the cases each: {"tcp"},
// {"ucx"}, {"tcp", "ucx"} (--lane both), or {""} (none forced).
std::vector<std::string> bench_lanes(const BenchArgs& args);

struct CaseResult {
  CaseSpec spec;  // as run, overrides applied
  // The lane asked for (KVXFER_LANES on both sides; "" when none was) and
  // the lane the initiator's counters say carried the transfers ("tcp",
  // "ucx", "cma", "mixed", or "" when none counted any).
  std::string lane;
  std::string lane_seen;
  bool encrypted = false;  // KVXFER_TCP_ENCRYPT=on on both sides (--encrypt)
  // Transfers each lane counted: tcp_writes + tcp_reads, ucx_writes +
  // ucx_reads, cma_writes + cma_reads.
  std::map<std::string, std::uint64_t> lane_transfers;
  std::uint64_t num_blocks = 0;  // of each side's region
  std::uint64_t writes = 0;
  std::uint64_t blocks = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;
  std::optional<double> gbps;  // only for a verified run
  std::optional<double> blocks_per_s;
  double measured_gbps = 0;  // what the clock said, verified or not
  Timing write_call;         // one write_blocks call
  Timing poll_call;          // one poll call (every poll of the timed part)
  std::uint64_t polls = 0;
  std::uint64_t failed_transfers = 0;
  double local_registration_ms = 0;      // Transport construction (pool registration)
  double peer_registration_us = 0;       // add_remote_peer
  std::optional<double> memcpy_gbps;     // the faster of memcpy_runs_gbps
  std::vector<double> memcpy_runs_gbps;  // before and after the WRITEs
  // The same copies split over one thread per core (what this machine can
  // do; kvxfer's same-host lane copies with several threads too).
  std::optional<double> memcpy_all_gbps;  // the faster of memcpy_all_runs_gbps
  std::vector<double> memcpy_all_runs_gbps;
  unsigned memcpy_all_threads = 0;
  PerftestResult perftest;
  bool verified = false;
  std::uint64_t verify_sampled = 0;
  std::uint64_t verify_good = 0;
  std::uint64_t verify_bad = 0;
  std::uint64_t verify_raced = 0;       // written blocks left out: landing order unknown
  bool handles_released = false;        // live handles all zero after close()
  std::uint64_t telemetry_records = 0;  // --telemetry: records checked
  // Cores' worth of CPU other processes used while the case ran: on a
  // shared machine, how far to trust its ratios.
  double others_cores = 0;
  // CPU seconds the spawned target process spent per GB of payload in the
  // timed part (all its threads): the receiving side's cost of a write.
  std::optional<double> target_cpu_s_per_gb;
  // --pool shared, writes: GB/s of the untimed write of every block before
  // the timed part (BenchInitiator::warm_mapping()); unset when none ran.
  std::optional<double> mapping_warm_gbps;
  // Unless --no-warm-pass: the case's first pass, before the steady-state
  // part that gbps times. Every block of the initiator's pool written once
  // into the target's (or read once from it), block i into block i, in the
  // case's batch and depth, through a Transport of its own
  // (BenchInitiator::first_pass()), timed once both sides' registrations
  // have finished their pre-touch of their pools (first_pass_settle_s).
  // first_pass_gbps only when a sample of its blocks verified;
  // first_pass_fresh when no earlier transfer or warm-up of this run had
  // touched the target's pool (a target's first case), as a server's first
  // requests after start-up meet it.
  std::optional<double> first_pass_gbps;
  double first_pass_measured_gbps = 0;  // what the clock said, verified or not
  bool first_pass_fresh = false;
  // Seconds from the first pass's registrations (the target's open, ours)
  // until both pools' pre-touch had finished: the time a server's first
  // transfers must come after its start-up to meet touched pools.
  double first_pass_settle_s = 0;
  double loadavg = 0;  // 1-minute load average when the case started
  std::string error;

  // reg only.
  Timing add_peer;                          // add_remote_peer alone
  Timing usable;                            // add_remote_peer + a first one-block write done
  double usable_first_us = 0;               // the first try: nothing of the peer cached yet
  std::int64_t add_peer_heap_bytes = 0;     // malloc heap growth of one add_remote_peer
  std::optional<double> inflight_bytes_1;   // malloc heap per in-flight 1-block write
  std::optional<double> inflight_bytes_16;  // ... per in-flight 16-block write

  [[nodiscard]] std::optional<double> memcpy_ratio() const;
  [[nodiscard]] std::optional<double> memcpy_all_ratio() const;
  [[nodiscard]] std::optional<double> perftest_ratio() const;
};

// kvxfer GB/s over a baseline's GB/s, when both exist.
std::optional<double> ratio_of(const std::optional<double>& gbps,
                               const std::optional<double>& baseline);

struct BenchReport {
  BenchArgs args;
  std::string ucx_tls;
  std::string fingerprint;
  std::string target;  // where the target ran
  std::string target_version;
  unsigned cpus = 0;
  CpuGaps cpu_gaps;  // measured before the cases
  std::vector<CaseResult> cases;
  // Of the initiator's source pool, after the cases: bytes on transparent
  // huge pages (`--pool huge` asks for them).
  std::uint64_t pool_huge_bytes = 0;
  // One plain TCP stream between the same two processes, pool to pool.
  std::optional<double> raw_tcp_gbps;
  std::uint64_t raw_tcp_bytes = 0;
  std::string raw_tcp_error;
  // Bytes streamed once, untimed, before the timed stream: every page of
  // both pools sent before (a first pass over pages never sent runs several
  // times slower on some VMs).
  std::uint64_t raw_tcp_warm_bytes = 0;
  // The same timed stream again with one thread of the bench spinning
  // beside it (as the bench's caller spins in poll()): what the same two
  // copies between the same pools move when a third thread wants a core.
  // Context for the x iperf3 column, never the baseline.
  std::optional<double> raw_tcp_spinner_gbps;
  // Targets whose pool took the untimed warm-up stream before their first
  // case, and its bytes (the initiator's pool).
  std::size_t warmed_targets = 0;
  std::uint64_t warm_bytes = 0;
  std::string warm_kind;  // "a plain TCP stream" or "process_vm_writev"
  double warm_gbps = 0;   // the first pass's GB/s
  // The lanes forced, one pass of the cases each (bench_lanes()).
  std::vector<std::string> lanes;
  // One iperf3 connection on loopback, in the same run (TCP runs).
  // Neither a figure nor an error: not a TCP run.
  IperfResult iperf3;
  // The same with one thread of the bench spinning beside it (as the
  // bench's caller spins in poll()): context, never the baseline.
  IperfResult iperf3_spinner;
  // Whether the raw stream is within kRawTcpAgreement of iperf3 (both
  // figures present).
  [[nodiscard]] std::optional<bool> raw_tcp_agrees() const;
  // Case c's GB/s over iperf3's.
  [[nodiscard]] std::optional<double> vs_iperf3(const CaseResult& c) const;
  // With --lane both: case c's tcp lane GB/s over its ucx lane GB/s (the
  // same case name, the other lane's row).
  [[nodiscard]] std::optional<double> tcp_vs_ucx(const CaseResult& c) const;
  [[nodiscard]] bool all_verified() const;
  // The lanes the cases' transfers went over, from the initiator's counters
  // (lane_seen), in the order met, joined by '+': "cma", "tcp+ucx"; "" when
  // none counted a transfer.
  [[nodiscard]] std::string lanes_carried() const;
};

// How far the raw stream may be from iperf3 and still agree with it.
inline constexpr double kRawTcpAgreement = 0.10;

// Runs the bench and prints the table; 0 when every case verified.
int run_bench(const BenchArgs& args);

// What a writer does after a poll that reported nothing (--poll-wait):
// "spin" returns at once, "yield" calls sched_yield, "sleep" sleeps sleep_us.
void poll_idle(const std::string& mode, int sleep_us);

}  // namespace kvxfer::tools
