// A peer reached through a UCP endpoint: what the lane knows of it and the
// endpoint's state, set in one place each (connect, the error callback,
// close) instead of being inferred from which fields happen to be set.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "engines/ucx/ucx_handles.h"

namespace kvxfer::internal::ucx {

class UcxLane;

enum class EndpointState : std::uint8_t {
  kConnecting,  // being created; its error callback may already fire
  kConnected,   // endpoint and rkey ready
  kFailed,      // the endpoint failed or the peer was found gone: nothing more lands
  kClosed,      // closed by disconnect() without having failed
};

struct UcxPeer {
  UcxLane* lane = nullptr;
  std::string agent_name;
  std::uint64_t remote_base = 0;
  std::uint64_t remote_block_len = 0;
  // The peer's cookie epoch: its scatter handler only takes messages that
  // carry it.
  std::uint64_t token = 0;
  bool scatter = false;  // its worker takes scatter writes
  EndpointHandle ep;
  RkeyHandle rkey;
  // Written from UCX callbacks, read anywhere.
  std::atomic<EndpointState> state{EndpointState::kConnecting};

  [[nodiscard]] bool failed() const {
    return state.load(std::memory_order_acquire) == EndpointState::kFailed;
  }
  // Connecting or connected -> failed. True for the call that made it so.
  bool mark_failed() {
    EndpointState s = state.load(std::memory_order_acquire);
    while (s == EndpointState::kConnecting || s == EndpointState::kConnected) {
      if (state.compare_exchange_weak(s, EndpointState::kFailed, std::memory_order_acq_rel)) {
        return true;
      }
    }
    return false;
  }
};

}  // namespace kvxfer::internal::ucx
