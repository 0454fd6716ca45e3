// SPDX-License-Identifier: Apache-2.0
// The tcp lane's I/O thread: accepts, says hello, receives frames (payload
// straight into the pool), sends transfers and answers with sendmsg, and
// ends transfers. Everything in TcpLane::Io is this thread's alone; it meets
// the callers' threads only in the command queue, the notification queue
// and the transfers' atomics.
#include "engines/tcp/tcp_io.h"

#include <fmt/format.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>

#include "common/log.h"
#include "engines/tcp/tcp_socket.h"

namespace kvxfer::internal::tcp {
namespace {

// Bytes one connection may receive per turn of the I/O loop before the
// others get theirs.
constexpr std::uint64_t kTurnBytes = std::uint64_t{8} << 20;
// A target stops reading a connection while this many answers wait to be
// sent on it (or while a read's reply is being sent): a peer that does not
// read slows only its own connection, and the target holds O(1) per peer.
constexpr std::size_t kMaxQueuedAnswers = 64;
// The most iovecs one sendmsg/readv takes.
constexpr std::size_t kIovMax = IOV_MAX;
// While a payload arrives, the socket wakes the thread only once this many
// of its bytes (or all that are left of it) are waiting (SO_RCVLOWAT), not
// for every segment: fewer wakes, epoll_waits and readvs per byte. The
// kernel grows the receive buffer to hold it and still wakes us early under
// memory pressure. Measured (bench-ab, --tls tcp, 2 vCPU): 256 KiB gave
// 1.08-1.21x the GB/s of no threshold, 1 MiB 1.21-1.51x with 15-36% less
// target CPU per GB, 4 MiB less than 1 MiB.
constexpr std::uint64_t kPayloadLowat = std::uint64_t{1} << 20;

Status status_of(std::uint32_t wire_status) {
  switch (wire_status) {
    case wire::kStatusOk:
      return Status::kSuccess;
    case wire::kStatusRefused:
      return Status::kInvalidParam;
    default:
      return Status::kBackend;
  }
}

const char* detail_of(std::uint32_t wire_status) {
  switch (wire_status) {
    case wire::kStatusRefused:
      return "the target refused the frame (runs outside its pool)";
    case wire::kStatusQueueFull:
      return "the target's notification queue for this sender is full";
    case wire::kStatusNotYours:
      return "the target registered a peer of our name with another key, and closed the "
             "connection";
    default:
      return "the target answered an unknown status";
  }
}

}  // namespace

void TcpLane::Io::run() {
  std::array<epoll_event, 64> events{};
  for (;;) {
    // Wakes at least once a second to close connections that never said
    // hello and to forget idle lineages.
    // A post that skipped the wake because its peer was sending may have
    // queued after this turn's drain, when the sending ended: then look
    // again at once.
    bool queued = false;
    {
      std::lock_guard lock(lane_.commands_mu_);
      queued = !lane_.commands_.empty();
    }
    const int n = epoll_wait(lane_.epoll_fd_, events.data(), static_cast<int>(events.size()),
                             queued ? 0 : 1000);
    for (int i = 0; i < n; ++i) {
      void* tag = events[static_cast<std::size_t>(i)].data.ptr;
      if (tag == &lane_.wake_fd_) {
        std::uint64_t count = 0;
        [[maybe_unused]] const ssize_t r = read(lane_.wake_fd_, &count, sizeof count);
      } else if (tag == &lane_.listen_fd_) {
        accept_all();
      } else {
        auto* c = static_cast<Conn*>(tag);
        if (conns_.count(c) != 0) on_ready(c, events[static_cast<std::size_t>(i)].events);
      }
    }
    drain_commands();
    if (stopping_) return;
    expire();
  }
}

void TcpLane::Io::drain_commands() {
  // Swapped with the lane's queue, so both keep their capacity.
  std::vector<Command>& commands = drained_;
  lane_.wake_pending_.store(false, std::memory_order_release);
  {
    std::lock_guard lock(lane_.commands_mu_);
    commands.swap(lane_.commands_);
  }
  for (Command& cmd : commands) {
    switch (cmd.kind) {
      case Command::Kind::kAdopt: {
        if (stopping_) {
          close(cmd.fd);
        } else {
          auto conn = std::make_unique<Conn>();
          Conn* c = conn.get();
          c->fd = cmd.fd;
          c->initiator = true;
          c->peer = cmd.peer;
          c->hello_done = true;
          conns_.emplace(c, std::move(conn));
          epoll_event ev{};
          ev.events = EPOLLIN;
          ev.data.ptr = c;
          epoll_ctl(lane_.epoll_fd_, EPOLL_CTL_ADD, c->fd, &ev);
          cmd.peer->conn = c;
        }
        cmd.done->set_value();
        break;
      }
      case Command::Kind::kPost:
        // The connection must still be this peer's (a closed one's address
        // may have been reused).
        if (conns_.count(cmd.conn) != 0 && cmd.conn->peer == cmd.xfer->peer) {
          queue_transfer(cmd.conn, cmd.xfer);
        } else {
          cmd.xfer->io_ref = true;
          finish(cmd.xfer, Status::kRemoteDisconnect, "the connection to the peer is closed");
        }
        break;
      case Command::Kind::kClose:
        if (conns_.count(cmd.conn) != 0 && cmd.conn->peer == cmd.peer) {
          // Our own removal: what was still posted is cancelled.
          close_conn(cmd.conn, "the peer was removed", Status::kCanceled);
        }
        cmd.done->set_value();
        break;
    }
  }
  commands.clear();
  // Send what the posts queued now rather than wait for EPOLLOUT.
  for (auto& [c, conn] : conns_) {
    if (!conn->out.empty() && !conn->waiting_out) send(c);
  }
  // send() may have closed connections; drop them.
  std::vector<Conn*> dead;
  for (auto& [c, conn] : conns_) {
    if (conn->fd < 0) dead.push_back(c);
  }
  for (Conn* c : dead) conns_.erase(c);
}

void TcpLane::Io::queue_transfer(Conn* c, Xfer* x) {
  Conn::Out o;
  o.xfer = x;
  c->out.push_back(std::move(o));
  ++x->io_uses;
  // The answers this transfer will get, in order.
  if (x->read) {
    for (std::size_t p = 0; p < x->parts.size(); ++p) c->awaiting.push_back({x, p});
    x->io_uses += static_cast<int>(x->parts.size());
  }
  if (!x->read || x->has_notify) {
    c->awaiting.push_back({x, SIZE_MAX});
    ++x->io_uses;
  }
}

void TcpLane::Io::finish(Xfer* x, Status status, const char* why) {
  if (x->result.load(std::memory_order_relaxed) == Status::kInProgress) {
    x->why = why;
    x->result.store(status, std::memory_order_release);
  }
  if (x->io_uses == 0 && x->io_ref) {
    x->io_ref = false;
    lane_.drop_ref(x);
  }
}

void TcpLane::Io::unuse(Xfer* x) {
  --x->io_uses;
  if (x->io_uses == 0 && x->io_ref &&
      x->result.load(std::memory_order_relaxed) != Status::kInProgress) {
    x->io_ref = false;
    lane_.drop_ref(x);
  }
}

void TcpLane::Io::accept_all() {
  for (;;) {
    const int fd = accept4(lane_.listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (stopping_ || conns_.size() >= kMaxConnections) {
      lane_.counters_->refused_full.fetch_add(1, std::memory_order_relaxed);
      if (log_limit_.allow()) {
        log().warn("kvxfer tcp {}: refused a connection: {} open, {} without a hello yet",
                   lane_.agent_name_, conns_.size(), pending_hellos_);
      }
      close(fd);
      continue;
    }
    if (pending_hellos_ >= kMaxPendingHellos) {
      // The oldest connection still without a hello goes, not the new one:
      // silent connections cannot keep a peer that says hello at once out.
      // (It holds no state; drain_commands() drops it from conns_.)
      Conn* oldest = nullptr;
      for (auto& [c, conn] : conns_) {
        if (conn->fd >= 0 && !conn->hello_done &&
            (oldest == nullptr || conn->hello_deadline < oldest->hello_deadline)) {
          oldest = c;
        }
      }
      if (oldest != nullptr) {
        refuse(oldest, lane_.counters_->refused_full,
               "the oldest connection without a hello, to make room for a new one");
        close_conn(oldest, "pushed out by a newer connection before its hello");
      }
    }
    tune(fd);
    auto conn = std::make_unique<Conn>();
    Conn* c = conn.get();
    c->fd = fd;
    c->hello_deadline = Clock::now() + kHelloTimeout;
    c->body.reserve(wire::kMaxRuns * wire::kRunLen);
    conns_.emplace(c, std::move(conn));
    ++pending_hellos_;
    lane_.counters_->connections_accepted.fetch_add(1, std::memory_order_relaxed);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = c;
    epoll_ctl(lane_.epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
}

void TcpLane::Io::on_ready(Conn* c, std::uint32_t events) {
  if ((events & EPOLLOUT) != 0) send(c);
  if (c->fd >= 0 && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0 && !c->paused) receive(c);
  if (c->fd < 0) conns_.erase(c);
}

void TcpLane::Io::receive(Conn* c) {
  std::uint64_t budget = kTurnBytes;
  while (c->closing && budget > 0) {
    const ssize_t n = recv(c->fd, drain_buf_.data(), drain_buf_.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      close_conn(c, "refused");
      return;
    }
    budget -= std::min<std::uint64_t>(budget, static_cast<std::uint64_t>(n));
  }
  if (c->closing) return;
  while (c->fd >= 0 && !c->paused && budget > 0) {
    ssize_t n = 0;
    switch (c->rx) {
      case Conn::Rx::kHeader:
        n = recv(c->fd, c->head.data() + c->head_have, wire::kHeaderLen - c->head_have, 0);
        break;
      case Conn::Rx::kBody:
        n = recv(c->fd, c->body.data() + c->body_have, c->body.size() - c->body_have, 0);
        break;
      case Conn::Rx::kPayload: {
        if (c->rx_drain) {
          n = recv(c->fd, drain_buf_.data(), std::min<std::uint64_t>(c->rx_left, drain_buf_.size()),
                   0);
        } else {
          const std::size_t count = std::min(c->rx_iov.size() - c->rx_at, kIovMax);
          n = readv(c->fd, c->rx_iov.data() + c->rx_at, static_cast<int>(count));
        }
        break;
      }
    }
    if (n == 0) {
      close_conn(c, "the peer closed the connection");
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      close_conn(c, "the connection failed");
      return;
    }
    const auto got = static_cast<std::size_t>(n);
    budget -= std::min<std::uint64_t>(budget, got);
    lane_.counters_->bytes_received.fetch_add(got, std::memory_order_relaxed);
    bool ok = true;
    switch (c->rx) {
      case Conn::Rx::kHeader:
        c->head_have += got;
        if (c->head_have == wire::kHeaderLen) ok = on_header(c);
        break;
      case Conn::Rx::kBody:
        c->body_have += got;
        if (c->body_have == c->body.size()) ok = on_body(c);
        break;
      case Conn::Rx::kPayload:
        c->rx_left -= got;
        if (!c->rx_drain) {
          std::size_t left = got;
          while (left > 0) {
            iovec& v = c->rx_iov[c->rx_at];
            const std::size_t step = std::min(left, v.iov_len);
            v.iov_base = static_cast<std::uint8_t*>(v.iov_base) + step;
            v.iov_len -= step;
            left -= step;
            if (v.iov_len == 0) ++c->rx_at;
          }
        }
        if (c->rx_left == 0) ok = on_payload_done(c);
        break;
    }
    if (!ok) return;
  }
  // All read for now, out of budget, or paused: the next wake must come for
  // the state the connection is in now.
  if (c->fd >= 0) set_lowat(c);
}

void TcpLane::Io::set_lowat(Conn* c) {
  // A payload's rest (bounded), else any byte: a header, a body, an answer.
  const int want = c->rx == Conn::Rx::kPayload && !c->closing
                       ? static_cast<int>(std::min(c->rx_left, kPayloadLowat))
                       : 1;
  if (want == c->lowat) return;
  if (setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) == 0) c->lowat = want;
}

void TcpLane::Io::refuse(Conn* c, std::atomic<std::uint64_t>& counter, const std::string& what) {
  counter.fetch_add(1, std::memory_order_relaxed);
  if (log_limit_.allow()) {
    log().warn("kvxfer tcp {}: {} (connection from {}); closing it", lane_.agent_name_, what,
               c->sender.empty() ? std::string("an unknown peer") : c->sender);
  }
}

bool TcpLane::Io::on_header(Conn* c) {
  c->head_have = 0;
  lane_.counters_->frames_received.fetch_add(1, std::memory_order_relaxed);
  wire::FrameHeader h;
  if (!wire::decode_header(c->head, &h)) {
    refuse(c, c->hello_done ? lane_.counters_->refused_frame : lane_.counters_->refused_token,
           "a malformed frame header");
    close_conn(c, "it sent a malformed frame");
    return false;
  }
  if (!c->hello_done && h.type != wire::FrameType::kHello) {
    refuse(c, lane_.counters_->refused_token, "a connection whose first frame is not a hello");
    close_conn(c, "no hello");
    return false;
  }
  // What an initiator may receive, and what a target may.
  const bool for_initiator = h.type == wire::FrameType::kAck || h.type == wire::FrameType::kReadData;
  if (c->initiator != for_initiator || (c->hello_done && h.type == wire::FrameType::kHello) ||
      h.type == wire::FrameType::kWelcome) {
    refuse(c, lane_.counters_->refused_frame, "a frame of a type it may not send");
    close_conn(c, "unexpected frame");
    return false;
  }
  // A transfer's frames come together: after wire::kMore the same transfer's
  // next frame, after wire::kNotifyFollows its notification.
  if (!c->initiator) {
    if (c->cont && (h.seq != c->cont_seq || h.type != c->cont_type)) {
      refuse(c, lane_.counters_->refused_frame, "a frame that breaks off a transfer");
      close_conn(c, "broken transfer");
      return false;
    }
    c->cont = (h.flags & (wire::kMore | wire::kNotifyFollows)) != 0;
    c->cont_seq = h.seq;
    c->cont_type = (h.flags & wire::kNotifyFollows) != 0 ? wire::FrameType::kNotify : h.type;
  }
  c->h = h;
  const std::size_t len = body_len(h);
  if (len > 0) {
    c->body.resize(len);
    c->body_have = 0;
    c->rx = Conn::Rx::kBody;
    return true;
  }
  return on_body(c);
}

bool TcpLane::Io::on_body(Conn* c) {
  const wire::FrameHeader& h = c->h;
  c->rx = Conn::Rx::kHeader;
  auto& counters = *lane_.counters_;
  switch (h.type) {
    case wire::FrameType::kHello:
      return on_hello(c);
    case wire::FrameType::kWrite:
    case wire::FrameType::kReadReq: {
      if (!runs_fit(h, c->body, lane_.pool_len_)) {
        refuse(c, counters.refused_runs, "runs outside this pool");
        return answer_and_close(
            c, h.type == wire::FrameType::kWrite ? wire::FrameType::kAck : wire::FrameType::kReadData, h.seq,
            wire::kStatusRefused);
      }
      auto* base = static_cast<std::uint8_t*>(lane_.region_.base);
      const wire::RunList list{c->body};
      std::vector<iovec> pool;
      pool.reserve(list.run_count());
      for (std::size_t i = 0; i < list.run_count(); ++i) {
        const wire::Run r = list.run(i);
        pool.push_back(iovec{base + r.offset, r.length});
      }
      if (h.type == wire::FrameType::kReadReq) {
        // The reply goes from our pool; nothing more is read from this
        // connection until it is out.
        answer(c, wire::FrameType::kReadData, h.seq, wire::kStatusOk, h.length, std::move(pool));
        return c->fd >= 0;
      }
      c->rx_iov = std::move(pool);
      c->rx_at = 0;
      c->rx_left = h.length;
      c->rx_drain = false;
      c->rx = Conn::Rx::kPayload;
      return true;
    }
    case wire::FrameType::kNotify: {
      // Where the sender stands now (our owner may have registered or
      // removed peers since its hello).
      const Claim claim = lane_.claim_of(c->sender, c->key);
      if (claim == Claim::kImpostor) {
        refuse(c, counters.refused_identity,
               fmt::format("a notification under registered peer {}'s name from another key",
                           c->sender));
        return answer_and_close(c, wire::FrameType::kAck, h.seq, wire::kStatusNotYours);
      }
      const bool registered = claim == Claim::kRegistered;
      bool queued = false;
      {
        // A registered peer's share is its own; the others share
        // kMaxQueuedNotifications besides their own share each.
        std::lock_guard lock(lane_.notes_mu_);
        const auto sender = std::make_pair(c->sender, c->key);
        std::size_t& mine = lane_.notes_per_sender_[sender];
        if (mine < kMaxQueuedPerSender &&
            (registered || lane_.unregistered_notes_ < kMaxQueuedNotifications)) {
          ++mine;
          if (!registered) ++lane_.unregistered_notes_;
          lane_.notes_.push_back(Queued{Notification{c->sender, std::vector<std::uint8_t>(c->body)},
                                        c->key, registered});
          queued = true;
        } else if (mine == 0) {
          lane_.notes_per_sender_.erase(sender);
        }
      }
      if (!queued) {
        counters.refused_notify.fetch_add(1, std::memory_order_relaxed);
        if (log_limit_.allow()) {
          log().warn("kvxfer tcp {}: refused a notification from {}: its queue is full",
                     lane_.agent_name_, c->sender);
        }
      }
      answer(c, wire::FrameType::kAck, h.seq, queued ? wire::kStatusOk : wire::kStatusQueueFull);
      return c->fd >= 0;
    }
    case wire::FrameType::kAck: {
      if (c->awaiting.empty() || c->awaiting.front().part != SIZE_MAX ||
          c->awaiting.front().xfer->seq != h.seq) {
        refuse(c, counters.refused_frame, "an ack nobody waits for");
        close_conn(c, "unexpected ack");
        return false;
      }
      Xfer* x = c->awaiting.front().xfer;
      c->awaiting.pop_front();
      if (h.status != wire::kStatusOk) {
        finish(x, status_of(h.status), detail_of(h.status));
      } else if (std::none_of(c->awaiting.begin(), c->awaiting.end(),
                              [x](const Conn::Await& a) { return a.xfer == x; })) {
        finish(x, Status::kSuccess, nullptr);
      }
      unuse(x);
      return true;
    }
    case wire::FrameType::kReadData: {
      if (c->awaiting.empty() || c->awaiting.front().part == SIZE_MAX ||
          c->awaiting.front().xfer->seq != h.seq) {
        refuse(c, counters.refused_frame, "a read reply nobody waits for");
        close_conn(c, "unexpected reply");
        return false;
      }
      const Conn::Await a = c->awaiting.front();
      Xfer* x = a.xfer;
      const Xfer::Part& part = x->parts[a.part];
      if (h.status == wire::kStatusOk && h.length != part.bytes) {
        refuse(c, counters.refused_frame, "a read reply of the wrong length");
        close_conn(c, "bad reply length");
        return false;
      }
      if (h.status != wire::kStatusOk) {
        c->awaiting.pop_front();
        finish(x, status_of(h.status), detail_of(h.status));
        unuse(x);
        return true;
      }
      c->rx_xfer = x;
      c->rx_left = h.length;
      c->rx_at = 0;
      // A read that ended or was released takes no more bytes into our pool.
      c->rx_drain = x->released.load(std::memory_order_acquire) ||
                    x->result.load(std::memory_order_acquire) != Status::kInProgress;
      if (!c->rx_drain) {
        c->rx_iov.assign(
            x->read_iov.begin() + static_cast<std::ptrdiff_t>(part.first),
            x->read_iov.begin() + static_cast<std::ptrdiff_t>(part.first + part.count));
      }
      c->rx = Conn::Rx::kPayload;
      return true;
    }
    default:
      close_conn(c, "unexpected frame");
      return false;
  }
}

bool TcpLane::Io::on_payload_done(Conn* c) {
  c->rx = Conn::Rx::kHeader;
  if (!c->initiator) {
    // A write's bytes are in place: ack its last frame.
    if ((c->h.flags & (wire::kMore | wire::kNotifyFollows)) == 0)
      answer(c, wire::FrameType::kAck, c->h.seq, wire::kStatusOk);
    return c->fd >= 0;
  }
  Xfer* x = c->rx_xfer;
  c->rx_xfer = nullptr;
  c->awaiting.pop_front();
  if (std::none_of(c->awaiting.begin(), c->awaiting.end(),
                   [x](const Conn::Await& a) { return a.xfer == x; })) {
    finish(x, Status::kSuccess, nullptr);
  }
  unuse(x);
  return true;
}

bool TcpLane::Io::on_hello(Conn* c) {
  wire::Hello hello;
  auto& counters = *lane_.counters_;
  if (!wire::decode_hello_body(c->body, c->h.count, &hello) || hello.token != lane_.token_) {
    refuse(c, counters.refused_token, "a hello without this lane's token");
    close_conn(c, "wrong token");
    return false;
  }
  // The MAC proves the hello's key: whoever sent it holds the private half.
  IdentityKey conn_key{};
  Mac expected{};
  if (!lane_.identity_.connection_key(hello.key, /*we_initiate=*/false, &conn_key) ||
      !mac_of(conn_key, wire::hello_signed_part(c->body), &expected) || !same_mac(expected, hello.mac)) {
    refuse(c, counters.refused_identity, "a hello whose MAC does not prove its key");
    return refuse_hello(c, wire::kStatusUnproven);
  }
  std::string name(hello.name);
  const Claim claim = lane_.claim_of(name, hello.key);
  if (claim == Claim::kImpostor) {
    refuse(c, counters.refused_identity,
           fmt::format("a hello presenting registered peer {}'s name with another key", name));
    return refuse_hello(c, wire::kStatusNotYours);
  }
  const bool registered = claim == Claim::kRegistered;
  if (!registered && unregistered_conns_ >= kMaxUnregisteredConnections) {
    refuse(c, counters.refused_full,
           "a connection of no registered peer while their share is full");
    return refuse_hello(c, wire::kStatusTableFull);
  }
  auto it = fences_.find(hello.lineage);
  if (it == fences_.end()) {
    // Full means refusal, never forgetting; a registered peer still has
    // room of its own (a few lineages per key).
    const std::size_t of_key = lineages_per_key_[hello.key];
    if (fences_.size() >= kMaxLineages && !(registered && of_key < kMaxLineagesPerPeer)) {
      if (of_key == 0) lineages_per_key_.erase(hello.key);
      refuse(c, counters.refused_full, "a new initiator while the fence table is full");
      return refuse_hello(c, wire::kStatusTableFull);
    }
    ++lineages_per_key_[hello.key];
    it = fences_.emplace(hello.lineage, Lineage{hello.gen, hello.epoch, hello.key, {}, {}}).first;
  }
  Lineage& f = it->second;
  if (f.key != hello.key) {
    refuse(c, counters.refused_identity, "a hello of another identity's lineage");
    return refuse_hello(c, wire::kStatusNotYours);
  }
  if (hello.gen < f.gen || (hello.gen == f.gen && hello.epoch != f.epoch)) {
    refuse(c, counters.refused_stale_fence, "a hello of a registration already replaced");
    return refuse_hello(c, wire::kStatusStaleFence);
  }
  if (hello.gen == f.gen && f.conns.size() >= kMaxConnectionsPerLineage) {
    refuse(c, counters.refused_full, "one connection too many for one registration");
    return refuse_hello(c, wire::kStatusTableFull);
  }
  if (hello.gen > f.gen) {
    // A newer registration: the older connections go, with whatever they
    // still hold, before anything of the new one is read.
    const std::vector<Conn*> older = f.conns;
    for (Conn* o : older) {
      counters.fences_superseded.fetch_add(1, std::memory_order_relaxed);
      close_conn(o, "a newer registration of its initiator replaced it");
    }
    f.gen = hello.gen;
    f.epoch = hello.epoch;
  }
  f.conns.push_back(c);
  c->hello_done = true;
  --pending_hellos_;
  c->lineage = hello.lineage;
  c->gen = hello.gen;
  c->sender = std::move(name);
  c->key = hello.key;
  if (!registered) {
    c->counted_unregistered = true;
    ++unregistered_conns_;
  }
  answer(c, wire::FrameType::kWelcome, 0, wire::kStatusOk);
  return c->fd >= 0;
}

// A hello that carried our token, refused: the initiator learns why (a
// welcome with that status), then the connection ends as after any
// refusal (begin_closing). It holds no state meanwhile: no lineage, no
// name, and it no longer counts as waiting for its hello.
bool TcpLane::Io::refuse_hello(Conn* c, std::uint32_t status) {
  c->hello_done = true;
  --pending_hellos_;
  return answer_and_close(c, wire::FrameType::kWelcome, 0, status);
}

// A refusal's answer: nothing more is read as frames, and once the answer
// is out the connection ends in order (send(), begin_closing). False, for
// the frame handlers to return.
bool TcpLane::Io::answer_and_close(Conn* c, wire::FrameType type, std::uint64_t seq,
                                   std::uint32_t status) {
  c->close_after_out = true;
  c->paused = true;
  answer(c, type, seq, status);
  return false;
}

void TcpLane::Io::answer(Conn* c, wire::FrameType type, std::uint64_t seq, std::uint32_t status,
                         std::uint64_t length, std::vector<iovec> pool) {
  Conn::Out o;
  wire::encode_header(o.answer.data(), wire::FrameHeader{type, 0, 0, status, seq, length});
  o.reply = !pool.empty();
  o.own.reserve(pool.size() + 1);
  c->out.push_back(std::move(o));
  Conn::Out& q = c->out.back();
  q.own.push_back(iovec{q.answer.data(), wire::kHeaderLen});
  q.own.insert(q.own.end(), pool.begin(), pool.end());
  if (q.reply || c->out.size() >= kMaxQueuedAnswers) c->paused = true;
  send(c);
}

void TcpLane::Io::send(Conn* c) {
  while (c->fd >= 0 && !c->out.empty()) {
    // Gather the queued entries' iovecs into one sendmsg.
    scratch_iov_.clear();
    for (const Conn::Out& o : c->out) {
      const std::vector<iovec>& v = o.xfer != nullptr ? o.xfer->iov : o.own;
      for (std::size_t i = o.at; i < v.size() && scratch_iov_.size() < kIovMax; ++i) {
        scratch_iov_.push_back(v[i]);
      }
      if (scratch_iov_.size() >= kIovMax) break;
    }
    msghdr msg{};
    msg.msg_iov = scratch_iov_.data();
    msg.msg_iovlen = scratch_iov_.size();
    const ssize_t n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      close_conn(c, "sending failed");
      return;
    }
    lane_.counters_->bytes_sent.fetch_add(static_cast<std::uint64_t>(n), std::memory_order_relaxed);
    auto left = static_cast<std::size_t>(n);
    while (!c->out.empty()) {
      Conn::Out& o = c->out.front();
      std::vector<iovec>& v = o.xfer != nullptr ? o.xfer->iov : o.own;
      while (o.at < v.size() && left >= v[o.at].iov_len) {
        left -= v[o.at].iov_len;
        ++o.at;
      }
      if (o.at < v.size()) {
        v[o.at].iov_base = static_cast<std::uint8_t*>(v[o.at].iov_base) + left;
        v[o.at].iov_len -= left;
        left = 0;
        break;
      }
      Xfer* x = o.xfer;
      c->out.pop_front();
      if (x != nullptr) unuse(x);
    }
  }
  if (c->fd < 0) return;
  if (c->out.empty() && c->close_after_out) {
    begin_closing(c);
    return;
  }
  rearm(c);
}

// A reset now could discard the refusal still in our socket's send queue
// (off loopback it may not have reached the peer yet), and would make the
// peer's kernel drop what it had not read of it. So: FIN after the last
// answer, then read and drop whatever the peer still sends until it closes
// (kClosingGrace at most: expire()). Nothing it sends is looked at.
void TcpLane::Io::begin_closing(Conn* c) {
  c->close_after_out = false;
  c->closing = true;
  c->closing_deadline = Clock::now() + kClosingGrace;
  c->paused = false;
  c->waiting_out = false;
  if (shutdown(c->fd, SHUT_WR) != 0) {
    close_conn(c, "refused");
    return;
  }
  set_lowat(c);  // every byte it still sends wakes us, to be dropped
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = c;
  epoll_ctl(lane_.epoll_fd_, EPOLL_CTL_MOD, c->fd, &ev);
}

// Arms EPOLLOUT while something waits to go out, and EPOLLIN unless the
// connection is paused; a paused target connection resumes once its
// answers are out.
void TcpLane::Io::rearm(Conn* c) {
  const bool was_paused = c->paused;
  if (c->paused && c->out.empty() && !c->close_after_out) c->paused = false;
  const bool want_out = !c->out.empty();
  if (want_out == c->waiting_out && was_paused == c->paused) return;
  epoll_event ev{};
  ev.events = (c->paused ? 0u : static_cast<std::uint32_t>(EPOLLIN)) |
              (want_out ? static_cast<std::uint32_t>(EPOLLOUT) : 0u);
  ev.data.ptr = c;
  epoll_ctl(lane_.epoll_fd_, EPOLL_CTL_MOD, c->fd, &ev);
  c->waiting_out = want_out;
  // Cleared before run() looks for queued commands again, so a post that
  // saw it set is drained on this turn (run()).
  if (c->peer != nullptr) c->peer->sending.store(want_out, std::memory_order_seq_cst);
  // Resumed: EPOLLIN is level-triggered, so bytes already waiting in the
  // socket are reported on the next turn.
}

void TcpLane::Io::close_conn(Conn* c, const char* why, Status status) {
  if (c->fd < 0) return;
  epoll_ctl(lane_.epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  // RST rather than FIN: a peer learns at once, and nothing queued on
  // either side is delivered later.
  linger lin{1, 0};
  setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lin, sizeof lin);
  close(c->fd);
  c->fd = -1;
  if (!c->hello_done) --pending_hellos_;
  if (c->counted_unregistered) {
    c->counted_unregistered = false;
    --unregistered_conns_;
  }
  if (c->lineage != 0) {
    auto it = fences_.find(c->lineage);
    if (it != fences_.end()) {
      auto& v = it->second.conns;
      v.erase(std::remove(v.begin(), v.end(), c), v.end());
      if (v.empty()) it->second.idle_since = Clock::now();
    }
  }
  if (c->peer) {
    c->peer->dead.store(true, std::memory_order_release);
    c->peer->sending.store(false, std::memory_order_seq_cst);
  }
  // Everything still queued or awaited on this connection fails.
  std::deque<Conn::Out> out;
  out.swap(c->out);
  std::deque<Conn::Await> awaiting;
  awaiting.swap(c->awaiting);
  const char* detail = why;
  for (Conn::Out& o : out) {
    if (o.xfer == nullptr) continue;
    finish(o.xfer, status, detail);
    unuse(o.xfer);
  }
  for (Conn::Await& a : awaiting) {
    finish(a.xfer, status, detail);
    unuse(a.xfer);
  }
}

void TcpLane::Io::expire() {
  const auto now = Clock::now();
  std::vector<Conn*> late;
  for (auto& [c, conn] : conns_) {
    if (!conn->hello_done && conn->fd >= 0 && now > conn->hello_deadline) late.push_back(c);
  }
  for (Conn* c : late) {
    refuse(c, lane_.counters_->refused_token, "a connection that sent no hello in time");
    close_conn(c, "no hello in time");
    conns_.erase(c);
  }
  late.clear();
  for (auto& [c, conn] : conns_) {
    if (conn->closing && conn->fd >= 0 && now > conn->closing_deadline) late.push_back(c);
  }
  for (Conn* c : late) {
    close_conn(c, "refused, and the peer did not close within the grace");
    conns_.erase(c);
  }
  for (auto it = fences_.begin(); it != fences_.end();) {
    if (it->second.conns.empty() && now - it->second.idle_since > kLineageLinger) {
      auto k = lineages_per_key_.find(it->second.key);
      if (k != lineages_per_key_.end() && --k->second == 0) lineages_per_key_.erase(k);
      it = fences_.erase(it);
    } else {
      ++it;
    }
  }
}

void TcpLane::Io::close_all() {
  for (auto& [c, conn] : conns_) close_conn(c, "the transport is closing");
  conns_.clear();
  // Transfers posted but never taken by the thread.
  std::vector<Command> commands;
  {
    std::lock_guard lock(lane_.commands_mu_);
    commands.swap(lane_.commands_);
  }
  for (Command& cmd : commands) {
    if (cmd.kind == Command::Kind::kPost) {
      finish(cmd.xfer, Status::kRemoteDisconnect, "the transport is closing");
    } else if (cmd.kind == Command::Kind::kAdopt) {
      close(cmd.fd);
      cmd.done->set_value();
    } else if (cmd.done != nullptr) {
      cmd.done->set_value();
    }
  }
}

}  // namespace kvxfer::internal::tcp
