// SPDX-License-Identifier: Apache-2.0
// The tcp lane's inside: what its handles, peers and connections hold, and
// the I/O thread that owns every socket. Included by the lane's rooms only,
// never elsewhere: tcp_lane.cc (the calls any thread makes) and the I/O
// thread's tcp_io.cc (its loop), tcp_conn.cc (a connection's bytes),
// tcp_target.cc (the frames a target receives) and tcp_initiator.cc (the
// answers an initiator receives).
#pragma once

#include <sys/epoll.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engines/fence_table.h"
#include "engines/tcp/tcp_handshake.h"
#include "engines/tcp/tcp_lane.h"
#include "engines/tcp/tcp_tls.h"

namespace kvxfer::internal::tcp {

using Clock = std::chrono::steady_clock;

// At most five log lines a second for what peers can make us log as often
// as they like (refused frames and hellos); the counters count every one.
class RateLimit {
 public:
  bool allow() {
    const auto now = Clock::now();
    if (now - window_ > std::chrono::seconds(1)) {
      window_ = now;
      in_window_ = 0;
    }
    return ++in_window_ <= 5;
  }

 private:
  Clock::time_point window_{};
  int in_window_ = 0;
};

struct TcpLane::Counters {
  std::atomic<std::uint64_t> writes{0};
  std::atomic<std::uint64_t> reads{0};
  std::atomic<std::uint64_t> notifications_sent{0};
  std::atomic<std::uint64_t> bytes_sent{0};
  std::atomic<std::uint64_t> bytes_received{0};
  std::atomic<std::uint64_t> frames_received{0};
  std::atomic<std::uint64_t> connections_accepted{0};
  std::atomic<std::uint64_t> refused_token{0};
  std::atomic<std::uint64_t> refused_frame{0};
  std::atomic<std::uint64_t> refused_runs{0};
  std::atomic<std::uint64_t> refused_stale_fence{0};
  std::atomic<std::uint64_t> refused_full{0};
  std::atomic<std::uint64_t> refused_notify{0};
  std::atomic<std::uint64_t> refused_identity{0};
  std::atomic<std::uint64_t> refused_tag{0};
  std::atomic<std::uint64_t> refused_tls{0};
  std::atomic<std::uint64_t> fences_superseded{0};
};

struct TcpLane::Peer : LanePeer, std::enable_shared_from_this<Peer> {
  explicit Peer(TcpLane* owner) : LanePeer(owner) {}
  std::string name;
  std::uint64_t remote_block_len = 0;
  // The peer's region ids, as its metadata lists them (ByteRun::remote_region
  // is an index into this); its pool first, id 0, when it has one.
  std::vector<std::uint64_t> region_ids;
  Conn* conn = nullptr;  // owned by the I/O thread; only its identity is used here
  std::atomic<bool> dead{false};
  std::atomic<std::uint64_t> next_seq{1};
  // Set by the I/O thread while this peer's connection has bytes waiting to
  // go out (EPOLLOUT armed): the thread comes back to it on its own, so a
  // post behind them needs no wake (tcp_lane.cc, submit()).
  std::atomic<bool> sending{false};
  // What its transfers not yet released hold (Xfer::held), against
  // kMaxHeldBytesPerPeer.
  std::atomic<std::uint64_t> held_bytes{0};
};

// A transfer handle. The core holds one reference until release(), the I/O
// thread one until the transfer ended and nothing of it is queued or awaited.
struct TcpLane::Xfer : LaneXfer {
  explicit Xfer(TcpLane* owner) : LaneXfer(owner) {}
  std::shared_ptr<Peer> peer;
  TransferId id = 0;
  std::uint64_t seq = 0;
  bool read = false;
  bool has_notify = false;
  std::uint64_t held = 0;  // counted in peer->held_bytes from post to recycle
  // The frames' headers, runs and message, and what to send, in order
  // (pieces of `wire` and, for writes, of our pool).
  std::vector<std::uint8_t> wire;
  std::vector<iovec> iov;
  // A read's replies: per request frame, the part of `read_iov` (our pool)
  // its reply fills and that part's bytes.
  struct Part {
    std::size_t first = 0;
    std::size_t count = 0;
    std::uint64_t bytes = 0;
  };
  std::vector<iovec> read_iov;
  std::vector<Part> parts;
  std::atomic<Status> result{Status::kInProgress};
  const char* why = nullptr;  // written before `result` turns final
  std::atomic<int> refs{2};
  std::atomic<bool> released{false};
  // I/O thread only: queue entries and awaited answers still naming this
  // transfer; the I/O thread lets go once the transfer ended and this is 0.
  int io_uses = 0;
  bool io_ref = true;
};

struct TcpLane::Command {
  enum class Kind { kAdopt, kPost, kClose, kForgetRegion } kind = Kind::kPost;
  int fd = -1;                         // kAdopt: a connected, welcomed socket
  std::shared_ptr<Peer> peer;          // kAdopt, kClose
  Conn* conn = nullptr;                // kPost, kClose
  Xfer* xfer = nullptr;                // kPost
  std::promise<void>* done = nullptr;  // kClose, kAdopt, kForgetRegion: set once carried out
  LocalRegion region;                  // kForgetRegion: a region no longer live
  // kAdopt: the connection's frame keys (its welcome, frame 0 of the
  // target's, was checked already).
  std::shared_ptr<const HandshakeKeys> keys;
  // kAdopt, with encryption on: the connection's TLS, its handshake done.
  SslPtr ssl;
};

struct TcpLane::Conn {
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
  bool counted_key = false;           // in Io::key_conns_
  // Target side: the challenge we sent first (the hello's proof covers it).
  std::array<std::uint8_t, wire::kHeaderLen + wire::kNonceLen> challenge{};
  // Both sides, from the handshake on: the tags of the frames we receive
  // and of those we send, each direction numbered on its own.
  FrameAuth rx_auth;
  FrameAuth tx_auth;
  // With encryption on, from the welcome on: the connection's TLS 1.3
  // (tcp_tls.h), which every byte after the welcome goes through. A target
  // runs its handshake on this thread (tls_handshaking, by
  // hello_deadline); an initiator's connection comes with it done. OpenSSL
  // may need the socket the other way round: a read that must write first
  // (tls_rx_wants_write arms EPOLLOUT), a write that must read first
  // (tls_tx_wants_read arms EPOLLIN, even while paused).
  SslPtr ssl;
  bool tls_handshaking = false;
  bool tls_rx_wants_write = false;
  bool tls_tx_wants_read = false;
  bool tls_unflushed = false;  // records wait in the write buffer (EPOLLOUT)
  bool in_tls_ready = false;   // in Io::tls_ready_
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
  bool rx_drain = false;  // receiving bytes nobody wants (a released read)
  // Target: the payload arriving is dropped because a region it was for
  // was removed meanwhile; once it is in, the frame is refused.
  bool rx_refused = false;
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
  bool waiting_out = false;       // answers or transfers wait to go out
  std::uint32_t armed = EPOLLIN;  // the epoll events armed (rearm())
  bool in_ready = false;          // in Io::ready_
  bool paused = false;            // target: not reading (answers queued)
  bool close_after_out = false;
  // Target: the last answer (a refusal) is out and our side is shut down
  // for writing; what the peer still sends is read and dropped until it
  // closes too, or until closing_deadline, so the refusal reaches it
  // before any reset (Io::begin_closing).
  bool closing = false;
  Clock::time_point closing_deadline{};
  // Target: when bytes last moved either way (the turn's clock). A
  // connection that owes us the rest of a frame, or does not take the
  // answers queued for it, is closed once this is older than the stall.
  Clock::time_point moved{};

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
  // The next bytes the connection's state wants (as recv), and what they
  // advance (false: a handler closed or paused the connection).
  ssize_t read_next(Conn* c);
  bool took(Conn* c, std::size_t got);
  // A connection's bytes, through TLS once it has it: as recv, readv and
  // sendmsg (> 0 bytes moved, 0 the peer closed, -1 with errno; EAGAIN for
  // nothing now).
  ssize_t read_some(Conn* c, void* buf, std::size_t len);
  ssize_t read_iov(Conn* c, const iovec* iov, std::size_t count);
  ssize_t write_iov(Conn* c, const iovec* iov, std::size_t count);
  // Target: the TLS handshake after an encrypted welcome, one step; false
  // while it is not done (or the connection closed).
  bool tls_handshake(Conn* c);
  bool start_tls(Conn* c, const TlsPsk& psk);
  // OpenSSL holds bytes of `c` epoll cannot see: receive() it next turn.
  void tls_ready(Conn* c);
  // Before the thread waits on `c`: how many bytes must arrive to wake it.
  void set_lowat(Conn* c);
  bool on_header(Conn* c);
  bool on_body(Conn* c);
  // The target's frames (tcp_target.cc).
  bool on_runs(Conn* c);
  bool on_notify(Conn* c);
  bool on_payload_done(Conn* c);
  // The initiator's answers (tcp_initiator.cc).
  bool on_ack(Conn* c);
  bool on_read_data(Conn* c);
  bool on_read_done(Conn* c);
  bool on_hello(Conn* c);
  std::optional<bool> join_lineage(Conn* c, const wire::Hello& hello, bool registered);
  bool refuse_hello(Conn* c, std::uint32_t status);
  bool answer_and_close(Conn* c, wire::FrameType type, std::uint64_t seq, std::uint32_t status);
  void send(Conn* c);
  void answer(Conn* c, wire::FrameType type, std::uint64_t seq, std::uint32_t status,
              std::uint64_t length = 0, std::vector<iovec> pool = {});
  void queue_transfer(Conn* c, Xfer* x);
  // Ends whatever still moves bytes into or out of a region that is no
  // longer live (tcp_regions.cc).
  void forget_region(const LocalRegion& region);
  void finish(Xfer* x, Status status, const char* why);
  void unuse(Xfer* x);
  // Closes a connection; what it still holds ends `status`.
  void close_conn(Conn* c, const char* why, Status status = Status::kRemoteDisconnect);
  void refuse(Conn* c, std::atomic<std::uint64_t>& counter, const std::string& what);
  void rearm(Conn* c);
  void begin_closing(Conn* c);
  void expire();
  // Frees the connections closed this turn.
  void reap();
  // accept() found no descriptor left (EMFILE/ENFILE): the listener stops
  // waking the thread for kAcceptRest; wake_listener() rearms it after.
  void rest_listener(int error);
  void wake_listener(Clock::time_point now);

  TcpLane& lane_;
  std::unordered_map<Conn*, std::unique_ptr<Conn>> conns_;
  // Connections a turn's posts queued transfers on, to be sent before the
  // thread waits again; and connections closed this turn, freed at its end
  // (so no pointer the turn still holds, in ready_ or in epoll's batch,
  // outlives its connection).
  std::vector<Conn*> ready_;
  std::vector<Conn*> closed_;
  // Encrypted connections whose bytes OpenSSL already holds (a turn's
  // budget ended, or the connection was paused, with records read ahead).
  std::vector<Conn*> tls_ready_;
  // expire() looks at deadlines of seconds: at most every kExpireEvery,
  // not on every turn of a busy loop.
  static constexpr std::chrono::milliseconds kExpireEvery{100};
  Clock::time_point next_expire_{};
  Clock::time_point now_{};  // this turn's clock, read once after epoll_wait
  bool listener_resting_ = false;
  Clock::time_point listener_back_{};
  std::size_t closing_conns_ = 0;  // refused, waiting for the peer to close
  std::size_t pending_hellos_ = 0;
  // Per initiator lineage: its newest registration, the identity key it
  // is bound to and its open connections (engines/fence_table.h).
  FenceTable<IdentityKey, std::vector<Conn*>> fences_{
      {kMaxLineages, kMaxLineagesPerPeer, kLineageLinger}};
  // Welcomed connections whose key was no registered peer's when they said
  // hello.
  std::size_t unregistered_conns_ = 0;
  // Welcomed connections per identity key (ConnLimits::per_key); a key is
  // here while it holds one.
  std::map<IdentityKey, std::size_t> key_conns_;
  RateLimit log_limit_;
  std::vector<iovec> scratch_iov_;
  std::vector<Command> drained_;  // drain_commands(): the queue taken
  std::vector<std::uint8_t> drain_buf_ = std::vector<std::uint8_t>(64 * 1024);
  std::atomic<bool> stopping_{false};
  friend class TcpLane;
};

}  // namespace kvxfer::internal::tcp
