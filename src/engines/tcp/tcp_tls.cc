// SPDX-License-Identifier: Apache-2.0
#include "engines/tcp/tcp_tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/uio.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string_view>

namespace kvxfer::internal::tcp {
namespace {

// The PSK's name on the wire: one per protocol version. Both ends know the
// key already; the name only says which one.
constexpr std::string_view kPskIdentity = "kvxfer tcp v3 psk";
constexpr std::array<unsigned char, 2> kAes128GcmSha256 = {0x13, 0x01};

// An SSL's PSK session, made by TlsContext::open and kept in its app data
// until SslFree.
SSL_SESSION* psk_session(SSL* ssl) { return static_cast<SSL_SESSION*>(SSL_get_app_data(ssl)); }

int use_psk(SSL* ssl, const EVP_MD* md, const unsigned char** id, std::size_t* id_len,
            SSL_SESSION** sess) {
  SSL_SESSION* s = psk_session(ssl);
  *sess = nullptr;
  *id = nullptr;
  *id_len = 0;
  if (s == nullptr) return 0;
  // A second call names the suite's hash: ours is SHA-256, the only one.
  if (md != nullptr && md != SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(s))) return 1;
  if (SSL_SESSION_up_ref(s) != 1) return 0;
  *sess = s;  // OpenSSL owns the reference it is given
  *id = reinterpret_cast<const unsigned char*>(kPskIdentity.data());
  *id_len = kPskIdentity.size();
  return 1;
}

int find_psk(SSL* ssl, const unsigned char* id, std::size_t id_len, SSL_SESSION** sess) {
  SSL_SESSION* s = psk_session(ssl);
  *sess = nullptr;
  if (s == nullptr) return 0;
  // Another name: no PSK, and with no certificate the handshake fails.
  if (id_len != kPskIdentity.size() || std::memcmp(id, kPskIdentity.data(), id_len) != 0) return 1;
  if (SSL_SESSION_up_ref(s) != 1) return 0;
  *sess = s;
  return 1;
}

// The handshake used the PSK (no certificate) and an ephemeral X25519
// exchange with it (psk_dhe_ke: forward secrecy), as both ends require.
bool keyed_as_agreed(SSL* ssl) {
  return SSL_session_reused(ssl) == 1 && SSL_get_negotiated_group(ssl) == NID_X25519;
}

SSL_CTX* make_ctx(bool client) {
  SSL_CTX* ctx = SSL_CTX_new(client ? TLS_client_method() : TLS_server_method());
  if (ctx == nullptr) return nullptr;
  const bool ok = SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) == 1 &&
                  SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) == 1 &&
                  SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256") == 1 &&
                  SSL_CTX_set1_groups_list(ctx, "X25519") == 1 &&
                  SSL_CTX_set_num_tickets(ctx, 0) == 1;
  if (!ok) {
    SSL_CTX_free(ctx);
    return nullptr;
  }
  // No resumption tickets, no session cache: every connection's PSK is its
  // own. A client demands a certificate it cannot verify (no trust store),
  // so only the PSK can complete a handshake.
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  if (client) SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  // Non-blocking sends from the pool: a write may end after any record and
  // be retried from a moved pointer. Reads take up to kTlsReadBuffer bytes
  // of records per recv.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_read_ahead(ctx, 1);
  SSL_CTX_set_default_read_buffer_len(ctx, kTlsReadBuffer);
  return ctx;
}

}  // namespace

void SslFree::operator()(ssl_st* ssl) const {
  if (ssl == nullptr) return;
  SSL_SESSION* s = psk_session(ssl);
  SSL_free(ssl);
  SSL_SESSION_free(s);
}

TlsContext::TlsContext() : client_(make_ctx(true)), server_(make_ctx(false)) {
  if (client_ == nullptr || server_ == nullptr) {
    const std::string why = tls_error();
    SSL_CTX_free(client_);
    SSL_CTX_free(server_);
    throw std::runtime_error("kvxfer tcp: OpenSSL cannot make a TLS 1.3 context: " + why);
  }
}

TlsContext::~TlsContext() {
  SSL_CTX_free(client_);
  SSL_CTX_free(server_);
}

SslPtr TlsContext::open(int fd, const TlsPsk& psk, bool client) const {
  SslPtr ssl(SSL_new(client ? client_ : server_));
  if (!ssl) return nullptr;
  SSL_SESSION* s = SSL_SESSION_new();
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl.get(), kAes128GcmSha256.data());
  if (s == nullptr || cipher == nullptr || SSL_set_app_data(ssl.get(), s) != 1) {
    SSL_SESSION_free(s);
    return nullptr;
  }
  // From here SslFree frees the session with the SSL.
  if (SSL_SESSION_set1_master_key(s, psk.data(), psk.size()) != 1 ||
      SSL_SESSION_set_cipher(s, cipher) != 1 ||
      SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) != 1) {
    return nullptr;
  }
  // Reads straight from the socket; writes through a buffer, so records
  // (16 KiB at most each) go out kTlsWriteBuffer bytes a send, not one a
  // send (tls_flush empties it).
  BIO* in = BIO_new_socket(fd, BIO_NOCLOSE);
  BIO* out = BIO_new_socket(fd, BIO_NOCLOSE);
  BIO* buffer = BIO_new(BIO_f_buffer());
  if (in == nullptr || out == nullptr || buffer == nullptr ||
      BIO_set_write_buffer_size(buffer, kTlsWriteBuffer) != 1) {
    BIO_free(in);
    BIO_free(out);
    BIO_free(buffer);
    return nullptr;
  }
  SSL_set_bio(ssl.get(), in, BIO_push(buffer, out));
  if (client) {
    SSL_set_psk_use_session_callback(ssl.get(), use_psk);
    SSL_set_connect_state(ssl.get());
  } else {
    SSL_set_psk_find_session_callback(ssl.get(), find_psk);
    SSL_set_accept_state(ssl.get());
  }
  return ssl;
}

bool tls_connect(ssl_st* ssl, int fd, std::chrono::milliseconds timeout, std::string* why) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    ERR_clear_error();
    const int r = SSL_connect(ssl);
    if (r == 1) break;
    const int err = SSL_get_error(ssl, r);
    if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) {
      *why = "the TLS handshake failed: " + tls_error();
      return false;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, static_cast<short>(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT), 0};
    if (left.count() <= 0 ||
        (::poll(&p, 1, static_cast<int>(left.count())) < 0 && errno != EINTR)) {
      *why = "the TLS handshake did not finish in time";
      return false;
    }
  }
  if (!keyed_as_agreed(ssl)) {
    *why =
        "the TLS handshake did not use the key both ends derived with an ephemeral X25519 "
        "exchange";
    return false;
  }
  return true;
}

TlsStep tls_accept(ssl_st* ssl) {
  ERR_clear_error();
  const int r = SSL_accept(ssl);
  if (r == 1) return keyed_as_agreed(ssl) ? TlsStep::kDone : TlsStep::kFailed;
  switch (SSL_get_error(ssl, r)) {
    case SSL_ERROR_WANT_READ:
      return TlsStep::kWantRead;
    case SSL_ERROR_WANT_WRITE:
      return TlsStep::kWantWrite;
    default:
      return TlsStep::kFailed;
  }
}

long tls_read(ssl_st* ssl, void* buf, std::size_t len, TlsIo* io) {
  ERR_clear_error();
  std::size_t n = 0;
  if (SSL_read_ex(ssl, buf, len, &n) == 1) return static_cast<long>(n);
  switch (SSL_get_error(ssl, 0)) {
    case SSL_ERROR_WANT_READ:
      return -1;
    case SSL_ERROR_WANT_WRITE:
      io->want_other = true;
      return -1;
    case SSL_ERROR_ZERO_RETURN:
      return 0;
    default:
      io->failed = true;
      return -1;
  }
}

long tls_writev(ssl_st* ssl, std::span<const iovec> iov, TlsIo* io) {
  long total = 0;
  for (const iovec& v : iov) {
    std::size_t at = 0;
    while (at < v.iov_len) {
      ERR_clear_error();
      std::size_t n = 0;
      if (SSL_write_ex(ssl, static_cast<const std::uint8_t*>(v.iov_base) + at, v.iov_len - at,
                       &n) == 1) {
        at += n;
        total += static_cast<long>(n);
        continue;
      }
      switch (SSL_get_error(ssl, 0)) {
        case SSL_ERROR_WANT_WRITE:
          break;
        case SSL_ERROR_WANT_READ:
          io->want_other = true;
          break;
        default:
          io->failed = true;
          return -1;
      }
      return total > 0 ? total : -1;
    }
  }
  return total;
}

bool tls_flush(ssl_st* ssl, TlsIo* io) {
  BIO* out = SSL_get_wbio(ssl);
  if (BIO_wpending(out) == 0) return true;
  if (BIO_flush(out) == 1) return true;
  if (!BIO_should_retry(out)) io->failed = true;
  return false;
}

bool tls_has_pending(const ssl_st* ssl) { return SSL_has_pending(ssl) == 1; }

std::string tls_error() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "no OpenSSL error";
  std::array<char, 256> text{};
  ERR_error_string_n(e, text.data(), text.size());
  return text.data();
}

}  // namespace kvxfer::internal::tcp
