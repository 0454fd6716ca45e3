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
  m.regions = {{(1ull << 32) | 1, 0x7f1000000000, 65536}, {(2ull << 32) | 2, 0x7f1000010000, 8}};
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
  m.regions = {{0x0000000100000001ull, 0x4142434445464748ull, 0x51525354ull}};
  return m;
}

// Version 1, which had no region list: refused since version 2.
const std::vector<std::uint8_t> kVersion1Bytes = {
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

const std::vector<std::uint8_t> kGoldenBytes = {
    'K',  'V',  'X',  'F',  'M',  'E',  'T',  'A',   // magic
    0x02, 0x00, 0x20, 0x00,                          // version 2, header length 32
    0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // base_addr
    0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,  // num_blocks
    0x24, 0x23, 0x22, 0x21, 0x00, 0x00, 0x00, 0x00,  // block_len
    0x34, 0x33, 0x32, 0x31,                          // pid
    0x9f, 0x1f, 0x37, 0x93,                          // checksum (FNV-1a of the rest)
    0x03, 0x00, 0x00, 0x00, 'U',  'C',  'X',         // engine
    0x01, 0x00, 0x00, 0x00, 'a',                     // agent name
    0x02, 0x00, 0x00, 0x00, 'f',  'p',               // config fingerprint
    0x01, 0x00, 0x00, 0x00, 'b',                     // boot id
    0x02, 0x00, 0x00, 0x00, 0xaa, 0xbb,              // engine blob
    0x01, 0x00, 0x00, 0x00,                          // one region:
    0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,  //   id (slot 1, generation 1)
    0x48, 0x47, 0x46, 0x45, 0x44, 0x43, 0x42, 0x41,  //   address
    0x54, 0x53, 0x52, 0x51, 0x00, 0x00, 0x00, 0x00,  //   length
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
  bytes[8] = 3;  // version, little-endian u16 after the magic
  EXPECT_NE(error_of(bytes).find("version 3"), std::string::npos);
}

TEST(WireMetadata, RefusesVersion1WhichListsNoRegions) {
  EXPECT_NE(error_of(kVersion1Bytes).find("version 1"), std::string::npos);
}

TEST(WireMetadata, RefusesABadRegionList) {
  const auto with = [](std::vector<AgentMetadata::Region> regions) {
    AgentMetadata m = sample();
    m.regions = std::move(regions);
    return error_of(encode(m));
  };
  const std::uint64_t id = (1ull << 32) | 1;
  EXPECT_EQ(with({{id, 0x1000, 16}, {id + 1, 0x1010, 16}}), "");  // adjacent is fine
  EXPECT_NE(with({{0, 0x1000, 16}}).find("pool"), std::string::npos);
  EXPECT_NE(with({{id, 0x1000, 0}}).find("empty"), std::string::npos);
  EXPECT_NE(with({{id, ~0ull - 4, 16}}).find("address space"), std::string::npos);
  EXPECT_NE(with({{id, 0x1000, 16}, {id + 1, 0x100f, 16}}).find("not after"), std::string::npos);
  EXPECT_NE(with({{id, 0x2000, 16}, {id + 1, 0x1000, 16}}).find("not after"), std::string::npos);
}

TEST(WireMetadata, RefusesMoreRegionsThanTheLimit) {
  AgentMetadata m = sample();
  m.regions.resize(kMaxRegions + 1);
  for (std::size_t i = 0; i < m.regions.size(); ++i) {
    m.regions[i] = {(1ull << 32) | (i + 1), 0x100000 + i * 16, 16};
  }
  EXPECT_NE(error_of(encode(m)).find("more than the limit"), std::string::npos);
  m.regions.pop_back();
  EXPECT_EQ(decode(encode(m)), m);
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
