// SPDX-License-Identifier: Apache-2.0
// What a test scripted through the public loopback::FaultPlan, and the hooks
// the loopback engine reads it through at every post, check, release and
// connect. Private to the loopback engine: users see only the FaultPlan.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "kvxfer/loopback.h"
#include "kvxfer/status.h"
#include "kvxfer/transport.h"

namespace kvxfer::internal {

// Thread-safe. Not movable: the FaultPlan it hands out refers to it.
class FaultScript {
 public:
  FaultScript() = default;
  FaultScript(const FaultScript&) = delete;
  FaultScript& operator=(const FaultScript&) = delete;

  // The user's side of this script.
  [[nodiscard]] loopback::FaultPlan& plan() noexcept { return plan_; }

  struct PostDecision {
    Status status = Status::kSuccess;
    bool hold = false;
    // A failed post's blocks issued before it failed (fail_next_posts_partway).
    int started = 0;
  };
  PostDecision on_post(const std::string& peer_agent) EXCLUDES(mu_);
  // The check error scripted for `id`, else REMOTE_DISCONNECT when
  // `peer_agent` is disconnected, else kSuccess. Counts one state check.
  Status check_error(TransferId id, const std::string& peer_agent) EXCLUDES(mu_);
  // Scripted final state of `id`, or kSuccess.
  Status final_state(TransferId id) EXCLUDES(mu_);
  bool landing_requested(TransferId id) EXCLUDES(mu_);
  void forget(TransferId id) EXCLUDES(mu_);
  Status on_release() EXCLUDES(mu_);
  Status on_connect(const std::string& peer_agent) EXCLUDES(mu_);
  Status on_disconnect() EXCLUDES(mu_);
  // Returns once disconnects are not paused (FaultPlan::pause_disconnects).
  void wait_while_disconnects_paused() EXCLUDES(mu_);
  int connect_delay_ms() EXCLUDES(mu_);
  // The engine's hook for land(): called (outside the script's lock) with the
  // id, so bytes land when the test says so, without waiting for a check.
  void set_lander(std::function<void(TransferId)> lander) EXCLUDES(mu_);

 private:
  friend class loopback::FaultPlan;  // writes the script

  // Taken alone, or under the loopback engine's lock (its hooks); the
  // lander runs outside it.
  mutable Mutex mu_;
  std::condition_variable disconnects_resumed_;
  bool disconnects_paused_ GUARDED_BY(mu_) = false;
  std::deque<Status> post_failures_ GUARDED_BY(mu_);
  std::deque<std::pair<Status, int>> partway_failures_ GUARDED_BY(mu_);  // status, blocks started
  std::deque<Status> release_failures_ GUARDED_BY(mu_);
  std::deque<Status> connect_failures_ GUARDED_BY(mu_);
  std::deque<Status> disconnect_failures_ GUARDED_BY(mu_);
  int holds_pending_ GUARDED_BY(mu_) = 0;
  std::map<TransferId, Status> check_errors_ GUARDED_BY(mu_);
  std::map<TransferId, Status> final_states_ GUARDED_BY(mu_);
  std::set<TransferId> landed_ GUARDED_BY(mu_);
  std::set<std::string> disconnected_ GUARDED_BY(mu_);
  int connect_delay_ms_ GUARDED_BY(mu_) = 0;
  std::uint64_t checks_ GUARDED_BY(mu_) = 0;
  std::function<void(TransferId)> lander_ GUARDED_BY(mu_);
  loopback::FaultPlan plan_{*this};
};

}  // namespace kvxfer::internal
