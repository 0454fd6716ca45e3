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

}  // namespace kvxfer
