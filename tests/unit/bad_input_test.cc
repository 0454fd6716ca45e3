// SPDX-License-Identifier: Apache-2.0
// Bad input is a caller mistake: a clear std::invalid_argument before
// anything is posted, nothing written, and nothing held against the peer.
#include <gtest/gtest.h>

#include <functional>

#include "agents.h"
#include "wire/metadata.h"

namespace kvxfer::unit {
namespace {

class BadInputTest : public LoopbackTest {
 protected:
  // Nothing was posted or written, and peer "b" was not charged.
  void expect_nothing_happened() {
    EXPECT_TRUE(untouched(b));
    EXPECT_TRUE(untouched(c));
    const Stats stats = a.transport.stats();
    EXPECT_EQ(stats.inflight, 0u);
    EXPECT_EQ(stats.live.transfers, 0u);
    const PeerStats pb = peer("b");
    EXPECT_EQ(pb.strikes, 0);
    EXPECT_EQ(pb.post_failures, 0u);
    EXPECT_FALSE(pb.fault.has_value());
    EXPECT_TRUE(poll("b").empty());
  }

  void expect_rejected_write(const std::vector<std::int64_t>& local,
                             const std::vector<std::int64_t>& remote) {
    EXPECT_THROW((void)write("b", local, remote), std::invalid_argument);
    expect_nothing_happened();
  }

  // b's metadata, re-encoded after `edit`, so only the edited field is wrong.
  std::vector<std::uint8_t> edited_metadata(const std::function<void(wire::AgentMetadata&)>& edit) {
    wire::AgentMetadata m = wire::decode(b.transport.agent_metadata());
    edit(m);
    return wire::encode(m);
  }

  // Registering `metadata` as peer "x" is refused, and nothing changed.
  void expect_rejected_metadata(const std::vector<std::uint8_t>& metadata) {
    EXPECT_THROW(
        a.transport.add_remote_peer("x", metadata, b.transport.base_addr(), kNumBlocks, kBlockLen),
        std::invalid_argument);
    EXPECT_FALSE(has_peer(a.transport, "x"));
    EXPECT_EQ(live().peers, 2u);
    EXPECT_FALSE(write("x", {0}, {0}).has_value());
    expect_nothing_happened();
  }
};

TEST_F(BadInputTest, LocalIndexPastTheEndIsRejected) {
  expect_rejected_write({static_cast<std::int64_t>(kNumBlocks)}, {0});
}

TEST_F(BadInputTest, NegativeLocalIndexIsRejected) { expect_rejected_write({-1}, {0}); }

TEST_F(BadInputTest, RemoteIndexPastTheEndIsRejected) {
  expect_rejected_write({0}, {static_cast<std::int64_t>(kNumBlocks)});
}

TEST_F(BadInputTest, NegativeRemoteIndexIsRejected) { expect_rejected_write({0}, {-1}); }

TEST_F(BadInputTest, BadIndexLaterInTheListRejectsTheWholeWrite) {
  expect_rejected_write({0, 1, 2}, {0, 1, static_cast<std::int64_t>(kNumBlocks) + 5});
}

TEST_F(BadInputTest, Int32IndexOutOfRangeIsRejected) {
  const std::vector<std::int32_t> local{0};
  const std::vector<std::int32_t> remote{-7};
  EXPECT_THROW((void)a.transport.write_blocks("b", std::span<const std::int32_t>(local),
                                              std::span<const std::int32_t>(remote)),
               std::invalid_argument);
  expect_nothing_happened();
}

TEST_F(BadInputTest, ListsOfDifferentLengthsAreRejected) { expect_rejected_write({0, 1}, {0}); }

TEST_F(BadInputTest, EmptyWriteIsRejected) { expect_rejected_write({}, {}); }

TEST_F(BadInputTest, DuplicateRemoteIndexIsRejected) {
  expect_rejected_write({0, 1, 2}, {5, 9, 5});
}

TEST_F(BadInputTest, RepeatedLocalIndexIsAllowed) {
  // Reading one block twice is harmless; only two writes to one block race.
  ASSERT_TRUE(write("b", {3, 3}, {0, 1}).has_value());
  EXPECT_TRUE(landed(b, 0, 3));
  EXPECT_TRUE(landed(b, 1, 3));
}

TEST(BadViewTest, ViewWithZeroBlocksIsRejected) {
  std::vector<std::uint8_t> memory(kBlockLen);
  EXPECT_THROW(Transport("agent-a", Region{memory.data(), 0, kBlockLen}, loopback_options()),
               std::invalid_argument);
}

TEST(BadViewTest, ViewWithZeroBlockLengthIsRejected) {
  std::vector<std::uint8_t> memory(kBlockLen);
  EXPECT_THROW(Transport("agent-a", Region{memory.data(), kNumBlocks, 0}, loopback_options()),
               std::invalid_argument);
}

TEST(BadViewTest, ViewWithoutMemoryIsRejected) {
  EXPECT_THROW(Transport("agent-a", Region{nullptr, kNumBlocks, kBlockLen}, loopback_options()),
               std::invalid_argument);
}

TEST_F(BadInputTest, EmptyMetadataIsRejected) { expect_rejected_metadata({}); }

TEST_F(BadInputTest, TruncatedMetadataIsRejected) {
  const std::vector<std::uint8_t> full = b.transport.agent_metadata();
  expect_rejected_metadata(std::vector<std::uint8_t>(full.begin(), full.end() - 1));
  expect_rejected_metadata(
      std::vector<std::uint8_t>(full.begin(), full.begin() + static_cast<long>(full.size() / 2)));
  expect_rejected_metadata(std::vector<std::uint8_t>(full.begin(), full.begin() + 10));
}

TEST_F(BadInputTest, MetadataOfAnotherFormatIsRejected) {
  const std::string json = R"({"agent_name":"agent-b","base_addr":0})";
  expect_rejected_metadata(std::vector<std::uint8_t>(json.begin(), json.end()));
}

TEST_F(BadInputTest, MetadataOfAnotherVersionIsRejected) {
  std::vector<std::uint8_t> metadata = b.transport.agent_metadata();
  // The u16 version follows the 8-byte magic (see wire/metadata.h).
  metadata[8] = static_cast<std::uint8_t>(wire::kMetadataVersion + 1);
  metadata[9] = 0;
  expect_rejected_metadata(metadata);
}

TEST_F(BadInputTest, CorruptedMetadataIsRejected) {
  std::vector<std::uint8_t> metadata = b.transport.agent_metadata();
  metadata.back() ^= 0x5a;  // inside the engine blob, covered by the checksum
  expect_rejected_metadata(metadata);
}

TEST_F(BadInputTest, MetadataOfAnotherBackendIsRejected) {
  expect_rejected_metadata(edited_metadata([](wire::AgentMetadata& m) { m.engine = "UCX"; }));
}

TEST_F(BadInputTest, MetadataWhoseBlockCountDisagreesWithTheArgumentsIsRejected) {
  expect_rejected_metadata(
      edited_metadata([](wire::AgentMetadata& m) { m.num_blocks = kNumBlocks * 2; }));
}

TEST_F(BadInputTest, MetadataWhoseBaseDisagreesWithTheArgumentsIsRejected) {
  expect_rejected_metadata(
      edited_metadata([](wire::AgentMetadata& m) { m.base_addr += kBlockLen; }));
}

TEST_F(BadInputTest, ArgumentsThatDisagreeWithTheMetadataAreRejected) {
  const std::vector<std::uint8_t> metadata = b.transport.agent_metadata();
  const std::uintptr_t base = b.transport.base_addr();
  EXPECT_THROW(a.transport.add_remote_peer("x", metadata, base + kBlockLen, kNumBlocks, kBlockLen),
               std::invalid_argument);
  EXPECT_THROW(a.transport.add_remote_peer("x", metadata, base, kNumBlocks + 1, kBlockLen),
               std::invalid_argument);
  EXPECT_THROW(a.transport.add_remote_peer("x", metadata, base, kNumBlocks - 1, kBlockLen),
               std::invalid_argument);
  EXPECT_FALSE(has_peer(a.transport, "x"));
  expect_nothing_happened();
}

TEST_F(BadInputTest, PeerBlockLengthDifferentFromOursIsRejected) {
  Agent wide{"agent-wide", loopback_options(), kNumBlocks, kBlockLen * 2};
  EXPECT_THROW(a.transport.add_remote_peer("x", wide.transport.agent_metadata(),
                                           wide.transport.base_addr(), kNumBlocks, kBlockLen * 2),
               std::invalid_argument);
  EXPECT_FALSE(has_peer(a.transport, "x"));
  EXPECT_TRUE(wide.pool.all(0));
  expect_nothing_happened();
}

TEST_F(BadInputTest, PeerWithOurOwnAgentNameIsRejected) {
  Agent twin{"agent-a"};
  EXPECT_THROW(add_peer(a.transport, "x", twin.transport), std::invalid_argument);
  EXPECT_FALSE(has_peer(a.transport, "x"));
  EXPECT_TRUE(twin.pool.all(0));
  expect_nothing_happened();
}

TEST_F(BadInputTest, PeerWithADifferentConfigFingerprintIsRejected) {
  Options options = loopback_options();
  options.config_fields = {{"model", "other"}};
  Agent other{"agent-other", options};
  Options ours = loopback_options();
  ours.config_fields = {{"model", "llama"}};
  Agent initiator{"agent-i", ours};
  EXPECT_THROW(add_peer(initiator.transport, "x", other.transport), std::invalid_argument);
  EXPECT_FALSE(has_peer(initiator.transport, "x"));
}

TEST_F(BadInputTest, BadMetadataIsRejectedBeforeAnAsyncRegistrationStarts) {
  EXPECT_THROW((void)a.transport.add_remote_peer_async("x", {}, b.transport.base_addr(), kNumBlocks,
                                                       kBlockLen),
               std::invalid_argument);
  EXPECT_EQ(a.transport.stats().registrations_pending, 0u);
  EXPECT_FALSE(has_peer(a.transport, "x"));
  expect_nothing_happened();
}

TEST_F(BadInputTest, BadMetadataLeavesAnExistingRegistrationInPlace) {
  const std::string junk = "not metadata";
  EXPECT_THROW(a.transport.add_remote_peer("b", std::vector<std::uint8_t>(junk.begin(), junk.end()),
                                           b.transport.base_addr(), kNumBlocks, kBlockLen),
               std::invalid_argument);
  EXPECT_TRUE(has_peer(a.transport, "b"));
  expect_nothing_happened();
  ASSERT_TRUE(write("b", {1}, {2}).has_value());
  EXPECT_TRUE(landed(b, 2, 1));
}

}  // namespace
}  // namespace kvxfer::unit
