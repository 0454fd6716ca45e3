// SPDX-License-Identifier: Apache-2.0
#include "engines/ucx/ucx_fences.h"

namespace kvxfer::internal::ucx {

FenceTable::Verdict FenceTable::take(const wire::Fence& fence, ucp_ep_h from, Clock::time_point now) {
  auto it = entries_.find(fence.lineage);
  if (it == entries_.end()) {
    if (entries_.size() >= wire::kMaxFences) {
      auto quietest = entries_.end();
      for (auto e = entries_.begin(); e != entries_.end(); ++e) {
        if (e->second.acks == 0 &&
            (quietest == entries_.end() || e->second.heard < quietest->second.heard)) {
          quietest = e;
        }
      }
      if (quietest == entries_.end() || now - quietest->second.heard < kIdle) return Verdict::kFull;
      entries_.erase(quietest);
    }
    it = entries_.emplace(fence.lineage, Entry{}).first;
  } else if (fence.gen <= it->second.gen) {
    return Verdict::kStale;  // an older registration's fence, late
  }
  Entry& e = it->second;
  e.gen = fence.gen;
  e.epoch = fence.epoch;
  e.from = from;
  e.name.assign(fence.name);
  e.heard = now;
  return Verdict::kTaken;
}

FenceTable::Entry* FenceTable::admit(std::uint64_t lineage, std::uint64_t epoch, ucp_ep_h from,
                                     Clock::time_point now) {
  const auto it = entries_.find(lineage);
  if (it == entries_.end() || it->second.epoch != epoch || it->second.from != from) return nullptr;
  it->second.heard = now;
  return &it->second;
}

}  // namespace kvxfer::internal::ucx
