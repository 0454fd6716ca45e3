// SPDX-License-Identifier: Apache-2.0
// Status names. What a status means for a peer (is_peer_scope,
// is_terminal_check_error) is policy: see core/peer_policy.cc.
#include "kvxfer/status.h"

namespace kvxfer {

std::string_view status_name(Status status) noexcept {
  switch (status) {
    case Status::kInProgress: return "IN_PROGRESS";
    case Status::kSuccess: return "SUCCESS";
    case Status::kNotPosted: return "NOT_POSTED";
    case Status::kInvalidParam: return "INVALID_PARAM";
    case Status::kBackend: return "BACKEND";
    case Status::kNotFound: return "NOT_FOUND";
    case Status::kMismatch: return "MISMATCH";
    case Status::kNotAllowed: return "NOT_ALLOWED";
    case Status::kRepostActive: return "REPOST_ACTIVE";
    case Status::kUnknown: return "UNKNOWN";
    case Status::kNotSupported: return "NOT_SUPPORTED";
    case Status::kRemoteDisconnect: return "REMOTE_DISCONNECT";
    case Status::kCanceled: return "CANCELED";
    case Status::kStalled: return "STALLED";
  }
  return "UNKNOWN";
}

}  // namespace kvxfer
