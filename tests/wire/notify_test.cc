// SPDX-License-Identifier: Apache-2.0
// The notification header (wire/notify.h): round trip, golden layout, and
// every malformed variant refused with the output left alone.
#include "wire/notify.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvxfer::internal::ucx {
namespace {

std::vector<std::uint8_t> encode(const NotifyHeader& h) {
  std::vector<std::uint8_t> b(notify_header_len(h.name.size()));
  encode_notify_header(b.data(), h);
  return b;
}

TEST(NotifyHeaderTest, RoundTrips) {
  const auto bytes = encode(NotifyHeader{0x1122, 0x3344, 7, 0x5566, 0x7788, "agent-a"});
  ASSERT_EQ(bytes.size(), kNotifyFixedLen + 7);
  NotifyHeader h;
  ASSERT_TRUE(decode_notify_header(bytes, &h));
  EXPECT_EQ(h.token, 0x1122u);
  EXPECT_EQ(h.sequence, 0x3344u);
  EXPECT_EQ(h.slot, 7u);
  EXPECT_EQ(h.lineage, 0x5566u);
  EXPECT_EQ(h.epoch, 0x7788u);
  EXPECT_EQ(h.name, "agent-a");
}

TEST(NotifyHeaderTest, LayoutIsLittleEndianWithTheNameLast) {
  const auto b = encode(NotifyHeader{1, 2, 3, 4, 5, "xy"});
  EXPECT_EQ(b[0], 'K');
  EXPECT_EQ(b[1], 'V');
  EXPECT_EQ(b[2], 'X');
  EXPECT_EQ(b[3], 'N');
  EXPECT_EQ(b[4], kNotifyVersion);
  EXPECT_EQ(b[6], 2);  // name length
  EXPECT_EQ(b[8], 1);  // token
  EXPECT_EQ(b[16], 2);
  EXPECT_EQ(b[24], 3);
  EXPECT_EQ(b[32], 4);
  EXPECT_EQ(b[40], 5);
  EXPECT_EQ(b[48], 'x');
  EXPECT_EQ(b[49], 'y');
}

TEST(NotifyHeaderTest, MalformedHeadersAreRefusedAndLeaveTheOutputAlone) {
  const auto valid = encode(NotifyHeader{1, 2, 3, 4, 5, "name"});
  std::vector<std::vector<std::uint8_t>> bad;
  bad.emplace_back();                                   // empty
  bad.emplace_back(valid.begin(), valid.end() - 1);     // name cut
  bad.emplace_back(valid.begin(), valid.begin() + 47);  // fixed part cut
  auto longer = valid;
  longer.push_back('!');
  bad.push_back(longer);
  auto magic = valid;
  magic[0] ^= 1;
  bad.push_back(magic);
  auto version = valid;
  version[4] = kNotifyVersion + 1;
  bad.push_back(version);
  auto reserved = valid;
  reserved[28] = 1;
  bad.push_back(reserved);
  std::vector<std::uint8_t> no_name(valid.begin(), valid.begin() + kNotifyFixedLen);
  no_name[6] = 0;
  bad.push_back(no_name);
  bad.push_back(encode(NotifyHeader{1, 2, 3, 4, 5, std::string(kMaxNotifyName + 1, 'n')}));
  for (std::size_t i = 0; i < bad.size(); ++i) {
    NotifyHeader h{9, 9, 9, 9, 9, "untouched"};
    EXPECT_FALSE(decode_notify_header(bad[i], &h)) << "variant " << i;
    EXPECT_EQ(h.name, "untouched") << "variant " << i;
    EXPECT_EQ(h.token, 9u) << "variant " << i;
  }
  NotifyHeader h;
  EXPECT_TRUE(decode_notify_header(
      encode(NotifyHeader{1, 2, 3, 4, 5, std::string(kMaxNotifyName, 'n')}), &h));
}

}  // namespace
}  // namespace kvxfer::internal::ucx
