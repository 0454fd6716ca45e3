// SPDX-License-Identifier: Apache-2.0
// The tcp lane's I/O thread, its loop: waits on epoll, accepts, takes the
// callers' commands (adopt a connection, post a transfer, close), ends
// transfers and expires connections. Everything in TcpLane::Io is this
// thread's alone; it meets the callers' threads only in the command queue,
// the notification queue and the transfers' atomics. A connection's bytes
// are tcp_conn.cc, the frames a target receives tcp_target.cc, those an
// initiator receives tcp_initiator.cc.
#include "engines/tcp/tcp_io.h"

#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/log.h"
#include "engines/tcp/tcp_socket.h"

namespace kvxfer::internal::tcp {

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
      MutexLock lock(lane_.commands_mu_);
      queued = !lane_.commands_.empty();
    }
    const int n = epoll_wait(lane_.epoll_fd_, events.data(), static_cast<int>(events.size()),
                             queued || !tls_ready_.empty() ? 0 : (listener_resting_ ? 10 : 1000));
    now_ = Clock::now();
    for (int i = 0; i < n; ++i) {
      void* tag = events[static_cast<std::size_t>(i)].data.ptr;
      if (tag == &lane_.wake_fd_) {
        std::uint64_t count = 0;
        [[maybe_unused]] const ssize_t r = read(lane_.wake_fd_, &count, sizeof count);
      } else if (tag == &lane_.listen_fd_) {
        accept_all();
      } else {
        // A connection closed earlier in this batch is still allocated
        // (reap()); its fd is -1 and on_ready() does nothing with it.
        on_ready(static_cast<Conn*>(tag), events[static_cast<std::size_t>(i)].events);
      }
    }
    drain_commands();
    if (stopping_) return;
    if (!tls_ready_.empty()) {
      std::vector<Conn*> again;
      again.swap(tls_ready_);
      for (Conn* c : again) {
        c->in_tls_ready = false;
        if (c->fd >= 0 && !c->paused) receive(c);
      }
    }
    const auto now = now_;
    wake_listener(now);
    if (now >= next_expire_) {
      expire();
      next_expire_ = now + kExpireEvery;
    }
    reap();
  }
}

void TcpLane::Io::drain_commands() {
  // Swapped with the lane's queue, so both keep their capacity.
  std::vector<Command>& commands = drained_;
  lane_.wake_pending_.store(false, std::memory_order_release);
  {
    MutexLock lock(lane_.commands_mu_);
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
          // Our frames from number 0; the target's from 1 (connect()
          // checked its welcome).
          if (!c->tx_auth.start(cmd.keys->to_target) ||
              !c->rx_auth.start(cmd.keys->to_initiator, 1)) {
            close(cmd.fd);
            cmd.done->set_value();
            break;
          }
          c->ssl = std::move(cmd.ssl);
          conns_.emplace(c, std::move(conn));
          epoll_event ev{};
          ev.events = EPOLLIN;
          ev.data.ptr = c;
          epoll_ctl(lane_.epoll_fd_, EPOLL_CTL_ADD, c->fd, &ev);
          cmd.peer->conn = c;
          // Records its handshake read ahead are not the socket's to report.
          if (c->ssl && tls_has_pending(c->ssl.get())) tls_ready(c);
        }
        cmd.done->set_value();
        break;
      }
      case Command::Kind::kPost:
        // The connection must still be open and this peer's (a closed one's
        // address may have been reused).
        if (conns_.count(cmd.conn) != 0 && cmd.conn->fd >= 0 && cmd.conn->peer == cmd.xfer->peer) {
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
      case Command::Kind::kForgetRegion:
        forget_region(cmd.region);
        cmd.done->set_value();
        break;
    }
  }
  commands.clear();
  // Send what the posts queued now rather than wait for EPOLLOUT.
  for (Conn* c : ready_) {
    c->in_ready = false;
    if (c->fd >= 0 && !c->out.empty() && !c->waiting_out) send(c);
  }
  ready_.clear();
}

void TcpLane::Io::queue_transfer(Conn* c, Xfer* x) {
  // Each frame is tagged here, in the order the frames go out on this
  // connection (posts from several threads reach it in this order, not in
  // theirs). TcpLane::frame lays every frame's header and body out
  // together in x->wire, one iovec each; the others are the pool's.
  const std::uint8_t* const wire_begin = x->wire.data();
  const std::uint8_t* const wire_end = wire_begin + x->wire.size();
  for (const iovec& v : x->iov) {
    auto* at = static_cast<std::uint8_t*>(v.iov_base);
    if (at < wire_begin || at >= wire_end) continue;
    const std::span<std::uint8_t> frame(at, v.iov_len);
    const std::span<std::uint8_t, wire::kHeaderLen> head = frame.first<wire::kHeaderLen>();
    if (!c->tx_auth.sign(head.first<wire::kFieldsLen>(), frame.subspan(wire::kHeaderLen),
                         wire::tag_slot(head))) {
      close_conn(c, "OpenSSL could not tag a frame");
      finish(x, Status::kBackend, "OpenSSL could not tag a frame");
      return;
    }
  }
  Conn::Out o;
  o.xfer = x;
  c->out.push_back(std::move(o));
  ++x->io_uses;
  if (!c->in_ready) {
    c->in_ready = true;
    ready_.push_back(c);
  }
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
    if (fd < 0) {
      // Out of descriptors: the connection stays in the listener's queue,
      // which stays readable, so the listener rests instead of spinning.
      if (errno == EMFILE || errno == ENFILE) rest_listener(errno);
      return;
    }
    const std::size_t open = conns_.size() - closed_.size();
    if (stopping_ || open >= lane_.limits_.total) {
      lane_.counters_->refused_full.fetch_add(1, std::memory_order_relaxed);
      if (log_limit_.allow()) {
        log().warn(
            "kvxfer tcp {}: refused a connection: {} open (at most {}: half of "
            "RLIMIT_NOFILE, at most {}), {} without a hello yet",
            lane_.agent_name_, open, lane_.limits_.total, kMaxConnections, pending_hellos_);
      }
      close(fd);
      continue;
    }
    if (pending_hellos_ >= lane_.limits_.pending) {
      // The oldest connection still without a hello goes, not the new one:
      // silent connections cannot keep a peer that says hello at once out.
      // (It holds no state; reap() frees it at the end of this turn.)
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
    cap_send_buffer(fd);
    auto conn = std::make_unique<Conn>();
    Conn* c = conn.get();
    // Our challenge first, before anything is read: a fresh socket's send
    // buffer takes its 80 bytes at once, or the connection is not worth
    // keeping.
    Nonce nonce{};
    if (!fresh_nonce(&nonce)) {
      close(fd);
      continue;
    }
    wire::encode_challenge(c->challenge.data(), nonce);
    if (::send(fd, c->challenge.data(), c->challenge.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(c->challenge.size())) {
      close(fd);
      continue;
    }
    c->fd = fd;
    c->hello_deadline = now_ + kHelloTimeout;
    c->moved = now_;
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

void TcpLane::Io::rest_listener(int error) {
  lane_.counters_->refused_full.fetch_add(1, std::memory_order_relaxed);
  if (log_limit_.allow()) {
    rlimit r{};
    getrlimit(RLIMIT_NOFILE, &r);
    log().warn(
        "kvxfer tcp {}: cannot accept a connection: {} (this process: RLIMIT_NOFILE {}, "
        "{} connections open here); not accepting for {} ms",
        lane_.agent_name_, std::strerror(error), static_cast<std::uint64_t>(r.rlim_cur),
        conns_.size() - closed_.size(), kAcceptRest.count());
  }
  epoll_event ev{};
  ev.data.ptr = &lane_.listen_fd_;
  epoll_ctl(lane_.epoll_fd_, EPOLL_CTL_MOD, lane_.listen_fd_, &ev);
  listener_resting_ = true;
  listener_back_ = Clock::now() + kAcceptRest;
}

void TcpLane::Io::wake_listener(Clock::time_point now) {
  if (!listener_resting_ || now < listener_back_) return;
  listener_resting_ = false;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &lane_.listen_fd_;
  epoll_ctl(lane_.epoll_fd_, EPOLL_CTL_MOD, lane_.listen_fd_, &ev);
}

void TcpLane::Io::on_ready(Conn* c, std::uint32_t events) {
  // Through TLS a write may wait for the socket to be readable and a read
  // (the handshake's included) for it to be writable.
  const bool out = (events & EPOLLOUT) != 0;
  const bool in = (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0;
  if (c->fd >= 0 && (out || (in && c->tls_tx_wants_read))) send(c);
  if (c->fd >= 0 && !c->paused && (in || (out && c->tls_rx_wants_write))) receive(c);
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
  c->ssl.reset();
  closed_.push_back(c);
  if (c->in_tls_ready) {
    c->in_tls_ready = false;
    tls_ready_.erase(std::find(tls_ready_.begin(), tls_ready_.end(), c));
  }
  if (!c->hello_done) --pending_hellos_;
  if (c->closing) --closing_conns_;
  if (c->counted_unregistered) {
    c->counted_unregistered = false;
    --unregistered_conns_;
  }
  if (c->counted_key) {
    c->counted_key = false;
    const auto held = key_conns_.find(c->key);
    if (held != key_conns_.end() && --held->second == 0) key_conns_.erase(held);
  }
  if (c->lineage != 0) {
    if (auto* f = fences_.find(c->lineage)) {
      auto& v = f->extra;
      const auto at = std::find(v.begin(), v.end(), c);
      if (at != v.end()) {
        v.erase(at);
        fences_.release(*f, Clock::now());
      }
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
  const auto now = now_;
  std::vector<Conn*> late;
  std::vector<Conn*> stalled;
  for (auto& [c, conn] : conns_) {
    if (conn->fd < 0) continue;
    if ((!conn->hello_done || conn->tls_handshaking) && now > conn->hello_deadline) {
      late.push_back(c);
    } else if (conn->closing && now > conn->closing_deadline) {
      late.push_back(c);
    } else if (!conn->initiator && !conn->closing && now - conn->moved > lane_.stall_ &&
               (!conn->out.empty() || conn->rx != Conn::Rx::kHeader || conn->head_have > 0)) {
      stalled.push_back(c);
    }
  }
  for (Conn* c : late) {
    if (c->closing) {
      close_conn(c, "refused, and the peer did not close within the grace");
    } else if (c->tls_handshaking) {
      refuse(c, lane_.counters_->refused_tls, "a connection that did not finish its TLS handshake");
      close_conn(c, "no TLS handshake in time");
    } else {
      refuse(c, lane_.counters_->refused_token, "a connection that sent no hello in time");
      close_conn(c, "no hello in time");
    }
  }
  for (Conn* c : stalled) {
    refuse(c, lane_.counters_->refused_frame,
           c->out.empty() ? "a connection that stopped in the middle of a frame"
                          : "a connection that does not take the answers it asked for");
    close_conn(c, "stalled");
  }
  fences_.expire(now);
}

void TcpLane::Io::reap() {
  for (Conn* c : closed_) conns_.erase(c);
  closed_.clear();
}

void TcpLane::Io::close_all() {
  for (auto& [c, conn] : conns_) close_conn(c, "the transport is closing");
  closed_.clear();
  ready_.clear();
  conns_.clear();
  // Transfers posted but never taken by the thread.
  std::vector<Command> commands;
  {
    MutexLock lock(lane_.commands_mu_);
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
