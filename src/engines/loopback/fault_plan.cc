// SPDX-License-Identifier: Apache-2.0
// kvxfer::loopback::FaultPlan, the user's side: writes the FaultScript; and
// the FaultScript's hooks, the engine's side: read it at every post, check,
// release and connect.
#include <utility>

#include "engines/loopback/fault_script.h"
#include "kvxfer/loopback.h"

namespace kvxfer {
namespace {

void push_n(std::deque<Status>& queue, Status status, int count) {
  for (int i = 0; i < count; ++i) queue.push_back(status);
}

// Pops the next scripted status of `queue`, or kSuccess when none is left.
Status pop_or_success(std::deque<Status>& queue) {
  if (queue.empty()) return Status::kSuccess;
  const Status status = queue.front();
  queue.pop_front();
  return status;
}

}  // namespace
}  // namespace kvxfer

namespace kvxfer::loopback {

using internal::MutexLock;

void FaultPlan::fail_next_posts(Status status, int count) {
  MutexLock lock(script_.mu_);
  push_n(script_.post_failures_, status, count);
}

void FaultPlan::fail_next_posts_partway(Status status, int started, int count) {
  MutexLock lock(script_.mu_);
  for (int i = 0; i < count; ++i) script_.partway_failures_.emplace_back(status, started);
}

void FaultPlan::fail_checks(TransferId id, Status status) {
  MutexLock lock(script_.mu_);
  script_.check_errors_[id] = status;
}

void FaultPlan::clear_check_error(TransferId id) {
  MutexLock lock(script_.mu_);
  script_.check_errors_.erase(id);
}

void FaultPlan::finish_with(TransferId id, Status status) {
  MutexLock lock(script_.mu_);
  script_.final_states_[id] = status;
}

void FaultPlan::hold_next(int count) {
  MutexLock lock(script_.mu_);
  if (count > 0) script_.holds_pending_ += count;
}

void FaultPlan::land(TransferId id) {
  std::function<void(TransferId)> lander;
  {
    MutexLock lock(script_.mu_);
    script_.landed_.insert(id);
    lander = script_.lander_;
  }
  // Outside the script's lock: the engine takes its own lock and then calls
  // back into the script (forget), the same order it uses everywhere else.
  if (lander) lander(id);
}

void FaultPlan::fail_next_releases(Status status, int count) {
  MutexLock lock(script_.mu_);
  push_n(script_.release_failures_, status, count);
}

void FaultPlan::fail_next_connects(Status status, int count) {
  MutexLock lock(script_.mu_);
  push_n(script_.connect_failures_, status, count);
}

void FaultPlan::fail_next_disconnects(Status status, int count) {
  MutexLock lock(script_.mu_);
  push_n(script_.disconnect_failures_, status, count);
}

void FaultPlan::disconnect(const std::string& agent_name) {
  MutexLock lock(script_.mu_);
  script_.disconnected_.insert(agent_name);
}

void FaultPlan::reconnect(const std::string& agent_name) {
  MutexLock lock(script_.mu_);
  script_.disconnected_.erase(agent_name);
}

void FaultPlan::set_connect_delay_ms(int delay_ms) {
  MutexLock lock(script_.mu_);
  script_.connect_delay_ms_ = delay_ms > 0 ? delay_ms : 0;
}

void FaultPlan::pause_disconnects() {
  MutexLock lock(script_.mu_);
  script_.disconnects_paused_ = true;
}

void FaultPlan::resume_disconnects() {
  {
    MutexLock lock(script_.mu_);
    script_.disconnects_paused_ = false;
  }
  script_.disconnects_resumed_.notify_all();
}

std::uint64_t FaultPlan::check_count() const {
  MutexLock lock(script_.mu_);
  return script_.checks_;
}

}  // namespace kvxfer::loopback

namespace kvxfer::internal {

FaultScript::PostDecision FaultScript::on_post(const std::string& peer_agent) {
  MutexLock lock(mu_);
  // A gone peer fails every post without using up the scripted failures or
  // holds meant for later posts.
  if (disconnected_.contains(peer_agent)) return {Status::kRemoteDisconnect, false};
  if (const Status failure = pop_or_success(post_failures_); failure != Status::kSuccess) {
    return {failure, false};
  }
  if (!partway_failures_.empty()) {
    const auto [failure, started] = partway_failures_.front();
    partway_failures_.pop_front();
    // A held post had its started blocks still in flight when it failed.
    const bool held = holds_pending_ > 0;
    if (held) --holds_pending_;
    return {failure, held, started};
  }
  if (holds_pending_ > 0) {
    --holds_pending_;
    return {Status::kSuccess, true};
  }
  return {};
}

Status FaultScript::check_error(TransferId id, const std::string& peer_agent) {
  MutexLock lock(mu_);
  ++checks_;
  if (const auto it = check_errors_.find(id); it != check_errors_.end()) return it->second;
  if (disconnected_.contains(peer_agent)) return Status::kRemoteDisconnect;
  return Status::kSuccess;
}

Status FaultScript::final_state(TransferId id) {
  MutexLock lock(mu_);
  const auto it = final_states_.find(id);
  return it == final_states_.end() ? Status::kSuccess : it->second;
}

bool FaultScript::landing_requested(TransferId id) {
  MutexLock lock(mu_);
  return landed_.contains(id);
}

void FaultScript::forget(TransferId id) {
  MutexLock lock(mu_);
  check_errors_.erase(id);
  final_states_.erase(id);
  landed_.erase(id);
}

Status FaultScript::on_release() {
  MutexLock lock(mu_);
  return pop_or_success(release_failures_);
}

Status FaultScript::on_connect(const std::string& peer_agent) {
  MutexLock lock(mu_);
  if (disconnected_.contains(peer_agent)) return Status::kRemoteDisconnect;
  return pop_or_success(connect_failures_);
}

Status FaultScript::on_disconnect() {
  MutexLock lock(mu_);
  return pop_or_success(disconnect_failures_);
}

void FaultScript::wait_while_disconnects_paused() {
  MutexLock lock(mu_);
  while (disconnects_paused_) lock.wait(disconnects_resumed_);
}

int FaultScript::connect_delay_ms() {
  MutexLock lock(mu_);
  return connect_delay_ms_;
}

void FaultScript::set_lander(std::function<void(TransferId)> lander) {
  MutexLock lock(mu_);
  lander_ = std::move(lander);
}

}  // namespace kvxfer::internal
