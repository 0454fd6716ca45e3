// SPDX-License-Identifier: Apache-2.0
#include "engines/ucx/ucx_endpoint.h"

#include <utility>

#include "engines/ucx/ucx_lane.h"

namespace kvxfer::internal::ucx {

Endpoint::Endpoint(UcxLane* in, std::string name, std::vector<PeerRegion> peer_regions,
                   std::uint64_t peer_token)
    : LanePeer(in),
      owner(in),
      agent_name(std::move(name)),
      regions(std::move(peer_regions)),
      token(peer_token) {}

ucs_status_t Endpoint::open(ucp_worker_h worker, std::span<const std::uint8_t> address,
                            std::span<const std::span<const std::uint8_t>> packed,
                            ucp_err_handler_cb_t on_error, void* arg, const char** what) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = on_error;
  params.err_handler.arg = arg;
  *what = "creating the endpoint";
  ucs_status_t st = ucp_ep_create(worker, &params, &ep);
  if (st != UCS_OK) {
    ep = nullptr;
    return st;
  }
  *what = "unpacking an rkey";
  rkeys.clear();
  rkeys.reserve(packed.size());
  for (const std::span<const std::uint8_t> key : packed) {
    RkeyHandle& rkey = rkeys.emplace_back();
    if ((st = ucp_ep_rkey_unpack(ep, key.data(), rkey.out())) != UCS_OK) {
      *rkey.out() = nullptr;
      return st;
    }
  }
  return UCS_OK;
}

bool Endpoint::connected() { return move(EpState::kConnecting, EpState::kConnected); }

bool Endpoint::fail(ucs_status_t status) {
  int ok = UCS_OK;
  error_.compare_exchange_strong(ok, status, std::memory_order_acq_rel);
  return move(EpState::kConnecting, EpState::kFailed) ||
         move(EpState::kConnected, EpState::kFailed);
}

bool Endpoint::close(ucp_send_nbx_callback_t on_closed, void* arg) {
  EpState s = state();
  while (s != EpState::kClosing && s != EpState::kClosed &&
         !state_.compare_exchange_weak(s, EpState::kClosing, std::memory_order_acq_rel)) {
  }
  if (ep == nullptr) return false;
  ucp_request_param_t params{};
  params.op_attr_mask =
      UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  params.cb.send = on_closed;
  params.user_data = arg;
  return UCS_PTR_IS_PTR(ucp_ep_close_nbx(std::exchange(ep, nullptr), &params));
}

void Endpoint::closed() {
  for (RkeyHandle& rkey : rkeys) rkey.reset();
  state_.store(EpState::kClosed, std::memory_order_release);
}

}  // namespace kvxfer::internal::ucx
