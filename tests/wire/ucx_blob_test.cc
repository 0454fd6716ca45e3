// SPDX-License-Identifier: Apache-2.0
// The UCX engine's blob inside the agent metadata: its exact bytes, round
// trips, and every malformed blob refused without reading outside it.
#include "wire/ucx_blob.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <vector>

namespace kvxfer::internal::ucx {
namespace {

const std::vector<std::uint8_t> kAddress = {0xa1, 0xa2, 0xa3};
const std::vector<std::uint8_t> kRkey = {0xb1, 0xb2};

Blob golden_value() {
  Blob b;
  b.flags = 0x0203;
  b.pidns_dev = 0x0102030405060708ull;
  b.pidns_ino = 0x1112131415161718ull;
  b.cookie_addr = 0x2122232425262728ull;
  b.cookie_epoch = 0x3132333435363738ull;
  b.worker_address = kAddress;
  b.rkey = kRkey;
  b.notify_fd = 0x41424344;
  return b;
}

// Written out by hand: peers of earlier versions read and write these bytes.
const std::vector<std::uint8_t> kGoldenBytes = {
    'K',  'V',  'X',  'U',  0x02, 0x00, 0x03, 0x02,  // magic, version 2, flags
    0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // pid namespace device
    0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,  // pid namespace inode
    0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21,  // cookie address
    0x38, 0x37, 0x36, 0x35, 0x34, 0x33, 0x32, 0x31,  // cookie epoch
    0x03, 0x00, 0x00, 0x00, 0xa1, 0xa2, 0xa3,        // worker address
    0x02, 0x00, 0x00, 0x00, 0xb1, 0xb2,              // packed rkey
    0x44, 0x43, 0x42, 0x41,                          // notify fd
};

std::vector<std::uint8_t> bytes_of(std::span<const std::uint8_t> s) { return {s.begin(), s.end()}; }

TEST(UcxBlob, EncodesToTheGoldenBytes) { EXPECT_EQ(encode_blob(golden_value()), kGoldenBytes); }

TEST(UcxBlob, DecodesTheGoldenBytesIntoViewsOfThem) {
  Blob b;
  ASSERT_TRUE(decode_blob(kGoldenBytes, &b));
  EXPECT_EQ(b.flags, 0x0203);
  EXPECT_EQ(b.pidns_dev, 0x0102030405060708ull);
  EXPECT_EQ(b.pidns_ino, 0x1112131415161718ull);
  EXPECT_EQ(b.cookie_addr, 0x2122232425262728ull);
  EXPECT_EQ(b.cookie_epoch, 0x3132333435363738ull);
  EXPECT_EQ(bytes_of(b.worker_address), kAddress);
  EXPECT_EQ(bytes_of(b.rkey), kRkey);
  EXPECT_EQ(b.worker_address.data(), kGoldenBytes.data() + 44);
  EXPECT_EQ(b.rkey.data(), kGoldenBytes.data() + 51);
}

TEST(UcxBlob, RoundTripsEmptyFields) {
  Blob in;
  in.flags = kBlobAcceptsCma | kBlobAcceptsScatter;
  const auto bytes = encode_blob(in);
  EXPECT_EQ(bytes.size(), 52u);
  Blob out;
  ASSERT_TRUE(decode_blob(bytes, &out));
  EXPECT_EQ(out.flags, in.flags);
  EXPECT_TRUE(out.worker_address.empty());
  EXPECT_TRUE(out.rkey.empty());
}

TEST(UcxBlob, RefusesEveryTruncationAndLeavesTheOutputAlone) {
  for (std::size_t len = 0; len < kGoldenBytes.size(); ++len) {
    Blob out;
    out.flags = 0x7777;
    EXPECT_FALSE(decode_blob(std::span(kGoldenBytes.data(), len), &out)) << len;
    EXPECT_EQ(out.flags, 0x7777) << len;
  }
}

TEST(UcxBlob, RefusesTrailingBytes) {
  auto bytes = kGoldenBytes;
  bytes.push_back(0);
  Blob out;
  EXPECT_FALSE(decode_blob(bytes, &out));
}

TEST(UcxBlob, RefusesWrongMagicOrVersion) {
  for (const std::size_t at : {0u, 3u, 4u, 5u}) {
    auto bytes = kGoldenBytes;
    bytes[at] ^= 0x01;
    Blob out;
    EXPECT_FALSE(decode_blob(bytes, &out)) << "accepted a flipped byte " << at;
  }
}

TEST(UcxBlob, RefusesAFieldLongerThanTheLimit) {
  // A worker address of kMaxBlobField + 1 bytes, all present.
  std::vector<std::uint8_t> address(kMaxBlobField + 1, 0x5a);
  Blob in = golden_value();
  in.worker_address = address;
  Blob out;
  EXPECT_FALSE(decode_blob(encode_blob(in), &out));
  address.pop_back();
  in.worker_address = address;
  EXPECT_TRUE(decode_blob(encode_blob(in), &out));
}

}  // namespace
}  // namespace kvxfer::internal::ucx
