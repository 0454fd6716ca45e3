// SPDX-License-Identifier: Apache-2.0
// The stale-write scenario (issue 10), shared by stale_write_test.cc (TCP on
// loopback) and netns_test.cc (TCP over a veth link):
//
//   per round, an initiator streams writes of a round-specific OLD pattern
//   into remote blocks 0..N-1 of a kvxfer_it_target, many of them in flight;
//   the target freezes (SIGSTOP) with the sockets' buffers full; the old
//   writes are dropped (the peer stalls and faults, or they are cancelled
//   with kImmediate); the owner calls remove_remote_peer, the target resumes
//   (SIGCONT), the owner registers it again with the same metadata and
//   writes a NEW pattern into the same N blocks until poll reports done.
//   After a settle time every block must hold the NEW pattern.
//
// The requirement: once remove_remote_peer(p) has returned, no byte of a
// write posted on the old registration may be applied to p's pool after a
// write posted on the new registration was reported done. Old transfers may
// fail or be refused; only the target's bytes are checked.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "it_support.h"
#include "kvxfer/transport.h"

namespace kvxfer::it {

// How the writes posted on the old registration are dropped.
enum class StaleDrop {
  // The peer is faulted by Options::stall_timeout while the target is frozen.
  kStall,
  // While the target is frozen, every in-flight write is cancelled with
  // CancelMode::kImmediate (no fault).
  kCancelImmediate,
};

struct StaleConfig {
  std::uint64_t blocks = 64;  // remote blocks 0..blocks-1 are rewritten
  // Small blocks: the NEW write (64 x 4 KiB) is done within milliseconds of
  // the new registration, while the old bytes in the sockets (up to tens of
  // MiB) take longer to apply. With 64 KiB blocks the same scenario left
  // stale blocks in about 1 round in 20.
  std::uint64_t block_len = 4096;
  StaleDrop drop = StaleDrop::kStall;
  std::chrono::milliseconds stall_timeout{400};
  // The initiator's engine_config (the tcp lane at least: the same-host
  // process_vm_writev lane must stay off).
  std::map<std::string, std::string> engine_config{{"TLS", "tcp"}, {"KVXFER_LANES", "tcp"}};
  // Writes in flight while the old pattern streams, and blocks in flight
  // reached by posting more once the target is frozen (the sockets' buffers
  // and UCX's pending queue fill up).
  std::size_t depth = 32;
  std::size_t frozen_blocks_in_flight = 8192;  // 32 MiB of 4 KiB blocks
  // The OLD stream runs at least this many bytes (reported done) before the
  // freeze: each round's registration is a new TCP connection, whose
  // receive window only grows with traffic, and a small window leaves few
  // old bytes in the target's socket.
  std::uint64_t warm_bytes = 64ull << 20;
  // After SIGSTOP (kCancelImmediate): how long the initiator keeps pushing
  // bytes into the frozen target's socket before the cancel.
  std::chrono::milliseconds freeze_fill{400};
  // The target resumes this long after SIGSTOP, or right after
  // remove_remote_peer when that comes later (0: right after it, as in the
  // issue). With 4 KiB blocks, resuming right after the removal left stale
  // blocks in more rounds (about 1 in 4 on 2 vCPUs) than a pause of 1 s
  // (1 in 12).
  std::chrono::milliseconds freeze{0};
  // Socket buffers (UCX_TCP_SNDBUF / UCX_TCP_RCVBUF) on both sides: the
  // bigger, the more old bytes sit in them when the target freezes. The
  // kernel caps them at 2 x net.core.[wr]mem_max.
  std::string socket_buffer = "8m";
  // From "NEW reported done" to the read-back.
  std::chrono::milliseconds settle{1000};
  // The slow tier plays rounds for the whole budget; `make test` plays
  // three (up to two more when a round has nothing in flight to drop).
  int min_rounds = slow_tier() ? 8 : 3;
  int max_rounds = slow_tier() ? 30 : 5;
  // No round starts after this much time (min_rounds always run).
  std::chrono::seconds budget{slow_tier() ? 40 : 0};
};

// The initiator's engine_config entries for the socket buffers; the target
// needs the same (TargetOptions::engine_config).
inline std::map<std::string, std::string> stale_socket_config(const StaleConfig& config) {
  return {{"TCP_SNDBUF", config.socket_buffer}, {"TCP_RCVBUF", config.socket_buffer}};
}

struct StaleRound {
  int round = 0;
  std::uint64_t stale = 0;           // blocks not holding the NEW pattern
  std::uint64_t old_blocks = 0;      // of those, blocks holding this round's OLD pattern
  std::size_t inflight_at_drop = 0;  // old writes in flight when dropped
  std::size_t inflight_blocks_at_drop = 0;
  double drop_ms = 0;      // SIGSTOP to fault (kStall) or to cancel (kCancelImmediate)
  double new_done_ms = 0;  // SIGCONT to the NEW pattern reported done
  bool skipped = false;    // nothing was left in flight to stall
  std::string fault;
};

// One initiator and one target; run() plays the rounds and returns what each
// round left on the target. Failures of the scenario's steps (no fault, the
// NEW write not done) are gtest failures; stale blocks are only counted,
// the caller asserts on them.
class StaleScenario {
 public:
  using Clock = std::chrono::steady_clock;

  StaleScenario(const StaleConfig& config, TargetProcess& target)
      : config_(config),
        target_(target),
        pool_(2 * config.blocks, config.block_len),
        transport_(make(config, pool_)) {}

  Transport& transport() { return transport_; }

  std::vector<StaleRound> run() {
    std::vector<StaleRound> rounds;
    int skipped = 0;
    add();
    const auto t0 = Clock::now();
    for (int r = 0; r < config_.max_rounds; ++r) {
      if (static_cast<int>(rounds.size()) >= config_.min_rounds &&
          Clock::now() - t0 > config_.budget) {
        break;
      }
      StaleRound round;
      round.round = r;
      play(round);
      if (::testing::Test::HasFatalFailure()) break;
      if (round.skipped) {
        ++skipped;
        EXPECT_LE(skipped, std::max(1, config_.max_rounds / 4))
            << "too many rounds had nothing in flight";
        continue;
      }
      std::cout << "[stale] round " << r << ": " << round.stale << " of " << config_.blocks
                << " blocks stale (" << round.old_blocks << " with this round's OLD pattern); "
                << round.inflight_at_drop << " old writes (" << round.inflight_blocks_at_drop
                << " blocks) in flight when dropped after " << static_cast<long>(round.drop_ms)
                << " ms; NEW done " << round.new_done_ms << " ms after SIGCONT"
                << (round.fault.empty() ? "" : "; fault: ") << round.fault << std::endl;
      rounds.push_back(round);
    }
    return rounds;
  }

  static std::string summary(const std::vector<StaleRound>& rounds) {
    std::size_t bad_rounds = 0;
    std::uint64_t stale = 0;
    std::ostringstream per;
    for (const StaleRound& r : rounds) {
      if (r.stale != 0) ++bad_rounds;
      stale += r.stale;
      per << ' ' << r.stale;
    }
    std::ostringstream out;
    out << bad_rounds << " of " << rounds.size() << " rounds had stale blocks, " << stale
        << " stale blocks in all; per round:" << per.str();
    return out.str();
  }

 private:
  // Generations: OLD of round r is 100 + 2r, NEW is 101 + 2r, so a block
  // left over from any earlier round is stale too.
  static std::uint64_t old_gen(int r) { return 100 + 2 * static_cast<std::uint64_t>(r); }
  static std::uint64_t new_gen(int r) { return 101 + 2 * static_cast<std::uint64_t>(r); }

  static Transport make(const StaleConfig& config, MappedPool& pool) {
    Options options;
    options.backends = {"UCX"};
    options.stall_timeout =
        config.drop == StaleDrop::kStall ? config.stall_timeout : std::chrono::milliseconds(0);
    options.engine_config = config.engine_config;
    options.engine_config.merge(stale_socket_config(config));
    return Transport("stale-initiator", Region{pool.base(), pool.num_blocks(), pool.block_len()},
                     options);
  }

  void add() {
    transport_.add_remote_peer("t", target_.metadata(), target_.base_addr(), target_.num_blocks(),
                               target_.block_len());
  }

  struct Posted {
    std::vector<std::int64_t> remote;
  };

  // Local block i holds OLD(r, i), local blocks+i holds NEW(r, i): the write
  // of remote block i takes local i (old) or blocks+i (new), and the target
  // checks remote i against the pattern of index i in either generation.
  void fill(int r) {
    for (std::uint64_t i = 0; i < config_.blocks; ++i) {
      fill_block(pool_.block(i), config_.block_len, old_gen(r), i);
      fill_block(pool_.block(config_.blocks + i), config_.block_len, new_gen(r), i);
    }
  }

  // The next write of the OLD stream. Shapes alternate: one block, 16
  // consecutive blocks (one run), eight scattered blocks (eight runs).
  std::vector<std::int64_t> next_old_shape() {
    const std::size_t n = config_.blocks;
    std::vector<std::int64_t> remote;
    switch (shape_++ % 3) {
      case 0:
        remote.push_back(static_cast<std::int64_t>(cursor_++ % n));
        break;
      case 1: {
        const std::uint64_t run = std::min<std::uint64_t>(16, n);
        const std::uint64_t start = (cursor_ % n) > n - run ? 0 : cursor_ % n;
        for (std::uint64_t k = 0; k < run; ++k) {
          remote.push_back(static_cast<std::int64_t>(start + k));
        }
        cursor_ = start + run;
        break;
      }
      default:
        remote = random_sample(rng_, n, std::min<std::size_t>(8, n));
        break;
    }
    return remote;
  }

  std::optional<TransferId> post(const std::vector<std::int64_t>& remote, bool fresh) {
    std::vector<std::int64_t> local = remote;
    if (fresh) {
      for (auto& l : local) l += static_cast<std::int64_t>(config_.blocks);
    }
    return transport_.write_blocks("t", std::span<const std::int64_t>(local),
                                   std::span<const std::int64_t>(remote));
  }

  std::size_t blocks_in_flight() const {
    std::size_t n = 0;
    for (const auto& [id, p] : inflight_) n += p.remote.size();
    return n;
  }

  // Polls once; returns the fault if the peer is faulted.
  void poll_once(std::set<std::int64_t>* landed, std::optional<std::string>& fault) {
    PollResult res = transport_.poll("t");
    for (const TransferId id : res.done) {
      auto it = inflight_.find(id);
      if (it == inflight_.end()) continue;
      if (landed != nullptr) landed->insert(it->second.remote.begin(), it->second.remote.end());
      ++done_;
      done_bytes_ += it->second.remote.size() * config_.block_len;
      inflight_.erase(it);
    }
    for (const TransferId id : res.failed) inflight_.erase(id);
    if (res.peer_fault && !fault) fault = res.peer_fault;
  }

  void play(StaleRound& round) {
    using namespace std::chrono_literals;
    const int r = round.round;
    fill(r);
    inflight_.clear();

    // 1. The OLD pattern streams until every block held it at least once
    //    (reported done) and a few passes went by.
    std::set<std::int64_t> landed;
    std::optional<std::string> fault;
    done_ = 0;
    done_bytes_ = 0;
    int early_faults = 0;
    const auto warm_deadline = Clock::now() + 60s;
    while (landed.size() < config_.blocks || done_ < 3 * config_.depth ||
           done_bytes_ < config_.warm_bytes) {
      ASSERT_LT(Clock::now(), warm_deadline) << "round " << r << ": the OLD stream stalled";
      while (inflight_.size() < config_.depth) {
        auto remote = next_old_shape();
        const auto id = post(remote, /*fresh=*/false);
        ASSERT_TRUE(id.has_value()) << "round " << r << ": OLD post failed";
        inflight_.emplace(*id, Posted{std::move(remote)});
      }
      poll_once(&landed, fault);
      if (fault) {
        // Not one of ours: on a loaded machine (a sanitizer build) a write
        // can outlast the short stall_timeout. Stream again on a new
        // registration; what the old one still writes is OLD too.
        ASSERT_LT(++early_faults, 5) << "round " << r << ": faulted before the freeze: " << *fault;
        std::cout << "[stale] round " << r << ": fault before the freeze (" << *fault
                  << "); registering again" << std::endl;
        transport_.remove_remote_peer("t");
        inflight_.clear();
        add();
        fault.reset();
      }
      std::this_thread::sleep_for(100us);
    }

    // 2. Freeze the target and keep posting: the initiator's sends back up
    //    into the target's receive buffer, its own send buffer and UCX.
    const auto stopped_at = Clock::now();
    target_.send_signal(SIGSTOP);
    while (blocks_in_flight() < config_.frozen_blocks_in_flight) {
      auto remote = next_old_shape();
      const auto id = post(remote, /*fresh=*/false);
      if (!id) break;  // faulted already (a very short stall_timeout)
      inflight_.emplace(*id, Posted{std::move(remote)});
    }

    // 3. Drop the old writes.
    if (config_.drop == StaleDrop::kStall) {
      const std::size_t done_at_freeze = done_;
      const auto deadline = Clock::now() + config_.stall_timeout + 15s;
      while (!fault && !inflight_.empty() && Clock::now() < deadline) {
        poll_once(nullptr, fault);
        std::this_thread::sleep_for(1ms);
      }
      round.drop_ms = std::chrono::duration<double, std::milli>(Clock::now() - stopped_at).count();
      if (!fault && inflight_.empty()) {
        // Every old write was reported (done or failed) although the target
        // was stopped: nothing was left to stall, so this round cannot show
        // the bug. Seen once in about 130 rounds on main; say so and skip.
        std::cout << "[stale] round " << r << ": nothing left in flight " << round.drop_ms
                  << " ms after SIGSTOP (" << done_ - done_at_freeze
                  << " old writes reported done since); round skipped" << std::endl;
        target_.send_signal(SIGCONT);
        transport_.remove_remote_peer("t");
        add();
        round.skipped = true;
        return;
      }
      if (!fault) {
        target_.send_signal(SIGCONT);
        FAIL() << "round " << r << ": the frozen peer was not faulted " << round.drop_ms
               << " ms after SIGSTOP with " << inflight_.size() << " old writes in flight";
      }
      round.fault = *fault;
      EXPECT_NE(fault->find("STALLED"), std::string::npos) << *fault;
    } else {
      const auto fill_until = stopped_at + config_.freeze_fill;
      while (Clock::now() < fill_until) {
        poll_once(nullptr, fault);
        std::this_thread::sleep_for(1ms);
      }
      std::vector<TransferId> ids;
      for (const auto& [id, p] : inflight_) ids.push_back(id);
      round.drop_ms = std::chrono::duration<double, std::milli>(Clock::now() - stopped_at).count();
      EXPECT_TRUE(transport_.cancel(ids, CancelMode::kImmediate).empty());
      if (fault) round.fault = *fault;
    }
    round.inflight_at_drop = inflight_.size();
    round.inflight_blocks_at_drop = blocks_in_flight();
    // The removal settles what is still in flight: the next poll of "t"
    // reports each of them once (failed, or done if its bytes had landed).
    std::set<TransferId> dropped;
    for (const auto& [id, p] : inflight_) dropped.insert(id);
    inflight_.clear();

    // 4. Remove, resume (once the pause is over), register again with the
    //    same metadata.
    transport_.remove_remote_peer("t");
    std::this_thread::sleep_until(stopped_at + config_.freeze);
    target_.send_signal(SIGCONT);
    const auto resumed_at = Clock::now();
    add();

    // 5. The NEW pattern into the same blocks, until every write is done.
    std::vector<std::int64_t> all(config_.blocks);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng_);
    std::set<TransferId> fresh;
    for (std::size_t at = 0; at < all.size(); at += 8) {
      const std::vector<std::int64_t> remote(
          all.begin() + static_cast<std::ptrdiff_t>(at),
          all.begin() + static_cast<std::ptrdiff_t>(std::min(at + 8, all.size())));
      const auto id = post(remote, /*fresh=*/true);
      ASSERT_TRUE(id.has_value()) << "round " << r << ": NEW post failed on the new registration";
      fresh.insert(*id);
    }
    std::optional<std::string> new_fault;
    std::set<TransferId> done;
    const auto deadline = Clock::now() + 30s;
    while (done.size() < fresh.size() && !new_fault && Clock::now() < deadline) {
      PollResult res = transport_.poll("t");
      for (const TransferId id : res.done) {
        if (dropped.erase(id) == 0) done.insert(id);
      }
      for (const TransferId id : res.failed) {
        if (dropped.erase(id) == 0) ADD_FAILURE() << "round " << r << ": NEW write " << id << " failed";
      }
      if (res.peer_fault) new_fault = res.peer_fault;
      std::this_thread::sleep_for(100us);
    }
    ASSERT_FALSE(new_fault.has_value())
        << "round " << r << ": new registration faulted: " << *new_fault;
    ASSERT_EQ(done, fresh) << "round " << r << ": NEW writes not all reported done";
    round.new_done_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - resumed_at).count();

    // 6. Settle, then read every block back through the target.
    std::this_thread::sleep_for(config_.settle);
    for (std::uint64_t i = 0; i < config_.blocks; ++i) {
      const std::vector<std::int64_t> idx{static_cast<std::int64_t>(i)};
      const std::string verdict = target_.verify(new_gen(r), idx, idx);
      if (verdict == "ok") continue;
      ASSERT_TRUE(verdict.starts_with("bad ")) << "target reply out of step: " << verdict;
      ++round.stale;
      if (target_.verify(old_gen(r), idx, idx) == "ok") ++round.old_blocks;
    }
  }

  StaleConfig config_;
  TargetProcess& target_;
  MappedPool pool_;
  Transport transport_;
  std::mt19937_64 rng_{20261201};
  std::uint64_t cursor_ = 0;
  std::uint64_t shape_ = 0;
  std::size_t done_ = 0;
  std::uint64_t done_bytes_ = 0;
  std::map<TransferId, Posted> inflight_;
};

}  // namespace kvxfer::it
