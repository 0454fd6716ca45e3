// kvxfer_soak: random writes, cancels (both modes), polls, peer removals and
// re-additions against three kvxfer_it_target processes, one of which is
// killed (or restarted) at random, for a given time. Every block of every
// transfer reported done is checked on its target. It touches only the public
// API and the integration tests' target (tests/integration/it_support.h).
//
//   kvxfer_soak [--seconds S] [--seed N] [--rss-bound-mib M]
//
// Exit status 0 only when no block was corrupt, blocks were verified, every
// handle was given back after close() and RSS grew less than the bound
// between the end of the warm-up and the end.
//
// Why the verification is exact: a remote block is lent to one transfer at a
// time. A transfer reported done has its blocks checked before they are lent
// again, and the next write to a block always carries another local block,
// so stale content cannot pass for new. A transfer that is cancelled, fails,
// or is dropped with its peer may still land later (bytes already in the
// target's socket buffer are applied when it runs again), so its blocks are
// never lent again in that target process; when a target runs short of
// blocks it is restarted, which gives a new, zeroed pool.
#include <unistd.h>

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
  std::map<std::string, std::uint64_t> fault_kinds;
  std::map<std::string, std::uint64_t> verified_by_target;
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
  std::vector<std::int64_t> last_local;  // per remote block; -1: zero
  std::size_t inflight = 0;
};

struct Pending {
  std::size_t target;
  std::vector<std::int64_t> local;
  std::vector<std::int64_t> remote;
  bool posted_after_kill = false;  // its target was already SIGKILLed
};

class Soak {
 public:
  Soak(std::chrono::seconds duration, std::uint64_t seed, std::uint64_t rss_bound)
      : duration_(duration), rss_bound_(rss_bound), rng_(seed), pool_(kBlocks, kBlockLen) {
    pool_.fill_generation(kGen);
    Options options;
    options.backends = {"UCX"};
    options.stall_timeout = 5s;
    // Shared memory and TCP: the same-host target gets the process_vm_writev
    // lane, the tcp-only ones UCX endpoints.
    options.engine_config = {{"TLS", "sm,self,tcp"}};
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
    auto next_report = t0 + 30s;
    while (Clock::now() < end) {
      step();
      const auto now = Clock::now();
      if (!rss_warm && now >= warm_until) rss_warm = rss_bytes();
      if (now >= next_kill) {
        kill_one();
        next_kill = now + std::chrono::milliseconds(10000 + rng_() % 40000);
      }
      if (now >= next_report) {
        std::cout << "soak: " << std::chrono::duration_cast<std::chrono::seconds>(now - t0).count()
                  << " s, " << c_.transfers_done << " done, " << c_.verified_blocks
                  << " blocks verified, " << c_.corrupt_blocks << " corrupt, " << c_.faults
                  << " faults" << std::endl;
        next_report = now + 30s;
      }
    }
    drain();
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
              << "  engine              ";
    for (const auto& [name, n] : engine_counters) std::cout << " " << name << "=" << n;
    std::cout << "\n"
              << "  faults seen         " << c_.faults;
    for (const auto& [kind, n] : c_.fault_kinds) std::cout << " " << kind << "=" << n;
    std::cout << "\n"
              << "  verified blocks     " << c_.verified_blocks;
    for (const auto& [peer, n] : c_.verified_by_target) std::cout << ", " << peer << " " << n;
    std::cout << "\n"
              << "  corrupt blocks      " << c_.corrupt_blocks << "\n"
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
    t.free_blocks.resize(kBlocks);
    for (std::uint64_t i = 0; i < kBlocks; ++i) t.free_blocks[i] = static_cast<std::int64_t>(i);
    t.last_local.assign(kBlocks, -1);
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

  // Removing a peer drops its transfers; their WRITEs may still land.
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
  }

  // The peer is faulted (or its process is gone): take it out and bring it
  // back, restarting the process when it was killed or runs short of blocks.
  void recover(Target& t) {
    ++c_.removals;
    remove(t);
    if (t.killed || t.free_blocks.size() < kRefreshBelow) {
      t.process.reset();  // quit, or reap the killed one
      start(t);
      ++c_.restarts;
    }
    if (rng_() % 2 == 0) {
      add_sync(t);
    } else {
      add_async(t);
    }
  }

  void kill_one() {
    Target& t = targets_[rng_() % targets_.size()];
    if (t.killed) return;
    t.process->kill9();
    t.killed = true;
    t.killed_at = Clock::now();
    ++c_.kills;
  }

  void forget(TransferId id, bool poison) {
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    Target& t = targets_[it->second.target];
    --t.inflight;
    if (!poison) {
      for (std::size_t i = 0; i < it->second.remote.size(); ++i) {
        t.last_local[static_cast<std::size_t>(it->second.remote[i])] = it->second.local[i];
        t.free_blocks.push_back(it->second.remote[i]);
      }
    }
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
    forget(id, /*poison=*/false);
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

  void post(std::size_t ti) {
    Target& t = targets_[ti];
    const std::size_t n = 1 + rng_() % kMaxBlocksPerWrite;
    if (t.free_blocks.size() < n) return;
    Pending p{ti, {}, {}, t.killed};
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t at = rng_() % t.free_blocks.size();
      const std::int64_t r = t.free_blocks[at];
      t.free_blocks[at] = t.free_blocks.back();
      t.free_blocks.pop_back();
      std::int64_t l = static_cast<std::int64_t>(rng_() % kBlocks);
      if (l == t.last_local[static_cast<std::size_t>(r)])
        l = (l + 1) % static_cast<std::int64_t>(kBlocks);
      p.remote.push_back(r);
      p.local.push_back(l);
    }
    const auto id = transport_->write_blocks(t.peer_id, std::span<const std::int64_t>(p.local),
                                             std::span<const std::int64_t>(p.remote));
    ++c_.transfers_posted;
    if (!id) {
      // Some of it may have been put on the wire before the post failed.
      ++c_.post_failures;
      return;
    }
    ++t.inflight;
    pending_.emplace(*id, std::move(p));
  }

  void cancel_random(CancelMode mode) {
    if (pending_.empty()) return;
    auto it = pending_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng_() % pending_.size()));
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
      while (t.inflight < kDepthPerTarget && rng_() % 4 != 0) {
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
        recover(t);
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
      if (t.registered && !t.adding) recover(t);
    } else if (dice < 390) {
      Target& t = targets_[rng_() % targets_.size()];
      if (t.registered && !t.adding && !t.killed) {
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
