// SPDX-License-Identifier: Apache-2.0
// A peer reached through a UCP endpoint: what the lane knows of it and the
// endpoint's state, set in one place each (connect, the error callback,
// close) instead of being inferred from which fields happen to be set.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "engines/ucx/ucx_handles.h"
#include "wire/fence.h"

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
  bool scatter = false;  // its worker takes scatter writes (and we can send them)
  bool gather = false;   // its worker answers gather requests (and we can send them)
  bool puts = false;     // we may write it with ucp_put_nbx (RMA on, rkey unpacked)
  // This registration of the peer (wire/fence.h): the lane's lineage for the
  // peer, this registration's number in it and its random epoch. Every
  // scatter write carries lineage and epoch; the fence sent first on `ep`
  // makes the peer take no other epoch of the lineage.
  std::uint64_t lineage = 0;
  std::uint64_t gen = 0;
  std::uint64_t epoch = 0;
  std::array<std::uint8_t, kFenceLen> fence_bytes{};  // UCX reads it until the send completes
  EndpointHandle ep;
  // ep's handle as created, never cleared: what acks' reply endpoints are
  // compared with (ep itself is cleared by the close, on another thread).
  ucp_ep_h ep_id = nullptr;
  RkeyHandle rkey;
  // Set by disconnect() under the lane's send_mu_: handed-off writes not yet
  // sent are failed instead of sent.
  bool closing = false;
  // Written from UCX callbacks, read anywhere.
  std::atomic<EndpointState> state{EndpointState::kConnecting};
  // The ucs_status_t the endpoint failed with (UCS_OK until then).
  std::atomic<int> error{UCS_OK};

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
