// SPDX-License-Identifier: Apache-2.0
// The same-host lane's calls (cma_lane.h): its peers (connect, disconnect),
// posts that queue a transfer's iovecs, check and release, notifications over
// its socketpair, counts and stop. The copies themselves are cma_copy.cc's.
#include "engines/cma/cma_lane.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "common/host.h"
#include "wire/notify.h"

namespace kvxfer::internal::cma {

CmaLane::CmaLane(std::string agent_name, const Region& region, int num_threads,
                 const CopyPolicy& policy, std::uint64_t token)
    : agent_name_(std::move(agent_name)),
      region_(region),
      pidns_(own_pid_namespace()),
      pool_file_(region.base == nullptr
                     ? SharedPoolFile{}
                     : find_shared_pool(region.base, region.num_blocks * region.block_len)),
      cookie_(region, pool_file_.fd >= 0 ? static_cast<std::uint32_t>(pool_file_.fd) : wire::kNoFd,
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
  // Every region besides: in the target's table, live, where it says.
  if (st = check_regions(*peer, declared, remote, &out->reason); st != Status::kSuccess) return st;
  // Chunks into them mark them in the target's fence table; a peer whose
  // table we cannot use is left to the next lane.
  if (st = fence_regions(*peer, declared, &out->reason); st != Status::kSuccess) {
    out->next_may_try = st != Status::kRemoteDisconnect;
    return st;
  }
  if (declared.pool_fd != wire::kNoFd && map_peer_pools_) map_pool(*peer, declared);
  if (notify_fd >= 0) take_notify_socket(*peer, notify_fd);
  log().info("kvxfer cma {}: peer {} (pid {}) is on this host: writing {}", agent_name_,
             peer->agent_name, peer->pid,
             peer->mapping.mapped() ? "into its mapped pool" : "with process_vm_writev");
  start_copiers();
  out->peer = peer.get();
  MutexLock lock(peers_mu_);
  peers_.emplace(peer.get(), std::move(peer));
  return Status::kSuccess;
}

void CmaLane::take_notify_socket(Peer& peer, int notify_fd) {
  peer.notify_fd = duplicate_notify_socket(peer.pid, notify_fd);
  // The cookie again: the descriptor is the peer's engine's only if its
  // pid was not reused meanwhile.
  int cookie_err = 0;
  if (peer.notify_fd >= 0 &&
      read_cookie(peer.pid, peer.cookie_addr, peer.cookie_epoch, &cookie_err) != Status::kSuccess) {
    ::close(peer.notify_fd);
    peer.notify_fd = -1;
  }
  if (peer.notify_fd < 0) {
    log().info("kvxfer cma {}: peer {} (pid {}) takes no notifications from us", agent_name_,
               peer.agent_name, peer.pid);
  }
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
    MutexLock lock(peers_mu_);
    auto it = peers_.find(handle);
    if (it == peers_.end()) return Status::kNotFound;
    peer = std::move(it->second);
    peers_.erase(it);
  }
  // Queued copies are cancelled when a copier picks them up; a running one
  // finishes. Either way none is left once this returns.
  MutexLock lock(copy_mu_);
  ours(*peer);
  peer->disconnected = true;
  while (peer->copies != 0) lock.wait(copy_done_cv_);
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
  MutexLock lock(pool_mu_);
  if (free_xfers_.empty()) return &xfers_.emplace_back(this);
  Xfer* x = free_xfers_.back();
  free_xfers_.pop_back();
  return x;
}

void CmaLane::unref(Xfer* xfer) {
  if (xfer->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  xfer->peer.reset();
  MutexLock lock(pool_mu_);
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
  if (const Status st = build_iovecs(*peer, post, *xfer); st != Status::kSuccess) {
    xfer->held.store(false, std::memory_order_relaxed);
    xfer->refs.store(1, std::memory_order_relaxed);
    unref(xfer);
    return st;
  }
  live_requests_.fetch_add(1, std::memory_order_relaxed);
  {
    MutexLock lock(copy_mu_);
    ours(*peer);
    ours(*xfer);
    ++peer->copies;
    xfer->next_iov = 0;
    xfer->end_iov = xfer->local_iov.size();
    xfer->running = 0;
    xfer->chunk_error = Status::kSuccess;
    xfer->next_copy = nullptr;
    if (copy_tail_ != nullptr) {
      ours(*copy_tail_);
      copy_tail_->next_copy = xfer;
    } else {
      copy_head_ = xfer;
    }
    copy_tail_ = xfer;
    copies_queued_.store(true, std::memory_order_relaxed);
  }
  copy_cv_.notify_one();
  (read ? cma_reads_ : cma_writes_).fetch_add(1, std::memory_order_relaxed);
  live_transfers_.fetch_add(1, std::memory_order_relaxed);
  *out = handle_of(static_cast<LaneXfer*>(xfer));
  return Status::kSuccess;
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
  MutexLock lock(notify_mu_);
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
    MutexLock lock(peers_mu_);
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

void CmaLane::stop(StopStage stage) {
  switch (stage) {
    case StopStage::kRefuse:
      break;
    case StopStage::kDisconnect: {
      std::vector<LanePeer*> left;
      {
        MutexLock lock(peers_mu_);
        for (const auto& [handle, peer] : peers_) left.push_back(handle);
      }
      disconnect_all(left, agent_name_);
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

}  // namespace kvxfer::internal::cma
