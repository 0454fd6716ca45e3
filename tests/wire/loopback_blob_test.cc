// SPDX-License-Identifier: Apache-2.0
// The loopback engine's blob inside the agent metadata: its exact bytes, and
// anything but exactly one blob refused.
#include "wire/loopback_blob.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <vector>

namespace kvxfer::wire {
namespace {

// Written out by hand: peers of earlier versions read and write these bytes.
const std::vector<std::uint8_t> kGoldenBytes = {
    'K',  'V',  'L',  'B',                           // magic
    0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // pool key
    0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,  // cookie
};

TEST(LoopbackBlob, EncodesToTheGoldenBytes) {
  EXPECT_EQ(encode_loopback_blob({0x0102030405060708ull, 0x1112131415161718ull}), kGoldenBytes);
}

TEST(LoopbackBlob, DecodesTheGoldenBytes) {
  LoopbackBlob b;
  ASSERT_TRUE(decode_loopback_blob(kGoldenBytes, &b));
  EXPECT_EQ(b.key, 0x0102030405060708ull);
  EXPECT_EQ(b.cookie, 0x1112131415161718ull);
}

TEST(LoopbackBlob, RefusesEveryOtherLengthAndLeavesTheOutputAlone) {
  auto longer = kGoldenBytes;
  longer.push_back(0);
  for (std::size_t len = 0; len <= longer.size(); ++len) {
    if (len == kLoopbackBlobLen) continue;
    LoopbackBlob out{7, 7};
    EXPECT_FALSE(decode_loopback_blob(std::span(longer.data(), len), &out)) << len;
    EXPECT_EQ(out.key, 7u);
    EXPECT_EQ(out.cookie, 7u);
  }
}

TEST(LoopbackBlob, RefusesWrongMagic) {
  for (std::size_t at = 0; at < 4; ++at) {
    auto bytes = kGoldenBytes;
    bytes[at] ^= 0x01;
    LoopbackBlob out;
    EXPECT_FALSE(decode_loopback_blob(bytes, &out)) << "accepted a flipped magic byte " << at;
  }
}

}  // namespace
}  // namespace kvxfer::wire
