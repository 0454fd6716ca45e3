// SPDX-License-Identifier: Apache-2.0
#include "engines/cma/cma_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <thread>

#include "common/size_setting.h"

namespace kvxfer::internal::cma {

int CopyPolicy::copiers(int num_threads) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::clamp(num_threads, 1, cores);
}

CopyPolicy compute_copy_policy(const std::map<std::string, std::string>& engine_config) {
  CopyPolicy out;
  // Both lanes are backend UCX's: its name heads every message.
  for (const auto& [key, value] : engine_config) {
    if (!is_cma_key(key)) continue;
    if (key == "KVXFER_CMA_MAP") {
      if (value == "on") {
        out.map = PoolMapping::kOn;
      } else if (value == "populate") {
        out.map = PoolMapping::kPopulate;
      } else if (value == "off") {
        out.map = PoolMapping::kOff;
      } else {
        throw std::runtime_error(fmt::format(
            "kvxfer cma: engine_config KVXFER_CMA_MAP={} is not one of on, populate, off", value));
      }
    } else if (key == "KVXFER_CMA_SLICE") {
      out.caller_slice = parse_size_setting("UCX", key, value);
      if (out.caller_slice != 0 &&
          (out.caller_slice < 4096 || out.caller_slice > (std::uint64_t{1} << 20))) {
        throw std::runtime_error(fmt::format(
            "kvxfer cma: engine_config KVXFER_CMA_SLICE={} is neither 0 nor in 4K..1M", value));
      }
    } else {
      // Before this lane read its own keys, UCX was handed them and
      // rejected them: the same words.
      throw std::runtime_error(fmt::format(
          "kvxfer cma: engine_config {}={} rejected: not a setting of the same-host lane "
          "(KVXFER_CMA_MAP, KVXFER_CMA_SLICE)",
          key, value));
    }
  }
  return out;
}

}  // namespace kvxfer::internal::cma
