// SPDX-License-Identifier: Apache-2.0
// The answers an initiator receives, on the tcp lane's I/O thread: acks
// and read replies, matched against what its connection awaits, in order.
#include <algorithm>

#include "engines/tcp/tcp_io.h"

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
      return "the target refused the frame (runs outside its regions: unknown, removed, or past "
             "their end)";
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

// An ack: the oldest awaited answer must be this transfer's ack.
bool TcpLane::Io::on_ack(Conn* c) {
  const wire::FrameHeader& h = c->h;
  auto& counters = *lane_.counters_;
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

// A read reply's header: the oldest awaited answer must be this part of
// this read; its payload goes into our pool (or is dropped, for a read
// that ended).
bool TcpLane::Io::on_read_data(Conn* c) {
  const wire::FrameHeader& h = c->h;
  auto& counters = *lane_.counters_;
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
    c->rx_iov.assign(x->read_iov.begin() + static_cast<std::ptrdiff_t>(part.first),
                     x->read_iov.begin() + static_cast<std::ptrdiff_t>(part.first + part.count));
  }
  c->rx = Conn::Rx::kPayload;
  return true;
}

// A read reply's payload is in: the read ends with its last part.
bool TcpLane::Io::on_read_done(Conn* c) {
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

}  // namespace kvxfer::internal::tcp
