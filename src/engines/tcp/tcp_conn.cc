// SPDX-License-Identifier: Apache-2.0
// A connection's bytes, on the tcp lane's I/O thread: receiving (header,
// body, payload straight into the pool; a turn's byte budget; the socket's
// wake threshold), sending with sendmsg from the queued transfers and
// answers, and the orderly end of a refused connection.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>

#include "engines/tcp/tcp_io.h"

namespace kvxfer::internal::tcp {
namespace {

// Bytes one connection may receive per turn of the I/O loop before the
// others get theirs.
constexpr std::uint64_t kTurnBytes = std::uint64_t{8} << 20;
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

}  // namespace

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
  bool drained = false;  // all the socket (and OpenSSL) had is read
  while (c->fd >= 0 && !c->paused && budget > 0) {
    // An encrypted welcome went out (maybe in this very loop): TLS's
    // handshake before any frame.
    if (c->tls_handshaking && !tls_handshake(c)) return;
    const ssize_t n = read_next(c);
    if (n == 0) {
      close_conn(c, "the peer closed the connection");
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        drained = true;
        break;
      }
      close_conn(c, c->ssl ? "the connection failed (TLS: a record that does not decrypt, or "
                             "the socket failed)"
                           : "the connection failed");
      return;
    }
    const auto got = static_cast<std::size_t>(n);
    c->moved = now_;
    budget -= std::min<std::uint64_t>(budget, got);
    lane_.counters_->bytes_received.fetch_add(got, std::memory_order_relaxed);
    if (!took(c, got)) return;
  }
  // All read for now, out of budget, or paused: the next wake must come for
  // the state the connection is in now.
  if (c->fd < 0) return;
  set_lowat(c);
  if (c->ssl) {
    // Out of budget with records OpenSSL read ahead: epoll would not wake
    // us for them. (Paused: rearm() looks when it resumes.)
    if (!drained && !c->paused && tls_has_pending(c->ssl.get())) tls_ready(c);
    rearm(c);
  }
}

ssize_t TcpLane::Io::read_next(Conn* c) {
  switch (c->rx) {
    case Conn::Rx::kHeader:
      return read_some(c, c->head.data() + c->head_have, wire::kHeaderLen - c->head_have);
    case Conn::Rx::kBody:
      return read_some(c, c->body.data() + c->body_have, c->body.size() - c->body_have);
    case Conn::Rx::kPayload:
      break;
  }
  if (c->rx_drain) {
    return read_some(c, drain_buf_.data(), std::min<std::uint64_t>(c->rx_left, drain_buf_.size()));
  }
  const std::size_t count = std::min(c->rx_iov.size() - c->rx_at, kIovMax);
  return read_iov(c, c->rx_iov.data() + c->rx_at, count);
}

bool TcpLane::Io::took(Conn* c, std::size_t got) {
  switch (c->rx) {
    case Conn::Rx::kHeader:
      c->head_have += got;
      return c->head_have < wire::kHeaderLen || on_header(c);
    case Conn::Rx::kBody:
      c->body_have += got;
      return c->body_have < c->body.size() || on_body(c);
    case Conn::Rx::kPayload:
      break;
  }
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
  return c->rx_left > 0 || on_payload_done(c);
}

ssize_t TcpLane::Io::read_some(Conn* c, void* buf, std::size_t len) {
  if (!c->ssl) return recv(c->fd, buf, len, 0);
  TlsIo io;
  const long n = tls_read(c->ssl.get(), buf, len, &io);
  c->tls_rx_wants_write = io.want_other;
  if (n < 0) errno = io.failed ? EPROTO : EAGAIN;
  return n;
}

ssize_t TcpLane::Io::read_iov(Conn* c, const iovec* iov, std::size_t count) {
  if (!c->ssl) return readv(c->fd, iov, static_cast<int>(count));
  // OpenSSL hands out at most one record per call: into the first iovec
  // (every run is at least one byte), straight from its decryption.
  return read_some(c, iov[0].iov_base, iov[0].iov_len);
}

ssize_t TcpLane::Io::write_iov(Conn* c, const iovec* iov, std::size_t count) {
  if (!c->ssl) {
    msghdr msg{};
    msg.msg_iov = const_cast<iovec*>(iov);
    msg.msg_iovlen = count;
    return sendmsg(c->fd, &msg, MSG_NOSIGNAL);
  }
  TlsIo io;
  const long n = tls_writev(c->ssl.get(), std::span(iov, count), &io);
  c->tls_tx_wants_read = io.want_other;
  if (n < 0) errno = io.failed ? EPIPE : EAGAIN;
  return n;
}

bool TcpLane::Io::tls_handshake(Conn* c) {
  switch (tls_accept(c->ssl.get())) {
    case TlsStep::kDone:
      c->tls_handshaking = false;
      c->tls_rx_wants_write = false;
      c->moved = now_;
      return true;
    case TlsStep::kWantRead:
      c->tls_rx_wants_write = false;
      rearm(c);
      return false;
    case TlsStep::kWantWrite:
      c->tls_rx_wants_write = true;
      rearm(c);
      return false;
    case TlsStep::kFailed:
      break;
  }
  refuse(c, lane_.counters_->refused_tls,
         "a connection whose TLS handshake failed after its encrypted hello (cleartext, or not "
         "the key both ends derived): " +
             tls_error());
  close_conn(c, "its TLS handshake failed");
  return false;
}

void TcpLane::Io::tls_ready(Conn* c) {
  if (c->in_tls_ready) return;
  c->in_tls_ready = true;
  tls_ready_.push_back(c);
}

void TcpLane::Io::set_lowat(Conn* c) {
  // A payload's rest (bounded), else any byte: a header, a body, an answer.
  // Through TLS, less what OpenSSL may already hold of it (records read
  // ahead): the socket then has at least that much left to bring, since
  // records are never shorter than what they carry.
  std::uint64_t rest = c->rx == Conn::Rx::kPayload && !c->closing ? c->rx_left : 1;
  if (c->ssl) rest = rest > 2 * kTlsReadBuffer ? rest - 2 * kTlsReadBuffer : 1;
  const int want = static_cast<int>(std::clamp<std::uint64_t>(rest, 1, kPayloadLowat));
  if (want == c->lowat) return;
  if (setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) == 0) c->lowat = want;
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
    const ssize_t n = write_iov(c, scratch_iov_.data(), scratch_iov_.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      close_conn(c, "sending failed");
      return;
    }
    lane_.counters_->bytes_sent.fetch_add(static_cast<std::uint64_t>(n), std::memory_order_relaxed);
    c->moved = now_;
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
  if (c->ssl) {
    TlsIo io;
    c->tls_unflushed = !tls_flush(c->ssl.get(), &io);
    if (io.failed) {
      close_conn(c, "sending failed");
      return;
    }
  }
  if (c->out.empty() && c->close_after_out && !c->tls_unflushed) {
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
  if (closing_conns_ >= lane_.limits_.closing) {
    // As many refused connections wait to close as may: this one is reset
    // now, so refusals cannot take the room registered peers need.
    close_conn(c, "refused");
    return;
  }
  ++closing_conns_;
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
  c->armed = EPOLLIN;
}

// Arms EPOLLOUT while something waits to go out, and EPOLLIN unless the
// connection is paused; a paused target connection resumes once its
// answers are out.
void TcpLane::Io::rearm(Conn* c) {
  const bool resumed = c->paused && c->out.empty() && !c->close_after_out;
  if (resumed) c->paused = false;
  const bool want_out = !c->out.empty();
  const std::uint32_t events =
      (c->paused && !c->tls_tx_wants_read ? 0u : static_cast<std::uint32_t>(EPOLLIN)) |
      (want_out || c->tls_rx_wants_write || c->tls_unflushed ? static_cast<std::uint32_t>(EPOLLOUT)
                                                             : 0u);
  if (events != c->armed) {
    epoll_event ev{};
    ev.events = events;
    ev.data.ptr = c;
    epoll_ctl(lane_.epoll_fd_, EPOLL_CTL_MOD, c->fd, &ev);
    c->armed = events;
  }
  if (want_out != c->waiting_out) {
    c->waiting_out = want_out;
    // Cleared before run() looks for queued commands again, so a post that
    // saw it set is drained on this turn (run()).
    if (c->peer != nullptr) c->peer->sending.store(want_out, std::memory_order_seq_cst);
  }
  // Resumed: EPOLLIN is level-triggered, so bytes already waiting in the
  // socket are reported on the next turn; those OpenSSL holds are not.
  if (resumed && c->ssl && !c->tls_handshaking && tls_has_pending(c->ssl.get())) tls_ready(c);
}

}  // namespace kvxfer::internal::tcp
