// SPDX-License-Identifier: Apache-2.0
// Inbox (engines/inbox.h): the tcp and ucx lanes' notification queue. Each
// sender's share is bounded, senders without a share of their own are
// bounded together, taking empties every share, and the lane's filter
// drops what it refuses without losing the rest.
#include "engines/inbox.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace kvxfer::internal {
namespace {

Notification note(const std::string& from, std::uint8_t byte) { return Notification{from, {byte}}; }

TEST(InboxTest, EachSenderQueuesAtMostItsShare) {
  Inbox<std::string> inbox(/*per_sender=*/3, /*shared=*/100);
  for (std::uint8_t i = 0; i < 3; ++i) EXPECT_TRUE(inbox.offer("a", false, note("a", i)));
  EXPECT_FALSE(inbox.offer("a", false, note("a", 9)));
  EXPECT_TRUE(inbox.offer("b", false, note("b", 0)));  // another sender still has room
  std::vector<Notification> out;
  EXPECT_EQ(inbox.take(&out, [](const Notification&, const std::string&) { return true; }), 0u);
  ASSERT_EQ(out.size(), 4u);
  for (std::uint8_t i = 0; i < 3; ++i) {  // oldest first, the refused one absent
    EXPECT_EQ(out[i].agent, "a");
    EXPECT_EQ(out[i].bytes, std::vector<std::uint8_t>{i});
  }
  EXPECT_EQ(out[3].agent, "b");
  // Taking emptied the share: "a" may queue again.
  EXPECT_TRUE(inbox.offer("a", false, note("a", 7)));
}

TEST(InboxTest, SendersWithoutAShareOfTheirOwnAreBoundedTogether) {
  Inbox<std::string> inbox(/*per_sender=*/10, /*shared=*/4);
  for (int s = 0; s < 4; ++s) {
    const std::string from = "s" + std::to_string(s);
    EXPECT_TRUE(inbox.offer(from, false, note(from, 0)));
  }
  EXPECT_FALSE(inbox.offer("s9", false, note("s9", 0)));
  // A sender with its own share is not crowded out by them...
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(inbox.offer("mine", true, note("mine", 0)));
  // ...and is still bounded by its share.
  EXPECT_FALSE(inbox.offer("mine", true, note("mine", 0)));
  EXPECT_EQ(inbox.size(), 14u);
  std::vector<Notification> out;
  inbox.take(&out, [](const Notification&, const std::string&) { return true; });
  EXPECT_EQ(out.size(), 14u);
  EXPECT_EQ(inbox.size(), 0u);
  EXPECT_TRUE(inbox.offer("s9", false, note("s9", 0)));  // the shared room is back
}

TEST(InboxTest, WhatTheFilterRefusesIsDroppedAndCountedTheRestHandedOut) {
  Inbox<std::pair<std::string, int>> inbox(/*per_sender=*/10, /*shared=*/10);
  ASSERT_TRUE(inbox.offer({"p", 1}, false, note("p", 1)));
  ASSERT_TRUE(inbox.offer({"p", 2}, false, note("p", 2)));
  ASSERT_TRUE(inbox.offer({"q", 1}, true, note("q", 3)));
  std::vector<Notification> out;
  const std::size_t dropped =
      inbox.take(&out, [](const Notification&, const std::pair<std::string, int>& s) {
        return s.second == 1;  // ("p", 2) is no longer who it said
      });
  EXPECT_EQ(dropped, 1u);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].bytes, std::vector<std::uint8_t>{1});
  EXPECT_EQ(out[1].bytes, std::vector<std::uint8_t>{3});
}

TEST(InboxTest, ARefusedFirstOfferLeavesNoShareBehind) {
  Inbox<int> inbox(/*per_sender=*/2, /*shared=*/1);
  ASSERT_TRUE(inbox.offer(1, false, note("x", 0)));
  // Sender 2 is refused by the shared bound; it must not keep an entry that
  // later counts against it once room is back.
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(inbox.offer(2, false, note("y", 0)));
  std::vector<Notification> out;
  inbox.take(&out, [](const Notification&, int) { return true; });
  EXPECT_TRUE(inbox.offer(2, false, note("y", 0)));
}

TEST(InboxTest, OffersAndTakesFromTwoThreadsLoseNothing) {
  Inbox<int> inbox(/*per_sender=*/1'000'000, /*shared=*/1'000'000);
  constexpr int kNotes = 20'000;
  std::thread sender([&] {
    for (int i = 0; i < kNotes; ++i) ASSERT_TRUE(inbox.offer(i % 7, false, note("s", 0)));
  });
  std::size_t taken = 0;
  std::vector<Notification> out;
  while (taken < kNotes) {
    out.clear();
    inbox.take(&out, [](const Notification&, int) { return true; });
    taken += out.size();
  }
  sender.join();
  EXPECT_EQ(taken, static_cast<std::size_t>(kNotes));
}

}  // namespace
}  // namespace kvxfer::internal
