// SPDX-License-Identifier: Apache-2.0
// The tcp lane's calls, from any thread: connect and disconnect (which hand
// their socket to the I/O thread and wait for it), posts (which build their
// frames here and queue them), checks, releases and counters. It reaches the
// I/O thread (tcp_io.h) only through Commands, the inbox and the transfers.
#include "engines/tcp/tcp_lane.h"

#include <fmt/format.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <stdexcept>
#include <utility>

#include "common/host.h"
#include "common/log.h"
#include "common/random.h"
#include "engines/tcp/tcp_io.h"
#include "engines/tcp/tcp_socket.h"
#include "engines/tcp/tcp_xfer.h"

namespace kvxfer::internal::tcp {
namespace {

// Why a target refused our hello, from its welcome's status.
const char* hello_refusal(std::uint32_t status) {
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
      return "our hello's MAC did not prove our identity key against the key in its metadata";
    default:
      return "a status this build does not know";
  }
}

static_assert(wire::kMaxMessage == kMaxNotificationBytes, "the frame bound is the public bound");

}  // namespace

TcpLane::TcpLane(std::string agent_name, const Region& region, const TcpSettings& settings)
    : agent_name_(std::move(agent_name)),
      region_(region),
      token_(fresh_random()),
      commands_(this),
      notes_(kMaxQueuedPerSender, kMaxQueuedNotifications) {
  listen_fd_ = open_listener(settings, &port_);
  addresses_ = published_addresses(settings);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) {
    stop();
    throw std::runtime_error(fmt::format("kvxfer tcp: eventfd/epoll: {}", strerror(errno)));
  }
  io_ = std::make_unique<Io>(epoll_fd_, listen_fd_, commands_,
                             Target::Setup{.agent_name = agent_name_,
                                           .pool = region_,
                                           .token = token_,
                                           .identity = identity_,
                                           .vouched = vouched_,
                                           .notes = notes_,
                                           .counters = counters_});
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "kvxfer-tcp");
    io_->run();
  });
}

TcpLane::~TcpLane() { stop(); }

void TcpLane::stop() {
  if (stopped_.exchange(true)) return;
  if (thread_.joinable()) {
    io_->stop_soon();
    thread_.join();
  }
  if (io_) io_->close_all();
  commands_.close();
  for (int* fd : {&listen_fd_, &epoll_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
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
      std::lock_guard lock(peers_mu_);
      for (const auto& [handle, peer] : peers_) left.push_back(handle);
    }
    if (!left.empty()) {
      log().warn("kvxfer tcp {}: stopping with {} peer(s) still connected", agent_name_,
                 left.size());
    }
    for (LanePeer* peer : left) static_cast<void>(disconnect(peer));
  }
  if (stage == StopStage::kQuiesce) stop();
}

Status TcpLane::connect(const wire::PeerBlob& blob, const RemoteRegion& remote, Connected* out) {
  const auto fail = [&](std::string why) {
    out->reason = std::move(why);
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
  std::vector<std::uint8_t> frame;
  if (const Status st = hello_frame(blob, remote.agent_name, &frame, &out->reason);
      st != Status::kSuccess) {
    close(fd);
    return st;
  }
  std::array<std::uint8_t, wire::kHeaderLen> welcome{};
  wire::FrameHeader h;
  if (!write_all(fd, frame.data(), frame.size()) ||
      !read_exactly(fd, welcome.data(), welcome.size(), kConnectTimeout) ||
      !wire::decode_header(welcome, &h) || h.type != wire::FrameType::kWelcome) {
    close(fd);
    return fail(fmt::format(
        "peer {}'s tcp lane closed the connection without an answer to our hello (its token is "
        "not the one in the metadata)",
        remote.agent_name));
  }
  if (h.status != wire::kStatusOk) {
    close(fd);
    return fail(fmt::format("peer {}'s tcp lane refused our hello: {}", remote.agent_name,
                            hello_refusal(h.status)));
  }
  set_nonblocking(fd, true);
  return adopt(fd, remote, out);
}

Status TcpLane::hello_frame(const wire::PeerBlob& blob, const std::string& peer_name,
                            std::vector<std::uint8_t>* frame, std::string* reason) {
  IdentityKey conn_key{};
  if (!identity_.connection_key(blob.tcp_key, /*we_initiate=*/true, &conn_key)) {
    *reason =
        fmt::format("peer {}'s metadata names a tcp key no connection key comes of", peer_name);
    return Status::kInvalidParam;
  }
  wire::Hello hello;
  hello.token = blob.tcp_token;
  hello.key = identity_.public_key();
  const Lineages::Registration registration = lineages_.next(peer_name, blob.tcp_token);
  hello.lineage = registration.lineage;
  hello.gen = registration.gen;
  hello.epoch = registration.epoch;
  const std::string_view name =
      std::string_view(agent_name_).substr(0, std::min(agent_name_.size(), wire::kMaxName));
  hello.name = name.empty() ? std::string_view("?") : name;
  frame->resize(wire::kHeaderLen + wire::kHelloFixedLen + hello.name.size() + wire::kHelloMacLen);
  wire::encode_header(frame->data(),
                      wire::FrameHeader{wire::FrameType::kHello, 0,
                                        static_cast<std::uint32_t>(hello.name.size()), 0, 0, 0});
  wire::encode_hello_body(frame->data() + wire::kHeaderLen, hello);
  const auto body = std::span<const std::uint8_t>(*frame).subspan(wire::kHeaderLen);
  Mac mac{};
  if (!mac_of(conn_key, wire::hello_signed_part(body), &mac)) {
    *reason = "OpenSSL could not compute the hello's MAC";
    return Status::kRemoteDisconnect;
  }
  std::copy(mac.begin(), mac.end(), frame->end() - static_cast<std::ptrdiff_t>(wire::kHelloMacLen));
  return Status::kSuccess;
}

Status TcpLane::adopt(int fd, const RemoteRegion& remote, Connected* out) {
  auto peer = std::make_shared<Peer>(this);
  peer->name = remote.agent_name;
  peer->remote_block_len = remote.block_len;
  std::promise<void> adopted;
  Command cmd;
  cmd.kind = Command::Kind::kAdopt;
  cmd.fd = fd;
  cmd.peer = peer;
  cmd.done = &adopted;
  commands_.submit(std::move(cmd));
  adopted.get_future().wait();
  if (peer->conn == nullptr) {
    out->reason = fmt::format("the tcp lane is stopping; peer {} not added", remote.agent_name);
    return Status::kRemoteDisconnect;
  }
  out->peer = peer.get();
  std::lock_guard lock(peers_mu_);
  peers_.emplace(peer.get(), std::move(peer));
  return Status::kSuccess;
}

Status TcpLane::disconnect(LanePeer* handle) {
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
  commands_.submit(std::move(cmd));
  closed.get_future().wait();
  return Status::kSuccess;
}

Status TcpLane::post(LanePeer* handle, const Post& post, XferHandle* out) {
  const std::span<const std::uint8_t> notify = post.note;
  if (notify.size() > kMaxNotificationBytes) return Status::kInvalidParam;
  if (post.op == TransferOp::kNotify && notify.empty()) return Status::kInvalidParam;
  // The core posts only to peers it connected and has not disconnected.
  std::shared_ptr<Peer> peer = static_cast<Peer*>(handle)->shared_from_this();
  if (peer->dead.load(std::memory_order_acquire)) return Status::kRemoteDisconnect;

  Xfer* x = commands_.take_xfer();
  x->peer = peer;
  x->id = post.id;
  x->read = post.op == TransferOp::kRead;
  x->has_notify = !notify.empty();
  x->seq = peer->next_seq.fetch_add(1, std::memory_order_relaxed);
  x->frame(post, region_, peer->remote_block_len);
  live_xfers_.fetch_add(1, std::memory_order_relaxed);
  if (!post.runs.empty()) bump(x->read ? counters_.reads : counters_.writes);
  if (x->has_notify) bump(counters_.notifications_sent);
  Command cmd;
  cmd.kind = Command::Kind::kPost;
  cmd.conn = peer->conn;
  cmd.xfer = x;
  commands_.submit(std::move(cmd));
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
  commands_.unref(x);
  return Status::kSuccess;
}

void TcpLane::take_notifications(std::vector<Notification>* out) {
  notes_.take(out, [this](const Sender& sender, const Notification& note) {
    // Queued before our owner registered a peer of that name with another
    // key: not that peer's, so not handed out under its name.
    if (vouched_.claim_of(note.agent, sender.second) != Claim::kImpostor) return true;
    bump(counters_.refused_identity);
    return false;
  });
}

void TcpLane::vouch(PeerHandle handle, const RemoteRegion& remote, const wire::PeerBlob& blob) {
  if (blob.tcp_port == 0) return;
  vouched_.vouch(handle, remote.agent_name, blob.tcp_key);
}

void TcpLane::unvouch(PeerHandle handle) { vouched_.unvouch(handle); }

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
  const Counters& c = counters_;
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
  counters["tcp_fences_superseded"] += get(c.fences_superseded);
}

}  // namespace kvxfer::internal::tcp
