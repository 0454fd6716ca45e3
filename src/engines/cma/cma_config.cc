// SPDX-License-Identifier: Apache-2.0
#include "engines/cma/cma_config.h"

#include <algorithm>
#include <thread>

namespace kvxfer::internal::cma {

int CopyPolicy::copiers(int num_threads) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::clamp(num_threads, 1, cores);
}

CopyPolicy compute_copy_policy(const CmaKeys& keys) {
  CopyPolicy out;
  if (const auto& map = keys.map) {
    if (map->value == "on") {
      out.map = PoolMapping::kOn;
    } else if (map->value == "populate") {
      out.map = PoolMapping::kPopulate;
    } else if (map->value == "off") {
      out.map = PoolMapping::kOff;
    } else {
      refuse("cma", *map, "is not one of on, populate, off");
    }
  }
  if (const auto& slice = keys.slice) {
    const std::optional<std::uint64_t> bytes = parse_size(slice->value);
    if (!bytes) refuse("cma", *slice, "is not a size (e.g. 65536, 64K, 1M, 1G)");
    if (*bytes != 0 && (*bytes < 4096 || *bytes > (std::uint64_t{1} << 20))) {
      refuse("cma", *slice, "is neither 0 nor in 4K..1M");
    }
    out.caller_slice = *bytes;
  }
  return out;
}

}  // namespace kvxfer::internal::cma
