// SPDX-License-Identifier: Apache-2.0
// The same-host lane's copies (cma_lane.h): copier threads, and callers of
// progress() a slice at a time, claim chunks of queued transfers and copy them
// between cookie reads. Touches the copy queue (copy_mu_) and what it holds.
#include "engines/cma/cma_lane.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/log.h"
#include "common/sanitizers.h"

namespace kvxfer::internal::cma {
namespace {

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void CmaLane::start_copiers() {
  MutexLock lock(copy_mu_);
  if (!copiers_.empty() || copiers_stop_) return;
  for (int i = 0; i < num_copiers_; ++i) copiers_.emplace_back([this] { copier_loop(); });
}

void CmaLane::stop_copiers() {
  std::vector<std::thread> copiers;
  {
    MutexLock lock(copy_mu_);
    copiers_stop_ = true;
    copiers.swap(copiers_);
  }
  copy_cv_.notify_all();
  for (auto& t : copiers) t.join();
}

void CmaLane::copier_loop() {
  // Lowering one's own thread's priority needs no privilege; failing to is
  // harmless (the copiers then only compete as before).
  static_cast<void>(::pthread_setname_np(::pthread_self(), "kvxfer-copy"));
  static_cast<void>(
      ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), CopyPolicy::kCopierNice));
  MutexLock lock(copy_mu_);
  for (;;) {
    while (copy_head_ == nullptr && !copiers_stop_) lock.wait(copy_cv_);
    if (copy_head_ == nullptr) return;  // stopping, and nothing left to finish
    run_chunk(/*caller=*/false);
  }
}

void CmaLane::progress() {
  // A caller of poll() copies one slice of what is queued, whether it spins
  // or comes back between steps: on a host without a spare core its thread
  // holds a core the copiers would use, and the slice is bounded, so that
  // the poll returns in microseconds (CopyPolicy).
  if (caller_slice_bytes_ == 0 || !copies_queued_.load(std::memory_order_relaxed)) return;
  MutexLock lock(copy_mu_);
  if (copy_head_ == nullptr) return;
  const std::uint64_t bytes = run_chunk(/*caller=*/true);
  lock.unlock();
  caller_slices_.fetch_add(1, std::memory_order_relaxed);
  std::uint64_t max = caller_slice_max_bytes_.load(std::memory_order_relaxed);
  while (bytes > max &&
         !caller_slice_max_bytes_.compare_exchange_weak(max, bytes, std::memory_order_relaxed)) {
  }
}

// A copier's claim: iovecs from the front, at most kChunkBytes (but one at
// least) and kMaxIov of them.
void CmaLane::claim_front(Xfer& xfer, Claim* claim) {
  const std::size_t begin = xfer.next_iov;
  std::size_t end = begin;
  for (; end < xfer.end_iov && end - begin < kMaxIov; ++end) {
    const std::size_t len = xfer.local_iov[end].iov_len;
    if (end > begin && claim->bytes + len > kChunkBytes) break;
    claim->bytes += len;
  }
  xfer.next_iov = end;
  claim->first = begin;
  claim->local = std::span(xfer.local_iov).subspan(begin, end - begin);
  claim->remote = std::span(xfer.remote_iov).subspan(begin, end - begin);
}

// A caller's claim: whole iovecs from the back while they fit in
// `max_bytes`, or else the last `max_bytes` of the last iovec, which then
// stays unclaimed, shorter.
void CmaLane::claim_back(Xfer& xfer, std::size_t max_bytes, Claim* claim) {
  const std::size_t end = xfer.end_iov;
  if (end == xfer.next_iov) return;  // no iovecs (a notification alone)
  iovec& last_local = xfer.local_iov[end - 1];
  iovec& last_remote = xfer.remote_iov[end - 1];
  if (last_local.iov_len > max_bytes) {
    last_local.iov_len -= max_bytes;
    last_remote.iov_len -= max_bytes;
    claim->local_tail = {static_cast<std::uint8_t*>(last_local.iov_base) + last_local.iov_len,
                         max_bytes};
    claim->remote_tail = {static_cast<std::uint8_t*>(last_remote.iov_base) + last_remote.iov_len,
                          max_bytes};
    claim->local = std::span(&claim->local_tail, 1);
    claim->remote = std::span(&claim->remote_tail, 1);
    claim->bytes = max_bytes;
    claim->first = end - 1;
    return;
  }
  std::size_t begin = end;
  for (; begin > xfer.next_iov && end - begin < kMaxIov; --begin) {
    const std::size_t len = xfer.local_iov[begin - 1].iov_len;
    if (begin < end && claim->bytes + len > max_bytes) break;
    claim->bytes += len;
  }
  xfer.end_iov = begin;
  claim->first = begin;
  claim->local = std::span(xfer.local_iov).subspan(begin, end - begin);
  claim->remote = std::span(xfer.remote_iov).subspan(begin, end - begin);
}

// Claims a chunk of the transfer at the head of the queue and copies it;
// whoever finishes a transfer's last chunk completes the transfer. Called,
// and returns, with copy_mu_ held; copy_head_ is set. Returns the bytes
// claimed.
std::size_t CmaLane::run_chunk(bool caller) {
  Claim claim;
  bool cancelled = false;
  Xfer* xfer = claim_chunk(caller, &claim, &cancelled);
  Peer& peer = *xfer->peer;
  copy_mu_.unlock();
  const Status result = cancelled ? Status::kCanceled : run_copy(*xfer, &claim, caller);
  copy_mu_.lock();
  ours(*xfer);
  drop_slots(*xfer, claim);
  Status final_result = Status::kSuccess;
  if (!end_chunk(*xfer, result, &final_result)) return claim.bytes;  // its other chunks finish it
  copy_mu_.unlock();
  // Every chunk landed: the cookie (and the regions named) must still read
  // back (run_copy of no claim).
  if (final_result == Status::kSuccess) final_result = run_copy(*xfer, nullptr);
  // Then, and only then, the notification; not for a transfer the core let
  // go of before its bytes were in place.
  if (final_result == Status::kSuccess && !xfer->notify.empty() &&
      xfer->held.load(std::memory_order_relaxed)) {
    final_result = send_notification(peer, *xfer);
  }
  xfer->result.store(final_result, std::memory_order_release);
  live_requests_.fetch_sub(1, std::memory_order_relaxed);
  copy_mu_.lock();
  ours(peer);
  if (--peer.copies == 0) copy_done_cv_.notify_all();
  copy_mu_.unlock();
  unref(xfer);
  copy_mu_.lock();
  return claim.bytes;
}

CmaLane::Xfer* CmaLane::claim_chunk(bool caller, Claim* claim, bool* cancelled) {
  Xfer* xfer = copy_head_;
  ours(*xfer);
  const Peer& peer = *xfer->peer;
  ours(peer);
  if (caller) {
    claim_back(*xfer, caller_slice_bytes_, claim);
  } else {
    claim_front(*xfer, claim);
  }
  if (xfer->next_iov == xfer->end_iov) {  // fully claimed: the next transfer is up
    copy_head_ = xfer->next_copy;
    if (copy_head_ == nullptr) {
      copy_tail_ = nullptr;
      copies_queued_.store(false, std::memory_order_relaxed);
    }
  }
  ++xfer->running;
  // A read the core let go of stops here: what it has not copied yet never
  // reaches our pool (a write's chunks go on, as a real WRITE would).
  *cancelled = peer.disconnected || copiers_stop_ || xfer->chunk_error != Status::kSuccess ||
               (xfer->read && !xfer->held.load(std::memory_order_relaxed));
  // A chunk from or into a region of ours that remove_region took away is
  // dropped; otherwise the region stays until the chunk ends.
  if (!*cancelled && !hold_slots(*xfer, *claim)) *cancelled = true;
  if (copy_head_ != nullptr) copy_cv_.notify_one();  // more to claim: another copier may help
  return xfer;
}

bool CmaLane::end_chunk(Xfer& xfer, Status result, Status* final_result) {
  ours(xfer);
  if (result != Status::kSuccess && xfer.chunk_error == Status::kSuccess) {
    xfer.chunk_error = result;
  }
  if (--xfer.running > 0 || xfer.next_iov < xfer.end_iov) return false;
  *final_result = xfer.chunk_error;
  return true;
}

// Copies a claim of a transfer after reading the peer's cookie; with none,
// only reads the cookie. A transfer's cookie is read before each chunk, so a
// reused pid is never written, and once after its last chunk, so a peer that
// died or shut its engine down during the copy does not count it as landed.
// (Into a mapped pool whose cookie page is mapped too, the check before a
// chunk is a load from that page; a `caller` slice skips the check when some
// copy read the cookie back within CopyPolicy::kCookieFresh; the read after
// the last chunk always goes through the pid.) A transfer that names regions
// reads their table entries' seq words with the epoch every time (no
// shortcut), so a region the target withdrew fails the transfer (kMismatch)
// at the next chunk or at the end. Returns kSuccess, kRemoteDisconnect (the
// peer is gone), kMismatch, kBackend (an I/O error) or kCanceled.
Status CmaLane::run_copy(Xfer& xfer, const Claim* claim, bool caller) {
  Peer& peer = *xfer.peer;
  if (peer.gone.load(std::memory_order_acquire)) return Status::kRemoteDisconnect;
  const std::span<iovec> local = claim != nullptr ? claim->local : std::span<iovec>{};
  const std::span<iovec> remote = claim != nullptr ? claim->remote : std::span<iovec>{};
  int err = 0;
  Status st = Status::kSuccess;
  constexpr std::int64_t kFreshNs =
      std::chrono::duration_cast<std::chrono::nanoseconds>(CopyPolicy::kCookieFresh).count();
  // The target's slots a chunk into regions marks while it copies (cma_fence.h).
  std::uint32_t marked[kMaxIov];
  std::uint64_t marked_seqs[kMaxIov];
  std::size_t num_marked = 0;
  if (!xfer.remote_index.empty()) {
    const std::span<const std::uint32_t> named =
        claim != nullptr
            ? std::span<const std::uint32_t>(xfer.remote_index).subspan(claim->first, local.size())
            : std::span<const std::uint32_t>(xfer.remote_index);
    if (claim != nullptr) num_marked = fenced_slots(peer, named, marked, marked_seqs);
    if (num_marked > 0 &&
        !peer.fence.mark(std::span(marked, num_marked), std::span(marked_seqs, num_marked))) {
      num_marked = 0;
      st = Status::kMismatch;
    } else {
      st = check_peer(peer, named, &err);
    }
  } else if (!local.empty() && caller &&
             steady_ns() - peer.cookie_ok_ns.load(std::memory_order_relaxed) < kFreshNs) {
    // A caller's slice right after another copy's check: the cookie read
    // back moments ago (CopyPolicy::kCookieFresh).
  } else if (!local.empty() && xfer.mapped && peer.mapping.cookie_mapped()) {
    // Before a chunk into a mapped pool, the mapped cookie says whether the
    // engine is still up: copies go through our mapping, not the pid, so a
    // reused pid is no danger here, and death is checked after the last
    // chunk, through the pid (below, with no iovecs).
    if (peer.mapping.cookie_epoch() != peer.cookie_epoch) st = Status::kRemoteDisconnect;
  } else {
    st = read_cookie(peer.pid, peer.cookie_addr, peer.cookie_epoch, &err);
    if (st == Status::kSuccess) peer.cookie_ok_ns.store(steady_ns(), std::memory_order_relaxed);
  }
  if (const ChunkHook hook = chunk_hook_.load(std::memory_order_acquire);
      hook != nullptr && st == Status::kSuccess && !local.empty()) {
    hook(chunk_hook_arg_);
  }
  Status result = st == Status::kSuccess ? copy_claim(peer, xfer, local, remote) : st;
  if (num_marked > 0) peer.fence.unmark(std::span(marked, num_marked));
  if (st == Status::kNotAllowed || st == Status::kBackend) {
    log().warn("kvxfer cma {}: process_vm_readv from peer {} (pid {}) failed: {}", agent_name_,
               peer.agent_name, peer.pid, std::strerror(err));
    result = Status::kBackend;
  }
  if (st == Status::kMismatch) {
    log().warn(
        "kvxfer cma {}: transfer {} to peer {} (pid {}) names a region the target "
        "withdrew: not copied",
        agent_name_, xfer.id, peer.agent_name, peer.pid);
  }
  if (result == Status::kRemoteDisconnect && !peer.gone.exchange(true)) {
    log().warn("kvxfer cma {}: peer {} (pid {}) is gone", agent_name_, peer.agent_name, peer.pid);
  }
  return result;
}

// The copy of a checked claim: through the peer's mapped pool, or with
// process_vm_writev/readv, kMaxIov iovecs a call.
Status CmaLane::copy_claim(Peer& peer, const Xfer& xfer, std::span<iovec> local,
                           std::span<iovec> remote) {
  Status result = Status::kSuccess;
  for (std::size_t i = 0; i < local.size() && result == Status::kSuccess; i += kMaxIov) {
    const std::size_t k = std::min(kMaxIov, local.size() - i);
    if (xfer.mapped) {
      bytes_copied_.fetch_add(
          mapped_copy(peer, xfer.read, local.subspan(i, k), remote.subspan(i, k)),
          std::memory_order_relaxed);
    } else {
      result = cma_copy(peer, xfer.read, local.subspan(i, k), remote.subspan(i, k));
    }
  }
  return result;
}

// The copy through a mapped pool. The bytes are the peer's pool and ours:
// two transfers of one block in flight at once race there by the contract
// (they have no order). Through process_vm_writev/readv ThreadSanitizer
// never sees the peer's side, and sees our side only as a read's
// destination (where such a race is reported: tests keep reads in flight
// apart). So the mapped copy is uninstrumented_copy (common/sanitizers.h):
// the lane's own state stays checked, and cma_bytes counts every byte copied.
std::uint64_t CmaLane::mapped_copy(const Peer& peer, bool read, std::span<const iovec> local,
                                   std::span<const iovec> remote) {
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < local.size(); ++i) {
    std::uint8_t* theirs = peer.mapping.at(reinterpret_cast<std::uintptr_t>(remote[i].iov_base));
    auto* ours = static_cast<std::uint8_t*>(local[i].iov_base);
    if (read) {
      uninstrumented_copy(ours, theirs, local[i].iov_len);
    } else {
      uninstrumented_copy(theirs, ours, local[i].iov_len);
    }
    bytes += local[i].iov_len;
  }
  return bytes;
}

Status CmaLane::cma_copy(Peer& peer, bool read, std::span<iovec> local, std::span<iovec> remote) {
  // Runs have equal lengths on both sides, so a short copy advances both
  // lists by the same bytes.
  std::size_t i = 0;
  while (i < local.size()) {
    const ssize_t n = read ? ::process_vm_readv(peer.pid, &local[i], local.size() - i, &remote[i],
                                                remote.size() - i, 0)
                           : ::process_vm_writev(peer.pid, &local[i], local.size() - i, &remote[i],
                                                 remote.size() - i, 0);
    if (n < 0) {
      const int err = errno;
      if (err == ESRCH) return Status::kRemoteDisconnect;
      if (err == EFAULT) {
        // Our pool is mapped, so the fault is on the peer's side: gone or
        // shut down unless its cookie still reads back.
        int cookie_err = 0;
        if (read_cookie(peer.pid, peer.cookie_addr, peer.cookie_epoch, &cookie_err) !=
            Status::kSuccess) {
          return Status::kRemoteDisconnect;
        }
      }
      log().warn("kvxfer cma {}: process_vm_{} with peer {} failed: {}", agent_name_,
                 read ? "readv" : "writev", peer.agent_name, std::strerror(err));
      return Status::kBackend;
    }
    if (n == 0) return Status::kBackend;
    bytes_copied_.fetch_add(static_cast<std::uint64_t>(n), std::memory_order_relaxed);
    auto left = static_cast<std::size_t>(n);
    while (i < local.size() && left >= local[i].iov_len) {
      left -= local[i].iov_len;
      ++i;
    }
    if (left > 0) {
      local[i].iov_base = static_cast<std::uint8_t*>(local[i].iov_base) + left;
      local[i].iov_len -= left;
      remote[i].iov_base = static_cast<std::uint8_t*>(remote[i].iov_base) + left;
      remote[i].iov_len -= left;
    }
  }
  return Status::kSuccess;
}

}  // namespace kvxfer::internal::cma
