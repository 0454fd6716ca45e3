// SPDX-License-Identifier: Apache-2.0
// The tcp lane against hand-written hostile clients (the threat model in
// docs/reliability.md): a real Transport listens, and a test client that
// knows only what its metadata says (port, token) sends frames of its own
// making over a plain socket. Every refusal is observable: the connection
// closes, a counter moves, and no byte outside what the frame was allowed
// to write changes. Then what a process opens and keeps: its listeners and
// its descriptors across many registrations.
#include "engines/tcp/tcp_lane.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/identity.h"
#include "engines/tcp/tcp_handshake.h"
#include "engines/tcp/tcp_socket.h"
#include "it_pool.h"
#include "kvxfer/transport.h"
#include "wire/metadata.h"
#include "wire/peer_blob.h"
#include "wire/tcp_frame.h"

namespace kvxfer::it {
namespace {

using namespace std::chrono_literals;
namespace tcp = internal::tcp;

constexpr std::uint64_t kBlocks = 16;
constexpr std::uint64_t kBlockLen = 4096;
constexpr std::uint64_t kGuard = 64 * 1024;

Options tcp_options() {
  Options options;
  options.engine_config = {{"KVXFER_LANES", "tcp"}};
  return options;
}

// A target on the tcp lane, with a guard after its pool.
class TcpTarget {
 public:
  explicit TcpTarget(const Options& options = tcp_options())
      : pool_(kBlocks, kBlockLen, kGuard),
        transport_("target", Region{pool_.base(), kBlocks, kBlockLen}, options) {
    const wire::AgentMetadata m = wire::decode(transport_.agent_metadata());
    wire::PeerBlob blob;
    if (!wire::decode_blob(m.engine_blob, &blob)) throw std::runtime_error("bad blob");
    token_ = blob.tcp_token;
    port_ = blob.tcp_port;
    key_ = blob.tcp_key;
  }

  [[nodiscard]] std::uint64_t token() const { return token_; }
  [[nodiscard]] const internal::IdentityKey& key() const { return key_; }
  [[nodiscard]] std::uint16_t port() const { return port_; }
  [[nodiscard]] MappedPool& pool() { return pool_; }
  [[nodiscard]] Transport& transport() { return transport_; }
  [[nodiscard]] std::uint64_t counter(const std::string& name) {
    const auto counters = transport_.stats().engine_counters;
    const auto it = counters.find(name);
    return it == counters.end() ? 0 : it->second;
  }
  // Waits until counter `name` reaches `at_least` (the I/O thread counts
  // on its own time); false after 5 s.
  bool wait_counter(const std::string& name, std::uint64_t at_least) {
    for (int i = 0; i < 500; ++i) {
      if (counter(name) >= at_least) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

 private:
  MappedPool pool_;
  Transport transport_;
  std::uint64_t token_ = 0;
  std::uint16_t port_ = 0;
  internal::IdentityKey key_{};
};

// A plain TCP client on loopback.
class Client {
 public:
  explicit Client(std::uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
      throw std::runtime_error("connect failed");
    }
  }
  ~Client() {
    if (fd_ >= 0) close(fd_);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The target's challenge, its first bytes on the connection (read once).
  const std::vector<std::uint8_t>& challenge() {
    if (challenge_.empty()) {
      challenge_.resize(wire::kHeaderLen + wire::kNonceLen);
      std::size_t have = 0;
      while (have < challenge_.size()) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 5000) != 1) throw std::runtime_error("no challenge");
        const ssize_t n = ::recv(fd_, challenge_.data() + have, challenge_.size() - have, 0);
        if (n <= 0) throw std::runtime_error("no challenge");
        have += static_cast<std::size_t>(n);
      }
    }
    return challenge_;
  }

  // The keys of the hello we build next: they tag our frames once it is
  // sent, and check the target's answers.
  void expect_keys(const internal::tcp::HandshakeKeys& keys) {
    next_tx_ = keys.to_target;
    next_rx_ = keys.to_initiator;
  }

  // Sends `bytes` as an honest client would: every whole frame in them
  // after our hello gets its tag, in order (a frame split across calls is
  // held until its header and body are all there; a payload passes as it
  // comes); bytes that do not decode as a frame go as they are. False once
  // the target closed the connection.
  bool send_bytes(const std::vector<std::uint8_t>& bytes) {
    last_sent_ = tagged(bytes);
    return send_raw(last_sent_);
  }

  // `bytes` as send_bytes() would send them (the frames count as sent).
  std::vector<std::uint8_t> tagged(const std::vector<std::uint8_t>& bytes) {
    std::vector<std::uint8_t> out;
    for (std::size_t i = 0; i < bytes.size();) {
      if (raw_ || skip_ > 0) {
        const std::size_t left = bytes.size() - i;
        const std::size_t n = raw_ ? left : std::min<std::size_t>(skip_, left);
        out.insert(out.end(), bytes.begin() + static_cast<long>(i),
                   bytes.begin() + static_cast<long>(i + n));
        if (!raw_) skip_ -= n;
        i += n;
        continue;
      }
      pending_.push_back(bytes[i++]);
      if (pending_.size() == wire::kHeaderLen && !wire::decode_header(pending_, &pending_h_)) {
        raw_ = true;  // not a frame: the rest goes as it is
        out.insert(out.end(), pending_.begin(), pending_.end());
        pending_.clear();
        continue;
      }
      if (pending_.size() < wire::kHeaderLen ||
          pending_.size() < wire::kHeaderLen + body_len(pending_h_)) {
        continue;
      }
      const std::span<std::uint8_t, wire::kHeaderLen> head(pending_.data(), wire::kHeaderLen);
      if (pending_h_.type == wire::FrameType::kHello) {
        if (next_tx_) {
          EXPECT_TRUE(tx_.start(*next_tx_));
          EXPECT_TRUE(rx_.start(*next_rx_));
          next_tx_.reset();
        }
      } else if (tx_.started()) {
        EXPECT_TRUE(tx_.sign(head.first<wire::kFieldsLen>(),
                             std::span(pending_).subspan(wire::kHeaderLen), wire::tag_slot(head)));
      }
      skip_ = pending_h_.type == wire::FrameType::kWrite ? pending_h_.length : 0;
      out.insert(out.end(), pending_.begin(), pending_.end());
      pending_.clear();
    }
    return out;
  }

  // What the last send_bytes() sent, tags and all.
  [[nodiscard]] const std::vector<std::uint8_t>& last_sent() const { return last_sent_; }

  // Sends `bytes` as they are.
  bool send_raw(const std::vector<std::uint8_t>& bytes) {
    std::size_t at = 0;
    while (at < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return false;
      at += static_cast<std::size_t>(n);
    }
    return true;
  }

  // The next frame header from the target, or nothing when the connection
  // closed (or nothing came within `timeout`).
  std::optional<wire::FrameHeader> next_header(std::chrono::milliseconds timeout = 5s) {
    if (challenge_.empty()) (void)challenge();  // what the target sent first
    std::array<std::uint8_t, wire::kHeaderLen> head{};
    std::size_t have = 0;
    while (have < head.size()) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return std::nullopt;
      const ssize_t n = ::recv(fd_, head.data() + have, head.size() - have, 0);
      if (n <= 0) return std::nullopt;
      have += static_cast<std::size_t>(n);
    }
    wire::FrameHeader h;
    if (!wire::decode_header(head, &h)) return std::nullopt;
    last_tag_ok_ =
        rx_.started() && rx_.verify(wire::header_fields(head), {}, wire::header_tag(head));
    return h;
  }

  // Whether the last header next_header() returned carried the target's
  // tag for its place (answers have no body).
  [[nodiscard]] bool last_tag_ok() const { return last_tag_ok_; }

  // True once the target closed the connection (EOF or reset) within
  // `timeout`.
  bool closed_by_target(std::chrono::milliseconds timeout = 5s) {
    std::array<std::uint8_t, 4096> buf{};
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
      const ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
      if (n <= 0) return true;
    }
  }

  [[nodiscard]] int fd() const { return fd_; }

 private:
  int fd_ = -1;
  std::vector<std::uint8_t> challenge_;
  std::optional<internal::tcp::FrameKey> next_tx_;
  std::optional<internal::tcp::FrameKey> next_rx_;
  internal::tcp::FrameAuth tx_;
  internal::tcp::FrameAuth rx_;
  std::vector<std::uint8_t> pending_;
  wire::FrameHeader pending_h_;
  std::uint64_t skip_ = 0;
  bool raw_ = false;
  bool last_tag_ok_ = false;
  std::vector<std::uint8_t> last_sent_;
};

std::vector<std::uint8_t> header(const wire::FrameHeader& h) {
  std::vector<std::uint8_t> out(wire::kHeaderLen);
  wire::encode_header(out.data(), h);
  return out;
}

// The identity the test clients present unless a test gives its own.
const internal::Identity& client_identity() {
  static const internal::Identity id;
  return id;
}

// A hello on connection `c` to target `t` presenting `token`, with `id`'s
// key and the proof over c's challenge that `id`'s private key gives;
// `mac_by` (when given) computes the proof instead, as a client that does
// not hold `id`'s private key would. c tags its frames with the keys that
// come with it once it is sent.
std::vector<std::uint8_t> hello(Client& c, const TcpTarget& t, std::uint64_t token,
                                std::uint64_t lineage, std::uint64_t gen, std::uint64_t epoch,
                                std::string_view name,
                                const internal::Identity& id = client_identity(),
                                const internal::Identity* mac_by = nullptr) {
  std::vector<std::uint8_t> out =
      header({wire::FrameType::kHello, 0, static_cast<std::uint32_t>(name.size()), 0, 0, 0});
  out.resize(wire::kHeaderLen + wire::kHelloFixedLen + name.size() + wire::kHelloProofLen);
  wire::Hello h{token, lineage, gen, epoch, name};
  h.key = id.public_key();
  if (!internal::tcp::fresh_nonce(&h.nonce)) throw std::runtime_error("no nonce");
  wire::encode_hello_body(out.data() + wire::kHeaderLen, h);
  const auto sent = std::span<const std::uint8_t>(out);
  internal::tcp::HandshakeKeys keys;
  if (!internal::tcp::handshake_keys(mac_by != nullptr ? *mac_by : id, t.key(), true,
                                     c.challenge(), sent.first(wire::kHeaderLen),
                                     wire::hello_proven_part(sent.subspan(wire::kHeaderLen)),
                                     &keys)) {
    throw std::runtime_error("no handshake keys");
  }
  std::copy(keys.proof.begin(), keys.proof.end(),
            out.end() - static_cast<std::ptrdiff_t>(wire::kHelloProofLen));
  c.expect_keys(keys);
  return out;
}

// A write frame of one run (offset, length) of the target's region `region`
// (its pool unless given) with `length` bytes of `fill` after it.
std::vector<std::uint8_t> write_frame(std::uint64_t seq, std::uint64_t offset, std::uint64_t length,
                                      std::uint8_t fill, std::uint64_t region = 0) {
  std::vector<std::uint8_t> out = header({wire::FrameType::kWrite, 0, 1, 0, seq, length});
  out.resize(wire::kHeaderLen + wire::kRunLen);
  wire::put_run_at(out.data() + wire::kHeaderLen, region, offset, length);
  out.resize(out.size() + length, fill);
  return out;
}

std::vector<std::uint8_t> notify_frame(std::uint64_t seq, std::string_view message) {
  std::vector<std::uint8_t> out = header({wire::FrameType::kNotify, 0, 0, 0, seq, message.size()});
  out.insert(out.end(), message.begin(), message.end());
  return out;
}

// Says hello with the target's token; true once welcomed.
bool greet(Client& c, const TcpTarget& t, std::uint64_t lineage = 7, std::uint64_t gen = 1,
           std::uint64_t epoch = 11, std::string_view name = "mallory",
           const internal::Identity& id = client_identity()) {
  if (!c.send_bytes(hello(c, t, t.token(), lineage, gen, epoch, name, id))) return false;
  const auto h = c.next_header();
  return h && h->type == wire::FrameType::kWelcome;
}

bool pool_is_zero(MappedPool& pool) {
  for (std::uint64_t i = 0; i < pool.len(); ++i) {
    if (pool.base()[i] != 0) return false;
  }
  return true;
}

TEST(TcpHostile, AHelloWithoutTheTokenIsClosedAndCounted) {
  TcpTarget t;
  Client c(t.port());
  ASSERT_TRUE(c.send_bytes(hello(c, t, t.token() ^ 1, 7, 1, 11, "mallory")));
  // Then a write the target must never read.
  c.send_bytes(write_frame(1, 0, kBlockLen, 0xab));
  EXPECT_TRUE(c.closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_token", 1));
  EXPECT_TRUE(pool_is_zero(t.pool()));
}

TEST(TcpHostile, AFirstFrameThatIsNotAHelloIsClosedBeforeItsBodyIsRead) {
  TcpTarget t;
  Client c(t.port());
  ASSERT_TRUE(c.send_bytes(write_frame(1, 0, kBlockLen, 0xab)));
  EXPECT_TRUE(c.closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_token", 1));
  EXPECT_TRUE(pool_is_zero(t.pool()));
}

TEST(TcpHostile, AConnectionThatSaysNothingIsClosedAfterTheHelloTimeout) {
  TcpTarget t;
  Client c(t.port());
  // After kHelloTimeout, found by the I/O thread's once-a-second sweep.
  EXPECT_TRUE(c.closed_by_target(internal::tcp::TcpLane::kHelloTimeout + 5s));
  EXPECT_TRUE(t.wait_counter("tcp_refused_token", 1));
}

TEST(TcpHostile, AWriteWithARunPastThePoolIsRefusedAndNothingLands) {
  TcpTarget t;
  Client c(t.port());
  ASSERT_TRUE(greet(c, t));
  const std::uint64_t pool_len = kBlocks * kBlockLen;
  ASSERT_TRUE(c.send_bytes(write_frame(1, pool_len - 128, 256, 0xab)));
  const auto ack = c.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->type, wire::FrameType::kAck);
  EXPECT_EQ(ack->status, wire::kStatusRefused);
  EXPECT_TRUE(c.closed_by_target());
  EXPECT_EQ(t.counter("tcp_refused_runs"), 1u);
  EXPECT_EQ(t.pool().guard_mismatch(), -1);
  EXPECT_TRUE(pool_is_zero(t.pool()));
}

TEST(TcpHostile, ARefusalReachesThePeerBeforeTheConnectionCloses) {
  TcpTarget t;
  Client c(t.port());
  ASSERT_TRUE(greet(c, t));
  const std::uint64_t pool_len = kBlocks * kBlockLen;
  // The refused frame's payload and more frames after it: bytes the target
  // never reads as frames. A reset with them unread could discard the
  // refusal; the target shuts its side down after the refusal instead and
  // drops what follows until we close.
  auto bytes = write_frame(1, pool_len - 128, 256, 0xab);
  for (std::uint64_t seq = 2; seq < 40; ++seq) {
    const auto more = write_frame(seq, 0, kBlockLen, 0xcd);
    bytes.insert(bytes.end(), more.begin(), more.end());
  }
  ASSERT_TRUE(c.send_bytes(bytes));
  const auto ack = c.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->status, wire::kStatusRefused);
  // Then an orderly end of stream (FIN), not a reset.
  std::array<std::uint8_t, 64> buf{};
  pollfd p{c.fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  errno = 0;
  const ssize_t n = ::recv(c.fd(), buf.data(), buf.size(), 0);
  EXPECT_EQ(n, 0) << "errno " << errno;
  EXPECT_TRUE(pool_is_zero(t.pool()));
  EXPECT_EQ(t.counter("tcp_refused_runs"), 1u);
  // Whatever we send now is dropped, never read as a frame.
  c.send_bytes(write_frame(99, 0, kBlockLen, 0xef));
  std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(pool_is_zero(t.pool()));
  EXPECT_EQ(t.counter("tcp_refused_frame"), 0u);
}

TEST(TcpHostile, AWriteInsideThePoolLandsAndIsAckedAfterItsBytes) {
  TcpTarget t;
  Client c(t.port());
  ASSERT_TRUE(greet(c, t));
  ASSERT_TRUE(c.send_bytes(write_frame(5, 3 * kBlockLen, kBlockLen, 0x5a)));
  const auto ack = c.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->type, wire::FrameType::kAck);
  EXPECT_EQ(ack->seq, 5u);
  EXPECT_EQ(ack->status, wire::kStatusOk);
  for (std::uint64_t i = 0; i < kBlockLen; ++i) ASSERT_EQ(t.pool().block(3)[i], 0x5a) << i;
  EXPECT_EQ(t.pool().block(2)[kBlockLen - 1], 0);
  EXPECT_EQ(t.pool().block(4)[0], 0);
}

// The target waits for a payload's bytes in bulk (SO_RCVLOWAT): a payload
// that trickles in still lands, and the frames after it, smaller than what
// it waited for, still wake the target.
TEST(TcpLane, APayloadThatTricklesInLandsAndTheSmallFramesAfterItAreHeard) {
  TcpTarget t;
  Client c(t.port());
  ASSERT_TRUE(greet(c, t, 7, 1, 11, "alice"));
  const std::vector<std::uint8_t> frame = write_frame(5, 0, 8 * kBlockLen, 0x33);
  const std::size_t cuts[] = {wire::kHeaderLen + wire::kRunLen + 1000, 20'000, frame.size()};
  std::size_t at = 0;
  for (const std::size_t cut : cuts) {
    ASSERT_TRUE(c.send_bytes(std::vector<std::uint8_t>(frame.begin() + static_cast<long>(at),
                                                       frame.begin() + static_cast<long>(cut))));
    at = cut;
    std::this_thread::sleep_for(50ms);
  }
  auto ack = c.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->seq, 5u);
  EXPECT_EQ(ack->status, wire::kStatusOk);
  for (std::uint64_t i = 0; i < 8 * kBlockLen; ++i) ASSERT_EQ(t.pool().base()[i], 0x33) << i;
  // One block, then a notification: each far less than the payload's rest
  // the target last waited for.
  ASSERT_TRUE(c.send_bytes(write_frame(6, 9 * kBlockLen, kBlockLen, 0x44)));
  ack = c.next_header(2s);
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->seq, 6u);
  EXPECT_EQ(t.pool().block(9)[kBlockLen - 1], 0x44);
  ASSERT_TRUE(c.send_bytes(notify_frame(7, "after the bytes")));
  ack = c.next_header(2s);
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->seq, 7u);
  EXPECT_EQ(ack->status, wire::kStatusOk);
  EXPECT_EQ(t.transport().get_notifications().count("alice"), 1u);
}

TEST(TcpHostile, AHeaderWithAHugeRunCountIsRefusedBeforeAnythingIsAllocated) {
  TcpTarget t;
  Client c(t.port());
  ASSERT_TRUE(greet(c, t));
  ASSERT_TRUE(c.send_bytes(header({wire::FrameType::kWrite, 0, 1u << 30, 0, 1, 1u << 30})));
  EXPECT_TRUE(c.closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_frame", 1));
}

TEST(TcpHostile, AnOversizedNotificationIsRefusedFromItsHeader) {
  TcpTarget t;
  Client c(t.port());
  ASSERT_TRUE(greet(c, t));
  // 1 GiB announced; the header alone is refused, nothing is reassembled.
  ASSERT_TRUE(c.send_bytes(header({wire::FrameType::kNotify, 0, 0, 0, 1, 1u << 30})));
  EXPECT_TRUE(c.closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_frame", 1));
  EXPECT_TRUE(t.transport().get_notifications().empty());
}

TEST(TcpHostile, ANotificationCarriesTheNameItsConnectionPresented) {
  TcpTarget t;
  Client c(t.port());
  ASSERT_TRUE(greet(c, t, 7, 1, 11, "alice"));
  ASSERT_TRUE(c.send_bytes(notify_frame(1, "hello from alice")));
  const auto ack = c.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->status, wire::kStatusOk);
  const auto notes = t.transport().get_notifications();
  ASSERT_EQ(notes.size(), 1u);
  ASSERT_EQ(notes.count("alice"), 1u);
  const auto& message = notes.at("alice").at(0);
  EXPECT_EQ(std::string(message.begin(), message.end()), "hello from alice");
}

TEST(TcpHostile, OneSendersNotificationFloodCostsOnlyThatSender) {
  TcpTarget t;
  Client flood(t.port());
  Client honest(t.port());
  ASSERT_TRUE(greet(flood, t, 1, 1, 11, "flood"));
  ASSERT_TRUE(greet(honest, t, 2, 1, 12, "honest"));
  const std::size_t limit = internal::tcp::TcpLane::kMaxQueuedPerSender;
  std::vector<std::uint8_t> burst;
  for (std::size_t i = 0; i < limit + 10; ++i) {
    const auto f = notify_frame(i + 1, "x");
    burst.insert(burst.end(), f.begin(), f.end());
  }
  std::thread sender([&] { flood.send_bytes(burst); });
  std::size_t ok = 0;
  std::size_t full = 0;
  for (std::size_t i = 0; i < limit + 10; ++i) {
    const auto ack = flood.next_header();
    ASSERT_TRUE(ack.has_value()) << i;
    (ack->status == wire::kStatusOk ? ok : full) += 1;
  }
  sender.join();
  EXPECT_EQ(ok, limit);
  EXPECT_EQ(full, 10u);
  ASSERT_TRUE(honest.send_bytes(notify_frame(1, "still heard")));
  const auto ack = honest.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->status, wire::kStatusOk);
  const auto notes = t.transport().get_notifications();
  EXPECT_EQ(notes.at("flood").size(), limit);
  ASSERT_EQ(notes.at("honest").size(), 1u);
  EXPECT_EQ(t.counter("tcp_refused_notify"), 10u);
}

TEST(TcpHostile, ANewerRegistrationClosesTheOlderConnectionOfItsLineage) {
  TcpTarget t;
  Client old_conn(t.port());
  ASSERT_TRUE(greet(old_conn, t, /*lineage=*/42, /*gen=*/1, /*epoch=*/100));
  Client new_conn(t.port());
  ASSERT_TRUE(greet(new_conn, t, 42, 2, 200));
  EXPECT_TRUE(old_conn.closed_by_target());
  // What the old registration sends now is never read.
  old_conn.send_bytes(write_frame(1, 0, kBlockLen, 0xee));
  ASSERT_TRUE(new_conn.send_bytes(write_frame(1, kBlockLen, kBlockLen, 0x22)));
  const auto ack = new_conn.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->status, wire::kStatusOk);
  EXPECT_EQ(t.pool().block(0)[0], 0);
  EXPECT_EQ(t.pool().block(1)[0], 0x22);
  EXPECT_EQ(t.counter("tcp_fences_superseded"), 1u);
}

TEST(TcpHostile, AnOlderRegistrationArrivingLateIsRefused) {
  TcpTarget t;
  Client new_conn(t.port());
  ASSERT_TRUE(greet(new_conn, t, 42, 2, 200));
  Client late(t.port());
  ASSERT_TRUE(late.send_bytes(hello(late, t, t.token(), 42, 1, 100, "mallory")));
  late.send_bytes(write_frame(1, 0, kBlockLen, 0xee));
  // Told why (it held the token), then closed.
  const auto refusal = late.next_header();
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(refusal->type, wire::FrameType::kWelcome);
  EXPECT_EQ(refusal->status, wire::kStatusStaleFence);
  EXPECT_TRUE(late.closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_stale_fence", 1));
  EXPECT_EQ(t.pool().block(0)[0], 0);
  // The newer registration is untouched.
  ASSERT_TRUE(new_conn.send_bytes(write_frame(1, 0, kBlockLen, 0x33)));
  const auto ack = new_conn.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->status, wire::kStatusOk);
}

TEST(TcpHostile, AReaderThatNeverReadsRepliesStallsOnlyItsOwnConnection) {
  TcpTarget t;
  Client reader(t.port());
  ASSERT_TRUE(greet(reader, t, 1, 1, 11, "reader"));
  // Many requests for the whole pool, none of the replies read.
  std::vector<std::uint8_t> requests;
  const std::uint64_t pool_len = kBlocks * kBlockLen;
  for (int i = 0; i < 20000; ++i) {
    auto h =
        header({wire::FrameType::kReadReq, 0, 1, 0, static_cast<std::uint64_t>(i + 1), pool_len});
    h.resize(wire::kHeaderLen + wire::kRunLen);
    wire::put_run_at(h.data() + wire::kHeaderLen, 0, 0, pool_len);
    requests.insert(requests.end(), h.begin(), h.end());
  }
  // The target stops reading them once its replies back up, so this send
  // does not finish: give it a few seconds on a thread of its own.
  std::thread sender([&] { reader.send_bytes(requests); });
  std::this_thread::sleep_for(1s);
  Client honest(t.port());
  ASSERT_TRUE(greet(honest, t, 2, 1, 12, "honest"));
  ASSERT_TRUE(honest.send_bytes(write_frame(1, 0, kBlockLen, 0x44)));
  const auto ack = honest.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->status, wire::kStatusOk);
  EXPECT_EQ(t.pool().block(0)[0], 0x44);
  // Far fewer replies went out than were asked for.
  EXPECT_LT(t.counter("tcp_bytes_sent"), 2000 * pool_len);
  shutdown(reader.fd(), SHUT_RDWR);
  sender.join();
}

TEST(TcpHostile, AFloodOfLineagesFailsClosedAndForgetsNoFence) {
  TcpTarget t;
  // An honest initiator's registration (lineage 1, generation 2).
  Client honest(t.port());
  ASSERT_TRUE(greet(honest, t, 1, 2, 22, "honest"));
  // Every other slot of the fence table, one short-lived connection each,
  // under as many keys as one key's share of lineages asks for.
  auto id = std::make_unique<internal::Identity>();
  for (std::uint64_t lineage = 2; lineage <= internal::tcp::TcpLane::kMaxLineages; ++lineage) {
    if (lineage % internal::tcp::TcpLane::kMaxLineagesPerPeer == 0) {
      id = std::make_unique<internal::Identity>();
    }
    Client c(t.port());
    ASSERT_TRUE(greet(c, t, lineage, 1, 1, "mallory", *id)) << lineage;
  }
  // Full: a new lineage is refused rather than an old one forgotten.
  Client newcomer(t.port());
  ASSERT_TRUE(newcomer.send_bytes(hello(newcomer, t, t.token(), 999999, 1, 1, "newcomer")));
  const auto refusal = newcomer.next_header();
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(refusal->status, wire::kStatusTableFull);
  EXPECT_TRUE(newcomer.closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_full", 1));
  // The honest lineage's older generation is still refused...
  Client stale(t.port());
  ASSERT_TRUE(stale.send_bytes(hello(stale, t, t.token(), 1, 1, 11, "honest")));
  EXPECT_TRUE(stale.closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_stale_fence", 1));
  // ...and its registration still writes.
  ASSERT_TRUE(honest.send_bytes(write_frame(1, 0, kBlockLen, 0x66)));
  const auto ack = honest.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->status, wire::kStatusOk);
  EXPECT_EQ(t.pool().block(0)[0], 0x66);
}

TEST(TcpHostile, AHelloWhoseMacDoesNotProveItsKeyIsRefused) {
  TcpTarget t;
  // The client presents client_identity()'s public key but does not hold
  // its private half: its MAC is under another key pair's connection key.
  const internal::Identity forger;
  Client c(t.port());
  ASSERT_TRUE(c.send_bytes(hello(c, t, t.token(), 7, 1, 11, "mallory", client_identity(), &forger)));
  c.send_bytes(write_frame(1, 0, kBlockLen, 0xee));
  const auto refusal = c.next_header();
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(refusal->status, wire::kStatusUnproven);
  EXPECT_TRUE(c.closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_identity", 1));
  EXPECT_TRUE(pool_is_zero(t.pool()));
  // A hello with a MAC bit flipped is refused the same way.
  Client flipped(t.port());
  auto bytes = hello(flipped, t, t.token(), 8, 1, 12, "mallory");
  bytes.back() ^= 1;
  ASSERT_TRUE(flipped.send_bytes(bytes));
  EXPECT_TRUE(flipped.closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_identity", 2));
}

TEST(TcpHostile, AnotherIdentityCannotTakeOverALineage) {
  TcpTarget t;
  Client owner(t.port());
  ASSERT_TRUE(greet(owner, t, /*lineage=*/42, /*gen=*/1, /*epoch=*/100, "alice"));
  // Someone who learned the lineage (it is no secret) presents a newer
  // generation of it under a key of its own: refused, and the owner's
  // connection is not superseded.
  const internal::Identity other;
  Client thief(t.port());
  ASSERT_TRUE(thief.send_bytes(hello(thief, t, t.token(), 42, 2, 200, "alice", other)));
  EXPECT_TRUE(thief.closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_identity", 1));
  EXPECT_EQ(t.counter("tcp_fences_superseded"), 0u);
  ASSERT_TRUE(owner.send_bytes(write_frame(1, 0, kBlockLen, 0x51)));
  const auto ack = owner.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->status, wire::kStatusOk);
  EXPECT_EQ(t.pool().block(0)[0], 0x51);
}

TEST(TcpHostile, OneRegistrationHoldsAFewConnectionsAtMost) {
  TcpTarget t;
  std::vector<std::unique_ptr<Client>> held;
  for (std::size_t i = 0; i < internal::tcp::TcpLane::kMaxConnectionsPerLineage; ++i) {
    held.push_back(std::make_unique<Client>(t.port()));
    ASSERT_TRUE(greet(*held.back(), t, 42, 1, 100)) << i;
  }
  Client extra(t.port());
  ASSERT_TRUE(extra.send_bytes(hello(extra, t, t.token(), 42, 1, 100, "mallory")));
  const auto refusal = extra.next_header();
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(refusal->status, wire::kStatusTableFull);
  EXPECT_TRUE(extra.closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_full", 1));
}

TEST(TcpHostile, SilentConnectionsDoNotKeepAHelloOut) {
  TcpTarget t;
  // Every slot for connections without a hello, held by silent clients.
  std::vector<std::unique_ptr<Client>> silent;
  for (std::size_t i = 0; i < internal::tcp::TcpLane::kMaxPendingHellos; ++i) {
    silent.push_back(std::make_unique<Client>(t.port()));
  }
  // The I/O thread takes them in before the next one arrives.
  std::this_thread::sleep_for(200ms);
  // A client that says hello at once gets in; the oldest silent one goes.
  Client honest(t.port());
  ASSERT_TRUE(greet(honest, t, 1, 1, 11, "honest"));
  EXPECT_TRUE(silent.front()->closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_full", 1));
  ASSERT_TRUE(honest.send_bytes(write_frame(1, 0, kBlockLen, 0x52)));
  const auto ack = honest.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->status, wire::kStatusOk);
}

// A second Transport on the tcp lane, registered by a target as a peer:
// the honest party whose name the hostile clients below borrow.
class Peer {
 public:
  explicit Peer(const std::string& name)
      : pool_(kBlocks, kBlockLen, kGuard),
        transport_(name, Region{pool_.base(), kBlocks, kBlockLen}, tcp_options()) {}
  // `t` registers us under our name, and we register `t` as "target".
  void register_both_ways(TcpTarget& t) {
    t.transport().add_remote_peer(transport_.agent_name(), transport_.agent_metadata(),
                                  reinterpret_cast<std::uintptr_t>(pool_.base()), kBlocks,
                                  kBlockLen);
    transport_.add_remote_peer("target", t.transport().agent_metadata(),
                               reinterpret_cast<std::uintptr_t>(t.pool().base()), kBlocks,
                               kBlockLen);
  }
  void unregister_target() { transport_.remove_remote_peer("target"); }
  // We register `t` as "target" with `metadata` (its own, or one a test
  // changed).
  void register_target(const std::vector<std::uint8_t>& metadata, TcpTarget& t) {
    transport_.add_remote_peer("target", metadata,
                               reinterpret_cast<std::uintptr_t>(t.pool().base()), kBlocks,
                               kBlockLen);
  }
  // Writes block 0 to the target's block `remote` with `message`; true once
  // done.
  bool write_with_note(std::int64_t remote, std::string_view message) {
    pool_.block(0)[0] = 0x5a;
    const std::vector<std::int64_t> local{0};
    const std::vector<std::int64_t> far{remote};
    const auto id = transport_.write_blocks(
        "target", local, far,
        std::span(reinterpret_cast<const std::uint8_t*>(message.data()), message.size()));
    if (!id) return false;
    for (int i = 0; i < 5000; ++i) {
      const PollResult r = transport_.poll("target");
      if (std::find(r.done.begin(), r.done.end(), *id) != r.done.end()) return true;
      if (std::find(r.failed.begin(), r.failed.end(), *id) != r.failed.end()) return false;
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }

 private:
  MappedPool pool_;
  Transport transport_;
};

TEST(TcpHostile, ARegisteredPeersNameWithAnotherKeyIsRefused) {
  TcpTarget t;
  Peer alice("alice");
  alice.register_both_ways(t);
  Client impostor(t.port());
  ASSERT_TRUE(impostor.send_bytes(hello(impostor, t, t.token(), 7, 1, 11, "alice")));
  const auto refusal = impostor.next_header();
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(refusal->status, wire::kStatusNotYours);
  EXPECT_TRUE(impostor.closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_identity", 1));
  // A transport of that name with its own key is refused, and told why.
  MappedPool other_pool(kBlocks, kBlockLen, kGuard);
  Transport other("alice", Region{other_pool.base(), kBlocks, kBlockLen}, tcp_options());
  try {
    other.add_remote_peer("target", t.transport().agent_metadata(),
                          reinterpret_cast<std::uintptr_t>(t.pool().base()), kBlocks, kBlockLen);
    ADD_FAILURE() << "a second alice was welcomed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("another identity key"), std::string::npos) << e.what();
  }
  // The real alice is heard under her name.
  ASSERT_TRUE(alice.write_with_note(3, "from alice"));
  EXPECT_EQ(t.pool().block(3)[0], 0x5a);
  const auto notes = t.transport().get_notifications();
  ASSERT_EQ(notes.count("alice"), 1u);
  ASSERT_EQ(notes.at("alice").size(), 1u);
  EXPECT_EQ(std::string(notes.at("alice")[0].begin(), notes.at("alice")[0].end()), "from alice");
}

TEST(TcpHostile, NotesAnImpostorQueuedBeforeTheRegistrationAreNotHandedOut) {
  TcpTarget t;
  Client impostor(t.port());
  ASSERT_TRUE(greet(impostor, t, 7, 1, 11, "alice"));
  ASSERT_TRUE(impostor.send_bytes(notify_frame(1, "forged")));
  const auto ack = impostor.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->status, wire::kStatusOk);
  // Now the target's owner registers the real alice.
  Peer alice("alice");
  alice.register_both_ways(t);
  ASSERT_TRUE(alice.write_with_note(2, "real"));
  const auto notes = t.transport().get_notifications();
  ASSERT_EQ(notes.count("alice"), 1u);
  ASSERT_EQ(notes.at("alice").size(), 1u);
  EXPECT_EQ(std::string(notes.at("alice")[0].begin(), notes.at("alice")[0].end()), "real");
  EXPECT_GE(t.counter("tcp_refused_identity"), 1u);
  // The impostor's next notification is refused and its connection closed.
  ASSERT_TRUE(impostor.send_bytes(notify_frame(2, "forged again")));
  const auto refusal = impostor.next_header();
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(refusal->status, wire::kStatusNotYours);
  EXPECT_TRUE(impostor.closed_by_target());
  EXPECT_TRUE(t.transport().get_notifications().empty());
}

TEST(TcpHostile, UnregisteredSendersCannotFillARegisteredPeersQueue) {
  TcpTarget t;
  Peer alice("alice");
  alice.register_both_ways(t);
  // Senders nobody registered fill their shared share, one name each up to
  // the per-sender limit.
  const std::size_t per_sender = internal::tcp::TcpLane::kMaxQueuedPerSender;
  const std::size_t names = kMaxQueuedNotifications / per_sender + 1;
  std::size_t ok = 0;
  std::size_t full = 0;
  for (std::size_t n = 0; n < names; ++n) {
    Client c(t.port());
    ASSERT_TRUE(greet(c, t, 100 + n, 1, 11, "flood" + std::to_string(n)));
    std::vector<std::uint8_t> burst;
    for (std::size_t i = 0; i < per_sender; ++i) {
      const auto f = notify_frame(i + 1, "x");
      burst.insert(burst.end(), f.begin(), f.end());
    }
    std::thread sender([&] { c.send_bytes(burst); });
    for (std::size_t i = 0; i < per_sender; ++i) {
      const auto ack = c.next_header();
      ASSERT_TRUE(ack.has_value()) << n << " " << i;
      (ack->status == wire::kStatusOk ? ok : full) += 1;
    }
    sender.join();
  }
  EXPECT_EQ(ok, kMaxQueuedNotifications);
  EXPECT_EQ(full, names * per_sender - kMaxQueuedNotifications);
  // The registered peer is still heard.
  ASSERT_TRUE(alice.write_with_note(1, "still heard"));
  const auto notes = t.transport().get_notifications();
  ASSERT_EQ(notes.count("alice"), 1u);
  EXPECT_EQ(notes.at("alice").size(), 1u);
}

TEST(TcpHostile, ARegisteredPeerGetsInWhileTheLineageTableIsFull) {
  TcpTarget t;
  for (std::uint64_t lineage = 1; lineage <= internal::tcp::TcpLane::kMaxLineages; ++lineage) {
    Client c(t.port());
    ASSERT_TRUE(greet(c, t, lineage, 1, 1)) << lineage;
  }
  Client newcomer(t.port());
  ASSERT_TRUE(newcomer.send_bytes(hello(newcomer, t, t.token(), 999999, 1, 1, "newcomer")));
  EXPECT_TRUE(newcomer.closed_by_target());
  // A peer the target's owner registered still connects and writes.
  Peer alice("alice");
  alice.register_both_ways(t);
  ASSERT_TRUE(alice.write_with_note(4, "in"));
  EXPECT_EQ(t.pool().block(4)[0], 0x5a);
}

// Issue 46, item 2: the bytes of a hello recorded on one connection,
// replayed on another by someone who does not hold the key they prove.
TEST(TcpHostile, ARecordedHelloReplayedOnAnotherConnectionIsRefused) {
  TcpTarget t;
  Client first(t.port());
  const std::vector<std::uint8_t> recorded = hello(first, t, t.token(), 77, 1, 11, "dave");
  ASSERT_TRUE(first.send_bytes(recorded));
  const auto welcome = first.next_header();
  ASSERT_TRUE(welcome.has_value());
  ASSERT_EQ(welcome->status, wire::kStatusOk);
  // The attacker replays the same bytes on a connection of its own, then
  // a notification as dave.
  Client replay(t.port());
  replay.send_bytes(recorded);
  replay.send_bytes(notify_frame(1, "forged"));
  const auto answer = replay.next_header();
  EXPECT_TRUE(!answer.has_value() || answer->status != wire::kStatusOk)
      << "a replayed hello was welcomed";
  EXPECT_TRUE(replay.closed_by_target());
  EXPECT_EQ(t.transport().get_notifications().count("dave"), 0u);
}

// Issue 46, item 2 (continued): after the handshake, a frame is the
// connection's next one in its direction or it is refused. An on-path
// attacker can inject bytes but not their tag.
TEST(TcpHostile, AnInjectedFrameIsRefusedAndNothingOfItLands) {
  TcpTarget t;
  Client c(t.port());
  ASSERT_TRUE(greet(c, t));
  EXPECT_TRUE(c.last_tag_ok());  // the welcome is the target's frame 0
  // A write frame as the peer would send it, but with no tag (zero).
  ASSERT_TRUE(c.send_raw(write_frame(1, 0, kBlockLen, 0xab)));
  EXPECT_TRUE(c.closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_tag", 1));
  EXPECT_TRUE(pool_is_zero(t.pool()));
}

TEST(TcpHostile, AFrameReplayedWithinItsConnectionIsRefused) {
  TcpTarget t;
  Client c(t.port());
  ASSERT_TRUE(greet(c, t));
  ASSERT_TRUE(c.send_bytes(write_frame(1, 0, kBlockLen, 0x11)));
  const std::vector<std::uint8_t> first = c.last_sent();
  auto ack = c.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->status, wire::kStatusOk);
  EXPECT_TRUE(c.last_tag_ok());
  ASSERT_TRUE(c.send_bytes(write_frame(2, 0, kBlockLen, 0x22)));
  ack = c.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->status, wire::kStatusOk);
  EXPECT_TRUE(c.last_tag_ok());
  ASSERT_EQ(t.pool().block(0)[0], 0x22);
  // The first write again, byte for byte, tag included: its number is past.
  ASSERT_TRUE(c.send_raw(first));
  EXPECT_TRUE(c.closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_tag", 1));
  EXPECT_EQ(t.pool().block(0)[0], 0x22);
}

TEST(TcpHostile, AFrameWithAChangedRunIsRefused) {
  // The runs say where the payload lands: the tag covers them.
  TcpTarget t;
  Client c(t.port());
  ASSERT_TRUE(greet(c, t));
  std::vector<std::uint8_t> frame = c.tagged(write_frame(1, 0, kBlockLen, 0x11));
  // On the way, the run is re-aimed at block 5.
  wire::put_run_at(frame.data() + wire::kHeaderLen, 0, 5 * kBlockLen, kBlockLen);
  ASSERT_TRUE(c.send_raw(frame));
  EXPECT_TRUE(c.closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_tag", 1));
  EXPECT_TRUE(pool_is_zero(t.pool()));
}

// The initiator's side of the same: someone who answers in the target's
// place (on the path, or at the target's published address) without the
// target's private key cannot welcome it. A listener of ours sends a
// well-formed challenge and answers every hello with a welcome it cannot
// tag; the metadata is the real target's but for the port.
TEST(TcpHostile, AWelcomeTheTargetsKeyDidNotTagIsNotTrusted) {
  TcpTarget t;
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<const sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  socklen_t len = sizeof sa;
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  std::atomic<bool> done{false};
  std::thread fake([listener, &done] {
    const int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    std::array<std::uint8_t, wire::kHeaderLen + wire::kNonceLen> challenge{};
    std::array<std::uint8_t, wire::kNonceLen> nonce{};
    nonce.fill(7);
    wire::encode_challenge(challenge.data(), nonce);
    (void)::send(fd, challenge.data(), challenge.size(), MSG_NOSIGNAL);
    std::array<std::uint8_t, 4096> hello{};
    (void)::recv(fd, hello.data(), hello.size(), 0);  // the hello (or part of it)
    std::array<std::uint8_t, wire::kHeaderLen> welcome{};
    wire::encode_header(welcome.data(), {wire::FrameType::kWelcome, 0, 0, wire::kStatusOk, 0, 0});
    (void)::send(fd, welcome.data(), welcome.size(), MSG_NOSIGNAL);
    // Until the initiator closes, or the test is over (had it trusted us).
    std::array<std::uint8_t, 64> rest{};
    while (!done.load()) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) == 1 && ::recv(fd, rest.data(), rest.size(), 0) <= 0) break;
    }
    close(fd);
  });
  wire::AgentMetadata m = wire::decode(t.transport().agent_metadata());
  wire::PeerBlob blob;
  ASSERT_TRUE(wire::decode_blob(m.engine_blob, &blob));
  blob.tcp_port = ntohs(sa.sin_port);
  wire::TcpAddress loopback;
  loopback.bytes = {127, 0, 0, 1};
  blob.tcp_addresses = {loopback};
  m.engine_blob = wire::encode_blob(blob);
  const std::vector<std::uint8_t> forged = wire::encode(m);
  Peer alice("alice");
  std::string what;
  try {
    alice.register_target(forged, t);
  } catch (const std::runtime_error& e) {
    what = e.what();
  }
  done.store(true);
  fake.join();
  close(listener);
  EXPECT_NE(what.find("not tagged with the key its metadata names"), std::string::npos)
      << (what.empty() ? "the forged welcome was trusted" : what);
}

// Issue 46, item 4: a same-host peer registered over the cma lane publishes
// no tcp key; its name is still its own on the tcp lane.
TEST(TcpHostile, APeerOnAnotherLaneCannotBeImpersonatedOverTcp) {
  Options both;
  both.engine_config = {{"KVXFER_LANES", "cma,tcp"}};
  TcpTarget t(both);
  MappedPool carol_pool(kBlocks, kBlockLen, kGuard);
  Options cma_only;
  cma_only.engine_config = {{"KVXFER_LANES", "cma"}};
  Transport carol("carol", Region{carol_pool.base(), kBlocks, kBlockLen}, cma_only);
  t.transport().add_remote_peer("carol", carol.agent_metadata(),
                                reinterpret_cast<std::uintptr_t>(carol_pool.base()), kBlocks,
                                kBlockLen);
  Client impostor(t.port());
  impostor.send_bytes(hello(impostor, t, t.token(), 7, 1, 11, "carol"));
  impostor.send_bytes(notify_frame(1, "forged"));
  const auto refusal = impostor.next_header();
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(refusal->status, wire::kStatusNotYours);
  EXPECT_TRUE(impostor.closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_identity", 1));
  EXPECT_EQ(t.transport().get_notifications().count("carol"), 0u);
}

// The inodes of the TCP sockets this process has listening.
std::set<std::string> listening_socket_inodes() {
  std::set<std::string> mine;
  if (DIR* dir = opendir("/proc/self/fd"); dir != nullptr) {
    while (const dirent* e = readdir(dir)) {
      char target[256] = {};
      const std::string path = std::string("/proc/self/fd/") + e->d_name;
      const ssize_t n = readlink(path.c_str(), target, sizeof target - 1);
      const std::string link(target, n > 0 ? static_cast<std::size_t>(n) : 0);
      if (link.rfind("socket:[", 0) == 0) mine.insert(link.substr(8, link.size() - 9));
    }
    closedir(dir);
  }
  std::set<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the heading
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      fields >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >>
          inode;
      if (state == "0A" && mine.count(inode) != 0) out.insert(inode);  // 0A: LISTEN
    }
  }
  return out;
}

std::size_t open_descriptors() {
  std::size_t n = 0;
  if (DIR* dir = opendir("/proc/self/fd"); dir != nullptr) {
    while (readdir(dir) != nullptr) ++n;
    closedir(dir);
  }
  return n;
}

// Without an RDMA device and with the default lanes, no UCX context exists,
// so UCX's tcp transport (which executes any client's PUT anywhere in the
// process) has no listener: the tcp lane's is the only one.
TEST(TcpLane, ByDefaultTheOnlyListenerIsTheTcpLanes) {
  if (std::getenv("KVXFER_LANES") != nullptr) GTEST_SKIP() << "KVXFER_LANES is set here";
  const std::set<std::string> before = listening_socket_inodes();
  MappedPool pool(kBlocks, kBlockLen);
  Transport t("listener", Region{pool.base(), kBlocks, kBlockLen});
  std::set<std::string> opened;
  for (const std::string& inode : listening_socket_inodes()) {
    if (before.count(inode) == 0) opened.insert(inode);
  }
  EXPECT_EQ(opened.size(), 1u);
  EXPECT_EQ(t.stats().live.memory_registrations, 1u);
  for (const auto& [name, value] : t.stats().engine_counters) {
    EXPECT_FALSE(name.starts_with("ucx_")) << name;
  }
}

// UCX's own tcp transport is still there for tests that force the UCX lane
// (KVXFER_RMA=on), and then it does listen.
TEST(TcpLane, ForcingTheUcxLaneOpensUcxsListener) {
  const std::set<std::string> before = listening_socket_inodes();
  MappedPool pool(kBlocks, kBlockLen);
  Options options;
  options.engine_config = {{"KVXFER_LANES", "ucx"}, {"TLS", "tcp"}, {"KVXFER_RMA", "on"}};
  Transport t("forced", Region{pool.base(), kBlocks, kBlockLen}, options);
  std::size_t opened = 0;
  for (const std::string& inode : listening_socket_inodes()) opened += before.count(inode) == 0;
  EXPECT_GE(opened, 1u);
}

// remove_remote_peer closes the peer's socket at once: many registrations
// hold no more descriptors than one.
// UCX_TLS speaks for the ucx lane only: two Transports of one host whose
// UCX_TLS names tcp alone still get the same-host lane by default, and the
// tcp lane when KVXFER_LANES says so.
TEST(TcpLane, UcxTlsDoesNotChooseTheLane) {
  if (std::getenv("KVXFER_LANES") != nullptr) GTEST_SKIP() << "KVXFER_LANES is set here";
  for (const bool tcp_lane : {false, true}) {
    SCOPED_TRACE(tcp_lane ? "KVXFER_LANES=tcp" : "KVXFER_LANES unset");
    Options options;
    options.engine_config = {{"TLS", "tcp"}};
    if (tcp_lane) options.engine_config["KVXFER_LANES"] = "tcp";
    MappedPool target_pool(kBlocks, kBlockLen);
    MappedPool initiator_pool(kBlocks, kBlockLen);
    Transport target("target", Region{target_pool.base(), kBlocks, kBlockLen}, options);
    Transport initiator("initiator", Region{initiator_pool.base(), kBlocks, kBlockLen}, options);
    initiator.add_remote_peer("t", target.agent_metadata(), target.base_addr(), kBlocks, kBlockLen);
    const std::vector<std::int64_t> blocks{1, 2};
    const auto id = initiator.write_blocks("t", std::span<const std::int64_t>(blocks),
                                           std::span<const std::int64_t>(blocks));
    ASSERT_TRUE(id.has_value());
    bool done = false;
    for (int spins = 0; spins < 5000 && !done; ++spins) {
      const PollResult r = initiator.poll("t");
      ASSERT_TRUE(r.failed.empty());
      done = !r.done.empty();
      if (!done) std::this_thread::sleep_for(1ms);
    }
    ASSERT_TRUE(done);
    const auto counters = initiator.stats().engine_counters;
    const auto count = [&](const char* key) {
      const auto it = counters.find(key);
      return it == counters.end() ? std::uint64_t{0} : it->second;
    };
    EXPECT_EQ(count("tcp_writes"), tcp_lane ? 1u : 0u);
    EXPECT_EQ(count("cma_writes"), tcp_lane ? 0u : 1u);
  }
}

TEST(TcpLane, RegistrationsThatComeAndGoLeaveNoDescriptorBehind) {
  MappedPool target_pool(kBlocks, kBlockLen);
  MappedPool initiator_pool(kBlocks, kBlockLen);
  Transport target("target", Region{target_pool.base(), kBlocks, kBlockLen}, tcp_options());
  Transport initiator("initiator", Region{initiator_pool.base(), kBlocks, kBlockLen},
                      tcp_options());
  const auto metadata = target.agent_metadata();
  const auto cycle = [&](int i) {
    initiator.add_remote_peer("t", metadata, target.base_addr(), kBlocks, kBlockLen);
    const std::vector<std::int64_t> blocks{i % static_cast<int>(kBlocks)};
    const auto id = initiator.write_blocks("t", std::span<const std::int64_t>(blocks),
                                           std::span<const std::int64_t>(blocks));
    ASSERT_TRUE(id.has_value());
    for (int spins = 0; spins < 5000; ++spins) {
      const PollResult r = initiator.poll("t");
      if (!r.done.empty()) break;
      ASSERT_TRUE(r.failed.empty());
      std::this_thread::sleep_for(1ms);
    }
    ASSERT_EQ(initiator.stats().peers.at(0).transfers_done, 1u);
    initiator.remove_remote_peer("t");
  };
  cycle(0);
  // The target's I/O thread closes its side once it reads the reset.
  std::this_thread::sleep_for(100ms);
  const std::size_t settled = open_descriptors();
  for (int i = 1; i <= 300; ++i) cycle(i);
  std::this_thread::sleep_for(200ms);
  EXPECT_LE(open_descriptors(), settled + 2);
  EXPECT_EQ(initiator.stats().live.peers, 0u);
}

// A peer that stops in the middle of a frame, or asks for reads it never
// takes, holds its connection no longer than KVXFER_TCP_STALL_MS (issue 46:
// it held it forever, with the bytes received so far unacked).
Options stall_options() {
  Options options = tcp_options();
  options.engine_config["KVXFER_TCP_STALL_MS"] = "300";
  return options;
}

TEST(TcpHostile, AWriteWhosePayloadStopsIsClosedAfterTheStall) {
  TcpTarget t(stall_options());
  Client c(t.port());
  ASSERT_TRUE(greet(c, t));
  auto frame = write_frame(1, 0, 2 * kBlockLen, 0x61);
  frame.resize(frame.size() - kBlockLen);  // half the payload, then nothing
  ASSERT_TRUE(c.send_bytes(frame));
  EXPECT_TRUE(c.closed_by_target(5s));
  EXPECT_TRUE(t.wait_counter("tcp_refused_frame", 1));
}

TEST(TcpHostile, AHeaderThatStopsHalfwayIsClosedAfterTheStall) {
  TcpTarget t(stall_options());
  Client c(t.port());
  ASSERT_TRUE(greet(c, t));
  auto frame = write_frame(1, 0, kBlockLen, 0x62);
  frame.resize(wire::kHeaderLen / 2);
  ASSERT_TRUE(c.send_raw(frame));  // (send_bytes holds a frame until it is whole)
  EXPECT_TRUE(c.closed_by_target(5s));
}

TEST(TcpHostile, AReaderThatTakesNoRepliesIsClosedAfterTheStall) {
  TcpTarget t(stall_options());
  Client c(t.port());
  ASSERT_TRUE(greet(c, t));
  // Read requests for the whole pool, many times over, never read: the
  // replies fill the socket's send queue and stop.
  std::vector<std::uint8_t> requests;
  for (std::uint64_t seq = 1; seq <= 64; ++seq) {
    auto r = header({wire::FrameType::kReadReq, 0, 1, 0, seq, kBlocks * kBlockLen});
    r.resize(wire::kHeaderLen + wire::kRunLen);
    wire::put_run_at(r.data() + wire::kHeaderLen, 0, 0, kBlocks * kBlockLen);
    requests.insert(requests.end(), r.begin(), r.end());
  }
  ASSERT_TRUE(c.send_bytes(requests));
  EXPECT_TRUE(t.wait_counter("tcp_refused_frame", 1));
}

TEST(TcpHostile, AnIdleWelcomedConnectionIsNotAStall) {
  TcpTarget t(stall_options());
  Client c(t.port());
  ASSERT_TRUE(greet(c, t));
  std::this_thread::sleep_for(1s);  // three stalls' worth, between frames
  ASSERT_TRUE(c.send_bytes(write_frame(1, 0, kBlockLen, 0x63)));
  const auto ack = c.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->status, wire::kStatusOk);
  EXPECT_EQ(t.counter("tcp_refused_frame"), 0u);
}

// ------------------------------------------------ regions besides the pool

// A region the target registered besides its pool: kRegionBytes of zeros.
constexpr std::size_t kRegionBytes = 32 * 1024;
struct TargetRegion {
  explicit TargetRegion(TcpTarget& t)
      : bytes(kRegionBytes, 0), id(t.transport().register_memory(bytes.data(), bytes.size())) {}
  [[nodiscard]] bool zero_from(std::size_t at) const {
    return std::all_of(bytes.begin() + static_cast<std::ptrdiff_t>(at), bytes.end(),
                       [](std::uint8_t b) { return b == 0; });
  }
  std::vector<std::uint8_t> bytes;
  RegionId id;
};

// Sends a write of one run into region `region` on a welcomed connection;
// true when the target refused it (an ack kStatusRefused, then the
// connection closed).
bool refused_write(TcpTarget& t, std::uint64_t region, std::uint64_t offset,
                   std::uint64_t length) {
  Client c(t.port());
  if (!greet(c, t) || !c.send_bytes(write_frame(1, offset, length, 0xab, region))) return false;
  const auto ack = c.next_header();
  return ack && ack->type == wire::FrameType::kAck && ack->status == wire::kStatusRefused &&
         c.closed_by_target();
}

TEST(TcpHostile, AWriteIntoARegisteredRegionLandsThereAndNowhereElse) {
  TcpTarget t;
  TargetRegion r(t);
  Client c(t.port());
  ASSERT_TRUE(greet(c, t));
  ASSERT_TRUE(c.send_bytes(write_frame(3, 1000, 5000, 0x5a, r.id)));
  const auto ack = c.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->status, wire::kStatusOk);
  std::vector<std::uint8_t> want(kRegionBytes, 0);
  std::fill_n(want.begin() + 1000, 5000, 0x5a);
  EXPECT_EQ(r.bytes, want);
  EXPECT_TRUE(pool_is_zero(t.pool()));
}

TEST(TcpHostile, ARunNamingARegionTheTargetNeverRegisteredIsRefusedAndNothingLands) {
  TcpTarget t;
  TargetRegion r(t);
  const std::uint64_t slot = r.id & 0xffffffffu;
  // Another slot; this region's slot of another generation, older and newer.
  EXPECT_TRUE(refused_write(t, (std::uint64_t{1} << 32) | (slot + 5), 0, 64));
  EXPECT_TRUE(refused_write(t, r.id + (std::uint64_t{1} << 32), 0, 64));
  EXPECT_TRUE(refused_write(t, slot, 0, 64));
  EXPECT_EQ(t.counter("tcp_refused_runs"), 3u);
  EXPECT_TRUE(r.zero_from(0));
  EXPECT_TRUE(pool_is_zero(t.pool()));
  EXPECT_EQ(t.pool().guard_mismatch(), -1);
}

TEST(TcpHostile, ARunPastTheEndOfARegionIsRefusedAndNothingLands) {
  TcpTarget t;
  TargetRegion r(t);
  EXPECT_TRUE(refused_write(t, r.id, kRegionBytes - 100, 200));
  EXPECT_TRUE(refused_write(t, r.id, kRegionBytes, 1));
  EXPECT_TRUE(refused_write(t, r.id, ~std::uint64_t{0} - 10, 64));
  // Inside the pool's length but past the region's.
  EXPECT_TRUE(refused_write(t, r.id, kRegionBytes, kBlockLen));
  EXPECT_EQ(t.counter("tcp_refused_runs"), 4u);
  EXPECT_TRUE(r.zero_from(0));
  EXPECT_TRUE(pool_is_zero(t.pool()));
}

TEST(TcpHostile, ARunIntoADeregisteredRegionIsRefusedAndNothingLands) {
  TcpTarget t;
  TargetRegion r(t);
  t.transport().deregister_memory(r.id);
  EXPECT_TRUE(refused_write(t, r.id, 0, 64));
  EXPECT_EQ(t.counter("tcp_refused_runs"), 1u);
  EXPECT_TRUE(r.zero_from(0));
}

TEST(TcpHostile, NoByteOfAWriteLandsInItsRegionAfterTheDeregistrationReturns) {
  TcpTarget t;
  TargetRegion r(t);
  Client c(t.port());
  ASSERT_TRUE(greet(c, t));
  // Half the payload, in one send; the target is receiving it (its first
  // byte landed) before deregistration.
  const std::vector<std::uint8_t> frame = write_frame(4, 0, kRegionBytes, 0x77, r.id);
  const std::size_t half = frame.size() - kRegionBytes / 2;
  // The target's count of bytes received says when the half is in (the
  // region itself is not read until deregister_memory has returned: the
  // I/O thread writes it until then).
  const std::uint64_t before = t.counter("tcp_bytes_received");
  ASSERT_TRUE(c.send_bytes(std::vector<std::uint8_t>(frame.begin(), frame.begin() +
                                                      static_cast<std::ptrdiff_t>(half))));
  for (int i = 0; i < 500 && t.counter("tcp_bytes_received") < before + half; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_GE(t.counter("tcp_bytes_received"), before + half);
  t.transport().deregister_memory(r.id);
  ASSERT_EQ(r.bytes[0], 0x77);  // the first half landed before
  // The rest arrives after: dropped, and the write refused.
  ASSERT_TRUE(c.send_bytes(std::vector<std::uint8_t>(
      frame.begin() + static_cast<std::ptrdiff_t>(half), frame.end())));
  const auto ack = c.next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->seq, 4u);
  EXPECT_EQ(ack->status, wire::kStatusRefused);
  EXPECT_TRUE(c.closed_by_target());
  EXPECT_TRUE(r.zero_from(kRegionBytes / 2));
  EXPECT_EQ(t.counter("tcp_refused_runs"), 1u);
}

// Issue 46, items 6 and 7: what one identity key, and refused connections,
// may hold of a target's connection slots. The targets here size their caps
// from a low RLIMIT_NOFILE (TcpLane::conn_limits), so a flood fills them in
// a second.
constexpr rlim_t kLowNofile = 256;

// A target whose lane sized its caps from RLIMIT_NOFILE `nofile`; the
// process's limit is back to what it was once it is made.
std::unique_ptr<TcpTarget> target_sized_for(rlim_t nofile, const Options& options = tcp_options()) {
  rlimit old{};
  getrlimit(RLIMIT_NOFILE, &old);
  rlimit low = old;
  low.rlim_cur = nofile;
  setrlimit(RLIMIT_NOFILE, &low);
  auto t = std::make_unique<TcpTarget>(options);
  setrlimit(RLIMIT_NOFILE, &old);
  return t;
}

Options cma_and_tcp() {
  Options options;
  options.engine_config = {{"KVXFER_LANES", "cma,tcp"}};
  return options;
}

// A peer `t` registers (over the cma lane: same host) whose metadata names
// `id`'s key as its tcp key: a test client holding `id` says hello to `t`
// as that registered peer. `t` must run the cma and tcp lanes.
class RegisteredKey {
 public:
  RegisteredKey(TcpTarget& t, const std::string& name, const internal::Identity& id)
      : pool_(kBlocks, kBlockLen, 0),
        transport_(name, Region{pool_.base(), kBlocks, kBlockLen}, cma_and_tcp()) {
    wire::AgentMetadata m = wire::decode(transport_.agent_metadata());
    wire::PeerBlob blob;
    if (!wire::decode_blob(m.engine_blob, &blob)) throw std::runtime_error("bad blob");
    blob.tcp_key = id.public_key();
    m.engine_blob = wire::encode_blob(blob);
    t.transport().add_remote_peer(
        name, wire::encode(m), reinterpret_cast<std::uintptr_t>(pool_.base()), kBlocks, kBlockLen);
  }

 private:
  MappedPool pool_;
  Transport transport_;
};

// Opens a connection and says hello on it: the welcome's status, or nothing
// when the target closed the connection without one.
std::optional<std::uint32_t> try_hello(std::unique_ptr<Client>* out, TcpTarget& t,
                                       std::uint64_t lineage, std::string_view name,
                                       const internal::Identity& id,
                                       const internal::Identity* mac_by = nullptr) {
  try {
    auto c = std::make_unique<Client>(t.port());
    if (!c->send_bytes(hello(*c, t, t.token(), lineage, 1, lineage, name, id, mac_by))) {
      return std::nullopt;
    }
    const auto h = c->next_header();
    if (!h || h->type != wire::FrameType::kWelcome) return std::nullopt;
    *out = std::move(c);
    return h->status;
  } catch (const std::runtime_error&) {
    return std::nullopt;  // closed before its challenge
  }
}

TEST(TcpHostile, OneRegisteredKeyCannotTakeEverySlot) {
  const auto limits = tcp::TcpLane::conn_limits(kLowNofile);
  auto t = target_sized_for(kLowNofile, cma_and_tcp());
  RegisteredKey mallory(*t, "mallory", client_identity());
  // The registered key opens a lineage's worth of connections over new
  // lineages, until the target refuses it.
  std::vector<std::unique_ptr<Client>> held;
  std::optional<std::uint32_t> refused;
  for (std::uint64_t lineage = 1; !refused && held.size() < limits.total; ++lineage) {
    for (std::size_t i = 0; i < tcp::TcpLane::kMaxConnectionsPerLineage; ++i) {
      std::unique_ptr<Client> c;
      const auto status = try_hello(&c, *t, lineage, "mallory", client_identity());
      if (status != wire::kStatusOk) {
        refused = status.value_or(~0u);
        break;
      }
      held.push_back(std::move(c));
    }
  }
  EXPECT_EQ(held.size(), limits.per_key);
  EXPECT_EQ(refused, wire::kStatusTableFull);
  EXPECT_TRUE(t->wait_counter("tcp_refused_full", 1));
  // Another registered peer still connects, both ways, and writes.
  Peer alice("alice");
  ASSERT_NO_THROW(alice.register_both_ways(*t));
  ASSERT_TRUE(alice.write_with_note(3, "from alice"));
  EXPECT_EQ(t->pool().block(3)[0], 0x5a);
  // The key's own connections still work.
  ASSERT_FALSE(held.empty());
  ASSERT_TRUE(held.front()->send_bytes(write_frame(1, 0, kBlockLen, 0x61)));
  const auto ack = held.front()->next_header();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->status, wire::kStatusOk);
}

TEST(TcpHostile, OneKeyHoldsAFewLineagesAtMost) {
  TcpTarget t;
  // Lineages of one key, each with one short-lived connection: the key's
  // share of the fence table.
  for (std::uint64_t lineage = 1; lineage <= tcp::TcpLane::kMaxLineagesPerPeer; ++lineage) {
    Client c(t.port());
    ASSERT_TRUE(greet(c, t, lineage, 1, lineage)) << lineage;
  }
  Client extra(t.port());
  ASSERT_TRUE(extra.send_bytes(hello(extra, t, t.token(), 1000, 1, 1, "mallory")));
  const auto refusal = extra.next_header();
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(refusal->status, wire::kStatusTableFull);
  EXPECT_TRUE(extra.closed_by_target());
  // A lineage it holds takes a newer registration, and another key a new
  // lineage.
  Client again(t.port());
  EXPECT_TRUE(greet(again, t, 1, 2, 99));
  const internal::Identity other;
  Client newcomer(t.port());
  EXPECT_TRUE(greet(newcomer, t, 1001, 1, 1, "trent", other));
}

TEST(TcpHostile, RefusedHellosDoNotCrowdOutARegisteredPeer) {
  using Clock = std::chrono::steady_clock;
  const auto limits = tcp::TcpLane::conn_limits(kLowNofile);
  auto t = target_sized_for(kLowNofile);
  // Unregistered keys hold every welcomed connection their share allows.
  std::vector<std::unique_ptr<internal::Identity>> keys;
  std::vector<std::unique_ptr<Client>> welcomed;
  for (std::uint64_t lineage = 1; welcomed.size() <= limits.unregistered; ++lineage) {
    keys.push_back(std::make_unique<internal::Identity>());
    std::size_t i = 0;
    for (; i < tcp::TcpLane::kMaxConnectionsPerLineage; ++i) {
      std::unique_ptr<Client> c;
      if (try_hello(&c, *t, lineage, "mallory", *keys.back()) != wire::kStatusOk) break;
      welcomed.push_back(std::move(c));
    }
    if (i < tcp::TcpLane::kMaxConnectionsPerLineage) break;
  }
  EXPECT_EQ(welcomed.size(), limits.unregistered);
  // Then hellos whose MAC proves nothing, on new connections, as fast as
  // one thread sends them, each connection kept open past the target's
  // closing grace.
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> sent{0};
  std::thread flood([&] {
    const internal::Identity forger;
    std::deque<std::pair<Clock::time_point, std::unique_ptr<Client>>> open;
    for (std::uint64_t lineage = 1'000'000; !stop.load(); ++lineage) {
      const auto now = Clock::now();
      while (!open.empty() && now - open.front().first > tcp::TcpLane::kClosingGrace + 500ms) {
        open.pop_front();
      }
      try {
        auto c = std::make_unique<Client>(t->port());
        c->send_bytes(
            hello(*c, *t, t->token(), lineage, 1, 1, "mallory", client_identity(), &forger));
        open.emplace_back(now, std::move(c));
        sent.fetch_add(1);
      } catch (const std::runtime_error&) {
        // Reset before its challenge: the target was full.
      }
    }
  });
  for (int i = 0; i < 500 && sent.load() < limits.total; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  // A registered peer registers the target, writes and removes it, eight
  // times over the closing grace, during the flood.
  Peer alice("alice");
  int done = 0;
  for (int i = 0; i < 8; ++i) {
    std::this_thread::sleep_for(tcp::TcpLane::kClosingGrace / 8);
    try {
      if (i == 0) {
        alice.register_both_ways(*t);
      } else {
        alice.register_target(t->transport().agent_metadata(), *t);
      }
      if (alice.write_with_note(i, "during the flood")) ++done;
      alice.unregister_target();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "try " << i << ": " << e.what();
    }
  }
  const std::uint64_t flooded = sent.load();
  stop.store(true);
  flood.join();
  EXPECT_EQ(done, 8);
  EXPECT_GE(flooded, limits.total);
  EXPECT_GE(t->counter("tcp_refused_identity"), limits.closing);
}

// Issue 46, "kernel memory": what one connection may have asked for and not
// yet read, and what its socket's send queue may hold.
std::vector<std::uint8_t> read_request(std::uint64_t seq, std::uint64_t offset, std::uint64_t len,
                                       std::size_t runs) {
  std::vector<std::uint8_t> out =
      header({wire::FrameType::kReadReq, 0, static_cast<std::uint32_t>(runs), 0, seq, runs * len});
  out.resize(wire::kHeaderLen + runs * wire::kRunLen);
  for (std::size_t i = 0; i < runs; ++i) {
    wire::put_run_at(out.data() + wire::kHeaderLen + i * wire::kRunLen, 0, offset, len);
  }
  return out;
}

// The send buffer of this process's socket whose peer is `client` (the
// target's end of the client's connection), or -1.
int target_send_buffer(const Client& client) {
  sockaddr_storage mine{};
  socklen_t mine_len = sizeof mine;
  getsockname(client.fd(), reinterpret_cast<sockaddr*>(&mine), &mine_len);
  for (int fd = 0; fd < 65536; ++fd) {
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof peer;
    if (fd == client.fd() || getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0 ||
        peer_len != mine_len || std::memcmp(&peer, &mine, mine_len) != 0) {
      continue;
    }
    int value = 0;
    socklen_t len = sizeof value;
    if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &value, &len) == 0) return value;
  }
  return -1;
}

TEST(TcpHostile, AReadRequestForMoreThanTheTargetRegisteredIsRefused) {
  TcpTarget t;
  const std::uint64_t pool_len = kBlocks * kBlockLen;
  for (std::uint64_t i = 0; i < pool_len; ++i)
    t.pool().base()[i] = static_cast<std::uint8_t>(i * 7);
  // One 24 KB request for the whole pool a thousand times over, never read.
  Client greedy(t.port());
  ASSERT_TRUE(greet(greedy, t, 1, 1, 11, "greedy"));
  ASSERT_TRUE(greedy.send_bytes(read_request(1, 0, pool_len, wire::kMaxRuns)));
  const auto refusal = greedy.next_header();
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(refusal->type, wire::FrameType::kReadData);
  EXPECT_EQ(refusal->status, wire::kStatusRefused);
  EXPECT_TRUE(greedy.closed_by_target());
  EXPECT_TRUE(t.wait_counter("tcp_refused_runs", 1));
  // A reader that asks for the whole pool once gets it, from a socket
  // whose send buffer is capped.
  Client reader(t.port());
  ASSERT_TRUE(greet(reader, t, 2, 1, 12, "reader"));
  ASSERT_TRUE(reader.send_bytes(read_request(1, 0, pool_len, 1)));
  const auto reply = reader.next_header();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->status, wire::kStatusOk);
  ASSERT_EQ(reply->length, pool_len);
  std::vector<std::uint8_t> got(pool_len);
  for (std::size_t have = 0; have < got.size();) {
    pollfd p{reader.fd(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 5000), 1);
    const ssize_t n = ::recv(reader.fd(), got.data() + have, got.size() - have, 0);
    ASSERT_GT(n, 0);
    have += static_cast<std::size_t>(n);
  }
  EXPECT_EQ(std::memcmp(got.data(), t.pool().base(), pool_len), 0);
  std::ifstream wmem("/proc/sys/net/core/wmem_max");
  std::uint64_t wmem_max = 0;
  wmem >> wmem_max;
  // Linux doubles what SO_SNDBUF asks for (its bookkeeping) and caps the
  // request at net.core.wmem_max.
  const auto expected = 2 * std::min<std::uint64_t>(tcp::kTargetSendBuffer, wmem_max);
  EXPECT_EQ(target_send_buffer(reader), static_cast<int>(expected));
}

// Issue 46: what an initiator accepts on a connection whose handshake it
// trusted. The target here is a fake one that holds the key its metadata
// names, so its welcome is trusted; then an ack or a read reply that was
// not tagged with the connection's key (injected on the path) comes
// instead of the real one: the initiator refuses it, closes the
// connection, fails the transfer, and lands none of the reply's bytes.
struct Injected {
  std::atomic<bool> welcomed{false};
  std::atomic<bool> closed{false};  // the initiator closed on us
};

void serve_and_inject(int listener, const internal::Identity& id, wire::FrameType type,
                      std::uint64_t length, Injected* out) {
  const int fd = accept(listener, nullptr, nullptr);
  if (fd < 0) return;
  std::array<std::uint8_t, wire::kHeaderLen + wire::kNonceLen> challenge{};
  internal::tcp::Nonce nonce{};
  if (!internal::tcp::fresh_nonce(&nonce)) return;
  wire::encode_challenge(challenge.data(), nonce);
  (void)::send(fd, challenge.data(), challenge.size(), MSG_NOSIGNAL);
  // The hello, whole; then the keys it gives, as a target derives them.
  std::array<std::uint8_t, wire::kHeaderLen> head{};
  wire::FrameHeader h;
  std::vector<std::uint8_t> body;
  wire::Hello hello;
  internal::tcp::HandshakeKeys keys;
  internal::tcp::FrameAuth tx;
  if (!internal::tcp::read_exactly(fd, head.data(), head.size(), 5s) ||
      !wire::decode_header(head, &h)) {
    close(fd);
    return;
  }
  body.resize(wire::kHelloFixedLen + h.count + wire::kHelloProofLen);
  if (!internal::tcp::read_exactly(fd, body.data(), body.size(), 5s) ||
      !wire::decode_hello_body(body, h.count, &hello) ||
      !internal::tcp::handshake_keys(id, hello.key, /*we_initiate=*/false, challenge, head,
                                     wire::hello_proven_part(body), &keys) ||
      !tx.start(keys.to_initiator)) {
    close(fd);
    return;
  }
  std::array<std::uint8_t, wire::kHeaderLen> welcome{};
  wire::encode_header(welcome.data(), {wire::FrameType::kWelcome, 0, 0, wire::kStatusOk, 0, 0});
  const std::span<std::uint8_t, wire::kHeaderLen> w(welcome);
  if (!tx.sign(w.first<wire::kFieldsLen>(), {}, wire::tag_slot(w))) return;
  (void)::send(fd, welcome.data(), welcome.size(), MSG_NOSIGNAL);
  out->welcomed.store(true);
  // The initiator's first transfer (seq 1) arrives; the answer injected
  // for it carries a tag nobody computed (zeros), and a reply its bytes.
  std::this_thread::sleep_for(100ms);
  std::vector<std::uint8_t> forged(wire::kHeaderLen);
  wire::encode_header(forged.data(), {type, 0, 0, wire::kStatusOk, 1, length});
  forged.resize(forged.size() + length, 0xee);
  (void)::send(fd, forged.data(), forged.size(), MSG_NOSIGNAL);
  std::array<std::uint8_t, 4096> rest{};
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1) break;
    if (::recv(fd, rest.data(), rest.size(), 0) <= 0) {
      out->closed.store(true);
      break;
    }
  }
  close(fd);
}

class InjectedAnswerTest : public ::testing::TestWithParam<wire::FrameType> {};

TEST_P(InjectedAnswerTest, IsRefusedAndNothingOfItLands) {
  const wire::FrameType type = GetParam();
  const bool read = type == wire::FrameType::kReadData;
  TcpTarget t;
  const internal::Identity fake_key;
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  ASSERT_EQ(bind(listener, reinterpret_cast<const sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  Injected injected;
  std::thread fake(
      [&] { serve_and_inject(listener, fake_key, type, read ? kBlockLen : 0, &injected); });
  // The target's metadata, pointing at the fake with the fake's key.
  wire::AgentMetadata m = wire::decode(t.transport().agent_metadata());
  wire::PeerBlob blob;
  ASSERT_TRUE(wire::decode_blob(m.engine_blob, &blob));
  blob.tcp_port = ntohs(sa.sin_port);
  wire::TcpAddress loopback;
  loopback.bytes = {127, 0, 0, 1};
  blob.tcp_addresses = {loopback};
  blob.tcp_key = fake_key.public_key();
  m.engine_blob = wire::encode_blob(blob);
  MappedPool pool(kBlocks, kBlockLen, kGuard);
  Transport alice("alice", Region{pool.base(), kBlocks, kBlockLen}, tcp_options());
  alice.add_remote_peer("target", wire::encode(m),
                        reinterpret_cast<std::uintptr_t>(t.pool().base()), kBlocks, kBlockLen);
  EXPECT_TRUE(injected.welcomed.load());
  const std::vector<std::int64_t> local{1};
  const std::vector<std::int64_t> remote{2};
  const auto id = read ? alice.read_blocks("target", local, remote)
                       : alice.write_blocks("target", local, remote);
  ASSERT_TRUE(id.has_value());
  bool failed = false;
  for (int i = 0; i < 5000 && !failed; ++i) {
    const PollResult r = alice.poll("target");
    ASSERT_TRUE(std::find(r.done.begin(), r.done.end(), *id) == r.done.end())
        << "an injected answer completed the transfer";
    failed = std::find(r.failed.begin(), r.failed.end(), *id) != r.failed.end();
    if (!failed) std::this_thread::sleep_for(1ms);
  }
  fake.join();
  close(listener);
  EXPECT_TRUE(failed);
  EXPECT_TRUE(injected.closed.load());
  EXPECT_GE(alice.stats().engine_counters.at("tcp_refused_tag"), 1u);
  EXPECT_TRUE(pool_is_zero(pool));  // no byte of the forged reply landed
}

INSTANTIATE_TEST_SUITE_P(TcpHostileInitiator, InjectedAnswerTest,
                         ::testing::Values(wire::FrameType::kAck, wire::FrameType::kReadData),
                         [](const auto& param_info) {
                           return param_info.param == wire::FrameType::kAck
                                      ? std::string("Ack")
                                      : std::string("ReadReply");
                         });

}  // namespace
}  // namespace kvxfer::it
