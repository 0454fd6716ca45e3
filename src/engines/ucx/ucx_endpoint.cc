// SPDX-License-Identifier: Apache-2.0
// Peers of the UCX lane: connect (endpoint + rkey), the endpoint's error
// callback, and disconnect (forced close, then the rkey).
#include <fmt/format.h>

#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "common/log.h"
#include "engines/ucx/ucx_engine.h"

namespace kvxfer::internal::ucx {
namespace {

constexpr auto kPeerReleaseTimeout = std::chrono::milliseconds(500);

}  // namespace

Status UcxLane::connect(const Blob& blob, const RemoteRegion& remote, PeerHandle* out,
                        std::string* reason) {
  // Logs why a connect fails and hands the same words to the caller.
  const auto refuse = [&](Status st, std::string why) {
    log().warn("kvxfer UCX {}: {}", agent_name_, why);
    if (reason != nullptr) *reason = std::move(why);
    return st;
  };
  if (blob.worker_address.empty()) {
    return refuse(Status::kInvalidParam,
                  fmt::format("peer {} sent no worker address", remote.agent_name));
  }
  const bool peer_scatter = (blob.flags & kBlobAcceptsScatter) != 0;
  const bool can_put = settings_.rma && !blob.rkey.empty();
  if (!can_put && !(peer_scatter && scatter_ok_)) {
    // Without puts, writes go only as checked scatter messages; a peer that
    // does not take them cannot be written safely.
    return refuse(
        Status::kNotSupported,
        fmt::format(
            "refusing peer {}: {}, and {}; writes without an RDMA device go only as checked "
            "scatter messages (no raw-address puts over TCP)",
            remote.agent_name,
            peer_scatter ? "our transports cannot carry scatter writes"
                         : "its blob says it does not take scatter writes (an older kvxfer?)",
            !settings_.rma ? "this agent has no RDMA device (RMA off; KVXFER_RMA=on overrides)"
                           : "it published no rkey for puts"));
  }
  auto peer = std::make_shared<UcxPeer>();
  peer->lane = this;
  peer->agent_name = remote.agent_name;
  peer->remote_base = remote.base_addr;
  peer->remote_block_len = remote.block_len;
  peer->token = blob.cookie_epoch;
  peer->scatter = peer_scatter && scatter_ok_;
  peer->gather = (blob.flags & kBlobAcceptsGather) != 0 && scatter_ok_;
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(blob.worker_address.data());
  // PEER mode: a failed peer completes our requests with an error and calls
  // on_ep_error, instead of leaving them pending forever.
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxLane::on_ep_error;
  params.err_handler.arg = peer.get();
  ucs_status_t st = peer->ep.create(worker_.worker(), params);
  if (st != UCS_OK) {
    return refuse(
        st == UCS_ERR_UNREACHABLE ? Status::kNotSupported : Status::kBackend,
        fmt::format(
            "cannot create an endpoint to peer {}: {} (a transport with peer-failure support, "
            "e.g. tcp, must reach it: UCX_TLS here is \"{}\"; shared memory serves same-host "
            "peers only through process_vm_writev)",
            peer->agent_name, ucs_status_string(st), settings_.tls));
  }
  peer->ep_id = peer->ep.get();
  if (can_put) {
    st = ucp_ep_rkey_unpack(peer->ep.get(), blob.rkey.data(), peer->rkey.out());
    if (st != UCS_OK) {
      *peer->rkey.out() = nullptr;
      [[maybe_unused]] const Status closed = close_endpoint(*peer);
      return refuse(Status::kInvalidParam, fmt::format("cannot unpack the rkey of peer {}: {}",
                                                       peer->agent_name, ucs_status_string(st)));
    }
    peer->puts = true;
    live_rkeys_.fetch_add(1, std::memory_order_relaxed);
  }
  if (peer->scatter) {
    // The first message on the endpoint, before any write can be posted.
    if (const Status fenced = send_fence(*peer); fenced != Status::kSuccess) {
      [[maybe_unused]] const Status closed = close_endpoint(*peer);
      if (peer->rkey) {
        peer->rkey.reset();
        live_rkeys_.fetch_sub(1, std::memory_order_relaxed);
      }
      return refuse(fenced, fmt::format("cannot send the fence to peer {}", peer->agent_name));
    }
  }
  live_peers_.fetch_add(1, std::memory_order_relaxed);
  EndpointState connecting = EndpointState::kConnecting;
  peer->state.compare_exchange_strong(connecting, EndpointState::kConnected,
                                      std::memory_order_acq_rel);
  const auto handle = reinterpret_cast<PeerHandle>(peer.get());
  {
    std::lock_guard lock(peers_mu_);
    peers_.emplace(handle, std::move(peer));
  }
  *out = handle;
  return Status::kSuccess;
}

void UcxLane::on_ep_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* peer = static_cast<UcxPeer*>(arg);
  int ok = UCS_OK;
  peer->error.compare_exchange_strong(ok, status, std::memory_order_acq_rel);
  peer->mark_failed();
  log().warn("kvxfer UCX: endpoint to peer {} failed: {}", peer->agent_name,
             ucs_status_string(status));
  // Acks will not come through a failed endpoint.
  peer->lane->fail_peer_scatters(peer, status);
}

Status UcxLane::close_endpoint(UcxPeer& peer) {
  if (!peer.ep) return Status::kSuccess;
  const ucs_status_t st = peer.ep.close(&live_requests_);
  // A failed endpoint stays failed: its transfers still report the peer gone.
  EndpointState s = peer.state.load(std::memory_order_acquire);
  while (s != EndpointState::kFailed && s != EndpointState::kClosed &&
         !peer.state.compare_exchange_weak(s, EndpointState::kClosed, std::memory_order_acq_rel)) {
  }
  if (st != UCS_OK) {
    log().error("kvxfer UCX {}: closing the endpoint to peer {} failed: {}", agent_name_,
                peer.agent_name, ucs_status_string(st));
    return Status::kBackend;
  }
  return Status::kSuccess;
}

Status UcxLane::disconnect(PeerHandle handle) {
  std::shared_ptr<UcxPeer> peer;
  {
    std::lock_guard lock(peers_mu_);
    auto it = peers_.find(handle);
    if (it == peers_.end()) return Status::kNotFound;
    peer = std::move(it->second);
    peers_.erase(it);
  }
  live_peers_.fetch_sub(1, std::memory_order_relaxed);
  {
    // From here no queued write of this peer is sent, and none is being
    // sent: the endpoint can be closed under the progress thread.
    std::lock_guard lock(send_mu_);
    peer->closing = true;
  }
  // The endpoint goes first: the forced close cancels every request still
  // using the rkey, after which the rkey can go. Both are attempted.
  const Status closed = close_endpoint(*peer);
  fail_peer_scatters(peer.get(), UCS_ERR_CANCELED);
  // The forced close completes the peer's requests, but their callbacks may
  // still be finishing on the progress thread. Every in-flight transfer holds
  // the peer, so wait (bounded) until none does: a disconnect then leaves no
  // live request behind.
  const auto deadline = std::chrono::steady_clock::now() + kPeerReleaseTimeout;
  while (peer.use_count() > 1 && std::chrono::steady_clock::now() < deadline) {  // bounded
    worker_.progress_once();
    std::this_thread::yield();
  }
  if (peer->rkey) {
    peer->rkey.reset();
    live_rkeys_.fetch_sub(1, std::memory_order_relaxed);
  }
  return closed;
}

}  // namespace kvxfer::internal::ucx
