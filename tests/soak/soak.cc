// SPDX-License-Identifier: Apache-2.0
// kvxfer_soak: random writes, cancels (both modes), polls, peer removals and
// re-additions against three kvxfer_it_target processes, one of which is
// killed (or restarted) at random, and one of the two TCP ones frozen
// (SIGSTOP) every 2-5 s until stall_timeout faults it, for a given time. Every block of
// every transfer reported done is checked on its target, and every block
// whose last write was checked is checked again (an audit) every second and
// at the end. It touches only the public API and the integration tests'
// target (tests/integration/it_support.h).
//
//   kvxfer_soak [--seconds S] [--seed N] [--rss-bound-mib M]
//
// Exit status 0 only when no block was corrupt, blocks were verified, every
// handle was given back after close() and RSS grew less than the bound
// between the end of the warm-up and the end.
//
// Why the verification is exact: a remote block is lent to one transfer at a
// time. A transfer reported done has its blocks checked before they are lent
// again, and the next write to a block always carries a local block that no
// write which might still land there carries (neither the last checked one
// nor any of a dropped transfer), so stale content cannot pass for new.
//
// A transfer that is cancelled, fails, or is dropped with its peer may still
// land while its peer's registration lives, so its blocks are not lent again
// until the peer was removed. Once remove_remote_peer() returned, nothing
// posted on the old registration may land after a write on the new one was
// reported done (docs/contract.md); so after each removal those blocks are
// lent again on the new registration ("reused"), and the audit catches old
// bytes that land after the new write was checked. A freeze (SIGSTOP of a TCP
// target with writes in flight, until stall_timeout faults it; then remove,
// SIGCONT, register again) is the way such old bytes are left in a target's
// socket buffer. When a target runs short of blocks (blocks whose content an
// audit found wrong are never lent again) it is restarted for a new, zeroed
// pool.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <future>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "it_support.h"
#include "kvxfer/transport.h"

namespace kvxfer::soak {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using it::TargetOptions;
using it::TargetProcess;

constexpr std::uint64_t kBlocks = 1024;
constexpr std::uint64_t kBlockLen = 16 * 1024;
constexpr std::uint64_t kGen = 1;
constexpr std::size_t kMaxBlocksPerWrite = 32;
constexpr std::size_t kDepthPerTarget = 12;
// While a target is frozen its writes pile up to this depth, so that its
// socket buffers fill and old bytes are left in them.
constexpr std::size_t kDepthFrozen = 256;
// Sanitizer runtimes keep freed memory in quarantine and grow shadow
// memory, so RSS says nothing about leaks there; LeakSanitizer does.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

constexpr auto kStallTimeout = std::chrono::milliseconds(2000);
// A frozen target no fault brought back is resumed after this long.
constexpr auto kMaxFreeze = std::chrono::milliseconds(15000);
// Below this many free remote blocks a target is restarted for a new pool.
constexpr std::size_t kRefreshBelow = kBlocks / 4;

std::uint64_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::uint64_t size = 0;
  std::uint64_t resident = 0;
  statm >> size >> resident;
  return resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

struct Counters {
  std::uint64_t transfers_posted = 0;
  std::uint64_t post_failures = 0;
  std::uint64_t transfers_done = 0;
  std::uint64_t transfers_failed = 0;
  std::uint64_t bytes_done = 0;
  std::uint64_t cancels_immediate = 0;
  std::uint64_t cancels_wait = 0;
  std::uint64_t cancel_wait_still = 0;
  std::uint64_t dropped_with_peer = 0;
  std::uint64_t faults = 0;
  std::uint64_t removals = 0;
  std::uint64_t async_adds = 0;
  std::uint64_t kills = 0;
  std::uint64_t restarts = 0;
  std::uint64_t polls = 0;
  std::uint64_t verified_blocks = 0;
  std::uint64_t corrupt_blocks = 0;
  std::uint64_t unverifiable_blocks = 0;  // done, but its target was killed first
  std::uint64_t protocol_errors = 0;      // a target's reply that answers no check
  std::uint64_t done_after_kill = 0;      // posted to a dead target, reported done
  std::uint64_t freezes = 0;              // SIGSTOPs of a TCP target
  std::uint64_t freeze_faults = 0;        // ... that ended in a fault (then removal)
  std::uint64_t reused_blocks = 0;        // lent again after their peer's removal
  std::uint64_t audits = 0;
  std::uint64_t audited_blocks = 0;
  std::uint64_t stale_blocks = 0;  // an audit found a checked block changed
  std::map<std::string, std::uint64_t> fault_kinds;
  std::map<std::string, std::uint64_t> verified_by_target;
};

struct Pending {
  std::size_t target;
  std::vector<std::int64_t> local;
  std::vector<std::int64_t> remote;
  bool posted_after_kill = false;  // its target was already SIGKILLed
};

struct Target {
  std::string peer_id;
  TargetOptions options;
  std::unique_ptr<TargetProcess> process;
  bool killed = false;  // SIGKILLed by us; awaiting the fault, then a restart
  Clock::time_point killed_at;
  bool registered = false;
  std::optional<std::future<void>> adding;
  std::vector<std::int64_t> free_blocks;
  // Blocks of transfers that may still land on this registration; free
  // again once the peer was removed.
  std::vector<std::int64_t> held_blocks;
  // Blocks freed by the last removal: the next writes take them first, so
  // the new registration rewrites the blocks the old one was writing.
  std::vector<std::int64_t> reuse_first;
  std::vector<std::int64_t> last_local;  // per remote block; -1: zero or unknown
  // Per remote block: whether it holds its last_local's pattern as checked
  // (what the audit checks again), and the local blocks of dropped
  // transfers that may have written it since.
  std::vector<bool> checked;
  std::vector<std::vector<std::int64_t>> maybe_local;
  std::size_t inflight = 0;
  bool frozen = false;  // SIGSTOPped by us
  Clock::time_point frozen_at;
  // Transfers reported done while the target was frozen: checked once it
  // runs again.
  std::vector<std::pair<TransferId, Pending>> deferred;
  Clock::time_point next_audit;
};

class Soak {
 public:
  Soak(std::chrono::seconds duration, std::uint64_t seed, std::uint64_t rss_bound)
      : duration_(duration), rss_bound_(rss_bound), rng_(seed), pool_(kBlocks, kBlockLen) {
    pool_.fill_generation(kGen);
    Options options;
    options.backends = {"UCX"};
    // Short enough that a frozen target is faulted within a few seconds,
    // long enough that a loaded two-core machine rarely trips it otherwise
    // (when it does, the peer is recovered like any faulted one).
    options.stall_timeout = kStallTimeout;
    // Shared memory and TCP: the same-host target gets the process_vm_writev
    // lane, the tcp-only ones (KVXFER_LANES=tcp on them, it_lanes.h) the tcp
    // lane.
    // Big socket buffers (both sides): more old bytes in them when a target
    // freezes.
    options.engine_config = {{"TLS", "sm,self,tcp"}, {"TCP_SNDBUF", "8m"}, {"TCP_RCVBUF", "8m"}};
    transport_ = std::make_unique<Transport>(
        "soak", Region{pool_.base(), pool_.num_blocks(), pool_.block_len()}, options);
    const char* tls[] = {"sm,self", "tcp", "tcp"};
    for (std::size_t i = 0; i < 3; ++i) {
      Target& t = targets_.emplace_back();
      t.peer_id = "t" + std::to_string(i);
      t.options.name = "soak-" + t.peer_id;
      t.options.num_blocks = kBlocks;
      t.options.block_len = kBlockLen;
      t.options.tls = tls[i];
      t.options.engine_config = {{"TCP_SNDBUF", "8m"}, {"TCP_RCVBUF", "8m"}};
      start(t);
      add_sync(t);
    }
  }

  int run() {
    const auto t0 = Clock::now();
    const auto end = t0 + duration_;
    const auto warm_until = t0 + std::max<Clock::duration>(5s, duration_ / 10);
    std::optional<std::uint64_t> rss_warm;
    auto next_kill = t0 + duration_ * 3 / 10;
    auto next_freeze = t0 + 4s;
    auto next_report = t0 + 30s;
    while (Clock::now() < end) {
      step();
      const auto now = Clock::now();
      if (!rss_warm && now >= warm_until) rss_warm = rss_bytes();
      if (now >= next_kill) {
        kill_one();
        next_kill = now + std::chrono::milliseconds(10000 + rng_() % 40000);
      }
      if (now >= next_freeze) {
        freeze_one();
        next_freeze = now + std::chrono::milliseconds(2000 + rng_() % 3000);
      }
      if (now >= next_report) {
        std::cout << "soak: " << std::chrono::duration_cast<std::chrono::seconds>(now - t0).count()
                  << " s, " << c_.transfers_done << " done, " << c_.verified_blocks
                  << " blocks verified, " << c_.corrupt_blocks << " corrupt (" << c_.stale_blocks
                  << " stale), " << c_.faults << " faults, " << c_.freezes << " freezes, "
                  << c_.reused_blocks << " blocks reused" << std::endl;
        next_report = now + 30s;
      }
    }
    drain();
    // Whatever a removed registration might still write has had the drain's
    // time to land: every checked block must still hold what was checked.
    std::this_thread::sleep_for(1s);
    for (Target& t : targets_) audit(t);
    const std::uint64_t rss_end = rss_bytes();
    for (const TransferId id : ids_of_all()) forget(id, /*poison=*/true);
    const auto engine_counters = transport_->stats().engine_counters;
    transport_->close();
    const HandleCounts live = transport_->stats().live;
    for (Target& t : targets_) t.process.reset();
    const std::uint64_t growth =
        rss_end > rss_warm.value_or(rss_end) ? rss_end - rss_warm.value_or(rss_end) : 0;
    const bool live_zero = live == HandleCounts{};
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();

    std::cout << "soak summary (" << static_cast<long>(secs) << " s)\n"
              << "  transfers posted    " << c_.transfers_posted << " (post failures "
              << c_.post_failures << ")\n"
              << "  transfers done      " << c_.transfers_done << "\n"
              << "  transfers failed    " << c_.transfers_failed << "\n"
              << "  bytes done          " << c_.bytes_done << " (" << c_.bytes_done / (1024 * 1024)
              << " MiB)\n"
              << "  cancels             immediate " << c_.cancels_immediate << ", wait "
              << c_.cancels_wait << " (still in flight " << c_.cancel_wait_still << ")\n"
              << "  dropped with peer   " << c_.dropped_with_peer << "\n"
              << "  polls               " << c_.polls << "\n"
              << "  peer removals       " << c_.removals << " (async re-adds " << c_.async_adds
              << ")\n"
              << "  kills               " << c_.kills << ", restarts " << c_.restarts << "\n"
              << "  freezes             " << c_.freezes << " (faulted, removed, resumed, "
              << "registered again: " << c_.freeze_faults << ")\n"
              << "  reused blocks       " << c_.reused_blocks
              << " (lent again after their peer's removal)\n"
              << "  audits              " << c_.audits << " (" << c_.audited_blocks
              << " blocks checked again)\n"
              << "  engine              ";
    for (const auto& [name, n] : engine_counters) std::cout << " " << name << "=" << n;
    std::cout << "\n"
              << "  faults seen         " << c_.faults;
    for (const auto& [kind, n] : c_.fault_kinds) std::cout << " " << kind << "=" << n;
    std::cout << "\n"
              << "  verified blocks     " << c_.verified_blocks;
    for (const auto& [peer, n] : c_.verified_by_target) std::cout << ", " << peer << " " << n;
    std::cout << "\n"
              << "  corrupt blocks      " << c_.corrupt_blocks
              << " (of them stale, found by an audit: " << c_.stale_blocks << ")\n"
              << "  unverifiable blocks " << c_.unverifiable_blocks
              << " (done, target killed before the check)\n"
              << "  protocol errors     " << c_.protocol_errors << "\n"
              << "  done after kill     " << c_.done_after_kill
              << " (posted to a killed target, reported done: must be 0)\n"
              << "  live after close    memory=" << live.memory_registrations
              << " peers=" << live.peers << " rkeys=" << live.remote_keys
              << " transfers=" << live.transfers << " requests=" << live.requests << "\n"
              << "  RSS                 " << rss_warm.value_or(0) / 1024 << " KiB after warm-up, "
              << rss_end / 1024 << " KiB at the end, growth " << growth / 1024 << " KiB (bound "
              << rss_bound_ / 1024 << " KiB)" << std::endl;

    bool ok = true;
    auto fail = [&](const std::string& why) {
      std::cout << "soak FAILED: " << why << std::endl;
      ok = false;
    };
    if (c_.corrupt_blocks != 0) fail("corrupt blocks");
    if (c_.protocol_errors != 0) fail("target replies out of step");
    if (c_.done_after_kill != 0) fail("writes to a killed target reported done");
    if (c_.verified_blocks == 0) fail("nothing verified");
    if (!live_zero) fail("handles still live after close");
    if (kSanitized) {
      std::cout << "  (RSS bound not checked under a sanitizer)" << std::endl;
    } else if (growth >= rss_bound_) {
      fail("RSS grew past the bound");
    }
    if (ok) std::cout << "soak PASSED" << std::endl;
    return ok ? 0 : 1;
  }

 private:
  void start(Target& t) {
    t.process = std::make_unique<TargetProcess>(t.options);
    t.killed = false;
    t.frozen = false;
    t.free_blocks.resize(kBlocks);
    for (std::uint64_t i = 0; i < kBlocks; ++i) t.free_blocks[i] = static_cast<std::int64_t>(i);
    t.held_blocks.clear();
    t.reuse_first.clear();
    t.last_local.assign(kBlocks, -1);
    t.checked.assign(kBlocks, false);
    t.maybe_local.assign(kBlocks, {});
    t.deferred.clear();
    t.next_audit = Clock::now() + 1s;
  }

  void add_sync(Target& t) {
    transport_->add_remote_peer(t.peer_id, t.process->metadata(), t.process->base_addr(),
                                t.process->num_blocks(), t.process->block_len());
    t.registered = true;
  }

  void add_async(Target& t) {
    t.adding =
        transport_->add_remote_peer_async(t.peer_id, t.process->metadata(), t.process->base_addr(),
                                          t.process->num_blocks(), t.process->block_len());
    ++c_.async_adds;
  }

  // Removing a peer drops its transfers. Nothing posted on the removed
  // registration may land once a write on the next one is reported done, so
  // the blocks held back for that reason are lent again from here on.
  void remove(Target& t) {
    transport_->remove_remote_peer(t.peer_id);
    t.registered = false;
    t.adding.reset();
    std::vector<TransferId> dropped;
    for (const auto& [id, p] : pending_) {
      if (&targets_[p.target] == &t) dropped.push_back(id);
    }
    for (const TransferId id : dropped) {
      ++c_.dropped_with_peer;
      forget(id, /*poison=*/true);
    }
    c_.reused_blocks += t.held_blocks.size();
    t.free_blocks.insert(t.free_blocks.end(), t.held_blocks.begin(), t.held_blocks.end());
    t.reuse_first = std::move(t.held_blocks);
    std::shuffle(t.reuse_first.begin(), t.reuse_first.end(), rng_);
    t.held_blocks.clear();
  }

  // The peer is faulted (or its process is gone): take it out and bring it
  // back, restarting the process when it was killed or runs short of blocks.
  // A frozen target resumes after the removal and before the new
  // registration: the order of the issue that made removal a fence.
  void recover(Target& t) {
    ++c_.removals;
    remove(t);
    const bool was_frozen = t.frozen;
    resume(t);
    if (t.killed || t.free_blocks.size() < kRefreshBelow) {
      check_deferred(t);
      t.process.reset();  // quit, or reap the killed one
      start(t);
      ++c_.restarts;
    }
    if (was_frozen || rng_() % 2 == 0) {
      add_sync(t);
    } else {
      add_async(t);
    }
    if (was_frozen) {
      // At once, as the owner in the issue did: the new registration
      // rewrites the blocks the old one was writing (reuse_first) while the
      // target still works through the old bytes in its socket; the audit
      // looks at them again soon after.
      const auto ti = static_cast<std::size_t>(&t - targets_.data());
      // Short writes: done within milliseconds, before the old bytes are
      // through.
      for (std::size_t i = 0; i < kDepthPerTarget; ++i) post(ti, 4);
      t.next_audit = Clock::now() + 100ms;
    }
    check_deferred(t);
  }

  void kill_one() {
    Target& t = targets_[rng_() % targets_.size()];
    if (t.killed) return;
    t.process->kill9();  // a stopped process dies of SIGKILL too
    t.killed = true;
    t.frozen = false;
    t.killed_at = Clock::now();
    ++c_.kills;
    for (const auto& [id, p] : t.deferred) {
      c_.unverifiable_blocks += p.local.size();
      release(t, p, /*poison=*/true);
    }
    t.deferred.clear();
  }

  // SIGSTOP of a TCP target that takes writes: they pile up in its socket
  // buffers until stall_timeout faults the peer (see recover()).
  void freeze_one() {
    std::vector<Target*> candidates;
    for (Target& t : targets_) {
      if (t.options.tls == "tcp" && t.registered && !t.adding && !t.killed && !t.frozen) {
        candidates.push_back(&t);
      }
    }
    if (candidates.empty()) return;
    Target& t = *candidates[rng_() % candidates.size()];
    t.process->send_signal(SIGSTOP);
    t.frozen = true;
    t.frozen_at = Clock::now();
    ++c_.freezes;
  }

  // Resumes a frozen target and checks what was reported done meanwhile.
  void thaw(Target& t) {
    resume(t);
    check_deferred(t);
  }

  void resume(Target& t) {
    if (!t.frozen) return;
    t.process->send_signal(SIGCONT);
    t.frozen = false;
  }

  void check_deferred(Target& t) {
    std::vector<std::pair<TransferId, Pending>> deferred;
    deferred.swap(t.deferred);
    for (const auto& [id, p] : deferred) check(t, id, p);
  }

  // Gives a transfer's blocks back: free when it was checked, held until
  // the next removal when it may still land.
  void release(Target& t, const Pending& p, bool poison) {
    for (std::size_t i = 0; i < p.remote.size(); ++i) {
      const auto r = static_cast<std::size_t>(p.remote[i]);
      if (poison) {
        t.maybe_local[r].push_back(p.local[i]);
        t.checked[r] = false;
        t.held_blocks.push_back(p.remote[i]);
      } else {
        t.last_local[r] = p.local[i];
        t.maybe_local[r].clear();
        t.checked[r] = true;
        t.free_blocks.push_back(p.remote[i]);
      }
    }
  }

  void forget(TransferId id, bool poison) {
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    Target& t = targets_[it->second.target];
    --t.inflight;
    release(t, it->second, poison);
    pending_.erase(it);
  }

  std::vector<TransferId> ids_of_all() const {
    std::vector<TransferId> ids;
    for (const auto& [id, p] : pending_) ids.push_back(id);
    return ids;
  }

  void on_done(TransferId id) {
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    const Pending& p = it->second;
    Target& t = targets_[p.target];
    ++c_.transfers_done;
    c_.bytes_done += p.local.size() * kBlockLen;
    if (t.killed) {
      // Done after the kill is fine for a WRITE posted before it; one posted
      // to a dead process cannot have landed.
      if (p.posted_after_kill) {
        ++c_.done_after_kill;
        std::cout << "soak: transfer " << id << " to " << t.peer_id
                  << " posted after its target was killed was reported done" << std::endl;
      }
      c_.unverifiable_blocks += p.local.size();
      forget(id, /*poison=*/true);
      return;
    }
    if (t.frozen) {
      // A stopped target answers no check: keep the blocks lent until it runs.
      --t.inflight;
      t.deferred.emplace_back(id, std::move(it->second));
      pending_.erase(it);
      return;
    }
    const Pending done = std::move(it->second);
    --t.inflight;
    pending_.erase(it);
    check(t, id, done);
  }

  // Checks a done transfer's blocks on its (running) target and frees them.
  void check(Target& t, TransferId id, const Pending& p) {
    const std::string verdict = t.process->verify(kGen, p.local, p.remote);
    if (verdict != "ok" && !verdict.starts_with("bad ")) {
      // Not an answer to this check: the command channel is out of step.
      ++c_.protocol_errors;
      std::cout << "soak: PROTOCOL ERROR from " << t.peer_id << ": " << verdict << std::endl;
    } else if (verdict == "ok") {
      c_.verified_blocks += p.local.size();
      c_.verified_by_target[t.peer_id + " (" + t.options.tls + ")"] += p.local.size();
    } else {
      // The first bad block stops the target's check: count the transfer's
      // blocks as corrupt, and say which.
      c_.corrupt_blocks += p.local.size();
      std::cout << "soak: CORRUPT transfer " << id << " to " << t.peer_id << ": " << verdict
                << std::endl;
    }
    release(t, p, /*poison=*/false);
    if (verdict != "ok") {
      for (const std::int64_t r : p.remote) t.checked[static_cast<std::size_t>(r)] = false;
    }
  }

  // Checks again every free block whose last write was checked: no write is
  // lent those blocks, so they must still hold it. A block that changed was
  // written by a transfer posted on a registration removed before its last
  // (checked) write was reported done -- stale bytes.
  void audit(Target& t) {
    if (!t.process || t.killed || t.frozen) return;
    std::vector<std::int64_t> local;
    std::vector<std::int64_t> remote;
    for (const std::int64_t r : t.free_blocks) {
      const auto ri = static_cast<std::size_t>(r);
      if (t.checked[ri] && t.last_local[ri] >= 0) {
        remote.push_back(r);
        local.push_back(t.last_local[ri]);
      }
    }
    ++c_.audits;
    c_.audited_blocks += remote.size();
    for (int pass = 0; pass < 64 && !remote.empty(); ++pass) {
      const std::string verdict = t.process->verify(kGen, local, remote);
      if (verdict == "ok") return;
      std::int64_t bad = -1;
      if (std::sscanf(verdict.c_str(), "bad remote=%ld", &bad) != 1 || bad < 0) {
        ++c_.protocol_errors;
        std::cout << "soak: PROTOCOL ERROR from " << t.peer_id << " (audit): " << verdict
                  << std::endl;
        return;
      }
      ++c_.stale_blocks;
      ++c_.corrupt_blocks;
      std::cout << "soak: STALE block " << bad << " of " << t.peer_id << " (" << t.options.tls
                << ") no longer holds its checked write of local block "
                << t.last_local[static_cast<std::size_t>(bad)] << ": " << verdict << std::endl;
      // Its content is unknown now: never lend it again in this process.
      t.checked[static_cast<std::size_t>(bad)] = false;
      std::erase(t.free_blocks, bad);
      for (std::size_t i = 0; i < remote.size(); ++i) {
        if (remote[i] == bad) {
          remote.erase(remote.begin() + static_cast<std::ptrdiff_t>(i));
          local.erase(local.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
      }
    }
  }

  void on_failed(TransferId id) {
    if (pending_.contains(id)) ++c_.transfers_failed;
    forget(id, /*poison=*/true);
  }

  void take(const PollResult& r) {
    ++c_.polls;
    for (const TransferId id : r.done) on_done(id);
    for (const TransferId id : r.failed) on_failed(id);
  }

  // A local block whose pattern no write that may still land in remote
  // block r carries.
  std::int64_t fresh_local(const Target& t, std::int64_t r) {
    const auto ri = static_cast<std::size_t>(r);
    auto l = static_cast<std::int64_t>(rng_() % kBlocks);
    auto taken = [&](std::int64_t x) {
      return x == t.last_local[ri] || std::find(t.maybe_local[ri].begin(), t.maybe_local[ri].end(),
                                                x) != t.maybe_local[ri].end();
    };
    while (taken(l)) l = (l + 1) % static_cast<std::int64_t>(kBlocks);
    return l;
  }

  void post(std::size_t ti, std::size_t max_blocks = kMaxBlocksPerWrite) {
    Target& t = targets_[ti];
    const std::size_t n = 1 + rng_() % max_blocks;
    if (t.free_blocks.size() < n) return;
    Pending p{ti, {}, {}, t.killed};
    while (p.remote.size() < n) {
      std::size_t at = rng_() % t.free_blocks.size();
      if (!t.reuse_first.empty()) {
        const std::int64_t want = t.reuse_first.back();
        t.reuse_first.pop_back();
        const auto it = std::find(t.free_blocks.begin(), t.free_blocks.end(), want);
        if (it == t.free_blocks.end()) continue;  // lent (and checked) meanwhile
        at = static_cast<std::size_t>(it - t.free_blocks.begin());
      }
      const std::int64_t r = t.free_blocks[at];
      t.free_blocks[at] = t.free_blocks.back();
      t.free_blocks.pop_back();
      p.remote.push_back(r);
      p.local.push_back(fresh_local(t, r));
    }
    const auto id = transport_->write_blocks(t.peer_id, std::span<const std::int64_t>(p.local),
                                             std::span<const std::int64_t>(p.remote));
    ++c_.transfers_posted;
    if (!id) {
      // Some of it may have been put on the wire before the post failed.
      ++c_.post_failures;
      release(t, p, /*poison=*/true);
      return;
    }
    ++t.inflight;
    pending_.emplace(*id, std::move(p));
  }

  void cancel_random(CancelMode mode) {
    if (pending_.empty()) return;
    auto it = pending_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng_() % pending_.size()));
    // A frozen target's writes wait for its stall fault.
    if (targets_[it->second.target].frozen) return;
    const TransferId id = it->first;
    const std::vector<TransferId> ids{id};
    const std::vector<TransferId> still = transport_->cancel(ids, mode);
    if (mode == CancelMode::kImmediate) {
      ++c_.cancels_immediate;
      forget(id, /*poison=*/true);
    } else {
      ++c_.cancels_wait;
      if (still.empty()) {
        // Finished, landed or not; we will never hear which.
        forget(id, /*poison=*/true);
      } else {
        ++c_.cancel_wait_still;  // stays in flight; a later poll reports it
      }
    }
  }

  void step() {
    for (std::size_t ti = 0; ti < targets_.size(); ++ti) {
      Target& t = targets_[ti];
      if (t.adding) {
        if (t.adding->wait_for(0s) != std::future_status::ready) continue;
        try {
          t.adding->get();
          t.registered = true;
        } catch (const std::exception& e) {
          std::cout << "soak: async add of " << t.peer_id << " failed: " << e.what() << std::endl;
          t.adding.reset();
          add_sync(t);
        }
        t.adding.reset();
      }
      if (!t.registered) continue;
      if (t.killed && Clock::now() - t.killed_at > 20s) {
        // A killed target no write noticed: do not wait for ever.
        recover(t);
        continue;
      }
      if (t.frozen && Clock::now() - t.frozen_at > kMaxFreeze) {
        std::cout << "soak: " << t.peer_id << " frozen for " << kMaxFreeze.count()
                  << " ms without a fault; resuming it" << std::endl;
        thaw(t);
      }
      while (t.inflight < (t.frozen ? kDepthFrozen : kDepthPerTarget) && rng_() % 4 != 0) {
        const std::size_t before = c_.post_failures;
        post(ti);
        if (c_.post_failures != before) break;
      }
      const PollResult r = transport_->poll(t.peer_id);
      take(r);
      if (r.peer_fault) {
        ++c_.faults;
        const std::string& f = *r.peer_fault;
        const std::string kind = f.substr(0, f.find(':'));
        ++c_.fault_kinds[kind.size() > 24 ? kind.substr(0, 24) : kind];
        if (t.frozen) ++c_.freeze_faults;
        recover(t);
      }
      if (Clock::now() >= t.next_audit && !t.adding) {
        audit(t);
        t.next_audit = Clock::now() + 1s;
      }
    }
    const std::uint64_t dice = rng_() % 1000;
    if (dice < 40) {
      cancel_random(CancelMode::kImmediate);
    } else if (dice < 80) {
      cancel_random(CancelMode::kWait);
    } else if (dice < 380) {
      take(transport_->poll());
    } else if (dice < 388) {
      Target& t = targets_[rng_() % targets_.size()];
      // A frozen target waits for its stall fault.
      if (t.registered && !t.adding && !t.frozen) recover(t);
    } else if (dice < 390) {
      Target& t = targets_[rng_() % targets_.size()];
      if (t.registered && !t.adding && !t.killed && !t.frozen) {
        // A graceful restart: a new process with a new pool under the same
        // peer id.
        ++c_.removals;
        remove(t);
        t.process.reset();
        start(t);
        ++c_.restarts;
        add_sync(t);
      }
    }
    std::this_thread::sleep_for(50us);
  }

  // Lets what is in flight finish (or fault) before the final tally.
  void drain() {
    for (Target& t : targets_) thaw(t);
    const auto deadline = Clock::now() + 15s;
    while (!pending_.empty() && Clock::now() < deadline) {
      take(transport_->poll());
      for (Target& t : targets_) {
        if (!t.registered) continue;
        const PollResult r = transport_->poll(t.peer_id);
        take(r);
        if (r.peer_fault) {
          ++c_.faults;
          ++c_.removals;
          remove(t);
        }
      }
      std::this_thread::sleep_for(1ms);
    }
  }

  std::chrono::seconds duration_;
  std::uint64_t rss_bound_;
  std::mt19937_64 rng_;
  it::MappedPool pool_;
  std::unique_ptr<Transport> transport_;
  std::vector<Target> targets_;
  std::unordered_map<TransferId, Pending> pending_;
  Counters c_;
};

}  // namespace
}  // namespace kvxfer::soak

int main(int argc, char** argv) {
  long seconds = 600;
  std::uint64_t seed = 1;
  std::uint64_t rss_bound_mib = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--seconds") {
      seconds = std::atol(argv[i + 1]);
    } else if (arg == "--seed") {
      seed = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (arg == "--rss-bound-mib") {
      rss_bound_mib = std::strtoull(argv[i + 1], nullptr, 10);
    } else {
      std::cerr << "usage: kvxfer_soak [--seconds S] [--seed N] [--rss-bound-mib M]\n";
      return 2;
    }
  }
  std::cout << "soak: " << seconds << " s, seed " << seed << ", 3 targets (sm lane, 2x tcp)"
            << std::endl;
  try {
    kvxfer::soak::Soak soak(std::chrono::seconds(seconds), seed, rss_bound_mib * 1024 * 1024);
    return soak.run();
  } catch (const std::exception& e) {
    std::cout << "soak FAILED: " << e.what() << std::endl;
    return 1;
  }
}
