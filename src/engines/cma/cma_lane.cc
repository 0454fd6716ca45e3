// SPDX-License-Identifier: Apache-2.0
#include "engines/cma/cma_lane.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "common/sanitizers.h"
#include "common/host.h"
#include "wire/notify.h"

namespace kvxfer::internal::cma {
namespace {

// process_vm_writev takes at most UIO_MAXIOV iovecs per call.
constexpr std::size_t kMaxIov = 1024;
// A copier claims at most this many bytes, and kMaxIov iovecs, at a time.
constexpr std::size_t kChunkBytes = CopyPolicy::kChunkBytes;

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

CmaLane::CmaLane(std::string agent_name, const Region& region, int num_threads,
                 const CopyPolicy& policy, std::uint64_t token)
    : agent_name_(std::move(agent_name)),
      region_(region),
      pidns_(own_pid_namespace()),
      pool_file_(find_shared_pool(region.base, region.num_blocks * region.block_len)),
      cookie_(region,
              pool_file_.fd >= 0 ? static_cast<std::uint32_t>(pool_file_.fd) : wire::kNoFd,
              pool_file_.fd >= 0 ? pool_file_.offset : 0, token),
      map_peer_pools_(policy.map != PoolMapping::kOff),
      populate_peer_pools_(policy.map == PoolMapping::kPopulate),
      caller_slice_bytes_(policy.caller_slice),
      num_copiers_(CopyPolicy::copiers(num_threads)) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) == 0) {
    notify_rx_ = pair[0];
    notify_tx_ = pair[1];
    // Room for what the owner has not taken yet (the kernel caps it at
    // net.core.wmem_max).
    const int room = 8 << 20;
    static_cast<void>(::setsockopt(notify_tx_, SOL_SOCKET, SO_SNDBUF, &room, sizeof(room)));
  } else {
    log().warn("kvxfer cma {}: no notification socket ({}): same-host peers cannot notify us",
               agent_name_, std::strerror(errno));
  }
}

CmaLane::~CmaLane() {
  stop_copiers();
  // No peer may find our pool's descriptor named once it is closed.
  cookie_.retire();
  if (pool_file_.fd >= 0) ::close(pool_file_.fd);
  if (notify_rx_ >= 0) ::close(notify_rx_);
  if (notify_tx_ >= 0) ::close(notify_tx_);
}

// ---------------------------------------------------------------------------
// Peers
// ---------------------------------------------------------------------------

namespace {

// Our duplicate of descriptor `fd` of process `pid` (pidfd_getfd, which
// needs the same ptrace permission as process_vm_writev), if it is an
// AF_UNIX SOCK_SEQPACKET socket; else -1.
int duplicate_notify_socket(pid_t pid, int fd) {
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return -1;
  const int dup = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
  ::close(pidfd);
  if (dup < 0) return -1;
  int type = 0;
  int domain = 0;
  socklen_t len = sizeof(type);
  const bool socket_ok =
      ::getsockopt(dup, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_SEQPACKET &&
      (len = sizeof(domain), ::getsockopt(dup, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0) &&
      domain == AF_UNIX;
  if (!socket_ok) {
    ::close(dup);
    return -1;
  }
  ::fcntl(dup, F_SETFD, FD_CLOEXEC);
  return dup;
}

}  // namespace

void CmaLane::publish(wire::PeerBlob& blob) const {
  blob.flags |= wire::kBlobAcceptsCma;
  blob.pidns_dev = pidns_.dev;
  blob.pidns_ino = pidns_.ino;
  blob.cookie_addr = cookie_.addr();
  if (notify_tx_ >= 0) blob.notify_fd = static_cast<std::uint32_t>(notify_tx_);
}

bool CmaLane::qualifies(const RemoteRegion& remote, const wire::PeerBlob& blob) const {
  return !boot_id().empty() && remote.boot_id == boot_id() && remote.pid != 0 && pidns_.ino != 0 &&
         blob.pidns_dev == pidns_.dev && blob.pidns_ino == pidns_.ino &&
         (blob.flags & wire::kBlobAcceptsCma) != 0;
}

Status CmaLane::connect(const wire::PeerBlob& blob, const RemoteRegion& remote, Connected* out) {
  const int notify_fd = blob.notify_fd == wire::kNoNotifyFd || blob.notify_fd > 0x7fffffff
                            ? -1
                            : static_cast<int>(blob.notify_fd);
  auto peer = std::make_shared<Peer>(this);
  peer->agent_name = remote.agent_name;
  peer->remote_base = remote.base_addr;
  peer->remote_block_len = remote.block_len;
  peer->pid = static_cast<pid_t>(remote.pid);
  peer->cookie_addr = blob.cookie_addr;
  peer->cookie_epoch = blob.cookie_epoch;
  // The metadata says where the pool is; only the target's own cookie page
  // says which pool it registered. Writes go where the metadata says, so the
  // two must agree exactly.
  Declaration declared;
  int err = 0;
  Status st = read_declaration(peer->pid, peer->cookie_addr, &declared, &err);
  if (st == Status::kSuccess && declared.epoch != peer->cookie_epoch) {
    st = Status::kRemoteDisconnect;
  }
  if (st == Status::kRemoteDisconnect) {
    out->reason = fmt::format("peer {} is on this host but its process (pid {}) is gone ({})",
                              peer->agent_name, peer->pid,
                              err != 0 ? std::strerror(err) : "its engine's cookie does not match");
    return st;
  }
  if (st == Status::kMismatch) {
    out->reason = fmt::format(
        "refusing peer {} (pid {}): its metadata names cookie address {:#x}, which is not a "
        "cookie page",
        peer->agent_name, peer->pid, peer->cookie_addr);
    return st;
  }
  if (st != Status::kSuccess) {
    out->reason = fmt::format(
        "peer {} (pid {}) is on this host but the same-host lane cannot reach it "
        "(process_vm_readv: {})",
        peer->agent_name, peer->pid, std::strerror(err));
    out->next_may_try = true;
    return st;
  }
  if (declared.base_addr != remote.base_addr || declared.num_blocks != remote.num_blocks ||
      declared.block_len != remote.block_len) {
    out->reason = fmt::format(
        "refusing peer {} (pid {}): its metadata describes a pool at {:#x} of {} blocks of {} "
        "bytes, but the target registered {:#x} with {} blocks of {} bytes",
        peer->agent_name, peer->pid, remote.base_addr, remote.num_blocks, remote.block_len,
        declared.base_addr, declared.num_blocks, declared.block_len);
    return Status::kMismatch;
  }
  if (declared.pool_fd != wire::kNoFd && map_peer_pools_) map_pool(*peer, declared);
  if (notify_fd >= 0) {
    peer->notify_fd = duplicate_notify_socket(peer->pid, notify_fd);
    // The cookie again: the descriptor is the peer's engine's only if its
    // pid was not reused meanwhile.
    int cookie_err = 0;
    if (peer->notify_fd >= 0 && read_cookie(peer->pid, peer->cookie_addr, peer->cookie_epoch,
                                            &cookie_err) != Status::kSuccess) {
      ::close(peer->notify_fd);
      peer->notify_fd = -1;
    }
    if (peer->notify_fd < 0) {
      log().info("kvxfer cma {}: peer {} (pid {}) takes no notifications from us", agent_name_,
                 peer->agent_name, peer->pid);
    }
  }
  log().info("kvxfer cma {}: peer {} (pid {}) is on this host: writing {}", agent_name_,
             peer->agent_name, peer->pid,
             peer->mapping.mapped() ? "into its mapped pool" : "with process_vm_writev");
  start_copiers();
  out->peer = peer.get();
  std::lock_guard lock(peers_mu_);
  peers_.emplace(peer.get(), std::move(peer));
  return Status::kSuccess;
}

void CmaLane::map_pool(Peer& peer, const Declaration& declared) {
  std::string why;
  PeerPoolMapping mapping;
  Status st =
      map_peer_pool(peer.pid, declared, peer.cookie_addr, populate_peer_pools_, &mapping, &why);
  // The cookie again: the descriptor was the declaring engine's only if its
  // pid was not reused meanwhile.
  int err = 0;
  if (st == Status::kSuccess &&
      read_cookie(peer.pid, peer.cookie_addr, peer.cookie_epoch, &err) != Status::kSuccess) {
    st = Status::kRemoteDisconnect;
    why = "it went away while its pool was mapped";
  }
  if (st != Status::kSuccess) {
    log().info("kvxfer cma {}: not mapping the pool of peer {} (pid {}): {}", agent_name_,
               peer.agent_name, peer.pid, why);
    return;
  }
  if (!mapping.cookie_mapped()) {
    log().info("kvxfer cma {}: reading the cookie of peer {} (pid {}) with process_vm_readv: {}",
               agent_name_, peer.agent_name, peer.pid,
               why.empty() ? "it declares no cookie descriptor" : why);
  }
  peer.mapping = std::move(mapping);
  mapped_peers_.fetch_add(1, std::memory_order_relaxed);
}

Status CmaLane::disconnect(LanePeer* handle) {
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard lock(peers_mu_);
    auto it = peers_.find(handle);
    if (it == peers_.end()) return Status::kNotFound;
    peer = std::move(it->second);
    peers_.erase(it);
  }
  // Queued copies are cancelled when a copier picks them up; a running one
  // finishes. Either way none is left once this returns.
  std::unique_lock lock(copy_mu_);
  peer->disconnected = true;
  copy_done_cv_.wait(lock, [&] { return peer->copies == 0; });
  // No copy is left to send a notification through it.
  if (peer->notify_fd >= 0) {
    ::close(peer->notify_fd);
    peer->notify_fd = -1;
  }
  return Status::kSuccess;
}

// ---------------------------------------------------------------------------
// Transfers
// ---------------------------------------------------------------------------

CmaLane::Xfer* CmaLane::acquire_xfer() {
  std::lock_guard lock(pool_mu_);
  if (free_xfers_.empty()) return &xfers_.emplace_back(this);
  Xfer* x = free_xfers_.back();
  free_xfers_.pop_back();
  return x;
}

void CmaLane::unref(Xfer* xfer) {
  if (xfer->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  xfer->peer.reset();
  std::lock_guard lock(pool_mu_);
  free_xfers_.push_back(xfer);
}

Status CmaLane::post(LanePeer* handle, const Post& post, XferHandle* out) {
  // The core posts only to peers it connected and has not disconnected.
  std::shared_ptr<Peer> peer = static_cast<Peer*>(handle)->shared_from_this();
  const std::span<const std::uint8_t> notify = post.note;
  const bool read = post.op == TransferOp::kRead;
  if (peer->gone.load(std::memory_order_acquire)) return Status::kRemoteDisconnect;
  if (!notify.empty() && peer->notify_fd < 0) return Status::kNotSupported;

  Xfer* xfer = acquire_xfer();
  xfer->id = post.id;
  xfer->read = read;
  xfer->notify.assign(notify.begin(), notify.end());
  xfer->held.store(true, std::memory_order_relaxed);
  xfer->peer = peer;
  xfer->result.store(Status::kInProgress, std::memory_order_relaxed);
  xfer->refs.store(2, std::memory_order_relaxed);  // the core's and the copier's
  xfer->local_iov.clear();
  xfer->remote_iov.clear();
  auto* const base = static_cast<std::uint8_t*>(region_.base);
  const std::uint64_t block_len = region_.block_len;
  for (const BlockRun& run : post.runs) {
    // A run longer than a copier's chunk becomes several iovecs, so that
    // copiers can share it.
    auto* src = base + static_cast<std::uint64_t>(run.local) * block_len;
    auto dst = peer->remote_base + static_cast<std::uint64_t>(run.remote) * peer->remote_block_len;
    for (std::size_t left = run.count * block_len; left > 0;) {
      const std::size_t len = std::min(left, kChunkBytes);
      xfer->local_iov.push_back({src, len});
      xfer->remote_iov.push_back({reinterpret_cast<void*>(dst), len});
      src += len;
      dst += len;
      left -= len;
    }
  }
  live_requests_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(copy_mu_);
    ++peer->copies;
    xfer->next_iov = 0;
    xfer->end_iov = xfer->local_iov.size();
    xfer->running = 0;
    xfer->chunk_error = Status::kSuccess;
    xfer->next_copy = nullptr;
    (copy_tail_ != nullptr ? copy_tail_->next_copy : copy_head_) = xfer;
    copy_tail_ = xfer;
    copies_queued_.store(true, std::memory_order_relaxed);
  }
  copy_cv_.notify_one();
  (read ? cma_reads_ : cma_writes_).fetch_add(1, std::memory_order_relaxed);
  live_transfers_.fetch_add(1, std::memory_order_relaxed);
  *out = handle_of(static_cast<LaneXfer*>(xfer));
  return Status::kSuccess;
}

void CmaLane::progress() {
  // A caller of poll() copies one slice of what is queued, whether it spins
  // or comes back between steps: on a host without a spare core its thread
  // holds a core the copiers would use, and the slice is bounded, so that
  // the poll returns in microseconds (CopyPolicy).
  if (caller_slice_bytes_ == 0 || !copies_queued_.load(std::memory_order_relaxed)) return;
  std::unique_lock lock(copy_mu_);
  if (copy_head_ == nullptr) return;
  const std::uint64_t bytes = run_chunk(lock, /*caller=*/true);
  lock.unlock();
  caller_slices_.fetch_add(1, std::memory_order_relaxed);
  std::uint64_t max = caller_slice_max_bytes_.load(std::memory_order_relaxed);
  while (bytes > max &&
         !caller_slice_max_bytes_.compare_exchange_weak(max, bytes, std::memory_order_relaxed)) {
  }
}

Status CmaLane::check(XferHandle handle, Status* state) {
  Xfer* xfer = from_handle(handle);
  if (!xfer->held.load(std::memory_order_relaxed)) return Status::kInvalidParam;
  const Status result = xfer->result.load(std::memory_order_acquire);
  if (result == Status::kSuccess) {
    *state = Status::kSuccess;
    return Status::kSuccess;
  }
  // A peer that is gone can no longer take the bytes: report that as the
  // check error, which is terminal for the core.
  const bool peer_gone = xfer->peer != nullptr && xfer->peer->gone.load(std::memory_order_acquire);
  if (result == Status::kInProgress) {
    if (peer_gone) return Status::kRemoteDisconnect;
    *state = Status::kInProgress;
    return Status::kSuccess;
  }
  if (peer_gone || result == Status::kRemoteDisconnect) return Status::kRemoteDisconnect;
  *state = result == Status::kCanceled ? Status::kCanceled : Status::kBackend;
  return Status::kSuccess;
}

Status CmaLane::release(XferHandle handle) {
  Xfer* xfer = from_handle(handle);
  if (!xfer->held.exchange(false, std::memory_order_relaxed)) return Status::kInvalidParam;
  live_transfers_.fetch_sub(1, std::memory_order_relaxed);
  // A copy still running keeps its reference: it returns the handle.
  unref(xfer);
  return Status::kSuccess;
}

Status CmaLane::send_notification(Peer& peer, Xfer& xfer) {
  // The peer's fd is closed only by disconnect(), which waits for this copy.
  const std::string_view name =
      std::string_view(agent_name_).substr(0, std::min(agent_name_.size(), wire::kMaxNotifyName));
  const std::size_t header_len = wire::notify_header_len(name.size());
  xfer.datagram.resize(header_len + xfer.notify.size());
  wire::encode_notify_header(xfer.datagram.data(),
                            wire::NotifyHeader{peer.cookie_epoch, 0, 0, 0, 0, name});
  std::memcpy(xfer.datagram.data() + header_len, xfer.notify.data(), xfer.notify.size());
  const ssize_t sent = ::send(peer.notify_fd, xfer.datagram.data(), xfer.datagram.size(),
                              MSG_DONTWAIT | MSG_NOSIGNAL);
  if (sent == static_cast<ssize_t>(xfer.datagram.size())) {
    notifications_sent_.fetch_add(1, std::memory_order_relaxed);
    return Status::kSuccess;
  }
  const int err = sent < 0 ? errno : EMSGSIZE;
  notifications_refused_.fetch_add(1, std::memory_order_relaxed);
  log().warn(
      "kvxfer cma {}: the notification of transfer {} to peer {} was not sent: {}", agent_name_,
      xfer.id, peer.agent_name,
      err == EAGAIN ? "its queue is full (its owner is not taking them)" : std::strerror(err));
  // The receiving end is gone with the peer's engine.
  if (err == ECONNREFUSED || err == EPIPE || err == ECONNRESET) return Status::kRemoteDisconnect;
  return Status::kBackend;
}

void CmaLane::take_notifications(std::vector<Notification>* out) {
  if (notify_rx_ < 0) return;
  std::lock_guard lock(notify_mu_);
  notify_buffer_.resize(wire::notify_header_len(wire::kMaxNotifyName) + kMaxNotificationBytes + 1);
  for (;;) {
    const ssize_t got =
        ::recv(notify_rx_, notify_buffer_.data(), notify_buffer_.size(), MSG_DONTWAIT | MSG_TRUNC);
    if (got < 0) return;  // EAGAIN: nothing more queued
    // A datagram is a header (its name length in bytes 6..7) and the
    // message; anything else a same-host process wrote there is dropped.
    const auto size = static_cast<std::size_t>(got);
    const std::span<const std::uint8_t> bytes(notify_buffer_.data(),
                                              std::min(size, notify_buffer_.size()));
    wire::NotifyHeader h;
    std::size_t header_len = 0;
    if (size <= notify_buffer_.size() && size >= wire::kNotifyFixedLen) {
      header_len = wire::notify_header_len(wire::load_le<std::uint16_t>(bytes.data() + 6));
    }
    if (header_len == 0 || header_len >= size ||
        !wire::decode_notify_header(bytes.first(header_len), &h) || h.token != cookie_.epoch() ||
        size - header_len > kMaxNotificationBytes) {
      notifications_refused_.fetch_add(1, std::memory_order_relaxed);
      log().warn("kvxfer cma {}: dropped a malformed notification datagram ({} bytes)", agent_name_,
                 size);
      continue;
    }
    const auto message = bytes.subspan(header_len);
    out->push_back(Notification{std::string(h.name), {message.begin(), message.end()}});
    notifications_received_.fetch_add(1, std::memory_order_relaxed);
  }
}

void CmaLane::add_live(HandleCounts& counts) const {
  {
    std::lock_guard lock(peers_mu_);
    counts.peers += peers_.size();
  }
  counts.transfers += live_transfers_.load(std::memory_order_relaxed);
  counts.requests += live_requests_.load(std::memory_order_relaxed);
}

void CmaLane::add_counters(std::map<std::string, std::uint64_t>& counters) const {
  counters["cma_writes"] = cma_writes_.load(std::memory_order_relaxed);
  counters["cma_reads"] = cma_reads_.load(std::memory_order_relaxed);
  counters["cma_mapped_peers"] = mapped_peers_.load(std::memory_order_relaxed);
  counters["cma_notifications_sent"] = notifications_sent_.load(std::memory_order_relaxed);
  counters["cma_notifications_received"] = notifications_received_.load(std::memory_order_relaxed);
  counters["cma_notifications_refused"] = notifications_refused_.load(std::memory_order_relaxed);
  counters["cma_bytes"] = bytes_copied_.load(std::memory_order_relaxed);
  counters["cma_caller_slices"] = caller_slices_.load(std::memory_order_relaxed);
  counters["cma_caller_slice_max_bytes"] = caller_slice_max_bytes_.load(std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------
// Copiers
// ---------------------------------------------------------------------------

void CmaLane::stop(StopStage stage) {
  switch (stage) {
    case StopStage::kRefuse:
      break;
    case StopStage::kDisconnect: {
      std::vector<LanePeer*> left;
      {
        std::lock_guard lock(peers_mu_);
        for (const auto& [handle, peer] : peers_) left.push_back(handle);
      }
      if (!left.empty()) {
        log().warn("kvxfer cma {}: stopping with {} peer(s) still connected", agent_name_,
                   left.size());
      }
      for (LanePeer* peer : left) static_cast<void>(disconnect(peer));
      break;
    }
    case StopStage::kQuiesce:
      stop_copiers();
      break;
    case StopStage::kRelease:
      cookie_.retire();
      break;
  }
}

void CmaLane::start_copiers() {
  std::lock_guard lock(copy_mu_);
  if (!copiers_.empty() || copiers_stop_) return;
  for (int i = 0; i < num_copiers_; ++i) copiers_.emplace_back([this] { copier_loop(); });
}

void CmaLane::stop_copiers() {
  {
    std::lock_guard lock(copy_mu_);
    copiers_stop_ = true;
  }
  copy_cv_.notify_all();
  for (auto& t : copiers_) t.join();
  copiers_.clear();
}

void CmaLane::copier_loop() {
  // Lowering one's own thread's priority needs no privilege; failing to is
  // harmless (the copiers then only compete as before).
  static_cast<void>(::pthread_setname_np(::pthread_self(), "kvxfer-copy"));
  static_cast<void>(
      ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), CopyPolicy::kCopierNice));
  std::unique_lock lock(copy_mu_);
  for (;;) {
    copy_cv_.wait(lock, [this] { return copy_head_ != nullptr || copiers_stop_; });
    if (copy_head_ == nullptr) return;  // stopping, and nothing left to finish
    run_chunk(lock, /*caller=*/false);
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
    return;
  }
  std::size_t begin = end;
  for (; begin > xfer.next_iov && end - begin < kMaxIov; --begin) {
    const std::size_t len = xfer.local_iov[begin - 1].iov_len;
    if (begin < end && claim->bytes + len > max_bytes) break;
    claim->bytes += len;
  }
  xfer.end_iov = begin;
  claim->local = std::span(xfer.local_iov).subspan(begin, end - begin);
  claim->remote = std::span(xfer.remote_iov).subspan(begin, end - begin);
}

// Claims a chunk of the transfer at the head of the queue and copies it;
// whoever finishes a transfer's last chunk completes the transfer. Called,
// and returns, with copy_mu_ held through `lock`; copy_head_ is set.
// Returns the bytes claimed.
std::size_t CmaLane::run_chunk(std::unique_lock<std::mutex>& lock, bool caller) {
  Xfer* xfer = copy_head_;
  Peer& peer = *xfer->peer;
  Claim claim;
  if (caller) {
    claim_back(*xfer, caller_slice_bytes_, &claim);
  } else {
    claim_front(*xfer, &claim);
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
  const bool cancelled = peer.disconnected || copiers_stop_ ||
                         xfer->chunk_error != Status::kSuccess ||
                         (xfer->read && !xfer->held.load(std::memory_order_relaxed));
  if (copy_head_ != nullptr) copy_cv_.notify_one();  // more to claim: another copier may help
  lock.unlock();
  const Status result =
      cancelled ? Status::kCanceled : run_copy(peer, xfer->read, claim.local, claim.remote, caller);
  lock.lock();
  if (result != Status::kSuccess && xfer->chunk_error == Status::kSuccess) {
    xfer->chunk_error = result;
  }
  // Its other chunks finish it.
  if (--xfer->running > 0 || xfer->next_iov < xfer->end_iov) return claim.bytes;
  Status final_result = xfer->chunk_error;
  lock.unlock();
  // Every chunk landed: the cookie must still read back (run_copy of none).
  if (final_result == Status::kSuccess) final_result = run_copy(peer, xfer->read, {}, {});
  // Then, and only then, the notification; not for a transfer the core let
  // go of before its bytes were in place.
  if (final_result == Status::kSuccess && !xfer->notify.empty() &&
      xfer->held.load(std::memory_order_relaxed)) {
    final_result = send_notification(peer, *xfer);
  }
  xfer->result.store(final_result, std::memory_order_release);
  live_requests_.fetch_sub(1, std::memory_order_relaxed);
  lock.lock();
  if (--peer.copies == 0) copy_done_cv_.notify_all();
  lock.unlock();
  unref(xfer);
  lock.lock();
  return claim.bytes;
}

// Copies matching iovecs of a transfer after reading the peer's cookie;
// with none, only reads the cookie. A transfer's cookie is read before each
// chunk, so a reused pid is never written, and once after its last chunk,
// so a peer that died or shut its engine down during the copy does not
// count it as landed. (Into a mapped pool whose cookie page is mapped too,
// the check before a chunk is a load from that page; a `caller` slice
// skips the check when some copy read the cookie back within
// CopyPolicy::kCookieFresh; the read after the last chunk always goes
// through the pid.) Returns kSuccess, kRemoteDisconnect (the peer is gone),
// kBackend (an I/O error) or kCanceled.
Status CmaLane::run_copy(Peer& peer, bool read, std::span<iovec> local, std::span<iovec> remote,
                         bool caller) {
  if (peer.gone.load(std::memory_order_acquire)) return Status::kRemoteDisconnect;
  int err = 0;
  Status st = Status::kSuccess;
  constexpr std::int64_t kFreshNs =
      std::chrono::duration_cast<std::chrono::nanoseconds>(CopyPolicy::kCookieFresh).count();
  if (!local.empty() && caller &&
      steady_ns() - peer.cookie_ok_ns.load(std::memory_order_relaxed) < kFreshNs) {
    // A caller's slice right after another copy's check: the cookie read
    // back moments ago (CopyPolicy::kCookieFresh).
  } else if (!local.empty() && peer.mapping.cookie_mapped()) {
    // Before a chunk into a mapped pool, the mapped cookie says whether the
    // engine is still up: copies go through our mapping, not the pid, so a
    // reused pid is no danger here, and death is checked after the last
    // chunk, through the pid (below, with no iovecs).
    if (peer.mapping.cookie_epoch() != peer.cookie_epoch) st = Status::kRemoteDisconnect;
  } else {
    st = read_cookie(peer.pid, peer.cookie_addr, peer.cookie_epoch, &err);
    if (st == Status::kSuccess) peer.cookie_ok_ns.store(steady_ns(), std::memory_order_relaxed);
  }
  Status result = Status::kSuccess;
  if (st == Status::kSuccess) {
    for (std::size_t i = 0; i < local.size() && result == Status::kSuccess; i += kMaxIov) {
      const std::size_t k = std::min(kMaxIov, local.size() - i);
      if (peer.mapping.mapped()) {
        bytes_copied_.fetch_add(mapped_copy(peer, read, local.subspan(i, k), remote.subspan(i, k)),
                                std::memory_order_relaxed);
      } else {
        result = cma_copy(peer, read, local.subspan(i, k), remote.subspan(i, k));
      }
    }
  }
  if (st == Status::kRemoteDisconnect) result = Status::kRemoteDisconnect;
  if (st == Status::kNotAllowed || st == Status::kBackend) {
    log().warn("kvxfer cma {}: process_vm_readv from peer {} (pid {}) failed: {}", agent_name_,
               peer.agent_name, peer.pid, std::strerror(err));
    result = Status::kBackend;
  }
  if (result == Status::kRemoteDisconnect && !peer.gone.exchange(true)) {
    log().warn("kvxfer cma {}: peer {} (pid {}) is gone", agent_name_, peer.agent_name, peer.pid);
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
