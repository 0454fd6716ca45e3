// SPDX-License-Identifier: Apache-2.0
// The target's side of the tcp lane's connections, on the I/O thread:
// accepting within the caps, the hello (token, MAC, identity, fence table),
// runs checked against the pool before a payload byte is read, notifications
// into the inbox, answers. Every byte here is a peer's: TcpLane's caps bound
// what it can grow. Touches its connections (through Conns), the pool, the
// registered peers (read) and the inbox (write).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/identity.h"
#include "engines/tcp/tcp_conn.h"
#include "engines/tcp/tcp_senders.h"
#include "kvxfer/transport.h"

namespace kvxfer::internal::tcp {

class Target final : public Role {
 public:
  // What the target side is given; each outlives it.
  struct Setup {
    const std::string& agent_name;  // ours, for logs
    Region pool;
    std::uint64_t token = 0;  // the one a hello must present
    const Identity& identity;
    const Vouched& vouched;
    Notes& notes;
    Counters& counters;
  };
  Target(Conns& conns, const Setup& setup);

  // Accepts what the listener holds, within the caps (refusing, or pushing
  // out the oldest connection without a hello).
  void accept_all(int listen_fd, const std::atomic<bool>& stopping);
  // Closes the connections late with their hello and forgets the lineages
  // idle for long enough (Conns closes the refused ones late to close).
  void expire(Clock::time_point now);

  bool on_header(Conn& c, wire::FrameHeader* h) override;
  bool on_body(Conn& c) override;
  bool on_payload(Conn& c) override;
  void on_sent(Xfer& /*x*/) override {}
  void on_close(Conn& c, const char* why, Status status) override;

 private:
  // Per initiator lineage, the newest registration it presented.
  struct Lineage {
    std::uint64_t gen = 0;
    std::uint64_t epoch = 0;
    IdentityKey key{};               // a lineage is one identity's: another key is refused
    std::vector<TargetConn*> conns;  // open connections of this lineage
    Clock::time_point idle_since{};
    std::list<std::uint64_t>::iterator idle_at;  // in idle_ while conns is empty, else its end
  };

  void take(int fd);
  void push_out_oldest();
  // c no longer waits for its hello: it said one, or was refused.
  void said_hello(TargetConn& c);
  bool on_hello(TargetConn& c);
  [[nodiscard]] bool proves_key(const TargetConn& c, const wire::Hello& hello) const;
  // kStatusOk once the hello's lineage admits c, else why not (counted).
  std::uint32_t fence(TargetConn& c, const wire::Hello& hello, bool registered);
  Lineage* lineage_of(TargetConn& c, const wire::Hello& hello, bool registered);
  bool refuse_hello(TargetConn& c, std::uint32_t status);
  bool on_runs(TargetConn& c);
  bool on_notify(TargetConn& c);
  void answer(Conn& c, wire::FrameType type, std::uint64_t seq, std::uint32_t status,
              std::uint64_t length = 0, std::vector<iovec> pool = {});
  bool answer_and_close(Conn& c, wire::FrameType type, std::uint64_t seq, std::uint32_t status);
  void refuse(TargetConn& c, std::atomic<std::uint64_t>& counter, const std::string& what);

  Conns& conns_;
  const std::string& agent_name_;
  std::uint8_t* const pool_base_;
  const std::uint64_t pool_len_;
  const std::uint64_t token_;
  const Identity& identity_;
  const Vouched& vouched_;
  Notes& notes_;
  Counters& counters_;

  // Open connections without a hello yet, oldest first (so by deadline).
  std::list<TargetConn*> waiting_hello_;
  std::unordered_map<std::uint64_t, Lineage> fences_;
  // The lineages without an open connection, longest idle first.
  std::list<std::uint64_t> idle_;
  // Lineages per identity key, and welcomed connections whose key was no
  // registered peer's when they said hello.
  std::map<IdentityKey, std::size_t> lineages_per_key_;
  std::size_t unregistered_conns_ = 0;
};

}  // namespace kvxfer::internal::tcp
