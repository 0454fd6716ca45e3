// SPDX-License-Identifier: Apache-2.0
// The one judge of peers: what a failed post or transfer, a failed state
// check, a success or a stalled transfer means for a peer's registration.
// Engines report statuses; only this room decides what they cost the peer.
// Touches a peer's Standing and the log, nothing else.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kvxfer/metrics.h"
#include "kvxfer/status.h"
#include "kvxfer/transport.h"

namespace kvxfer::internal {

// What we hold against one registration of a peer. A new registration
// starts clean.
struct Standing {
  // Failures since the last success; the strike_limit-th faults the peer.
  int strikes = 0;
  // Why the registration is unusable; set once, the first cause sticks.
  std::optional<std::string> fault;
  // The fault's kind (the metrics' `cause` label), set with it.
  std::optional<FaultCause> fault_cause;
  // Every strike ever given to this registration (metrics).
  std::uint64_t strikes_total = 0;
};

// The transport's running totals of what the policy decided, over every
// registration it ever judged (metrics). Guarded by the transport's mutex,
// like every Standing.
struct PolicyTally {
  std::uint64_t strikes_total = 0;
  std::array<std::uint64_t, kNumFaultCauses> faults{};
};

// The clock the stall rule reads. Stall detection needs seconds, not
// nanoseconds: the coarse clock is cheaper to read on every post and poll.
[[nodiscard]] std::chrono::steady_clock::time_point coarse_now();

class PeerPolicy {
 public:
  // Never throws: the options are validated by the transport. `tally`, when
  // given, counts every strike and fault once, when it happens.
  PeerPolicy(std::string agent_name, int strike_limit, std::chrono::milliseconds stall_timeout,
             PolicyTally* tally = nullptr);

  // Faults the peer with `cause` (of kind `kind`) and logs it, unless it is
  // faulted already.
  void set_fault(Standing& peer, std::string_view peer_id, FaultCause kind,
                 std::string cause) const;

  // A failed post, or a transfer that finished failed: a peer-scope status
  // faults the peer at once, any other is one strike.
  void record_failure(Standing& peer, std::string_view peer_id, Status status,
                      std::string_view cause) const;

  // A state check that itself failed.
  void record_check_failure(Standing& peer, std::string_view peer_id, Status status) const;

  // A transfer of the peer finished well: its earlier failures were not
  // consecutive after all.
  void record_success(Standing& peer) const noexcept { peer.strikes = 0; }

  // Whether the stall rule is on (stall_timeout > 0); when it is off,
  // transfers need no post time.
  [[nodiscard]] bool watches_stalls() const noexcept { return stall_timeout_.count() > 0; }

  // The stall rule: a transfer still in progress stall_timeout after it was
  // posted faults its peer. Returns whether this call faulted it. Inline: poll
  // asks it of every transfer in progress.
  bool check_stall(Standing& peer, std::string_view peer_id, TransferId id,
                   std::chrono::steady_clock::time_point posted,
                   std::chrono::steady_clock::time_point now) const {
    if (peer.fault || !watches_stalls() || now - posted < stall_timeout_) return false;
    fault_stalled(peer, peer_id, id, now - posted);
    return true;
  }

 private:
  void fault_stalled(Standing& peer, std::string_view peer_id, TransferId id,
                     std::chrono::steady_clock::duration age) const;

  const std::string agent_name_;
  const int strike_limit_;
  const std::chrono::milliseconds stall_timeout_;
  PolicyTally* const tally_;
};

}  // namespace kvxfer::internal
