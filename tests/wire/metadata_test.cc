// SPDX-License-Identifier: Apache-2.0
// The metadata format: round trips, and every malformed input is refused
// with a clear error without reading outside the buffer.
#include "wire/metadata.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvxfer::wire {
namespace {

AgentMetadata sample() {
  AgentMetadata m;
  m.engine = "UCX";
  m.agent_name = "agent-a";
  m.config_fingerprint = "0123456789abcdef";
  m.boot_id = "af5fe7dc-2358-4d7d-8467-0ac08ecd54f5";
  m.base_addr = 0x7f0000001000;
  m.num_blocks = 262144;
  m.block_len = 4096;
  m.pid = 4242;
  m.engine_blob = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  return m;
}

std::string error_of(const std::vector<std::uint8_t>& bytes) {
  try {
    (void)decode(bytes);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// One fixed value and its bytes, written out by hand: the format peers of
// earlier versions read and write, so these bytes never change.
AgentMetadata golden_value() {
  AgentMetadata m;
  m.engine = "UCX";
  m.agent_name = "a";
  m.config_fingerprint = "fp";
  m.boot_id = "b";
  m.base_addr = 0x0102030405060708ull;
  m.num_blocks = 0x1112131415161718ull;
  m.block_len = 0x21222324ull;
  m.pid = 0x31323334u;
  m.engine_blob = {0xaa, 0xbb};
  return m;
}

const std::vector<std::uint8_t> kGoldenBytes = {
    'K',  'V',  'X',  'F',  'M',  'E',  'T',  'A',   // magic
    0x01, 0x00, 0x20, 0x00,                          // version 1, header length 32
    0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // base_addr
    0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,  // num_blocks
    0x24, 0x23, 0x22, 0x21, 0x00, 0x00, 0x00, 0x00,  // block_len
    0x34, 0x33, 0x32, 0x31,                          // pid
    0x2e, 0x56, 0xc8, 0x9a,                          // checksum (FNV-1a of the rest)
    0x03, 0x00, 0x00, 0x00, 'U',  'C',  'X',         // engine
    0x01, 0x00, 0x00, 0x00, 'a',                     // agent name
    0x02, 0x00, 0x00, 0x00, 'f',  'p',               // config fingerprint
    0x01, 0x00, 0x00, 0x00, 'b',                     // boot id
    0x02, 0x00, 0x00, 0x00, 0xaa, 0xbb,              // engine blob
};

TEST(WireMetadata, EncodesToTheGoldenBytes) { EXPECT_EQ(encode(golden_value()), kGoldenBytes); }

TEST(WireMetadata, DecodesTheGoldenBytes) { EXPECT_EQ(decode(kGoldenBytes), golden_value()); }

TEST(WireMetadata, RoundTripsEveryField) {
  const AgentMetadata m = sample();
  EXPECT_EQ(decode(encode(m)), m);
}

TEST(WireMetadata, SizeDoesNotDependOnNumBlocks) {
  AgentMetadata small = sample();
  small.num_blocks = 1;
  AgentMetadata big = sample();
  big.num_blocks = 1ull << 40;
  EXPECT_EQ(encode(small).size(), encode(big).size());
}

TEST(WireMetadata, RefusesEmpty) { EXPECT_NE(error_of({}).find("empty"), std::string::npos); }

TEST(WireMetadata, RefusesEveryTruncation) {
  const auto bytes = encode(sample());
  for (std::size_t len = 1; len < bytes.size(); ++len) {
    const std::vector<std::uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<long>(len));
    EXPECT_FALSE(error_of(cut).empty()) << "accepted a prefix of " << len << " bytes";
  }
}

TEST(WireMetadata, RefusesAnotherFormat) {
  const std::string nixl = "NIXL metadata of some other agent";
  const std::vector<std::uint8_t> bytes(nixl.begin(), nixl.end());
  EXPECT_NE(error_of(bytes).find("not kvxfer metadata"), std::string::npos);
}

TEST(WireMetadata, RefusesAnotherVersion) {
  auto bytes = encode(sample());
  bytes[8] = 2;  // version, little-endian u16 after the magic
  EXPECT_NE(error_of(bytes).find("version 2"), std::string::npos);
}

TEST(WireMetadata, RefusesTrailingBytes) {
  auto bytes = encode(sample());
  bytes.push_back(0);
  EXPECT_NE(error_of(bytes).find("trailing"), std::string::npos);
}

TEST(WireMetadata, RefusesFlippedBit) {
  auto bytes = encode(sample());
  bytes[bytes.size() - 3] ^= 0x10;  // inside the engine blob
  EXPECT_NE(error_of(bytes).find("corrupt"), std::string::npos);
}

TEST(WireMetadata, RefusesOversizedLength) {
  auto bytes = encode(sample());
  // The engine name length field follows the 12-byte preamble and 32 fixed bytes.
  bytes[44] = 0xff;
  bytes[45] = 0xff;
  bytes[46] = 0xff;
  bytes[47] = 0x7f;
  EXPECT_NE(error_of(bytes).find("limit"), std::string::npos);
}

}  // namespace
}  // namespace kvxfer::wire
