// SPDX-License-Identifier: Apache-2.0
// The initiator's side, on the I/O thread (tcp_initiator.h): a transfer is
// queued on its peer's connection with the answers it awaits, in order, and
// ends with the last of them, or with its connection. A frame a target may
// not send, or an answer nobody waits for, closes the connection.
#include "engines/tcp/tcp_initiator.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <utility>

namespace kvxfer::internal::tcp {
namespace {

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

bool awaits(const InitiatorConn& c, const Xfer* x) {
  return std::any_of(c.awaiting.begin(), c.awaiting.end(),
                     [x](const InitiatorConn::Await& a) { return a.xfer == x; });
}

}  // namespace

void Initiator::adopt(int fd, const std::shared_ptr<Peer>& peer) {
  auto conn = std::make_unique<InitiatorConn>(fd, *this);
  conn->peer = peer;
  conn->sending = &peer->sending;
  peer->conn = conns_.add(std::move(conn));
}

InitiatorConn* Initiator::ours(Conn* conn) {
  // A closed connection's address may have been reused, by either side's.
  if (!conns_.has(conn) || &conn->role != this) return nullptr;
  return static_cast<InitiatorConn*>(conn);
}

void Initiator::post(Conn* conn, Xfer* x) {
  InitiatorConn* c = ours(conn);
  // The connection must still be this peer's.
  if (c != nullptr && c->peer == x->peer) {
    queue(*c, x);
    conns_.want_send(*c);
  } else {
    x->io_ref = true;
    finish(x, Status::kRemoteDisconnect, "the connection to the peer is closed");
  }
}

void Initiator::remove(Conn* conn, const std::shared_ptr<Peer>& peer) {
  InitiatorConn* c = ours(conn);
  // Our own removal: what was still posted is cancelled.
  if (c != nullptr && c->peer == peer) conns_.close(*c, "the peer was removed", Status::kCanceled);
}

void Initiator::queue(InitiatorConn& c, Xfer* x) {
  Conn::Out o;
  o.xfer = x;
  c.out.push_back(std::move(o));
  ++x->io_uses;
  // The answers this transfer will get, in order.
  if (x->read) {
    for (std::size_t p = 0; p < x->parts.size(); ++p) c.awaiting.push_back({x, p});
    x->io_uses += static_cast<int>(x->parts.size());
  }
  if (!x->read || x->has_notify) {
    c.awaiting.push_back({x, SIZE_MAX});
    ++x->io_uses;
  }
}

void Initiator::finish(Xfer* x, Status status, const char* why) {
  if (x->result.load(std::memory_order_relaxed) == Status::kInProgress) {
    x->why = why;
    x->result.store(status, std::memory_order_release);
  }
  if (x->io_uses == 0 && x->io_ref) {
    x->io_ref = false;
    commands_.unref(x);
  }
}

void Initiator::unuse(Xfer* x) {
  --x->io_uses;
  if (x->io_uses == 0 && x->io_ref &&
      x->result.load(std::memory_order_relaxed) != Status::kInProgress) {
    x->io_ref = false;
    commands_.unref(x);
  }
}

bool Initiator::on_header(Conn& c, wire::FrameHeader* h) {
  if (!wire::decode_header(c.head, h)) {
    conns_.refuse(counters_.refused_frame, {}, "a malformed frame header");
    conns_.close(c, "it sent a malformed frame");
    return false;
  }
  // A target sends answers only.
  if (h->type != wire::FrameType::kAck && h->type != wire::FrameType::kReadData) {
    conns_.refuse(counters_.refused_frame, {}, "a frame of a type it may not send");
    conns_.close(c, "unexpected frame");
    return false;
  }
  return true;
}

bool Initiator::on_body(Conn& conn) {
  auto& c = static_cast<InitiatorConn&>(conn);
  switch (c.h.type) {
    case wire::FrameType::kAck:
      return on_ack(c);
    case wire::FrameType::kReadData:
      return on_read_data(c);
    default:
      conns_.close(c, "unexpected frame");
      return false;
  }
}

bool Initiator::on_ack(InitiatorConn& c) {
  const wire::FrameHeader& h = c.h;
  if (c.awaiting.empty() || c.awaiting.front().part != SIZE_MAX ||
      c.awaiting.front().xfer->seq != h.seq) {
    conns_.refuse(counters_.refused_frame, {}, "an ack nobody waits for");
    conns_.close(c, "unexpected ack");
    return false;
  }
  Xfer* x = c.awaiting.front().xfer;
  c.awaiting.pop_front();
  if (h.status != wire::kStatusOk) {
    finish(x, status_of(h.status), detail_of(h.status));
  } else if (!awaits(c, x)) {
    finish(x, Status::kSuccess, nullptr);
  }
  unuse(x);
  return true;
}

bool Initiator::on_read_data(InitiatorConn& c) {
  const wire::FrameHeader& h = c.h;
  if (c.awaiting.empty() || c.awaiting.front().part == SIZE_MAX ||
      c.awaiting.front().xfer->seq != h.seq) {
    conns_.refuse(counters_.refused_frame, {}, "a read reply nobody waits for");
    conns_.close(c, "unexpected reply");
    return false;
  }
  const InitiatorConn::Await a = c.awaiting.front();
  Xfer* x = a.xfer;
  const Xfer::Part& part = x->parts[a.part];
  if (h.status == wire::kStatusOk && h.length != part.bytes) {
    conns_.refuse(counters_.refused_frame, {}, "a read reply of the wrong length");
    conns_.close(c, "bad reply length");
    return false;
  }
  if (h.status != wire::kStatusOk) {
    c.awaiting.pop_front();
    finish(x, status_of(h.status), detail_of(h.status));
    unuse(x);
    return true;
  }
  c.rx_xfer = x;
  c.rx_left = h.length;
  c.rx_at = 0;
  // A read that ended or was released takes no more bytes into our pool.
  c.rx_drain = x->released.load(std::memory_order_acquire) ||
               x->result.load(std::memory_order_acquire) != Status::kInProgress;
  if (!c.rx_drain) {
    c.rx_iov.assign(x->read_iov.begin() + static_cast<std::ptrdiff_t>(part.first),
                    x->read_iov.begin() + static_cast<std::ptrdiff_t>(part.first + part.count));
  }
  c.rx = Conn::Rx::kPayload;
  return true;
}

// A read reply's payload is in (or was dropped).
bool Initiator::on_payload(Conn& conn) {
  auto& c = static_cast<InitiatorConn&>(conn);
  Xfer* x = c.rx_xfer;
  c.rx_xfer = nullptr;
  c.awaiting.pop_front();
  if (!awaits(c, x)) finish(x, Status::kSuccess, nullptr);
  unuse(x);
  return true;
}

void Initiator::on_close(Conn& conn, const char* why, Status status) {
  auto& c = static_cast<InitiatorConn&>(conn);
  c.peer->dead.store(true, std::memory_order_release);
  c.peer->sending.store(false, std::memory_order_seq_cst);
  // Everything still queued or awaited on this connection fails.
  std::deque<Conn::Out> out;
  out.swap(c.out);
  std::deque<InitiatorConn::Await> awaiting;
  awaiting.swap(c.awaiting);
  for (Conn::Out& o : out) {
    if (o.xfer == nullptr) continue;
    finish(o.xfer, status, why);
    unuse(o.xfer);
  }
  for (InitiatorConn::Await& a : awaiting) {
    finish(a.xfer, status, why);
    unuse(a.xfer);
  }
}

}  // namespace kvxfer::internal::tcp
