// SPDX-License-Identifier: Apache-2.0
// The engine's settings where they act: a Transport of backend UCX refuses
// a misspelt KVXFER_* name, in engine_config or in the environment, naming
// it and the key it likely meant, and takes engine_config over the
// environment (engines/settings.h has the rules, settings_test.cc each one).
// Public API only.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvxfer/transport.h"

namespace kvxfer {
namespace {

using Config = std::map<std::string, std::string>;

// An environment variable set for one test, restored after it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (saved_) {
      ::setenv(name_, saved_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

// The message of the runtime_error a Transport of this engine_config
// throws, or "" when it starts.
std::string transport_error(const Config& engine_config) {
  std::vector<std::uint8_t> pool(16 * 64);
  Options options;
  options.engine_config = engine_config;
  try {
    Transport t("settings", Region{pool.data(), 16, 64}, options);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(TransportSettingsTest, AMisspeltKeyInEngineConfigRefusesTheTransport) {
  EXPECT_EQ(transport_error({{"KVXFER_LANE", "tcp"}}),
            "kvxfer: engine_config KVXFER_LANE is not a kvxfer setting; did you mean "
            "KVXFER_LANES? (docs/configuration.md lists them all)");
}

TEST(TransportSettingsTest, AMisspeltVariableInTheEnvironmentRefusesTheTransport) {
  const ScopedEnv env("KVXFER_LANE", "tcp");
  EXPECT_EQ(transport_error({{"KVXFER_LANES", "tcp"}}),
            "kvxfer: environment KVXFER_LANE is not a kvxfer setting; did you mean "
            "KVXFER_LANES? (docs/configuration.md lists them all)");
}

TEST(TransportSettingsTest, EngineConfigLanesWinOverTheEnvironment) {
  // The environment's list does not parse: read, it would refuse.
  const ScopedEnv env("KVXFER_LANES", "nope");
  EXPECT_EQ(transport_error({{"KVXFER_LANES", "tcp"}}), "");
  EXPECT_EQ(transport_error({}),
            "kvxfer: environment KVXFER_LANES=nope is not a list of distinct lanes among cma, "
            "ucx, tcp");
}

TEST(TransportSettingsTest, TheEnvironmentAppliesToEveryLanesKeys) {
  const ScopedEnv env("KVXFER_CMA_MAP", "sometimes");
  EXPECT_EQ(transport_error({{"KVXFER_LANES", "tcp"}}),
            "kvxfer cma: environment KVXFER_CMA_MAP=sometimes is not one of on, populate, off");
  EXPECT_EQ(transport_error({{"KVXFER_LANES", "tcp"}, {"KVXFER_CMA_MAP", "off"}}), "");
}

}  // namespace
}  // namespace kvxfer
