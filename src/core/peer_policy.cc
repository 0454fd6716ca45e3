// SPDX-License-Identifier: Apache-2.0
#include "core/peer_policy.h"

#include <fmt/format.h>
#include <time.h>

#include <utility>

#include "common/log.h"

namespace kvxfer {

bool is_peer_scope(Status status) noexcept {
  // A disconnect means the endpoint is gone; not-found means the peer's
  // registration is. Either way no retry to this registration can succeed.
  return status == Status::kRemoteDisconnect || status == Status::kNotFound;
}

bool is_terminal_check_error(Status status) noexcept {
  // Only a disconnect proves nothing more can land. Any other failed check
  // says nothing about the WRITE, which may still be writing the peer's
  // blocks: dropping it would let them be reused under it.
  return status == Status::kRemoteDisconnect;
}

namespace internal {

std::chrono::steady_clock::time_point coarse_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::steady_clock::time_point(std::chrono::seconds(ts.tv_sec) +
                                               std::chrono::nanoseconds(ts.tv_nsec));
}

PeerPolicy::PeerPolicy(std::string agent_name, int strike_limit,
                       std::chrono::milliseconds stall_timeout, PolicyTally* tally)
    : agent_name_(std::move(agent_name)),
      strike_limit_(strike_limit),
      stall_timeout_(stall_timeout),
      tally_(tally) {}

void PeerPolicy::set_fault(Standing& peer, std::string_view peer_id, FaultCause kind,
                           std::string cause) const {
  if (peer.fault) return;  // the first cause sticks
  log().warn("kvxfer {}: registration for peer={} judged unusable: {}", agent_name_, peer_id,
             cause);
  peer.fault = std::move(cause);
  peer.fault_cause = kind;
  if (tally_ != nullptr) ++tally_->faults[static_cast<std::size_t>(kind)];
}

namespace {

// The kind of a fault a peer-scope status causes.
FaultCause peer_scope_cause(Status status) {
  return status == Status::kRemoteDisconnect ? FaultCause::kRemoteDisconnect
                                             : FaultCause::kNotFound;
}

}  // namespace

void PeerPolicy::record_failure(Standing& peer, std::string_view peer_id, Status status,
                                std::string_view cause) const {
  if (is_peer_scope(status)) {
    set_fault(peer, peer_id, peer_scope_cause(status), std::string(status_name(status)));
    return;
  }
  const int strikes = ++peer.strikes;
  ++peer.strikes_total;
  if (tally_ != nullptr) ++tally_->strikes_total;
  if (strikes >= strike_limit_) {
    set_fault(peer, peer_id, FaultCause::kStrikeLimit,
              fmt::format("{} consecutive transfer failures (last: {})", strikes, cause));
  }
}

void PeerPolicy::record_check_failure(Standing& peer, std::string_view peer_id,
                                      Status status) const {
  // A failed check is a failure the engine reported, not a flaky check. The
  // peer is faulted rather than struck: with strikes, successes to the same
  // peer could keep resetting them while this transfer stays in flight,
  // holding the peer's blocks, for good.
  if (is_peer_scope(status)) {
    set_fault(peer, peer_id, peer_scope_cause(status), std::string(status_name(status)));
  } else {
    set_fault(peer, peer_id, FaultCause::kCheckFailed,
              fmt::format("state check failed: {}", status_name(status)));
  }
}

void PeerPolicy::fault_stalled(Standing& peer, std::string_view peer_id, TransferId id,
                               std::chrono::steady_clock::duration age) const {
  // A frozen peer leaves a WRITE in progress for ever; the engines do not
  // notice. Fault the peer so its owner tears it down, which reclaims the
  // transfer; until then it stays, since it may still land.
  set_fault(
      peer, peer_id, FaultCause::kStalled,
      fmt::format("{}: transfer_id={} in flight for {:.1f} s (stall_timeout {:.1f} s)",
                  status_name(Status::kStalled), id, std::chrono::duration<double>(age).count(),
                  std::chrono::duration<double>(stall_timeout_).count()));
}

}  // namespace internal
}  // namespace kvxfer
