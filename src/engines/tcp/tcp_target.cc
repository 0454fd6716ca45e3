// SPDX-License-Identifier: Apache-2.0
// The target's side, on the I/O thread (tcp_target.h). A connection must
// present the lane's token in a hello before anything else of it is read;
// its frames are checked against the header's bounds (wire/), the runs
// against our pool, and refused by an answer and the connection's end.
#include "engines/tcp/tcp_target.h"

#include <fmt/format.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "common/log.h"
#include "engines/tcp/tcp_lane.h"
#include "engines/tcp/tcp_socket.h"

namespace kvxfer::internal::tcp {
namespace {

// A target stops reading a connection while this many answers wait to be
// sent on it (or while a read's reply is being sent): a peer that does not
// read slows only its own connection, and the target holds O(1) per peer.
constexpr std::size_t kMaxQueuedAnswers = 64;

}  // namespace

Target::Target(Conns& conns, const Setup& setup)
    : conns_(conns),
      agent_name_(setup.agent_name),
      pool_base_(static_cast<std::uint8_t*>(setup.pool.base)),
      pool_len_(setup.pool.num_blocks * setup.pool.block_len),
      token_(setup.token),
      identity_(setup.identity),
      vouched_(setup.vouched),
      notes_(setup.notes),
      counters_(setup.counters) {}

void Target::accept_all(int listen_fd, const std::atomic<bool>& stopping) {
  for (;;) {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (stopping || conns_.size() >= TcpLane::kMaxConnections) {
      bump(counters_.refused_full);
      if (conns_.may_log()) {
        log().warn("kvxfer tcp {}: refused a connection: {} open, {} without a hello yet",
                   agent_name_, conns_.size(), waiting_hello_.size());
      }
      close(fd);
      continue;
    }
    if (waiting_hello_.size() >= TcpLane::kMaxPendingHellos) push_out_oldest();
    take(fd);
  }
}

// The oldest connection still without a hello goes, not the new one:
// silent connections cannot keep a peer that says hello at once out. (It
// holds no state; the loop erases it after this turn.)
void Target::push_out_oldest() {
  TargetConn& oldest = *waiting_hello_.front();
  refuse(oldest, counters_.refused_full,
         "the oldest connection without a hello, to make room for a new one");
  conns_.close(oldest, "pushed out by a newer connection before its hello");
}

void Target::take(int fd) {
  tune(fd);
  auto conn = std::make_unique<TargetConn>(fd, *this);
  conn->hello_deadline = Clock::now() + TcpLane::kHelloTimeout;
  conn->body.reserve(wire::kMaxRuns * wire::kRunLen);
  TargetConn* c = conn.get();
  c->waiting_at = waiting_hello_.insert(waiting_hello_.end(), c);
  conns_.add(std::move(conn));
  bump(counters_.connections_accepted);
}

void Target::said_hello(TargetConn& c) {
  c.hello_done = true;
  waiting_hello_.erase(c.waiting_at);
}

void Target::expire(Clock::time_point now) {
  while (!waiting_hello_.empty() && now > waiting_hello_.front()->hello_deadline) {
    TargetConn* c = waiting_hello_.front();
    refuse(*c, counters_.refused_token, "a connection that sent no hello in time");
    conns_.close(*c, "no hello in time");
    conns_.drop(c);
  }
  while (!idle_.empty()) {
    const auto it = fences_.find(idle_.front());
    if (now - it->second.idle_since <= TcpLane::kLineageLinger) break;
    auto k = lineages_per_key_.find(it->second.key);
    if (k != lineages_per_key_.end() && --k->second == 0) lineages_per_key_.erase(k);
    fences_.erase(it);
    idle_.pop_front();
  }
}

bool Target::on_header(Conn& conn, wire::FrameHeader* h) {
  auto& c = static_cast<TargetConn&>(conn);
  if (!wire::decode_header(c.head, h)) {
    refuse(c, c.hello_done ? counters_.refused_frame : counters_.refused_token,
           "a malformed frame header");
    conns_.close(c, "it sent a malformed frame");
    return false;
  }
  if (!c.hello_done && h->type != wire::FrameType::kHello) {
    refuse(c, counters_.refused_token, "a connection whose first frame is not a hello");
    conns_.close(c, "no hello");
    return false;
  }
  // An initiator sends one hello, then transfers' frames.
  if (h->type == wire::FrameType::kAck || h->type == wire::FrameType::kReadData ||
      h->type == wire::FrameType::kWelcome ||
      (c.hello_done && h->type == wire::FrameType::kHello)) {
    refuse(c, counters_.refused_frame, "a frame of a type it may not send");
    conns_.close(c, "unexpected frame");
    return false;
  }
  // A transfer's frames come together: after wire::kMore the same transfer's
  // next frame, after wire::kNotifyFollows its notification.
  if (c.cont && (h->seq != c.cont_seq || h->type != c.cont_type)) {
    refuse(c, counters_.refused_frame, "a frame that breaks off a transfer");
    conns_.close(c, "broken transfer");
    return false;
  }
  c.cont = (h->flags & (wire::kMore | wire::kNotifyFollows)) != 0;
  c.cont_seq = h->seq;
  c.cont_type = (h->flags & wire::kNotifyFollows) != 0 ? wire::FrameType::kNotify : h->type;
  return true;
}

bool Target::on_body(Conn& conn) {
  auto& c = static_cast<TargetConn&>(conn);
  switch (c.h.type) {
    case wire::FrameType::kHello:
      return on_hello(c);
    case wire::FrameType::kWrite:
    case wire::FrameType::kReadReq:
      return on_runs(c);
    case wire::FrameType::kNotify:
      return on_notify(c);
    default:
      conns_.close(c, "unexpected frame");
      return false;
  }
}

bool Target::on_hello(TargetConn& c) {
  wire::Hello hello;
  if (!wire::decode_hello_body(c.body, c.h.count, &hello) || hello.token != token_) {
    refuse(c, counters_.refused_token, "a hello without this lane's token");
    conns_.close(c, "wrong token");
    return false;
  }
  if (!proves_key(c, hello)) {
    refuse(c, counters_.refused_identity, "a hello whose MAC does not prove its key");
    return refuse_hello(c, wire::kStatusUnproven);
  }
  std::string name(hello.name);
  const Claim claim = vouched_.claim_of(name, hello.key);
  if (claim == Claim::kImpostor) {
    refuse(c, counters_.refused_identity,
           fmt::format("a hello presenting registered peer {}'s name with another key", name));
    return refuse_hello(c, wire::kStatusNotYours);
  }
  const bool registered = claim == Claim::kRegistered;
  if (!registered && unregistered_conns_ >= TcpLane::kMaxUnregisteredConnections) {
    refuse(c, counters_.refused_full,
           "a connection of no registered peer while their share is full");
    return refuse_hello(c, wire::kStatusTableFull);
  }
  if (const std::uint32_t refused = fence(c, hello, registered); refused != wire::kStatusOk) {
    return refuse_hello(c, refused);
  }
  said_hello(c);
  c.lineage = hello.lineage;
  c.gen = hello.gen;
  c.sender = std::move(name);
  c.key = hello.key;
  if (!registered) {
    c.counted_unregistered = true;
    ++unregistered_conns_;
  }
  answer(c, wire::FrameType::kWelcome, 0, wire::kStatusOk);
  return c.fd >= 0;
}

// The MAC proves the hello's key: whoever sent it holds the private half.
bool Target::proves_key(const TargetConn& c, const wire::Hello& hello) const {
  IdentityKey conn_key{};
  Mac expected{};
  return identity_.connection_key(hello.key, /*we_initiate=*/false, &conn_key) &&
         mac_of(conn_key, wire::hello_signed_part(c.body), &expected) &&
         same_mac(expected, hello.mac);
}

// The hello's lineage, made when it is new; nullptr (refused, counted) when
// the table is full: full means refusal, never forgetting, and a registered
// peer still has room of its own (a few lineages per key).
Target::Lineage* Target::lineage_of(TargetConn& c, const wire::Hello& hello, bool registered) {
  if (auto it = fences_.find(hello.lineage); it != fences_.end()) return &it->second;
  const std::size_t of_key = lineages_per_key_[hello.key];
  if (fences_.size() >= TcpLane::kMaxLineages &&
      !(registered && of_key < TcpLane::kMaxLineagesPerPeer)) {
    if (of_key == 0) lineages_per_key_.erase(hello.key);
    refuse(c, counters_.refused_full, "a new initiator while the fence table is full");
    return nullptr;
  }
  ++lineages_per_key_[hello.key];
  Lineage fresh{hello.gen, hello.epoch, hello.key, {}, {}, idle_.end()};
  return &fences_.emplace(hello.lineage, std::move(fresh)).first->second;
}

std::uint32_t Target::fence(TargetConn& c, const wire::Hello& hello, bool registered) {
  Lineage* const found = lineage_of(c, hello, registered);
  if (found == nullptr) return wire::kStatusTableFull;
  Lineage& f = *found;
  if (f.key != hello.key) {
    refuse(c, counters_.refused_identity, "a hello of another identity's lineage");
    return wire::kStatusNotYours;
  }
  if (hello.gen < f.gen || (hello.gen == f.gen && hello.epoch != f.epoch)) {
    refuse(c, counters_.refused_stale_fence, "a hello of a registration already replaced");
    return wire::kStatusStaleFence;
  }
  if (hello.gen == f.gen && f.conns.size() >= TcpLane::kMaxConnectionsPerLineage) {
    refuse(c, counters_.refused_full, "one connection too many for one registration");
    return wire::kStatusTableFull;
  }
  if (hello.gen > f.gen) {
    // A newer registration: the older connections go, with whatever they
    // still hold, before anything of the new one is read.
    const std::vector<TargetConn*> older = f.conns;
    for (TargetConn* o : older) {
      bump(counters_.fences_superseded);
      conns_.close(*o, "a newer registration of its initiator replaced it");
    }
    f.gen = hello.gen;
    f.epoch = hello.epoch;
  }
  if (f.idle_at != idle_.end()) {
    idle_.erase(f.idle_at);
    f.idle_at = idle_.end();
  }
  f.conns.push_back(&c);
  return wire::kStatusOk;
}

// A hello that carried our token, refused: the initiator learns why (a
// welcome with that status), then the connection ends as after any
// refusal (Conns::begin_closing). It holds no state meanwhile: no lineage,
// no name, and it no longer counts as waiting for its hello.
bool Target::refuse_hello(TargetConn& c, std::uint32_t status) {
  said_hello(c);
  return answer_and_close(c, wire::FrameType::kWelcome, 0, status);
}

bool Target::on_runs(TargetConn& c) {
  const wire::FrameHeader& h = c.h;
  const bool write = h.type == wire::FrameType::kWrite;
  if (!wire::runs_fit(h, c.body, pool_len_)) {
    refuse(c, counters_.refused_runs, "runs outside this pool");
    return answer_and_close(c, write ? wire::FrameType::kAck : wire::FrameType::kReadData, h.seq,
                            wire::kStatusRefused);
  }
  const wire::RunList list{c.body};
  std::vector<iovec> pool;
  pool.reserve(list.run_count());
  for (std::size_t i = 0; i < list.run_count(); ++i) {
    const wire::Run r = list.run(i);
    pool.push_back(iovec{pool_base_ + r.offset, r.length});
  }
  if (!write) {
    // The reply goes from our pool; nothing more is read from this
    // connection until it is out.
    answer(c, wire::FrameType::kReadData, h.seq, wire::kStatusOk, h.length, std::move(pool));
    return c.fd >= 0;
  }
  c.rx_iov = std::move(pool);
  c.rx_at = 0;
  c.rx_left = h.length;
  c.rx_drain = false;
  c.rx = Conn::Rx::kPayload;
  return true;
}

bool Target::on_notify(TargetConn& c) {
  const wire::FrameHeader& h = c.h;
  // Where the sender stands now (our owner may have registered or removed
  // peers since its hello).
  const Claim claim = vouched_.claim_of(c.sender, c.key);
  if (claim == Claim::kImpostor) {
    refuse(
        c, counters_.refused_identity,
        fmt::format("a notification under registered peer {}'s name from another key", c.sender));
    return answer_and_close(c, wire::FrameType::kAck, h.seq, wire::kStatusNotYours);
  }
  // A registered peer's share is its own; the others share
  // kMaxQueuedNotifications besides their own share each.
  const bool queued =
      notes_.put(Sender{c.sender, c.key}, claim == Claim::kRegistered, c.sender, c.body);
  if (!queued) {
    bump(counters_.refused_notify);
    if (conns_.may_log()) {
      log().warn("kvxfer tcp {}: refused a notification from {}: its queue is full", agent_name_,
                 c.sender);
    }
  }
  answer(c, wire::FrameType::kAck, h.seq, queued ? wire::kStatusOk : wire::kStatusQueueFull);
  return c.fd >= 0;
}

// A write's bytes are in place: its last frame is acked.
bool Target::on_payload(Conn& c) {
  if ((c.h.flags & (wire::kMore | wire::kNotifyFollows)) == 0) {
    answer(c, wire::FrameType::kAck, c.h.seq, wire::kStatusOk);
  }
  return c.fd >= 0;
}

// A refusal's answer: nothing more is read as frames, and once the answer
// is out the connection ends in order (Conns::send(), begin_closing). False,
// for the frame handlers to return.
bool Target::answer_and_close(Conn& c, wire::FrameType type, std::uint64_t seq,
                              std::uint32_t status) {
  c.close_after_out = true;
  c.paused = true;
  answer(c, type, seq, status);
  return false;
}

void Target::answer(Conn& c, wire::FrameType type, std::uint64_t seq, std::uint32_t status,
                    std::uint64_t length, std::vector<iovec> pool) {
  Conn::Out o;
  wire::encode_header(o.answer.data(), wire::FrameHeader{type, 0, 0, status, seq, length});
  o.reply = !pool.empty();
  o.own.reserve(pool.size() + 1);
  c.out.push_back(std::move(o));
  Conn::Out& q = c.out.back();
  q.own.push_back(iovec{q.answer.data(), wire::kHeaderLen});
  q.own.insert(q.own.end(), pool.begin(), pool.end());
  if (q.reply || c.out.size() >= kMaxQueuedAnswers) c.paused = true;
  conns_.send(c);
}

void Target::on_close(Conn& conn, const char* /*why*/, Status /*status*/) {
  auto& c = static_cast<TargetConn&>(conn);
  if (!c.hello_done) waiting_hello_.erase(c.waiting_at);
  if (c.counted_unregistered) {
    c.counted_unregistered = false;
    --unregistered_conns_;
  }
  if (c.lineage == 0) return;
  auto it = fences_.find(c.lineage);
  if (it == fences_.end()) return;
  auto& open = it->second.conns;
  open.erase(std::remove(open.begin(), open.end(), &c), open.end());
  if (open.empty() && it->second.idle_at == idle_.end()) {
    it->second.idle_since = Clock::now();
    it->second.idle_at = idle_.insert(idle_.end(), c.lineage);
  }
}

void Target::refuse(TargetConn& c, std::atomic<std::uint64_t>& counter, const std::string& what) {
  conns_.refuse(counter, c.sender, what);
}

}  // namespace kvxfer::internal::tcp
