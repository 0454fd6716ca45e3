// SPDX-License-Identifier: Apache-2.0
// Gather reads (wire/gather.h), the UCX lane's READ: the initiator's
// requests and its handler that copies checked replies into our pool, and
// the target's handler that checks every run and answers from its pool.
// Chunking, the wait, sending and handed-off posts are the scatter writes'
// (ucx_scatter.cc).
#include <cstring>
#include <span>
#include <utility>

#include "common/log.h"
#include "engines/ucx/ucx_engine.h"

namespace kvxfer::internal::ucx {

// A read's requests are cut like a write's messages, so the same header
// limit (scatter_max_runs_) and chunk size bound them; the configured chunk
// (at most 64 MiB, ucx_config.cc) never asks a target for more than it serves.
static_assert(kGatherFixedLen == kScatterFixedLen && kGatherRunLen == kScatterRunLen &&
              kMaxGatherRuns == kMaxScatterRuns);

void UcxLane::register_gather_handlers() {
  worker_.set_am_handler(kGatherAmId, &UcxLane::on_gather_am, this);
  worker_.set_am_handler(kGatherReplyAmId, &UcxLane::on_gather_reply_am, this);
}

// ---------------------------------------------------------------------------
// Initiator
// ---------------------------------------------------------------------------

Status UcxLane::post_read(PeerHandle handle, TransferId id, std::span<const std::int64_t> local,
                          std::span<const std::int64_t> remote, XferHandle* out,
                          std::span<const std::uint8_t> notify) {
  const std::shared_ptr<UcxPeer> peer = find_peer(handle);
  if (peer == nullptr) return Status::kNotFound;
  if (peer->failed()) return Status::kRemoteDisconnect;
  // Only the peer's handler reads its pool for us (there is no get through
  // an rkey): a peer whose blob does not say it answers gather requests (an
  // older kvxfer) serves no reads.
  if (!peer->gather) return Status::kNotSupported;
  Xfer* xfer = start_xfer(peer, id, Xfer::Op::kRead, notify);
  return hand_out(xfer, post_gather(*peer, local, remote, xfer), out);
}

// Sends a read as gather requests, each naming the chunk of the read it is,
// and awaits one reply per request.
Status UcxLane::post_gather(UcxPeer& p, std::span<const std::int64_t> local,
                            std::span<const std::int64_t> remote, Xfer* xfer) {
  gather_reads_.fetch_add(1, std::memory_order_relaxed);
  if (handoff_) return defer_build(p, local, remote, xfer);
  take_runs(local, remote, xfer);
  build_chunks(p, xfer, kGatherFixedLen);
  arm_wait(xfer);
  put_fixed_parts(p, xfer);
  return launch(p, xfer);
}

// Initiator: a target's answer to one request. Its bytes are copied only
// when it came through the endpoint of the peer the read went to, names a
// read still awaited (random sequence) and a chunk of it not yet answered,
// and carries exactly the bytes that chunk asked for. The copy itself runs
// outside am_mu_ (a post never waits for it), counted in the read's
// `copying`: every end of a read's wait (done, failed, released, peer gone)
// clears am_seq and then waits for that count to be zero under am_mu_
// (end_wait_locked), so once a read is reported ended nothing more lands.
ucs_status_t UcxLane::on_gather_reply_am(void* arg, const void* header, std::size_t header_length,
                                         void* data, std::size_t length,
                                         const ucp_am_recv_param_t* param) {
  auto* lane = static_cast<UcxLane*>(arg);
  const char* drop = nullptr;  // why the reply is ignored
  bool quiet = false;          // a late reply of a read that already ended
  Xfer* done = nullptr;
  Xfer* notify = nullptr;
  Xfer* copy_into = nullptr;  // a read whose chunk this reply fills
  ucs_status_t result = UCS_OK;
  GatherReply reply;
  const ucp_ep_h from =
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 ? param->reply_ep : nullptr;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    // Our targets reply eagerly; a rendezvous reply is not theirs.
    ucp_am_data_release(lane->worker_.worker(), data);
    drop = "sent by rendezvous";
  } else if (from == nullptr) {
    drop = "without a reply endpoint";
  } else if (!decode_gather_reply({static_cast<const std::uint8_t*>(header), header_length},
                                  &reply)) {
    drop = "with a malformed header";
  } else if (reply.length != length) {
    drop = "whose bytes differ from its header";
  } else {
    const ucs_status_t status = peer_status(reply.status);
    std::unique_lock lock(lane->am_mu_);
    Xfer* xfer = reply.slot < lane->slots_.size() ? lane->slots_[reply.slot] : nullptr;
    if (xfer == nullptr || xfer->am_seq == 0 || xfer->am_seq != reply.sequence ||
        xfer->op != Xfer::Op::kRead) {
      drop = "for no read awaited";
      quiet = true;
    } else if (xfer->peer->ep_id != from) {  // awaiting replies, so it holds its peer
      drop = "from an endpoint other than its read's peer";
    } else if (reply.chunk >= xfer->am_chunks.size() || xfer->am_chunks[reply.chunk].answered) {
      drop = "for no chunk awaited";
    } else if (status == UCS_OK && length != xfer->am_chunks[reply.chunk].bytes) {
      drop = "of another length than its chunk asked for";
    } else {
      xfer->am_chunks[reply.chunk].answered = true;
      if (status == UCS_OK) {
        // The wait cannot end (nor the transfer be let go) until this
        // copy is counted out below.
        ++xfer->copying;
        copy_into = xfer;
      } else {
        // A refused chunk fails the whole read at once: the other chunks'
        // replies are then dropped rather than copied into a failed read.
        lane->end_wait_locked(xfer, lock);
        result = status;
        done = xfer;
      }
    }
  }
  if (copy_into != nullptr) {
    // The chunk and its iovecs were fixed before the read was posted.
    const Xfer::AmChunk& chunk = copy_into->am_chunks[reply.chunk];
    const auto* src = static_cast<const std::uint8_t*>(data);
    for (std::size_t i = 0; i < chunk.runs; ++i) {
      const ucp_dt_iov_t& dst = copy_into->am_iov[chunk.iov_offset + i];
      std::memcpy(dst.buffer, src, dst.length);
      src += dst.length;
    }
    std::unique_lock lock(lane->am_mu_);
    const bool last_copy = --copy_into->copying == 0;
    // Still awaited (not ended while we copied): count the chunk in.
    if (copy_into->am_seq == reply.sequence && --copy_into->am_left == 0) {
      if (begin_notify_locked(copy_into)) {
        notify = copy_into;  // the wait goes on, for the notification's ack
      } else {
        lane->end_wait_locked(copy_into, lock);
        done = copy_into;
      }
    }
    if (last_copy) lane->copies_cv_.notify_all();
  }
  if (drop != nullptr) {
    lane->gather_replies_ignored_.fetch_add(1, std::memory_order_relaxed);
    if (quiet) {
      log().debug("kvxfer UCX {}: dropped a gather reply for no read awaited", lane->agent_name_);
    } else {
      log().warn("kvxfer UCX {}: dropped a gather reply {} ({} header, {} data bytes)",
                 lane->agent_name_, drop, header_length, length);
    }
    return UCS_OK;
  }
  if (notify != nullptr) lane->send_notify(notify);
  if (done == nullptr) return UCS_OK;
  if (result != UCS_OK) {
    log().warn("kvxfer UCX {}: peer {} refused gather read {}: {}", lane->agent_name_,
               done->peer->agent_name, done->id, ucs_status_string(result));
  }
  lane->end_scatter(done, result);
  return UCS_OK;
}

// ---------------------------------------------------------------------------
// Target
// ---------------------------------------------------------------------------

// Target: a gather request. Served (the runs' bytes sent from our pool) only
// when it is for this engine, every run lies in the region, and its
// registration is the newest fenced for its lineage; otherwise refused with
// a status and no bytes. A request too broken to name its read is dropped.
ucs_status_t UcxLane::on_gather_am(void* arg, const void* header, std::size_t header_length,
                                   void* data, std::size_t length,
                                   const ucp_am_recv_param_t* param) {
  auto* lane = static_cast<UcxLane*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (rndv) ucp_am_data_release(lane->worker_.worker(), data);
  lane->gather_received_.fetch_add(1, std::memory_order_relaxed);
  const std::span<const std::uint8_t> bytes(static_cast<const std::uint8_t*>(header),
                                            header_length);
  GatherRequest request;
  ucs_status_t status = UCS_OK;
  std::uint64_t total = 0;
  const std::uint64_t region_len = lane->region_.num_blocks * lane->region_.block_len;
  if (!decode_gather_request(bytes, &request)) {
    GatherAddress a;
    lane->gather_rejected_.fetch_add(1, std::memory_order_relaxed);
    if (!peek_gather_address(bytes, &a)) {
      log().warn("kvxfer UCX {}: dropped a malformed gather request ({} header bytes)",
                 lane->agent_name_, header_length);
      return UCS_OK;
    }
    log().warn("kvxfer UCX {}: refused a malformed gather request ({} header bytes)",
               lane->agent_name_, header_length);
    lane->send_gather_reply(param,
                            GatherReply{a.slot, a.chunk, a.sequence,
                                        static_cast<std::int32_t>(UCS_ERR_INVALID_PARAM), 0},
                            nullptr);
    return UCS_OK;
  }
  if (rndv || length != 0) {
    status = UCS_ERR_UNSUPPORTED;  // a request carries no payload
  } else if (!lane->accepting_writes_.load(std::memory_order_acquire) ||
             request.token != lane->token_) {
    status = UCS_ERR_REJECTED;  // meant for another (earlier) engine, or closing
  } else if (!gather_runs_fit(request, region_len, kMaxGatherBytes, &total)) {
    status = UCS_ERR_INVALID_PARAM;
  } else {
    std::lock_guard lock(lane->fence_mu_);
    if (!lane->fence_allows(request.lineage, request.epoch)) {
      status = UCS_ERR_CANCELED;  // a removed registration's read
      lane->gather_fenced_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (status != UCS_OK) {
    lane->gather_rejected_.fetch_add(1, std::memory_order_relaxed);
    log().warn("kvxfer UCX {}: refused a gather request: {}", lane->agent_name_,
               ucs_status_string(status));
    total = 0;
  }
  lane->send_gather_reply(param,
                          GatherReply{request.slot, request.chunk, request.sequence,
                                      static_cast<std::int32_t>(status), total},
                          status == UCS_OK ? &request : nullptr);
  return UCS_OK;
}

// Sends `reply` back through the endpoint the request came by, with the
// bytes of `served`'s runs (already checked against the region) as its
// payload, sent by UCX straight from our pool; counted as a live request
// until UCX is done with it (shutdown drains it before unmapping the pool).
void UcxLane::send_gather_reply(const ucp_am_recv_param_t* param, const GatherReply& reply,
                                const GatherRequest* served) {
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 || param->reply_ep == nullptr) {
    log().warn("kvxfer UCX {}: a gather request came without a reply endpoint; not answered",
               agent_name_);
    return;
  }
  ReplyMsg* msg = nullptr;
  {
    std::lock_guard lock(reply_mu_);
    if (free_replies_.empty()) {
      msg = &replies_.emplace_back();
      msg->lane = this;
    } else {
      msg = free_replies_.back();
      free_replies_.pop_back();
    }
  }
  encode_gather_reply(msg->header.data(), reply);
  msg->iov.clear();
  if (served != nullptr) {
    auto* const region = static_cast<std::uint8_t*>(region_.base);
    for (std::size_t i = 0; i < served->run_count(); ++i) {
      const GatherRun r = served->run(i);
      msg->iov.push_back(ucp_dt_iov_t{region + r.offset, r.length});
    }
  }
  ucp_request_param_t send{};
  send.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  send.cb.send = &UcxLane::on_gather_reply_sent;
  send.user_data = msg;
  // REPLY: the initiator takes it only from the peer it read; EAGER: its
  // handler gets the bytes in the call.
  send.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  if (!msg->iov.empty()) {
    send.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    send.datatype = ucp_dt_make_iov();
  }
  live_requests_.fetch_add(1, std::memory_order_relaxed);
  ucs_status_ptr_t request =
      ucp_am_send_nbx(param->reply_ep, kGatherReplyAmId, msg->header.data(), msg->header.size(),
                      msg->iov.empty() ? nullptr : msg->iov.data(), msg->iov.size(), &send);
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) return;  // on_gather_reply_sent returns msg
  live_requests_.fetch_sub(1, std::memory_order_relaxed);
  if (UCS_PTR_IS_ERR(request)) {
    // The initiator is gone: its read fails on its side.
    log().debug("kvxfer UCX {}: gather reply not sent: {}", agent_name_,
                ucs_status_string(UCS_PTR_STATUS(request)));
  }
  std::lock_guard lock(reply_mu_);
  free_replies_.push_back(msg);
}

void UcxLane::on_gather_reply_sent(void* request, ucs_status_t /*status*/, void* user_data) {
  auto* msg = static_cast<ReplyMsg*>(user_data);
  UcxLane* lane = msg->lane;
  ucp_request_free(request);
  {
    std::lock_guard lock(lane->reply_mu_);
    lane->free_replies_.push_back(msg);
  }
  lane->live_requests_.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace kvxfer::internal::ucx
