// SPDX-License-Identifier: Apache-2.0
// The tcp lane's inside: its connections and the I/O thread that owns every
// socket (tcp_io.cc); the handles, peers and commands it takes are
// tcp_xfer.h and tcp_commands.h. Included by the lane's two rooms only
// (tcp_lane.cc: the calls any thread makes; tcp_io.cc: the thread).
#pragma once

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engines/tcp/tcp_counters.h"
#include "engines/tcp/tcp_lane.h"
#include "engines/tcp/tcp_xfer.h"

namespace kvxfer::internal::tcp {

// A connection: its socket, the frame being received, what waits to go out,
// and each side's state.
class Conn {
 public:
  int fd = -1;
  bool initiator = false;
  std::shared_ptr<Peer> peer;  // initiator side
  // Target side: the hello's fence and name, and when it must have come.
  bool hello_done = false;
  Clock::time_point hello_deadline{};
  std::uint64_t lineage = 0;
  std::uint64_t gen = 0;
  std::string sender;
  IdentityKey key{};                  // the identity key its hello proved
  bool counted_unregistered = false;  // in Io::unregistered_conns_
  // What the next frame must continue (a transfer's wire::kMore or
  // wire::kNotifyFollows): its seq and type, or none.
  std::uint64_t cont_seq = 0;
  wire::FrameType cont_type = wire::FrameType::kHello;
  bool cont = false;

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
  bool rx_drain = false;    // receiving bytes nobody wants (a released read)
  int lowat = 1;            // the socket's SO_RCVLOWAT (Io::set_lowat)
  Xfer* rx_xfer = nullptr;  // initiator: the read whose reply is arriving

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
  // before any reset (Io::begin_closing).
  bool closing = false;
  Clock::time_point closing_deadline{};

  // Initiator: answers we wait for, in the order they come.
  struct Await {
    Xfer* xfer = nullptr;
    std::size_t part = 0;  // a read's reply part; SIZE_MAX: an ack
  };
  std::deque<Await> awaiting;
};

// The I/O thread's state: everything here is touched by that thread only.
class TcpLane::Io {
 public:
  explicit Io(TcpLane& lane) : lane_(lane) {}
  void run();
  void close_all();

 private:
  void drain_commands();
  void accept_all();
  void on_ready(Conn* c, std::uint32_t events);
  void receive(Conn* c);
  // Before the thread waits on `c`: how many bytes must arrive to wake it.
  void set_lowat(Conn* c);
  bool on_header(Conn* c);
  bool on_body(Conn* c);
  bool on_payload_done(Conn* c);
  bool on_hello(Conn* c);
  bool refuse_hello(Conn* c, std::uint32_t status);
  bool answer_and_close(Conn* c, wire::FrameType type, std::uint64_t seq, std::uint32_t status);
  void send(Conn* c);
  void answer(Conn* c, wire::FrameType type, std::uint64_t seq, std::uint32_t status,
              std::uint64_t length = 0, std::vector<iovec> pool = {});
  void queue_transfer(Conn* c, Xfer* x);
  void finish(Xfer* x, Status status, const char* why);
  void unuse(Xfer* x);
  // Closes a connection; what it still holds ends `status`.
  void close_conn(Conn* c, const char* why, Status status = Status::kRemoteDisconnect);
  void refuse(Conn* c, std::atomic<std::uint64_t>& counter, const std::string& what);
  void rearm(Conn* c);
  void begin_closing(Conn* c);
  void expire();

  TcpLane& lane_;
  std::unordered_map<Conn*, std::unique_ptr<Conn>> conns_;
  std::size_t pending_hellos_ = 0;
  struct Lineage {
    std::uint64_t gen = 0;
    std::uint64_t epoch = 0;
    IdentityKey key{};         // a lineage is one identity's: another key is refused
    std::vector<Conn*> conns;  // open connections of this lineage
    Clock::time_point idle_since{};
  };
  std::unordered_map<std::uint64_t, Lineage> fences_;
  // Lineages per identity key, and welcomed connections whose key was no
  // registered peer's when they said hello.
  std::map<IdentityKey, std::size_t> lineages_per_key_;
  std::size_t unregistered_conns_ = 0;
  RateLimit log_limit_;
  std::vector<iovec> scratch_iov_;
  std::vector<Command> drained_;  // drain_commands(): the queue taken
  std::vector<std::uint8_t> drain_buf_ = std::vector<std::uint8_t>(64 * 1024);
  std::atomic<bool> stopping_{false};
  friend class TcpLane;
};

}  // namespace kvxfer::internal::tcp
