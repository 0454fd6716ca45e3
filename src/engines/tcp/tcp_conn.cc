// SPDX-License-Identifier: Apache-2.0
// Moving a connection's bytes, on the I/O thread (tcp_conn.h): receive into
// the frame state machine (payload straight into the pool), send with
// sendmsg, arm epoll, shut down after a refusal, reset. What the frames mean
// is the connection's Role's; this room touches its connections only.
#include "engines/tcp/tcp_conn.h"

#include <fmt/format.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <utility>

#include "common/log.h"
#include "engines/tcp/tcp_lane.h"

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

Conns::Conns(int epoll_fd, const std::string& agent_name, Counters& counters)
    : epoll_fd_(epoll_fd), agent_name_(agent_name), counters_(counters) {}

Conn* Conns::add(std::unique_ptr<Conn> conn) {
  Conn* c = conn.get();
  table_.emplace(c, std::move(conn));
  watch(*c, EPOLLIN, EPOLL_CTL_ADD);
  return c;
}

void Conns::watch(Conn& c, std::uint32_t events, int op) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = &c;
  epoll_ctl(epoll_fd_, op, c.fd, &ev);
}

void Conns::on_ready(Conn* c, std::uint32_t events) {
  if ((events & EPOLLOUT) != 0) send(*c);
  if (c->fd >= 0 && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0 && !c->paused) receive(*c);
  if (c->fd < 0) drop(c);
}

void Conns::receive(Conn& c) {
  if (c.closing) {
    drop_input(c);
    return;
  }
  std::uint64_t budget = kTurnBytes;
  while (c.fd >= 0 && !c.paused && budget > 0) {
    const ssize_t n = receive_some(c);
    if (n == 0) {
      close(c, "the peer closed the connection");
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      close(c, "the connection failed");
      return;
    }
    const auto got = static_cast<std::size_t>(n);
    budget -= std::min<std::uint64_t>(budget, got);
    bump(counters_.bytes_received, got);
    if (!took(c, got)) return;
  }
  // All read for now, out of budget, or paused: the next wake must come for
  // the state the connection is in now.
  if (c.fd >= 0) set_lowat(c);
}

// A refused connection, shut down on our side: what the peer still sends is
// read and dropped, unlooked at, until it closes (begin_closing).
void Conns::drop_input(Conn& c) {
  std::uint64_t budget = kTurnBytes;
  while (budget > 0) {
    const ssize_t n = recv(c.fd, drain_buf_.data(), drain_buf_.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      close(c, "refused");
      return;
    }
    budget -= std::min<std::uint64_t>(budget, static_cast<std::uint64_t>(n));
  }
}

// One recv or readv into what the connection receives now.
ssize_t Conns::receive_some(Conn& c) {
  switch (c.rx) {
    case Conn::Rx::kHeader:
      return recv(c.fd, c.head.data() + c.head_have, wire::kHeaderLen - c.head_have, 0);
    case Conn::Rx::kBody:
      return recv(c.fd, c.body.data() + c.body_have, c.body.size() - c.body_have, 0);
    case Conn::Rx::kPayload:
      break;
  }
  if (c.rx_drain) {
    return recv(c.fd, drain_buf_.data(), std::min<std::uint64_t>(c.rx_left, drain_buf_.size()), 0);
  }
  const std::size_t count = std::min(c.rx_iov.size() - c.rx_at, kIovMax);
  return readv(c.fd, c.rx_iov.data() + c.rx_at, static_cast<int>(count));
}

// `got` bytes arrived: a frame's part may be complete.
bool Conns::took(Conn& c, std::size_t got) {
  switch (c.rx) {
    case Conn::Rx::kHeader:
      c.head_have += got;
      return c.head_have < wire::kHeaderLen || on_header(c);
    case Conn::Rx::kBody:
      c.body_have += got;
      return c.body_have < c.body.size() || on_body(c);
    case Conn::Rx::kPayload:
      break;
  }
  c.rx_left -= got;
  for (std::size_t left = c.rx_drain ? 0 : got; left > 0;) {
    iovec& v = c.rx_iov[c.rx_at];
    const std::size_t step = std::min(left, v.iov_len);
    v.iov_base = static_cast<std::uint8_t*>(v.iov_base) + step;
    v.iov_len -= step;
    left -= step;
    if (v.iov_len == 0) ++c.rx_at;
  }
  if (c.rx_left > 0) return true;
  c.rx = Conn::Rx::kHeader;
  return c.role.on_payload(c);
}

bool Conns::on_header(Conn& c) {
  c.head_have = 0;
  bump(counters_.frames_received);
  wire::FrameHeader h;
  if (!c.role.on_header(c, &h)) return false;
  c.h = h;
  const std::size_t len = wire::body_len(h);
  if (len == 0) return on_body(c);
  c.body.resize(len);
  c.body_have = 0;
  c.rx = Conn::Rx::kBody;
  return true;
}

bool Conns::on_body(Conn& c) {
  c.rx = Conn::Rx::kHeader;
  return c.role.on_body(c);
}

void Conns::set_lowat(Conn& c) {
  // A payload's rest (bounded), else any byte: a header, a body, an answer.
  const int want = c.rx == Conn::Rx::kPayload && !c.closing
                       ? static_cast<int>(std::min(c.rx_left, kPayloadLowat))
                       : 1;
  if (want == c.lowat) return;
  if (setsockopt(c.fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) == 0) c.lowat = want;
}

void Conns::send(Conn& c) {
  while (c.fd >= 0 && !c.out.empty()) {
    gather(c);
    msghdr msg{};
    msg.msg_iov = scratch_iov_.data();
    msg.msg_iovlen = scratch_iov_.size();
    const ssize_t n = sendmsg(c.fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      close(c, "sending failed");
      return;
    }
    bump(counters_.bytes_sent, static_cast<std::uint64_t>(n));
    sent(c, static_cast<std::size_t>(n));
  }
  if (c.fd < 0) return;
  if (c.out.empty() && c.close_after_out) {
    begin_closing(c);
    return;
  }
  rearm(c);
}

// The queued entries' iovecs, into one sendmsg's worth.
void Conns::gather(const Conn& c) {
  scratch_iov_.clear();
  for (const Conn::Out& o : c.out) {
    const std::vector<iovec>& v = o.xfer != nullptr ? o.xfer->iov : o.own;
    for (std::size_t i = o.at; i < v.size() && scratch_iov_.size() < kIovMax; ++i) {
      scratch_iov_.push_back(v[i]);
    }
    if (scratch_iov_.size() >= kIovMax) break;
  }
}

// `bytes` went out: advances the entries' iovecs, lets go of the sent ones.
void Conns::sent(Conn& c, std::size_t bytes) {
  std::size_t left = bytes;
  while (!c.out.empty()) {
    Conn::Out& o = c.out.front();
    std::vector<iovec>& v = o.xfer != nullptr ? o.xfer->iov : o.own;
    while (o.at < v.size() && left >= v[o.at].iov_len) {
      left -= v[o.at].iov_len;
      ++o.at;
    }
    if (o.at < v.size()) {
      v[o.at].iov_base = static_cast<std::uint8_t*>(v[o.at].iov_base) + left;
      v[o.at].iov_len -= left;
      return;
    }
    Xfer* x = o.xfer;
    c.out.pop_front();
    if (x != nullptr) c.role.on_sent(*x);
  }
}

void Conns::want_send(Conn& c) {
  if (c.listed) return;
  c.listed = true;
  ready_.push_back(&c);
}

void Conns::send_ready() {
  // Send what the posts queued now rather than wait for EPOLLOUT.
  for (Conn* c : ready_) {
    c->listed = false;
    if (c->fd >= 0 && !c->out.empty() && !c->waiting_out) send(*c);
  }
  ready_.clear();
}

// A reset now could discard the refusal still in our socket's send queue
// (off loopback it may not have reached the peer yet), and would make the
// peer's kernel drop what it had not read of it. So: FIN after the last
// answer, then read and drop whatever the peer still sends until it closes
// (TcpLane::kClosingGrace at most: Target::expire()).
void Conns::begin_closing(Conn& c) {
  c.close_after_out = false;
  c.closing = true;
  c.closing_deadline = Clock::now() + TcpLane::kClosingGrace;
  c.closing_at = closing_.insert(closing_.end(), &c);
  c.paused = false;
  c.waiting_out = false;
  if (shutdown(c.fd, SHUT_WR) != 0) {
    close(c, "refused");
    return;
  }
  set_lowat(c);  // every byte it still sends wakes us, to be dropped
  watch(c, EPOLLIN, EPOLL_CTL_MOD);
}

// Arms EPOLLOUT while something waits to go out, and EPOLLIN unless the
// connection is paused; a paused target connection resumes once its
// answers are out.
void Conns::rearm(Conn& c) {
  const bool was_paused = c.paused;
  if (c.paused && c.out.empty() && !c.close_after_out) c.paused = false;
  const bool want_out = !c.out.empty();
  if (want_out == c.waiting_out && was_paused == c.paused) return;
  watch(c,
        (c.paused ? 0u : static_cast<std::uint32_t>(EPOLLIN)) |
            (want_out ? static_cast<std::uint32_t>(EPOLLOUT) : 0u),
        EPOLL_CTL_MOD);
  c.waiting_out = want_out;
  // Cleared before run() looks for queued commands again, so a post that
  // saw it set is taken on this turn (Io::run()).
  if (c.sending != nullptr) c.sending->store(want_out, std::memory_order_seq_cst);
  // Resumed: EPOLLIN is level-triggered, so bytes already waiting in the
  // socket are reported on the next turn.
}

void Conns::close(Conn& c, const char* why, Status status) {
  if (c.fd < 0) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  // RST rather than FIN: a peer learns at once, and nothing queued on
  // either side is delivered later.
  linger lin{1, 0};
  setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &lin, sizeof lin);
  ::close(c.fd);
  c.fd = -1;
  if (c.closing) closing_.erase(c.closing_at);
  closed_.push_back(&c);
  c.role.on_close(c, why, status);
  c.out.clear();
}

void Conns::reap() {
  for (Conn* c : closed_) table_.erase(c);
  closed_.clear();
}

void Conns::drop(Conn* c) {
  std::erase(closed_, c);
  if (c->listed) std::erase(ready_, c);
  table_.erase(c);
}

void Conns::close_all(const char* why) {
  for (auto& [c, conn] : table_) close(*c, why);
  table_.clear();
  closed_.clear();
  ready_.clear();
}

void Conns::expire_closing(Clock::time_point now) {
  while (!closing_.empty() && now > closing_.front()->closing_deadline) {
    Conn* c = closing_.front();
    close(*c, "refused, and the peer did not close within the grace");
    drop(c);
  }
}

void Conns::refuse(std::atomic<std::uint64_t>& counter, const std::string& who,
                   const std::string& what) {
  bump(counter);
  if (log_limit_.allow()) {
    log().warn("kvxfer tcp {}: {} (connection from {}); closing it", agent_name_, what,
               who.empty() ? std::string("an unknown peer") : who);
  }
}

}  // namespace kvxfer::internal::tcp
