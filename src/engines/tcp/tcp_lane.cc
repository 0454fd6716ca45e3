// SPDX-License-Identifier: Apache-2.0
// The tcp lane's calls, from any thread: connect and disconnect (which hand
// their socket to the I/O thread and wait for it), posts (which build their
// frames here and queue them), checks, releases and counters. What the I/O
// thread does with them starts in tcp_io.cc.
#include "engines/tcp/tcp_lane.h"

#include <fmt/format.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <future>
#include <stdexcept>
#include <utility>

#include "common/host.h"
#include "common/log.h"
#include "common/random.h"
#include "engines/tcp/tcp_io.h"
#include "engines/tcp/tcp_socket.h"

namespace kvxfer::internal::tcp {
namespace {

// Why a target refused our hello, from its welcome's status.
std::string hello_refusal(std::uint32_t status) {
  switch (status) {
    case wire::kStatusNotYours:
      return "it registered a peer of our agent name with another identity key (another "
             "transport of that name), or the lineage we presented is another key's";
    case wire::kStatusStaleFence:
      return "a newer registration of ours replaced this one";
    case wire::kStatusTableFull:
      return "its room for initiators is full (it refuses new ones rather than forget a fence); "
             "peers it registered keep room of their own";
    case wire::kStatusUnproven:
      return "our hello's proof did not prove our identity key on that connection (against the "
             "key in its metadata)";
    default:
      return "a status this build does not know";
  }
}

// Why a target refused our hello for its encryption setting, given ours.
std::string encryption_refusal(bool we_encrypt) {
  return we_encrypt ? "the target refuses encryption (KVXFER_TCP_ENCRYPT=off there, on here)"
                    : "the target requires encryption (KVXFER_TCP_ENCRYPT=on there, off here)";
}

static_assert(wire::kMaxMessage == kMaxNotificationBytes, "the frame bound is the public bound");

std::uint64_t nofile_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
  return r.rlim_cur;
}

}  // namespace

TcpLane::ConnLimits TcpLane::conn_limits(std::uint64_t nofile) {
  ConnLimits l;
  l.total = std::clamp<std::uint64_t>(nofile / 2, 16, kMaxConnections);
  l.unregistered = std::min(l.total / 2, kMaxUnregisteredConnections);
  l.pending = std::clamp<std::size_t>(l.total / 4, 2, kMaxPendingHellos);
  l.closing = std::max<std::size_t>(l.total / 8, 2);
  l.per_key =
      std::clamp<std::size_t>(l.total / 8, kMaxConnectionsPerLineage, kMaxConnectionsPerKey);
  return l;
}

TcpLane::TcpLane(std::string agent_name, const Region& region, const TcpSettings& settings)
    : agent_name_(std::move(agent_name)),
      limits_(conn_limits(nofile_limit())),
      stall_(settings.stall_ms),
      encrypt_(settings.encrypt),
      tls_(settings.encrypt ? std::make_unique<TlsContext>() : nullptr),
      region_(region),
      pool_{0, static_cast<std::uint8_t*>(region.base), region.num_blocks * region.block_len,
            region.base != nullptr && region.num_blocks * region.block_len != 0},
      token_(fresh_random()),
      counters_(std::make_unique<Counters>()) {
  {
    MutexLock lock(regions_mu_);
    regions_.push_back(pool_);
  }
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

TcpLane::~TcpLane() {
  stop();
  for (Xfer* x : xfer_pool_) delete x;
  delete spare_.load();
}

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
  const Peer* post_to = command.kind == Command::Kind::kPost ? command.xfer->peer.get() : nullptr;
  {
    MutexLock lock(commands_mu_);
    commands_.push_back(std::move(command));
    // The next post's transfer, taken while the lock is held anyway.
    if (post_to != nullptr && !xfer_pool_.empty() &&
        spare_.load(std::memory_order_relaxed) == nullptr) {
      Xfer* expected = nullptr;
      if (spare_.compare_exchange_strong(expected, xfer_pool_.back(), std::memory_order_acq_rel)) {
        xfer_pool_.pop_back();
      }
    }
  }
  // A post to a peer whose connection is still sending needs no wake: the
  // thread comes back for that connection (EPOLLOUT) and drains the queue
  // then; it clears `sending` before it looks at the queue (Io::run()).
  // Waking it anyway costs the caller a switch on a busy machine.
  if (post_to != nullptr && post_to->sending.load(std::memory_order_seq_cst)) return;
  // One wake per burst: the thread clears the flag before it drains.
  if (!wake_pending_.exchange(true, std::memory_order_acq_rel)) {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = write(wake_fd_, &one, sizeof one);
  }
}

void TcpLane::publish(wire::PeerBlob& blob) const {
  blob.tcp_token = token_;
  blob.tcp_key = identity_.public_key();
  blob.tcp_port = port_;
  blob.tcp_addresses = addresses_;
}

bool TcpLane::qualifies(const RemoteRegion& /*remote*/, const wire::PeerBlob& blob) const {
  return blob.tcp_port != 0;
}

void TcpLane::stop(StopStage stage) {
  if (stage == StopStage::kDisconnect) {
    std::vector<LanePeer*> left;
    {
      MutexLock lock(peers_mu_);
      for (const auto& [handle, peer] : peers_) left.push_back(handle);
    }
    disconnect_all(left, agent_name_);
  }
  if (stage == StopStage::kQuiesce) stop();
}

// The handshake on a connected socket (tcp_handshake.h): the target's
// challenge, our hello with its proof, and the target's tagged welcome. On
// success `*keys` holds the connection's frame keys; else `*reason` says why
// and the caller closes the socket.
Status TcpLane::say_hello(int fd, const wire::PeerBlob& blob, const RemoteRegion& remote,
                          std::shared_ptr<HandshakeKeys>* keys_out, std::string* reason) {
  const auto fail = [&](std::string why) {
    *reason = std::move(why);
    return Status::kRemoteDisconnect;
  };
  // The target speaks first: a challenge, fresh for this connection, that
  // our hello's proof covers (tcp_handshake.h).
  std::array<std::uint8_t, wire::kHeaderLen + wire::kNonceLen> challenge{};
  Nonce target_nonce{};
  if (!read_exactly(fd, challenge.data(), challenge.size(), kConnectTimeout) ||
      !wire::decode_challenge(challenge, &target_nonce)) {
    return fail(fmt::format(
        "peer {}'s tcp lane sent no challenge (it closed the connection at once: it holds as "
        "many as it may; or it does not speak tcp frames version {})",
        remote.agent_name, wire::kFrameVersion));
  }
  wire::Hello hello;
  if (!fresh_nonce(&hello.nonce)) {
    return fail("OpenSSL gave no random bytes for the hello's nonce");
  }
  hello.token = blob.tcp_token;
  hello.key = identity_.public_key();
  const Lineages::Registration registration = lineages_.next(remote.agent_name, blob.tcp_token);
  hello.lineage = registration.lineage;
  hello.gen = registration.gen;
  hello.epoch = registration.epoch;
  const std::string_view name =
      std::string_view(agent_name_).substr(0, std::min(agent_name_.size(), wire::kMaxName));
  hello.name = name.empty() ? std::string_view("?") : name;
  std::vector<std::uint8_t> frame(wire::kHeaderLen + wire::kHelloFixedLen + hello.name.size() +
                                  wire::kHelloProofLen);
  const std::uint16_t flags = encrypt_ ? wire::kEncrypt : 0;
  wire::encode_header(frame.data(),
                      wire::FrameHeader{wire::FrameType::kHello, flags,
                                        static_cast<std::uint32_t>(hello.name.size()), 0, 0, 0});
  wire::encode_hello_body(frame.data() + wire::kHeaderLen, hello);
  const auto sent = std::span<const std::uint8_t>(frame);
  auto keys = std::make_shared<HandshakeKeys>();
  if (!handshake_keys(identity_, blob.tcp_key, /*we_initiate=*/true, challenge,
                      sent.first(wire::kHeaderLen),
                      wire::hello_proven_part(sent.subspan(wire::kHeaderLen)), keys.get())) {
    *reason = fmt::format("peer {}'s metadata names a tcp key no handshake keys come of",
                          remote.agent_name);
    return Status::kInvalidParam;
  }
  std::copy(keys->proof.begin(), keys->proof.end(),
            frame.end() - static_cast<std::ptrdiff_t>(wire::kHelloProofLen));
  std::array<std::uint8_t, wire::kHeaderLen> welcome{};
  wire::FrameHeader h;
  if (!write_all(fd, frame.data(), frame.size()) ||
      !read_exactly(fd, welcome.data(), welcome.size(), kConnectTimeout) ||
      !wire::decode_header(welcome, &h) || h.type != wire::FrameType::kWelcome) {
    return fail(fmt::format(
        "peer {}'s tcp lane closed the connection without an answer to our hello (its token is "
        "not the one in the metadata, or it holds as many connections as it may)",
        remote.agent_name));
  }
  // The welcome is the target's frame 0: only the holder of the key its
  // metadata names, answering this hello, can tag it.
  FrameAuth welcome_auth;
  if (!welcome_auth.start(keys->to_initiator) ||
      !welcome_auth.verify(wire::header_fields(welcome), {}, wire::header_tag(welcome))) {
    return fail(fmt::format(
        "the answer to our hello on peer {}'s tcp lane is not tagged with the key its metadata "
        "names (someone else answered, or the bytes changed on the way)",
        remote.agent_name));
  }
  if (h.status != wire::kStatusOk) {
    return fail(fmt::format("peer {}'s tcp lane refused our hello: {}", remote.agent_name,
                            h.status == wire::kStatusEncryption ? encryption_refusal(encrypt_)
                                                                : hello_refusal(h.status)));
  }
  *keys_out = std::move(keys);
  return Status::kSuccess;
}

Status TcpLane::connect(const wire::PeerBlob& blob, const RemoteRegion& remote, Connected* out) {
  std::string* const reason = &out->reason;
  const auto fail = [&](std::string why) {
    *reason = std::move(why);
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
  std::shared_ptr<HandshakeKeys> keys;
  if (const Status s = say_hello(fd, blob, remote, &keys, reason); s != Status::kSuccess) {
    close(fd);
    return s;
  }
  set_nonblocking(fd, true);
  SslPtr ssl;
  if (tls_) {
    ssl = tls_->open(fd, keys->tls_psk, /*client=*/true);
    std::string tls_why = "OpenSSL could not start TLS";
    if (!ssl || !tls_connect(ssl.get(), fd, kConnectTimeout, &tls_why)) {
      close(fd);
      return fail(
          fmt::format("peer {}'s tcp lane welcomed us, but {}", remote.agent_name, tls_why));
    }
  }
  auto peer = std::make_shared<Peer>(this);
  peer->name = remote.agent_name;
  peer->remote_block_len = remote.block_len;
  peer->region_ids.reserve(remote.regions.size());
  for (const MemRegion& r : remote.regions) peer->region_ids.push_back(r.id);
  std::promise<void> adopted;
  Command cmd;
  cmd.kind = Command::Kind::kAdopt;
  cmd.fd = fd;
  cmd.peer = peer;
  cmd.done = &adopted;
  cmd.keys = std::move(keys);
  cmd.ssl = std::move(ssl);
  submit(std::move(cmd));
  adopted.get_future().wait();
  if (peer->conn == nullptr) {
    return fail(fmt::format("the tcp lane is stopping; peer {} not added", remote.agent_name));
  }
  out->peer = peer.get();
  MutexLock lock(peers_mu_);
  peers_.emplace(peer.get(), std::move(peer));
  return Status::kSuccess;
}

Status TcpLane::disconnect(LanePeer* handle) {
  std::shared_ptr<Peer> peer;
  {
    MutexLock lock(peers_mu_);
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

// Builds a post's frames into `x`: headers and runs in `x->wire` (sized
// once, so the iovecs into it stay valid), what to send in `x->iov` (for a
// write, our regions' runs between them), and for a read where each reply
// lands. Each run names the target's region by the target's own id.
bool TcpLane::frame(Xfer* x, std::span<const ByteRun> byte_runs,
                    std::span<const std::uint8_t> notify, std::span<const LocalRegion> mine,
                    std::span<const std::uint64_t> theirs) {
  const bool read = x->read;
  const std::size_t runs = byte_runs.size();
  const std::size_t frames = (runs + wire::kMaxRuns - 1) / wire::kMaxRuns;
  x->wire.resize(frames * wire::kHeaderLen + runs * wire::kRunLen +
                 (x->has_notify ? wire::kHeaderLen + notify.size() : 0));
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
    const std::uint16_t flags = last ? (x->has_notify && !read ? wire::kNotifyFollows : 0)
                                     : static_cast<std::uint16_t>(wire::kMore);
    wire::encode_header(
        frame_start, wire::FrameHeader{read ? wire::FrameType::kReadReq : wire::FrameType::kWrite,
                                       flags, frame_runs, 0, x->seq, frame_bytes});
    if (read) x->parts.back().bytes = frame_bytes;
  };
  std::size_t header_iov = 0;
  for (const ByteRun& run : byte_runs) {
    // The core validated the runs; what it named must still be there.
    if (run.local_region >= mine.size() || run.remote_region >= theirs.size()) return false;
    const LocalRegion& local = mine[run.local_region];
    if (!local.live || run.len > local.len || run.local > local.len - run.len) return false;
    if (run_index % wire::kMaxRuns == 0) {
      if (frame_start != nullptr) close_frame(false);
      frame_start = at;
      at += wire::kHeaderLen;
      frame_bytes = 0;
      frame_runs = 0;
      header_iov = x->iov.size();
      x->iov.push_back(iovec{frame_start, wire::kHeaderLen});
      if (read) x->parts.push_back(Xfer::Part{x->read_iov.size(), 0, 0});
    }
    wire::put_run_at(at, theirs[run.remote_region], run.remote, run.len);
    at += wire::kRunLen;
    x->iov[header_iov].iov_len += wire::kRunLen;
    const iovec ours{local.base + run.local, run.len};
    if (read) {
      x->read_iov.push_back(ours);
      ++x->parts.back().count;
    } else {
      x->iov.push_back(ours);
    }
    frame_bytes += run.len;
    ++frame_runs;
    ++run_index;
  }
  if (frame_start != nullptr) close_frame(true);
  if (x->has_notify) {
    wire::encode_header(
        at, wire::FrameHeader{wire::FrameType::kNotify, 0, 0, 0, x->seq, notify.size()});
    std::memcpy(at + wire::kHeaderLen, notify.data(), notify.size());
    x->iov.push_back(iovec{at, wire::kHeaderLen + notify.size()});
  }
  return true;
}

Status TcpLane::post(LanePeer* handle, const Post& post, XferHandle* out) {
  const std::span<const std::uint8_t> notify = post.note;
  const bool read = post.op == TransferOp::kRead;
  if (notify.size() > kMaxNotificationBytes) return Status::kInvalidParam;
  if (post.op == TransferOp::kNotify && notify.empty()) return Status::kInvalidParam;
  // The core posts only to peers it connected and has not disconnected.
  std::shared_ptr<Peer> peer = static_cast<Peer*>(handle)->shared_from_this();
  if (peer->dead.load(std::memory_order_acquire)) return Status::kRemoteDisconnect;
  // What frame() will lay out for it, counted until it is released.
  const std::uint64_t held = held_by(post.runs.size(), notify.size());
  if (peer->held_bytes.load(std::memory_order_relaxed) + held > kMaxHeldBytesPerPeer) {
    return Status::kNotPosted;
  }

  Xfer* x = take_xfer();
  x->peer = peer;
  x->held = held;
  peer->held_bytes.fetch_add(held, std::memory_order_relaxed);
  x->id = post.id;
  x->read = read;
  x->has_notify = !notify.empty();
  x->seq = peer->next_seq.fetch_add(1, std::memory_order_relaxed);
  const auto queue = [&] {
    live_xfers_.fetch_add(1, std::memory_order_relaxed);
    if (!post.runs.empty())
      (read ? counters_->reads : counters_->writes).fetch_add(1, std::memory_order_relaxed);
    if (x->has_notify) counters_->notifications_sent.fetch_add(1, std::memory_order_relaxed);
    Command cmd;
    cmd.kind = Command::Kind::kPost;
    cmd.conn = peer->conn;
    cmd.xfer = x;
    submit(std::move(cmd));
  };
  // Pool-only posts (write_blocks, read_blocks) name the pools alone, which
  // never change: no lock. Others hold our table until they are queued, so
  // a region's removal either refuses them here or comes after them in the
  // I/O thread's queue (and ends them there: tcp_regions.cc).
  static constexpr std::uint64_t kPoolIds[] = {0};
  if (post.pool_only) {
    if (!frame(x, post.runs, notify, std::span(&pool_, 1), kPoolIds)) {
      recycle(x);
      return Status::kInvalidParam;
    }
    queue();
  } else {
    MutexLock lock(regions_mu_);
    if (!frame(x, post.runs, notify, regions_, peer->region_ids)) {
      recycle(x);
      return Status::kInvalidParam;
    }
    queue();
  }
  *out = handle_of(static_cast<LaneXfer*>(x));
  return Status::kSuccess;
}

Status TcpLane::check(XferHandle handle, Status* state) {
  const auto* x = static_cast<const Xfer*>(lane_xfer(handle));
  *state = x->result.load(std::memory_order_acquire);
  return Status::kSuccess;
}

const char* TcpLane::detail(XferHandle handle) const {
  const auto* x = static_cast<const Xfer*>(lane_xfer(handle));
  return x->result.load(std::memory_order_acquire) == Status::kInProgress ? nullptr : x->why;
}

Status TcpLane::release(XferHandle handle) {
  auto* x = static_cast<Xfer*>(lane_xfer(handle));
  x->released.store(true, std::memory_order_release);
  live_xfers_.fetch_sub(1, std::memory_order_relaxed);
  drop_ref(x);
  return Status::kSuccess;
}

void TcpLane::drop_ref(Xfer* x) {
  if (x->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) recycle(x);
}

namespace {
constexpr std::size_t kPooledXfers = 256;
constexpr std::size_t kPooledBytes = std::size_t{1} << 20;
}  // namespace

TcpLane::Xfer* TcpLane::take_xfer() {
  // The spare submit() set aside (no lock); else one from the pool (the
  // first post after a burst), else a new one.
  if (Xfer* x = spare_.exchange(nullptr, std::memory_order_acq_rel); x != nullptr) return x;
  {
    MutexLock lock(commands_mu_);
    if (!xfer_pool_.empty()) {
      Xfer* x = xfer_pool_.back();
      xfer_pool_.pop_back();
      return x;
    }
  }
  return new Xfer(this);
}

void TcpLane::recycle(Xfer* x) {
  // Its peer holds its buffers no more, whether they are kept or freed.
  if (x->peer) x->peer->held_bytes.fetch_sub(x->held, std::memory_order_relaxed);
  x->held = 0;
  const std::size_t held = x->wire.capacity() +
                           (x->iov.capacity() + x->read_iov.capacity()) * sizeof(iovec) +
                           x->parts.capacity() * sizeof(Xfer::Part);
  if (held > kPooledBytes) {
    delete x;
    return;
  }
  // As new, buffers kept.
  x->peer.reset();
  x->id = 0;
  x->seq = 0;
  x->read = false;
  x->has_notify = false;
  x->wire.clear();
  x->iov.clear();
  x->read_iov.clear();
  x->parts.clear();
  x->result.store(Status::kInProgress, std::memory_order_relaxed);
  x->why = nullptr;
  x->refs.store(2, std::memory_order_relaxed);
  x->released.store(false, std::memory_order_relaxed);
  x->io_uses = 0;
  x->io_ref = true;
  {
    MutexLock lock(commands_mu_);
    if (xfer_pool_.size() < kPooledXfers) {
      xfer_pool_.push_back(x);
      return;
    }
  }
  delete x;
}

void TcpLane::take_notifications(std::vector<Notification>* out) {
  // Queued before our owner registered a peer of that name with another
  // key: not that peer's, so not handed out under its name.
  const std::size_t dropped = inbox_.take(out, [this](const Notification&, const Sender& from) {
    return claim_of(from.first, from.second) != Claim::kImpostor;
  });
  if (dropped > 0) counters_->refused_identity.fetch_add(dropped, std::memory_order_relaxed);
}

void TcpLane::add_live(HandleCounts& counts) const {
  // The pool is this lane's to receive into from creation until stop().
  if (!stopped_.load(std::memory_order_relaxed)) ++counts.memory_registrations;
  {
    MutexLock lock(peers_mu_);
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
  counters["tcp_refused_identity"] += get(c.refused_identity);
  counters["tcp_refused_tag"] += get(c.refused_tag);
  counters["tcp_refused_tls"] += get(c.refused_tls);
  counters["tcp_fences_superseded"] += get(c.fences_superseded);
}

}  // namespace kvxfer::internal::tcp
