// SPDX-License-Identifier: Apache-2.0
// Writes as puts: one ucp_put_nbx per run of consecutive blocks, then one
// ucp_ep_flush_nbx whose completion means the bytes are in the peer's memory
// (a put that completed locally is not yet visible remotely).
#include <chrono>

#include "common/log.h"
#include "engines/ucx/ucx_engine.h"

namespace kvxfer::internal::ucx {
namespace {

// How long a post that failed part-way waits for its puts to be flushed.
constexpr auto kPostFlushTimeout = std::chrono::seconds(2);

}  // namespace

Status UcxLane::post_puts(UcxPeer& p, std::span<const std::int64_t> local,
                          std::span<const std::int64_t> remote, Xfer* xfer) {
  put_writes_.fetch_add(1, std::memory_order_relaxed);
  // Puts carry no callback and their requests are freed at once: only the
  // flush is tracked, and its completion covers every put before it.
  ucp_request_param_t put{};
  put.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FLAG_MULTI_SEND;
  put.memh = memh_.get();
  auto* const base = static_cast<std::uint8_t*>(region_.base);
  const std::uint64_t block_len = region_.block_len;
  ucs_status_t put_status = UCS_OK;
  bool any_posted = false;
  for_each_run(local, remote, [&](std::int64_t l, std::int64_t r, std::uint64_t count) {
    ucs_status_ptr_t request = ucp_put_nbx(
        p.ep.get(), base + static_cast<std::uint64_t>(l) * block_len, count * block_len,
        p.remote_base + static_cast<std::uint64_t>(r) * p.remote_block_len, p.rkey.get(), &put);
    if (UCS_PTR_IS_ERR(request)) {
      put_status = UCS_PTR_STATUS(request);
      return false;
    }
    if (request != nullptr) ucp_request_free(request);
    any_posted = true;
    return true;
  });

  if (put_status != UCS_OK) {
    log().warn("kvxfer UCX {}: put to peer {} failed: {}", agent_name_, p.agent_name,
               ucs_status_string(put_status));
    if (is_disconnect(put_status)) p.mark_failed();
    // Puts already posted read the caller's blocks until they are done: wait
    // (bounded) for a flush to cover them before returning the error, and
    // force-close the endpoint if it does not complete in time.
    xfer->refs.store(1, std::memory_order_relaxed);  // ours
    ucs_status_t immediate = UCS_OK;
    if (any_posted) {
      xfer->refs.store(2, std::memory_order_relaxed);  // ours and the flush's
      if (flush(p, xfer, &immediate)) {
        const auto deadline = std::chrono::steady_clock::now() + kPostFlushTimeout;
        while (xfer->result.load(std::memory_order_acquire) == UCS_INPROGRESS &&
               std::chrono::steady_clock::now() < deadline) {
          worker_.progress_once();
        }
        if (xfer->result.load(std::memory_order_acquire) == UCS_INPROGRESS) {
          log().warn(
              "kvxfer UCX {}: puts of a failed write to peer {} not flushed in time; "
              "force-closing the endpoint",
              agent_name_, p.agent_name);
          p.mark_failed();
          [[maybe_unused]] const Status closed = close_endpoint(p);
        }
      } else {
        unref(xfer);  // the flush's: it completed at once
      }
    }
    xfer->result.store(put_status, std::memory_order_relaxed);
    unref(xfer);
    return map_post_error(put_status);
  }

  xfer->refs.store(2, std::memory_order_relaxed);  // the core's and the flush's
  ucs_status_t immediate = UCS_OK;
  if (flush(p, xfer, &immediate)) return Status::kSuccess;
  if (immediate == UCS_OK) {
    xfer->result.store(UCS_OK, std::memory_order_relaxed);
    xfer->refs.store(1, std::memory_order_relaxed);
    return Status::kSuccess;
  }
  log().warn("kvxfer UCX {}: flush to peer {} failed: {}", agent_name_, p.agent_name,
             ucs_status_string(immediate));
  if (is_disconnect(immediate)) p.mark_failed();
  xfer->refs.store(1, std::memory_order_relaxed);
  unref(xfer);
  return map_post_error(immediate);
}

// Posts a flush whose completion calls on_flush(xfer). True when it is
// pending (on_flush will run); false when it completed at once, with the
// status in *immediate.
bool UcxLane::flush(UcxPeer& peer, Xfer* xfer, ucs_status_t* immediate) {
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  params.cb.send = &UcxLane::on_flush;
  params.user_data = xfer;
  live_requests_.fetch_add(1, std::memory_order_relaxed);
  ucs_status_ptr_t request = ucp_ep_flush_nbx(peer.ep.get(), &params);
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) return true;
  live_requests_.fetch_sub(1, std::memory_order_relaxed);
  *immediate = UCS_PTR_STATUS(request);
  return false;
}

void UcxLane::on_flush(void* request, ucs_status_t status, void* user_data) {
  auto* xfer = static_cast<Xfer*>(user_data);
  UcxLane* lane = xfer->lane;
  xfer->result.store(status, std::memory_order_release);
  ucp_request_free(request);
  lane->live_requests_.fetch_sub(1, std::memory_order_relaxed);
  lane->unref(xfer);
}

}  // namespace kvxfer::internal::ucx
