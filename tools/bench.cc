// SPDX-License-Identifier: Apache-2.0
#include "bench.h"

#include <fmt/format.h>
#include <malloc.h>
#include <sched.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "bench_config.h"
#include "iperf.h"
#include "kvxfer/metrics.h"
#include "kvxfer/transport.h"
#include "kvxfer/ucx_tls.h"
#include "machine.h"
#include "pattern.h"
#include "pool.h"
#include "report.h"
#include "target_process.h"

namespace kvxfer::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kPeer = "target";
// A case with no completion for this long has stalled: the bench reports it
// instead of hanging.
constexpr auto kStallTimeout = std::chrono::seconds(60);
// Bytes checked per case at most (2 MiB blocks: 128 of them).
constexpr std::uint64_t kMaxVerifyBytes = 256ull << 20;
// The machine's CPU gaps: how long to read the clock, the shortest gap.
constexpr auto kCpuGapsSpin = std::chrono::milliseconds(500);
constexpr auto kCpuGapsThreshold = std::chrono::microseconds(10);

double load_average() {
  double one = 0;
  std::ifstream("/proc/loadavg") >> one;
  return one;
}

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// In-use malloc heap, for the memory figures of the reg case. UCX's own
// mmap'd pools are outside it, so these are the C++ side's growth plus
// whatever UCX takes from malloc.
std::int64_t heap_in_use() {
  const struct mallinfo2 m = ::mallinfo2();
  return static_cast<std::int64_t>(m.uordblks + m.hblkhd);
}

// A progress line on stderr, when it is a terminal and not --quiet.
class ProgressLine {
 public:
  ProgressLine(bool enabled, std::string label)
      : enabled_(enabled && ::isatty(STDERR_FILENO) != 0), label_(std::move(label)) {}
  ~ProgressLine() { clear(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  void update(double fraction, double gbps, Clock::time_point now) {
    if (!enabled_ || now - last_ < std::chrono::milliseconds(250)) return;
    last_ = now;
    std::fprintf(stderr, "\r\033[K  %-6s %3.0f%%  %6.2f GB/s", label_.c_str(), fraction * 100,
                 gbps);
    std::fflush(stderr);
    shown_ = true;
  }
  void clear() {
    if (!shown_) return;
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
    shown_ = false;
  }

 private:
  bool enabled_;
  std::string label_;
  Clock::time_point last_{};
  bool shown_ = false;
};

// Per-case seed, so a block left over from an earlier case never passes
// for a block of this one.
std::uint64_t case_seed(std::uint64_t base, const std::string& name) {
  return mix64(base ^ std::hash<std::string>{}(name));
}

// Fills blocks [0, count) of the initiator's pool with the case's pattern.
void fill(Pool& pool, std::uint64_t block_len, std::uint64_t count, std::uint64_t seed) {
  for (std::uint64_t i = 0; i < count; ++i) {
    fill_block(pool.data() + i * block_len, block_len, seed, i);
  }
}

// Polls until `ids` are all reported (done or failed); false on a failure,
// a fault or a stall.
bool wait_all(Transport& transport, std::vector<TransferId> ids, std::string* error) {
  auto last = Clock::now();
  while (!ids.empty()) {
    const PollResult r = transport.poll(kPeer);
    if (r.peer_fault) {
      *error = "peer faulted: " + *r.peer_fault;
      return false;
    }
    if (!r.failed.empty()) {
      *error = fmt::format("{} transfers failed", r.failed.size());
      return false;
    }
    for (const TransferId id : r.done) std::erase(ids, id);
    if (!r.done.empty()) last = Clock::now();
    if (Clock::now() - last > kStallTimeout) {
      *error = fmt::format("stalled: {} transfers made no progress for {} s", ids.size(),
                           kStallTimeout.count());
      return false;
    }
  }
  return true;
}

// Transfers each lane counted, from the engine's counters: what carried
// them, whatever KVXFER_LANES said.
std::map<std::string, std::uint64_t> lane_transfers(
    const std::map<std::string, std::uint64_t>& counters) {
  const auto get = [&](const char* key) -> std::uint64_t {
    const auto it = counters.find(key);
    return it != counters.end() ? it->second : 0;
  };
  return {{"tcp", get("tcp_writes") + get("tcp_reads")},
          {"ucx", get("ucx_writes") + get("ucx_reads")},
          {"cma", get("cma_writes") + get("cma_reads")}};
}

class Bench {
 public:
  Bench(const BenchArgs& args, std::string fingerprint)
      : args_(args), fingerprint_(std::move(fingerprint)) {}

  // Runs one case against `target`, with KVXFER_LANES=lane on this side
  // ("" leaves it to the configuration); the target must run the same.
  CaseResult run(const CaseSpec& spec, const std::string& lane, TargetProcess& target) {
    target_ = &target;
    lane_ = lane;
    CaseResult result;
    result.spec = spec;
    result.lane = lane;
    result.loadavg = load_average();
    const CpuSample cpu_before = sample_cpu(target.pid());
    struct Meter {
      CaseResult& r;
      const CpuSample& before;
      pid_t target;
      ~Meter() { r.others_cores = others_cores(before, sample_cpu(target)); }
    } meter{result, cpu_before, target.pid()};
    try {
      if (spec.block_len == 0 || spec.block_len > args_.region) {
        throw std::invalid_argument(fmt::format("block length {} must be in [1, --region {}]",
                                                spec.block_len, args_.region));
      }
      result.num_blocks = args_.region / spec.block_len;
      warm_pools(spec);
      if (spec.is_reg()) {
        run_reg(result);
      } else {
        run_throughput(result);
      }
    } catch (const TargetRefused& e) {
      result.error = e.what();
    } catch (const ChannelError&) {
      throw;  // the target is gone: no later case can run either
    } catch (const std::exception& e) {
      result.error = e.what();
      if (!lane.empty() && !args_.peer.empty() &&
          result.error.find("no lane") != std::string::npos) {
        result.error += fmt::format(" (start the target with --role target --lane {})", lane);
      }
    }
    return result;
  }

  // The initiator's metrics of every case that ran transfers, taken at its end.
  [[nodiscard]] const std::vector<Metrics>& metrics() const { return metrics_; }

 private:
  Options transport_options(std::uint64_t transfers = 0) const {
    Options options = bench_transport_options(args_, lane_);
    if (args_.telemetry) {
      options.telemetry = true;
      options.telemetry_capacity = std::clamp<std::uint64_t>(transfers, 1, kMaxTelemetryCapacity);
    }
    return options;
  }

  // The transport's own account of a case (its metrics, and its telemetry
  // with --telemetry) must agree with what poll() told us: `done` and
  // `failed` transfers of `bytes_each`.
  void check_counts(CaseResult& result, Transport& transport, std::uint64_t done,
                    std::uint64_t failed, std::uint64_t bytes_each) {
    if (!result.error.empty()) return;  // transfers may still be in flight
    const auto op = static_cast<std::size_t>(reading() ? TransferOp::kRead : TransferOp::kWrite);
    const OpCounters c = transport.metrics().ops[op];
    if (c.transfers_done != done || c.transfers_failed != failed ||
        c.bytes_done != done * bytes_each) {
      result.error = fmt::format(
          "the transport's metrics count {} done ({} bytes) and {} failed; poll() reported {} "
          "done ({} bytes) and {} failed",
          c.transfers_done, c.bytes_done, c.transfers_failed, done, done * bytes_each, failed);
      return;
    }
    // Same-host copies move each byte once: a chunk copied twice (or lost)
    // would show as the lane's bytes differing from the transfers'.
    const auto counters = transport.stats().engine_counters;
    const auto copied = counters.find("cma_bytes");
    const auto cma_ops = counters.find(reading() ? "cma_reads" : "cma_writes");
    if (failed == 0 && copied != counters.end() && cma_ops != counters.end() &&
        cma_ops->second == done && copied->second != done * bytes_each) {
      result.error =
          fmt::format("the same-host lane copied {} bytes for {} transfers of {} bytes each",
                      copied->second, done, bytes_each);
      return;
    }
    if (!args_.telemetry) return;
    const Telemetry t = transport.telemetry();
    std::uint64_t done_records = 0;
    std::uint64_t failed_records = 0;
    std::uint64_t other = 0;
    for (const TransferRecord& r : t.records) {
      const bool ours = r.peer == kPeer && static_cast<std::size_t>(r.op) == op &&
                        r.bytes == bytes_each && r.completed >= r.posted;
      if (ours && r.result == TransferResult::kDone) {
        ++done_records;
      } else if (ours && r.result == TransferResult::kFailed) {
        ++failed_records;
      } else {
        ++other;
      }
    }
    result.telemetry_records = t.records.size();
    if (t.dropped != 0 || done_records != done || failed_records != failed || other != 0) {
      result.error = fmt::format(
          "telemetry holds {} done and {} failed records ({} others, {} dropped); poll() "
          "reported {} done and {} failed",
          done_records, failed_records, other, t.dropped, done, failed);
    }
  }

  // Before a target's first case (unless --no-warm-pass), one untimed pass
  // of our whole pool into the target's, so that every page of both has
  // been sent once the way the case sends: a plain TCP stream for TCP runs,
  // process_vm_writev into a spawned target on this host otherwise. On some
  // VMs a first pass over pages never sent (or received) runs several times
  // slower: 0.1-0.5 GB/s against 2-3 GB/s on loopback; 0.85 GB/s against
  // 8-11 GB/s through process_vm_writev, whose first pin of a page costs
  // about 1 us, even for pages the CPU wrote just before. A case would
  // otherwise time that for the first lane and case to meet a pool, and not
  // for the others. Before this case's fill(), so the target's pool holds no
  // block of this case's pattern.
  void warm_pools(const CaseSpec& spec) {
    if (!args_.warm_pass) return;
    const bool tcp = kvxfer::ucx_tls_is_tcp_only(ucx_tls_for(args_.tls));
    if (!tcp && target_->pid() == 0) return;  // a same-host pass needs the target's pid
    if (std::find(warmed_.begin(), warmed_.end(), target_) != warmed_.end()) return;
    const TargetGeometry& g = target_->open(spec.block_len, args_.region, fingerprint_);
    const auto started = std::chrono::steady_clock::now();
    if (tcp) {
      target_->raw_stream(stream_host(), source().data(), source().size(), source().size());
    } else {
      write_into(target_->pid(), g.base, std::min(source().size(), g.num_blocks * g.block_len));
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    target_->close_region();
    warmed_.push_back(target_);
    warm_kind_ = tcp ? "a plain TCP stream" : "process_vm_writev";
    if (warm_gbps_ == 0 && seconds > 0) {
      warm_gbps_ = static_cast<double>(source().size()) / seconds / 1e9;
    }
  }

  // process_vm_writev of the start of our pool into process `pid` at `base`,
  // 1 MiB per call. Throws when the kernel refuses (the same-host lane
  // would be refused too).
  void write_into(pid_t pid, std::uintptr_t base, std::uint64_t len) {
    constexpr std::uint64_t kStep = std::uint64_t{1} << 20;
    for (std::uint64_t off = 0; off < len;) {
      const std::uint64_t n = std::min(kStep, len - off);
      iovec local{source().data() + off, n};
      iovec remote{reinterpret_cast<void*>(base + off), n};
      const ssize_t done = ::process_vm_writev(pid, &local, 1, &remote, 1, 0);
      if (done <= 0) {
        throw std::runtime_error(fmt::format(
            "warm-up: process_vm_writev into the target (pid {}) failed: {} (--no-warm-pass "
            "skips it)",
            pid, done < 0 ? std::strerror(errno) : "no byte written"));
      }
      off += static_cast<std::uint64_t>(done);
    }
  }

  // Which lane carried the case's `posted` transfers, from the initiator's
  // counters (taken before close). With a lane asked for, a transfer any
  // other lane carried, or fewer than `posted` on the lane asked for, fails
  // the case: its figures would be another lane's.
  void check_lane(CaseResult& result, Transport& transport, std::uint64_t posted) {
    result.lane_transfers = lane_transfers(transport.stats().engine_counters);
    std::vector<std::string> used;
    for (const auto& [name, count] : result.lane_transfers) {
      if (count > 0) used.push_back(name);
    }
    result.lane_seen = used.empty() ? "" : used.size() == 1 ? used.front() : "mixed";
    if (result.lane.empty()) return;
    const std::uint64_t on_lane = result.lane_transfers[result.lane];
    const bool others =
        std::any_of(result.lane_transfers.begin(), result.lane_transfers.end(),
                    [&](const auto& kv) { return kv.first != result.lane && kv.second > 0; });
    // Equal counts only when every transfer was posted and reported.
    const bool short_of = result.error.empty() ? on_lane != posted : on_lane == 0 && posted > 0;
    if (!others && !short_of) return;
    const std::string why = fmt::format(
        "LANE MISMATCH: asked for the {} lane (KVXFER_LANES={} on both sides), but the "
        "initiator's counters show {} transfers on the tcp lane, {} on the ucx lane and {} on the "
        "cma lane, of {} posted",
        result.lane, result.lane, result.lane_transfers["tcp"], result.lane_transfers["ucx"],
        result.lane_transfers["cma"], posted);
    result.error = result.error.empty() ? why : why + "; and: " + result.error;
  }

  [[nodiscard]] bool reading() const { return args_.op == "read"; }

  // With --lane both, a case runs twice: its agents (the metrics' labels)
  // are told apart by lane.
  [[nodiscard]] std::string agent_suffix() const {
    return args_.lane == "both" && !lane_.empty() ? "-" + lane_ : "";
  }

  Pool& source() {
    if (!source_) source_ = std::make_unique<Pool>(args_.region);
    return *source_;
  }
  Pool& memcpy_target() {
    if (!memcpy_target_) memcpy_target_ = std::make_unique<Pool>(args_.region);
    return *memcpy_target_;
  }

  // Opens the target's region and registers both sides; times both.
  std::unique_ptr<Transport> connect(CaseResult& result, std::uint64_t transfers = 0) {
    const CaseSpec& spec = result.spec;
    const TargetGeometry& g = target_->open(spec.block_len, args_.region, fingerprint_);
    const auto t0 = Clock::now();
    auto transport = std::make_unique<Transport>(
        fmt::format("bench-initiator-{}-{}{}", ::getpid(), spec.name, agent_suffix()),
        Region{source().data(), result.num_blocks, spec.block_len}, transport_options(transfers));
    const auto t1 = Clock::now();
    transport->add_remote_peer(kPeer, g.metadata, g.base, g.num_blocks, g.block_len);
    const auto t2 = Clock::now();
    result.local_registration_ms = micros(t1 - t0) / 1000;
    result.peer_registration_us = micros(t2 - t1);
    return transport;
  }

  // Checks each (r, l) of `to_verify`: block r of the pool written (the
  // target's after writes, ours after reads) must hold the pattern of
  // block l.
  void finish(CaseResult& result, Transport& transport,
              const std::vector<std::pair<std::int64_t, std::int64_t>>& to_verify,
              std::uint64_t seed, bool after_reads) {
    // Taken while the peer is still registered, so its figures are in it.
    metrics_.push_back(transport.metrics());
    // Closing joins the engine's threads: every byte they copied into our
    // pool is ordered before the checks below.
    transport.close();
    result.handles_released = transport.stats().live == HandleCounts{};
    if (!result.handles_released && result.error.empty()) {
      result.error = "live handles left after close()";
    }
    std::uint64_t good = 0;
    std::uint64_t bad = 0;
    if (after_reads) {
      const std::uint64_t len = result.spec.block_len;
      for (const auto& [r, l] : to_verify) {
        const bool ok = block_matches(source().data() + static_cast<std::uint64_t>(r) * len, len,
                                      seed, static_cast<std::uint64_t>(l));
        ++(ok ? good : bad);
      }
    } else {
      std::tie(good, bad) = target_->verify(seed, to_verify);
    }
    target_->close_region();
    result.verify_sampled = to_verify.size();
    result.verify_good = good;
    result.verify_bad = bad;
    result.verified = result.error.empty() && result.failed_transfers == 0 && bad == 0 &&
                      good == to_verify.size() && good > 0;
    if (result.error.empty() && !result.verified) {
      result.error =
          good == 0 && bad == 0
              ? fmt::format("no {} block could be verified", after_reads ? "read" : "written")
              : fmt::format("{} of {} blocks checked hold wrong bytes", bad, good + bad);
    }
  }

  // --pool shared, writes (unless --no-warm-pass): `count` untimed writes
  // of spec.batch blocks each that cover every block of our pool, block i
  // into the target's block i, so that the initiator's new mapping of the
  // target's pool (add_remote_peer made it) has had every page written once
  // before the clock starts. On a VM whose hypervisor sets up each page's
  // translation on its first use through a mapping (this one), a first
  // write costs 4-13 us a page: 1-3.5 s for 1 GiB, once per peer. The timed
  // part then measures the steady state; the pass's GB/s is reported.
  void warm_mapping(CaseResult& result, Transport& transport, std::uint64_t count) {
    const CaseSpec& spec = result.spec;
    const std::uint64_t n = result.num_blocks;
    std::vector<std::int64_t> blocks(spec.batch);
    std::vector<TransferId> ids;
    const auto start = Clock::now();
    for (std::uint64_t w = 0; w < count;) {
      ids.clear();
      for (; w < count && ids.size() < static_cast<std::size_t>(spec.depth); ++w) {
        for (std::uint64_t k = 0; k < spec.batch; ++k) {
          blocks[k] = static_cast<std::int64_t>((w * spec.batch + k) % n);
        }
        const auto id = transport.write_blocks(kPeer, blocks, blocks);
        if (!id) throw std::runtime_error("mapping warm-up: write_blocks failed to post");
        ids.push_back(*id);
      }
      std::string error;
      if (!wait_all(transport, ids, &error)) throw std::runtime_error("mapping warm-up: " + error);
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    result.mapping_warm_gbps =
        static_cast<double>(count * spec.batch * spec.block_len) / seconds / 1e9;
  }

  void run_throughput(CaseResult& result) {
    const CaseSpec& spec = result.spec;
    if (spec.batch == 0) throw std::invalid_argument("--batch must be >= 1");
    if (spec.depth < 1) throw std::invalid_argument("--depth must be >= 1");
    const std::uint64_t write_bytes = spec.batch * spec.block_len;
    const std::uint64_t writes =
        std::max<std::uint64_t>(1, (spec.total + write_bytes - 1) / write_bytes);
    const std::uint64_t seed = case_seed(seed_base(), spec.name);
    const Schedule schedule(spec.pattern, result.num_blocks, spec.batch, writes, seed + 1);
    // Reads bring the target's blocks into ours: ours start with another
    // pattern, so a block no read reached never passes for one it did.
    // Before a mapping's warm pass, too: what it writes must never pass for
    // a timed write's bytes.
    const bool warm_map = !reading() && shared_pools_requested() && args_.warm_pass &&
                          !kvxfer::ucx_tls_is_tcp_only(ucx_tls_for(args_.tls)) &&
                          spec.batch <= result.num_blocks;
    const std::uint64_t warm_writes =
        warm_map ? (result.num_blocks + spec.batch - 1) / spec.batch : 0;
    fill(source(), spec.block_len, result.num_blocks, reading() || warm_map ? ~seed : seed);
    auto transport = connect(result, warm_writes + writes +
                                         static_cast<std::uint64_t>(spec.depth));  // + warm-ups
    if (reading()) target_->fill(seed);
    if (warm_map) {
      warm_mapping(result, *transport, warm_writes);
      fill(source(), spec.block_len, result.num_blocks, seed);
    }
    // Transfer w: a WRITE of our schedule.local(w) into the target's
    // schedule.remote(w), or a READ the other way round, so that the blocks
    // written are schedule.remote(w) either way (one pool's blocks, never
    // named twice in a transfer) and hold the pattern of schedule.local(w).
    const auto post = [&](std::uint64_t w) {
      return reading() ? transport->read_blocks(kPeer, schedule.remote(w), schedule.local(w))
                       : transport->write_blocks(kPeer, schedule.local(w), schedule.remote(w));
    };
    const char* const call = reading() ? "read_blocks" : "write_blocks";
    // memcpy runs before and after the WRITEs, and the faster counts: the
    // limit is what the machine can do, and a neighbour's load on a shared
    // machine only ever slows one of them down. After connect(): a freshly
    // spawned target gives up on a first command that takes over 10 s, and
    // both baselines over 8 GiB (big) can take that on a loaded machine.
    result.memcpy_runs_gbps.push_back(memcpy_baseline(schedule, spec.block_len));
    result.memcpy_all_runs_gbps.push_back(
        memcpy_baseline_all(schedule, spec.block_len, result.num_blocks));
    const auto depth = static_cast<std::uint64_t>(spec.depth);

    // Warm-up, untimed: the first writes of the schedule, all landed before
    // the clock starts (so they never race with a timed write).
    {
      std::vector<TransferId> ids;
      for (std::uint64_t w = 0; w < std::min(depth, writes); ++w) {
        const auto id = post(w);
        if (!id) throw std::runtime_error(fmt::format("warm-up {} failed to post", call));
        ids.push_back(*id);
      }
      std::string error;
      if (!wait_all(*transport, ids, &error)) throw std::runtime_error("warm-up: " + error);
    }

    // Positions on one event clock: a post, and the poll that saw a write
    // complete. landed_blocks() reads which blocks raced from them.
    constexpr std::uint64_t kNotDone = std::numeric_limits<std::uint64_t>::max();
    std::vector<std::uint64_t> posted(writes, 0);
    std::vector<std::uint64_t> completed(writes, kNotDone);
    std::vector<double> call_us(writes, 0);
    struct Slot {
      TransferId id;
      std::uint64_t write;
    };
    std::vector<Slot> inflight;
    inflight.reserve(depth);
    const auto take = [&inflight](TransferId id) {
      for (auto& s : inflight) {
        if (s.id == id) {
          const std::uint64_t w = s.write;
          s = inflight.back();
          inflight.pop_back();
          return w;
        }
      }
      throw std::logic_error(fmt::format("poll reported transfer {} that is not ours", id));
    };

    LatencyHistogram poll_us;
    ProgressLine progress(!args_.quiet, spec.name);
    std::uint64_t clock = 0;
    std::uint64_t next = 0;
    std::uint64_t done = 0;
    std::uint64_t idle_polls = 0;
    const pid_t target_pid = target_->pid();
    const double target_cpu_before = target_pid > 0 ? threads_cpu_s(target_pid) : 0;
    const auto start = Clock::now();
    auto last_completion = start;
    while (done < writes) {
      while (next < writes && inflight.size() < depth) {
        const auto t0 = Clock::now();
        const auto id = post(next);
        const auto t1 = Clock::now();
        if (!id) {
          result.error = fmt::format("{} of transfer {} failed to post", call, next);
          break;
        }
        call_us[next] = micros(t1 - t0);
        posted[next] = ++clock;
        inflight.push_back({*id, next});
        ++next;
      }
      if (!result.error.empty()) break;
      const auto p0 = Clock::now();
      const PollResult r = transport->poll(kPeer);
      poll_us.add(micros(Clock::now() - p0));
      ++result.polls;
      if (!r.done.empty() || !r.failed.empty()) {
        ++clock;
        for (const TransferId id : r.done) completed[take(id)] = clock;
        for (const TransferId id : r.failed) completed[take(id)] = clock;
        result.failed_transfers += r.failed.size();
        done += r.done.size() + r.failed.size();
        last_completion = Clock::now();
        const double elapsed = std::chrono::duration<double>(last_completion - start).count();
        progress.update(static_cast<double>(done) / static_cast<double>(writes),
                        static_cast<double>(done * write_bytes) / elapsed / 1e9, last_completion);
        idle_polls = 0;
      } else {
        if (++idle_polls % 4096 == 0 && Clock::now() - last_completion > kStallTimeout) {
          result.error =
              fmt::format("stalled: no transfer completed for {} s", kStallTimeout.count());
          break;
        }
        idle_wait();
      }
      if (r.peer_fault) {
        result.error = "peer faulted: " + *r.peer_fault;
        break;
      }
    }
    const auto end = Clock::now();
    const double target_cpu_after = target_pid > 0 ? threads_cpu_s(target_pid) : 0;
    progress.clear();

    result.writes = done;
    result.blocks = done * spec.batch;
    result.bytes = done * write_bytes;
    result.seconds = std::chrono::duration<double>(end - start).count();
    result.measured_gbps = static_cast<double>(result.bytes) / result.seconds / 1e9;
    if (target_pid > 0 && result.bytes > 0) {
      result.target_cpu_s_per_gb =
          (target_cpu_after - target_cpu_before) / (static_cast<double>(result.bytes) / 1e9);
    }
    call_us.resize(next);
    result.write_call = Timing::of(std::move(call_us));
    result.poll_call = poll_us.timing();

    // Warm-up transfers all ended done (else it threw).
    check_counts(result, *transport,
                 warm_writes + std::min(depth, writes) + done - result.failed_transfers,
                 result.failed_transfers, write_bytes);
    check_lane(result, *transport, warm_writes + std::min(depth, writes) + next);

    const Landed landed =
        landed_blocks(schedule, result.num_blocks, std::span(posted).first(next), completed);
    result.verify_raced = landed.raced;
    const std::uint64_t max_verify =
        std::min(args_.verify_blocks, std::max<std::uint64_t>(1, kMaxVerifyBytes / spec.block_len));
    if (landed.known.empty() && landed.raced > 0 && result.error.empty()) {
      result.error = fmt::format(
          "every written block was also hit by another write in flight with it, so its bytes "
          "depend on landing order: nothing can be verified (batch {} x depth {} covers the {} "
          "blocks of the region; use a larger --region or a smaller --depth)",
          spec.batch, spec.depth, result.num_blocks);
    }
    finish(result, *transport, sample(landed.known, max_verify, seed + 2), seed, reading());
    transport.reset();

    if (result.verified) {
      result.gbps = result.measured_gbps;
      result.blocks_per_s = static_cast<double>(result.blocks) / result.seconds;
    }
    result.memcpy_runs_gbps.push_back(memcpy_baseline(schedule, spec.block_len));
    result.memcpy_gbps =
        *std::max_element(result.memcpy_runs_gbps.begin(), result.memcpy_runs_gbps.end());
    result.memcpy_all_runs_gbps.push_back(
        memcpy_baseline_all(schedule, spec.block_len, result.num_blocks));
    result.memcpy_all_gbps =
        *std::max_element(result.memcpy_all_runs_gbps.begin(), result.memcpy_all_runs_gbps.end());
    result.memcpy_all_threads = memcpy_threads();
    if (args_.perftest) {
      // ucx_perftest knows no lanes: one run serves every lane's pass of
      // the case.
      const std::string key = fmt::format("{}/{}", spec.name, spec.block_len);
      if (const auto it = perftest_runs_.find(key); it != perftest_runs_.end()) {
        result.perftest = it->second;
      } else {
        PerftestRequest request;
        request.message_len = spec.block_len;
        request.bytes = std::min<std::uint64_t>(spec.total, 512ull << 20);
        request.ucx_tls = ucx_tls_for(args_.tls);
        request.timeout = std::chrono::seconds(args_.perftest_timeout_s);
        result.perftest = run_perftest(request);
        perftest_runs_.emplace(key, result.perftest);
      }
    } else {
      result.perftest.error = "skipped (--no-perftest)";
    }
  }

  // The same pattern, copied by one thread between two regions of this
  // process: on one machine, the physical limit of a shared-memory WRITE.
  double memcpy_baseline(const Schedule& schedule, std::uint64_t block_len) {
    std::uint8_t* dst = memcpy_target().data();
    const std::uint8_t* src = source().data();
    const auto start = Clock::now();
    for (std::uint64_t w = 0; w < schedule.writes(); ++w) {
      const auto local = schedule.local(w);
      const auto remote = schedule.remote(w);
      for (std::size_t i = 0; i < local.size(); ++i) {
        std::memcpy(dst + static_cast<std::uint64_t>(remote[i]) * block_len,
                    src + static_cast<std::uint64_t>(local[i]) * block_len, block_len);
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return static_cast<double>(schedule.writes() * schedule.batch() * block_len) / seconds / 1e9;
  }

  static unsigned memcpy_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

  // The same copies, one thread per core, all started together: the
  // all-cores limit a multi-threaded copier could reach. Thread t copies the
  // blocks whose destination lies in its t-th slice of the region, so no two
  // threads ever write the same bytes (a schedule may write a block twice).
  double memcpy_baseline_all(const Schedule& schedule, std::uint64_t block_len,
                             std::uint64_t num_blocks) {
    std::uint8_t* dst = memcpy_target().data();
    const std::uint8_t* src = source().data();
    const unsigned n = memcpy_threads();
    const std::uint64_t slice = (num_blocks + n - 1) / n;
    std::atomic<unsigned> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    threads.reserve(n);
    for (unsigned t = 0; t < n; ++t) {
      threads.emplace_back([&, t] {
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        for (std::uint64_t w = 0; w < schedule.writes(); ++w) {
          const auto local = schedule.local(w);
          const auto remote = schedule.remote(w);
          for (std::size_t i = 0; i < local.size(); ++i) {
            if (static_cast<std::uint64_t>(remote[i]) / slice != t) continue;
            std::memcpy(dst + static_cast<std::uint64_t>(remote[i]) * block_len,
                        src + static_cast<std::uint64_t>(local[i]) * block_len, block_len);
          }
        }
      });
    }
    while (ready.load() < n) std::this_thread::yield();
    const auto start = Clock::now();
    go.store(true, std::memory_order_release);
    for (auto& t : threads) t.join();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return static_cast<double>(schedule.writes() * schedule.batch() * block_len) / seconds / 1e9;
  }

  // reg: how long until a peer of region / block_len blocks (262,144 for the
  // reference) is usable: add_remote_peer, then one write landed.
  void run_reg(CaseResult& result) {
    const CaseSpec& spec = result.spec;
    const std::uint64_t n = result.num_blocks;
    const auto reps = static_cast<std::uint64_t>(std::max(1, args_.reg_reps));
    // Blocks: reps single writes, then the in-flight memory probes (64 writes
    // of 1 block, 64 of 16), each to remote blocks of its own.
    const std::uint64_t probe_writes = std::min<std::uint64_t>(64, n / 32);
    const std::uint64_t needed = reps + probe_writes * 17;
    if (needed > n) {
      throw std::invalid_argument(fmt::format("reg needs {} blocks of {} bytes, --region holds {}",
                                              needed, spec.block_len, n));
    }
    const std::uint64_t seed = case_seed(seed_base(), spec.name);
    fill(source(), spec.block_len, needed, seed);

    // The remote blocks, taken from the far end of the region.
    std::uint64_t used = 0;
    auto next_pair = [&]() {
      const auto local = static_cast<std::int64_t>(used);
      const auto remote = static_cast<std::int64_t>(n - 1 - used);
      ++used;
      return std::pair<std::int64_t, std::int64_t>{local, remote};
    };
    std::vector<std::pair<std::int64_t, std::int64_t>> written;  // (remote, local)
    std::uint64_t posted = 0;  // transfers posted (each one or 16 blocks)

    const TargetGeometry& g = target_->open(spec.block_len, args_.region, fingerprint_);
    const auto t_local = Clock::now();
    auto transport = std::make_unique<Transport>(
        fmt::format("bench-initiator-{}-reg{}", ::getpid(), agent_suffix()),
        Region{source().data(), n, spec.block_len}, transport_options());
    result.local_registration_ms = micros(Clock::now() - t_local) / 1000;

    std::vector<double> add_us;
    std::vector<double> usable_us;
    std::vector<std::int64_t> heap_growth;
    for (std::uint64_t i = 0; i < reps && result.error.empty(); ++i) {
      if (i > 0) transport->remove_remote_peer(kPeer);
      const std::int64_t heap0 = heap_in_use();
      const auto t0 = Clock::now();
      transport->add_remote_peer(kPeer, g.metadata, g.base, g.num_blocks, g.block_len);
      const auto t1 = Clock::now();
      heap_growth.push_back(heap_in_use() - heap0);
      const auto t2 = Clock::now();
      const auto [local, remote] = next_pair();
      const std::int64_t l[] = {local};
      const std::int64_t r[] = {remote};
      const auto id = transport->write_blocks(kPeer, l, r);
      if (!id) {
        result.error = "write_blocks to a fresh peer failed to post";
        break;
      }
      ++posted;
      if (!wait_all(*transport, {*id}, &result.error)) break;
      const auto t3 = Clock::now();
      written.emplace_back(remote, local);
      add_us.push_back(micros(t1 - t0));
      usable_us.push_back(micros(t1 - t0) + micros(t3 - t2));
    }
    if (!usable_us.empty()) result.usable_first_us = usable_us.front();
    result.add_peer = Timing::of(add_us);
    result.usable = Timing::of(usable_us);
    if (!heap_growth.empty()) {
      std::sort(heap_growth.begin(), heap_growth.end());
      result.add_peer_heap_bytes = heap_growth[heap_growth.size() / 2];
    }
    result.writes = written.size();
    result.blocks = written.size();
    result.bytes = written.size() * spec.block_len;

    // What holding writes in flight costs: the heap growth of posting
    // `probe_writes` writes before polling any.
    auto probe = [&](std::uint64_t blocks_per_write) -> std::optional<double> {
      if (!result.error.empty() || probe_writes == 0) return std::nullopt;
      std::vector<std::vector<std::int64_t>> locals(probe_writes);
      std::vector<std::vector<std::int64_t>> remotes(probe_writes);
      for (std::uint64_t w = 0; w < probe_writes; ++w) {
        for (std::uint64_t b = 0; b < blocks_per_write; ++b) {
          const auto [local, remote] = next_pair();
          locals[w].push_back(local);
          remotes[w].push_back(remote);
          written.emplace_back(remote, local);
        }
      }
      std::vector<TransferId> ids;
      const std::int64_t heap0 = heap_in_use();
      for (std::uint64_t w = 0; w < probe_writes; ++w) {
        const auto id = transport->write_blocks(kPeer, locals[w], remotes[w]);
        if (!id) {
          result.error = "write_blocks failed to post during the memory probe";
          break;
        }
        ++posted;
        ids.push_back(*id);
      }
      const std::int64_t heap1 = heap_in_use();
      if (!wait_all(*transport, ids, &result.error) || !result.error.empty()) return std::nullopt;
      return static_cast<double>(heap1 - heap0) / static_cast<double>(probe_writes);
    };
    result.inflight_bytes_1 = probe(1);
    result.inflight_bytes_16 = probe(16);

    // Every write posted went to a remote block of its own, once.
    check_lane(result, *transport, posted);
    // The reg case writes, whatever --op says: it times registration.
    finish(result, *transport, written, seed, /*after_reads=*/false);
  }

  std::uint64_t seed_base() const { return args_.seed; }

 public:
  // The targets warm_pools() streamed into, and the bytes each took.
  [[nodiscard]] std::size_t warmed_targets() const { return warmed_.size(); }
  [[nodiscard]] std::uint64_t warm_bytes() { return warmed_.empty() ? 0 : source().size(); }
  // How the pass went ("a plain TCP stream", "process_vm_writev"), and the
  // first pass's GB/s: what a first copy into fresh pages costs here.
  [[nodiscard]] const std::string& warm_kind() const { return warm_kind_; }
  [[nodiscard]] double warm_gbps() const { return warm_gbps_; }

  // Where a plain TCP stream reaches the target: loopback for a spawned one.
  [[nodiscard]] std::string stream_host() const {
    return args_.peer.empty() ? "127.0.0.1" : HostPort::parse(args_.peer).host;
  }

  // Bytes of the source pool on transparent huge pages (Pool::huge_bytes).
  [[nodiscard]] std::uint64_t source_huge_bytes() { return source().huge_bytes(); }

  // The raw TCP baseline, from this side's pool into `target`'s: GB/s of
  // one plain stream. First one untimed stream of the whole pool, so that
  // the timed one sends (and lands on) pages that were all sent before: on
  // some VMs a first pass over pages never sent runs several times slower
  // (0.3-0.5 GB/s against 2-4 GB/s on loopback), which no transfer of a
  // case meets in its timed part either. *warm_bytes: the untimed bytes.
  double raw_tcp_gbps(TargetProcess& target, const std::string& host, std::uint64_t bytes,
                      std::uint64_t* warm_bytes) {
    *warm_bytes = source().size();
    target.raw_stream(host, source().data(), source().size(), *warm_bytes);
    const double seconds = target.raw_stream(host, source().data(), source().size(), bytes);
    return static_cast<double>(bytes) / seconds / 1e9;
  }

  // The same timed stream (no warm pass: the pages were sent) with one
  // thread of this process spinning beside it, as the caller spins in
  // poll() during a case.
  double raw_tcp_beside_spinner_gbps(TargetProcess& target, const std::string& host,
                                     std::uint64_t bytes) {
    std::atomic<bool> stop{false};
    std::thread spinner([&stop] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
    double seconds = 0;
    try {
      seconds = target.raw_stream(host, source().data(), source().size(), bytes);
    } catch (...) {
      stop.store(true);
      spinner.join();
      throw;
    }
    stop.store(true);
    spinner.join();
    return static_cast<double>(bytes) / seconds / 1e9;
  }

 private:
  // After a poll that reported nothing. Spinning is what a serving loop with
  // nothing else to do does; on a machine with few cores it takes a core
  // from the engine's own threads, which yield and sleep give back.
  void idle_wait() const { poll_idle(args_.poll_wait, args_.poll_sleep_us); }

  const BenchArgs& args_;
  const std::string fingerprint_;
  TargetProcess* target_ = nullptr;  // of the case running
  std::string lane_;                 // of the case running
  // ucx_perftest per case (name/block_len), run once for every lane.
  std::map<std::string, PerftestResult> perftest_runs_;
  std::vector<const TargetProcess*> warmed_;  // by warm_pools()
  std::string warm_kind_;
  double warm_gbps_ = 0;
  std::unique_ptr<Pool> source_;
  std::unique_ptr<Pool> memcpy_target_;
  std::vector<Metrics> metrics_;
};

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

}  // namespace

std::optional<double> ratio_of(const std::optional<double>& gbps,
                               const std::optional<double>& baseline) {
  if (!gbps || !baseline || *baseline <= 0) return std::nullopt;
  return *gbps / *baseline;
}

std::optional<bool> BenchReport::raw_tcp_agrees() const {
  if (!raw_tcp_gbps || !iperf3.gbps || *iperf3.gbps <= 0) return std::nullopt;
  return std::abs(*raw_tcp_gbps - *iperf3.gbps) <= kRawTcpAgreement * *iperf3.gbps;
}

std::optional<double> BenchReport::vs_iperf3(const CaseResult& c) const {
  return ratio_of(c.gbps, iperf3.gbps);
}

std::optional<double> BenchReport::tcp_vs_ucx(const CaseResult& c) const {
  if (c.lane != "tcp" && c.lane != "ucx") return std::nullopt;
  const auto find = [&](const char* lane) -> const CaseResult* {
    for (const CaseResult& o : cases) {
      if (o.lane == lane && o.spec.name == c.spec.name) return &o;
    }
    return nullptr;
  };
  const CaseResult* tcp = find("tcp");
  const CaseResult* ucx = find("ucx");
  if (tcp == nullptr || ucx == nullptr) return std::nullopt;
  return ratio_of(tcp->gbps, ucx->gbps);
}

std::optional<double> CaseResult::memcpy_all_ratio() const {
  if (!gbps || !memcpy_all_gbps || *memcpy_all_gbps <= 0) return std::nullopt;
  return *gbps / *memcpy_all_gbps;
}

std::optional<double> CaseResult::memcpy_ratio() const {
  if (!gbps || !memcpy_gbps || *memcpy_gbps <= 0) return std::nullopt;
  return *gbps / *memcpy_gbps;
}

std::optional<double> CaseResult::perftest_ratio() const {
  if (!gbps || !perftest.gbps || *perftest.gbps <= 0) return std::nullopt;
  return *gbps / *perftest.gbps;
}

bool BenchReport::all_verified() const {
  return !cases.empty() &&
         std::all_of(cases.begin(), cases.end(), [](const CaseResult& c) { return c.verified; });
}

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
  Options options;
  options.config_fields = bench_config_fields(args.tls);
  options.engine_config = engine_config_for(args.tls);
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

// The Prometheus text of every case's initiator transport (one `agent`
// label per case).
void write_metrics(const std::vector<Metrics>& metrics, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << prometheus_text(metrics);
  out.flush();
  if (!out) throw std::runtime_error(fmt::format("cannot write the metrics to {}", path));
}

namespace {

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

}  // namespace

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

  if (args.op != "write" && args.op != "read") {
    throw std::invalid_argument(fmt::format("--op {}: use write or read", args.op));
  }
  if (!args.lane.empty()) {
    if (args.lane != "tcp" && args.lane != "ucx" && args.lane != "both") {
      throw std::invalid_argument(fmt::format("--lane {}: use tcp, ucx or both", args.lane));
    }
    if (!tcp_only) {
      throw std::invalid_argument(
          fmt::format("--lane {} is for TCP runs (UCX_TLS={} is not TCP only): use --tls tcp",
                      args.lane, report.ucx_tls.empty() ? "(UCX default)" : report.ucx_tls));
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
  std::vector<std::unique_ptr<TargetProcess>> targets(report.lanes.size());
  const auto spawn_target = [&](std::size_t i) {
    std::map<std::string, std::string> engine = args.target_engine;
    add_lane_config(engine, report.lanes[i]);
    targets[i] = TargetProcess::spawn(target_command(args.tls, args.region, engine));
  };
  if (args.peer.empty()) {
    spawn_target(0);
    report.target =
        targets.size() > 1 ? "spawned on this machine, one per lane" : "spawned on this machine";
  } else {
    targets.clear();
    targets.push_back(TargetProcess::connect(HostPort::parse(args.peer)));
    report.target = args.peer;
  }
  report.target_version = targets.front()->version();
  report.cpus = machine_info().cpus;
  if (!args.quiet) {
    fmt::print(
        stderr, "kvxfer bench: {}s, UCX_TLS={}, {}, {} MiB regions, target {} (kvxfer {}){}\n",
        args.op, report.ucx_tls.empty() ? "(UCX default)" : report.ucx_tls,
        lanes_text(args, report.lanes), args.region >> 20, report.target, report.target_version,
        quarter ? ", TCP only: a quarter of each reference total" : "");
  }

  // What the machine takes from a running thread, for reading the call
  // percentiles below: half a second, with the target idle.
  report.cpu_gaps = measure_cpu_gaps(kCpuGapsSpin, kCpuGapsThreshold);

  Bench bench(report.args, report.fingerprint);
  std::vector<bool> lost(targets.size(), false);
  for (const CaseSpec& spec : specs) {
    for (std::size_t i = 0; i < report.lanes.size(); ++i) {
      const std::string& lane = report.lanes[i];
      if (!args.quiet) {
        if (report.lanes.size() > 1) {
          fmt::print(stderr, "  running {} on the {} lane ...\n", spec.name, lane);
        } else {
          fmt::print(stderr, "  running {} ...\n", spec.name);
        }
      }
      try {
        if (targets[i] == nullptr) spawn_target(i);
        report.cases.push_back(bench.run(spec, lane, *targets[i]));
      } catch (const std::exception& e) {
        // The target is gone: no later case can run either.
        CaseResult gone;
        gone.spec = spec;
        gone.lane = lane;
        gone.error = std::string("lost the target: ") + e.what();
        report.cases.push_back(std::move(gone));
        lost[i] = true;
        break;
      }
    }
    if (std::find(lost.begin(), lost.end(), true) != lost.end()) break;
  }
  report.pool_huge_bytes = bench.source_huge_bytes();
  report.warmed_targets = bench.warmed_targets();
  report.warm_bytes = bench.warm_bytes();
  report.warm_kind = bench.warm_kind();
  report.warm_gbps = bench.warm_gbps();
  if (tcp_only && !lost.front()) {
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
    if (args.raw_tcp) {
      if (!args.quiet) fmt::print(stderr, "  running the raw TCP stream baseline ...\n");
      try {
        report.raw_tcp_gbps = bench.raw_tcp_gbps(*targets.front(), bench.stream_host(),
                                                 args.raw_tcp_bytes, &report.raw_tcp_warm_bytes);
        report.raw_tcp_bytes = args.raw_tcp_bytes;
        report.raw_tcp_spinner_gbps = bench.raw_tcp_beside_spinner_gbps(
            *targets.front(), bench.stream_host(), args.raw_tcp_bytes);
      } catch (const std::exception& e) {
        report.raw_tcp_error = e.what();
      }
    }
  }
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] == nullptr) continue;
    const int target_status = targets[i]->quit();
    if (target_status != 0 && !args.quiet) {
      fmt::print(stderr, "kvxfer bench: the target{} exited with status {}\n",
                 targets.size() > 1 ? fmt::format(" of the {} lane", report.lanes[i]) : "",
                 target_status);
    }
  }

  print_table(report, stdout);
  if (!args.json_path.empty()) write_json(report, args.json_path);
  if (!args.metrics_path.empty()) write_metrics(bench.metrics(), args.metrics_path);
  if (!args.plot_path.empty()) {
    if (const std::string error = write_plot(report, args.plot_path); !error.empty()) {
      fmt::print(stderr, "kvxfer bench: no plot: {}\n", error);
      return 1;
    }
  }
  return report.all_verified() ? 0 : 1;
}

}  // namespace kvxfer::tools
