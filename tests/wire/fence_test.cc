// SPDX-License-Identifier: Apache-2.0
// The fence of the UCX lane (wire/fence.h): round trip with the sender's
// name, golden bytes, and hostile bytes (truncated, extended, wrong magic or
// version, a version-1 fence, an empty, too long or lying name length, zero
// lineage, gen or epoch) refused with the output left alone.
#include "wire/fence.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace kvxfer::internal::ucx {
namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

std::vector<std::uint8_t> bytes_of(const wire::Fence& f) {
  std::vector<std::uint8_t> out(wire::fence_len(f.name.size()));
  wire::encode_fence(out.data(), f);
  return out;
}

// True when `bytes` is refused and the output, filled beforehand, is left
// as it was.
bool refused(const std::vector<std::uint8_t>& bytes) {
  wire::Fence f{9, 9, 9, 9, "untouched"};
  if (wire::decode_fence(bytes, &f)) return false;
  return f.token == 9 && f.lineage == 9 && f.gen == 9 && f.epoch == 9 && f.name == "untouched";
}

const wire::Fence kGood{0x1122334455667788ull, 0x0102030405060708ull, 3, 0xa1a2a3a4a5a6a7a8ull, "ab"};

TEST(Fence, RoundTripsWithTheName) {
  const std::string longest(wire::kMaxFenceName, 'n');
  for (const wire::Fence in : {kGood, wire::Fence{0, 1, 1, 1, "a"}, wire::Fence{kMax, kMax, kMax, kMax, longest},
                         wire::Fence{5, 6, 7, 8, "initiator-agent"}}) {
    const auto bytes = bytes_of(in);
    ASSERT_EQ(bytes.size(), wire::kFenceFixedLen + in.name.size());
    wire::Fence out;
    ASSERT_TRUE(wire::decode_fence(bytes, &out)) << in.name;
    EXPECT_EQ(out.token, in.token);
    EXPECT_EQ(out.lineage, in.lineage);
    EXPECT_EQ(out.gen, in.gen);
    EXPECT_EQ(out.epoch, in.epoch);
    EXPECT_EQ(out.name, in.name);
    // The name is a view of the decoded bytes, not a copy.
    EXPECT_EQ(reinterpret_cast<const std::uint8_t*>(out.name.data()),
              bytes.data() + wire::kFenceFixedLen);
  }
}

TEST(Fence, LayoutIsLittleEndianWithMagicKVXFAndTheNameLast) {
  const std::vector<std::uint8_t> expected = {
      'K',  'V',  'X',  'F',  2,    0,    2,    0,     // magic, version 2, name length
      0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,  // target token
      8,    7,    6,    5,    4,    3,    2,    1,     // lineage
      3,    0,    0,    0,    0,    0,    0,    0,     // gen
      0xa8, 0xa7, 0xa6, 0xa5, 0xa4, 0xa3, 0xa2, 0xa1,  // epoch
      'a',  'b',                                       // name
  };
  EXPECT_EQ(bytes_of(kGood), expected);
  EXPECT_EQ(wire::kFenceFixedLen, expected.size() - 2);
  EXPECT_EQ(wire::fence_len(2), expected.size());
}

TEST(Fence, RefusesEveryTruncationAndExtension) {
  const auto good = bytes_of(kGood);
  for (std::size_t len = 0; len < good.size(); ++len) {
    EXPECT_TRUE(refused({good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len)})) << len;
  }
  auto longer = good;
  longer.push_back('c');
  EXPECT_TRUE(refused(longer));
}

TEST(Fence, RefusesWrongMagicOrVersion) {
  for (std::size_t at = 0; at < 4; ++at) {
    auto bytes = bytes_of(kGood);
    bytes[at] ^= 0x01;
    EXPECT_TRUE(refused(bytes)) << "byte " << at;
  }
  for (const std::uint16_t version : {0, 1, 3, 0x0102, 0xffff}) {
    auto bytes = bytes_of(kGood);
    bytes[4] = static_cast<std::uint8_t>(version);
    bytes[5] = static_cast<std::uint8_t>(version >> 8);
    EXPECT_TRUE(refused(bytes)) << "version " << version;
  }
}

TEST(Fence, RefusesAVersion1Fence) {
  // As version 1 wrote it: 40 bytes, a zero where version 2 keeps the name
  // length, no name.
  auto v1 = bytes_of(kGood);
  v1.resize(wire::kFenceFixedLen);
  v1[4] = 1;
  v1[6] = 0;
  EXPECT_TRUE(refused(v1));
}

TEST(Fence, RefusesAnEmptyTooLongOrLyingName) {
  // Empty: the fixed part alone, its name length zero.
  auto empty = bytes_of(kGood);
  empty.resize(wire::kFenceFixedLen);
  empty[6] = 0;
  EXPECT_TRUE(refused(empty));
  EXPECT_TRUE(refused(bytes_of(wire::Fence{1, 1, 1, 1, std::string(wire::kMaxFenceName + 1, 'n')})));
  wire::Fence out;
  EXPECT_TRUE(wire::decode_fence(bytes_of(wire::Fence{1, 1, 1, 1, std::string(wire::kMaxFenceName, 'n')}), &out));
  for (const std::uint16_t len : {0, 1, 3, 0x0102, 0xffff}) {
    auto bytes = bytes_of(kGood);  // two name bytes
    bytes[6] = static_cast<std::uint8_t>(len);
    bytes[7] = static_cast<std::uint8_t>(len >> 8);
    EXPECT_TRUE(refused(bytes)) << "name length " << len;
  }
}

TEST(Fence, RefusesZeroLineageGenOrEpoch) {
  EXPECT_TRUE(refused(bytes_of(wire::Fence{1, 0, 1, 1, "a"})));
  EXPECT_TRUE(refused(bytes_of(wire::Fence{1, 1, 0, 1, "a"})));
  EXPECT_TRUE(refused(bytes_of(wire::Fence{1, 1, 1, 0, "a"})));
  EXPECT_TRUE(refused(bytes_of(wire::Fence{0, 0, 0, 0, "a"})));
}

}  // namespace
}  // namespace kvxfer::internal::ucx
