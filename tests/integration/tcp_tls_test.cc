// SPDX-License-Identifier: Apache-2.0
// The tcp lane with KVXFER_TCP_ENCRYPT=on (issue 46, item 3): transfers
// between two encrypting transports land byte for byte; a side that does
// not agree is refused, and told why, on both sides; a hand-written client
// that says an encrypted hello and then speaks cleartext frames gets
// nothing written; and a forwarding proxy between the two, a passive
// on-path observer, never sees a payload byte in the clear (while it does
// with encryption off, so the check can fail).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/identity.h"
#include "engines/tcp/tcp_handshake.h"
#include "it_pool.h"
#include "kvxfer/transport.h"
#include "wire/metadata.h"
#include "wire/peer_blob.h"
#include "wire/tcp_frame.h"

namespace kvxfer::it {
namespace {

using namespace std::chrono_literals;
namespace tcp = internal::tcp;
using Bytes = std::vector<std::uint8_t>;

// Blocks of several TLS records each (16 KiB), so a payload spans records.
constexpr std::uint64_t kBlocks = 16;
constexpr std::uint64_t kBlockLen = 64 * 1024;
constexpr std::uint64_t kGuard = 64 * 1024;

Options options_with(const char* encrypt) {
  Options options;
  options.engine_config = {{"KVXFER_LANES", "tcp"}, {"KVXFER_TCP_ENCRYPT", encrypt}};
  return options;
}

// A transport on the tcp lane with its pool.
struct Side {
  Side(const std::string& name, const char* encrypt)
      : pool(kBlocks, kBlockLen, kGuard),
        transport(name, Region{pool.base(), kBlocks, kBlockLen}, options_with(encrypt)) {}
  // Registers `peer` as `peer_name`, with `metadata` (its own unless given).
  void add(const std::string& peer_name, Side& peer, std::optional<Bytes> metadata = {}) {
    transport.add_remote_peer(peer_name, metadata ? *metadata : peer.transport.agent_metadata(),
                              reinterpret_cast<std::uintptr_t>(peer.pool.base()), kBlocks,
                              kBlockLen);
  }
  std::uint64_t counter(const std::string& name) {
    const auto counters = transport.stats().engine_counters;
    const auto it = counters.find(name);
    return it == counters.end() ? 0 : it->second;
  }
  bool wait_counter(const std::string& name, std::uint64_t at_least) {
    for (int i = 0; i < 500 && counter(name) < at_least; ++i) std::this_thread::sleep_for(10ms);
    return counter(name) >= at_least;
  }
  // True once transfer `id` to `peer` is done (false: failed or 10 s).
  bool wait_done(const std::string& peer, std::optional<TransferId> id) {
    if (!id) return false;
    for (int i = 0; i < 10000; ++i) {
      const PollResult r = transport.poll(peer);
      if (std::find(r.done.begin(), r.done.end(), *id) != r.done.end()) return true;
      if (std::find(r.failed.begin(), r.failed.end(), *id) != r.failed.end()) return false;
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }
  MappedPool pool;
  Transport transport;
};

void fill(std::uint8_t* block, std::uint8_t seed) {
  for (std::uint64_t i = 0; i < kBlockLen; ++i) block[i] = static_cast<std::uint8_t>(seed + i * 7);
}

Bytes span_of(std::string_view s) { return Bytes(s.begin(), s.end()); }

std::string add_error(Side& initiator, Side& target) {
  try {
    initiator.add("target", target);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(TcpTls, EncryptedWritesReadsAndNotificationsLandByteForByte) {
  Side target("target", "on");
  Side alice("alice", "on");
  target.add("alice", alice);
  alice.add("target", target);
  for (std::uint64_t b = 0; b < 8; ++b) fill(alice.pool.block(b), static_cast<std::uint8_t>(b + 1));
  const std::vector<std::int64_t> local{0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<std::int64_t> far{8, 9, 10, 11, 12, 13, 14, 15};
  ASSERT_TRUE(alice.wait_done(
      "target", alice.transport.write_blocks("target", local, far, span_of("written"))));
  for (std::uint64_t b = 0; b < 8; ++b) {
    ASSERT_EQ(std::memcmp(alice.pool.block(b), target.pool.block(b + 8), kBlockLen), 0) << b;
  }
  for (std::uint64_t b = 0; b < 4; ++b)
    fill(target.pool.block(b), static_cast<std::uint8_t>(b + 91));
  const std::vector<std::int64_t> into{12, 13, 14, 15};
  const std::vector<std::int64_t> from{0, 1, 2, 3};
  ASSERT_TRUE(alice.wait_done("target",
                              alice.transport.read_blocks("target", into, from, span_of("read"))));
  for (std::uint64_t b = 0; b < 4; ++b) {
    EXPECT_EQ(std::memcmp(alice.pool.block(b + 12), target.pool.block(b), kBlockLen), 0) << b;
  }
  ASSERT_TRUE(
      alice.wait_done("target", alice.transport.send_notification("target", span_of("hi"))));
  const auto notes = target.transport.get_notifications();
  ASSERT_EQ(notes.count("alice"), 1u);
  EXPECT_EQ(notes.at("alice"),
            (std::vector<Bytes>{span_of("written"), span_of("read"), span_of("hi")}));
  EXPECT_EQ(target.counter("tcp_refused_tls"), 0u);
  EXPECT_EQ(target.counter("tcp_refused_tag"), 0u);
  // Nothing outside the pool moved.
  EXPECT_EQ(target.pool.guard_mismatch(), -1);
}

TEST(TcpTls, ATargetThatRequiresEncryptionRefusesAnInitiatorWithoutAndSaysWhy) {
  Side target("target", "on");
  Side alice("alice", "off");
  const std::string what = add_error(alice, target);
  EXPECT_NE(what.find("the target requires encryption (KVXFER_TCP_ENCRYPT=on there, off here)"),
            std::string::npos)
      << (what.empty() ? "welcomed" : what);
  EXPECT_TRUE(target.wait_counter("tcp_refused_tls", 1));
}

TEST(TcpTls, ATargetWithoutEncryptionRefusesAnEncryptingInitiatorAndSaysWhy) {
  Side target("target", "off");
  Side alice("alice", "on");
  const std::string what = add_error(alice, target);
  EXPECT_NE(what.find("the target refuses encryption (KVXFER_TCP_ENCRYPT=off there, on here)"),
            std::string::npos)
      << (what.empty() ? "welcomed" : what);
  EXPECT_TRUE(target.wait_counter("tcp_refused_tls", 1));
}

// A plain socket on loopback that speaks the lane's handshake by hand.
class RawClient {
 public:
  explicit RawClient(std::uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
      throw std::runtime_error("connect failed");
    }
  }
  ~RawClient() { close(fd_); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool read_exactly(std::uint8_t* out, std::size_t len) {
    for (std::size_t have = 0; have < len;) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 5000) != 1) return false;
      const ssize_t n = ::recv(fd_, out + have, len - have, 0);
      if (n <= 0) return false;
      have += static_cast<std::size_t>(n);
    }
    return true;
  }
  bool send_all(const Bytes& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // Challenge, then a hello (with kEncrypt when `encrypt`) proving our key
  // to a target of `token` and `key`; the welcome's header, or nothing.
  std::optional<wire::FrameHeader> hello(std::uint64_t token, const internal::IdentityKey& key,
                                         bool encrypt) {
    std::array<std::uint8_t, wire::kHeaderLen + wire::kNonceLen> challenge{};
    if (!read_exactly(challenge.data(), challenge.size())) return std::nullopt;
    const std::string_view name = "mallory";
    Bytes out(wire::kHeaderLen + wire::kHelloFixedLen + name.size() + wire::kHelloProofLen);
    wire::encode_header(out.data(), {wire::FrameType::kHello,
                                     static_cast<std::uint16_t>(encrypt ? wire::kEncrypt : 0),
                                     static_cast<std::uint32_t>(name.size()), 0, 0, 0});
    wire::Hello h{token, 7, 1, 11, name};
    h.key = identity_.public_key();
    if (!tcp::fresh_nonce(&h.nonce)) return std::nullopt;
    wire::encode_hello_body(out.data() + wire::kHeaderLen, h);
    const auto sent = std::span<const std::uint8_t>(out);
    if (!tcp::handshake_keys(identity_, key, true, challenge, sent.first(wire::kHeaderLen),
                             wire::hello_proven_part(sent.subspan(wire::kHeaderLen)), &keys_) ||
        !tx_.start(keys_.to_target)) {
      return std::nullopt;
    }
    std::copy(keys_.proof.begin(), keys_.proof.end(),
              out.end() - static_cast<std::ptrdiff_t>(wire::kHelloProofLen));
    std::array<std::uint8_t, wire::kHeaderLen> welcome{};
    wire::FrameHeader w;
    if (!send_all(out) || !read_exactly(welcome.data(), welcome.size()) ||
        !wire::decode_header(welcome, &w)) {
      return std::nullopt;
    }
    return w;
  }
  // A write frame of one run, tagged as the frame keys say, in the clear.
  Bytes write_frame(std::uint64_t offset, std::uint64_t length, std::uint8_t value) {
    Bytes out(wire::kHeaderLen + wire::kRunLen);
    wire::encode_header(out.data(), {wire::FrameType::kWrite, 0, 1, 0, 1, length});
    wire::put_run_at(out.data() + wire::kHeaderLen, 0, offset, length);  // the pool
    const std::span<std::uint8_t, wire::kHeaderLen> head(out.data(), wire::kHeaderLen);
    EXPECT_TRUE(tx_.sign(head.first<wire::kFieldsLen>(), std::span(out).subspan(wire::kHeaderLen),
                         wire::tag_slot(head)));
    out.resize(out.size() + length, value);
    return out;
  }
  // True once the target closed the connection within 5 s.
  bool closed_by_target() {
    std::array<std::uint8_t, 4096> buf{};
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 5000) != 1) return false;
      if (::recv(fd_, buf.data(), buf.size(), 0) <= 0) return true;
    }
  }

 private:
  int fd_ = -1;
  internal::Identity identity_;
  tcp::HandshakeKeys keys_;
  tcp::FrameAuth tx_;
};

wire::PeerBlob blob_of(Side& s) {
  wire::PeerBlob blob;
  if (!wire::decode_blob(wire::decode(s.transport.agent_metadata()).engine_blob, &blob)) {
    throw std::runtime_error("bad blob");
  }
  return blob;
}

bool pool_is_zero(const MappedPool& pool) {
  return std::all_of(pool.base(), pool.base() + pool.len(),
                     [](std::uint8_t v) { return v == 0; }) &&
         pool.guard_mismatch() == -1;
}

TEST(TcpTlsHostile, CleartextFramesAfterAnEncryptedHelloAreRefusedAndNothingLands) {
  Side target("target", "on");
  const wire::PeerBlob blob = blob_of(target);
  RawClient c(blob.tcp_port);
  const auto welcome = c.hello(blob.tcp_token, blob.tcp_key, /*encrypt=*/true);
  ASSERT_TRUE(welcome.has_value());
  ASSERT_EQ(welcome->status, wire::kStatusOk);
  // Frames as a target without encryption would take them: refused, since
  // only TLS may follow the welcome.
  ASSERT_TRUE(c.send_all(c.write_frame(0, kBlockLen, 0x5a)));
  EXPECT_TRUE(c.closed_by_target());
  EXPECT_TRUE(target.wait_counter("tcp_refused_tls", 1));
  EXPECT_TRUE(pool_is_zero(target.pool));
}

TEST(TcpTlsHostile, AHelloWithoutEncryptionIsToldTheTargetRequiresIt) {
  Side target("target", "on");
  const wire::PeerBlob blob = blob_of(target);
  RawClient c(blob.tcp_port);
  const auto welcome = c.hello(blob.tcp_token, blob.tcp_key, /*encrypt=*/false);
  ASSERT_TRUE(welcome.has_value());
  EXPECT_EQ(welcome->status, wire::kStatusEncryption);
  (void)c.send_all(c.write_frame(0, kBlockLen, 0x5a));
  EXPECT_TRUE(c.closed_by_target());
  EXPECT_TRUE(pool_is_zero(target.pool));
}

// A forwarding proxy on loopback: takes one connection, opens one to
// `port`, and relays both ways, keeping a copy of every byte it relayed
// (what an on-path observer sees).
class Proxy {
 public:
  explicit Proxy(std::uint16_t port) {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (bind(listener_, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0 ||
        listen(listener_, 4) != 0 ||
        getsockname(listener_, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
      throw std::runtime_error("no proxy listener");
    }
    port_ = ntohs(sa.sin_port);
    thread_ = std::thread([this, port] { relay(port); });
  }
  ~Proxy() {
    done_.store(true);
    thread_.join();
    close(listener_);
  }
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  [[nodiscard]] std::uint16_t port() const { return port_; }
  [[nodiscard]] Bytes seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  void relay(std::uint16_t port) {
    pollfd lp{listener_, POLLIN, 0};
    while (!done_.load() && ::poll(&lp, 1, 100) != 1) {
    }
    if (done_.load()) return;
    const int a = accept(listener_, nullptr, nullptr);
    const int b = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (a >= 0 && ::connect(b, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0) {
      std::array<std::uint8_t, 65536> buf{};
      while (!done_.load()) {
        std::array<pollfd, 2> p{pollfd{a, POLLIN, 0}, pollfd{b, POLLIN, 0}};
        if (::poll(p.data(), p.size(), 100) <= 0) continue;
        bool open = true;
        for (std::size_t i = 0; i < 2 && open; ++i) {
          if (p[i].revents == 0) continue;
          const ssize_t n = ::recv(p[i].fd, buf.data(), buf.size(), 0);
          open = n > 0 &&
                 ::send(i == 0 ? b : a, buf.data(), static_cast<std::size_t>(n), MSG_NOSIGNAL) == n;
          if (open) {
            std::lock_guard<std::mutex> lock(mu_);
            seen_.insert(seen_.end(), buf.begin(), buf.begin() + n);
          }
        }
        if (!open) break;
      }
    }
    if (a >= 0) close(a);
    close(b);
  }

  int listener_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> done_{false};
  std::mutex mu_;
  Bytes seen_;
  std::thread thread_;
};

// The target's metadata, its tcp lane reached through `port` on loopback.
Bytes metadata_via(Side& target, std::uint16_t port) {
  wire::AgentMetadata m = wire::decode(target.transport.agent_metadata());
  wire::PeerBlob blob = blob_of(target);
  blob.tcp_port = port;
  wire::TcpAddress loopback;
  loopback.bytes = {127, 0, 0, 1};
  blob.tcp_addresses = {loopback};
  m.engine_blob = wire::encode_blob(blob);
  return wire::encode(m);
}

// Writes a block of a recognizable text and reads one back through a
// proxy; whether the proxy saw either text.
bool observer_sees_payload(const char* encrypt) {
  Side target("target", encrypt);
  Side alice("alice", encrypt);
  Proxy proxy(blob_of(target).tcp_port);
  alice.add("target", target, metadata_via(target, proxy.port()));
  const std::string_view written = "the user typed: my card number is 4111-1111-1111-1111. ";
  const std::string_view read = "the model answered: please never type that again. ";
  for (std::uint64_t i = 0; i < kBlockLen; ++i) {
    alice.pool.block(0)[i] = static_cast<std::uint8_t>(written[i % written.size()]);
    target.pool.block(5)[i] = static_cast<std::uint8_t>(read[i % read.size()]);
  }
  const std::vector<std::int64_t> zero{0};
  const std::vector<std::int64_t> three{3};
  const std::vector<std::int64_t> five{5};
  EXPECT_TRUE(alice.wait_done("target", alice.transport.write_blocks("target", zero, three)));
  EXPECT_TRUE(alice.wait_done("target", alice.transport.read_blocks("target", three, five)));
  EXPECT_EQ(std::memcmp(alice.pool.block(0), target.pool.block(3), kBlockLen), 0);
  EXPECT_EQ(std::memcmp(alice.pool.block(3), target.pool.block(5), kBlockLen), 0);
  const Bytes seen = proxy.seen();
  EXPECT_GT(seen.size(), 2 * kBlockLen);  // both payloads went through it
  const auto contains = [&seen](std::string_view text) {
    return std::search(seen.begin(), seen.end(), text.begin(), text.end()) != seen.end();
  };
  return contains(written) || contains(read);
}

TEST(TcpTls, AnOnPathObserverSeesThePayloadOnlyWithEncryptionOff) {
  EXPECT_TRUE(observer_sees_payload("off"));  // the check can fail
  EXPECT_FALSE(observer_sees_payload("on"));
}

}  // namespace
}  // namespace kvxfer::it
