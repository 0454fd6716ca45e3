// SPDX-License-Identifier: Apache-2.0
// Behaviour 1: the local pool is one memory registration; a peer's
// registration is O(1) in its number of blocks.
#include <gtest/gtest.h>

#include "agents.h"

namespace kvxfer::unit {
namespace {

TEST(RegistrationTest, LocalPoolIsOneMemoryRegistration) {
  Agent a{"agent-a"};
  const HandleCounts live = a.transport.stats().live;
  EXPECT_EQ(live.memory_registrations, 1u);
  EXPECT_EQ(live.peers, 0u);
  EXPECT_EQ(live.remote_keys, 0u);
  EXPECT_EQ(live.transfers, 0u);
  EXPECT_EQ(live.requests, 0u);
}

TEST(RegistrationTest, TransportReportsItsPoolAndBackend) {
  Agent a{"agent-a"};
  EXPECT_TRUE(a.transport.available());
  EXPECT_EQ(a.transport.agent_name(), "agent-a");
  EXPECT_EQ(a.transport.base_addr(), reinterpret_cast<std::uintptr_t>(a.pool.region().base));
  EXPECT_EQ(a.transport.num_blocks(), kNumBlocks);
  EXPECT_EQ(a.transport.block_len(), kBlockLen);
  EXPECT_EQ(a.transport.backend(), "LOOPBACK");
  EXPECT_FALSE(a.transport.agent_metadata().empty());
}

TEST(RegistrationTest, PeerRegistrationIsOneEndpointAndOneRemoteKey) {
  Agent b{"agent-b"};
  Agent a{"agent-a"};
  add_peer(a.transport, "b", b.transport);
  const HandleCounts live = a.transport.stats().live;
  EXPECT_EQ(live.memory_registrations, 1u);
  EXPECT_EQ(live.peers, 1u);
  EXPECT_EQ(live.remote_keys, 1u);
  EXPECT_EQ(a.transport.peers(), std::vector<std::string>{"b"});
}

TEST(RegistrationTest, PeerOf262144BlocksIsOneEndpointAndOneRemoteKey) {
  constexpr std::uint64_t kBig = 262'144;
  constexpr std::uint64_t kSmallBlock = 16;
  Agent big{"agent-big", loopback_options(), kBig, kSmallBlock};
  Agent a{"agent-a", loopback_options(), 4, kSmallBlock};
  a.pool.fill_pattern(3);

  add_peer(a.transport, "big", big.transport);

  const Stats stats = a.transport.stats();
  EXPECT_EQ(stats.live.peers, 1u);
  EXPECT_EQ(stats.live.remote_keys, 1u);
  EXPECT_EQ(stats.live.transfers, 0u);
  EXPECT_EQ(peer_stats(a.transport, "big").num_blocks, kBig);
  // The whole region is reachable through that one registration.
  const auto id = write(a.transport, "big", {2}, {static_cast<std::int64_t>(kBig - 1)});
  ASSERT_TRUE(id.has_value());
  const auto want = a.pool.block(2);
  const auto got = big.pool.block(static_cast<std::int64_t>(kBig - 1));
  EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin(), got.end()));
}

}  // namespace
}  // namespace kvxfer::unit
