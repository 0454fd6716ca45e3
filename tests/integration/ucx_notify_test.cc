// SPDX-License-Identifier: Apache-2.0
// Notifications between processes, over shared memory (the same-host lane:
// process_vm_writev, then a datagram on the target's socket) and over TCP
// (the UCX lane: an acked message): a kvxfer_it_target process takes them
// with get_notifications() and checks, as each arrives, that the blocks it
// names already hold their bytes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "it_lanes.h"
#include "it_support.h"
#include "kvxfer/transport.h"

namespace kvxfer::it {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kGen = 1;

class UcxNotifyTest : public ::testing::TestWithParam<std::string> {
 protected:
  void open(std::uint64_t num_blocks, std::uint64_t block_len) {
    TargetOptions t;
    t.num_blocks = num_blocks;
    t.block_len = block_len;
    t.tls = GetParam();
    target_ = std::make_unique<TargetProcess>(t);
    pool_ = std::make_unique<MappedPool>(num_blocks, block_len);
    pool_->fill_generation(kGen);
    Options options;
    options.backends = {"UCX"};
    options.engine_config = with_tls({}, GetParam());
    transport_ = std::make_unique<Transport>("initiator",
                                             Region{pool_->base(), num_blocks, block_len}, options);
    transport_->add_remote_peer("t", target_->metadata(), target_->base_addr(),
                                target_->num_blocks(), target_->block_len());
  }

  std::optional<TransferId> write(const std::vector<std::int64_t>& local,
                                  const std::vector<std::int64_t>& remote,
                                  const std::string& note) {
    const std::vector<std::uint8_t> bytes(note.begin(), note.end());
    return transport_->write_blocks("t", std::span<const std::int64_t>(local),
                                    std::span<const std::int64_t>(remote),
                                    std::span<const std::uint8_t>(bytes));
  }

  // Polls until nothing is in flight (or 30 s); returns done and failed.
  std::pair<std::set<TransferId>, std::set<TransferId>> drain() {
    std::set<TransferId> done;
    std::set<TransferId> failed;
    const auto deadline = Clock::now() + 30s;
    while (transport_->stats().inflight > 0 && Clock::now() < deadline) {
      const PollResult r = transport_->poll("t");
      done.insert(r.done.begin(), r.done.end());
      failed.insert(r.failed.begin(), r.failed.end());
      std::this_thread::sleep_for(100us);
    }
    return {done, failed};
  }

  std::unique_ptr<TargetProcess> target_;
  std::unique_ptr<MappedPool> pool_;
  std::unique_ptr<Transport> transport_;
};

// The notification is never visible before its data: 2000 writes, each
// naming its blocks in its message, checked by the target at arrival.
TEST_P(UcxNotifyTest, EveryNotificationArrivesAfterItsBytesInOrder) {
  constexpr std::size_t kWrites = 2000;
  constexpr std::size_t kPerWrite = 2;
  constexpr std::uint64_t kBlocks = kWrites * kPerWrite;
  open(kBlocks, 4096);
  target_->post("watch " + std::to_string(kWrites) + " " + std::to_string(kGen));
  std::mt19937_64 rng(21);
  const auto remote_all = random_sample(rng, kBlocks, kBlocks);  // every block written once
  std::set<TransferId> posted;
  std::set<TransferId> done;
  for (std::size_t w = 0; w < kWrites; ++w) {
    const auto local = random_sample(rng, kBlocks, kPerWrite);
    const std::vector<std::int64_t> remote(
        remote_all.begin() + static_cast<std::ptrdiff_t>(w * kPerWrite),
        remote_all.begin() + static_cast<std::ptrdiff_t>((w + 1) * kPerWrite));
    std::string note = std::to_string(w);
    for (std::size_t i = 0; i < kPerWrite; ++i) {
      note += ' ' + std::to_string(local[i]) + ' ' + std::to_string(remote[i]);
    }
    // At most 32 in flight, so the messages also race the target's handler.
    while (posted.size() - done.size() >= 32) {
      const PollResult r = transport_->poll("t");
      ASSERT_TRUE(r.failed.empty());
      done.insert(r.done.begin(), r.done.end());
    }
    const auto id = write(local, remote, note);
    ASSERT_TRUE(id.has_value());
    posted.insert(*id);
  }
  const auto [rest, failed] = drain();
  done.insert(rest.begin(), rest.end());
  EXPECT_EQ(done, posted);
  EXPECT_TRUE(failed.empty());
  // Between hosts, messages arrive in the order the writes were posted (one
  // endpoint, acks in order). On the same host each is sent when its copy
  // ends, and copiers finish transfers in any order: its sender's completion
  // order, which the test cannot know; the bytes are there all the same.
  const std::string watched = target_->reply();
  if (remote_lane(GetParam())) {
    EXPECT_EQ(watched, "watched 2000 bad=0 out_of_order=0");
  } else {
    EXPECT_EQ(watched.substr(0, watched.find(" out_of_order")), "watched 2000 bad=0");
  }
  const auto counters = transport_->stats().engine_counters;
  EXPECT_EQ(counters.at(lane_counter(GetParam(), "notifications_sent")), kWrites);
}

TEST_P(UcxNotifyTest, SendNotificationAndReadNotifyReachTheTarget) {
  open(64, 4096);
  const std::string hello = "hello";
  const auto id = transport_->send_notification(
      "t", std::span(reinterpret_cast<const std::uint8_t*>(hello.data()), hello.size()));
  ASSERT_TRUE(id);
  const std::vector<std::int64_t> local{1, 2};
  const std::vector<std::int64_t> remote{3, 4};
  const std::string note = "read";
  const auto rid = transport_->read_blocks(
      "t", std::span<const std::int64_t>(local), std::span<const std::int64_t>(remote),
      std::span(reinterpret_cast<const std::uint8_t*>(note.data()), note.size()));
  ASSERT_TRUE(rid);
  const auto [done, failed] = drain();
  EXPECT_EQ(done, (std::set<TransferId>{*id, *rid}));
  // Over TCP in posting order; on the same host in completion order.
  const std::string notes = target_->request("notes");
  if (remote_lane(GetParam())) {
    EXPECT_EQ(notes, "notes 2 initiator=hello initiator=read");
  } else {
    EXPECT_TRUE(notes == "notes 2 initiator=hello initiator=read" ||
                notes == "notes 2 initiator=read initiator=hello")
        << notes;
  }
  EXPECT_EQ(target_->request("notes"), "notes 0");
}

// Exactly once: under immediate cancels, every transfer reported done
// delivered its message once, and nothing is delivered twice.
TEST_P(UcxNotifyTest, CancelledTransfersDeliverAtMostOnceAndDoneOnesExactlyOnce) {
  open(256, 16 * 1024);
  std::mt19937_64 rng(5);
  std::set<TransferId> cancelled;
  std::map<TransferId, std::string> note_of;
  for (int w = 0; w < 200; ++w) {
    const std::string note = "w" + std::to_string(w);
    const auto id = write(random_sample(rng, 256, 4), random_sample(rng, 256, 4), note);
    ASSERT_TRUE(id);
    note_of[*id] = note;
    if (w % 2 == 0) {
      const std::vector<TransferId> one{*id};
      EXPECT_TRUE(transport_->cancel(one, CancelMode::kImmediate).empty());
      cancelled.insert(*id);
    }
  }
  const auto [done, failed] = drain();
  EXPECT_TRUE(failed.empty());
  std::this_thread::sleep_for(200ms);  // anything still on the wire arrives
  const std::string notes = target_->request("notes");
  std::multiset<std::string> delivered;
  std::istringstream in(notes);
  std::string word;
  in >> word >> word;  // "notes <count>"
  while (in >> word) delivered.insert(word.substr(word.find('=') + 1));
  for (const auto& [id, note] : note_of) {
    EXPECT_LE(delivered.count(note), 1u) << note;
    if (done.count(id) != 0) {
      EXPECT_EQ(delivered.count(note), 1u) << note;
    }
  }
  for (const TransferId id : done) EXPECT_EQ(cancelled.count(id), 0u);
}

// A target whose owner does not take its notifications holds a bounded
// number (over TCP, on the tcp lane, kMaxQueuedNotificationsPerSender from
// one sender; on the same host what its socket buffer holds); the rest are
// refused and their transfers fail.
TEST_P(UcxNotifyTest, AFloodIsBoundedAtTheTarget) {
  open(16, 4096);
  const std::string m = "m";
  const std::span<const std::uint8_t> message(reinterpret_cast<const std::uint8_t*>(m.data()), 1);
  std::size_t done = 0;
  std::size_t failed = 0;
  std::size_t posted = 0;
  const std::size_t total =
      (remote_lane(GetParam()) ? kMaxQueuedNotificationsPerSender : kMaxQueuedNotifications) + 64;
  const auto deadline = Clock::now() + 60s;
  while (done + failed < total && Clock::now() < deadline) {
    while (posted < total && posted - done - failed < 256) {
      if (!transport_->send_notification("t", message)) break;
      ++posted;
    }
    const PollResult r = transport_->poll("t");
    done += r.done.size();
    failed += r.failed.size();
    if (r.peer_fault) break;  // refusals strike the peer
  }
  const auto [rest, rest_failed] = drain();
  done += rest.size();
  failed += rest_failed.size();
  if (remote_lane(GetParam())) {
    EXPECT_EQ(done, kMaxQueuedNotificationsPerSender);
  } else {
    EXPECT_GT(done, 100u);
    EXPECT_LE(done, kMaxQueuedNotifications);
  }
  EXPECT_GT(failed, 0u);
  const std::string notes = target_->request("notes");
  EXPECT_EQ(notes.substr(0, notes.find(' ', 6)), "notes " + std::to_string(done));
}

TEST_P(UcxNotifyTest, ASigkilledTargetFailsTheTransfersAndTheInitiatorGoesOn) {
  open(64, 64 * 1024);
  std::mt19937_64 rng(9);
  std::set<TransferId> posted;
  for (int w = 0; w < 16; ++w) {
    const auto id = write(random_sample(rng, 64, 4), random_sample(rng, 64, 4), "x");
    if (id) posted.insert(*id);
  }
  target_->kill9();
  const auto [done, failed] = drain();
  std::set<TransferId> reported = done;
  reported.insert(failed.begin(), failed.end());
  EXPECT_EQ(reported, posted);
  transport_->remove_remote_peer("t");
  EXPECT_EQ(transport_->stats().live.requests, 0u);
  EXPECT_EQ(transport_->stats().live.transfers, 0u);
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxNotifyTest, ::testing::Values("sm,self", "tcp", "ucx"),
                         [](const ::testing::TestParamInfo<std::string>& tls) {
                           return tls.param == "sm,self" ? std::string("sm") : tls.param;
                         });

}  // namespace
}  // namespace kvxfer::it
