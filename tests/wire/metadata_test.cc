// The metadata format: round trips, and every malformed input is refused
// with a clear error without reading outside the buffer.
#include "wire/metadata.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

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
