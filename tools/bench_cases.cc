// SPDX-License-Identifier: Apache-2.0
// The bench's cases, run by BenchInitiator (bench_initiator.h): the
// throughput cases (a schedule of writes or reads, timed, then verified) and
// reg (how soon a new peer is usable; what peers and writes in flight cost).
// Each touches only its CaseResult, the initiator's pools and the target.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>

#include "baselines.h"
#include "bench_config.h"
#include "bench_initiator.h"
#include "kvxfer/ucx_tls.h"
#include "machine.h"
#include "pattern.h"

namespace kvxfer::tools {
namespace {

using Clock = std::chrono::steady_clock;

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

}  // namespace

void BenchInitiator::run_throughput(CaseResult& result) {
  const CaseSpec& spec = result.spec;
  if (spec.batch == 0) throw std::invalid_argument("--batch must be >= 1");
  if (spec.depth < 1) throw std::invalid_argument("--depth must be >= 1");
  const std::uint64_t write_bytes = spec.batch * spec.block_len;
  const std::uint64_t writes =
      std::max<std::uint64_t>(1, (spec.total + write_bytes - 1) / write_bytes);
  const std::uint64_t seed = case_seed(args_.seed, spec.name);
  if (runs_first_pass(spec, result.num_blocks)) first_pass(result, seed);
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
  fill_blocks(source().data(), spec.block_len, result.num_blocks,
              reading() || warm_map ? ~seed : seed);
  auto transport =
      connect(result, warm_writes + writes + static_cast<std::uint64_t>(spec.depth));  // + warm-ups
  if (reading()) target_->fill(seed);
  if (warm_map) {
    warm_mapping(result, *transport, warm_writes);
    fill_blocks(source().data(), spec.block_len, result.num_blocks, seed);
  }
  // Transfer w: a WRITE of our schedule.local(w) into the target's
  // schedule.remote(w), or a READ the other way round, so that the blocks
  // written are schedule.remote(w) either way (one pool's blocks, never
  // named twice in a transfer) and hold the pattern of schedule.local(w).
  // With --api nixl, every block of each pool is a descriptor of a list
  // prepared once, and transfer w names the same blocks by index.
  const bool nixl = args_.api == "nixl";
  DescList ours;
  DescList theirs;
  if (nixl) {
    const std::uint64_t len = spec.block_len;
    std::vector<MemDesc> descs(result.num_blocks);
    const auto base = reinterpret_cast<std::uintptr_t>(source().data());
    for (std::uint64_t b = 0; b < descs.size(); ++b) descs[b] = {base + b * len, len};
    ours = transport->prepare(descs);
    const std::uint64_t target_base = target_->geometry().base;
    for (std::uint64_t b = 0; b < descs.size(); ++b) descs[b] = {target_base + b * len, len};
    theirs = transport->prepare(descs, kPeer);
  }
  const auto post = [&](std::uint64_t w) -> std::optional<TransferId> {
    if (nixl) {
      return reading() ? transport->transfer(TransferOp::kRead, kPeer, ours, schedule.remote(w),
                                             theirs, schedule.local(w))
                       : transport->transfer(TransferOp::kWrite, kPeer, ours, schedule.local(w),
                                             theirs, schedule.remote(w));
    }
    return reading() ? transport->read_blocks(kPeer, schedule.remote(w), schedule.local(w))
                     : transport->write_blocks(kPeer, schedule.local(w), schedule.remote(w));
  };
  const char* const call = nixl ? "transfer" : reading() ? "read_blocks" : "write_blocks";
  // memcpy runs before and after the WRITEs, and the faster counts: the
  // limit is what the machine can do, and a neighbour's load on a shared
  // machine only ever slows one of them down. After connect(): a freshly
  // spawned target gives up on a first command that takes over 10 s, and
  // both baselines over 8 GiB (big) can take that on a loaded machine.
  const auto run_memcpy = [&] {
    result.memcpy_runs_gbps.push_back(memcpy_gbps(schedule, spec.block_len, result.num_blocks,
                                                  source().data(), memcpy_target().data(), 1));
    result.memcpy_all_runs_gbps.push_back(memcpy_gbps(schedule, spec.block_len, result.num_blocks,
                                                      source().data(), memcpy_target().data(),
                                                      memcpy_threads()));
  };
  run_memcpy();
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
  run_memcpy();
  result.memcpy_gbps =
      *std::max_element(result.memcpy_runs_gbps.begin(), result.memcpy_runs_gbps.end());
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

// reg: how long until a peer of region / block_len blocks (262,144 for the
// reference) is usable: add_remote_peer, then one write landed.
void BenchInitiator::run_reg(CaseResult& result) {
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
  const std::uint64_t seed = case_seed(args_.seed, spec.name);
  fill_blocks(source().data(), spec.block_len, needed, seed);

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

}  // namespace kvxfer::tools
