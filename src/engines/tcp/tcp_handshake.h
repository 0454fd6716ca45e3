// SPDX-License-Identifier: Apache-2.0
// The tcp lane's handshake and frame authentication: what makes a hello
// unreplayable and every frame after it unforgeable. Frames themselves are
// wire/tcp_frame.h's; this is the cryptography over their bytes (OpenSSL).
//
// Each lane holds a static X25519 identity (common/identity.h) whose public
// half its metadata publishes, so an initiator knows its target's key before
// it connects, and presents its own in the hello. One connection:
//   target -> initiator  challenge: a fresh random nonce (the target's
//                        first bytes, before it reads anything)
//   initiator -> target  hello: token, fences, name, its static key, a fresh
//                        nonce of its own, and a proof
//   target -> initiator  welcome: the first frame authenticated with the
//                        keys below
// Both ends hash the transcript (both static keys, the challenge's bytes and
// the hello's bytes up to its proof) and, from the static-static X25519
// secret, derive three values, one per label, as TLS 1.3 derives its
// secrets (RFC 8446 section 7.1, Derive-Secret: HKDF over a secret, a label
// and the transcript's hash), with the static secret in the place of TLS's
// pre-shared key and the two nonces as its randoms (psk_ke mode):
//   the proof the hello carries (only a holder of the initiator's private
//   key, or of the target's, can compute it, and it names this challenge,
//   so a recorded hello proves nothing on another connection), one
//   frame key per direction, and the TLS 1.3 pre-shared key an encrypted
//   connection runs on (tcp_tls.h).
// Every frame after the hello then carries a 16-byte tag: AES-256-GCM with
// no plaintext (GMAC, NIST SP 800-38D) under its direction's key, over the
// header's fields and the frame's body (runs, message), with the frame's
// number in its direction as the nonce. The number is not sent: a frame
// injected, replayed, dropped or moved within the connection fails its tag.
// The payload (a write's or a reply's pool bytes) is not covered.
//
// Not forward secret (no ephemeral keys): nothing here is secret but the
// keys, and a lane's static key lives as long as the lane. A holder of the
// target's private key could also pose as any initiator to that target
// (key-compromise impersonation), which it could do anyway as that target.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "common/identity.h"
#include "wire/tcp_frame.h"

struct evp_cipher_ctx_st;

namespace kvxfer::internal::tcp {

inline constexpr std::size_t kNonceLen = wire::kNonceLen;
inline constexpr std::size_t kProofLen = wire::kHelloProofLen;
inline constexpr std::size_t kTagLen = wire::kTagLen;
using Nonce = std::array<std::uint8_t, kNonceLen>;
using Proof = std::array<std::uint8_t, kProofLen>;
using FrameKey = std::array<std::uint8_t, 32>;
using TlsPsk = std::array<std::uint8_t, 32>;

// Random bytes from OpenSSL's generator; false if it has none to give.
[[nodiscard]] bool fresh_nonce(Nonce* out);

// What both ends of one handshake derive. Wiped when destroyed.
struct HandshakeKeys {
  HandshakeKeys() = default;
  ~HandshakeKeys();
  HandshakeKeys(const HandshakeKeys&) = delete;
  HandshakeKeys& operator=(const HandshakeKeys&) = delete;

  Proof proof{};            // what the initiator's hello ends with
  FrameKey to_target{};     // tags the initiator's frames
  FrameKey to_initiator{};  // tags the target's frames
  // With encryption on (KVXFER_TCP_ENCRYPT), the external pre-shared key
  // TLS 1.3 then runs with (tcp_tls.h); its own label, so it is none of
  // the values above.
  TlsPsk tls_psk{};
};

// The keys of a handshake between `self` and the holder of `peer` (the
// target's key from its metadata when we initiate, the hello's key when we
// are the target): `challenge`, the challenge frame's bytes as sent; the
// hello frame's bytes as sent, its header and its body up to the proof.
// False for a peer key no X25519 secret comes of, or if OpenSSL fails.
[[nodiscard]] bool handshake_keys(const Identity& self, const IdentityKey& peer, bool we_initiate,
                                  std::span<const std::uint8_t> challenge,
                                  std::span<const std::uint8_t> hello_header,
                                  std::span<const std::uint8_t> hello_body, HandshakeKeys* out);

// Compares a proof with bytes received, in time independent of where they
// differ.
[[nodiscard]] bool same_proof(const Proof& ours, std::span<const std::uint8_t> theirs);

// One direction of a connection's frames: tags the frames we send, or
// checks those we receive, numbering them from 0 in order. Holds one cipher
// context from start() for the connection's life (none before, so a
// connection that never says hello costs none); tagging allocates nothing.
class FrameAuth {
 public:
  FrameAuth();
  ~FrameAuth();
  FrameAuth(const FrameAuth&) = delete;
  FrameAuth& operator=(const FrameAuth&) = delete;

  // Keys this direction; the next frame is number `first` (0 unless some
  // were checked elsewhere: the welcome, before a connection is handed to
  // the I/O thread). False if OpenSSL fails.
  [[nodiscard]] bool start(const FrameKey& key, std::uint64_t first = 0);
  [[nodiscard]] bool started() const { return started_; }

  // The next frame's tag over its header's fields and its body, into `tag`
  // (kTagLen bytes). False if not started or OpenSSL fails.
  [[nodiscard]] bool sign(std::span<const std::uint8_t> fields, std::span<const std::uint8_t> body,
                          std::span<std::uint8_t, kTagLen> tag);
  // Whether `tag` is the next frame's; the frame counts either way (a
  // receiver closes the connection on a tag that fails).
  [[nodiscard]] bool verify(std::span<const std::uint8_t> fields,
                            std::span<const std::uint8_t> body,
                            std::span<const std::uint8_t, kTagLen> tag);

 private:
  bool tag_of(std::span<const std::uint8_t> fields, std::span<const std::uint8_t> body,
              std::uint8_t* tag);

  evp_cipher_ctx_st* ctx_ = nullptr;
  std::uint64_t next_ = 0;
  bool started_ = false;
};

}  // namespace kvxfer::internal::tcp
