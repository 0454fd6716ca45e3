// SPDX-License-Identifier: Apache-2.0
#include "bench_initiator.h"

#include <fmt/format.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <tuple>

#include "bench_config.h"
#include "kvxfer/ucx_tls.h"
#include "lane_counts.h"
#include "machine.h"
#include "pattern.h"
#include "pretouch_wait.h"

namespace kvxfer::tools {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

CaseResult BenchInitiator::run(const CaseSpec& spec, const std::string& lane, bool encrypt,
                               TargetProcess& target) {
  target_ = &target;
  lane_ = lane;
  encrypt_ = encrypt;
  CaseResult result;
  result.spec = spec;
  result.lane = lane;
  result.encrypted = encrypt;
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
      throw std::invalid_argument(
          fmt::format("block length {} must be in [1, --region {}]", spec.block_len, args_.region));
    }
    result.num_blocks = args_.region / spec.block_len;
    // A case that times its own first pass meets the target's pool as it
    // is: warming it first would hide what that pass measures.
    if (!runs_first_pass(spec, result.num_blocks)) warm_pools(spec);
    struct Touched {
      std::vector<const TargetProcess*>& touched;
      const TargetProcess* target;
      ~Touched() {
        if (std::find(touched.begin(), touched.end(), target) == touched.end()) {
          touched.push_back(target);
        }
      }
    } touched{touched_, target_};
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
    if (!lane.empty() && !args_.peer.empty() && result.error.find("no lane") != std::string::npos) {
      result.error += fmt::format(" (start the target with --role target --lane {})", lane);
    }
  }
  return result;
}

Options BenchInitiator::transport_options(std::uint64_t transfers) const {
  Options options = bench_transport_options(args_, lane_);
  if (args_.encrypt != "off") options.engine_config[kEncryptKey] = encrypt_ ? "on" : "off";
  if (args_.telemetry) {
    options.telemetry = true;
    options.telemetry_capacity = std::clamp<std::uint64_t>(transfers, 1, kMaxTelemetryCapacity);
  }
  return options;
}

// The transport's own account of a case (its metrics, and its telemetry
// with --telemetry) must agree with what poll() told us: `done` and
// `failed` transfers of `bytes_each`.
void BenchInitiator::check_counts(CaseResult& result, Transport& transport, std::uint64_t done,
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
void BenchInitiator::warm_pools(const CaseSpec& spec) {
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
void BenchInitiator::write_into(pid_t pid, std::uintptr_t base, std::uint64_t len) {
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
void BenchInitiator::check_lane(CaseResult& result, Transport& transport, std::uint64_t posted) {
  result.lane_transfers = lane_transfers(transport.stats().engine_counters);
  result.lane_seen = lane_seen(result.lane_transfers);
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

Pool& BenchInitiator::source() {
  if (!source_) source_ = std::make_unique<Pool>(args_.region);
  return *source_;
}

Pool& BenchInitiator::memcpy_target() {
  if (!memcpy_target_) memcpy_target_ = std::make_unique<Pool>(args_.region);
  return *memcpy_target_;
}

// Opens the target's region and registers both sides; times both.
std::unique_ptr<Transport> BenchInitiator::connect(CaseResult& result, std::uint64_t transfers) {
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
void BenchInitiator::finish(CaseResult& result, Transport& transport,
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
void BenchInitiator::warm_mapping(CaseResult& result, Transport& transport, std::uint64_t count) {
  result.mapping_warm_gbps = write_every_block(result.spec, result.num_blocks, transport, count);
}

// `count` writes of spec.batch blocks, our block i into the target's block
// i (i wrapping at num_blocks), spec.depth in flight; with `read`, reads of
// the target's block i into ours. Returns their GB/s. Throws when one fails.
double BenchInitiator::write_every_block(const CaseSpec& spec, std::uint64_t num_blocks,
                                         Transport& transport, std::uint64_t count, bool read) {
  std::vector<std::int64_t> blocks(spec.batch);
  std::vector<TransferId> ids;
  const auto start = Clock::now();
  for (std::uint64_t w = 0; w < count;) {
    ids.clear();
    for (; w < count && ids.size() < static_cast<std::size_t>(spec.depth); ++w) {
      for (std::uint64_t k = 0; k < spec.batch; ++k) {
        blocks[k] = static_cast<std::int64_t>((w * spec.batch + k) % num_blocks);
      }
      const auto id = read ? transport.read_blocks(kPeer, blocks, blocks)
                           : transport.write_blocks(kPeer, blocks, blocks);
      if (!id) throw std::runtime_error("a pass over every block: a transfer failed to post");
      ids.push_back(*id);
    }
    std::string error;
    if (!wait_all(transport, ids, &error)) {
      throw std::runtime_error("a pass over every block: " + error);
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return static_cast<double>(count * spec.batch * spec.block_len) / seconds / 1e9;
}

bool BenchInitiator::runs_first_pass(const CaseSpec& spec, std::uint64_t num_blocks) const {
  return args_.warm_pass && !spec.is_reg() && spec.batch >= 1 && spec.depth >= 1 &&
         spec.batch <= num_blocks;
}

// The case's first pass, timed: every block of our pool written once into
// the target's (block i into block i), or read once from it, with the
// case's batch and depth, through a Transport and peer of its own, then a
// sample of the blocks checked (on the target after writes, here after
// reads). Its own Transport because the target's check ends its region's
// writes. Before the steady-state part, which it warms the way the untimed
// warm-up did: on some VMs the kernel's first copy from or into a page
// costs 8-40 us, and that is what a server's first transfers meet. Timed
// once both sides' pre-touch of their pools has finished (the target's
// open() waits for its own): a server's first transfers come after its
// start-up, and first_pass_settle_s says how long after they must come.
// Written (or filled on the target) with ~seed, so that none of its blocks
// passes for a timed transfer's.
void BenchInitiator::first_pass(CaseResult& result, std::uint64_t seed) {
  const CaseSpec& spec = result.spec;
  const std::uint64_t n = result.num_blocks;
  const std::uint64_t transfers = (n + spec.batch - 1) / spec.batch;
  result.first_pass_fresh = std::find(warmed_.begin(), warmed_.end(), target_) == warmed_.end() &&
                            std::find(touched_.begin(), touched_.end(), target_) == touched_.end();
  // Reads: our blocks hold another pattern, so a block no read reached
  // never passes for one it did.
  fill_blocks(source().data(), spec.block_len, n, reading() ? seed : ~seed);
  CaseResult pass;
  pass.spec = spec;
  pass.num_blocks = n;
  pass.lane = result.lane;
  const auto settle_start = Clock::now();
  auto transport = connect(pass, transfers);
  static_cast<void>(wait_for_pretouch(*transport));
  result.first_pass_settle_s = micros(Clock::now() - settle_start) / 1e6;
  if (reading()) target_->fill(~seed);
  result.first_pass_measured_gbps = write_every_block(spec, n, *transport, transfers, reading());
  check_counts(pass, *transport, transfers, 0, spec.batch * spec.block_len);
  check_lane(pass, *transport, transfers);
  // Closing joins the engine's threads: every byte they copied into our
  // pool is ordered before the checks below.
  transport->close();
  // The same sample size as the case's own check, spread over the pool.
  const std::uint64_t count = std::min(
      n,
      std::min(args_.verify_blocks, std::max<std::uint64_t>(1, kMaxVerifyBytes / spec.block_len)));
  std::vector<std::pair<std::int64_t, std::int64_t>> sampled;
  sampled.reserve(count);
  for (std::uint64_t k = 0; k < count; ++k) {
    const auto i = static_cast<std::int64_t>(k * n / count);
    sampled.emplace_back(i, i);
  }
  std::uint64_t good = 0;
  std::uint64_t bad = 0;
  if (reading()) {
    for (const auto& [r, l] : sampled) {
      const bool ok =
          block_matches(source().data() + static_cast<std::uint64_t>(r) * spec.block_len,
                        spec.block_len, ~seed, static_cast<std::uint64_t>(l));
      ++(ok ? good : bad);
    }
  } else {
    std::tie(good, bad) = target_->verify(~seed, sampled);
  }
  target_->close_region();
  if (!pass.error.empty()) throw std::runtime_error("first pass: " + pass.error);
  if (bad != 0 || good != sampled.size() || good == 0) {
    throw std::runtime_error(fmt::format("first pass: {} of {} blocks checked hold wrong bytes",
                                         sampled.size() - good, sampled.size()));
  }
  result.first_pass_gbps = result.first_pass_measured_gbps;
}

bool BenchInitiator::wait_all(Transport& transport, std::vector<TransferId> ids,
                              std::string* error) {
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

std::string BenchInitiator::stream_host() const {
  return args_.peer.empty() ? "127.0.0.1" : HostPort::parse(args_.peer).host;
}

}  // namespace kvxfer::tools
