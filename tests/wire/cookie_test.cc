// SPDX-License-Identifier: Apache-2.0
// The same-host cookie's declaration (wire/cookie.h): round trip, golden
// bytes, the epoch as the first 8 bytes, and hostile bytes (truncated,
// extended, wrong magic, version or reserved word, zero epoch, an empty or
// overflowing pool, a pool fd past an int or an offset without one) refused.
#include "wire/cookie.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace kvxfer::wire {
namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

std::vector<std::uint8_t> bytes_of(const CookieDeclaration& d) {
  std::vector<std::uint8_t> out(kCookieLen);
  encode_cookie(out.data(), d);
  return out;
}

bool decodes(const std::vector<std::uint8_t>& bytes) {
  CookieDeclaration d;
  return decode_cookie(bytes, &d);
}

const CookieDeclaration kGood{0x1122334455667788ull, 0x00007f0012340000ull, 16, 4096};

TEST(Cookie, RoundTrips) {
  for (const CookieDeclaration& in :
       {kGood, CookieDeclaration{1, 0, 1, 1}, CookieDeclaration{kMax, 0, 1, kMax},
        CookieDeclaration{kMax, kMax - 4096, 1, 4096}}) {
    CookieDeclaration out;
    ASSERT_TRUE(decode_cookie(bytes_of(in), &out));
    EXPECT_EQ(out.epoch, in.epoch);
    EXPECT_EQ(out.base_addr, in.base_addr);
    EXPECT_EQ(out.num_blocks, in.num_blocks);
    EXPECT_EQ(out.block_len, in.block_len);
    EXPECT_EQ(out.pool_fd, kNoFd);
    EXPECT_EQ(out.pool_offset, 0u);
    EXPECT_EQ(out.cookie_fd, kNoFd);
  }
}

TEST(Cookie, APoolDescriptorAndOffsetRoundTrip) {
  for (const auto& [fd, offset] :
       {std::pair<std::uint32_t, std::uint64_t>{0, 0}, {3, 4100}, {kMaxFd, kMax}}) {
    CookieDeclaration in = kGood;
    in.pool_fd = fd;
    in.pool_offset = offset;
    CookieDeclaration out;
    ASSERT_TRUE(decode_cookie(bytes_of(in), &out));
    EXPECT_EQ(out.pool_fd, fd);
    EXPECT_EQ(out.pool_offset, offset);
  }
}

TEST(Cookie, ACookieDescriptorRoundTrips) {
  for (const std::uint32_t fd : {0u, 7u, kMaxFd}) {
    CookieDeclaration in = kGood;
    in.cookie_fd = fd;
    CookieDeclaration out;
    ASSERT_TRUE(decode_cookie(bytes_of(in), &out));
    EXPECT_EQ(out.cookie_fd, fd);
  }
}

TEST(Cookie, RefusesADescriptorPastAnIntAndAnOffsetWithoutADescriptor) {
  CookieDeclaration d = kGood;
  d.pool_fd = kMaxFd + 1;
  EXPECT_FALSE(decodes(bytes_of(d)));
  d = kGood;
  d.cookie_fd = kMaxFd + 1;
  EXPECT_FALSE(decodes(bytes_of(d)));
  d = kGood;
  d.pool_fd = kNoFd;
  d.pool_offset = 4096;
  EXPECT_FALSE(decodes(bytes_of(d)));
}

TEST(Cookie, LayoutIsLittleEndianWithTheEpochFirstAndMagicKVXC) {
  const std::vector<std::uint8_t> expected = {
      0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,  // epoch
      'K',  'V',  'X',  'C',  4,    0,    0,    0,     // magic, version 4, zero
      0x00, 0x00, 0x34, 0x12, 0x00, 0x7f, 0x00, 0x00,  // pool base
      16,   0,    0,    0,    0,    0,    0,    0,     // num_blocks
      0x00, 0x10, 0,    0,    0,    0,    0,    0,     // block_len
      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,  // no pool fd, no cookie fd
      0,    0,    0,    0,    0,    0,    0,    0,     // pool offset
      0,    0,    0,    0,    0,    0,    0,    0,     // no region table
      0,    0,    0,    0,    0xff, 0xff, 0xff, 0xff,  // slots 0, no fence fd
  };
  EXPECT_EQ(bytes_of(kGood), expected);
  EXPECT_EQ(kCookieLen, expected.size());
  // read_cookie reads only these 8 bytes before every chunk.
  EXPECT_EQ(load_le<std::uint64_t>(expected.data() + kCookieEpochAt), kGood.epoch);
  EXPECT_EQ(kCookieEpochLen, 8u);
}

TEST(Cookie, RefusesEveryTruncationAndExtension) {
  const auto good = bytes_of(kGood);
  for (std::size_t len = 0; len < good.size(); ++len) {
    EXPECT_FALSE(decodes({good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len)})) << len;
  }
  auto longer = good;
  longer.push_back(0);
  EXPECT_FALSE(decodes(longer));
  // A whole page, as if the reader had read more than the declaration.
  auto page = good;
  page.resize(4096, 0);
  EXPECT_FALSE(decodes(page));
}

TEST(Cookie, RefusesWrongMagicVersionOrReservedWord) {
  for (std::size_t at = 8; at < 16; ++at) {
    if (at == 12) continue;  // the version's low byte: checked below
    auto bytes = bytes_of(kGood);
    bytes[at] ^= 0x01;
    EXPECT_FALSE(decodes(bytes)) << "byte " << at;
  }
  // Versions 1 and 2 (no region table) and 3 (no fence table: its peers
  // would copy into regions unseen by a removal) are no longer read: every
  // peer of a release writes version 4.
  for (const std::uint8_t version : {0, 1, 2, 3, 5, 0xff}) {
    auto bytes = bytes_of(kGood);
    bytes[12] = version;
    EXPECT_FALSE(decodes(bytes)) << "version " << int{version};
  }
}

// What the cookie page held before it was a wire format: the epoch, then
// base, num_blocks and block_len as native words. Not a declaration now.
TEST(Cookie, RefusesTheOldNativeLayout) {
  std::vector<std::uint8_t> old(32);
  store_le(old.data(), kGood.epoch);
  store_le(old.data() + 8, kGood.base_addr);
  store_le(old.data() + 16, kGood.num_blocks);
  store_le(old.data() + 24, kGood.block_len);
  EXPECT_FALSE(decodes(old));
  old.resize(kCookieLen, 0);
  EXPECT_FALSE(decodes(old));
}

TEST(Cookie, RefusesZeroEpochAndARetiredPage) {
  EXPECT_FALSE(decodes(bytes_of(CookieDeclaration{0, kGood.base_addr, 16, 4096})));
  EXPECT_FALSE(decodes(std::vector<std::uint8_t>(kCookieLen, 0)));
}

TEST(Cookie, RefusesAnEmptyPoolThatIsNotNone) {
  EXPECT_FALSE(decodes(bytes_of(CookieDeclaration{1, kGood.base_addr, 0, 4096})));
  EXPECT_FALSE(decodes(bytes_of(CookieDeclaration{1, kGood.base_addr, 16, 0})));
  EXPECT_FALSE(decodes(bytes_of(CookieDeclaration{1, 0, 0, 4096})));
}

TEST(Cookie, NoPoolAtAllIsDeclaredAsZerosButNeverWithADescriptor) {
  CookieDeclaration none{7, 0, 0, 0};
  CookieDeclaration out;
  ASSERT_TRUE(decode_cookie(bytes_of(none), &out));
  EXPECT_EQ(out.base_addr, 0u);
  EXPECT_EQ(out.num_blocks, 0u);
  none.pool_fd = 3;
  EXPECT_FALSE(decodes(bytes_of(none)));
}

TEST(Cookie, ARegionTableRoundTripsAtItsGoldenPlace) {
  CookieDeclaration in = kGood;
  in.table_addr = 0x00007f0000200000ull;
  in.table_slots = kCookieMaxSlots;
  const auto bytes = bytes_of(in);
  EXPECT_EQ(load_le<std::uint64_t>(bytes.data() + 56), in.table_addr);
  EXPECT_EQ(load_le<std::uint32_t>(bytes.data() + 64), kCookieMaxSlots);
  CookieDeclaration out;
  ASSERT_TRUE(decode_cookie(bytes, &out));
  EXPECT_EQ(out.table_addr, in.table_addr);
  EXPECT_EQ(out.table_slots, in.table_slots);
}

TEST(Cookie, RefusesATableTooLongMisalignedWrappingOrHalfDeclared) {
  const auto with = [](std::uint64_t addr, std::uint32_t slots) {
    CookieDeclaration d = kGood;
    d.table_addr = addr;
    d.table_slots = slots;
    return bytes_of(d);
  };
  EXPECT_FALSE(decodes(with(0x7f0000200000, kCookieMaxSlots + 1)));
  EXPECT_FALSE(decodes(with(0x7f0000200004, 16)));
  EXPECT_FALSE(decodes(with(kMax - 7, 1)));
  EXPECT_FALSE(decodes(with(kMax - 32 * 16 + 1 - 7, 16)));
  EXPECT_FALSE(decodes(with(0x7f0000200000, 0)));
  EXPECT_FALSE(decodes(with(0, 16)));
}

TEST(Cookie, AFenceDescriptorRoundTripsAndNoneIsAllOnes) {
  for (const std::uint32_t fd : {0u, 9u, kMaxFd, kNoFd}) {
    CookieDeclaration in = kGood;
    in.fence_fd = fd;
    CookieDeclaration out;
    ASSERT_TRUE(decode_cookie(bytes_of(in), &out));
    EXPECT_EQ(out.fence_fd, fd);
  }
  CookieDeclaration d = kGood;
  d.fence_fd = kMaxFd + 1;
  EXPECT_FALSE(decodes(bytes_of(d)));
  // It is the last word, where versions before 4 kept a zero.
  EXPECT_EQ(load_le<std::uint32_t>(bytes_of(d).data() + 68), kMaxFd + 1);
}

TEST(Cookie, ARegionEntryIsLittleEndianAndSettledOnlyWithAnEvenSeq) {
  const RegionEntry e{4, 0x0000000300000002ull, 0x7f0000300000ull, 8192};
  std::vector<std::uint8_t> bytes(kRegionEntryLen);
  encode_region_entry(bytes.data(), e);
  const std::vector<std::uint8_t> expected = {
      4,    0,    0,    0,    0,    0,    0,    0,     // seq
      2,    0,    0,    0,    3,    0,    0,    0,     // id: slot 2, generation 3
      0x00, 0x00, 0x30, 0x00, 0x00, 0x7f, 0x00, 0x00,  // base
      0x00, 0x20, 0,    0,    0,    0,    0,    0,     // len
  };
  EXPECT_EQ(bytes, expected);
  RegionEntry out;
  ASSERT_TRUE(decode_region_entry(bytes, &out));
  EXPECT_EQ(out.seq, 4u);
  EXPECT_EQ(out.id, e.id);
  EXPECT_EQ(out.base, e.base);
  EXPECT_EQ(out.len, e.len);
  bytes[0] = 5;  // being written
  EXPECT_FALSE(decode_region_entry(bytes, &out));
  encode_region_entry(bytes.data(), RegionEntry{2, 1, kMax - 10, 11});  // wraps
  EXPECT_FALSE(decode_region_entry(bytes, &out));
  bytes.push_back(0);
  EXPECT_FALSE(decode_region_entry(bytes, &out));
  EXPECT_EQ(out.seq, 4u);
}

TEST(Cookie, RefusesAPoolPastTheEndOfTheAddressSpace) {
  // num_blocks x block_len wraps in 64 bits to something small.
  EXPECT_FALSE(decodes(bytes_of(CookieDeclaration{1, 0, (1ull << 52) + 1, 1ull << 12})));
  // The size fits, but base + size wraps.
  EXPECT_FALSE(decodes(bytes_of(CookieDeclaration{1, kMax - 4095, 2, 4096})));
  EXPECT_FALSE(decodes(bytes_of(CookieDeclaration{1, kMax, 1, 1})));
  EXPECT_FALSE(decodes(bytes_of(CookieDeclaration{1, kMax - 8191, 2, 4096})));
  // The last byte may be kMax - 1 (common/region.h: base + size <= kMax).
  EXPECT_TRUE(decodes(bytes_of(CookieDeclaration{1, kMax - 8192, 2, 4096})));
}

TEST(Cookie, RefusedBytesLeaveTheOutputAlone) {
  CookieDeclaration out{9, 9, 9, 9};
  auto bytes = bytes_of(kGood);
  bytes[8] = 0;
  EXPECT_FALSE(decode_cookie(bytes, &out));
  EXPECT_EQ(out.epoch, 9u);
  EXPECT_EQ(out.base_addr, 9u);
  EXPECT_EQ(out.num_blocks, 9u);
  EXPECT_EQ(out.block_len, 9u);
}

}  // namespace
}  // namespace kvxfer::wire
