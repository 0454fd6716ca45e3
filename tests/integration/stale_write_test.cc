// SPDX-License-Identifier: Apache-2.0
// Issue 10, as multi-process tests: writes posted on a registration that was
// removed must never land after a write on the peer's new registration was
// reported done. TCP on loopback (UCX_TLS=tcp on both sides, so the same-host
// process_vm_writev lane is off and every byte crosses a socket); the
// scenario itself is in stale_scenario.h, the netns variant in netns_test.cc.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <vector>

#include "it_support.h"
#include "kvxfer/transport.h"
#include "stale_scenario.h"

namespace kvxfer::it {
namespace {

using namespace std::chrono_literals;

TargetOptions tcp_target(const StaleConfig& config) {
  TargetOptions t;
  t.name = "stale-target";
  t.num_blocks = config.blocks;
  t.block_len = config.block_len;
  t.tls = "tcp";
  t.engine_config = stale_socket_config(config);
  return t;
}

void expect_no_stale(const std::vector<StaleRound>& rounds, int min_rounds) {
  std::cout << "[stale] " << StaleScenario::summary(rounds) << std::endl;
  ASSERT_GE(static_cast<int>(rounds.size()), min_rounds);
  for (const StaleRound& r : rounds) {
    EXPECT_EQ(r.stale, 0u)
        << "round " << r.round << ": " << r.stale
        << " blocks did not hold the NEW pattern 1 s after it was reported done (" << r.old_blocks
        << " held the OLD pattern of the removed registration)";
  }
}

// The scenario of the issue: the frozen peer is faulted by stall_timeout.
TEST(StaleWrite, ReRegisteredPeerNeverGetsOldBytes) {
  StaleConfig config;
  config.drop = StaleDrop::kStall;
  config.stall_timeout = 400ms;
  TargetProcess target(tcp_target(config));
  StaleScenario scenario(config, target);
  expect_no_stale(scenario.run(), config.min_rounds);
}

// No fault: the old writes are cancelled (kImmediate) while the target is
// frozen, then the peer is removed and registered again.
TEST(StaleWrite, CancelImmediateThenReRegister) {
  StaleConfig config;
  config.drop = StaleDrop::kCancelImmediate;
  TargetProcess target(tcp_target(config));
  StaleScenario scenario(config, target);
  expect_no_stale(scenario.run(), config.min_rounds);
}

}  // namespace
}  // namespace kvxfer::it
