// SPDX-License-Identifier: Apache-2.0
// The loopback engine's fault plan: a scriptable way to make the in-process
// engine misbehave, so tier code (ours and our users') can be tested against
// every failure the real engines can produce.
//
// A Transport built with backends {"LOOPBACK"} reaches peers that are other
// LOOPBACK transports in the same process; a WRITE is a memcpy into the
// peer's pool. Get the plan with Transport::fault_plan(); it lives as long
// as its Transport, and any thread may script it at any time.
#pragma once

#include <cstdint>
#include <string>

#include "kvxfer/status.h"
#include "kvxfer/transport.h"

namespace kvxfer::internal {
class FaultScript;
}

namespace kvxfer::loopback {

class FaultPlan {
 public:
  // The next `count` posts fail with `status` (nothing is written).
  void fail_next_posts(Status status, int count = 1);
  // The next `count` posts fail with `status` part-way, after the WRITEs of
  // their first `started` blocks were issued, as a real engine's post can.
  // The engine settles what it issued before write_blocks returns nullopt:
  // those blocks land then (or, if the post was held by hold_next(), are
  // cancelled and never land), the others are never written, and nothing of
  // the post reads the caller's local blocks afterwards.
  void fail_next_posts_partway(Status status, int started, int count = 1);
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
  // handle stays live (and counted in stats().live) until a release of it
  // succeeds. Handles still live when the transport closes stay counted.
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
  // While paused, every peer teardown (remove_remote_peer, a re-registration,
  // close) waits in the engine's disconnect, as one to a frozen or cut-off
  // peer can, and close()'s engine shutdown waits as a real engine's drain
  // can, until resume_disconnects(). Lets tests check that such a wait
  // holds up no other peer and no other call.
  void pause_disconnects();
  void resume_disconnects();
  // How many transfer state checks the engine has made so far (lets a test
  // see what a poll cost).
  [[nodiscard]] std::uint64_t check_count() const;

  FaultPlan(const FaultPlan&) = delete;
  FaultPlan& operator=(const FaultPlan&) = delete;

 private:
  // Only the loopback engine makes a plan: the script it reads and the hooks
  // it reads it through live beside the engine, in src/.
  friend class internal::FaultScript;
  explicit FaultPlan(internal::FaultScript& script) : script_(script) {}

  internal::FaultScript& script_;
};

}  // namespace kvxfer::loopback
