// SPDX-License-Identifier: Apache-2.0
// Who is at the other end of a tcp-lane connection: every lane holds an
// X25519 key pair for its life and publishes the public half in its
// metadata. The lane's handshake (engines/tcp/tcp_handshake.h) derives a
// connection's keys from the secret the two ends' keys share, so a target
// learns that the connection's owner holds the private key of the public
// key it presents; whether that key is a peer the target's owner registered
// is the lane's question (engines/tcp/). OpenSSL does the arithmetic.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace kvxfer::internal {

inline constexpr std::size_t kIdentityKeyLen = 32;
using IdentityKey = std::array<std::uint8_t, kIdentityKeyLen>;

class Identity {
 public:
  // A fresh key pair. Throws std::runtime_error if OpenSSL cannot make one.
  Identity();
  ~Identity();
  Identity(const Identity&) = delete;
  Identity& operator=(const Identity&) = delete;

  [[nodiscard]] const IdentityKey& public_key() const { return public_; }

  // The raw X25519 secret we share with the holder of `peer_public`, for a
  // key schedule to extract keys from (engines/tcp/tcp_handshake.h); the
  // caller wipes it. False for a public key no secret comes of.
  [[nodiscard]] bool shared_secret(const IdentityKey& peer_public,
                                   std::array<std::uint8_t, 32>* out) const;

 private:
  struct Pkey;
  std::unique_ptr<Pkey> key_;
  IdentityKey public_{};
};

}  // namespace kvxfer::internal
