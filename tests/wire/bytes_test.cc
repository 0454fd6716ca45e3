// SPDX-License-Identifier: Apache-2.0
// The little-endian reader and writer every wire format is built on: exact
// byte layout, round trips, soft failure on every short read, and a fixed
// buffer never written past its end.
#include "wire/bytes.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace kvxfer::wire {
namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes one_of_each() {
  Bytes out;
  ByteWriter w(out);
  w.u8(0x01);
  w.u16(0x0302);
  w.u32(0x07060504);
  w.u64(0x0f0e0d0c0b0a0908ull);
  w.i32(-2);
  return out;
}

// --- writer ------------------------------------------------------------------

TEST(ByteWriter, WritesEachWidthLittleEndian) {
  const Bytes expected = {0x01,                                            // u8
                          0x02, 0x03,                                      // u16
                          0x04, 0x05, 0x06, 0x07,                          // u32
                          0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,  // u64
                          0xfe, 0xff, 0xff, 0xff};                         // i32 -2
  EXPECT_EQ(one_of_each(), expected);
}

TEST(ByteWriter, AppendsAfterWhatTheVectorHolds) {
  Bytes out = {0xaa};
  ByteWriter w(out);
  w.u16(0x0201);
  EXPECT_EQ(out, (Bytes{0xaa, 0x01, 0x02}));
  EXPECT_EQ(w.written(), 2u);
  EXPECT_TRUE(w.ok());
}

TEST(ByteWriter, WritesRawAndLengthPrefixedBytes) {
  Bytes out;
  ByteWriter w(out);
  const Bytes payload = {0xc1, 0xc2, 0xc3};
  w.raw(payload);
  w.prefixed(payload);
  w.prefixed({});
  w.raw({});
  EXPECT_EQ(out, (Bytes{0xc1, 0xc2, 0xc3, 0x03, 0, 0, 0, 0xc1, 0xc2, 0xc3, 0, 0, 0, 0}));
  EXPECT_EQ(w.written(), out.size());
}

TEST(ByteWriter, ByteViewOfAStringIsItsCharacters) {
  Bytes out;
  ByteWriter(out).prefixed(byte_view("UCX"));
  EXPECT_EQ(out, (Bytes{3, 0, 0, 0, 'U', 'C', 'X'}));
}

TEST(ByteWriter, FillsAFixedBufferExactly) {
  std::array<std::uint8_t, 6> buffer{};
  ByteWriter w(buffer);
  w.u16(0x0201);
  w.u32(0x06050403);
  EXPECT_TRUE(w.ok());
  EXPECT_EQ(w.written(), 6u);
  EXPECT_EQ(buffer, (std::array<std::uint8_t, 6>{1, 2, 3, 4, 5, 6}));
}

TEST(ByteWriter, NeverWritesPastAFixedBuffer) {
  // The buffer sits inside a larger one whose guard bytes must stay intact.
  std::array<std::uint8_t, 12> storage;
  storage.fill(0xee);
  ByteWriter w{std::span(storage).subspan(2, 6)};
  w.u32(0x04030201);
  w.u32(0x08070605);  // does not fit: nothing written
  EXPECT_FALSE(w.ok());
  w.u16(0x0a09);  // would fit, but the writer has failed: still nothing
  w.raw(Bytes{0x11});
  EXPECT_FALSE(w.ok());
  EXPECT_EQ(w.written(), 4u);
  EXPECT_EQ(storage, (std::array<std::uint8_t, 12>{0xee, 0xee, 1, 2, 3, 4, 0xee, 0xee, 0xee, 0xee,
                                                   0xee, 0xee}));
}

TEST(ByteWriter, RefusesRawBytesLongerThanAFixedBuffer) {
  std::array<std::uint8_t, 2> buffer{};
  ByteWriter w(buffer);
  w.raw(Bytes{1, 2, 3});
  EXPECT_FALSE(w.ok());
  EXPECT_EQ(buffer, (std::array<std::uint8_t, 2>{0, 0}));
}

// --- reader ------------------------------------------------------------------

TEST(ByteReader, ReadsBackWhatTheWriterWrote) {
  const Bytes bytes = one_of_each();
  ByteReader r(bytes);
  EXPECT_EQ(r.u8(), 0x01);
  EXPECT_EQ(r.u16(), 0x0302);
  EXPECT_EQ(r.u32(), 0x07060504u);
  EXPECT_EQ(r.u64(), 0x0f0e0d0c0b0a0908ull);
  EXPECT_EQ(r.i32(), -2);
  EXPECT_TRUE(r.at_end());
  EXPECT_TRUE(r.ok());
}

TEST(ByteReader, RoundTripsExtremeValues) {
  Bytes out;
  ByteWriter w(out);
  w.u64(std::numeric_limits<std::uint64_t>::max());
  w.u32(0);
  w.i32(std::numeric_limits<std::int32_t>::min());
  w.u16(std::numeric_limits<std::uint16_t>::max());
  ByteReader r(out);
  EXPECT_EQ(r.u64(), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(r.u32(), 0u);
  EXPECT_EQ(r.i32(), std::numeric_limits<std::int32_t>::min());
  EXPECT_EQ(r.u16(), std::numeric_limits<std::uint16_t>::max());
  EXPECT_TRUE(r.at_end());
}

TEST(ByteReader, ReadsUnalignedValues) {
  const Bytes bytes = {0xff, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08};
  ByteReader r{std::span(bytes).subspan(1)};
  EXPECT_EQ(r.u64(), 0x0807060504030201ull);
}

TEST(ByteReader, FailsEveryShortReadWithoutConsuming) {
  for (std::size_t len = 0; len < 8; ++len) {
    const Bytes bytes(len, 0x5a);
    if (len < 2) {
      ByteReader r(bytes);
      EXPECT_EQ(r.u16(), std::nullopt) << len;
      EXPECT_FALSE(r.ok());
      EXPECT_EQ(r.position(), 0u);
    }
    if (len < 4) {
      ByteReader r(bytes);
      EXPECT_EQ(r.u32(), std::nullopt) << len;
      EXPECT_EQ(r.i32(), std::nullopt) << len;
      EXPECT_EQ(r.position(), 0u);
    }
    ByteReader r(bytes);
    EXPECT_EQ(r.u64(), std::nullopt) << len;
    EXPECT_EQ(r.take(len + 1), std::nullopt) << len;
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.position(), 0u);
    EXPECT_EQ(r.remaining(), len);
  }
  ByteReader empty(std::span<const std::uint8_t>{});
  EXPECT_EQ(empty.u8(), std::nullopt);
  EXPECT_FALSE(empty.ok());
}

TEST(ByteReader, StaysFailedAfterAShortRead) {
  const Bytes bytes = {1, 2, 3, 4, 5};
  ByteReader r(bytes);
  EXPECT_EQ(r.u64(), std::nullopt);
  EXPECT_EQ(r.u32(), 0x04030201u);  // a later read that fits still reads...
  EXPECT_FALSE(r.ok());             // ...but the decoder's one check sees the failure
}

TEST(ByteReader, TakesViewsIntoItsBytes) {
  const Bytes bytes = {1, 2, 3, 4};
  ByteReader r(bytes);
  const auto first = r.take(3);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->data(), bytes.data());
  EXPECT_EQ(first->size(), 3u);
  EXPECT_EQ(r.remaining(), 1u);
  EXPECT_FALSE(r.at_end());
  const auto none = r.take(0);
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(r.u8(), 4);
  EXPECT_TRUE(r.at_end());
}

TEST(ByteReader, ReadsLengthPrefixedBytesUpToTheMax) {
  const Bytes bytes = {3, 0, 0, 0, 'a', 'b', 'c', 0, 0, 0, 0};
  ByteReader r(bytes);
  const auto abc = r.prefixed(3);
  ASSERT_TRUE(abc.has_value());
  EXPECT_EQ(Bytes(abc->begin(), abc->end()), (Bytes{'a', 'b', 'c'}));
  EXPECT_EQ(abc->data(), bytes.data() + 4);
  const auto empty = r.prefixed(0);
  ASSERT_TRUE(empty.has_value());
  EXPECT_TRUE(empty->empty());
  EXPECT_TRUE(r.at_end());
  EXPECT_TRUE(r.ok());
}

TEST(ByteReader, FailsALengthOverTheMaxEvenWhenTheBytesAreThere) {
  const Bytes bytes = {3, 0, 0, 0, 'a', 'b', 'c'};
  ByteReader r(bytes);
  EXPECT_EQ(r.prefixed(2), std::nullopt);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.position(), 0u);
}

TEST(ByteReader, FailsAHugeLength) {
  const Bytes bytes = {0xff, 0xff, 0xff, 0xff, 'a'};
  ByteReader r(bytes);
  EXPECT_EQ(r.prefixed(std::numeric_limits<std::size_t>::max()), std::nullopt);
  EXPECT_EQ(r.position(), 0u);
}

TEST(ByteReader, FailsEveryTruncationOfLengthPrefixedBytes) {
  const Bytes bytes = {3, 0, 0, 0, 'a', 'b', 'c'};
  for (std::size_t len = 0; len < bytes.size(); ++len) {
    ByteReader r{std::span(bytes).first(len)};
    EXPECT_EQ(r.prefixed(16), std::nullopt) << len;
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.position(), 0u) << len;
  }
}

TEST(ToLittleEndian, IsTheIdentityOnLittleEndianHostsAndASwapElsewhere) {
  const std::uint32_t value = 0x01020304u;
  const std::uint32_t expected = std::endian::native == std::endian::little ? value : 0x04030201u;
  EXPECT_EQ(to_little_endian(value), expected);
  EXPECT_EQ(to_little_endian(to_little_endian(value)), value);
}

}  // namespace
}  // namespace kvxfer::wire
