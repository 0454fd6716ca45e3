// SPDX-License-Identifier: Apache-2.0
// A registration the engine cannot make says why in the exception itself,
// not only in the log: the caller learns what to change (which transport must
// reach the peer, which backend to use) from what add_remote_peer throws.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "agents.h"
#include "wire/metadata.h"

namespace kvxfer::unit {
namespace {

// The message of the runtime_error add_remote_peer throws; "" (and a test
// failure) when it registers.
std::string refusal(Transport& from, const std::vector<std::uint8_t>& metadata, Transport& to) {
  try {
    from.add_remote_peer("b", metadata, to.base_addr(), to.num_blocks(), to.block_len());
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "the peer was registered";
  return "";
}

std::vector<std::uint8_t> edited(const Transport& t, void (*edit)(wire::AgentMetadata&)) {
  wire::AgentMetadata m = wire::decode(t.agent_metadata());
  edit(m);
  return wire::encode(m);
}

TEST(ConnectReasonTest, LoopbackPeerInAnotherProcessSaysToUseUcx) {
  Agent b{"agent-b"};
  Agent a{"agent-a"};
  const auto metadata = edited(b.transport, [](wire::AgentMetadata& m) {
    m.pid = static_cast<std::uint32_t>(::getpid()) + 1;
  });
  const std::string what = refusal(a.transport, metadata, b.transport);
  EXPECT_NE(what.find("cannot register peer b: NOT_FOUND"), std::string::npos) << what;
  EXPECT_NE(what.find("loopback peers must be in this process"), std::string::npos) << what;
  EXPECT_NE(what.find("UCX"), std::string::npos) << what;
}

TEST(ConnectReasonTest, ScriptedLoopbackFailureSaysItWasScripted) {
  Agent b{"agent-b"};
  Agent a{"agent-a"};
  a.plan().fail_next_connects(Status::kBackend);
  const std::string what = refusal(a.transport, b.transport.agent_metadata(), b.transport);
  EXPECT_NE(what.find("BACKEND: the fault plan scripted"), std::string::npos) << what;
}

TEST(ConnectReasonTest, AsyncRegistrationFailsItsFutureWithTheReason) {
  Agent b{"agent-b"};
  Agent a{"agent-a"};
  const auto metadata = edited(b.transport, [](wire::AgentMetadata& m) {
    m.pid = static_cast<std::uint32_t>(::getpid()) + 1;
  });
  auto future = a.transport.add_remote_peer_async(
      "b", metadata, b.transport.base_addr(), b.transport.num_blocks(), b.transport.block_len());
  try {
    future.get();
    ADD_FAILURE() << "the peer was registered";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("loopback peers must be in this process"),
              std::string::npos)
        << e.what();
  }
}

// A UCX peer on "another host" (its metadata names another boot id) with no
// tcp lane and UCX over shared memory only (KVXFER_RMA=on runs the UCX lane
// without an RDMA device): no UCX transport reaches it, and the reason says
// what must.
TEST(ConnectReasonTest, UcxPeerThatNoTransportReachesSaysWhatMustReachIt) {
  Options options;
  options.engine_config = {{"TLS", "sm,self"}, {"KVXFER_LANES", "cma,ucx"}, {"KVXFER_RMA", "on"}};
  options.progress_thread = false;
  Pool pool_b(kNumBlocks, kBlockLen);
  Pool pool_a(kNumBlocks, kBlockLen);
  Transport b("agent-b", pool_b.region(), options);
  Transport a("agent-a", pool_a.region(), options);
  const auto metadata =
      edited(b, [](wire::AgentMetadata& m) { m.boot_id = "00000000-0000-0000-0000-another-host"; });
  const std::string what = refusal(a, metadata, b);
  EXPECT_NE(what.find("cannot register peer b"), std::string::npos) << what;
  EXPECT_NE(what.find("creating the endpoint failed"), std::string::npos) << what;
  EXPECT_NE(what.find("UCX must reach it over an RDMA transport, or tcp with KVXFER_RMA=on"),
            std::string::npos)
      << what;
  EXPECT_TRUE(a.peers().empty());
  EXPECT_EQ(a.stats().live.peers, 0u);
}

}  // namespace
}  // namespace kvxfer::unit
