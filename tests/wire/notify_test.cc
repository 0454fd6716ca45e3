// SPDX-License-Identifier: Apache-2.0
// The notification header and its ack (wire/notify.h): round trip, golden
// layout, and every malformed variant refused with the output left alone.
#include "wire/notify.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace kvxfer::internal::ucx {
namespace {

std::vector<std::uint8_t> encode(const wire::NotifyHeader& h) {
  std::vector<std::uint8_t> b(wire::notify_header_len(h.name.size()));
  wire::encode_notify_header(b.data(), h);
  return b;
}

TEST(NotifyHeaderTest, RoundTrips) {
  const auto bytes = encode(wire::NotifyHeader{0x1122, 0x3344, 7, 0x5566, 0x7788, "agent-a"});
  ASSERT_EQ(bytes.size(), wire::kNotifyFixedLen + 7);
  wire::NotifyHeader h;
  ASSERT_TRUE(wire::decode_notify_header(bytes, &h));
  EXPECT_EQ(h.token, 0x1122u);
  EXPECT_EQ(h.sequence, 0x3344u);
  EXPECT_EQ(h.slot, 7u);
  EXPECT_EQ(h.lineage, 0x5566u);
  EXPECT_EQ(h.epoch, 0x7788u);
  EXPECT_EQ(h.name, "agent-a");
}

TEST(NotifyHeaderTest, LayoutIsLittleEndianWithTheNameLast) {
  const auto b = encode(wire::NotifyHeader{1, 2, 3, 4, 5, "xy"});
  EXPECT_EQ(b[0], 'K');
  EXPECT_EQ(b[1], 'V');
  EXPECT_EQ(b[2], 'X');
  EXPECT_EQ(b[3], 'N');
  EXPECT_EQ(b[4], wire::kNotifyVersion);
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
  const auto valid = encode(wire::NotifyHeader{1, 2, 3, 4, 5, "name"});
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
  version[4] = wire::kNotifyVersion + 1;
  bad.push_back(version);
  auto reserved = valid;
  reserved[28] = 1;
  bad.push_back(reserved);
  std::vector<std::uint8_t> no_name(valid.begin(), valid.begin() + wire::kNotifyFixedLen);
  no_name[6] = 0;
  bad.push_back(no_name);
  bad.push_back(encode(wire::NotifyHeader{1, 2, 3, 4, 5, std::string(wire::kMaxNotifyName + 1, 'n')}));
  for (std::size_t i = 0; i < bad.size(); ++i) {
    wire::NotifyHeader h{9, 9, 9, 9, 9, "untouched"};
    EXPECT_FALSE(wire::decode_notify_header(bad[i], &h)) << "variant " << i;
    EXPECT_EQ(h.name, "untouched") << "variant " << i;
    EXPECT_EQ(h.token, 9u) << "variant " << i;
  }
  wire::NotifyHeader h;
  EXPECT_TRUE(wire::decode_notify_header(
      encode(wire::NotifyHeader{1, 2, 3, 4, 5, std::string(wire::kMaxNotifyName, 'n')}), &h));
}

std::vector<std::uint8_t> encode(const wire::NotifyAck& a) {
  std::vector<std::uint8_t> b(wire::kAckLen);
  wire::encode_ack(b.data(), a);
  return b;
}

// True when `bytes` is refused as an ack and the output, filled beforehand,
// is left as it was.
bool ack_refused(const std::vector<std::uint8_t>& bytes) {
  wire::NotifyAck a{9, 9, 9};
  if (wire::decode_ack(bytes, &a)) return false;
  return a.slot == 9 && a.sequence == 9 && a.status == 9;
}

TEST(NotifyAckTest, RoundTrips) {
  constexpr std::int32_t kMin = std::numeric_limits<std::int32_t>::min();
  for (const wire::NotifyAck in : {wire::NotifyAck{3, 7, 0}, wire::NotifyAck{0, 0, -25},
                             wire::NotifyAck{0xffffffff, ~0ull, -1}, wire::NotifyAck{1, 2, kMin}}) {
    wire::NotifyAck out;
    ASSERT_TRUE(wire::decode_ack(encode(in), &out));
    EXPECT_EQ(out.slot, in.slot);
    EXPECT_EQ(out.sequence, in.sequence);
    EXPECT_EQ(out.status, in.status);
  }
}

TEST(NotifyAckTest, LayoutIsLittleEndianWithMagicKVXA) {
  const std::vector<std::uint8_t> expected = {
      'K',  'V',  'X',  'A',  0x04, 0x03, 0x02, 0x01,  // magic, slot
      0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,  // sequence
      0xe7, 0xff, 0xff, 0xff, 0,    0,    0,    0,     // status -25, zero
  };
  EXPECT_EQ(encode(wire::NotifyAck{0x01020304, 0x1112131415161718ull, -25}), expected);
  EXPECT_EQ(wire::kAckLen, expected.size());
}

TEST(NotifyAckTest, RefusesEveryOtherLength) {
  const auto good = encode(wire::NotifyAck{3, 7, 0});
  for (std::size_t len = 0; len < good.size(); ++len) {
    EXPECT_TRUE(ack_refused({good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len)}))
        << len;
  }
  auto longer = good;
  longer.push_back(0);
  EXPECT_TRUE(ack_refused(longer));
  auto doubled = good;
  doubled.insert(doubled.end(), good.begin(), good.end());
  EXPECT_TRUE(ack_refused(doubled));
}

TEST(NotifyAckTest, RefusesABadMagic) {
  for (std::size_t at = 0; at < 4; ++at) {
    auto bytes = encode(wire::NotifyAck{3, 7, 0});
    bytes[at] ^= 0x01;
    EXPECT_TRUE(ack_refused(bytes)) << "byte " << at;
  }
  // The other messages' magics.
  auto notify = encode(wire::NotifyAck{3, 7, 0});
  notify[3] = 'N';
  EXPECT_TRUE(ack_refused(notify));
  auto fence = encode(wire::NotifyAck{3, 7, 0});
  fence[3] = 'F';
  EXPECT_TRUE(ack_refused(fence));
}

TEST(NotifyAckTest, RefusesANonzeroReservedWord) {
  for (std::size_t at = 20; at < wire::kAckLen; ++at) {
    auto bytes = encode(wire::NotifyAck{3, 7, 0});
    bytes[at] = 0x80;
    EXPECT_TRUE(ack_refused(bytes)) << "byte " << at;
  }
}

TEST(NotifyAckTest, RefusesANotificationHeader) {
  EXPECT_TRUE(ack_refused(encode(wire::NotifyHeader{1, 2, 3, 4, 5, "a"})));
}

}  // namespace
}  // namespace kvxfer::internal::ucx
