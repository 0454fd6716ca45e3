// SPDX-License-Identifier: Apache-2.0
// The tcp lane's optional encryption (KVXFER_TCP_ENCRYPT=on): after the
// lane's own handshake (tcp_handshake.h) has authenticated both ends and
// agreed on encryption, the connection is carried over TLS 1.3 from
// OpenSSL. Only the TLS objects and their calls live here; the I/O thread
// drives them (tcp_conn.cc).
//
// No certificates and no certificate authority: both ends derive an
// external pre-shared key from the handshake (HandshakeKeys::tls_psk, a
// value only the two holders of the identity keys pinned in the metadata
// can compute, fresh per connection), and TLS 1.3 runs in psk_dhe_ke mode
// (RFC 8446 section 4.2.9): the PSK authenticates, an ephemeral X25519
// exchange gives the payload forward secrecy. One cipher suite,
// TLS_AES_128_GCM_SHA256 (AES-NI). The initiator is TLS's client, the
// target its server. A handshake that would end without the PSK (a
// certificate, a full handshake) fails on both sides: the client demands a
// certificate it cannot verify (no trust store) and both check that the
// PSK and an X25519 exchange were used.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "engines/tcp/tcp_handshake.h"

struct ssl_st;
struct ssl_ctx_st;

namespace kvxfer::internal::tcp {

struct SslFree {
  void operator()(ssl_st* ssl) const;
};
using SslPtr = std::unique_ptr<ssl_st, SslFree>;

// One lane's TLS contexts (client and server), made once when encryption
// is on; SSL objects made from them may live on any one thread at a time.
class TlsContext {
 public:
  // Throws std::runtime_error when OpenSSL cannot make them.
  TlsContext();
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // A TLS connection over `fd` keyed with `psk` (client: we initiate),
  // ready for its handshake; null if OpenSSL fails.
  [[nodiscard]] SslPtr open(int fd, const TlsPsk& psk, bool client) const;

 private:
  ssl_ctx_st* client_ = nullptr;
  ssl_ctx_st* server_ = nullptr;
};

// The client's handshake on a connected non-blocking socket, waiting at
// most `timeout`; false (and *why) when it fails or times out.
[[nodiscard]] bool tls_connect(ssl_st* ssl, int fd, std::chrono::milliseconds timeout,
                               std::string* why);

// One step of the server's handshake on a non-blocking socket.
enum class TlsStep { kDone, kWantRead, kWantWrite, kFailed };
[[nodiscard]] TlsStep tls_accept(ssl_st* ssl);

// Data through a TLS connection, as recv/sendmsg: bytes moved (> 0), 0 for
// the peer's orderly close (read only), -1 for nothing now (*want_other:
// OpenSSL needs the socket the other way: writable to read, readable to
// write) or a failure (*failed).
struct TlsIo {
  bool want_other = false;
  bool failed = false;
};
[[nodiscard]] long tls_read(ssl_st* ssl, void* buf, std::size_t len, TlsIo* io);
// Writes the iovecs in order until one would block; the bytes written.
// Called again after -1, it must start with the same first iovec (OpenSSL
// resumes the record it began).
[[nodiscard]] long tls_writev(ssl_st* ssl, std::span<const iovec> iov, TlsIo* io);
// Sends what tls_writev left in the write buffer: true once it is all out
// (false: the socket is full, or *failed).
[[nodiscard]] bool tls_flush(ssl_st* ssl, TlsIo* io);
// Whether OpenSSL holds bytes read from the socket that it has not handed
// out yet (epoll does not see them).
[[nodiscard]] bool tls_has_pending(const ssl_st* ssl);
// How many payload bytes OpenSSL may hold in its buffers at most (a bound
// for the socket's wake threshold: Io::set_lowat).
inline constexpr std::size_t kTlsReadBuffer = std::size_t{64} << 10;
// The records a connection buffers before one send: with kTlsReadBuffer,
// what an encrypted connection holds of its own beyond OpenSSL's state.
inline constexpr std::size_t kTlsWriteBuffer = std::size_t{128} << 10;

// Why OpenSSL's last call on this thread failed, for a log line.
[[nodiscard]] std::string tls_error();

}  // namespace kvxfer::internal::tcp
