// SPDX-License-Identifier: Apache-2.0
// The core under failures, across processes over TCP: a target without a
// progress thread still receives while its owner polls, removing a frozen
// peer holds up no write or poll to a healthy one, and neither does a
// registration superseded while it connects.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <iostream>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "it_lanes.h"
#include "it_support.h"
#include "kvxfer/log.h"
#include "kvxfer/transport.h"

namespace kvxfer::it {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kGen = 1;
constexpr std::uint64_t kNumBlocks = 64;
constexpr std::uint64_t kBlockLen = 64 * 1024;

// A target between hosts: the tcp lane, or ("ucx") the ucx lane over UCX's
// tcp transport (it_lanes.h).
TargetOptions tcp_target(std::string name, std::string lane = "tcp") {
  TargetOptions t;
  t.name = std::move(name);
  t.num_blocks = kNumBlocks;
  t.block_len = kBlockLen;
  t.tls = std::move(lane);
  return t;
}

// A UCX transport over TCP whose pool holds the pattern of generation kGen.
class TcpInitiator {
 public:
  explicit TcpInitiator(const std::string& lane = "tcp", bool progress_thread = true)
      : pool_(kNumBlocks, kBlockLen), transport_(make(pool_, lane, progress_thread)) {}

  Transport& transport() { return transport_; }

  void add(const std::string& peer_id, const TargetProcess& target) {
    transport_.add_remote_peer(peer_id, target.metadata(), target.base_addr(), target.num_blocks(),
                               target.block_len());
  }

  std::optional<TransferId> write(const std::string& peer_id,
                                  const std::vector<std::int64_t>& local,
                                  const std::vector<std::int64_t>& remote) {
    return transport_.write_blocks(peer_id, std::span<const std::int64_t>(local),
                                   std::span<const std::int64_t>(remote));
  }

  // Polls `peer_id` until every id in `ids` is reported done or failed, or
  // `timeout` passes; returns the ids reported done.
  std::set<TransferId> wait_done(const std::string& peer_id, const std::set<TransferId>& ids,
                                 Clock::duration timeout) {
    std::set<TransferId> done;
    std::set<TransferId> failed;
    const auto deadline = Clock::now() + timeout;
    while (done.size() + failed.size() < ids.size() && Clock::now() < deadline) {
      const PollResult r = transport_.poll(peer_id);
      done.insert(r.done.begin(), r.done.end());
      failed.insert(r.failed.begin(), r.failed.end());
      std::this_thread::sleep_for(200us);
    }
    return done;
  }

 private:
  static Transport make(MappedPool& pool, const std::string& lane, bool progress_thread) {
    pool.fill_generation(kGen);
    Options options;
    options.backends = {"UCX"};
    options.progress_thread = progress_thread;
    options.engine_config = with_tls({}, lane);
    return Transport("initiator", Region{pool.base(), pool.num_blocks(), pool.block_len()},
                     options);
  }

  MappedPool pool_;
  Transport transport_;
};

TEST(CoreFailuresTest, TargetWithoutProgressThreadReceivesTcpWritesWhileItsOwnerPolls) {
  TargetOptions options = tcp_target("target");
  options.progress_thread = false;
  options.poll_loop = true;  // its owner polls, with nothing of its own in flight
  TargetProcess target(options);
  TcpInitiator a;
  a.add("t", target);

  std::set<TransferId> posted;
  for (std::int64_t i = 0; i < 4; ++i) {
    const auto id = a.write("t", {i}, {10 + i});
    ASSERT_TRUE(id.has_value());
    posted.insert(*id);
  }

  // Generous for a loaded 2-core box: each lands in well under a second.
  const std::set<TransferId> done = a.wait_done("t", posted, 20s);
  EXPECT_EQ(done, posted) << done.size() << " of 4 writes landed";
  EXPECT_EQ(target.verify(kGen, {0, 1, 2, 3}, {10, 11, 12, 13}), "ok");
}

// The longest single write_blocks or poll call a thread streaming to a
// healthy peer saw while another peer was removed.
struct StreamRecord {
  Clock::duration worst{};
  std::uint64_t calls = 0;
  std::uint64_t done = 0;
  bool write_refused = false;
};

// How the bad peer goes bad (frozen: SIGSTOP, or dead: SIGKILL), and the
// lane between hosts.
class RemovalTest : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(RemovalTest, RemovingABadPeerHoldsUpNoWriteOrPollToAHealthyOne) {
  const auto& [signal, lane] = GetParam();
  TargetProcess healthy(tcp_target("healthy", lane));
  TargetProcess bad(tcp_target("bad", lane));
  TcpInitiator a(lane);
  a.add("healthy", healthy);
  a.add("bad", bad);

  // Writes stuck in flight to it: nothing acknowledges them.
  bad.send_signal(signal);
  std::uint64_t stuck = 0;
  for (std::int64_t i = 0; i < 16; ++i) {
    std::vector<std::int64_t> idx;
    for (std::int64_t j = 0; j < 8; ++j)
      idx.push_back((i * 8 + j) % static_cast<std::int64_t>(kNumBlocks));
    if (a.write("bad", idx, idx)) ++stuck;  // a dead peer may refuse the post already
  }
  std::this_thread::sleep_for(100ms);
  for (const PeerStats& p : a.transport().stats().peers) {
    if (p.peer_id == "bad") stuck = p.inflight;
  }

  std::atomic<bool> removing{false};
  std::atomic<bool> stop{false};
  StreamRecord record;
  std::thread streamer([&] {
    std::int64_t block = 0;
    while (!stop.load()) {
      const std::vector<std::int64_t> idx{block};
      block = (block + 1) % static_cast<std::int64_t>(kNumBlocks);
      auto started = Clock::now();
      const auto id = a.transport().write_blocks("healthy", std::span<const std::int64_t>(idx),
                                                 std::span<const std::int64_t>(idx));
      const auto write_took = Clock::now() - started;
      started = Clock::now();
      const PollResult r = a.transport().poll("healthy");
      const auto poll_took = Clock::now() - started;
      // Counted once the removal began, so a call it held up counts too.
      if (removing.load()) {
        record.worst = std::max({record.worst, write_took, poll_took});
        ++record.calls;
        if (!id) record.write_refused = true;
      }
      record.done += r.done.size();
      std::this_thread::sleep_for(100us);
    }
  });

  std::this_thread::sleep_for(300ms);  // the stream is running
  removing = true;
  const auto remove_started = Clock::now();
  a.transport().remove_remote_peer("bad");
  const auto remove_took = Clock::now() - remove_started;
  std::this_thread::sleep_for(100ms);  // calls that queued behind the removal
  stop = true;
  streamer.join();
  if (signal == SIGSTOP) bad.send_signal(SIGCONT);

  const auto ms = [](Clock::duration d) {
    return std::chrono::duration<double, std::milli>(d).count();
  };
  std::cout << "  removing the " << (signal == SIGSTOP ? "frozen" : "dead") << " peer took "
            << ms(remove_took) << " ms; worst write_blocks/poll to the healthy peer meanwhile "
            << ms(record.worst) << " ms over " << record.calls << " call pairs (" << stuck
            << " writes of 8 blocks were in flight to it)" << std::endl;
  EXPECT_FALSE(record.write_refused);
  EXPECT_GT(record.done, 0u);
  EXPECT_GT(record.calls, 0u);
  // The bar is 5 ms. Over TCP a removal is quick today even under
  // the lock (force-closing the endpoint took well under 1 ms here), so this
  // bound is a guard, with room for a loaded 2-core box: a removal that held
  // the transport through the engine's 500 ms peer-release wait or its 10 s
  // close drain would break it. The unit test
  // FailureCleanupTest.RemovalWaitingInTheEngineHoldsUpNoOtherPeer pins the
  // lock rule itself with a teardown that waits for as long as it is told.
  EXPECT_LT(ms(record.worst), 100.0);
  EXPECT_EQ(a.transport().peers(), std::vector<std::string>{"healthy"});
  EXPECT_EQ(a.transport().stats().live.peers, 1u);
}

INSTANTIATE_TEST_SUITE_P(
    BadPeer, RemovalTest,
    ::testing::Combine(::testing::Values(SIGSTOP, SIGKILL), ::testing::Values("tcp", "ucx")),
    [](const ::testing::TestParamInfo<std::tuple<int, std::string>>& param_info) {
      return std::string(std::get<0>(param_info.param) == SIGSTOP ? "Frozen" : "Dead") + "_" +
             std::get<1>(param_info.param);
    });

// Collects the library's error records while it lives.
class ErrorRecords {
 public:
  ErrorRecords() {
    set_log_sink([this](LogLevel level, std::string_view message) {
      if (level < LogLevel::kError) return;
      std::lock_guard lock(mu_);
      errors_.emplace_back(message);
    });
  }
  ~ErrorRecords() {
    static_cast<void>(flush_log());
    set_log_sink(nullptr);
  }
  ErrorRecords(const ErrorRecords&) = delete;
  ErrorRecords& operator=(const ErrorRecords&) = delete;

  std::vector<std::string> all() {
    static_cast<void>(flush_log());
    std::lock_guard lock(mu_);
    return errors_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> errors_;
};

// A registration removed while it connects is released by the registration
// worker, outside the transport's lock, as a removal is. Without a progress
// thread the ucx lane's disconnect takes the UCX driver's turn itself: under
// the lock, UCX's callbacks would run under it (the core's check of that
// rule logs an error, and aborts in a build with assertions), and a thread
// polling meanwhile would wait for the whole close (up to 10 s on a peer
// that does not answer).
TEST(CoreFailuresTest, SupersededUcxRegistrationWithoutProgressThreadHoldsUpNoPoll) {
  TargetProcess healthy(tcp_target("healthy", "ucx"));
  TargetProcess late(tcp_target("late", "ucx"));
  ErrorRecords errors;
  TcpInitiator a("ucx", /*progress_thread=*/false);
  a.add("healthy", healthy);

  // This thread drives the initiator's UCX worker: its polls are all that
  // moves it between the registrations' own turns.
  std::atomic<bool> stop{false};
  StreamRecord record;
  std::thread poller([&] {
    std::int64_t block = 0;
    while (!stop.load()) {
      const std::vector<std::int64_t> idx{block};
      block = (block + 1) % static_cast<std::int64_t>(kNumBlocks);
      auto started = Clock::now();
      const auto id = a.write("healthy", idx, idx);
      const auto write_took = Clock::now() - started;
      started = Clock::now();
      const PollResult r = a.transport().poll("healthy");
      const auto poll_took = Clock::now() - started;
      record.worst = std::max({record.worst, write_took, poll_took});
      ++record.calls;
      if (!id) record.write_refused = true;
      record.done += r.done.size();
      std::this_thread::sleep_for(100us);
    }
  });

  int superseded = 0;
  int published = 0;
  for (int round = 0; round < 10; ++round) {
    std::future<void> registering = a.transport().add_remote_peer_async(
        "late", late.metadata(), late.base_addr(), late.num_blocks(), late.block_len());
    a.transport().remove_remote_peer("late");
    ASSERT_EQ(registering.wait_for(20s), std::future_status::ready) << "round " << round;
    try {
      registering.get();
      ++published;  // connected before the removal, which then removed it
    } catch (const SupersededError&) {
      ++superseded;
    }
  }
  std::this_thread::sleep_for(100ms);  // calls that queued behind the last one
  stop = true;
  poller.join();

  const auto ms = [](Clock::duration d) {
    return std::chrono::duration<double, std::milli>(d).count();
  };
  std::cout << "  " << superseded << " of 10 registrations superseded; worst write_blocks/poll "
            << "to the healthy peer meanwhile " << ms(record.worst) << " ms over " << record.calls
            << " call pairs" << std::endl;
  EXPECT_GT(superseded, 0) << published << " registrations connected before their removal";
  EXPECT_EQ(errors.all(), std::vector<std::string>{});
  EXPECT_FALSE(record.write_refused);
  EXPECT_GT(record.done, 0u);
  // The same guard as RemovalTest's, for a loaded 2-core box.
  EXPECT_LT(ms(record.worst), 100.0);
  EXPECT_EQ(a.transport().peers(), std::vector<std::string>{"healthy"});
  EXPECT_EQ(a.transport().stats().live.peers, 1u);
}

}  // namespace
}  // namespace kvxfer::it
