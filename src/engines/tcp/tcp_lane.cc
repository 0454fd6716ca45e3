// SPDX-License-Identifier: Apache-2.0
#include "engines/tcp/tcp_lane.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <future>
#include <stdexcept>
#include <unordered_set>
#include <utility>

#include "common/host.h"
#include "common/log.h"
#include "common/random.h"
#include "engines/block_runs.h"
#include "engines/tcp/tcp_socket.h"

namespace kvxfer::internal::tcp {
namespace {

static_assert(kMaxMessage == kMaxNotificationBytes, "the frame bound is the public bound");

using Clock = std::chrono::steady_clock;

// Bytes one connection may receive per turn of the I/O loop before the
// others get theirs.
constexpr std::uint64_t kTurnBytes = std::uint64_t{8} << 20;
// A target stops reading a connection while this many answers wait to be
// sent on it (or while a read's reply is being sent): a peer that does not
// read slows only its own connection, and the target holds O(1) per peer.
constexpr std::size_t kMaxQueuedAnswers = 64;
// The most iovecs one sendmsg/readv takes.
constexpr std::size_t kIovMax = IOV_MAX;

std::uint64_t nonzero_random() {
  for (;;) {
    if (const std::uint64_t v = random_u64(); v != 0) return v;
  }
}

Status status_of(std::uint32_t wire_status) {
  switch (wire_status) {
    case kStatusOk:
      return Status::kSuccess;
    case kStatusRefused:
      return Status::kInvalidParam;
    default:
      return Status::kBackend;
  }
}

const char* detail_of(std::uint32_t wire_status) {
  switch (wire_status) {
    case kStatusRefused:
      return "the target refused the frame (runs outside its pool)";
    case kStatusQueueFull:
      return "the target's notification queue for this sender is full";
    default:
      return "the target answered an unknown status";
  }
}

// Logs at most five refusal lines a second (all kinds together); the
// counters count every one.
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

}  // namespace

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
  std::atomic<std::uint64_t> fences_superseded{0};
};

struct TcpLane::Peer {
  std::string name;
  std::uint64_t remote_block_len = 0;
  Conn* conn = nullptr;  // owned by the I/O thread; only its identity is used here
  std::atomic<bool> dead{false};
  std::atomic<std::uint64_t> next_seq{1};
};

// A transfer handle. The core holds one reference until release(), the I/O
// thread one until the transfer ended and nothing of it is queued or awaited.
struct TcpLane::Xfer : LaneXfer {
  Xfer() : LaneXfer(Lane::kTcp) {}
  std::shared_ptr<Peer> peer;
  TransferId id = 0;
  std::uint64_t seq = 0;
  bool read = false;
  bool has_notify = false;
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
  enum class Kind { kAdopt, kPost, kClose } kind = Kind::kPost;
  int fd = -1;                         // kAdopt: a connected, welcomed socket
  std::shared_ptr<Peer> peer;          // kAdopt, kClose
  Conn* conn = nullptr;                // kPost, kClose
  Xfer* xfer = nullptr;                // kPost
  std::promise<void>* done = nullptr;  // kClose, kAdopt: set once carried out
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
  // What the next frame must continue (a transfer's kMore or
  // kNotifyFollows): its seq and type, or none.
  std::uint64_t cont_seq = 0;
  FrameType cont_type = FrameType::kHello;
  bool cont = false;

  // Receiving.
  enum class Rx { kHeader, kBody, kPayload };
  Rx rx = Rx::kHeader;
  std::array<std::uint8_t, kHeaderLen> head{};
  std::size_t head_have = 0;
  Header h;
  std::vector<std::uint8_t> body;
  std::size_t body_have = 0;
  std::vector<iovec> rx_iov;
  std::size_t rx_at = 0;
  std::uint64_t rx_left = 0;
  bool rx_drain = false;    // receiving bytes nobody wants (a released read)
  Xfer* rx_xfer = nullptr;  // initiator: the read whose reply is arriving

  // Sending: transfers (initiator) or answers (target), oldest first. An
  // entry's iovecs are advanced in place as bytes go out.
  struct Out {
    Xfer* xfer = nullptr;
    std::array<std::uint8_t, kHeaderLen> answer{};
    std::vector<iovec> own;  // an answer's iovecs (its header, a reply's pool bytes)
    std::size_t at = 0;      // first iovec not fully sent
    bool reply = false;      // a read's reply (the target reads nothing while it goes)
  };
  std::deque<Out> out;
  bool waiting_out = false;  // EPOLLOUT armed
  bool paused = false;       // target: not reading (answers queued)
  bool close_after_out = false;

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
  bool receive_header(Conn* c);
  bool on_header(Conn* c);
  bool on_body(Conn* c);
  bool on_payload_done(Conn* c);
  bool on_hello(Conn* c);
  void send(Conn* c);
  void answer(Conn* c, FrameType type, std::uint64_t seq, std::uint32_t status,
              std::uint64_t length = 0, std::vector<iovec> pool = {});
  void queue_transfer(Conn* c, Xfer* x);
  void finish(Xfer* x, Status status, const char* why);
  void unuse(Xfer* x);
  // Closes a connection; what it still holds ends `status`.
  void close_conn(Conn* c, const char* why, Status status = Status::kRemoteDisconnect);
  void refuse(Conn* c, std::atomic<std::uint64_t>& counter, const std::string& what);
  void rearm(Conn* c);
  void expire();

  TcpLane& lane_;
  std::unordered_map<Conn*, std::unique_ptr<Conn>> conns_;
  std::size_t pending_hellos_ = 0;
  struct Fence {
    std::uint64_t gen = 0;
    std::uint64_t epoch = 0;
    std::vector<Conn*> conns;  // open connections of this lineage
    Clock::time_point idle_since{};
  };
  std::unordered_map<std::uint64_t, Fence> fences_;
  RateLimit log_limit_;
  std::vector<iovec> scratch_iov_;
  std::vector<std::uint8_t> drain_buf_ = std::vector<std::uint8_t>(64 * 1024);
  std::atomic<bool> stopping_{false};
  friend class TcpLane;
};

// ---------------------------------------------------------------------------
// The lane's calls (any thread).

TcpLane::TcpLane(std::string agent_name, const Region& region, const TcpSettings& settings)
    : agent_name_(std::move(agent_name)),
      region_(region),
      pool_len_(region.num_blocks * region.block_len),
      token_(nonzero_random()),
      counters_(std::make_unique<Counters>()) {
  listen_fd_ = open_listener(settings, &port_);
  addresses_ = published_addresses(settings);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd_ < 0 || epoll_fd_ < 0) {
    stop();
    throw std::runtime_error(fmt::format("kvxfer tcp: eventfd/epoll: {}", strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &listen_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.ptr = &wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  io_ = std::make_unique<Io>(*this);
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "kvxfer-tcp");
    io_->run();
  });
}

TcpLane::~TcpLane() { stop(); }

void TcpLane::stop() {
  if (stopped_.exchange(true)) return;
  if (thread_.joinable()) {
    io_->stopping_.store(true);
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = write(wake_fd_, &one, sizeof one);
    thread_.join();
  }
  if (io_) io_->close_all();
  for (int* fd : {&listen_fd_, &wake_fd_, &epoll_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

void TcpLane::submit(Command command) {
  {
    std::lock_guard lock(commands_mu_);
    commands_.push_back(std::move(command));
  }
  // One wake per burst: the thread clears the flag before it drains.
  if (!wake_pending_.exchange(true, std::memory_order_acq_rel)) {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = write(wake_fd_, &one, sizeof one);
  }
}

Status TcpLane::connect(const ucx::Blob& blob, const RemoteRegion& remote, PeerHandle* out,
                        std::string* reason) {
  const auto fail = [&](std::string why) {
    if (reason != nullptr) *reason = std::move(why);
    return Status::kRemoteDisconnect;
  };
  if (blob.tcp_port == 0 || blob.tcp_addresses.empty()) {
    return fail(fmt::format("peer {} has no tcp lane in its metadata", remote.agent_name));
  }
  const bool same_host = !boot_id().empty() && remote.boot_id == boot_id();
  std::string why;
  const int fd = connect_any(blob.tcp_addresses, blob.tcp_port, same_host, kConnectTimeout, &why);
  if (fd < 0) {
    return fail(fmt::format("cannot reach peer {}'s tcp lane: {}", remote.agent_name, why));
  }
  Hello hello;
  hello.token = blob.tcp_token;
  hello.epoch = nonzero_random();
  {
    std::lock_guard lock(lineage_mu_);
    Lineage& l = lineages_[{remote.agent_name, blob.tcp_token}];
    if (l.id == 0) l.id = nonzero_random();
    hello.lineage = l.id;
    hello.gen = ++l.gens;
  }
  const std::string_view name =
      std::string_view(agent_name_).substr(0, std::min(agent_name_.size(), kMaxName));
  hello.name = name.empty() ? std::string_view("?") : name;
  std::vector<std::uint8_t> frame(kHeaderLen + kHelloFixedLen + hello.name.size());
  encode_header(frame.data(), Header{FrameType::kHello, 0,
                                     static_cast<std::uint32_t>(hello.name.size()), 0, 0, 0});
  encode_hello_body(frame.data() + kHeaderLen, hello);
  std::array<std::uint8_t, kHeaderLen> welcome{};
  Header h;
  if (!write_all(fd, frame.data(), frame.size()) ||
      !read_exactly(fd, welcome.data(), welcome.size(), kConnectTimeout) ||
      !decode_header(welcome, &h) || h.type != FrameType::kWelcome) {
    close(fd);
    return fail(fmt::format(
        "peer {}'s tcp lane closed the connection instead of welcoming it (its token is not the "
        "one in the metadata, or a newer registration of ours replaced this one)",
        remote.agent_name));
  }
  set_nonblocking(fd, true);
  auto peer = std::make_shared<Peer>();
  peer->name = remote.agent_name;
  peer->remote_block_len = remote.block_len;
  std::promise<void> adopted;
  Command cmd;
  cmd.kind = Command::Kind::kAdopt;
  cmd.fd = fd;
  cmd.peer = peer;
  cmd.done = &adopted;
  submit(std::move(cmd));
  adopted.get_future().wait();
  if (peer->conn == nullptr) {
    return fail(fmt::format("the tcp lane is stopping; peer {} not added", remote.agent_name));
  }
  const auto handle = reinterpret_cast<PeerHandle>(peer.get());
  {
    std::lock_guard lock(peers_mu_);
    peers_.emplace(handle, std::move(peer));
  }
  *out = handle;
  return Status::kSuccess;
}

Status TcpLane::disconnect(PeerHandle handle) {
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard lock(peers_mu_);
    auto it = peers_.find(handle);
    if (it == peers_.end()) return Status::kNotFound;
    peer = std::move(it->second);
    peers_.erase(it);
  }
  peer->dead.store(true, std::memory_order_release);
  std::promise<void> closed;
  Command cmd;
  cmd.kind = Command::Kind::kClose;
  cmd.conn = peer->conn;
  cmd.peer = peer;
  cmd.done = &closed;
  submit(std::move(cmd));
  closed.get_future().wait();
  return Status::kSuccess;
}

Status TcpLane::post_write(PeerHandle peer, TransferId id, std::span<const std::int64_t> local,
                           std::span<const std::int64_t> remote, XferHandle* out,
                           std::span<const std::uint8_t> notify) {
  return post(peer, id, false, local, remote, notify, out);
}

Status TcpLane::post_read(PeerHandle peer, TransferId id, std::span<const std::int64_t> local,
                          std::span<const std::int64_t> remote, XferHandle* out,
                          std::span<const std::uint8_t> notify) {
  return post(peer, id, true, local, remote, notify, out);
}

Status TcpLane::post_notify(PeerHandle peer, TransferId id, std::span<const std::uint8_t> message,
                            XferHandle* out) {
  if (message.empty()) return Status::kInvalidParam;
  return post(peer, id, false, {}, {}, message, out);
}

Status TcpLane::post(PeerHandle handle, TransferId id, bool read,
                     std::span<const std::int64_t> local, std::span<const std::int64_t> remote,
                     std::span<const std::uint8_t> notify, XferHandle* out) {
  if (notify.size() > kMaxNotificationBytes) return Status::kInvalidParam;
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard lock(peers_mu_);
    auto it = peers_.find(handle);
    if (it == peers_.end()) return Status::kNotFound;
    peer = it->second;
  }
  if (peer->dead.load(std::memory_order_acquire)) return Status::kRemoteDisconnect;

  auto* x = new Xfer;
  x->peer = peer;
  x->id = id;
  x->read = read;
  x->has_notify = !notify.empty();
  x->seq = peer->next_seq.fetch_add(1, std::memory_order_relaxed);
  const std::uint64_t block_len = region_.block_len;
  auto* base = static_cast<std::uint8_t*>(region_.base);

  // First pass: the runs, so `wire` is sized once and the iovecs into it
  // stay valid.
  std::size_t runs = 0;
  for_each_run(local, remote, [&](std::int64_t, std::int64_t, std::uint64_t) {
    ++runs;
    return true;
  });
  const std::size_t frames = (runs + kMaxRuns - 1) / kMaxRuns;
  x->wire.resize(frames * kHeaderLen + runs * wire::kRunLen +
                 (x->has_notify ? kHeaderLen + notify.size() : 0));
  x->iov.reserve(frames + (read ? 0 : runs) + 1);
  if (read) {
    x->read_iov.reserve(runs);
    x->parts.reserve(frames);
  }
  std::uint8_t* at = x->wire.data();
  std::size_t run_index = 0;
  std::uint8_t* frame_start = nullptr;
  std::uint64_t frame_bytes = 0;
  std::uint32_t frame_runs = 0;
  const auto close_frame = [&](bool last) {
    const std::uint16_t flags =
        last ? (x->has_notify && !read ? kNotifyFollows : 0) : static_cast<std::uint16_t>(kMore);
    encode_header(frame_start, Header{read ? FrameType::kReadReq : FrameType::kWrite, flags,
                                      frame_runs, 0, x->seq, frame_bytes});
    if (read) {
      Xfer::Part& part = x->parts.back();
      part.bytes = frame_bytes;
    }
  };
  std::size_t header_iov = 0;
  for_each_run(local, remote, [&](std::int64_t l, std::int64_t r, std::uint64_t count) {
    if (run_index % kMaxRuns == 0) {
      if (frame_start != nullptr) close_frame(false);
      frame_start = at;
      at += kHeaderLen;
      frame_bytes = 0;
      frame_runs = 0;
      header_iov = x->iov.size();
      x->iov.push_back(iovec{frame_start, kHeaderLen});
      if (read) x->parts.push_back(Xfer::Part{x->read_iov.size(), 0, 0});
    }
    const std::uint64_t bytes = count * block_len;
    wire::put_run_at(at, static_cast<std::uint64_t>(r) * peer->remote_block_len, bytes);
    at += wire::kRunLen;
    x->iov[header_iov].iov_len += wire::kRunLen;
    iovec pool_iov{base + static_cast<std::uint64_t>(l) * block_len, bytes};
    if (read) {
      x->read_iov.push_back(pool_iov);
      ++x->parts.back().count;
    } else {
      x->iov.push_back(pool_iov);
    }
    frame_bytes += bytes;
    ++frame_runs;
    ++run_index;
    return true;
  });
  if (frame_start != nullptr) close_frame(true);
  if (x->has_notify) {
    encode_header(at, Header{FrameType::kNotify, 0, 0, 0, x->seq, notify.size()});
    std::memcpy(at + kHeaderLen, notify.data(), notify.size());
    x->iov.push_back(iovec{at, kHeaderLen + notify.size()});
  }
  live_xfers_.fetch_add(1, std::memory_order_relaxed);
  if (runs > 0)
    (read ? counters_->reads : counters_->writes).fetch_add(1, std::memory_order_relaxed);
  if (x->has_notify) counters_->notifications_sent.fetch_add(1, std::memory_order_relaxed);
  Command cmd;
  cmd.kind = Command::Kind::kPost;
  cmd.conn = peer->conn;
  cmd.xfer = x;
  submit(std::move(cmd));
  *out = reinterpret_cast<XferHandle>(x);
  return Status::kSuccess;
}

Status TcpLane::check(XferHandle handle, Status* state) {
  const auto* x = reinterpret_cast<const Xfer*>(handle);
  *state = x->result.load(std::memory_order_acquire);
  return Status::kSuccess;
}

const char* TcpLane::detail(XferHandle handle) const {
  const auto* x = reinterpret_cast<const Xfer*>(handle);
  return x->result.load(std::memory_order_acquire) == Status::kInProgress ? nullptr : x->why;
}

Status TcpLane::release(XferHandle handle) {
  auto* x = reinterpret_cast<Xfer*>(handle);
  x->released.store(true, std::memory_order_release);
  live_xfers_.fetch_sub(1, std::memory_order_relaxed);
  drop_ref(x);
  return Status::kSuccess;
}

void TcpLane::drop_ref(Xfer* x) {
  if (x->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete x;
}

void TcpLane::take_notifications(std::vector<Notification>* out) {
  std::lock_guard lock(notes_mu_);
  while (!notes_.empty()) {
    Notification& n = notes_.front();
    auto it = notes_per_sender_.find(n.agent);
    if (it != notes_per_sender_.end() && --it->second == 0) notes_per_sender_.erase(it);
    out->push_back(std::move(n));
    notes_.pop_front();
  }
}

void TcpLane::add_live(HandleCounts& counts) const {
  // The pool is this lane's to receive into from creation until stop().
  if (!stopped_.load(std::memory_order_relaxed)) ++counts.memory_registrations;
  {
    std::lock_guard lock(peers_mu_);
    counts.peers += peers_.size();
  }
  counts.transfers += live_xfers_.load(std::memory_order_relaxed);
}

void TcpLane::add_counters(std::map<std::string, std::uint64_t>& counters) const {
  const Counters& c = *counters_;
  const auto get = [](const std::atomic<std::uint64_t>& v) {
    return v.load(std::memory_order_relaxed);
  };
  counters["tcp_writes"] += get(c.writes);
  counters["tcp_reads"] += get(c.reads);
  counters["tcp_notifications_sent"] += get(c.notifications_sent);
  counters["tcp_bytes_sent"] += get(c.bytes_sent);
  counters["tcp_bytes_received"] += get(c.bytes_received);
  counters["tcp_frames_received"] += get(c.frames_received);
  counters["tcp_connections_accepted"] += get(c.connections_accepted);
  counters["tcp_refused_token"] += get(c.refused_token);
  counters["tcp_refused_frame"] += get(c.refused_frame);
  counters["tcp_refused_runs"] += get(c.refused_runs);
  counters["tcp_refused_stale_fence"] += get(c.refused_stale_fence);
  counters["tcp_refused_full"] += get(c.refused_full);
  counters["tcp_refused_notify"] += get(c.refused_notify);
  counters["tcp_fences_superseded"] += get(c.fences_superseded);
}

// ---------------------------------------------------------------------------
// The I/O thread.

void TcpLane::Io::run() {
  std::array<epoll_event, 64> events{};
  for (;;) {
    // Wakes at least once a second to close connections that never said
    // hello and to forget idle lineages.
    const int n = epoll_wait(lane_.epoll_fd_, events.data(), static_cast<int>(events.size()), 1000);
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
  std::vector<Command> commands;
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
    if (stopping_ || conns_.size() >= kMaxConnections || pending_hellos_ >= kMaxPendingHellos) {
      lane_.counters_->refused_full.fetch_add(1, std::memory_order_relaxed);
      if (log_limit_.allow()) {
        log().warn("kvxfer tcp {}: refused a connection: {} open, {} without a hello yet",
                   lane_.agent_name_, conns_.size(), pending_hellos_);
      }
      close(fd);
      continue;
    }
    tune(fd);
    auto conn = std::make_unique<Conn>();
    Conn* c = conn.get();
    c->fd = fd;
    c->hello_deadline = Clock::now() + kHelloTimeout;
    c->body.reserve(kMaxRuns * wire::kRunLen);
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
  while (c->fd >= 0 && !c->paused && budget > 0) {
    ssize_t n = 0;
    switch (c->rx) {
      case Conn::Rx::kHeader:
        n = recv(c->fd, c->head.data() + c->head_have, kHeaderLen - c->head_have, 0);
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
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
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
        if (c->head_have == kHeaderLen) ok = on_header(c);
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
  Header h;
  if (!decode_header(c->head, &h)) {
    refuse(c, c->hello_done ? lane_.counters_->refused_frame : lane_.counters_->refused_token,
           "a malformed frame header");
    close_conn(c, "it sent a malformed frame");
    return false;
  }
  if (!c->hello_done && h.type != FrameType::kHello) {
    refuse(c, lane_.counters_->refused_token, "a connection whose first frame is not a hello");
    close_conn(c, "no hello");
    return false;
  }
  // What an initiator may receive, and what a target may.
  const bool for_initiator = h.type == FrameType::kAck || h.type == FrameType::kReadData;
  if (c->initiator != for_initiator || (c->hello_done && h.type == FrameType::kHello) ||
      h.type == FrameType::kWelcome) {
    refuse(c, lane_.counters_->refused_frame, "a frame of a type it may not send");
    close_conn(c, "unexpected frame");
    return false;
  }
  // A transfer's frames come together: after kMore the same transfer's
  // next frame, after kNotifyFollows its notification.
  if (!c->initiator) {
    if (c->cont && (h.seq != c->cont_seq || h.type != c->cont_type)) {
      refuse(c, lane_.counters_->refused_frame, "a frame that breaks off a transfer");
      close_conn(c, "broken transfer");
      return false;
    }
    c->cont = (h.flags & (kMore | kNotifyFollows)) != 0;
    c->cont_seq = h.seq;
    c->cont_type = (h.flags & kNotifyFollows) != 0 ? FrameType::kNotify : h.type;
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
  const Header& h = c->h;
  c->rx = Conn::Rx::kHeader;
  auto& counters = *lane_.counters_;
  switch (h.type) {
    case FrameType::kHello:
      return on_hello(c);
    case FrameType::kWrite:
    case FrameType::kReadReq: {
      if (!runs_fit(h, c->body, lane_.pool_len_)) {
        refuse(c, counters.refused_runs, "runs outside this pool");
        // Answer, then close once the answer is out; read nothing more.
        c->close_after_out = true;
        c->paused = true;
        answer(c, h.type == FrameType::kWrite ? FrameType::kAck : FrameType::kReadData, h.seq,
               kStatusRefused);
        return false;
      }
      auto* base = static_cast<std::uint8_t*>(lane_.region_.base);
      const wire::RunList list{c->body};
      std::vector<iovec> pool;
      pool.reserve(list.run_count());
      for (std::size_t i = 0; i < list.run_count(); ++i) {
        const wire::Run r = list.run(i);
        pool.push_back(iovec{base + r.offset, r.length});
      }
      if (h.type == FrameType::kReadReq) {
        // The reply goes from our pool; nothing more is read from this
        // connection until it is out.
        answer(c, FrameType::kReadData, h.seq, kStatusOk, h.length, std::move(pool));
        return c->fd >= 0;
      }
      c->rx_iov = std::move(pool);
      c->rx_at = 0;
      c->rx_left = h.length;
      c->rx_drain = false;
      c->rx = Conn::Rx::kPayload;
      return true;
    }
    case FrameType::kNotify: {
      bool queued = false;
      {
        std::lock_guard lock(lane_.notes_mu_);
        std::size_t& mine = lane_.notes_per_sender_[c->sender];
        if (mine < kMaxQueuedPerSender && lane_.notes_.size() < kMaxQueuedNotifications) {
          ++mine;
          lane_.notes_.push_back(Notification{c->sender, std::vector<std::uint8_t>(c->body)});
          queued = true;
        } else if (mine == 0) {
          lane_.notes_per_sender_.erase(c->sender);
        }
      }
      if (!queued) {
        counters.refused_notify.fetch_add(1, std::memory_order_relaxed);
        if (log_limit_.allow()) {
          log().warn("kvxfer tcp {}: refused a notification from {}: its queue is full",
                     lane_.agent_name_, c->sender);
        }
      }
      answer(c, FrameType::kAck, h.seq, queued ? kStatusOk : kStatusQueueFull);
      return c->fd >= 0;
    }
    case FrameType::kAck: {
      if (c->awaiting.empty() || c->awaiting.front().part != SIZE_MAX ||
          c->awaiting.front().xfer->seq != h.seq) {
        refuse(c, counters.refused_frame, "an ack nobody waits for");
        close_conn(c, "unexpected ack");
        return false;
      }
      Xfer* x = c->awaiting.front().xfer;
      c->awaiting.pop_front();
      if (h.status != kStatusOk) {
        finish(x, status_of(h.status), detail_of(h.status));
      } else if (std::none_of(c->awaiting.begin(), c->awaiting.end(),
                              [x](const Conn::Await& a) { return a.xfer == x; })) {
        finish(x, Status::kSuccess, nullptr);
      }
      unuse(x);
      return true;
    }
    case FrameType::kReadData: {
      if (c->awaiting.empty() || c->awaiting.front().part == SIZE_MAX ||
          c->awaiting.front().xfer->seq != h.seq) {
        refuse(c, counters.refused_frame, "a read reply nobody waits for");
        close_conn(c, "unexpected reply");
        return false;
      }
      const Conn::Await a = c->awaiting.front();
      Xfer* x = a.xfer;
      const Xfer::Part& part = x->parts[a.part];
      if (h.status == kStatusOk && h.length != part.bytes) {
        refuse(c, counters.refused_frame, "a read reply of the wrong length");
        close_conn(c, "bad reply length");
        return false;
      }
      if (h.status != kStatusOk) {
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
    if ((c->h.flags & (kMore | kNotifyFollows)) == 0)
      answer(c, FrameType::kAck, c->h.seq, kStatusOk);
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
  Hello hello;
  auto& counters = *lane_.counters_;
  if (!decode_hello_body(c->body, c->h.count, &hello) || hello.token != lane_.token_) {
    refuse(c, counters.refused_token, "a hello without this lane's token");
    close_conn(c, "wrong token");
    return false;
  }
  auto it = fences_.find(hello.lineage);
  if (it == fences_.end()) {
    if (fences_.size() >= kMaxLineages) {
      refuse(c, counters.refused_full, "a new initiator while the fence table is full");
      close_conn(c, "fence table full");
      return false;
    }
    it = fences_.emplace(hello.lineage, Fence{hello.gen, hello.epoch, {}, {}}).first;
  }
  Fence& f = it->second;
  if (hello.gen < f.gen || (hello.gen == f.gen && hello.epoch != f.epoch)) {
    refuse(c, counters.refused_stale_fence, "a hello of a registration already replaced");
    close_conn(c, "stale fence");
    return false;
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
  c->sender = std::string(hello.name);
  answer(c, FrameType::kWelcome, 0, kStatusOk);
  return c->fd >= 0;
}

void TcpLane::Io::answer(Conn* c, FrameType type, std::uint64_t seq, std::uint32_t status,
                         std::uint64_t length, std::vector<iovec> pool) {
  Conn::Out o;
  encode_header(o.answer.data(), Header{type, 0, 0, status, seq, length});
  o.reply = !pool.empty();
  o.own.reserve(pool.size() + 1);
  c->out.push_back(std::move(o));
  Conn::Out& q = c->out.back();
  q.own.push_back(iovec{q.answer.data(), kHeaderLen});
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
    close_conn(c, "refused");
    return;
  }
  rearm(c);
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
  if (c->lineage != 0) {
    auto it = fences_.find(c->lineage);
    if (it != fences_.end()) {
      auto& v = it->second.conns;
      v.erase(std::remove(v.begin(), v.end(), c), v.end());
      if (v.empty()) it->second.idle_since = Clock::now();
    }
  }
  if (c->peer) c->peer->dead.store(true, std::memory_order_release);
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
  for (auto it = fences_.begin(); it != fences_.end();) {
    if (it->second.conns.empty() && now - it->second.idle_since > kLineageLinger) {
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
