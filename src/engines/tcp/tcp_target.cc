// SPDX-License-Identifier: Apache-2.0
// The frames a connection receives, on the tcp lane's I/O thread: the
// header's checks, then what a target does with each (a hello, a write's
// runs, a read request, a notification) and its answers. What an initiator
// does with the answers it receives is tcp_initiator.cc.
#include <fmt/format.h>
#include <sys/uio.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/log.h"
#include "engines/tcp/tcp_handshake.h"
#include "engines/tcp/tcp_io.h"

namespace kvxfer::internal::tcp {
namespace {

// A target stops reading a connection while this many answers wait to be
// sent on it (or while a read's reply is being sent): a peer that does not
// read slows only its own connection, and the target holds O(1) per peer.
constexpr std::size_t kMaxQueuedAnswers = 64;

}  // namespace

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
  wire::FrameHeader h;
  if (!wire::decode_header(c->head, &h)) {
    refuse(c, c->hello_done ? lane_.counters_->refused_frame : lane_.counters_->refused_token,
           "a malformed frame header");
    close_conn(c, "it sent a malformed frame");
    return false;
  }
  if (!c->hello_done && h.type != wire::FrameType::kHello) {
    refuse(c, lane_.counters_->refused_token, "a connection whose first frame is not a hello");
    close_conn(c, "no hello");
    return false;
  }
  // What an initiator may receive, and what a target may.
  const bool for_initiator =
      h.type == wire::FrameType::kAck || h.type == wire::FrameType::kReadData;
  // (A challenge and a welcome come only before a connection is the I/O
  // thread's: TcpLane::connect.)
  if (c->initiator != for_initiator || (c->hello_done && h.type == wire::FrameType::kHello) ||
      h.type == wire::FrameType::kWelcome || h.type == wire::FrameType::kChallenge) {
    refuse(c, lane_.counters_->refused_frame, "a frame of a type it may not send");
    close_conn(c, "unexpected frame");
    return false;
  }
  // A transfer's frames come together: after wire::kMore the same transfer's
  // next frame, after wire::kNotifyFollows its notification.
  if (!c->initiator) {
    if (c->cont && (h.seq != c->cont_seq || h.type != c->cont_type)) {
      refuse(c, lane_.counters_->refused_frame, "a frame that breaks off a transfer");
      close_conn(c, "broken transfer");
      return false;
    }
    c->cont = (h.flags & (wire::kMore | wire::kNotifyFollows)) != 0;
    c->cont_seq = h.seq;
    c->cont_type = (h.flags & wire::kNotifyFollows) != 0 ? wire::FrameType::kNotify : h.type;
  }
  c->h = h;
  const std::size_t len = body_len(h);
  c->body.resize(len);  // empty for a frame without one: its tag covers none
  if (len > 0) {
    c->body_have = 0;
    c->rx = Conn::Rx::kBody;
    return true;
  }
  return on_body(c);
}

bool TcpLane::Io::on_body(Conn* c) {
  c->rx = Conn::Rx::kHeader;
  // Every frame after the hello is this connection's next one in its
  // direction, or it was injected, replayed, reordered or changed on the
  // way: nothing of it is acted on, and the connection closes.
  if (c->h.type != wire::FrameType::kHello &&
      !c->rx_auth.verify(wire::header_fields(c->head), c->body, wire::header_tag(c->head))) {
    refuse(c, lane_.counters_->refused_tag, "a frame whose tag fails");
    close_conn(c, "a frame whose tag fails (injected, replayed or changed on the way)");
    return false;
  }
  switch (c->h.type) {
    case wire::FrameType::kHello:
      return on_hello(c);
    case wire::FrameType::kWrite:
    case wire::FrameType::kReadReq:
      return on_runs(c);
    case wire::FrameType::kNotify:
      return on_notify(c);
    case wire::FrameType::kAck:
      return on_ack(c);
    case wire::FrameType::kReadData:
      return on_read_data(c);
    default:
      close_conn(c, "unexpected frame");
      return false;
  }
}

// A write's or read request's runs, each checked against the region of
// ours it names (live, and the run inside it): a write's payload goes
// straight into them, a read's reply comes from them. A region's removal
// after this is the I/O thread's to apply to what is left (tcp_regions.cc).
bool TcpLane::Io::on_runs(Conn* c) {
  const wire::FrameHeader& h = c->h;
  auto& counters = *lane_.counters_;
  const wire::RunList list{c->body};
  std::vector<iovec> pool;
  // What a read request may ask for: every byte we registered once (one
  // reply at a time per connection: reading pauses while it goes out).
  // More would make a few bytes of request cost us many times our memory
  // in sending.
  bool too_much = false;
  {
    MutexLock lock(lane_.regions_mu_);
    const std::span<const LocalRegion> table = lane_.regions_;
    if (h.type == wire::FrameType::kReadReq) {
      std::uint64_t registered = 0;
      for (const LocalRegion& r : table) registered += r.live ? r.len : 0;
      too_much = h.length > registered;
    }
    if (!too_much &&
        runs_fit(h, c->body, [table](std::uint64_t id) { return live_len(table, id); })) {
      pool.reserve(list.run_count());
      for (std::size_t i = 0; i < list.run_count(); ++i) {
        const wire::Run r = list.run(i);
        const LocalRegion& region = table[region_slot(r.region)];
        pool.push_back(iovec{region.base + r.offset, r.length});
      }
    }
  }
  if (pool.empty()) {
    refuse(c, counters.refused_runs,
           too_much ? "a read request for more bytes than this agent registered"
                    : "runs outside this agent's regions");
    return answer_and_close(
        c, h.type == wire::FrameType::kWrite ? wire::FrameType::kAck : wire::FrameType::kReadData,
        h.seq, wire::kStatusRefused);
  }
  if (h.type == wire::FrameType::kReadReq) {
    // The reply goes from our pool; nothing more is read from this
    // connection until it is out.
    answer(c, wire::FrameType::kReadData, h.seq, wire::kStatusOk, h.length, std::move(pool));
    return c->fd >= 0;
  }
  c->rx_iov = std::move(pool);
  c->rx_at = 0;
  c->rx_left = h.length;
  c->rx_drain = false;
  c->rx = Conn::Rx::kPayload;
  return true;
}

// A notification, queued under the name and key its connection's hello
// proved, within the sender's share.
bool TcpLane::Io::on_notify(Conn* c) {
  const wire::FrameHeader& h = c->h;
  auto& counters = *lane_.counters_;
  // Where the sender stands now (our owner may have registered or
  // removed peers since its hello).
  const Claim claim = lane_.claim_of(c->sender, c->key);
  if (claim == Claim::kImpostor) {
    refuse(
        c, counters.refused_identity,
        fmt::format("a notification under registered peer {}'s name from another key", c->sender));
    return answer_and_close(c, wire::FrameType::kAck, h.seq, wire::kStatusNotYours);
  }
  const bool registered = claim == Claim::kRegistered;
  // A registered peer's share is its own; the others share
  // kMaxQueuedNotifications besides their own share each.
  const bool queued = lane_.inbox_.offer(
      {c->sender, c->key}, registered, Notification{c->sender, std::vector<std::uint8_t>(c->body)});
  if (!queued) {
    counters.refused_notify.fetch_add(1, std::memory_order_relaxed);
    if (log_limit_.allow()) {
      log().warn("kvxfer tcp {}: refused a notification from {}: its queue is full",
                 lane_.agent_name_, c->sender);
    }
  }
  answer(c, wire::FrameType::kAck, h.seq, queued ? wire::kStatusOk : wire::kStatusQueueFull);
  return c->fd >= 0;
}

bool TcpLane::Io::on_payload_done(Conn* c) {
  c->rx = Conn::Rx::kHeader;
  if (c->rx_refused) {
    // A region this write was for was removed while it arrived: what came
    // after the removal was dropped, and the write is refused.
    c->rx_refused = false;
    refuse(c, lane_.counters_->refused_runs, "a write into a region removed while it arrived");
    return answer_and_close(c, wire::FrameType::kAck, c->h.seq, wire::kStatusRefused);
  }
  if (!c->initiator) {
    // A write's bytes are in place: ack its last frame.
    if ((c->h.flags & (wire::kMore | wire::kNotifyFollows)) == 0)
      answer(c, wire::FrameType::kAck, c->h.seq, wire::kStatusOk);
    return c->fd >= 0;
  }
  return on_read_done(c);
}

bool TcpLane::Io::on_hello(Conn* c) {
  wire::Hello hello;
  auto& counters = *lane_.counters_;
  if (!wire::decode_hello_body(c->body, c->h.count, &hello) || hello.token != lane_.token_) {
    refuse(c, counters.refused_token, "a hello without this lane's token");
    close_conn(c, "wrong token");
    return false;
  }
  // The proof, over our challenge on this connection and the hello, shows
  // that whoever sent it holds the private half of the hello's key now (a
  // recorded hello names another challenge). The keys it comes with tag the
  // frames both ways from here, a refusal included.
  HandshakeKeys keys;
  if (!handshake_keys(lane_.identity_, hello.key, /*we_initiate=*/false, c->challenge, c->head,
                      wire::hello_proven_part(c->body), &keys) ||
      !c->rx_auth.start(keys.to_target) || !c->tx_auth.start(keys.to_initiator)) {
    refuse(c, counters.refused_identity, "a hello whose key gives no keys");
    close_conn(c, "a hello whose key gives no keys");
    return false;
  }
  if (!same_proof(keys.proof, hello.proof)) {
    refuse(c, counters.refused_identity,
           "a hello whose proof does not prove its key on this connection (forged or replayed)");
    return refuse_hello(c, wire::kStatusUnproven);
  }
  // Both ends must agree on encryption: its flag is in the proven hello,
  // and the refusal's status in the tagged welcome.
  if (((c->h.flags & wire::kEncrypt) != 0) != lane_.encrypt_) {
    refuse(c, counters.refused_tls,
           lane_.encrypt_ ? "a hello without encryption, which this lane requires "
                            "(KVXFER_TCP_ENCRYPT=on here)"
                          : "a hello asking for encryption, which this lane refuses "
                            "(KVXFER_TCP_ENCRYPT=off here)");
    return refuse_hello(c, wire::kStatusEncryption);
  }
  std::string name(hello.name);
  const Claim claim = lane_.claim_of(name, hello.key);
  if (claim == Claim::kImpostor) {
    refuse(c, counters.refused_identity,
           fmt::format("a hello presenting registered peer {}'s name with another key", name));
    return refuse_hello(c, wire::kStatusNotYours);
  }
  const bool registered = claim == Claim::kRegistered;
  if (!registered && unregistered_conns_ >= lane_.limits_.unregistered) {
    refuse(c, counters.refused_full,
           "a connection of no registered peer while their share is full");
    return refuse_hello(c, wire::kStatusTableFull);
  }
  // One key, a registered peer's too, holds a share of the slots, never
  // all of them.
  const auto held = key_conns_.find(hello.key);
  if (held != key_conns_.end() && held->second >= lane_.limits_.per_key) {
    refuse(c, counters.refused_full,
           fmt::format("one connection too many for one identity key (it holds {})", held->second));
    return refuse_hello(c, wire::kStatusTableFull);
  }
  if (const std::optional<bool> refused = join_lineage(c, hello, registered)) return *refused;
  c->hello_done = true;
  --pending_hellos_;
  c->lineage = hello.lineage;
  c->gen = hello.gen;
  c->sender = std::move(name);
  c->key = hello.key;
  c->counted_key = true;
  ++key_conns_[hello.key];
  if (!registered) {
    c->counted_unregistered = true;
    ++unregistered_conns_;
  }
  answer(c, wire::FrameType::kWelcome, 0, wire::kStatusOk);
  if (c->fd < 0 || !lane_.tls_) return c->fd >= 0;
  return start_tls(c, keys.tls_psk);
}

// With encryption on, everything after the welcome is TLS 1.3 keyed by the
// handshake (tcp_tls.h): the welcome went out in the clear and the
// initiator's TLS handshake comes next, by hello_deadline (expire()).
bool TcpLane::Io::start_tls(Conn* c, const TlsPsk& psk) {
  // A fresh socket takes the welcome's 48 bytes at once; one that does not
  // is not worth keeping (TLS's bytes must not pass the welcome).
  if (!c->out.empty()) {
    refuse(c, lane_.counters_->refused_full, "a connection that did not take its welcome");
    close_conn(c, "the welcome did not go out");
    return false;
  }
  c->ssl = lane_.tls_->open(c->fd, psk, /*client=*/false);
  if (!c->ssl) {
    close_conn(c, "OpenSSL could not start TLS");
    return false;
  }
  c->tls_handshaking = true;
  c->hello_deadline = now_ + kHelloTimeout;
  return true;
}

// The hello's registration in the fence table: refused (stale, another
// identity's lineage, no room, one connection too many: the refusal is
// sent and its handler's result returned) or joined, the older
// registration's connections closed first (nullopt).
std::optional<bool> TcpLane::Io::join_lineage(Conn* c, const wire::Hello& hello, bool registered) {
  auto& counters = *lane_.counters_;
  // Full means refusal, never forgetting early; a registered peer still
  // has room of its own (a few lineages per key).
  using Verdict = decltype(fences_)::Verdict;
  const auto now = Clock::now();
  // A new lineage counts against its key's share first (those whose
  // connections all closed still count until they are forgotten).
  if (fences_.find(hello.lineage) == nullptr) {
    fences_.expire(now);
    if (fences_.count_of(hello.key) >= kMaxLineagesPerPeer) {
      refuse(c, counters.refused_full, "one lineage too many for one identity key");
      return refuse_hello(c, wire::kStatusTableFull);
    }
  }
  const auto presented =
      fences_.present(hello.lineage, hello.gen, hello.epoch, hello.key, registered, now);
  switch (presented.verdict) {
    case Verdict::kFull:
      refuse(c, counters.refused_full, "a new initiator while the fence table is full");
      return refuse_hello(c, wire::kStatusTableFull);
    case Verdict::kNotYours:
      refuse(c, counters.refused_identity, "a hello of another identity's lineage");
      return refuse_hello(c, wire::kStatusNotYours);
    case Verdict::kStale:
      refuse(c, counters.refused_stale_fence, "a hello of a registration already replaced");
      return refuse_hello(c, wire::kStatusStaleFence);
    case Verdict::kNew:
    case Verdict::kNewer:
    case Verdict::kSame:
      break;
  }
  auto& f = *presented.entry;
  if (presented.verdict == Verdict::kSame && f.extra.size() >= kMaxConnectionsPerLineage) {
    refuse(c, counters.refused_full, "one connection too many for one registration");
    return refuse_hello(c, wire::kStatusTableFull);
  }
  if (presented.verdict == Verdict::kNewer) {
    // A newer registration: the older connections go, with whatever they
    // still hold, before anything of the new one is read.
    const std::vector<Conn*> older = f.extra;
    for (Conn* o : older) {
      counters.fences_superseded.fetch_add(1, std::memory_order_relaxed);
      close_conn(o, "a newer registration of its initiator replaced it");
    }
  }
  f.extra.push_back(c);
  fences_.hold(f);
  return std::nullopt;
}

// A hello that carried our token, refused: the initiator learns why (a
// welcome with that status), then the connection ends as after any
// refusal (begin_closing). It holds no state meanwhile: no lineage, no
// name, and it no longer counts as waiting for its hello.
bool TcpLane::Io::refuse_hello(Conn* c, std::uint32_t status) {
  c->hello_done = true;
  --pending_hellos_;
  return answer_and_close(c, wire::FrameType::kWelcome, 0, status);
}

// A refusal's answer: nothing more is read as frames, and once the answer
// is out the connection ends in order (send(), begin_closing). False, for
// the frame handlers to return.
bool TcpLane::Io::answer_and_close(Conn* c, wire::FrameType type, std::uint64_t seq,
                                   std::uint32_t status) {
  c->close_after_out = true;
  c->paused = true;
  answer(c, type, seq, status);
  return false;
}

void TcpLane::Io::answer(Conn* c, wire::FrameType type, std::uint64_t seq, std::uint32_t status,
                         std::uint64_t length, std::vector<iovec> pool) {
  Conn::Out o;
  wire::encode_header(o.answer.data(), wire::FrameHeader{type, 0, 0, status, seq, length});
  // Answers carry no body: the tag covers the header (a reply's payload is
  // not covered).
  const std::span<std::uint8_t, wire::kHeaderLen> head(o.answer);
  if (!c->tx_auth.sign(head.first<wire::kFieldsLen>(), {}, wire::tag_slot(head))) {
    close_conn(c, "OpenSSL could not tag an answer");
    return;
  }
  o.reply = !pool.empty();
  o.own.reserve(pool.size() + 1);
  c->out.push_back(std::move(o));
  Conn::Out& q = c->out.back();
  q.own.push_back(iovec{q.answer.data(), wire::kHeaderLen});
  q.own.insert(q.own.end(), pool.begin(), pool.end());
  if (q.reply || c->out.size() >= kMaxQueuedAnswers) c->paused = true;
  send(c);
}

// The registered peers this lane vouches for, whatever lane serves them
// (tcp_lane.h, "Identities"): the target tells their connections by them.
void TcpLane::vouch(PeerHandle handle, const RemoteRegion& remote, const wire::PeerBlob& blob) {
  // Every registered name is reserved, whatever lane serves its peer: one
  // that runs no tcp lane (port 0) has no key here, and no connection can
  // present its name.
  MutexLock lock(vouched_mu_);
  vouched_[remote.agent_name][handle] =
      blob.tcp_port != 0 ? std::optional<IdentityKey>(blob.tcp_key) : std::nullopt;
  vouched_names_[handle] = remote.agent_name;
}

void TcpLane::unvouch(PeerHandle handle) {
  MutexLock lock(vouched_mu_);
  auto it = vouched_names_.find(handle);
  if (it == vouched_names_.end()) return;
  auto name = vouched_.find(it->second);
  if (name != vouched_.end()) {
    name->second.erase(handle);
    if (name->second.empty()) vouched_.erase(name);
  }
  vouched_names_.erase(it);
}

TcpLane::Claim TcpLane::claim_of(const std::string& agent_name, const IdentityKey& key) const {
  MutexLock lock(vouched_mu_);
  auto it = vouched_.find(agent_name);
  if (it == vouched_.end()) return Claim::kUnregistered;
  for (const auto& [handle, k] : it->second) {
    if (k.has_value() && *k == key) return Claim::kRegistered;
  }
  return Claim::kImpostor;
}

}  // namespace kvxfer::internal::tcp
