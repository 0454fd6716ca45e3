// The loopback engine's fault plan: a scriptable way to make the in-process
// engine misbehave, so tier code (ours and our users') can be tested against
// every failure the real engines can produce.
//
// A Transport built with backends {"LOOPBACK"} reaches peers that are other
// LOOPBACK transports in the same process; a WRITE is a memcpy into the
// peer's pool. Get the plan with Transport::fault_plan().
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "kvxfer/status.h"
#include "kvxfer/transport.h"

namespace kvxfer::loopback {

class FaultPlan {
 public:
  // The next `count` posts fail with `status` (nothing is written).
  void fail_next_posts(Status status, int count = 1);
  // Every state check of `id` reports `status` as a check error, until
  // clear_check_error(). The WRITE itself is unaffected.
  void fail_checks(TransferId id, Status status);
  void clear_check_error(TransferId id);
  // Transfer `id` finishes in the failed state `status` (a transfer failure,
  // not a check error).
  void finish_with(TransferId id, Status status);
  // The next `count` transfers stay in progress, with no bytes written, until
  // land() is called for them; land() writes the bytes even if the transfer
  // was cancelled or released, as a real in-flight WRITE would.
  void hold_next(int count = 1);
  void land(TransferId id);
  // The next `count` releases of a transfer handle fail with `status`; the
  // handle stays live.
  void fail_next_releases(Status status, int count = 1);
  // The next `count` peer registrations (connects) fail with `status`.
  void fail_next_connects(Status status, int count = 1);
  // The next `count` peer teardowns report `status` for their remote-key
  // release; the endpoint is still closed and both handles are still gone,
  // as with a real engine whose key release fails after a transport error.
  void fail_next_disconnects(Status status, int count = 1);
  // The peer whose agent name is `agent_name` is gone: posts to it fail and
  // checks of its transfers report REMOTE_DISCONNECT, and connecting to it
  // fails with REMOTE_DISCONNECT. reconnect() undoes it.
  void disconnect(const std::string& agent_name);
  void reconnect(const std::string& agent_name);
  // Makes every registration (connect) take at least `delay_ms`, so tests can
  // race removals against in-flight async registrations.
  void set_connect_delay_ms(int delay_ms);
  // How many transfer state checks the engine has made so far (lets a test
  // see what a poll cost).
  [[nodiscard]] std::uint64_t check_count() const;

  // --- read by the engine -------------------------------------------------
  struct PostDecision {
    Status status = Status::kSuccess;
    bool hold = false;
  };
  PostDecision on_post(const std::string& peer_agent);
  // The check error scripted for `id`, else REMOTE_DISCONNECT when
  // `peer_agent` is disconnected, else kSuccess. Counts one state check.
  Status check_error(TransferId id, const std::string& peer_agent);
  // Scripted final state of `id`, or kSuccess.
  Status final_state(TransferId id);
  bool landing_requested(TransferId id);
  void forget(TransferId id);
  Status on_release();
  Status on_connect(const std::string& peer_agent);
  Status on_disconnect();
  int connect_delay_ms();
  // The engine's hook for land(): called (outside the plan's lock) with the
  // id, so bytes land when the test says so, without waiting for a check.
  void set_lander(std::function<void(TransferId)> lander);

 private:
  mutable std::mutex mu_;
  std::deque<Status> post_failures_;
  std::deque<Status> release_failures_;
  std::deque<Status> connect_failures_;
  std::deque<Status> disconnect_failures_;
  int holds_pending_ = 0;
  std::map<TransferId, Status> check_errors_;
  std::map<TransferId, Status> final_states_;
  std::set<TransferId> landed_;
  std::set<std::string> disconnected_;
  int connect_delay_ms_ = 0;
  std::uint64_t checks_ = 0;
  std::function<void(TransferId)> lander_;
};

}  // namespace kvxfer::loopback
