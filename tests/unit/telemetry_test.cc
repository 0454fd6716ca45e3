// SPDX-License-Identifier: Apache-2.0
// Telemetry: with Options::telemetry on, every finished transfer leaves one
// record (done, failed or cancelled) in a bounded ring that drops its
// oldest and counts them; off, telemetry() is always empty.
#include "kvxfer/telemetry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "agents.h"

namespace kvxfer::unit {
namespace {

Options telemetry_options(std::size_t capacity = 64) {
  Options options = loopback_options();
  options.telemetry = true;
  options.telemetry_capacity = capacity;
  return options;
}

// Polls "b" until `expected` transfers are reported.
void drain(Transport& t, std::size_t expected) {
  std::size_t reported = 0;
  for (int i = 0; i < 1000 && reported < expected; ++i) {
    const PollResult r = t.poll("b");
    reported += r.done.size() + r.failed.size();
  }
  ASSERT_EQ(reported, expected);
}

std::vector<TransferId> ids_of(const Telemetry& t) {
  std::vector<TransferId> out;
  for (const TransferRecord& r : t.records) out.push_back(r.id);
  return out;
}

class TelemetryTest : public ::testing::Test {
 protected:
  TelemetryTest() {
    a.pool.fill_pattern(1);
    add_peer(a.transport, "b", b.transport);
  }
  Agent b{"agent-b"};
  Agent a{"agent-a", telemetry_options()};
};

TEST_F(TelemetryTest, EveryDoneTransferLeavesOneRecord) {
  std::vector<TransferId> posted;
  for (std::int64_t i = 0; i < 5; ++i)
    posted.push_back(*write(a.transport, "b", {i, i + 8}, {i, i + 8}));
  const std::vector<std::int64_t> local{20};
  const std::vector<std::int64_t> remote{3};
  posted.push_back(*a.transport.read_blocks("b", std::span<const std::int64_t>(local),
                                            std::span<const std::int64_t>(remote)));
  const std::vector<std::uint8_t> note{7};
  posted.push_back(*a.transport.send_notification("b", note));
  drain(a.transport, 7);

  const Telemetry t = a.transport.telemetry();
  EXPECT_EQ(t.dropped, 0u);
  ASSERT_EQ(t.records.size(), 7u);
  std::vector<TransferId> got = ids_of(t);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, posted);
  for (const TransferRecord& r : t.records) {
    EXPECT_EQ(r.peer, "b");
    EXPECT_EQ(r.result, TransferResult::kDone);
    EXPECT_LE(r.posted, r.completed);
    EXPECT_EQ(r.lane, "");  // the loopback engine has no lanes
    if (r.id == posted[5]) {
      EXPECT_EQ(r.op, TransferOp::kRead);
      EXPECT_EQ(r.blocks, 1u);
      EXPECT_EQ(r.bytes, kBlockLen);
    } else if (r.id == posted[6]) {
      EXPECT_EQ(r.op, TransferOp::kNotify);
      EXPECT_EQ(r.blocks, 0u);
    } else {
      EXPECT_EQ(r.op, TransferOp::kWrite);
      EXPECT_EQ(r.blocks, 2u);
      EXPECT_EQ(r.bytes, 2 * kBlockLen);
    }
  }
  // Each record is handed out once.
  EXPECT_TRUE(a.transport.telemetry().records.empty());
}

TEST_F(TelemetryTest, FailedAndCancelledTransfersAreRecordedAsSuch) {
  const auto failed = write(a.transport, "b", {1}, {1});
  ASSERT_TRUE(failed);
  a.plan().finish_with(*failed, Status::kBackend);
  drain(a.transport, 1);
  a.plan().hold_next(2);
  const auto cancelled = write(a.transport, "b", {2}, {2});
  const auto dropped_with_peer = write(a.transport, "b", {3}, {3});
  ASSERT_TRUE(cancelled && dropped_with_peer);
  const TransferId to_cancel[] = {*cancelled};
  EXPECT_TRUE(a.transport.cancel(to_cancel).empty());
  a.transport.remove_remote_peer("b");

  const Telemetry t = a.transport.telemetry();
  ASSERT_EQ(t.records.size(), 3u);
  EXPECT_EQ(ids_of(t), ids({*failed, *cancelled, *dropped_with_peer}));
  EXPECT_EQ(t.records[0].result, TransferResult::kFailed);
  EXPECT_EQ(t.records[1].result, TransferResult::kCancelled);
  // Settled with its peer: it had not landed, so it failed.
  EXPECT_EQ(t.records[2].result, TransferResult::kFailed);
  EXPECT_EQ(t.records[2].peer, "b");  // the peer is gone; its id stays
}

TEST(TelemetryRingTest, AFullRingDropsTheOldestAndCountsThem) {
  Agent b{"agent-b"};
  Agent a{"agent-a", telemetry_options(3)};
  add_peer(a.transport, "b", b.transport);
  std::vector<TransferId> posted;
  for (std::int64_t i = 0; i < 5; ++i) {
    posted.push_back(*write(a.transport, "b", {i}, {i}));
    drain(a.transport, 1);
  }

  const Telemetry t = a.transport.telemetry();
  EXPECT_EQ(t.dropped, 2u);
  EXPECT_EQ(ids_of(t), ids({posted[2], posted[3], posted[4]}));
  const Telemetry again = a.transport.telemetry();
  EXPECT_EQ(again.dropped, 0u);
  EXPECT_TRUE(again.records.empty());
}

TEST(TelemetryOffTest, OffMeansEmpty) {
  Agent b{"agent-b"};
  Agent a{"agent-a"};
  add_peer(a.transport, "b", b.transport);
  for (std::int64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(write(a.transport, "b", {i}, {i}));
    drain(a.transport, 1);
  }
  const Telemetry t = a.transport.telemetry();
  EXPECT_TRUE(t.records.empty());
  EXPECT_EQ(t.dropped, 0u);
}

TEST(TelemetryOptionsTest, ACapacityOutOfRangeIsRefusedAndCloseEndsReading) {
  EXPECT_THROW(Agent("agent-a", telemetry_options(0)), std::invalid_argument);
  EXPECT_THROW(Agent("agent-a", telemetry_options(kMaxTelemetryCapacity + 1)),
               std::invalid_argument);
  Agent a{"agent-a", telemetry_options(1)};
  a.transport.close();
  EXPECT_THROW((void)a.transport.telemetry(), std::logic_error);
}

}  // namespace
}  // namespace kvxfer::unit
