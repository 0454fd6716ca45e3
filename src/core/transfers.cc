// SPDX-License-Identifier: Apache-2.0
// Transfers: the in-flight table, write and read (the caller's indices
// copied once, the copy checked, then posted), poll (classify, then let PeerPolicy judge
// the peers) and cancel. write and poll are the hot path: nothing here
// allocates per block.
// May touch the engine interface and src/common/.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "common/log.h"
#include "core/pairs.h"
#include "core/transport_state.h"

namespace kvxfer::internal {
namespace {

// Records the duration of a sampled public call (started != 0), from
// `started` (the facade's entry) to its own destruction, however the call
// ends. Declared after the lock guard, so it records while the lock is
// still held (the histogram's writers are serialized by it).
class CallTimer {
 public:
  CallTimer(AtomicHistogram* histogram, Ticks started) : histogram_(histogram), started_(started) {}
  ~CallTimer() {
    if (histogram_ != nullptr && started_ != 0) {
      histogram_->record_serialized(ticks_to_ns(started_, ticks_now()));
    }
  }
  CallTimer(const CallTimer&) = delete;
  CallTimer& operator=(const CallTimer&) = delete;

 private:
  AtomicHistogram* const histogram_;
  const Ticks started_;
};

}  // namespace

void TransportState::link(Peer* peer, Inflight* e) {
  e->peer = peer;
  e->prev = peer->tail;
  e->next = nullptr;
  if (peer->tail != nullptr) {
    peer->tail->next = e;
  } else {
    peer->head = e;
  }
  peer->tail = e;
  ++peer->inflight;
}

void TransportState::unlink(Inflight* e) {
  Peer* peer = e->peer;
  (e->prev != nullptr ? e->prev->next : peer->head) = e->next;
  (e->next != nullptr ? e->next->prev : peer->tail) = e->prev;
  --peer->inflight;
}

// Releases the handle and forgets the transfer. The entry goes either way;
// a handle whose release failed is still live in the engine, so it is kept
// (and counted by stats().live) until close() tries it again.
void TransportState::release(Inflight* e) {
  if (const Status st = engine_->release(e->handle); st != Status::kSuccess) {
    log().warn("kvxfer {}: releasing transfer_id={} failed: {}; retried at close", agent_name_,
               e->id, status_name(st));
    unreleased_.push_back(e->handle);
  }
  unlink(e);
  inflight_.erase(e->id);
}

std::size_t TransportState::retry_unreleased() {
  // Caller holds mu_.
  std::erase_if(unreleased_, [this](XferHandle handle) {
    const Status st = engine_->release(handle);
    if (st != Status::kSuccess) {
      log().warn("kvxfer {}: releasing a transfer handle failed again: {}", agent_name_,
                 status_name(st));
    }
    return st == Status::kSuccess;
  });
  return unreleased_.size();
}

std::span<const std::uint8_t> TransportState::copy_notification(
    std::span<const std::uint8_t> message, bool required) {
  // Like the indices, the caller's bytes are read once, into a buffer that
  // keeps its capacity; the check and the engine see only the copy.
  scratch_notify_.assign(message.begin(), message.end());
  if (scratch_notify_.size() > kMaxNotificationBytes) {
    throw std::invalid_argument(fmt::format("a notification carries at most {} bytes; got {}",
                                            kMaxNotificationBytes, scratch_notify_.size()));
  }
  if (required && scratch_notify_.empty()) {
    throw std::invalid_argument("a notification needs at least one byte");
  }
  return scratch_notify_;
}

Peer* TransportState::find_peer_for(std::string_view peer_id, const char* call) {
  auto it = peers_.find(peer_id);
  if (it != peers_.end()) return it->second.get();
  warn_unknown_peer(peer_id, call);
  return nullptr;
}

void TransportState::warn_unknown_peer(std::string_view peer_id, const char* call) {
  std::vector<std::string_view> known;
  for (const auto& [id, p] : peers_) known.push_back(id);
  log().warn("kvxfer {}: {} to unknown peer={} (known peers: [{}])", agent_name_, call, peer_id,
             fmt::join(known, ", "));
}

template <typename Int>
std::optional<TransferId> TransportState::transfer(Op op, std::string_view peer_id,
                                                   std::span<const Int> local,
                                                   std::span<const Int> remote,
                                                   std::span<const std::uint8_t> notify,
                                                   Ticks started) {
  const char* const call = op == Op::kWrite ? "write_blocks" : "read_blocks";
  if (local.size() != remote.size()) {
    throw std::invalid_argument(fmt::format("local_idxs has {} entries but remote_idxs has {}",
                                            local.size(), remote.size()));
  }
  if (local.empty()) throw std::invalid_argument(fmt::format("{} needs at least one block", call));

  MutexLock lock(mu_);
  const CallTimer timer(op == Op::kWrite ? &write_blocks_duration_ : nullptr, started);
  // The caller's lists are read exactly once, here: another thread may be
  // changing them (a numpy array it writes to), and an index that changed
  // between our check and our post would aim the transfer outside a pool.
  // Every check below and the post read only this copy, which mu_ guards and
  // which keeps its capacity from call to call.
  // One pass over the caller's pairs copies them, checks both ranges and
  // cuts them into the runs every lane posts as they are; which check
  // failed is reported below in the order the arguments are judged.
  const auto found = peers_.find(peer_id);
  Peer* const peer = found != peers_.end() ? found->second.get() : nullptr;
  const PairsCopy pairs =
      copy_pairs(local, remote, region_.num_blocks,
                 peer != nullptr ? peer->num_blocks : ~std::uint64_t{0}, scratch_local_,
                 scratch_remote_, scratch_runs_);
  if (!pairs.local_ok) check_range(scratch_local_, region_.num_blocks, "local_idxs");
  const std::span<const std::uint8_t> message = copy_notification(notify, /*required=*/false);

  throw_if_closing();
  if (peer == nullptr) {
    warn_unknown_peer(peer_id, call);
    return std::nullopt;
  }
  if (!pairs.remote_ok) check_range(scratch_remote_, peer->num_blocks, "remote_idxs");
  if (peer->block_len != region_.block_len) {
    throw std::invalid_argument(fmt::format(
        "peer {}'s pool has blocks of {} bytes and ours of {}: {} moves whole blocks of one size "
        "(move bytes with descriptors instead: transfer())",
        peer->id, peer->block_len, region_.block_len, call));
  }

  // Two pairs landing in one block would race; refuse the transfer. The
  // blocks written are the peer's for a WRITE and ours for a READ. Runs in
  // ascending order name none twice (the common case, O(runs)); otherwise
  // the copy of that side is checked, naming the first repeat.
  const std::span<const BlockRun> runs(scratch_runs_.data(), pairs.runs);
  if (!runs_ascend(runs, /*remote=*/op == Op::kWrite)) {
    if (op == Op::kWrite) {
      check_no_duplicates(scratch_remote_, peer->num_blocks, scratch_seen_, "remote_idxs");
    } else {
      check_no_duplicates(scratch_local_, region_.num_blocks, scratch_seen_, "local_idxs");
    }
  }
  if (scratch_bytes_.size() < runs.size()) scratch_bytes_.resize(runs.size());
  block_runs_to_bytes(runs, region_.block_len, scratch_bytes_.data());
  return post(op, peer, std::span<const ByteRun>(scratch_bytes_.data(), runs.size()),
              scratch_local_.size() * region_.block_len, message, started);
}

std::optional<TransferId> TransportState::send_notification(std::string_view peer_id,
                                                            std::span<const std::uint8_t> message,
                                                            Ticks started) {
  MutexLock lock(mu_);
  const std::span<const std::uint8_t> copy = copy_notification(message, /*required=*/true);
  throw_if_closing();
  Peer* peer = find_peer_for(peer_id, "send_notification");
  if (peer == nullptr) return std::nullopt;
  return post(Op::kNotify, peer, {}, 0, copy, started);
}

std::map<std::string, std::vector<std::vector<std::uint8_t>>> TransportState::get_notifications() {
  std::vector<Notification> taken;
  {
    MutexLock lock(mu_);
    throw_if_closing();
    engine_->take_notifications(&taken);
  }
  std::map<std::string, std::vector<std::vector<std::uint8_t>>> out;
  for (Notification& n : taken) out[n.agent].push_back(std::move(n.bytes));
  return out;
}

std::optional<TransferId> TransportState::post(Op op, Peer* peer, std::span<const ByteRun> runs,
                                               std::uint64_t bytes,
                                               std::span<const std::uint8_t> notify,
                                               Ticks started, bool descs) {
  // Caller holds mu_.
  // Back-pressure, not a failure: no strike, nothing posted.
  if (peer->standing.fault || peer->inflight >= kMaxInflightPerPeer) {
    ++peer->counters.posts_refused;
    ++posts_refused_;
    if (peer->counters.posts_refused == 1 || peer->counters.posts_refused % 65536 == 0) {
      log().warn("kvxfer {}: refusing posts to peer={}: {} ({} refused so far)", agent_name_,
                 peer->id,
                 peer->standing.fault ? "it is faulted until it is removed"
                                      : "it has kMaxInflightPerPeer transfers in flight",
                 peer->counters.posts_refused);
    }
    return std::nullopt;
  }
  const TransferId id = next_id_;
  XferHandle handle = 0;
  const Status st = engine_->post(peer->handle, Post{op, id, runs, bytes, notify, /*pool_only=*/!descs}, &handle);
  if (st == Status::kNotPosted) {
    // The lane's own back-pressure (tcp: the bytes this peer's transfers
    // hold): as above, no strike.
    ++peer->counters.posts_refused;
    ++posts_refused_;
    return std::nullopt;
  }
  if (st != Status::kSuccess) {
    const char* const call = descs               ? "transfer"
                             : op == Op::kWrite  ? "write_blocks"
                             : op == Op::kRead ? "read_blocks"
                                               : "send_notification";
    log().warn("kvxfer {}: {} failed for peer={}: post {}", agent_name_, call, peer->id,
               status_name(st));
    ++peer->counters.post_failures;
    ++post_failures_;
    policy_.record_failure(peer->standing, peer->id, st, fmt::format("post {}", status_name(st)));
    return std::nullopt;
  }
  ++next_id_;
  auto [slot, inserted] = inflight_.try_emplace(id);
  Inflight& e = slot->second;
  e.id = id;
  e.handle = handle;
  e.op = op;
  e.bytes = bytes;
  e.descs = descs;
  e.timed = started != 0;
  e.started = started != 0 || !telemetry_ ? started : ticks_now();
  if (policy_.watches_stalls()) e.posted = coarse_now();
  link(peer, &e);
  return id;
}

void TransportState::count_finished(Inflight& e, bool done, Ticks& timed_now) {
  const auto op = static_cast<std::size_t>(e.op);
  OpCounters& peer_ops = e.peer->ops[op];
  if (done) {
    ++peer_ops.transfers_done;
    peer_ops.bytes_done += e.bytes;
    ++ops_[op].transfers_done;
    ops_[op].bytes_done += e.bytes;
    if (e.timed) {
      if (timed_now == 0) timed_now = ticks_now();
      latency_[op].record_serialized(ticks_to_ns(e.started, timed_now));
    }
  } else {
    ++peer_ops.transfers_failed;
    ++ops_[op].transfers_failed;
  }
  record_finished(e, done ? TransferResult::kDone : TransferResult::kFailed, timed_now);
}

void TransportState::record_into_ring(const Inflight& e, TransferResult result, Ticks& now) {
  if (now == 0) now = ticks_now();
  RingRecord& r = telemetry_->push();
  r.id = e.id;
  r.peer = e.peer->shared_id;
  r.op = e.op;
  // A transfer between descriptor lists moves no blocks (and a transport
  // with no pool has no block length to divide by).
  r.blocks = e.descs || region_.block_len == 0 ? 0 : e.bytes / region_.block_len;
  r.bytes = e.bytes;
  r.posted = e.started;
  r.completed = now;
  r.result = result;
  r.lane = e.peer->lane;
}

Telemetry TransportState::take_telemetry() {
  MutexLock lock(mu_);
  throw_if_closing();
  return telemetry_ ? telemetry_->take() : Telemetry{};
}

void TransportState::poll_peer(Peer* peer, PollResult& out,
                               std::chrono::steady_clock::time_point now, Ticks& timed_now) {
  // Caller holds mu_. Classify every transfer of this peer first; strikes
  // are applied once the batch is classified, because poll() sees
  // completions, not their order: a success anywhere in the batch is the
  // success "between" the peer's earlier failures.
  for (Inflight* e = peer->head; e != nullptr; e = e->next) {
    Status state = Status::kInProgress;
    const Status check = engine_->check(e->handle, &state);
    if (check != Status::kSuccess) {
      if (e->struck) {
        log().debug("kvxfer {}: state check failed for transfer_id={}: {}", agent_name_, e->id,
                    status_name(check));
      } else {
        log().warn("kvxfer {}: state check failed for transfer_id={}: {}", agent_name_, e->id,
                   status_name(check));
        policy_.record_check_failure(peer->standing, peer->id, check);
        e->struck = true;
      }
      // Kept unless the WRITE can no longer land: the peer is faulted now,
      // so its owner tears it down, which reclaims the transfer.
      if (!is_terminal_check_error(check)) continue;
      state = check;
    }
    if (state == Status::kSuccess) {
      out.done.push_back(e->id);
      peer->succeeded_in_batch = true;
      count_finished(*e, /*done=*/true, timed_now);
      scratch_finished_.push_back(e);
    } else if (state == Status::kInProgress) {
      // Stays, since it may still land; a stalled one faults its peer.
      policy_.check_stall(peer->standing, peer->id, e->id, e->posted, now);
    } else {
      out.failed.push_back(e->id);
      count_finished(*e, /*done=*/false, timed_now);
      if (!e->struck) scratch_failures_.emplace_back(peer, state, engine_->detail(e->handle));
      scratch_finished_.push_back(e);
    }
  }
}

void TransportState::drive_engine() {
  engine_drivers_.fetch_add(1);
  if (!engine_closing_.load()) engine_->progress();
  engine_drivers_.fetch_sub(1);
}

PollResult TransportState::poll(std::optional<std::string_view> peer_id, Ticks started) {
  PollResult out;
  // Always, even with nothing of ours in flight: without a progress thread
  // this call is all that drives the engine, and a target receives what
  // peers send only while its worker is progressed.
  drive_engine();
  MutexLock lock(mu_);
  const CallTimer timer(&poll_duration_, started);
  throw_if_closing();
  // First what registrations removed or replaced under this id left
  // settled (a scoped poll reports them even with no peer of that id now).
  if (!orphans_.empty()) take_orphans(peer_id, out);
  Peer* scoped = nullptr;
  if (peer_id) {
    auto it = peers_.find(*peer_id);
    if (it == peers_.end()) return out;
    scoped = it->second.get();
  }
  if (!inflight_.empty()) {
    scratch_failures_.clear();
    scratch_finished_.clear();
    // One clock for the batch: completions are seen, and stalls judged, as
    // of the call's start.
    const auto now =
        policy_.watches_stalls() ? coarse_now() : std::chrono::steady_clock::time_point{};
    Ticks timed_now = started;
    if (scoped != nullptr) {
      poll_peer(scoped, out, now, timed_now);
    } else {
      for (auto& [id, peer] : peers_) poll_peer(peer.get(), out, now, timed_now);
    }
    for (Inflight* e : scratch_finished_) {
      if (e->peer->succeeded_in_batch) {
        policy_.record_success(e->peer->standing);
        e->peer->succeeded_in_batch = false;
      }
    }
    for (const auto& [peer, status, detail] : scratch_failures_) {
      // The engine's detail (e.g. the UCX status) keeps the cause's reason.
      policy_.record_failure(peer->standing, peer->id, status,
                             detail != nullptr
                                 ? fmt::format("state {} ({})", status_name(status), detail)
                                 : fmt::format("state {}", status_name(status)));
    }
    for (Inflight* e : scratch_finished_) release(e);
  }
  if (scoped == nullptr) {
    std::sort(out.done.begin(), out.done.end());
    std::sort(out.failed.begin(), out.failed.end());
  }
  if (scoped != nullptr) out.peer_fault = scoped->standing.fault;
  return out;
}

std::vector<TransferId> TransportState::cancel(std::span<const TransferId> ids, CancelMode mode) {
  std::vector<TransferId> still;
  if (mode != CancelMode::kImmediate) drive_engine();
  MutexLock lock(mu_);
  throw_if_closing();
  if (mode == CancelMode::kImmediate) {
    // The engine keeps whatever a WRITE still in flight needs; forgetting it
    // here frees nothing it writes through. (A READ stops what has not
    // started: see Engine::post_read.)
    Ticks now = 0;
    for (const TransferId id : ids) {
      if (auto it = inflight_.find(id); it != inflight_.end()) {
        record_finished(it->second, TransferResult::kCancelled, now);
        release(&it->second);
      } else if (!orphans_.empty()) {
        forget_orphan(id);  // settled with its removed peer: not reported now
      }
    }
    return still;
  }
  Ticks now = 0;
  for (const TransferId id : ids) {
    auto it = inflight_.find(id);
    if (it == inflight_.end()) {
      // Settled with its removed peer: it can no longer land.
      if (!orphans_.empty()) forget_orphan(id);
      continue;
    }
    Inflight* e = &it->second;
    Status state = Status::kInProgress;
    const Status check = engine_->check(e->handle, &state);
    if (check != Status::kSuccess) {
      log().debug("kvxfer {}: cancel state check failed for transfer_id={}: {}", agent_name_, id,
                  status_name(check));
      policy_.record_check_failure(e->peer->standing, e->peer->id, check);
      e->struck = true;
      if (!is_terminal_check_error(check)) {
        still.push_back(id);
        continue;
      }
      // Terminal either way: drop it even if its handle cannot be released.
      record_finished(*e, TransferResult::kCancelled, now);
      release(e);
      continue;
    }
    // Releasing a transfer still in progress would not stop the WRITE: the
    // bytes keep landing. So it stays for a later poll to observe.
    if (state == Status::kInProgress) {
      still.push_back(id);
      continue;
    }
    if (const Status st = engine_->release(e->handle); st != Status::kSuccess) {
      log().debug("kvxfer {}: cancel pending for transfer_id={}: {}", agent_name_, id,
                  status_name(st));
      still.push_back(id);
      continue;
    }
    record_finished(*e, TransferResult::kCancelled, now);
    unlink(e);
    inflight_.erase(it);
  }
  return still;
}

template std::optional<TransferId> TransportState::transfer<std::int64_t>(
    Op op, std::string_view peer_id, std::span<const std::int64_t> local,
    std::span<const std::int64_t> remote, std::span<const std::uint8_t> notify, Ticks started);
template std::optional<TransferId> TransportState::transfer<std::int32_t>(
    Op op, std::string_view peer_id, std::span<const std::int32_t> local,
    std::span<const std::int32_t> remote, std::span<const std::uint8_t> notify, Ticks started);

}  // namespace kvxfer::internal
