// SPDX-License-Identifier: Apache-2.0
// The tcp lane's connections as its I/O thread holds them: what both sides
// share (the socket, the frame being received, what waits to go out), each
// side's own part, and Conns, the table that moves their bytes (tcp_conn.cc).
// What a frame means is the connection's Role: the target's (tcp_target.h)
// or the initiator's (tcp_initiator.h). The I/O thread's alone; no lock.
#pragma once

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/identity.h"
#include "engines/tcp/tcp_counters.h"
#include "engines/tcp/tcp_xfer.h"
#include "kvxfer/status.h"
#include "wire/tcp_frame.h"

namespace kvxfer::internal::tcp {

class Conn;

// One side of the protocol: what its frames mean, and what a connection's
// end undoes. The handlers return false once the connection closed or
// stopped reading (nothing more is read on this turn).
class Role {
 public:
  // The header in c.head arrived: decodes it into *h and checks that it may
  // come now, or refuses the connection.
  virtual bool on_header(Conn& c, wire::FrameHeader* h) = 0;
  // c.h and its body (c.body, body_len(c.h) bytes) arrived.
  virtual bool on_body(Conn& c) = 0;
  // The payload c.h announced is in c.rx_iov (or was dropped: c.rx_drain).
  virtual bool on_payload(Conn& c) = 0;
  // The last byte of a queued transfer's frames went out.
  virtual void on_sent(Xfer& x) = 0;
  // The socket of `c` is closed; what it still holds ends `status`.
  virtual void on_close(Conn& c, const char* why, Status status) = 0;

 protected:
  ~Role() = default;
};

class Conn {
 public:
  Conn(int fd_in, Role& role_in) : fd(fd_in), role(role_in) {}
  virtual ~Conn() = default;
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  int fd = -1;  // -1 once closed
  Role& role;

  // Receiving.
  enum class Rx { kHeader, kBody, kPayload };
  Rx rx = Rx::kHeader;
  std::array<std::uint8_t, wire::kHeaderLen> head{};
  std::size_t head_have = 0;
  wire::FrameHeader h;
  std::vector<std::uint8_t> body;
  std::size_t body_have = 0;
  std::vector<iovec> rx_iov;
  std::size_t rx_at = 0;
  std::uint64_t rx_left = 0;
  bool rx_drain = false;  // receiving bytes nobody wants (a released read)
  int lowat = 1;          // the socket's SO_RCVLOWAT (Conns::set_lowat)

  // Sending: transfers (initiator) or answers (target), oldest first. An
  // entry's iovecs are advanced in place as bytes go out.
  struct Out {
    Xfer* xfer = nullptr;
    std::array<std::uint8_t, wire::kHeaderLen> answer{};
    std::vector<iovec> own;  // an answer's iovecs (its header, a reply's pool bytes)
    std::size_t at = 0;      // first iovec not fully sent
    bool reply = false;      // a read's reply (the target reads nothing while it goes)
  };
  std::deque<Out> out;
  bool waiting_out = false;  // EPOLLOUT armed
  bool paused = false;       // target: not reading (answers queued)
  bool close_after_out = false;
  // Target: the last answer (a refusal) is out and our side is shut down
  // for writing; what the peer still sends is read and dropped until it
  // closes too, or until closing_deadline, so the refusal reaches it
  // before any reset (Conns::begin_closing).
  bool closing = false;
  Clock::time_point closing_deadline{};
  std::list<Conn*>::iterator closing_at;  // in Conns' closing list
  // Initiator: the peer's flag that tells posts we come back on our own
  // (Peer::sending), kept equal to waiting_out.
  std::atomic<bool>* sending = nullptr;
  bool listed = false;  // in Conns' ready list
};

// A connection a peer opened to us: its hello, and what the next frame must
// continue.
class TargetConn final : public Conn {
 public:
  using Conn::Conn;
  bool hello_done = false;
  Clock::time_point hello_deadline{};
  std::list<TargetConn*>::iterator waiting_at;  // in Target's list, until hello_done
  std::uint64_t lineage = 0;
  std::uint64_t gen = 0;
  std::string sender;
  IdentityKey key{};                  // the identity key its hello proved
  bool counted_unregistered = false;  // in Target::unregistered_conns_
  // What the next frame must continue (a transfer's wire::kMore or
  // wire::kNotifyFollows): its seq and type, or none.
  std::uint64_t cont_seq = 0;
  wire::FrameType cont_type = wire::FrameType::kHello;
  bool cont = false;
};

// A connection we opened to a peer: the answers we wait for.
class InitiatorConn final : public Conn {
 public:
  using Conn::Conn;
  std::shared_ptr<Peer> peer;
  struct Await {
    Xfer* xfer = nullptr;
    std::size_t part = 0;  // a read's reply part; SIZE_MAX: an ack
  };
  std::deque<Await> awaiting;
  Xfer* rx_xfer = nullptr;  // the read whose reply is arriving
};

// Every connection of the lane, and the moving of their bytes: receiving
// frames into the state machine their Role drives, sending what waits,
// epoll interest, closing. Connections are erased only here.
class Conns {
 public:
  Conns(int epoll_fd, const std::string& agent_name, Counters& counters);

  // Takes a new connection and waits for its bytes.
  Conn* add(std::unique_ptr<Conn> conn);
  [[nodiscard]] bool has(Conn* c) const { return table_.count(c) != 0; }
  [[nodiscard]] std::size_t size() const { return table_.size(); }

  // epoll reported `events` for c.
  void on_ready(Conn* c, std::uint32_t events);
  // Sends what waits on c, then waits for what comes next.
  void send(Conn& c);
  // c has entries to send that send() has not seen: sent by send_ready().
  void want_send(Conn& c);
  void send_ready();
  // Closes c at once (a reset); its Role ends what it holds. Erased later.
  void close(Conn& c, const char* why, Status status = Status::kRemoteDisconnect);
  // Erases the closed connections now, or `c` (closed) now.
  void reap();
  void drop(Conn* c);
  void close_all(const char* why);
  // Resets the refused connections whose peer did not close within
  // TcpLane::kClosingGrace.
  void expire_closing(Clock::time_point now);

  // Before the thread waits on c: how many bytes must arrive to wake it.
  void set_lowat(Conn& c);
  // Counts a refusal and logs it (rate-limited); `who`: the sender's name.
  void refuse(std::atomic<std::uint64_t>& counter, const std::string& who, const std::string& what);
  // Whether one more line about what peers do may be logged now.
  [[nodiscard]] bool may_log() { return log_limit_.allow(); }

 private:
  void receive(Conn& c);
  void drop_input(Conn& c);
  [[nodiscard]] ssize_t receive_some(Conn& c);
  bool took(Conn& c, std::size_t got);
  bool on_header(Conn& c);
  bool on_body(Conn& c);
  void gather(const Conn& c);
  void sent(Conn& c, std::size_t bytes);
  void begin_closing(Conn& c);
  void rearm(Conn& c);
  void watch(Conn& c, std::uint32_t events, int op);

  const int epoll_fd_;
  const std::string& agent_name_;
  Counters& counters_;
  RateLimit log_limit_;
  std::unordered_map<Conn*, std::unique_ptr<Conn>> table_;
  std::vector<Conn*> ready_;   // want_send() since the last send_ready()
  std::vector<Conn*> closed_;  // closed, not erased yet
  // Shut down after a refusal (begin_closing), oldest first: by deadline.
  std::list<Conn*> closing_;
  std::vector<iovec> scratch_iov_;
  std::vector<std::uint8_t> drain_buf_ = std::vector<std::uint8_t>(64 * 1024);
};

}  // namespace kvxfer::internal::tcp
