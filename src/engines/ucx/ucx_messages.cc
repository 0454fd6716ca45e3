// SPDX-License-Identifier: Apache-2.0
// The UCX lane's active messages (ucx_lane.h), each in the driver's turn: the
// fences, notifications and acks we send, and our handlers of those peers
// send. Touches the fence table, the acks in flight and the queued notes.
#include <chrono>
#include <span>

#include "common/log.h"
#include "engines/ucx/ucx_lane.h"
#include "wire/fence.h"

namespace kvxfer::internal::ucx {
namespace {

using Clock = std::chrono::steady_clock;

// Acks in flight to one lineage, and in all: past these, a notification is
// dropped unanswered (its sender does not take its acks).
constexpr std::uint32_t kMaxAcksPerLineage = 256;
constexpr std::size_t kMaxAcks = 16384;

// The status an ack carries, as one the target's handler sends; anything
// else is an I/O error.
ucs_status_t peer_status(std::int32_t sent) {
  for (const ucs_status_t known :
       {UCS_OK, UCS_ERR_INVALID_PARAM, UCS_ERR_CANCELED, UCS_ERR_NO_RESOURCE}) {
    if (sent == static_cast<std::int32_t>(known)) return known;
  }
  return UCS_ERR_IO_ERROR;
}

// An eager active message that lets the receiver reply, ended by `cb`.
ucp_request_param_t am_param(ucp_send_nbx_callback_t cb, void* user_data) {
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = cb;
  param.user_data = user_data;
  param.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  return param;
}

ucp_ep_h reply_ep(const ucp_am_recv_param_t* param) {
  return (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 ? param->reply_ep : nullptr;
}

std::span<const std::uint8_t> bytes_of(const void* data, std::size_t length) {
  return {static_cast<const std::uint8_t*>(data), length};
}

}  // namespace

// Initiator: the fence of an endpoint's registration, its first message.
// Returns the status of a send that failed at once, else UCS_OK.
ucs_status_t UcxLane::send_fence(Endpoint& ep) {
  const std::string_view name = std::string_view(agent_name_).substr(0, wire::kMaxFenceName);
  ep.fence.resize(wire::fence_len(name.size()));
  wire::encode_fence(ep.fence.data(), wire::Fence{ep.token, ep.lineage, ep.gen, ep.epoch, name});
  const ucp_request_param_t param = am_param(&UcxLane::on_sent, this);
  const ucs_status_ptr_t request = ucp_am_send_nbx(ep.ep, wire::kFenceAmId, ep.fence.data(),
                                                   ep.fence.size(), nullptr, 0, &param);
  if (UCS_PTR_IS_PTR(request)) live_requests_.fetch_add(1, std::memory_order_relaxed);
  return UCS_PTR_IS_ERR(request) ? UCS_PTR_STATUS(request) : UCS_OK;
}

// Initiator: a transfer's notification, once its flush completed; the ack
// (on_ack) or a failed send ends the transfer.
void UcxLane::send_note(Xfer* x) {
  Endpoint& ep = *x->ep;
  if (!ep.usable()) return complete(x, ep.error() != UCS_OK ? ep.error() : UCS_ERR_CANCELED);
  // The target labels it with the fence's name, not this one.
  const std::string_view name = std::string_view(agent_name_).substr(0, wire::kMaxNotifyName);
  x->note_header.resize(wire::notify_header_len(name.size()));
  wire::encode_notify_header(
      x->note_header.data(),
      wire::NotifyHeader{ep.token, x->sequence, x->slot, ep.lineage, ep.epoch, name});
  x->await_index = ep.awaiting.size();
  ep.awaiting.push_back(x->slot);
  count(kNotesSent);
  const ucp_request_param_t param = am_param(&UcxLane::on_note_sent, x);
  const ucs_status_ptr_t sent =
      ucp_am_send_nbx(ep.ep, wire::kNotifyAmId, x->note_header.data(), x->note_header.size(),
                      x->note.data(), x->note.size(), &param);
  if (UCS_PTR_IS_ERR(sent)) return complete(x, UCS_PTR_STATUS(sent));
  if (UCS_PTR_IS_PTR(sent)) {
    live_requests_.fetch_add(1, std::memory_order_relaxed);
    x->sending = true;
  }
}

void UcxLane::on_note_sent(void* request, ucs_status_t status, void* arg) {
  auto* x = static_cast<Xfer*>(arg);
  UcxLane& lane = *x->owner;
  lane.driver_.check_turn();
  ucp_request_free(request);
  lane.live_requests_.fetch_sub(1, std::memory_order_relaxed);
  x->sending = false;
  if (x->ended) return lane.unref(x);              // complete() left the driver's reference to us
  if (status != UCS_OK) lane.complete(x, status);  // else the ack ends it
}

void UcxLane::on_sent(void* request, ucs_status_t /*status*/, void* arg) {
  auto& lane = *static_cast<UcxLane*>(arg);
  lane.driver_.check_turn();
  ucp_request_free(request);
  lane.live_requests_.fetch_sub(1, std::memory_order_relaxed);
}

// Every message handler's start: the lane, in the driver's turn, with a
// rendezvous payload (our peers send eagerly) let go at once.
UcxLane& UcxLane::received(void* arg, void* data, const ucp_am_recv_param_t* param) {
  auto& lane = *static_cast<UcxLane*>(arg);
  lane.driver_.check_turn();
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    ucp_am_data_release(lane.driver_.worker(), data);
  }
  return lane;
}

// Target: a fence binds its lineage's newest registration to the endpoint
// it came on, under the name it carries.
ucs_status_t UcxLane::on_fence(void* arg, const void* header, std::size_t header_length, void* data,
                               std::size_t /*length*/, const ucp_am_recv_param_t* param) {
  UcxLane& lane = received(arg, data, param);
  lane.count(kFencesReceived);
  wire::Fence fence;
  const ucp_ep_h from = reply_ep(param);
  const char* why = "the fence table is full";
  if (from == nullptr || !wire::decode_fence(bytes_of(header, header_length), &fence)) {
    why = "it is malformed";
  } else if (fence.token != lane.token_ || !lane.accepting_.load(std::memory_order_acquire)) {
    why = "it is not for this transport";
  } else {
    const auto presented =
        lane.fences_.present(fence.lineage, fence.gen, fence.epoch, {}, false, Clock::now());
    switch (presented.verdict) {
      case Fences::Verdict::kNew:
      case Fences::Verdict::kNewer:
        presented.entry->extra.from = from;
        presented.entry->extra.name.assign(fence.name);
        return UCS_OK;
      case Fences::Verdict::kSame:
      case Fences::Verdict::kStale:
        why = "its registration, or a newer one of its lineage, fenced already";
        break;
      case Fences::Verdict::kNotYours:  // no identities here
      case Fences::Verdict::kFull:
        break;
    }
  }
  lane.count(kFencesRefused);
  log().warn("kvxfer ucx {}: refused a fence: {}", lane.agent_name_, why);
  return UCS_OK;
}

// Target: the fence entry a notification of (lineage, epoch) that came on
// `from` belongs to: the lineage's newest registration, fenced on `from`.
UcxLane::Fences::Entry* UcxLane::admit(std::uint64_t lineage, std::uint64_t epoch, ucp_ep_h from) {
  Fences::Entry* e = fences_.find(lineage);
  if (e == nullptr || e->epoch != epoch || e->extra.from != from) return nullptr;
  fences_.touch(*e, Clock::now());
  return e;
}

// Target: a notification, queued when it belongs to the newest registration
// of its lineage and came on that registration's endpoint, has
// 1..kMaxNotificationBytes bytes, and its sender's share has room; the ack
// says which.
ucs_status_t UcxLane::on_note(void* arg, const void* header, std::size_t header_length, void* data,
                              std::size_t length, const ucp_am_recv_param_t* param) {
  UcxLane& lane = received(arg, data, param);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  wire::NotifyHeader h;
  const ucp_ep_h from = reply_ep(param);
  Fences::Entry* entry = nullptr;
  ucs_status_t status = UCS_OK;
  if (from == nullptr || !wire::decode_notify_header(bytes_of(header, header_length), &h) ||
      lane.acks_in_flight_ >= kMaxAcks) {
    status = UCS_ERR_NO_RESOURCE;  // nothing to answer, or too many answers pending
  } else if (h.token != lane.token_ || !lane.accepting_.load(std::memory_order_acquire) ||
             (entry = lane.admit(h.lineage, h.epoch, from)) == nullptr) {
    status = UCS_ERR_CANCELED;  // a removed or replaced registration's, or another endpoint's
  } else if (entry->users >= kMaxAcksPerLineage) {
    status = UCS_ERR_NO_RESOURCE;
  } else if (rndv || length == 0 || length > kMaxNotificationBytes) {
    status = UCS_ERR_INVALID_PARAM;  // our initiators send eagerly
  } else {
    const auto message = bytes_of(data, length);
    if (!lane.inbox_.offer(h.lineage, /*own_share=*/false,
                           Notification{entry->extra.name, {message.begin(), message.end()}})) {
      status = UCS_ERR_NO_RESOURCE;  // the owner is not taking them
    }
  }
  if (status == UCS_OK) {
    lane.count(kNotesReceived);
  } else {
    lane.count(kNotesRefused);
    log().warn("kvxfer ucx {}: refused a notification from {}: {}", lane.agent_name_,
               entry != nullptr ? entry->extra.name : "an unknown sender",
               ucs_status_string(status));
    // Past the bounds on acks, not answered at all.
    if (from == nullptr || lane.acks_in_flight_ >= kMaxAcks ||
        (entry != nullptr && entry->users >= kMaxAcksPerLineage)) {
      return UCS_OK;
    }
  }
  lane.send_ack(from, entry,
                wire::NotifyAck{h.slot, h.sequence, static_cast<std::int32_t>(status)});
  return UCS_OK;
}

void UcxLane::send_ack(ucp_ep_h to, Fences::Entry* entry, const wire::NotifyAck& ack) {
  AckMsg* msg = nullptr;
  if (free_acks_.empty()) {
    msg = &acks_.emplace_back();
    msg->lane = this;
  } else {
    msg = free_acks_.back();
    free_acks_.pop_back();
  }
  msg->entry = entry;  // never forgotten while it has acks in flight
  wire::encode_ack(msg->bytes.data(), ack);
  const ucp_request_param_t param = am_param(&UcxLane::on_ack_sent, msg);
  const ucs_status_ptr_t request = ucp_am_send_nbx(to, wire::kNotifyAckAmId, msg->bytes.data(),
                                                   msg->bytes.size(), nullptr, 0, &param);
  if (!UCS_PTR_IS_PTR(request)) return free_acks_.push_back(msg);
  live_requests_.fetch_add(1, std::memory_order_relaxed);
  ++acks_in_flight_;
  if (entry != nullptr) fences_.hold(*entry);
}

void UcxLane::on_ack_sent(void* request, ucs_status_t /*status*/, void* arg) {
  auto* msg = static_cast<AckMsg*>(arg);
  UcxLane& lane = *msg->lane;
  lane.driver_.check_turn();
  ucp_request_free(request);
  lane.live_requests_.fetch_sub(1, std::memory_order_relaxed);
  --lane.acks_in_flight_;
  if (msg->entry != nullptr) lane.fences_.release(*msg->entry, Clock::now());
  lane.free_acks_.push_back(msg);
}

// Initiator: an ack ends the notification it names, if it came through the
// endpoint the notification went out on and echoes its sequence.
ucs_status_t UcxLane::on_ack(void* arg, const void* header, std::size_t header_length, void* data,
                             std::size_t /*length*/, const ucp_am_recv_param_t* param) {
  UcxLane& lane = received(arg, data, param);
  wire::NotifyAck ack;
  Xfer* x = nullptr;
  if (wire::decode_ack(bytes_of(header, header_length), &ack) && ack.slot < lane.slots_.size()) {
    x = lane.slots_[ack.slot];
  }
  // await_index first: only an awaiting transfer is the driver's to read.
  if (x == nullptr || x->await_index == kNotAwaiting || x->sequence != ack.sequence ||
      x->ep->ep == nullptr || x->ep->ep != reply_ep(param)) {
    lane.count(kAcksIgnored);
    return UCS_OK;
  }
  const ucs_status_t status = peer_status(ack.status);
  if (status != UCS_OK) {
    lane.count(kNotesRefused);
    log().warn("kvxfer ucx {}: peer {} refused the notification of transfer {}: {}",
               lane.agent_name_, x->ep->agent_name, x->id, ucs_status_string(status));
  }
  lane.complete(x, status);
  return UCS_OK;
}

}  // namespace kvxfer::internal::ucx
