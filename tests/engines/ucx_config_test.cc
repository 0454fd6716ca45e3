// SPDX-License-Identifier: Apache-2.0
// What the UCX lane asks of UCX (engines/ucx/ucx_config.h): whether it runs
// (KVXFER_RMA), the user's UCX keys, and the TLS rules. No UCX context: the
// function is pure.
#include "engines/ucx/ucx_config.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/ucx_tls.h"

namespace kvxfer::internal::ucx {
namespace {

using Config = std::map<std::string, std::string>;

// The lane's settings from this engine_config and environment, as the
// engine reads them (engines/settings.h).
UcxSettings settings(const Config& config, const Config& env = {}, bool rdma = false) {
  return compute_ucx_settings(read_settings(config, env).ucx, rdma);
}

std::optional<std::string> key(const UcxSettings& s, const std::string& name) {
  auto it = s.overrides.find(name);
  if (it == s.overrides.end()) return std::nullopt;
  return it->second;
}

// The message of a runtime_error `f` throws, or "" when it throws none.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(UcxConfigTest, UcxPrefixIsStrippedFromEngineConfigKeys) {
  const UcxSettings s =
      settings({{"UCX_TLS", "tcp"}, {"UCX_NET_DEVICES", "lo"}, {"RNDV_THRESH", "8K"}});
  EXPECT_EQ(key(s, "TLS"), "tcp");
  EXPECT_EQ(key(s, "NET_DEVICES"), "lo");
  EXPECT_EQ(key(s, "RNDV_THRESH"), "8K");
  EXPECT_FALSE(key(s, "UCX_TLS").has_value());
}

TEST(UcxConfigTest, OnlyTheUsersKeysAndTlsArePassed) {
  // No defaults of ours (the TCP segment sizes, keepalives, PUT_ENABLE and
  // ZCOPY_THRESH of the scatter lane are gone): UCX's own, or the user's.
  EXPECT_EQ(settings({{"TLS", "tcp"}}).overrides, (Config{{"TLS", "tcp"}}));
  EXPECT_EQ(settings({{"TLS", "tcp"}}, {}, /*rdma=*/true).overrides, (Config{{"TLS", "tcp"}}));
  EXPECT_EQ(settings({{"TLS", "tcp"}, {"KVXFER_RMA", "on"}}).overrides, (Config{{"TLS", "tcp"}}));
  EXPECT_EQ(settings({}).overrides, (Config{{"TLS", "^sm"}}));
  const UcxSettings s = settings({{"TLS", "tcp"}, {"TCP_TX_SEG_SIZE", "16K"}, {"KEEPCNT", "9"}},
                                 {{"UCX_TCP_PUT_ENABLE", "y"}});
  EXPECT_EQ(s.overrides, (Config{{"TLS", "tcp"}, {"TCP_TX_SEG_SIZE", "16K"}, {"KEEPCNT", "9"}}));
}

TEST(UcxConfigTest, TlsIsAllWhenNobodySetsIt) { EXPECT_EQ(settings({}).tls, "all"); }

TEST(UcxConfigTest, TlsComesFromTheEnvironmentUnlessEngineConfigSetsIt) {
  EXPECT_EQ(settings({}, {{"UCX_TLS", "sm,self"}}).tls, "sm,self");
  EXPECT_EQ(settings({{"TLS", "tcp"}}, {{"UCX_TLS", "sm,self"}}).tls, "tcp");
  EXPECT_EQ(settings({{"UCX_TLS", "tcp"}}, {{"UCX_TLS", "sm,self"}}).tls, "tcp");
  // From the environment, UCX reads it itself: no key unless ours differs.
  EXPECT_FALSE(key(settings({}, {{"UCX_TLS", "tcp"}}), "TLS").has_value());
}

TEST(UcxConfigTest, TheContextGetsNoSharedMemoryTransports) {
  // Same-host peers never go through UCX (the CMA lane does them), and
  // UCX's shared-memory transports are most of a worker's start-up.
  const std::vector<std::pair<std::string, std::string>> cases = {{"all", "^sm"},
                                                                  {"tcp", "tcp"},
                                                                  {"sm,self,tcp", "self,tcp"},
                                                                  {"\\sm,tcp", "tcp"},
                                                                  {"^ib", "^ib,sm"},
                                                                  {"^sm", "^sm"},
                                                                  {"^shm,ib", "^shm,ib"},
                                                                  {"^tcp", "^tcp,sm"},
                                                                  {"posix,sysv,cma", "self"},
                                                                  {"tcp,all", "^sm"},
                                                                  {"rc,ud,mm,self", "rc,ud,self"}};
  for (const auto& [tls, context] : cases) {
    const UcxSettings s = settings({{"TLS", tls}});
    EXPECT_EQ(s.tls, tls) << "what lanes.cc decides with stays the user's";
    EXPECT_EQ(s.context_tls, context) << tls;
    EXPECT_EQ(s.overrides, (Config{{"TLS", context}})) << tls;
  }
  // Unset: UCX's "all" minus shared memory, from the environment too.
  EXPECT_EQ(key(settings({}), "TLS"), "^sm");
  EXPECT_EQ(key(settings({}, {{"UCX_TLS", "sm,tcp"}}), "TLS"), "tcp");
}

TEST(UcxConfigTest, WithAnRdmaDeviceUcxsTcpTransportIsLeftOutUnlessNamed) {
  const UcxSettings rdma = settings({}, {}, /*rdma=*/true);
  EXPECT_EQ(rdma.tls, "^tcp");
  EXPECT_EQ(rdma.context_tls, "^tcp,sm");
  EXPECT_EQ(rdma.overrides, (Config{{"TLS", "^tcp,sm"}}));
  EXPECT_FALSE(tls_allows(rdma.tls, {"tcp"}));
  EXPECT_FALSE(tls_allows(rdma.context_tls, {"tcp"}));
  EXPECT_TRUE(tls_allows(rdma.context_tls, {"rc"}));
  EXPECT_FALSE(rdma.tcp_beside_rdma);
  // Named (engine_config or environment): kept, and flagged for a warning.
  EXPECT_TRUE(settings({{"TLS", "tcp"}}, {}, true).tcp_beside_rdma);
  EXPECT_TRUE(settings({{"UCX_TLS", "all"}}, {}, true).tcp_beside_rdma);
  EXPECT_TRUE(settings({}, {{"UCX_TLS", "rc,tcp"}}, true).tcp_beside_rdma);
  EXPECT_EQ(settings({}, {{"UCX_TLS", "rc,tcp"}}, true).tls, "rc,tcp");
  EXPECT_FALSE(settings({{"TLS", "rc,self"}}, {}, true).tcp_beside_rdma);
  EXPECT_FALSE(settings({{"TLS", "^tcp"}}, {}, true).tcp_beside_rdma);
  // Without an RDMA device nothing changes.
  EXPECT_EQ(settings({}).tls, "all");
  EXPECT_FALSE(settings({{"TLS", "tcp"}}).tcp_beside_rdma);
}

TEST(UcxConfigTest, RmaFollowsTheRdmaDeviceByDefault) {
  EXPECT_FALSE(settings({}).rma);
  EXPECT_FALSE(settings({{"TLS", "tcp"}}).rma);
  EXPECT_TRUE(settings({}, {}, /*rdma=*/true).rma);
  EXPECT_TRUE(settings({{"TLS", "tcp"}}, {}, /*rdma=*/true).rma);
  EXPECT_FALSE(settings({{"KVXFER_RMA", "auto"}}).rma);
  EXPECT_TRUE(settings({{"KVXFER_RMA", "auto"}}, {}, true).rma);
}

TEST(UcxConfigTest, KvxferRmaOverridesTheDeviceRule) {
  const UcxSettings on = settings({{"TLS", "tcp"}, {"KVXFER_RMA", "on"}});
  EXPECT_TRUE(on.rma);
  EXPECT_FALSE(key(on, "KVXFER_RMA").has_value());  // ours, not UCX's
  EXPECT_FALSE(key(on, "RMA").has_value());
  const UcxSettings off = settings({{"TLS", "tcp"}, {"KVXFER_RMA", "off"}}, {}, true);
  EXPECT_FALSE(off.rma);
  EXPECT_FALSE(key(off, "KVXFER_RMA").has_value());
  // The TLS rules do not depend on it.
  EXPECT_EQ(settings({{"KVXFER_RMA", "off"}}, {}, true).tls, "^tcp");
  EXPECT_EQ(settings({{"KVXFER_RMA", "on"}}).tls, "all");
}

TEST(UcxConfigTest, BadKvxferRmaValuesThrowNamingTheKey) {
  for (const std::string bad : {"", "yes", "1", "ON", "Auto", " on", "true"}) {
    const std::string msg = error_of([&] { (void)settings({{"KVXFER_RMA", bad}}); });
    EXPECT_EQ(msg, "kvxfer ucx: engine_config KVXFER_RMA=" + bad + " is not one of auto, on, off");
  }
}

TEST(UcxConfigTest, KvxferRmaFromTheEnvironmentAppliesWhereEngineConfigIsSilent) {
  EXPECT_TRUE(settings({}, {{"KVXFER_RMA", "on"}}).rma);
  EXPECT_FALSE(settings({{"KVXFER_RMA", "off"}}, {{"KVXFER_RMA", "on"}}).rma);
  EXPECT_EQ(error_of([] {
              (void)settings({}, {{"KVXFER_RMA", "yes"}});
            }),
            "kvxfer ucx: environment KVXFER_RMA=yes is not one of auto, on, off");
}

TEST(UcxConfigTest, OtherLanesKeysAreNotPassedToUcx) {
  const UcxSettings s = settings({{"KVXFER_CMA_SLICE", "64K"},
                                  {"KVXFER_CMA_MAP", "off"},
                                  {"KVXFER_TCP_PORTS", "7000-7010"},
                                  {"KVXFER_LANES", "ucx"},
                                  {"TLS", "sm,self"}});
  EXPECT_EQ(s.overrides, (Config{{"TLS", "self"}}));
}

}  // namespace
}  // namespace kvxfer::internal::ucx
