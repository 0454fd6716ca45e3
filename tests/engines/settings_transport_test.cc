// SPDX-License-Identifier: Apache-2.0
// The engine's settings where they act: a Transport of backend UCX refuses
// a misspelt KVXFER_* name, in engine_config or in the environment, naming
// it and the key it likely meant, and takes engine_config over the
// environment (engines/settings.h has the rules, settings_test.cc each one).
// Public API only.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kvxfer/transport.h"
#include "support/proc_threads.h"

namespace kvxfer {
namespace {

using kvxfer::test::threads_named;

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

TEST(TransportSettingsTest, PretouchTakesAutoOnOffFromEngineConfigOverTheEnvironment) {
  const ScopedEnv env("KVXFER_PRETOUCH", "sometimes");
  EXPECT_EQ(transport_error({}),
            "kvxfer transport: environment KVXFER_PRETOUCH=sometimes is not auto, on or off");
  for (const char* mode : {"auto", "on", "off"}) {
    EXPECT_EQ(transport_error({{"KVXFER_PRETOUCH", mode}}), "") << mode;
  }
}

// Threads of this process named `name`.
TEST(TransportSettingsTest, PretouchOffStartsNoThreadAndReportsNoCounters) {
  std::vector<std::uint8_t> pool(16 * 4096, 1);
  Options options;
  options.engine_config = {{"KVXFER_PRETOUCH", "off"}};
  const int before = threads_named("kvxfer-touch");
  Transport t("pretouch-off", Region{pool.data(), 16, 4096}, options);
  EXPECT_EQ(threads_named("kvxfer-touch"), before);
  const auto counters = t.stats().engine_counters;
  EXPECT_FALSE(counters.contains("pretouch_pages"));
  EXPECT_FALSE(counters.contains("pretouch_running"));
}

TEST(TransportSettingsTest, PretouchOnReadsEveryPageOfThePoolAndChangesNone) {
  constexpr std::size_t kPage = 4096;
  std::vector<std::uint8_t> pool(64 * kPage);
  for (std::size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<std::uint8_t>(i * 7);
  const std::vector<std::uint8_t> before = pool;
  Options options;
  options.engine_config = {{"KVXFER_PRETOUCH", "on"}};
  Transport t("pretouch-on", Region{pool.data(), 64, kPage}, options);
  while (t.stats().engine_counters.at("pretouch_running") != 0) std::this_thread::yield();
  // 64 pages, 65 when the vector's storage does not start on a page.
  const std::uint64_t pages = t.stats().engine_counters.at("pretouch_pages");
  EXPECT_TRUE(pages == 64 || pages == 65) << pages;
  t.close();
  EXPECT_EQ(pool, before);
}

// 16 GiB reserved and never written: reading every page takes seconds, so
// close() finds the pre-touch running, and must stop it, not wait for it.
TEST(TransportSettingsTest, CloseDuringThePretouchStopsIt) {
  const std::size_t bytes = std::size_t{16} << 30;
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  {
    Options options;
    options.engine_config = {{"KVXFER_PRETOUCH", "on"}};
    Transport t("pretouch-close", Region{static_cast<std::uint8_t*>(p), bytes >> 20, 1 << 20},
                options);
    while (t.stats().engine_counters.at("pretouch_pages") == 0) std::this_thread::yield();
    t.close();
    const auto counters = t.stats().engine_counters;
    EXPECT_EQ(counters.at("pretouch_running"), 0u);
    EXPECT_LT(counters.at("pretouch_pages"), bytes / 4096);
    EXPECT_EQ(threads_named("kvxfer-touch"), 0);
  }
  ::munmap(p, bytes);
}

// Regions registered besides the pool (here: no pool at all) are read ahead
// too; one deregistered while it is being read stops being read.
TEST(TransportSettingsTest, PretouchOnReadsRegisteredRegionsAndStopsAtTheirDeregistration) {
  constexpr std::size_t kPage = 4096;
  void* small = ::mmap(nullptr, 64 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
  ASSERT_NE(small, MAP_FAILED);
  const std::size_t huge_bytes = std::size_t{16} << 30;
  void* huge = ::mmap(nullptr, huge_bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                      -1, 0);
  ASSERT_NE(huge, MAP_FAILED);
  {
    Options options;
    options.engine_config = {{"KVXFER_PRETOUCH", "on"}};
    Transport t("pretouch-regions", Region{}, options);
    const RegionId a = t.register_memory(small, 64 * kPage);
    while (t.stats().engine_counters.at("pretouch_running") != 0) std::this_thread::yield();
    EXPECT_EQ(t.stats().engine_counters.at("pretouch_pages"), 64u);
    const RegionId b = t.register_memory(huge, huge_bytes);
    while (t.stats().engine_counters.at("pretouch_pages") == 64) std::this_thread::yield();
    t.deregister_memory(b);  // returns once no page of it is read any more
    const std::uint64_t pages = t.stats().engine_counters.at("pretouch_pages");
    EXPECT_LT(pages, 64 + huge_bytes / kPage);
    while (t.stats().engine_counters.at("pretouch_running") != 0) std::this_thread::yield();
    EXPECT_EQ(t.stats().engine_counters.at("pretouch_pages"), pages);
    t.deregister_memory(a);
    t.close();
  }
  ::munmap(huge, huge_bytes);
  ::munmap(small, 64 * kPage);
}

}  // namespace
}  // namespace kvxfer
