// SPDX-License-Identifier: Apache-2.0
// The engine's settings (engines/settings.h): one precedence rule for every
// key (engine_config wins over the environment), every KVXFER_* name known
// or refused by name with the nearest known one, removed settings refused
// with why, each lane handed only its own keys, UCX's keys to the UCX lane
// alone. Pure (settings_transport_test.cc: the same rules at a Transport).
#include "engines/settings.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engines/cma/cma_config.h"
#include "engines/tcp/tcp_config.h"
#include "engines/ucx/ucx_config.h"

namespace kvxfer::internal {
namespace {

using Config = std::map<std::string, std::string>;

// The message read_settings throws, or "" when it takes both.
std::string error_of(const Config& engine_config, const Config& environment = {}) {
  try {
    (void)read_settings(engine_config, environment);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

const KnownKey& known(const std::string& name) {
  for (const KnownKey& key : known_keys()) {
    if (name == key.name) return key;
  }
  throw std::logic_error(name + " is not in known_keys()");
}

// The slot read_settings fills for `name`, in `settings`.
const std::optional<Setting>& slot_of(EngineSettings& settings, const std::string& name) {
  return *known(name).slot(settings);
}

std::vector<std::string> engine_key_names() {
  std::vector<std::string> out;
  for (const KnownKey& key : known_keys()) {
    if (key.slot != nullptr) out.emplace_back(key.name);
  }
  return out;
}

TEST(SettingsTest, EngineConfigWinsOverTheEnvironmentForEveryKey) {
  for (const std::string& name : engine_key_names()) {
    SCOPED_TRACE(name);
    EngineSettings both = read_settings({{name, "from-config"}}, {{name, "from-env"}});
    ASSERT_TRUE(slot_of(both, name).has_value());
    EXPECT_EQ(slot_of(both, name)->value, "from-config");
    EXPECT_FALSE(slot_of(both, name)->from_environment);

    EngineSettings env = read_settings({}, {{name, "from-env"}});
    ASSERT_TRUE(slot_of(env, name).has_value());
    EXPECT_EQ(slot_of(env, name)->value, "from-env");
    EXPECT_TRUE(slot_of(env, name)->from_environment);

    EngineSettings neither = read_settings({}, {});
    EXPECT_FALSE(slot_of(neither, name).has_value());
  }
}

// The one key whose environment used to win.
TEST(SettingsTest, EngineConfigLanesWinOverTheEnvironmentsLanes) {
  const EngineSettings s = read_settings({{"KVXFER_LANES", "tcp"}}, {{"KVXFER_LANES", "cma"}});
  ASSERT_TRUE(s.lanes.has_value());
  EXPECT_EQ(s.lanes->value, "tcp");
  EXPECT_EQ(s.lanes->said(), "engine_config KVXFER_LANES=tcp");
}

TEST(SettingsTest, EachSourceCountsKeyByKey) {
  // engine_config sets one tcp key, the environment the other: both hold.
  const EngineSettings s =
      read_settings({{"KVXFER_TCP_PORTS", "7000"}}, {{"KVXFER_TCP_ADDRESS", "10.0.0.2"}});
  ASSERT_TRUE(s.tcp.ports && s.tcp.address);
  EXPECT_EQ(s.tcp.ports->said(), "engine_config KVXFER_TCP_PORTS=7000");
  EXPECT_EQ(s.tcp.address->said(), "environment KVXFER_TCP_ADDRESS=10.0.0.2");
}

TEST(SettingsTest, UnknownKeyInEngineConfigIsRefusedNamingItAndTheNearestKnownKey) {
  EXPECT_EQ(error_of({{"KVXFER_LANE", "tcp"}}),
            "kvxfer: engine_config KVXFER_LANE is not a kvxfer setting; did you mean "
            "KVXFER_LANES? (docs/configuration.md lists them all)");
}

TEST(SettingsTest, UnknownKeyInTheEnvironmentIsRefusedNamingItAndTheNearestKnownKey) {
  EXPECT_EQ(error_of({}, {{"KVXFER_LANE", "tcp"}}),
            "kvxfer: environment KVXFER_LANE is not a kvxfer setting; did you mean "
            "KVXFER_LANES? (docs/configuration.md lists them all)");
  // Even where engine_config sets the key it meant.
  EXPECT_NE(error_of({{"KVXFER_LANES", "tcp"}}, {{"KVXFER_LANE", "tcp"}}).find("KVXFER_LANE "),
            std::string::npos);
}

TEST(SettingsTest, TheSuggestionIsTheNearestKnownKey) {
  // A letter missing, another changed, two swapped, one too many, the
  // case, and names only the environment holds.
  const std::map<std::string, std::string> cases = {
      {"KVXFER_TCP_PORT", "KVXFER_TCP_PORTS"},      {"KVXFER_CMA_SLCE", "KVXFER_CMA_SLICE"},
      {"KVXFER_TCP_ADDRESZ", "KVXFER_TCP_ADDRESS"}, {"KVXFER_RAM", "KVXFER_RMA"},
      {"KVXFER_CMA_MAPS", "KVXFER_CMA_MAP"},        {"kvxfer_lanes", "KVXFER_LANES"},
      {"KVXFER_LOGLEVEL", "KVXFER_LOG_LEVEL"},      {"KVXFER_TEST_TIERS", "KVXFER_TEST_TIER"},
  };
  for (const auto& [typo, meant] : cases) {
    EXPECT_EQ(nearest_known_key(typo), meant) << typo;
    EXPECT_NE(error_of({{typo, "1"}}).find("did you mean " + meant + "?"), std::string::npos)
        << typo;
  }
}

TEST(SettingsTest, AKvxferKeyInAnyCaseIsOursNotUcxs) {
  EXPECT_TRUE(is_kvxfer_name("KVXFER_LANES"));
  EXPECT_TRUE(is_kvxfer_name("kvxfer_lanes"));
  EXPECT_TRUE(is_kvxfer_name("Kvxfer_X"));
  EXPECT_FALSE(is_kvxfer_name("KVXFER"));
  EXPECT_FALSE(is_kvxfer_name("UCX_KVXFER_LANES"));
  EXPECT_FALSE(is_kvxfer_name("TLS"));
  EXPECT_EQ(error_of({{"kvxfer_lanes", "tcp"}}),
            "kvxfer: engine_config kvxfer_lanes is not a kvxfer setting; did you mean "
            "KVXFER_LANES? (docs/configuration.md lists them all)");
}

TEST(SettingsTest, RemovedKeysAreRefusedWithWhyTheyWent) {
  // Settings of the UCX lane's scatter messages and of its progress
  // thread's naps and lingers: refused whatever the value (even one the old
  // lane took), from either source, with their own words.
  const std::vector<std::pair<std::string, std::string>> removed = {
      {"KVXFER_SCATTER_MAX_RUN", "64K"},
      {"KVXFER_SCATTER_CHUNK", "1M"},
      {"KVXFER_SCATTER_ANYTHING", "1"},
      {"KVXFER_POST", "inline"},
      {"KVXFER_NAP_US", "0"},
      {"KVXFER_LINGER_US", "100"},
      {"KVXFER_LINGER_STEP_US", "10"},
      {"KVXFER_PROGRESS_NICE", "-10"}};
  for (const auto& [name, value] : removed) {
    EXPECT_EQ(error_of({{name, value}}),
              "kvxfer ucx: engine_config " + name +
                  " is gone: the UCX lane writes with puts, and its progress thread sleeps until "
                  "UCX or a post wakes it (docs/configuration.md)");
    EXPECT_EQ(error_of({}, {{name, value}}),
              "kvxfer ucx: environment " + name +
                  " is gone: the UCX lane writes with puts, and its progress thread sleeps until "
                  "UCX or a post wakes it (docs/configuration.md)");
  }
}

TEST(SettingsTest, OthersEnvironmentVariablesAreLeftAloneThereAndRefusedInEngineConfig) {
  for (const KnownKey& key : known_keys()) {
    if (key.slot != nullptr) continue;
    SCOPED_TRACE(key.name);
    EXPECT_EQ(error_of({}, {{key.name, "1"}}), "");
    const std::string msg = error_of({{key.name, "1"}});
    EXPECT_NE(msg.find(std::string("engine_config ") + key.name + " is not an engine setting"),
              std::string::npos)
        << msg;
  }
  EXPECT_EQ(error_of({{"KVXFER_LOG_LEVEL", "debug"}}),
            "kvxfer: engine_config KVXFER_LOG_LEVEL is not an engine setting: the library's "
            "logger (src/common/log.cc) reads it from the environment (docs/configuration.md)");
}

TEST(SettingsTest, EachLaneGetsOnlyItsOwnKeys) {
  Config config;
  for (const std::string& name : engine_key_names()) config[name] = "x";
  config["TLS"] = "tcp";
  config["UCX_NET_DEVICES"] = "lo";
  const EngineSettings s = read_settings(config, {{"UCX_TLS", "rc"}, {"UCX_RNDV_THRESH", "8K"}});
  ASSERT_TRUE(s.lanes && s.cma.map && s.cma.slice && s.tcp.address && s.tcp.ports && s.ucx.rma);
  EXPECT_EQ(s.lanes->key, "KVXFER_LANES");
  EXPECT_EQ(s.cma.map->key, "KVXFER_CMA_MAP");
  EXPECT_EQ(s.cma.slice->key, "KVXFER_CMA_SLICE");
  EXPECT_EQ(s.tcp.address->key, "KVXFER_TCP_ADDRESS");
  EXPECT_EQ(s.tcp.ports->key, "KVXFER_TCP_PORTS");
  EXPECT_EQ(s.ucx.rma->key, "KVXFER_RMA");
  // UCX gets UCX's keys and nothing of ours.
  EXPECT_EQ(s.ucx.ucx_config, (Config{{"TLS", "tcp"}, {"UCX_NET_DEVICES", "lo"}}));
  EXPECT_EQ(s.ucx.environment_tls, "rc");
}

// Every engine_config key that is not KVXFER_* is UCX's configuration, with
// or without the UCX_ prefix, as before: it goes to the UCX lane alone,
// which hands it to ucp_config_modify (where UCX judges it).
TEST(SettingsTest, EveryOtherEngineConfigKeyGoesToUcxAsGiven) {
  const Config ucx = {
      {"UCX_TLS", "tcp"}, {"NET_DEVICES", "lo"}, {"RNDV_THRESH", "8K"}, {"NOT_A_UCX_KEY", "1"}};
  EXPECT_EQ(read_settings(ucx, {}).ucx.ucx_config, ucx);
  // The environment's UCX_* variables are UCX's to read: only UCX_TLS is
  // looked at, for the lane's own TLS rules.
  const EngineSettings s = read_settings({}, {{"UCX_TLS", "tcp"}, {"UCX_NET_DEVICES", "lo"}});
  EXPECT_TRUE(s.ucx.ucx_config.empty());
  EXPECT_EQ(s.ucx.environment_tls, "tcp");
}

TEST(SettingsTest, ProcessEnvironmentHoldsKvxferVariablesAndUcxTlsOnly) {
  struct Var {
    const char* name;
    std::optional<std::string> saved;
  };
  std::vector<Var> vars = {{"KVXFER_NETNS_KEEP", {}}, {"UCX_TLS", {}}, {"UCX_NET_DEVICES", {}}};
  for (Var& v : vars) {
    if (const char* old = std::getenv(v.name)) v.saved = old;
    ::setenv(v.name, "settings-test", 1);
  }
  const Config env = process_environment();
  for (Var& v : vars) {
    if (v.saved) {
      ::setenv(v.name, v.saved->c_str(), 1);
    } else {
      ::unsetenv(v.name);
    }
  }
  EXPECT_EQ(env.at("KVXFER_NETNS_KEEP"), "settings-test");
  EXPECT_EQ(env.at("UCX_TLS"), "settings-test");
  EXPECT_FALSE(env.contains("UCX_NET_DEVICES"));
  EXPECT_FALSE(env.contains("PATH"));
}

TEST(SettingsTest, EveryKnownKeyIsDocumentedWhereTheTableSays) {
  for (const KnownKey& key : known_keys()) {
    std::ifstream page(std::string(KVXFER_SOURCE_DIR) + "/" + key.documented_in);
    ASSERT_TRUE(page) << key.documented_in;
    const std::string text{std::istreambuf_iterator<char>(page), {}};
    EXPECT_NE(text.find(std::string("`") + key.name + "`"), std::string::npos)
        << key.name << " is not in " << key.documented_in;
  }
}

// Each lane's default, given explicitly, is what the lane takes with the
// key unset (KVXFER_LANES's is lanes.cc's, tested through a Transport).
TEST(SettingsTest, EachDefaultInTheTableIsTheLanesDefault) {
  const auto settings_with = [](const KnownKey& key) {
    return read_settings({{key.name, key.default_value}}, {});
  };
  const EngineSettings unset = read_settings({}, {});
  for (const KnownKey& key : known_keys()) {
    if (key.slot == nullptr || key.default_value == nullptr) continue;
    SCOPED_TRACE(key.name);
    const std::string owner = key.owner;
    if (owner == "cma") {
      EXPECT_EQ(cma::compute_copy_policy(settings_with(key).cma),
                cma::compute_copy_policy(unset.cma));
    } else if (owner == "tcp") {
      EXPECT_EQ(tcp::compute_tcp_settings(settings_with(key).tcp),
                tcp::compute_tcp_settings(unset.tcp));
    } else if (owner == "ucx") {
      for (const bool rdma : {false, true}) {
        EXPECT_EQ(ucx::compute_ucx_settings(settings_with(key).ucx, rdma),
                  ucx::compute_ucx_settings(unset.ucx, rdma));
      }
    } else {
      EXPECT_EQ(owner, "engine");
    }
  }
}

TEST(SettingsTest, ParseSizeTakesBytesAndKMGSuffixes) {
  EXPECT_EQ(parse_size("0"), 0u);
  EXPECT_EQ(parse_size("65536"), 65536u);
  EXPECT_EQ(parse_size("64K"), 65536u);
  EXPECT_EQ(parse_size("64k"), 65536u);
  EXPECT_EQ(parse_size("1M"), 1u << 20);
  EXPECT_EQ(parse_size("1g"), 1u << 30);
  EXPECT_EQ(parse_size("18446744073709551615"), UINT64_MAX);
  for (const char* bad :
       {"", "K", "1T", "1KB", " 1", "1 ", "-1", "0x10", "18446744073709551616", "17179869184G"}) {
    EXPECT_FALSE(parse_size(bad).has_value()) << "'" << bad << "'";
  }
}

}  // namespace
}  // namespace kvxfer::internal
