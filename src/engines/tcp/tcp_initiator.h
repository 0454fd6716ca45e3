// SPDX-License-Identifier: Apache-2.0
// The initiator's side of the tcp lane's connections, on the I/O thread:
// adopting a welcomed connection, queueing transfers on it, the acks and
// read replies that end them. Touches its connections (through Conns), the
// transfer handles, and hands them back through Commands.
#pragma once

#include <cstddef>
#include <memory>

#include "engines/tcp/tcp_commands.h"
#include "engines/tcp/tcp_conn.h"

namespace kvxfer::internal::tcp {

class Initiator final : public Role {
 public:
  Initiator(Conns& conns, Commands& commands, Counters& counters)
      : conns_(conns), commands_(commands), counters_(counters) {}

  // A connect()'s welcomed socket becomes peer's connection.
  void adopt(int fd, const std::shared_ptr<Peer>& peer);
  // Queues a post on its peer's connection, or ends it when that is gone.
  void post(Conn* conn, Xfer* x);
  // Our owner removed the peer: its connection closes, what it still holds
  // ends kCanceled.
  void remove(Conn* conn, const std::shared_ptr<Peer>& peer);
  // Ends a transfer (its first end counts), and lets go of it once nothing
  // names it.
  void finish(Xfer* x, Status status, const char* why);

  bool on_header(Conn& c, wire::FrameHeader* h) override;
  bool on_body(Conn& c) override;
  bool on_payload(Conn& c) override;
  void on_sent(Xfer& x) override { unuse(&x); }
  void on_close(Conn& c, const char* why, Status status) override;

 private:
  // `conn` when it is still one of ours, else nullptr.
  [[nodiscard]] InitiatorConn* ours(Conn* conn);
  void queue(InitiatorConn& c, Xfer* x);
  bool on_ack(InitiatorConn& c);
  bool on_read_data(InitiatorConn& c);
  void unuse(Xfer* x);

  Conns& conns_;
  Commands& commands_;
  Counters& counters_;
};

}  // namespace kvxfer::internal::tcp
