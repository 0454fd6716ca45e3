// SPDX-License-Identifier: Apache-2.0
// kvxfer::Status: the one error-code set of the data path.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvxfer {

// Mirrors the NIXL status set, plus kStalled. Engines return these; the core
// decides what they mean for a transfer and for its peer.
enum class Status : std::int8_t {
  kInProgress = 1,
  kSuccess = 0,
  kNotPosted = -1,
  kInvalidParam = -2,
  kBackend = -3,
  kNotFound = -4,
  kMismatch = -5,
  kNotAllowed = -6,
  kRepostActive = -7,
  kUnknown = -8,
  kNotSupported = -9,
  kRemoteDisconnect = -10,
  kCanceled = -11,
  kStalled = -12,
};

// Stable upper-case name, e.g. "REMOTE_DISCONNECT"; used in fault causes.
[[nodiscard]] std::string_view status_name(Status status) noexcept;

// True for statuses that say the peer itself is unusable (its endpoint is
// gone, or its registration is): such a failure faults the peer at once
// instead of counting one strike. The only place this set is defined.
[[nodiscard]] bool is_peer_scope(Status status) noexcept;

// True when a failed state check means the WRITE can no longer land, so the
// transfer may be dropped. Only a remote disconnect says that; any other
// check error leaves the WRITE possibly still landing.
[[nodiscard]] bool is_terminal_check_error(Status status) noexcept;

}  // namespace kvxfer
