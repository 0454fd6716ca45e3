// Scatter writes (wire/scatter.h): the initiator's messages and their acks,
// and the target's handler that checks every run, copies it into place and
// acks.
#include <cstring>
#include <utility>

#include "common/log.h"
#include "engines/ucx/ucx_engine.h"

namespace kvxfer::internal::ucx {

void UcxLane::register_scatter_handlers() {
  worker_.set_am_handler(kScatterAmId, &UcxLane::on_scatter_am, this);
  worker_.set_am_handler(kScatterAckAmId, &UcxLane::on_ack_am, this);
}

// Sends a write as scatter messages. The transfer holds one reference for
// the acks (until every message is acked, one fails, or the peer goes) and
// one per message UCX still holds.
Status UcxLane::post_scatter(UcxPeer& p, std::span<const std::int64_t> local,
                             std::span<const std::int64_t> remote, Xfer* xfer) {
  using Chunk = Xfer::AmChunk;
  auto* const base = static_cast<std::uint8_t*>(region_.base);
  const std::uint64_t block_len = region_.block_len;
  const std::uint64_t chunk_limit = settings_.scatter_chunk_bytes;
  xfer->am_headers.clear();
  xfer->am_iov.clear();
  xfer->am_chunks.clear();
  std::uint64_t chunk_bytes = 0;
  const auto open_chunk = [&] {
    xfer->am_chunks.push_back(Chunk{xfer->am_headers.size(), 0, xfer->am_iov.size()});
    xfer->am_headers.resize(xfer->am_headers.size() + kScatterFixedLen);
    chunk_bytes = 0;
  };
  open_chunk();
  for_each_run(local, remote, [&](std::int64_t l, std::int64_t r, std::uint64_t count) {
    std::uint8_t* src = base + static_cast<std::uint64_t>(l) * block_len;
    std::uint64_t offset = static_cast<std::uint64_t>(r) * p.remote_block_len;
    for (std::uint64_t left = count * block_len; left > 0;) {
      if (xfer->am_chunks.back().runs == scatter_max_runs_ || chunk_bytes == chunk_limit) {
        open_chunk();
      }
      const std::uint64_t len = std::min(left, chunk_limit - chunk_bytes);
      const std::size_t at = xfer->am_headers.size();
      xfer->am_headers.resize(at + kScatterRunLen);
      Chunk& chunk = xfer->am_chunks.back();
      put_scatter_run(xfer->am_headers.data() + chunk.header_offset, chunk.runs, offset, len);
      ++chunk.runs;
      xfer->am_iov.push_back(ucp_dt_iov_t{src, len});
      chunk_bytes += len;
      src += len;
      offset += len;
      left -= len;
    }
    return true;
  });

  const std::size_t n = xfer->am_chunks.size();
  scatter_writes_.fetch_add(1, std::memory_order_relaxed);
  scatter_messages_.fetch_add(n, std::memory_order_relaxed);
  std::uint64_t seq = 0;
  xfer->refs.store(2, std::memory_order_relaxed);  // the core's and the acks'
  {
    std::lock_guard lock(am_mu_);
    seq = next_am_seq_++;
    if (seq == 0) seq = next_am_seq_++;  // 0 means "not awaiting acks"
    xfer->am_seq = seq;
    xfer->am_left = static_cast<int>(n);
    xfer->am_status = UCS_OK;
  }
  live_requests_.fetch_add(1, std::memory_order_relaxed);
  for (const Chunk& chunk : xfer->am_chunks) {
    put_scatter_fixed(xfer->am_headers.data() + chunk.header_offset,
                      static_cast<std::uint16_t>(chunk.runs), p.token, seq, xfer->slot);
  }

  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = &UcxLane::on_am_sent;
  param.user_data = xfer;
  param.datatype = ucp_dt_make_iov();
  // Eager only: the target's handler then always gets the bytes in the call.
  param.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  ucs_status_t send_status = UCS_OK;
  std::size_t sent = 0;
  for (; sent < n; ++sent) {
    const Chunk& chunk = xfer->am_chunks[sent];
    const std::size_t iov_end =
        sent + 1 < n ? xfer->am_chunks[sent + 1].iov_offset : xfer->am_iov.size();
    xfer->refs.fetch_add(1, std::memory_order_relaxed);
    live_requests_.fetch_add(1, std::memory_order_relaxed);
    ucs_status_ptr_t request =
        ucp_am_send_nbx(p.ep.get(), kScatterAmId, xfer->am_headers.data() + chunk.header_offset,
                        scatter_header_len(chunk.runs), xfer->am_iov.data() + chunk.iov_offset,
                        iov_end - chunk.iov_offset, &param);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) continue;  // on_am_sent lets go
    live_requests_.fetch_sub(1, std::memory_order_relaxed);
    xfer->refs.fetch_sub(1, std::memory_order_relaxed);  // the core's keeps it above zero
    if (UCS_PTR_IS_ERR(request)) {
      send_status = UCS_PTR_STATUS(request);
      break;
    }
  }
  if (send_status == UCS_OK) return Status::kSuccess;

  log().warn("kvxfer UCX {}: scatter write to peer {} failed: {}", agent_name_, p.agent_name,
             ucs_status_string(send_status));
  if (is_disconnect(send_status)) p.mark_failed();
  // Messages already sent keep going and are still acked; the ones never
  // sent will not be.
  bool settle = false;
  {
    std::lock_guard lock(am_mu_);
    if (xfer->am_seq == seq) {
      xfer->am_left -= static_cast<int>(n - sent);
      xfer->am_status = send_status;
      if (xfer->am_left <= 0) {
        xfer->am_seq = 0;
        settle = true;
      }
    }
  }
  if (settle) end_scatter(xfer, send_status);
  unref(xfer);  // the core's: the write failed
  return map_post_error(send_status);
}

// Ends a transfer's wait for acks with `status`, unless it already ended.
void UcxLane::fail_scatter(Xfer* xfer, ucs_status_t status) {
  {
    std::lock_guard lock(am_mu_);
    if (xfer->am_seq == 0) return;
    xfer->am_seq = 0;
  }
  end_scatter(xfer, status);
}

// The wait for acks is over (am_seq was cleared under am_mu_): publish the
// result and let go of the acks' reference.
void UcxLane::end_scatter(Xfer* xfer, ucs_status_t status) {
  xfer->result.store(status, std::memory_order_release);
  live_requests_.fetch_sub(1, std::memory_order_relaxed);
  unref(xfer);
}

// Ends the wait for acks of every transfer to `peer` (its endpoint failed or
// was closed: no more acks come through it).
void UcxLane::fail_peer_scatters(const UcxPeer* peer, ucs_status_t status) {
  std::vector<Xfer*> failed;
  {
    std::lock_guard lock(am_mu_);
    for (Xfer* x : slots_) {
      if (x->am_seq != 0 && x->peer.get() == peer) {
        x->am_seq = 0;
        failed.push_back(x);
      }
    }
  }
  for (Xfer* x : failed) end_scatter(x, status);
}

void UcxLane::on_am_sent(void* request, ucs_status_t status, void* user_data) {
  auto* xfer = static_cast<Xfer*>(user_data);
  UcxLane* lane = xfer->lane;
  // A message that never left will never be acked.
  if (status != UCS_OK) lane->fail_scatter(xfer, status);
  ucp_request_free(request);
  lane->live_requests_.fetch_sub(1, std::memory_order_relaxed);
  lane->unref(xfer);
}

// Initiator: an ack from a target's scatter handler.
ucs_status_t UcxLane::on_ack_am(void* arg, const void* header, std::size_t header_length,
                                void* /*data*/, std::size_t /*length*/,
                                const ucp_am_recv_param_t* /*param*/) {
  auto* lane = static_cast<UcxLane*>(arg);
  ScatterAck ack;
  if (!decode_ack({static_cast<const std::uint8_t*>(header), header_length}, &ack)) {
    log().warn("kvxfer UCX {}: dropped a malformed scatter ack ({} bytes)", lane->agent_name_,
               header_length);
    return UCS_OK;
  }
  // Only the statuses a handler sends; anything else is an I/O error.
  ucs_status_t status = UCS_ERR_IO_ERROR;
  for (const ucs_status_t known :
       {UCS_OK, UCS_ERR_INVALID_PARAM, UCS_ERR_REJECTED, UCS_ERR_UNSUPPORTED}) {
    if (ack.status == static_cast<std::int32_t>(known)) status = known;
  }
  Xfer* done = nullptr;
  ucs_status_t result = UCS_OK;
  {
    std::lock_guard lock(lane->am_mu_);
    if (ack.slot >= lane->slots_.size()) return UCS_OK;
    Xfer* xfer = lane->slots_[ack.slot];
    if (xfer->am_seq == 0 || xfer->am_seq != ack.sequence) return UCS_OK;  // it already ended
    if (status != UCS_OK && xfer->am_status == UCS_OK) xfer->am_status = status;
    if (--xfer->am_left > 0) return UCS_OK;
    xfer->am_seq = 0;
    result = static_cast<ucs_status_t>(xfer->am_status);
    done = xfer;
  }
  if (result != UCS_OK) {
    lane->scatter_refused_.fetch_add(1, std::memory_order_relaxed);
    log().warn("kvxfer UCX {}: peer {} refused a scatter write of transfer {}: {}",
               lane->agent_name_, done->peer->agent_name, done->id, ucs_status_string(result));
  }
  lane->end_scatter(done, result);
  return UCS_OK;
}

// Target: a scatter write. Every run is checked against the region before a
// byte is copied; the ack tells the initiator what happened.
ucs_status_t UcxLane::on_scatter_am(void* arg, const void* header, std::size_t header_length,
                                    void* data, std::size_t length,
                                    const ucp_am_recv_param_t* param) {
  auto* lane = static_cast<UcxLane*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  lane->scatter_received_.fetch_add(1, std::memory_order_relaxed);
  ScatterHeader h;
  if (!decode_scatter_header({static_cast<const std::uint8_t*>(header), header_length}, &h)) {
    if (rndv) ucp_am_data_release(lane->worker_.worker(), data);
    lane->scatter_rejected_.fetch_add(1, std::memory_order_relaxed);
    log().warn("kvxfer UCX {}: dropped a malformed scatter write ({} header bytes)",
               lane->agent_name_, header_length);
    return UCS_OK;
  }
  ucs_status_t status = UCS_OK;
  const std::uint64_t region_len = lane->region_.num_blocks * lane->region_.block_len;
  if (rndv) {
    // Our initiators send eagerly; a rendezvous one is not ours to take.
    ucp_am_data_release(lane->worker_.worker(), data);
    status = UCS_ERR_UNSUPPORTED;
  } else if (!lane->accepting_writes_.load(std::memory_order_acquire) || h.token != lane->token_) {
    status = UCS_ERR_REJECTED;  // meant for another (earlier) engine, or closing
  } else if (!scatter_runs_fit(h, region_len, length)) {
    status = UCS_ERR_INVALID_PARAM;
  } else {
    auto* const region = static_cast<std::uint8_t*>(lane->region_.base);
    const auto* src = static_cast<const std::uint8_t*>(data);
    for (std::size_t i = 0; i < h.run_count(); ++i) {
      const ScatterRun r = h.run(i);
      std::memcpy(region + r.offset, src, r.length);
      src += r.length;
    }
  }
  if (status != UCS_OK) {
    lane->scatter_rejected_.fetch_add(1, std::memory_order_relaxed);
    log().warn("kvxfer UCX {}: refused a scatter write: {}", lane->agent_name_,
               ucs_status_string(status));
  }
  lane->send_ack(param, ScatterAck{h.slot, h.sequence, static_cast<std::int32_t>(status)});
  return UCS_OK;
}

void UcxLane::send_ack(const ucp_am_recv_param_t* param, const ScatterAck& ack) {
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 || param->reply_ep == nullptr) {
    log().warn("kvxfer UCX {}: a scatter write came without a reply endpoint; not acked",
               agent_name_);
    return;
  }
  AckMsg* msg = nullptr;
  {
    std::lock_guard lock(ack_mu_);
    if (free_acks_.empty()) {
      msg = &acks_.emplace_back();
      msg->lane = this;
    } else {
      msg = free_acks_.back();
      free_acks_.pop_back();
    }
  }
  encode_ack(msg->bytes.data(), ack);
  ucp_request_param_t send{};
  send.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  send.cb.send = &UcxLane::on_ack_sent;
  send.user_data = msg;
  send.flags = UCP_AM_SEND_FLAG_EAGER;
  ucs_status_ptr_t request = ucp_am_send_nbx(param->reply_ep, kScatterAckAmId, msg->bytes.data(),
                                             msg->bytes.size(), nullptr, 0, &send);
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) return;  // on_ack_sent returns msg
  if (UCS_PTR_IS_ERR(request)) {
    // The initiator is gone: its transfers fail on its side.
    log().debug("kvxfer UCX {}: scatter ack not sent: {}", agent_name_,
                ucs_status_string(UCS_PTR_STATUS(request)));
  }
  std::lock_guard lock(ack_mu_);
  free_acks_.push_back(msg);
}

void UcxLane::on_ack_sent(void* request, ucs_status_t /*status*/, void* user_data) {
  auto* msg = static_cast<AckMsg*>(user_data);
  ucp_request_free(request);
  std::lock_guard lock(msg->lane->ack_mu_);
  msg->lane->free_acks_.push_back(msg);
}

}  // namespace kvxfer::internal::ucx
