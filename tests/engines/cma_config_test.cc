// SPDX-License-Identifier: Apache-2.0
// The same-host lane's copy policy (engines/cma/cma_config.h): its
// KVXFER_CMA_* keys, their defaults and their errors, and the copier count.
// Pure: no lane.
#include "engines/cma/cma_config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>

namespace kvxfer::internal::cma {
namespace {

using Config = std::map<std::string, std::string>;

// The policy of these settings, as the engine reads them (engines/settings.h).
CopyPolicy policy_of(const Config& engine_config, const Config& environment = {}) {
  return compute_copy_policy(read_settings(engine_config, environment).cma);
}

std::string error_of(const Config& engine_config, const Config& environment = {}) {
  try {
    (void)policy_of(engine_config, environment);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(CmaConfigTest, CmaSliceIsZeroOrASizeIn4KTo1M) {
  EXPECT_EQ(policy_of({{"KVXFER_CMA_SLICE", "0"}}).caller_slice, 0u);
  EXPECT_EQ(policy_of({}).caller_slice, kDefaultCallerSlice);
  EXPECT_EQ(policy_of({{"KVXFER_CMA_SLICE", "64K"}}).caller_slice, 65536u);
  EXPECT_EQ(policy_of({{"KVXFER_CMA_SLICE", "4096"}}).caller_slice, 4096u);
  EXPECT_EQ(policy_of({{"KVXFER_CMA_SLICE", "1M"}}).caller_slice, 1u << 20);
  for (const std::string bad : {"4095", "1", "1025K", "x", ""}) {
    const std::string msg = error_of({{"KVXFER_CMA_SLICE", bad}});
    EXPECT_NE(msg.find("KVXFER_CMA_SLICE"), std::string::npos) << "'" << bad << "': " << msg;
  }
}

TEST(CmaConfigTest, CmaMapIsOnUnlessSetToPopulateOrOff) {
  EXPECT_EQ(policy_of({}).map, PoolMapping::kOn);
  EXPECT_EQ(policy_of({{"KVXFER_CMA_MAP", "on"}}).map, PoolMapping::kOn);
  EXPECT_EQ(policy_of({{"KVXFER_CMA_MAP", "populate"}}).map, PoolMapping::kPopulate);
  EXPECT_EQ(policy_of({{"KVXFER_CMA_MAP", "off"}}).map, PoolMapping::kOff);
  EXPECT_EQ(error_of({{"KVXFER_CMA_MAP", "yes"}}),
            "kvxfer cma: engine_config KVXFER_CMA_MAP=yes is not one of on, populate, off");
}

TEST(CmaConfigTest, MessagesNameTheLaneTheSettingAndItsSource) {
  EXPECT_EQ(error_of({{"KVXFER_CMA_SLICE", "lots"}}),
            "kvxfer cma: engine_config KVXFER_CMA_SLICE=lots is not a size (e.g. 65536, 64K, 1M, "
            "1G)");
  EXPECT_EQ(error_of({}, {{"KVXFER_CMA_SLICE", "2M"}}),
            "kvxfer cma: environment KVXFER_CMA_SLICE=2M is neither 0 nor in 4K..1M");
}

TEST(CmaConfigTest, TheEnvironmentAppliesWhereEngineConfigIsSilent) {
  EXPECT_EQ(policy_of({}, {{"KVXFER_CMA_MAP", "off"}}).map, PoolMapping::kOff);
  EXPECT_EQ(policy_of({{"KVXFER_CMA_MAP", "populate"}}, {{"KVXFER_CMA_MAP", "off"}}).map,
            PoolMapping::kPopulate);
  // A bad environment value that engine_config overrides is never read.
  EXPECT_EQ(policy_of({{"KVXFER_CMA_SLICE", "0"}}, {{"KVXFER_CMA_SLICE", "x"}}).caller_slice, 0u);
}

TEST(CmaConfigTest, CopiersAreNumThreadsBetweenOneAndTheCores) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(CopyPolicy::copiers(0), 1);
  EXPECT_EQ(CopyPolicy::copiers(1), 1);
  EXPECT_EQ(CopyPolicy::copiers(cores), cores);
  EXPECT_EQ(CopyPolicy::copiers(cores + 7), cores);
}

}  // namespace
}  // namespace kvxfer::internal::cma
