// SPDX-License-Identifier: Apache-2.0
// What the UCX lane asks of UCX (engines/ucx/ucx_config.h): the user's keys,
// our defaults, and who wins. No UCX context: the function is pure.
#include "engines/ucx/ucx_config.h"
#include "common/ucx_tls.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kvxfer::internal::ucx {
namespace {

using Config = std::map<std::string, std::string>;

// An environment holding exactly `vars`.
EnvLookup env_of(Config vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

UcxSettings settings(const Config& config, const Config& env = {}, bool rdma = false) {
  return compute_ucx_settings(config, env_of(env), rdma);
}

std::optional<std::string> key(const UcxSettings& s, const std::string& name) {
  auto it = s.overrides.find(name);
  if (it == s.overrides.end()) return std::nullopt;
  return it->second;
}

TEST(UcxConfigTest, UcxPrefixIsStrippedFromEngineConfigKeys) {
  const UcxSettings s =
      settings({{"UCX_TLS", "tcp"}, {"UCX_NET_DEVICES", "lo"}, {"RNDV_THRESH", "8K"}});
  EXPECT_EQ(key(s, "TLS"), "tcp");
  EXPECT_EQ(key(s, "NET_DEVICES"), "lo");
  EXPECT_EQ(key(s, "RNDV_THRESH"), "8K");
  EXPECT_FALSE(key(s, "UCX_TLS").has_value());
}

TEST(UcxConfigTest, TlsIsAllWhenNobodySetsIt) { EXPECT_EQ(settings({}).tls, "all"); }

TEST(UcxConfigTest, TlsComesFromTheEnvironmentUnlessEngineConfigSetsIt) {
  EXPECT_EQ(settings({}, {{"UCX_TLS", "sm,self"}}).tls, "sm,self");
  EXPECT_EQ(settings({{"TLS", "tcp"}}, {{"UCX_TLS", "sm,self"}}).tls, "tcp");
  EXPECT_EQ(settings({{"UCX_TLS", "tcp"}}, {{"UCX_TLS", "sm,self"}}).tls, "tcp");
}

TEST(UcxConfigTest, TcpDefaultsApplyWhereTcpMayBeUsed) {
  for (const std::string tls : {"tcp", "all", "sm,tcp,self"}) {
    const UcxSettings s = settings({{"TLS", tls}});
    EXPECT_EQ(key(s, "TX_SEG_SIZE"), "1M") << tls;
    EXPECT_EQ(key(s, "RX_SEG_SIZE"), "1M") << tls;
    EXPECT_EQ(key(s, "ZCOPY_THRESH"), "inf") << tls;
    EXPECT_EQ(key(s, "KEEPIDLE"), "5s") << tls;
    EXPECT_EQ(key(s, "KEEPINTVL"), "1s") << tls;
    EXPECT_EQ(key(s, "KEEPCNT"), "5") << tls;
  }
}

TEST(UcxConfigTest, NoTcpDefaultsWhereTcpIsNotAllowed) {
  // (The context's TLS is the user's without shared memory: see below.)
  for (const auto& [tls, context] : std::vector<std::pair<std::string, std::string>>{
           {"sm,self", "self"}, {"^tcp", "^tcp,sm"}, {"posix,cma,self", "self"}}) {
    const UcxSettings s = settings({{"TLS", tls}});
    EXPECT_EQ(s.tls, tls);
    EXPECT_EQ(s.overrides, (Config{{"TLS", context}})) << tls;
  }
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
                                                                  {"posix,sysv,cma", "self"},
                                                                  {"tcp,all", "^sm"},
                                                                  {"rc,ud,mm,self", "rc,ud,self"}};
  for (const auto& [tls, context] : cases) {
    const UcxSettings s = settings({{"TLS", tls}});
    EXPECT_EQ(s.tls, tls) << "what lanes.cc decides with stays the user's";
    EXPECT_EQ(s.context_tls, context) << tls;
    EXPECT_EQ(key(s, "TLS"), context) << tls;
  }
  // Unset: UCX's "all" minus shared memory, from the environment too.
  EXPECT_EQ(key(settings({}), "TLS"), "^sm");
  EXPECT_EQ(key(settings({}, {{"UCX_TLS", "sm,tcp"}}), "TLS"), "tcp");
}

TEST(UcxConfigTest, WithoutAnRdmaDeviceRmaIsOffAndTcpPutsAreNotAdvertised) {
  const UcxSettings s = settings({{"TLS", "tcp"}});
  EXPECT_FALSE(s.rma);
  EXPECT_EQ(key(s, "PUT_ENABLE"), "n");
  // Not where tcp is not in use (the key would be unknown to every transport).
  EXPECT_FALSE(key(settings({{"TLS", "sm,self"}}), "PUT_ENABLE").has_value());
}

TEST(UcxConfigTest, WithAnRdmaDeviceRmaIsOnAndPutsAreLeftAlone) {
  const UcxSettings s = settings({{"TLS", "tcp"}}, {}, true);
  EXPECT_TRUE(s.rma);
  EXPECT_FALSE(key(s, "PUT_ENABLE").has_value());
}

TEST(UcxConfigTest, KvxferRmaOverridesTheDeviceRule) {
  const UcxSettings on = settings({{"TLS", "tcp"}, {"KVXFER_RMA", "on"}});
  EXPECT_TRUE(on.rma);
  EXPECT_FALSE(key(on, "PUT_ENABLE").has_value());
  EXPECT_FALSE(key(on, "KVXFER_RMA").has_value());  // ours, not UCX's
  const UcxSettings off = settings({{"TLS", "tcp"}, {"KVXFER_RMA", "off"}}, {}, true);
  EXPECT_FALSE(off.rma);
  EXPECT_EQ(key(off, "PUT_ENABLE"), "n");
  EXPECT_FALSE(settings({{"KVXFER_RMA", "auto"}}).rma);
  EXPECT_TRUE(settings({{"KVXFER_RMA", "auto"}}, {}, true).rma);
  for (const std::string bad : {"", "yes", "1", "ON"}) {
    try {
      [[maybe_unused]] const UcxSettings s = settings({{"KVXFER_RMA", bad}});
      ADD_FAILURE() << "KVXFER_RMA=" << bad << " was taken";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("KVXFER_RMA"), std::string::npos) << e.what();
    }
  }
}

TEST(UcxConfigTest, UserOrEnvironmentPutEnableWins) {
  EXPECT_FALSE(key(settings({{"TLS", "tcp"}, {"TCP_PUT_ENABLE", "y"}}), "PUT_ENABLE").has_value());
  EXPECT_EQ(key(settings({{"TLS", "tcp"}, {"TCP_PUT_ENABLE", "y"}}), "TCP_PUT_ENABLE"), "y");
  EXPECT_FALSE(
      key(settings({{"TLS", "tcp"}}, {{"UCX_TCP_PUT_ENABLE", "y"}}), "PUT_ENABLE").has_value());
}

TEST(UcxConfigTest, EnvironmentWinsOverOurDefaults) {
  const UcxSettings s = settings({{"TLS", "tcp"}}, {{"UCX_TCP_TX_SEG_SIZE", "16K"},
                                                    {"UCX_TCP_RX_SEG_SIZE", "32K"},
                                                    {"UCX_ZCOPY_THRESH", "1M"},
                                                    {"UCX_TCP_KEEPIDLE", "30s"},
                                                    {"UCX_TCP_KEEPINTVL", "3s"},
                                                    {"UCX_TCP_KEEPCNT", "9"},
                                                    {"UCX_TCP_PUT_ENABLE", "y"}});
  EXPECT_EQ(s.overrides, (Config{{"TLS", "tcp"}}));
}

TEST(UcxConfigTest, UserKeyWinsOverOurDefaultsWithOrWithoutTheTransportPrefix) {
  const UcxSettings s = settings({{"TLS", "tcp"},
                                  {"TX_SEG_SIZE", "16K"},
                                  {"UCX_TCP_RX_SEG_SIZE", "32K"},
                                  {"ZCOPY_THRESH", "1M"},
                                  {"TCP_KEEPIDLE", "30s"},
                                  {"KEEPCNT", "9"}});
  EXPECT_EQ(key(s, "TX_SEG_SIZE"), "16K");
  EXPECT_EQ(key(s, "TCP_RX_SEG_SIZE"), "32K");
  EXPECT_FALSE(key(s, "RX_SEG_SIZE").has_value());
  EXPECT_EQ(key(s, "ZCOPY_THRESH"), "1M");
  EXPECT_EQ(key(s, "TCP_KEEPIDLE"), "30s");
  EXPECT_FALSE(key(s, "KEEPIDLE").has_value());
  EXPECT_EQ(key(s, "KEEPCNT"), "9");
  EXPECT_EQ(key(s, "KEEPINTVL"), "1s");  // the one the user left alone
}

TEST(UcxConfigTest, WithAnRdmaDeviceUcxsTcpTransportIsLeftOutUnlessNamed) {
  const UcxSettings rdma = settings({}, {}, /*rdma=*/true);
  EXPECT_FALSE(tls_allows(rdma.tls, {"tcp"}));
  EXPECT_FALSE(tls_allows(rdma.context_tls, {"tcp"}));
  EXPECT_TRUE(tls_allows(rdma.context_tls, {"rc"}));
  EXPECT_FALSE(rdma.tcp_beside_rdma);
  EXPECT_FALSE(key(rdma, "PUT_ENABLE").has_value());  // no tcp defaults either
  // Named (engine_config or environment): kept, and flagged for a warning.
  EXPECT_TRUE(settings({{"TLS", "tcp"}}, {}, true).tcp_beside_rdma);
  EXPECT_TRUE(settings({}, {{"UCX_TLS", "rc,tcp"}}, true).tcp_beside_rdma);
  EXPECT_FALSE(settings({{"TLS", "rc,self"}}, {}, true).tcp_beside_rdma);
  // Without an RDMA device nothing changes.
  EXPECT_EQ(settings({}).tls, "all");
  EXPECT_FALSE(settings({{"TLS", "tcp"}}).tcp_beside_rdma);
}

TEST(UcxConfigTest, RdmaDeviceLeavesZeroCopyAlone) {
  const UcxSettings s = settings({{"TLS", "tcp"}}, {}, /*rdma=*/true);
  EXPECT_FALSE(key(s, "ZCOPY_THRESH").has_value());
  EXPECT_EQ(key(s, "TX_SEG_SIZE"), "1M");
}

TEST(UcxConfigTest, ScatterKnobsDefaultAndAreNotPassedToUcx) {
  const UcxSettings defaults = settings({{"TLS", "sm,self"}});
  EXPECT_EQ(defaults.scatter_max_run, kScatterMaxRunBytes);
  EXPECT_EQ(defaults.scatter_chunk_bytes, kScatterChunkBytes);

  const UcxSettings s = settings(
      {{"TLS", "sm,self"}, {"KVXFER_SCATTER_MAX_RUN", "0"}, {"KVXFER_SCATTER_CHUNK", "1M"}});
  EXPECT_EQ(s.scatter_max_run, 0u);
  EXPECT_EQ(s.scatter_chunk_bytes, 1024u * 1024u);
  EXPECT_EQ(s.overrides, (Config{{"TLS", "self"}}));
}

TEST(UcxConfigTest, ScatterSizesTakeUnitSuffixes) {
  EXPECT_EQ(settings({{"KVXFER_SCATTER_MAX_RUN", "65536"}}).scatter_max_run, 65536u);
  EXPECT_EQ(settings({{"KVXFER_SCATTER_MAX_RUN", "64k"}}).scatter_max_run, 65536u);
  EXPECT_EQ(settings({{"KVXFER_SCATTER_CHUNK", "4K"}}).scatter_chunk_bytes, 4096u);
  EXPECT_EQ(settings({{"KVXFER_SCATTER_CHUNK", "64M"}}).scatter_chunk_bytes, 64u << 20);
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

TEST(UcxConfigTest, BadScatterValuesThrowNamingTheKey) {
  for (const std::string bad : {"", "x", "12Q", "1KB", "K", "-1", "99999999999999999999"}) {
    const std::string msg = error_of([&] { (void)settings({{"KVXFER_SCATTER_MAX_RUN", bad}}); });
    EXPECT_NE(msg.find("KVXFER_SCATTER_MAX_RUN"), std::string::npos) << "'" << bad << "': " << msg;
  }
  for (const std::string out_of_range : {"4095", "65M", "0"}) {
    const std::string msg = error_of([&] {
      (void)settings({{"KVXFER_SCATTER_CHUNK", out_of_range}});
    });
    EXPECT_NE(msg.find("KVXFER_SCATTER_CHUNK"), std::string::npos) << out_of_range << ": " << msg;
  }
}

TEST(UcxConfigTest, TheSameHostLanesKeysAreNotPassedToUcx) {
  const UcxSettings s = settings({{"KVXFER_CMA_SLICE", "64K"}, {"KVXFER_CMA_MAP", "off"}});
  EXPECT_FALSE(key(s, "KVXFER_CMA_SLICE").has_value());
  EXPECT_FALSE(key(s, "KVXFER_CMA_MAP").has_value());
}

TEST(UcxConfigTest, PostIsHandedOffUnlessKvxferPostSaysInline) {
  EXPECT_TRUE(settings({}).post_handoff);
  EXPECT_TRUE(settings({{"KVXFER_POST", "handoff"}}).post_handoff);
  const UcxSettings in = settings({{"KVXFER_POST", "inline"}});
  EXPECT_FALSE(in.post_handoff);
  EXPECT_FALSE(key(in, "KVXFER_POST").has_value());  // ours, not UCX's
  try {
    [[maybe_unused]] const UcxSettings s = settings({{"KVXFER_POST", "later"}});
    ADD_FAILURE() << "KVXFER_POST=later was taken";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("KVXFER_POST=later"), std::string::npos) << e.what();
  }
}

// Every value in `bad` for engine_config `key` is refused with an error
// that names the key.
void expect_refused_naming(const std::string& key, std::initializer_list<const char*> bad) {
  for (const char* value : bad) {
    const std::string msg = error_of([&] { (void)settings({{key, value}}); });
    EXPECT_FALSE(msg.empty()) << key << "='" << value << "' was taken";
    EXPECT_NE(msg.find(key), std::string::npos) << key << "='" << value << "': " << msg;
  }
}

TEST(UcxConfigTest, ProgressNiceIsAnIntegerInTheNiceRange) {
  EXPECT_FALSE(settings({}).progress_nice.has_value());
  EXPECT_EQ(settings({{"KVXFER_PROGRESS_NICE", "-10"}}).progress_nice, -10);
  EXPECT_EQ(settings({{"KVXFER_PROGRESS_NICE", "19"}}).progress_nice, 19);
  const UcxSettings low = settings({{"KVXFER_PROGRESS_NICE", "-20"}});
  EXPECT_EQ(low.progress_nice, -20);
  EXPECT_FALSE(key(low, "KVXFER_PROGRESS_NICE").has_value());  // ours, not UCX's
  expect_refused_naming("KVXFER_PROGRESS_NICE", {"", "20", "-21", "5x", "high", " 1", "+"});
}

TEST(UcxConfigTest, NapIsMicrosecondsUpToATenthOfASecond) {
  using std::chrono::microseconds;
  EXPECT_EQ(settings({}).nap, microseconds(kNapMicros));
  EXPECT_EQ(settings({{"KVXFER_NAP_US", "0"}}).nap, microseconds(0));
  const UcxSettings max = settings({{"KVXFER_NAP_US", "100000"}});
  EXPECT_EQ(max.nap, microseconds(100'000));
  EXPECT_FALSE(key(max, "KVXFER_NAP_US").has_value());  // ours, not UCX's
  expect_refused_naming("KVXFER_NAP_US", {"", "100001", "-1", "5us", "soon", " 1", "1e3"});
}

TEST(UcxConfigTest, LingerIsMicrosecondsInStepsOfAtLeastOne) {
  using std::chrono::microseconds;
  EXPECT_EQ(settings({}).linger, microseconds(kLingerMicros));
  EXPECT_EQ(settings({}).linger_step, microseconds(kLingerStepMicros));
  EXPECT_EQ(settings({{"KVXFER_LINGER_US", "0"}}).linger, microseconds(0));
  const UcxSettings max =
      settings({{"KVXFER_LINGER_US", "100000"}, {"KVXFER_LINGER_STEP_US", "100000"}});
  EXPECT_EQ(max.linger, microseconds(100'000));
  EXPECT_EQ(max.linger_step, microseconds(100'000));
  EXPECT_EQ(settings({{"KVXFER_LINGER_STEP_US", "1"}}).linger_step, microseconds(1));
  EXPECT_FALSE(key(max, "KVXFER_LINGER_US").has_value());  // ours, not UCX's
  EXPECT_FALSE(key(max, "KVXFER_LINGER_STEP_US").has_value());
  expect_refused_naming("KVXFER_LINGER_US", {"", "100001", "-1", "5us", " 1"});
  // A step of 0 would never sleep.
  expect_refused_naming("KVXFER_LINGER_STEP_US", {"0", "", "100001", "-1", "1ms"});
}

}  // namespace
}  // namespace kvxfer::internal::ucx
