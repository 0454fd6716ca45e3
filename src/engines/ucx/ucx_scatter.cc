// SPDX-License-Identifier: Apache-2.0
// Scatter writes (wire/scatter.h): the initiator's messages and their acks,
// and the target's handler that checks every run, copies it into place and
// acks; and fences (wire/fence.h), sent first on every endpoint, which the
// target's handler keeps per initiator lineage. Gather reads (ucx_gather.cc)
// share the message machinery here: chunking, the wait for answers, sending,
// handed-off posts, and ending the wait when a peer goes.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "common/log.h"
#include "engines/ucx/ucx_engine.h"

namespace kvxfer::internal::ucx {
namespace {

// How long a post that failed part-way waits for the messages it did send
// to leave (they read the caller's blocks until then) before it force-closes
// the endpoint instead.
constexpr auto kPostDrainTimeout = std::chrono::seconds(2);

}  // namespace

void UcxLane::register_scatter_handlers() {
  worker_.set_am_handler(kScatterAmId, &UcxLane::on_scatter_am, this);
  worker_.set_am_handler(kScatterAckAmId, &UcxLane::on_ack_am, this);
  worker_.set_am_handler(kFenceAmId, &UcxLane::on_fence_am, this);
}

// ---------------------------------------------------------------------------
// Fences
// ---------------------------------------------------------------------------

// Initiator: the first message on a new endpoint. Later sends on the same
// endpoint reach the peer after it, so there is nothing to wait for.
Status UcxLane::send_fence(UcxPeer& p) {
  {
    std::lock_guard lock(lineage_mu_);
    Lineage& lineage = lineages_[{p.agent_name, p.token}];
    if (lineage.id == 0) lineage.id = fresh_random();
    p.lineage = lineage.id;
    p.gen = ++lineage.gen;
  }
  p.epoch = fresh_random();
  encode_fence(p.fence_bytes.data(), Fence{p.token, p.lineage, p.gen, p.epoch});
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = &UcxLane::on_fence_sent;
  param.user_data = this;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  live_requests_.fetch_add(1, std::memory_order_relaxed);
  ucs_status_ptr_t request = ucp_am_send_nbx(p.ep.get(), kFenceAmId, p.fence_bytes.data(),
                                             p.fence_bytes.size(), nullptr, 0, &param);
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) return Status::kSuccess;
  live_requests_.fetch_sub(1, std::memory_order_relaxed);
  if (UCS_PTR_IS_ERR(request)) {
    log().warn("kvxfer UCX {}: cannot send the fence to peer {}: {}", agent_name_, p.agent_name,
               ucs_status_string(UCS_PTR_STATUS(request)));
    return map_post_error(UCS_PTR_STATUS(request));
  }
  return Status::kSuccess;
}

void UcxLane::on_fence_sent(void* request, ucs_status_t /*status*/, void* user_data) {
  // A fence that never left means a failed endpoint, whose error handler
  // fails the peer; writes sent after it are refused by the peer anyway.
  auto* lane = static_cast<UcxLane*>(user_data);
  ucp_request_free(request);
  lane->live_requests_.fetch_sub(1, std::memory_order_relaxed);
}

// Target: an initiator's fence. Kept when it is for us and newer than what
// we hold for its lineage; anything else is ignored and counted.
ucs_status_t UcxLane::on_fence_am(void* arg, const void* header, std::size_t header_length,
                                  void* data, std::size_t /*length*/,
                                  const ucp_am_recv_param_t* param) {
  auto* lane = static_cast<UcxLane*>(arg);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    ucp_am_data_release(lane->worker_.worker(), data);
  }
  lane->fences_received_.fetch_add(1, std::memory_order_relaxed);
  Fence f;
  if (!decode_fence({static_cast<const std::uint8_t*>(header), header_length}, &f)) {
    lane->fences_ignored_.fetch_add(1, std::memory_order_relaxed);
    log().warn("kvxfer UCX {}: dropped a malformed fence ({} header bytes)", lane->agent_name_,
               header_length);
    return UCS_OK;
  }
  if (f.token != lane->token_) {
    lane->fences_ignored_.fetch_add(1, std::memory_order_relaxed);
    log().warn("kvxfer UCX {}: ignored a fence meant for another engine", lane->agent_name_);
    return UCS_OK;
  }
  std::lock_guard lock(lane->fence_mu_);
  auto it = lane->fences_.find(f.lineage);
  if (it == lane->fences_.end()) {
    if (lane->fences_.size() >= kMaxFences) {
      // The least recently fenced lineage goes; its writes are refused from
      // now on (an unknown lineage is never written).
      auto oldest = std::min_element(
          lane->fences_.begin(), lane->fences_.end(),
          [](const auto& a, const auto& b) { return a.second.stamp < b.second.stamp; });
      lane->fences_.erase(oldest);
    }
    lane->fences_.emplace(f.lineage, FenceEntry{f.gen, f.epoch, ++lane->fence_stamp_});
    return UCS_OK;
  }
  if (f.gen > it->second.gen) {
    it->second = FenceEntry{f.gen, f.epoch, ++lane->fence_stamp_};
    return UCS_OK;
  }
  // An older (or repeated) registration's fence, e.g. one still in a
  // connection that was given up: it must not reopen that registration.
  lane->fences_ignored_.fetch_add(1, std::memory_order_relaxed);
  log().debug("kvxfer UCX {}: ignored a stale fence (gen {} <= {})", lane->agent_name_, f.gen,
              it->second.gen);
  return UCS_OK;
}

// Caller holds fence_mu_.
bool UcxLane::fence_allows(std::uint64_t lineage, std::uint64_t epoch) {
  const auto it = fences_.find(lineage);
  return it != fences_.end() && epoch != 0 && it->second.epoch == epoch;
}

// ---------------------------------------------------------------------------
// Scatter writes
// ---------------------------------------------------------------------------

// Sends a write as scatter messages. The transfer holds one reference for
// the acks (until every message is acked, one fails, or the peer goes) and
// one per message UCX still holds.
Status UcxLane::post_scatter(UcxPeer& p, std::span<const std::int64_t> local,
                             std::span<const std::int64_t> remote, Xfer* xfer) {
  scatter_writes_.fetch_add(1, std::memory_order_relaxed);
  if (handoff_) return defer_build(p, local, remote, xfer);
  take_runs(local, remote, xfer);
  build_chunks(p, xfer, kScatterFixedLen);
  arm_wait(xfer);
  put_fixed_parts(p, xfer);
  return launch(p, xfer);
}

// The caller's pairs as runs, in the transfer (one pass; storage for as
// many runs as pairs, kept at its high-water size): the messages are built
// from them, on this thread or on the progress thread.
void UcxLane::take_runs(std::span<const std::int64_t> local, std::span<const std::int64_t> remote,
                        Xfer* xfer) {
  if (xfer->runs.size() < local.size()) xfer->runs.resize(local.size());
  xfer->run_count = encode_runs(local, remote, xfer->runs.data());
  xfer->run_blocks = local.size();
  xfer->pairs_kept = false;
}

// A handed-off post's part on the caller's thread: what the progress thread
// builds its messages from, in the transfer, in the cheaper of two forms. A
// list of scattered blocks is copied as it is (16 bytes per pair, two
// memcpy; the thread finds the runs), one of long runs is kept as its runs
// (24 bytes per run). The first kPairsSample pairs decide: at least half of
// them starting a run of their own means scattered.
void UcxLane::keep_for_build(std::span<const std::int64_t> local,
                             std::span<const std::int64_t> remote, Xfer* xfer) {
  const std::size_t n = local.size();
  const std::size_t sample = std::min(n, kPairsSample);
  std::size_t starts = 1;
  for (std::size_t i = 1; i < sample; ++i) {
    starts +=
        static_cast<std::size_t>(local[i] != local[i - 1] + 1 || remote[i] != remote[i - 1] + 1);
  }
  if (2 * starts < sample) {
    take_runs(local, remote, xfer);
    return;
  }
  if (xfer->pairs.size() < 2 * n) xfer->pairs.resize(2 * n);
  std::memcpy(xfer->pairs.data(), local.data(), local.size_bytes());
  std::memcpy(xfer->pairs.data() + n, remote.data(), remote.size_bytes());
  xfer->run_blocks = n;
  xfer->pairs_kept = true;
  handed_off_as_pairs_.fetch_add(1, std::memory_order_relaxed);
}

// A handed-off post (write or read): the caller's part is to keep its lists
// (above) and arm the wait with no message yet; the progress thread builds
// the messages just before it sends them (build_handed_off). Building them
// here cost the caller about 9 ns per run on these VMs, and more while the
// progress thread streams bytes on the other core.
Status UcxLane::defer_build(UcxPeer& p, std::span<const std::int64_t> local,
                            std::span<const std::int64_t> remote, Xfer* xfer) {
  keep_for_build(local, remote, xfer);
  xfer->build_pending = true;
  xfer->am_chunks.clear();
  arm_wait(xfer);  // no message to answer until built
  return launch(p, xfer);
}

// Progress thread: builds a handed-off transfer's messages from its runs
// and gives its wait one answer to await per message. False when the wait
// ended while the transfer was queued (its peer failed): nothing is sent.
bool UcxLane::build_handed_off(const UcxPeer& p, Xfer* xfer) {
  xfer->build_pending = false;
  if (xfer->pairs_kept) {
    const std::size_t n = xfer->run_blocks;
    const std::span<const std::int64_t> pairs(xfer->pairs.data(), 2 * n);
    take_runs(pairs.first(n), pairs.subspan(n), xfer);
  }
  build_chunks(p, xfer, xfer->op == Xfer::Op::kRead ? kGatherFixedLen : kScatterFixedLen);
  put_fixed_parts(p, xfer);
  std::lock_guard lock(am_mu_);
  if (xfer->am_seq != xfer->post_seq) return false;
  xfer->am_left = static_cast<int>(xfer->am_chunks.size());
  return true;
}

// Fills in the fixed part of each of a built transfer's messages (it names
// the sequence the post drew) and counts the messages.
void UcxLane::put_fixed_parts(const UcxPeer& p, Xfer* xfer) {
  const std::size_t n = xfer->am_chunks.size();
  const std::uint64_t seq = xfer->post_seq;
  std::uint8_t* const headers = xfer->am_headers.data();
  if (xfer->op == Xfer::Op::kRead) {
    gather_messages_.fetch_add(n, std::memory_order_relaxed);
    for (std::size_t i = 0; i < n; ++i) {
      const Xfer::AmChunk& chunk = xfer->am_chunks[i];
      put_gather_fixed(headers + chunk.header_offset, static_cast<std::uint16_t>(chunk.runs),
                       p.token, seq, xfer->slot, static_cast<std::uint32_t>(i), p.lineage, p.epoch);
    }
    return;
  }
  scatter_messages_.fetch_add(n, std::memory_order_relaxed);
  for (const Xfer::AmChunk& chunk : xfer->am_chunks) {
    put_scatter_fixed(headers + chunk.header_offset, static_cast<std::uint16_t>(chunk.runs),
                      p.token, seq, xfer->slot, p.lineage, p.epoch);
  }
}

// Cuts a transfer's runs into messages of at most scatter_max_runs_ runs and
// settings_.scatter_chunk_bytes bytes (a longer run is split across
// messages): per message, a header whose runs follow `fixed_len` bytes left
// for the caller's fixed part, and our pool's side of each run in am_iov.
// From the transfer's runs (take_runs), on the thread that sends it (the
// progress thread's when handed off, else the caller's); per run, two
// stores into the header and one into am_iov, both sized once for the
// transfer's worst case (a piece per run, plus one per message cut at the
// byte limit) and kept at their high-water size; am_chunks alone says how
// much of them a transfer uses.
void UcxLane::build_chunks(const UcxPeer& p, Xfer* xfer, std::size_t fixed_len) {
  using Chunk = Xfer::AmChunk;
  auto* const base = static_cast<std::uint8_t*>(region_.base);
  const std::uint64_t block_len = region_.block_len;
  const std::uint64_t remote_block_len = p.remote_block_len;
  const std::uint64_t chunk_limit = settings_.scatter_chunk_bytes;
  const std::size_t max_runs = scatter_max_runs_;
  // A message closes at max_runs pieces or at chunk_limit bytes; every close
  // at the byte limit may split one run in two.
  const std::span<const BlockRun> runs_in(xfer->runs.data(), xfer->run_count);
  const std::size_t byte_cuts = xfer->run_blocks * block_len / chunk_limit;
  const std::size_t max_pieces = runs_in.size() + byte_cuts;
  const std::size_t max_chunks = max_pieces / max_runs + byte_cuts + 1;
  const std::size_t header_bound = max_chunks * fixed_len + max_pieces * wire::kRunLen;
  if (xfer->am_headers.size() < header_bound) xfer->am_headers.resize(header_bound);
  if (xfer->am_iov.size() < max_pieces) xfer->am_iov.resize(max_pieces);
  xfer->am_chunks.clear();
  xfer->am_chunks.reserve(max_chunks);
  std::uint8_t* const headers = xfer->am_headers.data();
  ucp_dt_iov_t* const iov = xfer->am_iov.data();
  // The open message's counts live in locals, stored into am_chunks when it
  // closes: the header stores go through a byte pointer, which may alias
  // anything, so counts kept in the Chunk would be reloaded and stored again
  // for every run.
  std::uint8_t* header = headers + fixed_len;
  ucp_dt_iov_t* piece = iov;
  std::size_t runs = 0;
  std::uint64_t bytes = 0;
  std::size_t header_offset = 0;
  std::size_t iov_offset = 0;
  const auto close_chunk = [&] {
    xfer->am_chunks.push_back(Chunk{header_offset, runs, iov_offset, bytes, false});
    header_offset = static_cast<std::size_t>(header - headers);
    iov_offset = static_cast<std::size_t>(piece - iov);
    header += fixed_len;
    runs = 0;
    bytes = 0;
  };
  for (const BlockRun& run : runs_in) {
    std::uint8_t* at = base + static_cast<std::uint64_t>(run.local) * block_len;
    std::uint64_t offset = static_cast<std::uint64_t>(run.remote) * remote_block_len;
    for (std::uint64_t left = run.count * block_len; left > 0;) {
      if (runs == max_runs || bytes == chunk_limit) close_chunk();
      const std::uint64_t len = std::min(left, chunk_limit - bytes);
      wire::put_run_at(header, offset, len);
      header += wire::kRunLen;
      *piece++ = ucp_dt_iov_t{at, len};
      ++runs;
      bytes += len;
      at += len;
      offset += len;
      left -= len;
    }
  }
  close_chunk();
}

// Starts the wait for a built transfer's acks (replies): draws its sequence
// (fresh and random per transfer, never 0, which means "not awaiting": an
// answer must name it, and no one but the peer it was sent to sees it) and
// takes the core's and the wait's references.
std::uint64_t UcxLane::arm_wait(Xfer* xfer) {
  const std::uint64_t seq = fresh_random();
  xfer->post_seq = seq;
  xfer->refs.store(2, std::memory_order_relaxed);  // the core's and the wait's
  xfer->sends_pending.store(0, std::memory_order_relaxed);
  {
    std::lock_guard lock(am_mu_);
    xfer->am_seq = seq;
    xfer->am_left = static_cast<int>(xfer->am_chunks.size());
    xfer->am_status = UCS_OK;
  }
  live_requests_.fetch_add(1, std::memory_order_relaxed);
  return seq;
}

// Sends an armed transfer: handed to the progress thread (which builds its
// messages first if the post left that to it), or, built, inline on the
// caller's thread.
Status UcxLane::launch(UcxPeer& p, Xfer* xfer) {
  const bool read = xfer->op == Xfer::Op::kRead;
  if (handoff_) {
    // The progress thread sends it; a failure then shows in check().
    xfer->refs.fetch_add(1, std::memory_order_relaxed);  // the queue's
    (read ? gather_handed_off_ : scatter_handed_off_).fetch_add(1, std::memory_order_relaxed);
    submit(xfer);
    return Status::kSuccess;
  }
  std::size_t sent = 0;
  const ucs_status_t send_status = send_scatter(p, xfer, &sent);
  if (send_status == UCS_OK) return Status::kSuccess;

  const std::size_t n = xfer->am_chunks.size();
  log().warn("kvxfer UCX {}: {} to peer {} failed after {} of {} messages: {}", agent_name_,
             read ? "gather read" : "scatter write", p.agent_name, sent, n,
             ucs_status_string(send_status));
  if (is_disconnect(send_status)) p.mark_failed();
  settle_unsent(xfer, sent, send_status);
  // A write's messages already sent read the caller's blocks until UCX is
  // done with them: none may still do so once the post returned its error.
  // (A read's requests carry only their headers, which the transfer keeps.)
  if (sent > 0 && !read) wait_sends(p, xfer);
  unref(xfer);  // the core's: the post failed
  return map_post_error(send_status);
}

// Sends a built transfer's messages in order: a write's scatter messages
// (header and bytes) or a read's gather requests (header only; am_iov is
// where the replies go). Returns UCS_OK, or the error of the first send that
// failed, with *sent the messages that left before it.
ucs_status_t UcxLane::send_scatter(UcxPeer& p, Xfer* xfer, std::size_t* sent) {
  const bool read = xfer->op == Xfer::Op::kRead;
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = &UcxLane::on_am_sent;
  param.user_data = xfer;
  if (!read) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_iov();
  }
  // Eager only: the target's handler then always gets the bytes in the call.
  // REPLY: the target answers through the endpoint the message came by.
  param.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  const unsigned am_id = read ? kGatherAmId : kScatterAmId;
  const std::size_t n = xfer->am_chunks.size();
  for (*sent = 0; *sent < n; ++*sent) {
    const std::size_t i = *sent;
    const Xfer::AmChunk& chunk = xfer->am_chunks[i];
    const std::size_t header_len =
        read ? gather_request_len(chunk.runs) : scatter_header_len(chunk.runs);
    xfer->refs.fetch_add(1, std::memory_order_relaxed);
    xfer->sends_pending.fetch_add(1, std::memory_order_relaxed);
    live_requests_.fetch_add(1, std::memory_order_relaxed);
    ucs_status_ptr_t request = ucp_am_send_nbx(
        p.ep.get(), am_id, xfer->am_headers.data() + chunk.header_offset, header_len,
        read ? nullptr : xfer->am_iov.data() + chunk.iov_offset, read ? 0 : chunk.runs, &param);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) continue;  // on_am_sent lets go
    live_requests_.fetch_sub(1, std::memory_order_relaxed);
    xfer->sends_pending.fetch_sub(1, std::memory_order_relaxed);
    xfer->refs.fetch_sub(1, std::memory_order_relaxed);  // another reference keeps it above zero
    if (UCS_PTR_IS_ERR(request)) return UCS_PTR_STATUS(request);
  }
  // A notification alone (send_notification) is its only message.
  if (xfer->op == Xfer::Op::kNotify) return send_notify_message(p, xfer);
  return UCS_OK;
}

// Messages [sent, n) of a transfer will never be acked: count them as
// answered with `status`. A write's messages already sent keep going and are
// still acked; the transfer ends when they are (or its peer fails). A read
// that could not ask for all its bytes fails at once: replies to the
// requests that did leave are then dropped, not copied into a failed read.
void UcxLane::settle_unsent(Xfer* xfer, std::size_t sent, ucs_status_t status) {
  if (xfer->op != Xfer::Op::kWrite) {  // a read, or a notification that never left
    fail_scatter(xfer, status);
    return;
  }
  const std::size_t n = xfer->am_chunks.size();
  bool settle = false;
  {
    std::lock_guard lock(am_mu_);
    if (xfer->am_seq == xfer->post_seq) {
      xfer->am_left -= static_cast<int>(n - sent);
      xfer->am_status = status;
      if (xfer->am_left <= 0) {
        xfer->am_seq = 0;
        settle = true;
      }
    }
  }
  if (settle) end_scatter(xfer, status);
}

// ---------------------------------------------------------------------------
// Handed-off posts
// ---------------------------------------------------------------------------

// Caller's thread: queues a built transfer (holding the queue's reference)
// and wakes the progress thread if it sleeps. No UCX call, no allocation.
void UcxLane::submit(Xfer* xfer) {
  bool wake = false;
  {
    std::lock_guard lock(submit_mu_);
    xfer->next_submit = nullptr;
    (submit_tail_ != nullptr ? submit_tail_->next_submit : submit_head_) = xfer;
    submit_tail_ = xfer;
    wake = std::exchange(thread_idle_, false);
  }
  if (wake) {
    wakes_.fetch_add(1, std::memory_order_relaxed);
    worker_.wake();
  }
}

// Progress thread: sends everything queued. Without `before_sleep`, returns
// kGoRound when there was something (the thread's sign of activity). With
// it, says how the thread rests: go round when it sent something; else
// sleep until woken (thread_idle_: the next submission wakes it); or, while
// UCX requests of ours are in flight and answering, nap: their events
// (acks, replies, sends leaving) wake the thread anyway, and the nap bounds
// the wait when none come, so a submission meanwhile needs no wake. A wake
// is a syscall on the caller's thread, 5-60 us on these VMs
// (docs/performance.md). Requests that went quiet for kMaxQuietNaps naps (a
// stalled peer) get a plain sleep: napping on them would only burn CPU.
// With nothing in flight, for settings_.linger after the lane last sent or
// had requests in flight, linger: naps of settings_.linger_step, so that a
// caller that posts again soon (a pipeline that ran dry for a moment) is
// served within a step without a wake.
UcxWorker::Rest UcxLane::drain_submissions(bool before_sleep) {
  bool drained = false;
  for (;;) {
    Xfer* head = nullptr;
    {
      std::lock_guard lock(submit_mu_);
      head = std::exchange(submit_head_, nullptr);
      submit_tail_ = nullptr;
      const bool rests = head == nullptr && before_sleep && !drained;
      const bool live = live_requests_.load(std::memory_order_relaxed) > 0;
      const bool nap = rests && settings_.nap.count() > 0 && live && !worker_.naps_unanswered();
      const bool linger = rests && settings_.linger.count() > 0 && lingers(live);
      thread_idle_ = rests && !nap && !linger;
      if (head == nullptr) {
        if (drained) return UcxWorker::Rest::kGoRound;
        if (nap) return UcxWorker::Rest::kNap;
        return linger ? UcxWorker::Rest::kLinger : UcxWorker::Rest::kSleep;
      }
    }
    drained = true;
    if (linger_.this_period) {  // a post the linger caught, with no wake
      linger_.misses = 0;
      linger_hits_.fetch_add(1, std::memory_order_relaxed);
    }
    linger_.busy(std::chrono::steady_clock::now());
    while (head != nullptr) {
      Xfer* next = std::exchange(head->next_submit, nullptr);
      send_submitted(head);
      head = next;
    }
  }
}

// Progress thread, at a rest with nothing queued: whether to linger. An idle
// period (nothing in flight since the last request ended or post was sent)
// lingers for settings_.linger after its start, unless lingers keep
// catching nothing: after k in a row that ended with no post (a caller whose
// posts come further apart than the linger), the next 2^k - 1 idle periods
// (k <= kMaxLingerMisses) sleep at once, so that such a caller costs the
// thread no step it cannot use. A linger that catches a post starts over.
bool UcxLane::lingers(bool live) {
  const auto now = std::chrono::steady_clock::now();
  if (live || linger_.was_live) linger_.busy(now);  // in flight, or just ended
  linger_.was_live = live;
  if (live) return false;
  if (!linger_.decided) {  // the first rest of this idle period
    // Nothing went on a moment ago (the thread's start, or an event that
    // was no post of ours): nothing to linger for.
    if (now - linger_.last_busy >= settings_.linger) return false;
    linger_.decided = true;
    linger_.this_period = linger_.skips == 0;
    if (linger_.this_period) {
      lingers_.fetch_add(1, std::memory_order_relaxed);
    } else {
      --linger_.skips;
    }
  }
  if (!linger_.this_period) return false;
  if (now - linger_.last_busy < settings_.linger) return true;
  // Ran out with no post: count the miss once, and sleep.
  linger_.this_period = false;
  linger_.misses = std::min(linger_.misses + 1, kMaxLingerMisses);
  linger_.skips = (1 << linger_.misses) - 1;
  return false;
}

// Progress thread (or stop(), once the thread is gone): sends one queued
// transfer, or fails it when its peer is closing or failed, the lane is
// stopping, or the core already let it go (an immediate cancel: better never
// sent than landing late). Lets go of the queue's reference.
void UcxLane::send_submitted(Xfer* xfer) {
  if (xfer->notify_queued) {
    send_queued_notify(xfer);
    return;
  }
  UcxPeer& p = *xfer->peer;
  {
    std::lock_guard lock(send_mu_);
    ucs_status_t refuse = UCS_OK;
    if (p.closing || !xfer->held.load(std::memory_order_relaxed) ||
        !sending_.load(std::memory_order_acquire)) {
      refuse = UCS_ERR_CANCELED;
    } else if (p.failed()) {
      const auto error = static_cast<ucs_status_t>(p.error.load(std::memory_order_acquire));
      refuse = error != UCS_OK ? error : UCS_ERR_CONNECTION_RESET;
    }
    if (refuse != UCS_OK) {
      // One still to build has no message yet: its wait ends with `refuse`.
      xfer->build_pending = false;
      settle_unsent(xfer, 0, refuse);
    } else if (!xfer->build_pending || build_handed_off(p, xfer)) {
      std::size_t sent = 0;
      const ucs_status_t st = send_scatter(p, xfer, &sent);
      if (st != UCS_OK) {
        log().warn("kvxfer UCX {}: {} to peer {} failed after {} of {} messages: {}", agent_name_,
                   xfer->op == Xfer::Op::kRead ? "gather read" : "scatter write", p.agent_name,
                   sent, xfer->am_chunks.size(), ucs_status_string(st));
        if (is_disconnect(st)) p.mark_failed();
        settle_unsent(xfer, sent, st);
      }
    }
  }
  unref(xfer);  // the queue's
}

// Drives the worker (bounded) until UCX holds none of `xfer`'s messages; if
// they do not leave in time (a stalled peer), force-closes the endpoint,
// which completes them. The caller holds a reference to `xfer`.
void UcxLane::wait_sends(UcxPeer& p, Xfer* xfer) {
  const auto deadline = std::chrono::steady_clock::now() + kPostDrainTimeout;
  while (xfer->sends_pending.load(std::memory_order_acquire) > 0 &&
         std::chrono::steady_clock::now() < deadline) {
    worker_.progress_once();
  }
  if (xfer->sends_pending.load(std::memory_order_acquire) == 0) return;
  log().warn(
      "kvxfer UCX {}: a failed write to peer {} still has {} message(s) in UCX after {} ms; "
      "force-closing the endpoint",
      agent_name_, p.agent_name, xfer->sends_pending.load(std::memory_order_relaxed),
      std::chrono::duration_cast<std::chrono::milliseconds>(kPostDrainTimeout).count());
  p.mark_failed();
  [[maybe_unused]] const Status closed = close_endpoint(p);
  fail_peer_scatters(&p, UCS_ERR_CANCELED);
}

// Ends a transfer's wait for acks with `status`, unless it already ended.
void UcxLane::fail_scatter(Xfer* xfer, ucs_status_t status) {
  {
    std::unique_lock lock(am_mu_);
    if (xfer->am_seq == 0) return;
    end_wait_locked(xfer, lock);
  }
  end_scatter(xfer, status);
}

void UcxLane::end_wait_locked(Xfer* xfer, std::unique_lock<std::mutex>& lock) {
  xfer->am_seq = 0;
  // A reply copy under way (on the thread that progresses the worker) is
  // bounded by one chunk; none can start now that am_seq is clear.
  copies_cv_.wait(lock, [xfer] { return xfer->copying == 0; });
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
    std::unique_lock lock(am_mu_);
    for (Xfer* x : slots_) {
      if (x->am_seq != 0 && x->peer.get() == peer) {
        x->am_seq = 0;
        failed.push_back(x);
      }
    }
    for (Xfer* x : failed) end_wait_locked(x, lock);  // waits out reply copies
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
  xfer->sends_pending.fetch_sub(1, std::memory_order_release);
  lane->unref(xfer);
}

// Initiator: an ack from a target's scatter handler. Taken only from the
// endpoint of the peer the write went to (the target acks with a reply
// endpoint) and only when it names the write's random sequence: no other
// peer can complete or fail it.
ucs_status_t UcxLane::on_ack_am(void* arg, const void* header, std::size_t header_length,
                                void* data, std::size_t /*length*/,
                                const ucp_am_recv_param_t* param) {
  auto* lane = static_cast<UcxLane*>(arg);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    ucp_am_data_release(lane->worker_.worker(), data);
  }
  const ucp_ep_h from =
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 ? param->reply_ep : nullptr;
  if (from == nullptr) {
    lane->acks_ignored_.fetch_add(1, std::memory_order_relaxed);
    log().warn("kvxfer UCX {}: dropped a scatter ack without a reply endpoint", lane->agent_name_);
    return UCS_OK;
  }
  ScatterAck ack;
  if (!decode_ack({static_cast<const std::uint8_t*>(header), header_length}, &ack)) {
    log().warn("kvxfer UCX {}: dropped a malformed scatter ack ({} bytes)", lane->agent_name_,
               header_length);
    return UCS_OK;
  }
  const ucs_status_t status = peer_status(ack.status);
  Xfer* done = nullptr;
  Xfer* notify = nullptr;
  ucs_status_t result = UCS_OK;
  {
    std::lock_guard lock(lane->am_mu_);
    if (ack.slot >= lane->slots_.size()) return UCS_OK;
    Xfer* xfer = lane->slots_[ack.slot];
    if (xfer->am_seq == 0 || xfer->am_seq != ack.sequence) return UCS_OK;  // it already ended
    if (xfer->op == Xfer::Op::kRead && !xfer->notify_stage) {
      lane->acks_ignored_.fetch_add(1, std::memory_order_relaxed);  // a read is answered by replies
      return UCS_OK;
    }
    // Awaiting acks, so the transfer holds its peer.
    if (xfer->peer->ep_id != from) {
      lane->acks_ignored_.fetch_add(1, std::memory_order_relaxed);
      log().warn(
          "kvxfer UCX {}: ignored a scatter ack for transfer {} from an endpoint other "
          "than its peer's",
          lane->agent_name_, xfer->id);
      return UCS_OK;
    }
    if (status != UCS_OK && xfer->am_status == UCS_OK) xfer->am_status = status;
    if (--xfer->am_left > 0) return UCS_OK;
    if (xfer->am_status == UCS_OK && begin_notify_locked(xfer)) {
      notify = xfer;  // every byte is in place: now the notification
    } else {
      xfer->am_seq = 0;
      result = static_cast<ucs_status_t>(xfer->am_status);
      done = xfer;
    }
  }
  if (notify != nullptr) {
    lane->send_notify(notify);
    return UCS_OK;
  }
  if (result != UCS_OK) {
    const bool note = done->op == Xfer::Op::kNotify || done->notify_stage;
    (note ? lane->notifications_refused_ : lane->scatter_refused_)
        .fetch_add(1, std::memory_order_relaxed);
    log().warn("kvxfer UCX {}: peer {} refused {} of transfer {}: {}", lane->agent_name_,
               done->peer->agent_name, note ? "the notification" : "a scatter write", done->id,
               ucs_status_string(result));
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
    // The fence check and the copy under one lock: a fence handled between
    // them could otherwise let an old registration's bytes land after it.
    // (UCX already runs this worker's handlers one at a time; the lock makes
    // it not depend on that.)
    std::lock_guard lock(lane->fence_mu_);
    if (!lane->fence_allows(h.lineage, h.epoch)) {
      status = UCS_ERR_CANCELED;
      lane->scatter_fenced_.fetch_add(1, std::memory_order_relaxed);
    } else {
      auto* const region = static_cast<std::uint8_t*>(lane->region_.base);
      const auto* src = static_cast<const std::uint8_t*>(data);
      for (std::size_t i = 0; i < h.run_count(); ++i) {
        const ScatterRun r = h.run(i);
        std::memcpy(region + r.offset, src, r.length);
        src += r.length;
      }
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
  // REPLY: the initiator learns which endpoint the ack came through, and
  // takes it only from the peer it wrote to.
  send.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
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
