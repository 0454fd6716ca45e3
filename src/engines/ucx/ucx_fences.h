// SPDX-License-Identifier: Apache-2.0
// The target's side of fencing (wire/fence.h): per initiator lineage, the
// newest registration fenced, the endpoint its fence came on and the
// sender's name. A notification counts only with that registration's epoch,
// on that endpoint, and is delivered under that name. Driver only.
//
// Bounded without evicting what an attacker can flood: a full table
// (wire::kMaxFences) refuses new lineages, except that it forgets the quietest
// one once that has been silent for kIdle with no ack in flight.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "wire/fence.h"

namespace kvxfer::internal::ucx {

class FenceTable {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kIdle = std::chrono::seconds(60);

  struct Entry {
    std::uint64_t gen = 0;
    std::uint64_t epoch = 0;
    ucp_ep_h from = nullptr;
    std::string name;
    Clock::time_point heard{};
    std::uint32_t acks = 0;  // in flight to this lineage
  };
  enum class Verdict { kTaken, kStale, kFull };

  // A fence that came on `from`: taken for a new lineage (with room) or a
  // newer gen than the one kept.
  Verdict take(const wire::Fence& fence, ucp_ep_h from, Clock::time_point now);
  // The entry a notification of (lineage, epoch) from `from` belongs to.
  Entry* admit(std::uint64_t lineage, std::uint64_t epoch, ucp_ep_h from, Clock::time_point now);

 private:
  std::unordered_map<std::uint64_t, Entry> entries_;
};

}  // namespace kvxfer::internal::ucx
