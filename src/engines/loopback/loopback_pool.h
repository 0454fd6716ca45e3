// SPDX-License-Identifier: Apache-2.0
// The loopback engine's shared state: an agent's pool and regions as the
// agents that copy into them see them, and the process-wide directory
// where they find each other. May use engine.h and common/.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "engine.h"

namespace kvxfer::internal::loopback_engine {

// A region of an agent, as copiers see it: slot 0 is the pool (live when
// there is one).
struct PoolRegion {
  std::uint64_t id = 0;
  std::byte* base = nullptr;
  std::uint64_t len = 0;
  bool live = false;
};

// A registered pool, as seen by the agents that write into it. It outlives
// its engine (writers hold it by shared_ptr) so a writer can always ask
// whether the pool is still there; the memory itself belongs to the user and
// may be gone once `alive` is false.
struct Pool {
  std::string agent_name;
  std::byte* base = nullptr;
  std::uint64_t num_blocks = 0;
  std::uint64_t block_len = 0;
  std::uint64_t cookie = 0;
  std::atomic<bool> alive{true};
  // By slot (region_slot of the id). Read under copy_mu (shared) or by the
  // owner under its engine's lock; written by the owner holding both, with
  // copy_mu exclusive.
  std::vector<PoolRegion> regions;
  // Writers copy under a shared lock; the owner's shutdown takes it
  // exclusively, so no copy is still running once shutdown returns. It
  // guards the pool's life (alive, and the user's memory), not a field, so
  // it stays a plain std::shared_mutex.
  std::shared_mutex copy_mu;
  // Notifications delivered to the owner, until it takes them.
  Mutex notes_mu;
  std::deque<Notification> notes GUARDED_BY(notes_mu);
};

// The process-global directory of live loopback agents, by agent key.
class PoolRegistry {
 public:
  static PoolRegistry& instance() {
    static PoolRegistry registry;
    return registry;
  }

  std::uint64_t add(std::shared_ptr<Pool> pool) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    const std::uint64_t key = next_key_++;
    pools_.emplace(key, std::move(pool));
    return key;
  }

  void remove(std::uint64_t key) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    pools_.erase(key);
  }

  // The live pool under `key` whose cookie matches, else nullptr: a key of
  // a closed agent never reaches a newer one.
  std::shared_ptr<Pool> find(std::uint64_t key, std::uint64_t cookie) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    const auto it = pools_.find(key);
    if (it == pools_.end() || it->second->cookie != cookie) return nullptr;
    return it->second;
  }

 private:
  Mutex mu_;
  std::uint64_t next_key_ GUARDED_BY(mu_) = 1;
  std::unordered_map<std::uint64_t, std::shared_ptr<Pool>> pools_ GUARDED_BY(mu_);
};

}  // namespace kvxfer::internal::loopback_engine
