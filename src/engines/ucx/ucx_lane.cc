// SPDX-License-Identifier: Apache-2.0
// The UCX lane's calls (ucx_lane.h): connect, disconnect, post, check, release,
// counts and stop; on the driver's side, endpoints opened and closed and each
// transfer's puts or gets and flush. Its messages are ucx_messages.cc's.
#include "engines/ucx/ucx_lane.h"

#include <fmt/format.h>

#include <chrono>
#include <stdexcept>
#include <utility>

#include "common/log.h"
#include "common/random.h"
#include "engines/ucx/ucx_compat.h"
#include "wire/fence.h"

namespace kvxfer::internal::ucx {
namespace {

using Clock = std::chrono::steady_clock;

// How long disconnect() and shutdown wait for UCX to end a close or drain.
constexpr auto kCloseTimeout = std::chrono::seconds(10);

// Statuses that say the peer's endpoint is gone: nothing more can land.
bool is_disconnect(ucs_status_t status) {
  return status == UCS_ERR_CONNECTION_RESET || status == UCS_ERR_ENDPOINT_TIMEOUT ||
         status == UCS_ERR_UNREACHABLE || status == UCS_ERR_REJECTED;
}

}  // namespace

UcxLane::UcxLane(std::string agent_name, const Region& region, const Options& options,
                 std::uint64_t token, const UcxSettings& settings, bool has_rdma,
                 bool tcp_lane_here)
    : agent_name_(std::move(agent_name)),
      region_(region),
      token_(token),
      threaded_(options.progress_thread),
      has_rdma_(has_rdma),
      tcp_lane_here_(tcp_lane_here),
      driver_(agent_name_, settings.overrides) {
  driver_.set_am_handler(wire::kFenceAmId, &UcxLane::on_fence, this);
  driver_.set_am_handler(wire::kNotifyAmId, &UcxLane::on_note, this);
  driver_.set_am_handler(wire::kNotifyAckAmId, &UcxLane::on_ack, this);
  // Without a pool (a transport of regions alone) the lane publishes no
  // pool rkey; its regions' keys come with add_region.
  if (region_.num_blocks == 0) {
    if (threaded_) driver_.start_thread();
    return;
  }
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = region_.base;
  params.length = pool_len();
  ucs_status_t st = ucp_mem_map(driver_.context(), &params, &memh_);
  void* rkey = nullptr;
  std::size_t rkey_len = 0;
  if (st != UCS_OK ||
      (st = ucx_compat::pack_rkey(driver_.context(), memh_, &rkey, &rkey_len)) != UCS_OK) {
    throw std::runtime_error(
        fmt::format("kvxfer ucx: registering the pool failed: {}", ucs_status_string(st)));
  }
  packed_rkey_.assign(static_cast<std::uint8_t*>(rkey),
                      static_cast<std::uint8_t*>(rkey) + rkey_len);
  ucx_compat::release_packed_rkey(rkey);
  if (threaded_) driver_.start_thread();
}

UcxLane::~UcxLane() {
  stop_accepting();
  release_pool();
  driver_.destroy();
}

bool UcxLane::qualifies(const RemoteRegion& remote, const wire::PeerBlob& blob) const {
  const bool both_rdma = has_rdma_ && (blob.flags & wire::kBlobHasRdma) != 0;
  const bool tcp_serves = tcp_lane_here_ && blob.tcp_port != 0;
  // A peer with a pool publishes its key; its regions' keys are matched at
  // connect, which refuses a peer whose metadata and keys disagree.
  return !blob.worker_address.empty() && (remote.num_blocks == 0 || !blob.rkey.empty()) &&
         (both_rdma || !tcp_serves);
}

struct UcxLane::ConnectJob {
  std::shared_ptr<Endpoint> ep;
  const wire::PeerBlob* blob = nullptr;
  std::vector<std::span<const std::uint8_t>> packed;  // each region's rkey, into the blob
  Status status = Status::kSuccess;
  std::string reason;
  bool done = false;  // under the driver's lock
};

Status UcxLane::connect(const wire::PeerBlob& blob, const RemoteRegion& remote, Connected* out) {
  ConnectJob job;
  job.blob = &blob;
  std::vector<PeerRegion> regions;
  if (blob.worker_address.empty()) {
    job.status = Status::kNotSupported;
    job.reason = fmt::format(
        "peer {} has no UCX lane (no worker address in its metadata): it has no RDMA "
        "device, or KVXFER_RMA=off",
        remote.agent_name);
  } else if ((job.status = match_regions(blob, remote, &regions, &job.packed, &job.reason)) ==
             Status::kSuccess) {
    job.ep =
        std::make_shared<Endpoint>(this, remote.agent_name, std::move(regions), blob.cookie_epoch);
    driver_.submit({&UcxLane::run_connect, &job});
    static_cast<void>(driver_.wait([&] { return job.done; }, Clock::time_point::max()));
  }
  if (job.status != Status::kSuccess) {
    out->reason = std::move(job.reason);
    return job.status;
  }
  live_peers_.fetch_add(1, std::memory_order_relaxed);
  live_rkeys_.fetch_add(job.packed.size(), std::memory_order_relaxed);
  out->peer = job.ep.get();
  MutexLock lock(mu_);
  peers_.emplace(job.ep.get(), std::move(job.ep));
  return Status::kSuccess;
}

void UcxLane::run_connect(void* arg) {
  auto& job = *static_cast<ConnectJob*>(arg);
  Endpoint& ep = *job.ep;
  UcxLane& lane = *ep.owner;
  lane.driver_.check_turn();
  const auto end = [&](Status st, std::string why) {
    job.status = st;
    job.reason = std::move(why);
    lane.driver_.finish([&] { job.done = true; });
  };
  const auto abandon = [&]() REQUIRES(lane.driver_.turn()) {
    ep.keep = job.ep;
    if (!ep.close(&UcxLane::on_closed, &ep)) lane.end_close(ep);
  };
  const char* what = "";
  const ucs_status_t st = ep.open(lane.driver_.worker(), job.blob->worker_address, job.packed,
                                  &UcxLane::on_ep_error, &ep, &what);
  if (st != UCS_OK) {
    abandon();
    return end(st == UCS_ERR_UNREACHABLE ? Status::kNotSupported : Status::kInvalidParam,
               fmt::format("peer {}: {} failed: {} (UCX must reach it over an RDMA transport, "
                           "or tcp with KVXFER_RMA=on)",
                           ep.agent_name, what, ucs_status_string(st)));
  }
  // The fence goes first on the endpoint, before any notification.
  const Lineages::Registration registration = lane.lineages_.next(ep.agent_name, ep.token);
  ep.lineage = registration.lineage;
  ep.gen = registration.gen;
  ep.epoch = registration.epoch;
  const ucs_status_t sent = lane.send_fence(ep);
  const ucs_status_t failed = sent != UCS_OK ? sent : ep.error();
  if (failed == UCS_OK && ep.connected()) return end(Status::kSuccess, {});
  abandon();
  end(is_disconnect(failed) ? Status::kRemoteDisconnect : Status::kBackend,
      fmt::format("peer {}: sending the fence failed: {}", ep.agent_name,
                  ucs_status_string(failed)));
}

Status UcxLane::disconnect(LanePeer* handle) {
  std::shared_ptr<Endpoint> ep;
  {
    MutexLock lock(mu_);
    const auto it = peers_.find(handle);
    if (it == peers_.end()) return Status::kNotFound;
    ep = std::move(it->second);
    peers_.erase(it);
  }
  live_peers_.fetch_sub(1, std::memory_order_relaxed);
  live_rkeys_.fetch_sub(ep->regions.size(), std::memory_order_relaxed);
  ep->keep = ep;  // the driver's until the close ends
  driver_.submit({&UcxLane::run_close, ep.get()});
  if (driver_.wait([&] { return ep->close_done; }, Clock::now() + kCloseTimeout)) {
    return Status::kSuccess;
  }
  log().error("kvxfer ucx {}: closing the endpoint to peer {} did not end in {} s", agent_name_,
              ep->agent_name, kCloseTimeout.count());
  return Status::kBackend;
}

void UcxLane::run_close(void* arg) {
  auto& ep = *static_cast<Endpoint*>(arg);
  ep.owner->driver_.check_turn();
  // Acks will not come; the forced close ends the endpoint's flushes and
  // sends with UCS_ERR_CANCELED.
  ep.owner->fail_awaiting(ep, UCS_ERR_CANCELED);
  if (!ep.close(&UcxLane::on_closed, &ep)) ep.owner->end_close(ep);
}

void UcxLane::on_closed(void* request, ucs_status_t /*status*/, void* arg) {
  auto& ep = *static_cast<Endpoint*>(arg);
  ep.owner->driver_.check_turn();
  ucp_request_free(request);
  ep.owner->end_close(ep);
}

void UcxLane::end_close(Endpoint& ep) {
  ep.closed();
  driver_.finish([&] { ep.close_done = true; });
  const std::shared_ptr<Endpoint> last = std::move(ep.keep);  // may be the last reference
}

void UcxLane::on_ep_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto& ep = *static_cast<Endpoint*>(arg);
  ep.owner->driver_.check_turn();
  if (!ep.fail(status)) return;
  log().warn("kvxfer ucx {}: endpoint to peer {} failed: {}", ep.owner->agent_name_, ep.agent_name,
             ucs_status_string(status));
  // Its flushes end with the error (peer-failure mode); acks will not come.
  ep.owner->fail_awaiting(ep, status);
}

Status UcxLane::post(LanePeer* handle, const Post& post, XferHandle* out) {
  // The core posts only to peers it connected and has not disconnected.
  auto* const ep = static_cast<Endpoint*>(handle);
  if (ep->error() != UCS_OK) return Status::kRemoteDisconnect;
  Xfer* x = nullptr;
  {
    MutexLock lock(mu_);
    if (free_xfers_.empty()) {
      x = &xfers_.emplace_back(this);
      x->slot = static_cast<std::uint32_t>(xfers_.size() - 1);
    } else {
      x = free_xfers_.back();
      free_xfers_.pop_back();
    }
  }
  // Descriptor runs are checked against the peer's regions and ours, and
  // ours held; block runs (write_blocks, read_blocks) are the pools' alone,
  // which the core checked against both geometries.
  x->descs = !post.pool_only;
  const Status checked = x->descs
                             ? hold_runs(*ep, post, x)
                             : (post.runs.empty() || (ep->has_pool() && region_.num_blocks != 0)
                                    ? Status::kSuccess
                                    : Status::kInvalidParam);
  if (checked != Status::kSuccess) {
    MutexLock lock(mu_);
    free_xfers_.push_back(x);
    return checked;
  }
  x->ep = ep->shared_from_this();
  x->id = post.id;
  x->op = post.op;
  x->runs.assign(post.runs.begin(), post.runs.end());
  x->run_count = post.runs.size();
  x->note.assign(post.note.begin(), post.note.end());
  x->sequence = fresh_random();
  x->result.store(UCS_INPROGRESS, std::memory_order_relaxed);
  x->held.store(true, std::memory_order_relaxed);
  x->refs.store(2, std::memory_order_relaxed);  // the core's and the driver's
  live_transfers_.fetch_add(1, std::memory_order_relaxed);
  if (post.op != Op::kNotify) count(post.op == Op::kRead ? kReads : kWrites);
  *out = handle_of(static_cast<LaneXfer*>(x));
  driver_.submit({&UcxLane::run_post, x});
  return Status::kSuccess;
}

void UcxLane::unref(Xfer* x) {
  if (x->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  x->ep.reset();
  MutexLock lock(mu_);
  free_xfers_.push_back(x);
}

void UcxLane::progress() {
  if (!threaded_) static_cast<void>(driver_.drive(std::chrono::milliseconds(1)));
}

Status UcxLane::check(XferHandle handle, Status* state) {
  const Xfer* x = from_handle(handle);
  if (!x->held.load(std::memory_order_relaxed)) return Status::kInvalidParam;
  const auto result = static_cast<ucs_status_t>(x->result.load(std::memory_order_acquire));
  const bool peer_failed = x->ep->error() != UCS_OK;
  if (result == UCS_INPROGRESS) {
    // A read ends only when its gets did (no byte lands after its end is
    // reported); a write to a failed peer can land no more.
    if (peer_failed && x->op != Op::kRead) return Status::kRemoteDisconnect;
    *state = Status::kInProgress;
  } else if (result == UCS_OK) {
    *state = Status::kSuccess;
  } else if (peer_failed || is_disconnect(result)) {
    return Status::kRemoteDisconnect;
  } else {
    *state = result == UCS_ERR_CANCELED ? Status::kCanceled : Status::kBackend;
  }
  return Status::kSuccess;
}

Status UcxLane::release(XferHandle handle) {
  Xfer* x = from_handle(handle);
  if (!x->held.exchange(false, std::memory_order_acq_rel)) return Status::kInvalidParam;
  live_transfers_.fetch_sub(1, std::memory_order_relaxed);
  unref(x);
  return Status::kSuccess;
}

const char* UcxLane::detail(XferHandle handle) const {
  const Xfer* x = from_handle(handle);
  if (!x->held.load(std::memory_order_relaxed)) return nullptr;
  const auto result = static_cast<ucs_status_t>(x->result.load(std::memory_order_acquire));
  if (result != UCS_OK && result != UCS_INPROGRESS) return ucs_status_string(result);
  return x->ep->error() != UCS_OK ? ucs_status_string(x->ep->error()) : nullptr;
}

void UcxLane::take_notifications(std::vector<Notification>* out) {
  inbox_.take(out, [](const Notification&, std::uint64_t) { return true; });
}

void UcxLane::run_post(void* arg) {
  auto* x = static_cast<Xfer*>(arg);
  UcxLane& lane = *x->owner;
  Endpoint& ep = *x->ep;
  lane.driver_.check_turn();
  if (x->slot >= lane.slots_.size()) lane.slots_.resize(x->slot + 1, nullptr);
  lane.slots_[x->slot] = x;
  x->error = UCS_OK;
  x->ended = false;
  x->sending = false;
  x->await_index = kNotAwaiting;
  // A read released before it started reads nothing (engine.h).
  if (x->op == Op::kRead && !x->held.load(std::memory_order_acquire)) {
    return lane.complete(x, UCS_ERR_CANCELED);
  }
  if (!ep.usable()) return lane.complete(x, ep.error() != UCS_OK ? ep.error() : UCS_ERR_CANCELED);
  // One whose region of ours is being removed moves nothing (queued, so no
  // byte of it moved yet).
  if (lane.holds_removed(x)) return lane.complete(x, UCS_ERR_CANCELED);
  // No callback per put or get: the flush after them covers each. A
  // notification alone flushes too, so it goes after every earlier one.
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FLAG_MULTI_SEND;
  param.memh = lane.memh_;
  auto* const base = static_cast<std::uint8_t*>(lane.region_.base);
  for (std::size_t i = 0; i < x->run_count; ++i) {
    const ByteRun& run = x->runs[i];
    // Block runs: pool to pool. Descriptor runs: where hold_runs() found
    // them, in the region of the peer's they name.
    std::uint8_t* local = nullptr;
    std::size_t r = 0;
    if (x->descs) {
      local = x->local_at[i].addr;
      param.memh = x->local_at[i].memh != nullptr ? x->local_at[i].memh : lane.memh_;
      r = run.remote_region;
    } else {
      local = base + run.local;
    }
    const std::uint64_t remote = ep.regions[r].base + run.remote;
    ucp_rkey_h rkey = ep.rkeys[r].get();
    const ucs_status_ptr_t request = x->op == Op::kWrite
                                         ? ucp_put_nbx(ep.ep, local, run.len, remote, rkey, &param)
                                         : ucp_get_nbx(ep.ep, local, run.len, remote, rkey, &param);
    if (UCS_PTR_IS_ERR(request)) {
      x->error = UCS_PTR_STATUS(request);
      log().warn("kvxfer ucx {}: a {} of transfer {} to peer {} failed: {}", lane.agent_name_,
                 x->op == Op::kWrite ? "put" : "get", x->id, ep.agent_name,
                 ucs_status_string(x->error));
      break;  // the flush still covers what was posted
    }
    if (request != nullptr) ucp_request_free(request);
  }
  lane.count(x->op == Op::kWrite ? kPuts : kGets, x->run_count);
  ucp_request_param_t flush{};
  flush.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  flush.cb.send = &UcxLane::on_flush;
  flush.user_data = x;
  const ucs_status_ptr_t request = ucp_ep_flush_nbx(ep.ep, &flush);
  if (!UCS_PTR_IS_PTR(request)) return on_flush(nullptr, UCS_PTR_STATUS(request), x);
  lane.live_requests_.fetch_add(1, std::memory_order_relaxed);
}

void UcxLane::on_flush(void* request, ucs_status_t status, void* arg) {
  auto* x = static_cast<Xfer*>(arg);
  UcxLane& lane = *x->owner;
  lane.driver_.check_turn();
  if (request != nullptr) {
    ucp_request_free(request);
    lane.live_requests_.fetch_sub(1, std::memory_order_relaxed);
  }
  if (x->error != UCS_OK) status = x->error;
  // Its puts and gets ended: the regions of ours it named may go.
  lane.let_go(x);
  if (is_disconnect(status) && x->ep->fail(status)) lane.fail_awaiting(*x->ep, status);
  // The bytes are in place: now the notification, unless the transfer was
  // released meanwhile (engine.h: it then delivers nothing).
  if (status != UCS_OK || x->note.empty() || !x->held.load(std::memory_order_acquire)) {
    return lane.complete(x, status);
  }
  lane.send_note(x);
}

// Ends a transfer: its result, then (once UCX holds none of its buffers)
// the driver's reference.
void UcxLane::complete(Xfer* x, ucs_status_t status) {
  if (x->ended) return;
  x->ended = true;
  let_go(x);
  if (x->await_index != kNotAwaiting) {
    auto& awaiting = x->ep->awaiting;
    const std::uint32_t moved = awaiting.back();
    awaiting[x->await_index] = moved;
    slots_[moved]->await_index = x->await_index;
    awaiting.pop_back();
    x->await_index = kNotAwaiting;
  }
  x->result.store(status, std::memory_order_release);
  if (!x->sending) unref(x);
}

void UcxLane::fail_awaiting(Endpoint& ep, ucs_status_t status) {
  while (!ep.awaiting.empty()) complete(slots_[ep.awaiting.back()], status);
}

void UcxLane::add_live(HandleCounts& counts) const {
  counts.memory_registrations +=
      (memh_ != nullptr ? 1 : 0) + live_regions_.load(std::memory_order_relaxed);
  {
    MutexLock lock(mu_);
    counts.peers += peers_.size();
  }
  counts.remote_keys += live_rkeys_.load(std::memory_order_relaxed);
  counts.transfers += live_transfers_.load(std::memory_order_relaxed);
  counts.requests += live_requests_.load(std::memory_order_relaxed);
}

void UcxLane::add_counters(std::map<std::string, std::uint64_t>& counters) const {
  // clang-format off
  static constexpr const char* kNames[kCounters] = {
      "ucx_writes", "ucx_reads", "ucx_puts", "ucx_gets", "ucx_notifications_sent",
      "ucx_notifications_received", "ucx_notifications_refused", "ucx_fences_received",
      "ucx_fences_refused", "ucx_acks_ignored", "ucx_refused_runs"};
  // clang-format on
  for (int i = 0; i < kCounters; ++i) counters[kNames[i]] = counts_[i].load();
  counters["ucx_progress_wakes"] = driver_.wakes();
  counters["ucx_driver_overlaps"] = driver_.overlaps();
}

void UcxLane::stop(StopStage stage) {
  switch (stage) {
    case StopStage::kRefuse:
      return stop_accepting();
    case StopStage::kDisconnect:
      return disconnect_left();
    case StopStage::kQuiesce:
      return release_pool();
    case StopStage::kRelease:
      return driver_.destroy();
  }
}

void UcxLane::stop_accepting() {
  accepting_.store(false, std::memory_order_release);
  driver_.stop_thread();
}

void UcxLane::disconnect_left() {
  std::vector<LanePeer*> left;
  {
    MutexLock lock(mu_);
    for (const auto& [handle, ep] : peers_) left.push_back(handle);
  }
  disconnect_all(left, agent_name_);
}

void UcxLane::run_unmap(void* arg) {
  auto& lane = *static_cast<UcxLane*>(arg);
  lane.driver_.check_turn();
  // The pool, and the regions the core left registered (or whose removal
  // gave up waiting).
  std::vector<ucp_mem_h> memhs;
  if (lane.memh_ != nullptr) memhs.push_back(lane.memh_);
  {
    MutexLock lock(lane.regions_mu_);
    for (OwnRegion& r : lane.regions_) {
      if (r.memh != nullptr) memhs.push_back(std::exchange(r.memh, nullptr));
      r.live = false;
    }
  }
  for (ucp_mem_h memh : memhs) {
    if (const ucs_status_t st = ucp_mem_unmap(lane.driver_.context(), memh); st != UCS_OK) {
      log().error("kvxfer ucx {}: ucp_mem_unmap failed: {}", lane.agent_name_,
                  ucs_status_string(st));
    }
  }
  lane.live_regions_.store(0, std::memory_order_relaxed);
  lane.driver_.finish([&] {
    lane.memh_ = nullptr;
    lane.unmapped_ = true;
  });
}

void UcxLane::release_pool() {
  if (unmapped_ || !driver_.has_worker()) return;
  // The last sends and acks end first (bounded).
  if (!driver_.wait([&] { return live_requests_.load(std::memory_order_relaxed) == 0; },
                    Clock::now() + kCloseTimeout)) {
    log().warn(
        "kvxfer ucx {}: {} request(s) still pending at shutdown; the worker's "
        "destruction cancels them",
        agent_name_, live_requests_.load(std::memory_order_relaxed));
  }
  driver_.submit({&UcxLane::run_unmap, this});
  static_cast<void>(driver_.wait([&] { return unmapped_; }, Clock::time_point::max()));
}

}  // namespace kvxfer::internal::ucx
