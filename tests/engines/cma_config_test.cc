// SPDX-License-Identifier: Apache-2.0
// The same-host lane's settings (engines/cma/cma_config.h): its KVXFER_CMA_*
// keys of engine_config, their defaults and their errors. Pure: no lane.
#include "engines/cma/cma_config.h"

#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>

namespace kvxfer::internal::cma {
namespace {

using Config = std::map<std::string, std::string>;

std::string error_of(const Config& config) {
  try {
    (void)compute_cma_settings(config);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(CmaConfigTest, CmaSliceIsASizeIn4KTo1M) {
  EXPECT_EQ(compute_cma_settings({}).caller_slice, kCallerSliceBytes);
  EXPECT_EQ(compute_cma_settings({{"KVXFER_CMA_SLICE", "64K"}}).caller_slice, 65536u);
  EXPECT_EQ(compute_cma_settings({{"KVXFER_CMA_SLICE", "4096"}}).caller_slice, 4096u);
  EXPECT_EQ(compute_cma_settings({{"KVXFER_CMA_SLICE", "1M"}}).caller_slice, 1u << 20);
  for (const std::string bad : {"4095", "1025K", "0", "x", ""}) {
    const std::string msg = error_of({{"KVXFER_CMA_SLICE", bad}});
    EXPECT_NE(msg.find("KVXFER_CMA_SLICE"), std::string::npos) << "'" << bad << "': " << msg;
  }
}

TEST(CmaConfigTest, CmaMapIsOnUnlessSetToPopulateOrOff) {
  EXPECT_EQ(compute_cma_settings({}).map, PoolMapping::kOn);
  EXPECT_EQ(compute_cma_settings({{"KVXFER_CMA_MAP", "on"}}).map, PoolMapping::kOn);
  EXPECT_EQ(compute_cma_settings({{"KVXFER_CMA_MAP", "populate"}}).map, PoolMapping::kPopulate);
  EXPECT_EQ(compute_cma_settings({{"KVXFER_CMA_MAP", "off"}}).map, PoolMapping::kOff);
  EXPECT_EQ(error_of({{"KVXFER_CMA_MAP", "yes"}}),
            "kvxfer UCX: engine_config KVXFER_CMA_MAP=yes is not one of on, populate, off");
}

TEST(CmaConfigTest, OtherLanesKeysAreLeftAloneAndAnUnknownCmaKeyIsRejected) {
  const CmaSettings s = compute_cma_settings(
      {{"KVXFER_SCATTER_CHUNK", "x"}, {"TLS", "sm,self"}, {"RNDV_THRESH", "8K"}});
  EXPECT_EQ(s.map, PoolMapping::kOn);
  EXPECT_EQ(s.caller_slice, kCallerSliceBytes);
  EXPECT_NE(error_of({{"KVXFER_CMA_SLOTS", "4"}}).find("KVXFER_CMA_SLOTS=4 rejected"),
            std::string::npos);
}

}  // namespace
}  // namespace kvxfer::internal::cma
