// SPDX-License-Identifier: Apache-2.0
// The fence of the UCX lane (wire/fence.h): round trip, golden bytes, and
// hostile bytes (truncated, extended, wrong magic, version or reserved word,
// zero lineage, gen or epoch) refused.
#include "wire/fence.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace kvxfer::internal::ucx {
namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

std::vector<std::uint8_t> bytes_of(const Fence& f) {
  std::vector<std::uint8_t> out(kFenceLen);
  encode_fence(out.data(), f);
  return out;
}

bool decodes(const std::vector<std::uint8_t>& bytes) {
  Fence f;
  return decode_fence(bytes, &f);
}

const Fence kGood{0x1122334455667788ull, 0x0102030405060708ull, 3, 0xa1a2a3a4a5a6a7a8ull};

TEST(Fence, RoundTrips) {
  for (const Fence in : {kGood, Fence{0, 1, 1, 1}, Fence{kMax, kMax, kMax, kMax}}) {
    Fence out;
    ASSERT_TRUE(decode_fence(bytes_of(in), &out));
    EXPECT_EQ(out.token, in.token);
    EXPECT_EQ(out.lineage, in.lineage);
    EXPECT_EQ(out.gen, in.gen);
    EXPECT_EQ(out.epoch, in.epoch);
  }
}

TEST(Fence, LayoutIsLittleEndianWithMagicKVXF) {
  const std::vector<std::uint8_t> expected = {
      'K',  'V',  'X',  'F',  1,    0,    0,    0,     // magic, version 1, zero
      0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,  // target token
      8,    7,    6,    5,    4,    3,    2,    1,     // lineage
      3,    0,    0,    0,    0,    0,    0,    0,     // gen
      0xa8, 0xa7, 0xa6, 0xa5, 0xa4, 0xa3, 0xa2, 0xa1,  // epoch
  };
  EXPECT_EQ(bytes_of(kGood), expected);
  EXPECT_EQ(kFenceLen, expected.size());
}

TEST(Fence, RefusesEveryTruncationAndExtension) {
  const auto good = bytes_of(kGood);
  for (std::size_t len = 0; len < good.size(); ++len) {
    EXPECT_FALSE(decodes({good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len)})) << len;
  }
  auto longer = good;
  longer.push_back(0);
  EXPECT_FALSE(decodes(longer));
}

TEST(Fence, RefusesWrongMagicVersionOrReservedWord) {
  for (std::size_t at = 0; at < 8; ++at) {
    if (at == 4) continue;  // the version's low byte: checked below
    auto bytes = bytes_of(kGood);
    bytes[at] ^= 0x01;
    EXPECT_FALSE(decodes(bytes)) << "byte " << at;
  }
  for (const std::uint8_t version : {0, 2, 0xff}) {
    auto bytes = bytes_of(kGood);
    bytes[4] = version;
    EXPECT_FALSE(decodes(bytes)) << "version " << int{version};
  }
}

TEST(Fence, RefusesZeroLineageGenOrEpoch) {
  EXPECT_FALSE(decodes(bytes_of(Fence{1, 0, 1, 1})));
  EXPECT_FALSE(decodes(bytes_of(Fence{1, 1, 0, 1})));
  EXPECT_FALSE(decodes(bytes_of(Fence{1, 1, 1, 0})));
}

TEST(Fence, RefusedBytesLeaveTheOutputAlone) {
  Fence out{9, 9, 9, 9};
  auto bytes = bytes_of(kGood);
  bytes[0] = 0;
  EXPECT_FALSE(decode_fence(bytes, &out));
  EXPECT_EQ(out.token, 9u);
  EXPECT_EQ(out.epoch, 9u);
}

}  // namespace
}  // namespace kvxfer::internal::ucx
