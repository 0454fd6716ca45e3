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
  // The peer whose agent name is `agent_name` is gone: posts to it fail and
  // checks of its transfers report REMOTE_DISCONNECT. reconnect() undoes it.
  void disconnect(const std::string& agent_name);
  void reconnect(const std::string& agent_name);
  // Makes every registration (connect) take at least `delay_ms`, so tests can
  // race removals against in-flight async registrations.
  void set_connect_delay_ms(int delay_ms);

  // --- read by the engine -------------------------------------------------
  struct PostDecision {
    Status status = Status::kSuccess;
    bool hold = false;
  };
  PostDecision on_post(const std::string& peer_agent);
  // Status of a check-error scripted for `id`, or kSuccess.
  Status check_error(TransferId id, const std::string& peer_agent);
  // Scripted final state of `id`, or kSuccess.
  Status final_state(TransferId id);
  bool landing_requested(TransferId id);
  void forget(TransferId id);
  Status on_release();
  Status on_connect();
  int connect_delay_ms();

 private:
  std::mutex mu_;
  std::deque<Status> post_failures_;
  std::deque<Status> release_failures_;
  std::deque<Status> connect_failures_;
  int holds_pending_ = 0;
  std::map<TransferId, Status> check_errors_;
  std::map<TransferId, Status> final_states_;
  std::set<TransferId> landed_;
  std::set<std::string> disconnected_;
  int connect_delay_ms_ = 0;
};

}  // namespace kvxfer::loopback
