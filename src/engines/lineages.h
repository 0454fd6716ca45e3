// SPDX-License-Identifier: Apache-2.0
// An initiator's registrations of its targets, as both lanes between hosts
// fence them (wire/fence.h, the tcp lane's hello): per target (its agent
// name and token), a random lineage for the life of the lane, and every
// registration's number in it (1, 2, ...) with a fresh random epoch.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "common/mutex.h"
#include "common/random.h"

namespace kvxfer::internal {

class Lineages {
 public:
  struct Registration {
    std::uint64_t lineage = 0;
    std::uint64_t gen = 0;
    std::uint64_t epoch = 0;
  };

  // The next registration of target (`name`, `token`).
  Registration next(const std::string& name, std::uint64_t token) {
    MutexLock lock(mu_);
    auto& [lineage, gens] = lineages_[{name, token}];
    if (lineage == 0) lineage = fresh_random();
    return {lineage, ++gens, fresh_random()};
  }

 private:
  Mutex mu_;
  std::map<std::pair<std::string, std::uint64_t>, std::pair<std::uint64_t, std::uint64_t>>
      lineages_ GUARDED_BY(mu_);
};

}  // namespace kvxfer::internal
