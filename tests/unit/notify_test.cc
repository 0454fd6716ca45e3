// SPDX-License-Identifier: Apache-2.0
// Notifications: a write or read with `notify`, and send_notification, put
// a message in the peer's get_notifications() once the transfer's bytes are
// in place, never before, exactly once, and never for a transfer that failed
// or was cancelled before its bytes landed.
#include <gtest/gtest.h>

#include <string>

#include "agents.h"

namespace kvxfer::unit {
namespace {

std::vector<std::uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }

std::vector<std::vector<std::uint8_t>> one(std::vector<std::uint8_t> message) {
  return {std::move(message)};
}

using Notes = std::map<std::string, std::vector<std::vector<std::uint8_t>>>;

class NotifyTest : public LoopbackTest {
 protected:
  std::optional<TransferId> write_note(std::string_view peer_id, std::vector<std::int64_t> local,
                                       std::vector<std::int64_t> remote, const std::string& note) {
    const auto message = bytes(note);
    return a.transport.write_blocks(peer_id, std::span<const std::int64_t>(local),
                                    std::span<const std::int64_t>(remote),
                                    std::span<const std::uint8_t>(message));
  }
  std::optional<TransferId> read_note(std::string_view peer_id, std::vector<std::int64_t> local,
                                      std::vector<std::int64_t> remote, const std::string& note) {
    const auto message = bytes(note);
    return a.transport.read_blocks(peer_id, std::span<const std::int64_t>(local),
                                   std::span<const std::int64_t>(remote),
                                   std::span<const std::uint8_t>(message));
  }
};

TEST_F(NotifyTest, AWriteDeliversItsNotificationWithItsBytes) {
  const auto id = write_note("b", {1, 2}, {3, 4}, "blocks 3,4");
  ASSERT_TRUE(id);
  const Notes notes = b.transport.get_notifications();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes.at("agent-a"), one(bytes("blocks 3,4")));
  EXPECT_TRUE(landed(b, 3, 1));
  EXPECT_TRUE(landed(b, 4, 2));
  EXPECT_EQ(poll("b").done, ids({*id}));
  // Each message is handed out once.
  EXPECT_TRUE(b.transport.get_notifications().empty());
  // And only to the peer it was for.
  EXPECT_TRUE(c.transport.get_notifications().empty());
  EXPECT_TRUE(a.transport.get_notifications().empty());
}

TEST_F(NotifyTest, AReadDeliversItsNotificationToThePeerReadFrom) {
  b.pool.fill_pattern(9);
  const auto id = read_note("b", {0}, {5}, "read 5");
  ASSERT_TRUE(id);
  EXPECT_EQ(b.transport.get_notifications().at("agent-a"), one(bytes("read 5")));
  EXPECT_EQ(poll("b").done, ids({*id}));
}

TEST_F(NotifyTest, SendNotificationAloneIsATransferOfNoBlocks) {
  const auto message = bytes("hello");
  const auto id = a.transport.send_notification("b", message);
  ASSERT_TRUE(id);
  EXPECT_EQ(poll("b").done, ids({*id}));
  EXPECT_EQ(b.transport.get_notifications().at("agent-a"), one(bytes("hello")));
  EXPECT_TRUE(untouched(b));
}

TEST_F(NotifyTest, NotificationsKeepTheirSendersOrder) {
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(write_note("b", {i % 8}, {i % 8}, "n" + std::to_string(i)));
  }
  const auto notes = b.transport.get_notifications().at("agent-a");
  ASSERT_EQ(notes.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(notes[i], bytes("n" + std::to_string(i)));
}

TEST_F(NotifyTest, TheNotificationOfAHeldWriteWaitsForItsBytes) {
  plan().hold_next();
  const auto id = write_note("b", {1}, {2}, "later");
  ASSERT_TRUE(id);
  EXPECT_TRUE(b.transport.get_notifications().empty());
  EXPECT_TRUE(untouched(b));
  plan().land(*id);
  EXPECT_EQ(b.transport.get_notifications().at("agent-a"), one(bytes("later")));
  EXPECT_TRUE(landed(b, 2, 1));
}

TEST_F(NotifyTest, AFailedPostDeliversNothing) {
  plan().fail_next_posts(Status::kBackend);
  EXPECT_FALSE(write_note("b", {1}, {2}, "never"));
  EXPECT_TRUE(b.transport.get_notifications().empty());
}

TEST_F(NotifyTest, ATransferThatFailsDeliversNothing) {
  plan().hold_next();
  const auto id = write_note("b", {1}, {2}, "never");
  ASSERT_TRUE(id);
  plan().finish_with(*id, Status::kBackend);
  EXPECT_EQ(poll("b").failed, ids({*id}));
  EXPECT_TRUE(b.transport.get_notifications().empty());
}

TEST_F(NotifyTest, AWriteCancelledBeforeItLandsDeliversNothing) {
  plan().hold_next();
  const auto id = write_note("b", {1}, {2}, "never");
  ASSERT_TRUE(id);
  EXPECT_TRUE(cancel({*id}, CancelMode::kImmediate).empty());
  plan().land(*id);  // the WRITE still lands (as a cancelled write may)...
  EXPECT_TRUE(landed(b, 2, 1));
  EXPECT_TRUE(b.transport.get_notifications().empty());  // ...but says nothing
}

TEST_F(NotifyTest, AHeldNotificationCancelledIsNeverDelivered) {
  plan().hold_next();
  const auto message = bytes("never");
  const auto id = a.transport.send_notification("b", message);
  ASSERT_TRUE(id);
  EXPECT_TRUE(cancel({*id}, CancelMode::kImmediate).empty());
  plan().land(*id);
  EXPECT_TRUE(b.transport.get_notifications().empty());
}

TEST_F(NotifyTest, RemovingThePeerDropsTheNotificationOfAWriteInFlight) {
  plan().hold_next();
  const auto id = write_note("b", {1}, {2}, "never");
  ASSERT_TRUE(id);
  a.transport.remove_remote_peer("b");
  plan().land(*id);
  EXPECT_TRUE(b.transport.get_notifications().empty());
}

TEST_F(NotifyTest, BadMessagesThrowBeforeAnythingIsPosted) {
  const std::vector<std::uint8_t> too_long(kMaxNotificationBytes + 1, 'x');
  const std::vector<std::int64_t> first{0};
  EXPECT_THROW((void)a.transport.write_blocks("b", first, first, too_long), std::invalid_argument);
  EXPECT_THROW((void)a.transport.read_blocks("b", first, first, too_long), std::invalid_argument);
  EXPECT_THROW((void)a.transport.send_notification("b", too_long), std::invalid_argument);
  EXPECT_THROW((void)a.transport.send_notification("b", {}), std::invalid_argument);
  EXPECT_TRUE(untouched(b));
  EXPECT_EQ(peer("b").strikes, 0);
  // The largest message goes.
  const std::vector<std::uint8_t> largest(kMaxNotificationBytes, 'y');
  EXPECT_TRUE(a.transport.send_notification("b", largest));
  EXPECT_EQ(b.transport.get_notifications().at("agent-a"), one(largest));
}

TEST_F(NotifyTest, UnknownPeerIsNullopt) {
  EXPECT_FALSE(a.transport.send_notification("nobody", bytes("x")));
}

TEST_F(NotifyTest, AFullQueueRefusesAndFailsTheTransfer) {
  const auto message = bytes("m");
  std::vector<TransferId> sent;
  for (std::size_t i = 0; i < kMaxQueuedNotifications; ++i) {
    const auto id = a.transport.send_notification("b", message);
    ASSERT_TRUE(id);
    sent.push_back(*id);
  }
  const auto over = a.transport.send_notification("b", message);
  ASSERT_TRUE(over);
  const PollResult r = poll("b");
  EXPECT_EQ(r.done.size(), kMaxQueuedNotifications);
  EXPECT_EQ(r.failed, ids({*over}));
  EXPECT_EQ(b.transport.get_notifications().at("agent-a").size(), kMaxQueuedNotifications);
  // Drained, the queue takes messages again.
  const auto again = a.transport.send_notification("b", message);
  ASSERT_TRUE(again);
  EXPECT_EQ(poll("b").done, ids({*again}));
}

TEST_F(NotifyTest, GetNotificationsAfterCloseThrows) {
  b.transport.close();
  EXPECT_THROW((void)b.transport.get_notifications(), std::logic_error);
}

}  // namespace
}  // namespace kvxfer::unit
