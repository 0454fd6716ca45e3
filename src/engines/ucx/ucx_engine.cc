// SPDX-License-Identifier: Apache-2.0
#include "engines/ucx/ucx_engine.h"

#include <fmt/format.h>
#include <pthread.h>
#include <sys/random.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <stdexcept>
#include <utility>

#include "common/log.h"
#include "common/random.h"
#include "engines/ucx/ucx_compat.h"

namespace kvxfer::internal::ucx {

namespace {

// fresh_random's supply, per thread: one getrandom call fills 32 values (256
// bytes, which getrandom never cuts short), where one call per transfer cost
// about 9% of a 4,096-block write_blocks here (a syscall on this VM). Used
// values are wiped. A child made by fork() starts with none, so that it
// never replays what its parent draws next.
struct RandomSupply {
  static constexpr std::size_t kValues = 32;
  std::array<std::uint64_t, kValues> values{};
  std::size_t left = 0;
};
thread_local RandomSupply t_random;

void forget_random_in_child() { t_random.left = 0; }

}  // namespace

std::uint64_t fresh_random() {
  static const int atfork = ::pthread_atfork(nullptr, nullptr, &forget_random_in_child);
  static_cast<void>(atfork);
  RandomSupply& supply = t_random;
  for (;;) {
    if (supply.left == 0) {
      const std::size_t bytes = sizeof(supply.values);
      if (::getrandom(supply.values.data(), bytes, 0) != static_cast<ssize_t>(bytes)) {
        const std::uint64_t value = random_u64();  // getrandom unavailable
        if (value != 0) return value;
        continue;
      }
      supply.left = supply.values.size();
    }
    --supply.left;
    const std::uint64_t value = std::exchange(supply.values[supply.left], 0);
    if (value != 0) return value;
  }
}

UcxLane::UcxLane(std::string agent_name, const Region& region, const Options& options,
                 std::uint64_t token)
    : agent_name_(std::move(agent_name)),
      region_(region),
      token_(token),
      // Computed (and checked) before UCX reads its configuration: a refused
      // knob must not leave anything of UCX behind.
      settings_(compute_ucx_settings(options.engine_config, &process_env, host_has_rdma_device())),
      want_progress_thread_(options.progress_thread),
      worker_(agent_name_, settings_.overrides, settings_.rma) {
  // A scatter message's header lists its runs, so UCX's header limit bounds
  // the runs per message; a limit too small for a few runs turns them off.
  if (worker_.max_am_header() >= scatter_header_len(8)) {
    scatter_max_runs_ =
        std::min(kMaxScatterRuns, (worker_.max_am_header() - kScatterFixedLen) / kScatterRunLen);
  } else {
    settings_.scatter_max_run = 0;
    scatter_ok_ = false;
  }
  if (!settings_.rma && !scatter_ok_) {
    throw std::runtime_error(fmt::format(
        "kvxfer UCX: the transports in use ({}) allow active message headers of {} bytes, too "
        "few for scatter writes, and without an RDMA device (or with KVXFER_RMA=off) scatter "
        "writes are the only way to write",
        settings_.tls, worker_.max_am_header()));
  }
  register_scatter_handlers();
  register_gather_handlers();
  register_notify_handler();

  ucs_status_t st =
      memh_.map(worker_.context(), region_.base, region_.num_blocks * region_.block_len);
  if (st != UCS_OK) {
    throw std::runtime_error(
        fmt::format("kvxfer UCX: ucp_mem_map failed: {}", ucs_status_string(st)));
  }
  // Without RMA the pool is still mapped (and counted as registered), but no
  // rkey is published: peers write it only through scatter messages.
  if (settings_.rma) publish_rkey();
  accepting_writes_.store(true, std::memory_order_release);
  if (want_progress_thread_) {
    handoff_ = settings_.post_handoff;
    if (handoff_) {
      worker_.set_submit_hook([this](bool before_sleep) { return drain_submissions(before_sleep); },
                              settings_.nap, settings_.linger_step);
    }
    worker_.start_progress_thread(settings_.progress_nice);
  }
}

void UcxLane::publish_rkey() {
  void* rkey_buffer = nullptr;
  std::size_t rkey_len = 0;
  const ucs_status_t st =
      ucx_compat::pack_rkey(worker_.context(), memh_.get(), &rkey_buffer, &rkey_len);
  if (st != UCS_OK) {
    throw std::runtime_error(
        fmt::format("kvxfer UCX: packing the pool's rkey failed: {}", ucs_status_string(st)));
  }
  const auto* rkey_bytes = static_cast<const std::uint8_t*>(rkey_buffer);
  packed_rkey_.assign(rkey_bytes, rkey_bytes + rkey_len);
  ucx_compat::release_packed_rkey(rkey_buffer);
}

UcxLane::~UcxLane() {
  stop();
  release_pool();
  destroy_worker();
}

// ---------------------------------------------------------------------------
// Transfers
// ---------------------------------------------------------------------------

UcxLane::Xfer* UcxLane::acquire_xfer() {
  std::lock_guard lock(pool_mu_);
  if (free_xfers_.empty()) {
    Xfer& x = xfers_.emplace_back();
    x.lane = this;
    std::lock_guard am_lock(am_mu_);
    x.slot = static_cast<std::uint32_t>(slots_.size());
    slots_.push_back(&x);
    return &x;
  }
  Xfer* x = free_xfers_.back();
  free_xfers_.pop_back();
  return x;
}

void UcxLane::unref(Xfer* xfer) {
  if (xfer->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  xfer->peer.reset();
  std::lock_guard lock(pool_mu_);
  free_xfers_.push_back(xfer);
}

// The core only posts to peers it connected and has not disconnected, so
// this lookup exists to hand transfers a reference, not to validate.
std::shared_ptr<UcxPeer> UcxLane::find_peer(PeerHandle handle) const {
  std::lock_guard lock(peers_mu_);
  auto it = peers_.find(handle);
  return it == peers_.end() ? nullptr : it->second;
}

UcxLane::Xfer* UcxLane::start_xfer(std::shared_ptr<UcxPeer> peer, TransferId id, Xfer::Op op,
                                   std::span<const std::uint8_t> notify) {
  Xfer* xfer = acquire_xfer();
  xfer->id = id;
  xfer->op = op;
  xfer->notify_msg.assign(notify.begin(), notify.end());
  {
    std::lock_guard lock(am_mu_);
    xfer->notify_stage = false;
  }
  xfer->held.store(true, std::memory_order_relaxed);
  xfer->peer = std::move(peer);
  xfer->result.store(UCS_INPROGRESS, std::memory_order_relaxed);
  return xfer;
}

// The end of a post: on success the core gets the handle; on failure the
// post already disposed of the transfer.
Status UcxLane::hand_out(Xfer* xfer, Status posted, XferHandle* out) {
  if (posted != Status::kSuccess) {
    xfer->held.store(false, std::memory_order_relaxed);
    return posted;
  }
  live_transfers_.fetch_add(1, std::memory_order_relaxed);
  *out = reinterpret_cast<XferHandle>(static_cast<LaneXfer*>(xfer));
  return Status::kSuccess;
}

Status UcxLane::post_write(PeerHandle handle, TransferId id, std::span<const std::int64_t> local,
                           std::span<const std::int64_t> remote, XferHandle* out,
                           std::span<const std::uint8_t> notify) {
  const std::shared_ptr<UcxPeer> peer = find_peer(handle);
  if (peer == nullptr) return Status::kNotFound;
  if (peer->failed()) return Status::kRemoteDisconnect;
  // A notification follows acked scatter messages; puts have no such path.
  if (!notify.empty() && !peer->scatter) return Status::kNotSupported;

  Xfer* xfer = start_xfer(peer, id, Xfer::Op::kWrite, notify);
  Status st = Status::kSuccess;
  // Scatter when puts are not an option (no RMA, or the peer published no
  // rkey); else when the runs are short enough that one message per run
  // would cost more than gathering them.
  bool scatter = peer->scatter && !peer->puts;
  if (peer->scatter && peer->puts) {
    std::size_t runs = 0;
    for_each_run(local, remote, [&](std::int64_t, std::int64_t, std::uint64_t) {
      ++runs;
      return true;
    });
    scatter = !notify.empty() ||
              (runs > 1 && local.size() * region_.block_len <= runs * settings_.scatter_max_run);
  }
  if (scatter) {
    st = post_scatter(*peer, local, remote, xfer);
  } else {
    st = post_puts(*peer, local, remote, xfer);
  }
  return hand_out(xfer, st, out);
}

void UcxLane::progress() {
  // Posts handed off: the progress thread alone drives the worker, and a
  // poll only reads the transfers' states (microseconds, never the worker's
  // lock).
  if (handoff_) return;
  // With the progress thread on, peers reached through UCX are what needs the
  // caller's help; with none, the thread has it covered.
  if (worker_.progress_thread_running() && live_peers_.load(std::memory_order_relaxed) == 0) {
    return;
  }
  worker_.progress_from_caller();
}

Status UcxLane::check(XferHandle handle, Status* state) {
  Xfer* xfer = from_handle(handle);
  if (!xfer->held.load(std::memory_order_relaxed)) return Status::kInvalidParam;
  const auto result = static_cast<ucs_status_t>(xfer->result.load(std::memory_order_acquire));
  if (result == UCS_OK) {
    *state = Status::kSuccess;
    return Status::kSuccess;
  }
  // A peer whose endpoint failed can no longer take the bytes: report that
  // as the check error, which is terminal for the core.
  const bool peer_failed = xfer->peer != nullptr && xfer->peer->failed();
  if (result == UCS_INPROGRESS) {
    if (peer_failed) {
      // Reported ended here, so a read takes no reply from now on (engine.h).
      if (xfer->op == Xfer::Op::kRead) fail_scatter(xfer, UCS_ERR_CONNECTION_RESET);
      return Status::kRemoteDisconnect;
    }
    *state = Status::kInProgress;
    return Status::kSuccess;
  }
  if (peer_failed || is_disconnect(result)) return Status::kRemoteDisconnect;
  *state = result == UCS_ERR_CANCELED ? Status::kCanceled : Status::kBackend;
  return Status::kSuccess;
}

Status UcxLane::release(XferHandle handle) {
  Xfer* xfer = from_handle(handle);
  if (!xfer->held.exchange(false, std::memory_order_relaxed)) return Status::kInvalidParam;
  live_transfers_.fetch_sub(1, std::memory_order_relaxed);
  // A read stops awaiting replies: one that comes later is dropped, so no
  // byte lands in our pool after this (engine.h). A write keeps going (its
  // bytes already left); a flush or acks still pending keep their reference
  // and return the handle.
  if (xfer->op == Xfer::Op::kRead) fail_scatter(xfer, UCS_ERR_CANCELED);
  unref(xfer);
  return Status::kSuccess;
}

const char* UcxLane::detail(XferHandle handle) const {
  const Xfer* xfer = from_handle(handle);
  if (!xfer->held.load(std::memory_order_relaxed)) return nullptr;
  const auto result = static_cast<ucs_status_t>(xfer->result.load(std::memory_order_acquire));
  if (result != UCS_OK && result != UCS_INPROGRESS) return ucs_status_string(result);
  if (xfer->peer != nullptr && xfer->peer->failed()) {
    const auto error = static_cast<ucs_status_t>(xfer->peer->error.load(std::memory_order_acquire));
    return ucs_status_string(error != UCS_OK ? error : UCS_ERR_CONNECTION_RESET);
  }
  return nullptr;
}

void UcxLane::add_live(HandleCounts& counts) const {
  counts.memory_registrations += memh_ ? 1 : 0;
  {
    std::lock_guard lock(peers_mu_);
    counts.peers += peers_.size();
  }
  counts.remote_keys += live_rkeys_.load(std::memory_order_relaxed);
  counts.transfers += live_transfers_.load(std::memory_order_relaxed);
  counts.requests += live_requests_.load(std::memory_order_relaxed);
}

void UcxLane::add_counters(std::map<std::string, std::uint64_t>& counters) const {
  const auto get = [](const std::atomic<std::uint64_t>& c) {
    return c.load(std::memory_order_relaxed);
  };
  counters["put_writes"] = get(put_writes_);
  counters["scatter_writes"] = get(scatter_writes_);
  counters["scatter_messages"] = get(scatter_messages_);
  counters["scatter_handed_off"] = get(scatter_handed_off_);
  counters["handed_off_as_pairs"] = get(handed_off_as_pairs_);
  counters["progress_wakes"] = get(wakes_);
  counters["progress_lingers"] = get(lingers_);
  counters["progress_linger_hits"] = get(linger_hits_);
  counters["scatter_refused"] = get(scatter_refused_);
  counters["scatter_received"] = get(scatter_received_);
  counters["scatter_rejected"] = get(scatter_rejected_);
  counters["scatter_fenced"] = get(scatter_fenced_);
  counters["fences_received"] = get(fences_received_);
  counters["fences_ignored"] = get(fences_ignored_);
  counters["scatter_acks_ignored"] = get(acks_ignored_);
  counters["gather_reads"] = get(gather_reads_);
  counters["gather_messages"] = get(gather_messages_);
  counters["gather_handed_off"] = get(gather_handed_off_);
  counters["gather_received"] = get(gather_received_);
  counters["gather_rejected"] = get(gather_rejected_);
  counters["gather_fenced"] = get(gather_fenced_);
  counters["gather_replies_ignored"] = get(gather_replies_ignored_);
  counters["notifications_sent"] = get(notifications_sent_);
  counters["notifications_received"] = get(notifications_received_);
  counters["notifications_refused"] = get(notifications_refused_);
}

// ---------------------------------------------------------------------------
// Shutdown
// ---------------------------------------------------------------------------

void UcxLane::drain_requests(const char* why) {
  const auto deadline = std::chrono::steady_clock::now() + kDrainTimeout;
  while (live_requests_.load(std::memory_order_relaxed) > 0 &&
         std::chrono::steady_clock::now() < deadline) {
    worker_.progress_once();
  }
  if (const auto left = live_requests_.load(std::memory_order_relaxed); left > 0) {
    log().warn(
        "kvxfer UCX {}: {} request(s) still pending {}; the worker's destruction cancels "
        "them",
        agent_name_, left, why);
  }
}

void UcxLane::stop() {
  accepting_writes_.store(false, std::memory_order_release);
  sending_.store(false, std::memory_order_release);
  worker_.stop_progress_thread();
  // Posts still queued are failed, not sent: the transport is closing.
  Xfer* head = nullptr;
  {
    std::lock_guard lock(submit_mu_);
    head = std::exchange(submit_head_, nullptr);
    submit_tail_ = nullptr;
  }
  while (head != nullptr) {
    Xfer* next = std::exchange(head->next_submit, nullptr);
    send_submitted(head);
    head = next;
  }
}

void UcxLane::release_pool() {
  if (!memh_) return;
  if (worker_.worker() != nullptr) drain_requests("at shutdown");
  if (const ucs_status_t st = memh_.reset(); st != UCS_OK) {
    log().error("kvxfer UCX {}: ucp_mem_unmap failed: {}", agent_name_, ucs_status_string(st));
  }
}

void UcxLane::destroy_worker() { worker_.destroy(); }

}  // namespace kvxfer::internal::ucx
