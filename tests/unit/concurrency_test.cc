// SPDX-License-Identifier: Apache-2.0
// Behaviour 10: writes, polls and cancels from several threads at once,
// concurrent with async registrations and removals, need no external lock.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "agents.h"

namespace kvxfer::unit {
namespace {

TEST(ConcurrencyTest, ThreadsWritingPollingAndCancellingReportEveryIdAtMostOnce) {
  constexpr int kWorkers = 4;
  constexpr int kIterations = 300;  // at least; workers go on until the registrar is done
  constexpr int kReregistrations = 60;
  constexpr std::int64_t kBlocksPerWorker = 16;
  constexpr std::uint64_t kBlocks = kWorkers * kBlocksPerWorker;
  Agent b{"agent-b", loopback_options(), kBlocks};
  Agent c{"agent-c", loopback_options(), kBlocks};
  Agent d{"agent-d", loopback_options(), kBlocks};
  Agent a{"agent-a", loopback_options(), kBlocks};
  a.pool.fill_pattern(1);
  const std::array<std::string, 3> peer_ids{"b", "c", "d"};
  const std::array<Transport*, 3> targets{&b.transport, &c.transport, &d.transport};
  for (std::size_t i = 0; i < 3; ++i) add_peer(a.transport, peer_ids[i], *targets[i]);
  a.plan().set_connect_delay_ms(1);

  std::mutex mu;
  std::set<TransferId> issued;
  std::set<TransferId> reported;
  std::vector<TransferId> duplicates;
  std::vector<std::string> unexpected_errors;
  std::atomic<bool> stop{false};

  auto record = [&](const PollResult& result) {
    std::lock_guard lock(mu);
    for (const auto* list : {&result.done, &result.failed}) {
      for (const TransferId id : *list) {
        if (!reported.insert(id).second) duplicates.push_back(id);
      }
    }
  };

  // Removes and re-registers peers asynchronously while the workers run.
  std::thread registrar([&] {
    std::vector<std::future<void>> futures;
    for (int i = 0; i < kReregistrations; ++i) {
      const std::size_t p = static_cast<std::size_t>(i) % 3;
      a.transport.remove_remote_peer(peer_ids[p]);
      futures.push_back(add_peer_async(a.transport, peer_ids[p], *targets[p]));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    for (auto& f : futures) {
      try {
        f.get();
      } catch (const SupersededError&) {
        // expected: later registrations and removals supersede earlier ones
      } catch (const std::exception& e) {
        std::lock_guard lock(mu);
        unexpected_errors.emplace_back(e.what());
      }
    }
    // The injected failures may have faulted every peer by now (on a loaded
    // machine, three of them in a row to each): register each afresh, so a
    // worker that has issued nothing yet still can (no failures are
    // injected from here on).
    for (std::size_t p = 0; p < 3; ++p) {
      a.transport.remove_remote_peer(peer_ids[p]);
      add_peer(a.transport, peer_ids[p], *targets[p]);
    }
    stop.store(true);
  });

  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      // Each worker writes its own remote blocks, so the copies never race.
      const std::int64_t first = w * kBlocksPerWorker;
      std::vector<TransferId> mine;
      // Until the registrar is done and this worker issued a write (every
      // peer is registered by then; on a loaded machine the removals can
      // have refused all of its first iterations' writes), within a bound.
      for (int n = 0; n < kIterations || !stop.load() || (mine.empty() && n < 20 * kIterations);
           ++n) {
        const std::string& peer_id = peer_ids[static_cast<std::size_t>(n + w) % 3];
        if (n % 11 == 0) a.plan().hold_next();
        if (n % 13 == 0 && !stop.load()) a.plan().fail_next_posts(Status::kBackend);
        const std::int64_t k = n % (kBlocksPerWorker - 1);
        const auto id =
            write(a.transport, peer_id, {first + k, first + k + 1}, {first + k, first + k + 1});
        if (id) {
          std::lock_guard lock(mu);
          if (!issued.insert(*id).second) duplicates.push_back(*id);
          mine.push_back(*id);
        }
        record(a.transport.poll(peer_id));
        if (id && n % 5 == 0) {
          const std::vector<TransferId> one{*id};
          (void)a.transport.cancel(one, n % 10 == 0 ? CancelMode::kImmediate : CancelMode::kWait);
        }
        if (n % 7 == 0 && !mine.empty())
          a.plan().land(mine[static_cast<std::size_t>(n) % mine.size()]);
      }
      for (const TransferId id : mine) a.plan().land(id);
    });
  }
  registrar.join();
  for (auto& t : workers) t.join();
  record(a.transport.poll());

  EXPECT_TRUE(duplicates.empty()) << duplicates.size() << " ids issued or reported twice";
  EXPECT_TRUE(unexpected_errors.empty()) << unexpected_errors.front();
  EXPECT_FALSE(issued.empty());
  for (const TransferId id : reported)
    EXPECT_TRUE(issued.contains(id)) << "reported unknown id " << id;
  a.transport.close();
  EXPECT_EQ(a.transport.stats().live, HandleCounts{});
}

TEST(ConcurrencyTest, ConcurrentWritersToOnePeerAllLand) {
  constexpr int kWorkers = 4;
  constexpr std::uint64_t kBlocks = 64;
  Agent b{"agent-b", loopback_options(), kBlocks};
  Agent a{"agent-a", loopback_options(), kBlocks};
  a.pool.fill_pattern(2);
  add_peer(a.transport, "b", b.transport);

  std::vector<std::thread> workers;
  std::atomic<int> done{0};
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      for (std::int64_t k = 0; k < 16; ++k) {
        const std::int64_t block = w * 16 + k;
        const auto id = write(a.transport, "b", {block}, {block});
        if (!id) continue;
        done += static_cast<int>(a.transport.poll("b").done.size());
      }
    });
  }
  for (auto& t : workers) t.join();
  done += static_cast<int>(a.transport.poll("b").done.size());
  EXPECT_EQ(done.load(), 64);
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(kBlocks); ++i) {
    const auto want = a.pool.block(i);
    const auto got = b.pool.block(i);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin(), got.end())) << "block " << i;
  }
}

}  // namespace
}  // namespace kvxfer::unit
