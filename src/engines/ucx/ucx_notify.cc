// SPDX-License-Identifier: Apache-2.0
// Notifications (wire/notify.h) on the UCX lane: the message a transfer
// sends its peer once every byte is in place (or alone), the target's
// handler that fences, bounds and queues it, and take_notifications(). The
// wait for its ack is the transfer's own (ucx_scatter.cc's acks).
#include <algorithm>
#include <utility>

#include "common/log.h"
#include "engines/ucx/ucx_engine.h"

namespace kvxfer::internal::ucx {

void UcxLane::register_notify_handler() {
  worker_.set_am_handler(kNotifyAmId, &UcxLane::on_notify_am, this);
}

// ---------------------------------------------------------------------------
// Initiator
// ---------------------------------------------------------------------------

Status UcxLane::post_notify(PeerHandle handle, TransferId id, std::span<const std::uint8_t> message,
                            XferHandle* out) {
  const std::shared_ptr<UcxPeer> peer = find_peer(handle);
  if (peer == nullptr) return Status::kNotFound;
  if (peer->failed()) return Status::kRemoteDisconnect;
  if (!peer->scatter) return Status::kNotSupported;  // its acks are scatter acks
  Xfer* xfer = start_xfer(peer, id, Xfer::Op::kNotify, message);
  xfer->am_chunks.clear();  // no data messages
  arm_wait(xfer);
  {
    std::lock_guard lock(am_mu_);
    xfer->notify_stage = true;  // its one message is the notification
    xfer->am_left = 1;
  }
  return hand_out(xfer, launch(*peer, xfer), out);
}

bool UcxLane::begin_notify_locked(Xfer* xfer) {
  // A transfer released before its bytes were in place delivers nothing.
  if (xfer->notify_stage || xfer->notify_msg.empty() ||
      !xfer->held.load(std::memory_order_relaxed)) {
    return false;
  }
  xfer->notify_stage = true;
  xfer->am_left = 1;
  xfer->refs.fetch_add(1, std::memory_order_relaxed);  // send_notify's
  return true;
}

void UcxLane::send_notify(Xfer* xfer) {
  if (handoff_) {
    // We run inside the worker's progress (a handler), and send_mu_ is
    // always taken before the worker's lock: the progress thread sends it
    // from its queue instead, right after this round of progress. The
    // reference begin_notify_locked took becomes the queue's.
    xfer->notify_queued = true;
    submit(xfer);
    return;
  }
  send_notify_checked(xfer);
  unref(xfer);  // begin_notify_locked's
}

void UcxLane::send_queued_notify(Xfer* xfer) {
  xfer->notify_queued = false;
  send_notify_checked(xfer);
  unref(xfer);  // the queue's
}

void UcxLane::send_notify_checked(Xfer* xfer) {
  UcxPeer& p = *xfer->peer;
  ucs_status_t st = UCS_OK;
  {
    // As for a queued write, never a send on an endpoint being closed. But
    // not the held check of a queued post: the bytes are in place, so a
    // transfer released since still delivers its notification.
    std::lock_guard lock(send_mu_);
    if (p.closing || !sending_.load(std::memory_order_acquire)) {
      st = UCS_ERR_CANCELED;
    } else if (p.failed()) {
      const auto error = static_cast<ucs_status_t>(p.error.load(std::memory_order_acquire));
      st = error != UCS_OK ? error : UCS_ERR_CONNECTION_RESET;
    } else {
      st = send_notify_message(p, xfer);
    }
  }
  if (st == UCS_OK) return;
  log().warn("kvxfer UCX {}: the notification of transfer {} to peer {} was not sent: {}",
             agent_name_, xfer->id, p.agent_name, ucs_status_string(st));
  if (is_disconnect(st)) p.mark_failed();
  fail_scatter(xfer, st);
}

ucs_status_t UcxLane::send_notify_message(UcxPeer& p, Xfer* xfer) {
  // Our agent name labels the message at the target; names longer than a
  // header takes are cut (the label is all it is).
  const std::string_view name =
      std::string_view(agent_name_).substr(0, std::min(agent_name_.size(), kMaxNotifyName));
  xfer->notify_header.resize(notify_header_len(name.size()));
  encode_notify_header(xfer->notify_header.data(),
                       NotifyHeader{p.token, xfer->post_seq, xfer->slot, p.lineage, p.epoch, name});
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = &UcxLane::on_am_sent;
  param.user_data = xfer;
  param.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  xfer->refs.fetch_add(1, std::memory_order_relaxed);
  xfer->sends_pending.fetch_add(1, std::memory_order_relaxed);
  live_requests_.fetch_add(1, std::memory_order_relaxed);
  notifications_sent_.fetch_add(1, std::memory_order_relaxed);
  ucs_status_ptr_t request = ucp_am_send_nbx(p.ep.get(), kNotifyAmId, xfer->notify_header.data(),
                                             xfer->notify_header.size(), xfer->notify_msg.data(),
                                             xfer->notify_msg.size(), &param);
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) return UCS_OK;  // on_am_sent lets go
  live_requests_.fetch_sub(1, std::memory_order_relaxed);
  xfer->sends_pending.fetch_sub(1, std::memory_order_relaxed);
  xfer->refs.fetch_sub(1, std::memory_order_relaxed);  // another reference keeps it above zero
  return UCS_PTR_IS_ERR(request) ? UCS_PTR_STATUS(request) : UCS_OK;
}

// ---------------------------------------------------------------------------
// Target
// ---------------------------------------------------------------------------

// A notification: queued when it is for this engine, its registration is the
// newest fenced for its lineage, its message has 1..kMaxNotificationBytes
// bytes and the queue has room; the ack says which. A header too broken to
// name its transfer is dropped (its sender's transfer then stalls).
ucs_status_t UcxLane::on_notify_am(void* arg, const void* header, std::size_t header_length,
                                   void* data, std::size_t length,
                                   const ucp_am_recv_param_t* param) {
  auto* lane = static_cast<UcxLane*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (rndv) ucp_am_data_release(lane->worker_.worker(), data);
  NotifyHeader h;
  if (!decode_notify_header({static_cast<const std::uint8_t*>(header), header_length}, &h)) {
    lane->notifications_refused_.fetch_add(1, std::memory_order_relaxed);
    log().warn("kvxfer UCX {}: dropped a malformed notification ({} header bytes)",
               lane->agent_name_, header_length);
    return UCS_OK;
  }
  ucs_status_t status = UCS_OK;
  if (rndv) {
    status = UCS_ERR_UNSUPPORTED;  // our initiators send eagerly
  } else if (!lane->accepting_writes_.load(std::memory_order_acquire) || h.token != lane->token_) {
    status = UCS_ERR_REJECTED;
  } else if (length == 0 || length > kMaxNotificationBytes) {
    status = UCS_ERR_INVALID_PARAM;
  } else {
    // Copied out of UCX's buffer before anything else looks at it.
    const auto* bytes = static_cast<const std::uint8_t*>(data);
    Notification note{std::string(h.name), std::vector<std::uint8_t>(bytes, bytes + length)};
    std::lock_guard fence(lane->fence_mu_);
    if (!lane->fence_allows(h.lineage, h.epoch)) {
      status = UCS_ERR_CANCELED;  // a removed or replaced registration's
    } else {
      std::lock_guard lock(lane->notes_mu_);
      if (lane->notes_.size() >= kMaxQueuedNotifications) {
        status = UCS_ERR_NO_RESOURCE;  // the owner is not taking them
      } else {
        lane->notes_.push_back(std::move(note));
      }
    }
  }
  if (status == UCS_OK) {
    lane->notifications_received_.fetch_add(1, std::memory_order_relaxed);
  } else {
    lane->notifications_refused_.fetch_add(1, std::memory_order_relaxed);
    log().warn("kvxfer UCX {}: refused a notification from {}: {}", lane->agent_name_, h.name,
               ucs_status_string(status));
  }
  lane->send_ack(param, ScatterAck{h.slot, h.sequence, static_cast<std::int32_t>(status)});
  return UCS_OK;
}

void UcxLane::take_notifications(std::vector<Notification>* out) {
  std::lock_guard lock(notes_mu_);
  for (Notification& n : notes_) out->push_back(std::move(n));
  notes_.clear();
}

}  // namespace kvxfer::internal::ucx
