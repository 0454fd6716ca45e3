// SPDX-License-Identifier: Apache-2.0
// Who is at the other end of a tcp-lane connection: every lane holds an
// X25519 key pair for its life and publishes the public half in its
// metadata. An initiator's hello carries its own public key and a MAC under
// the key both ends derive (X25519 of one's private and the other's public
// key), so a target learns that the connection's owner holds the private key
// of the public key it presents; whether that key is a peer the target's
// owner registered is the lane's question (engines/tcp/). OpenSSL does the
// arithmetic; nothing here allocates per call beyond OpenSSL's own contexts.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace kvxfer::internal {

inline constexpr std::size_t kIdentityKeyLen = 32;
inline constexpr std::size_t kMacLen = 32;
using IdentityKey = std::array<std::uint8_t, kIdentityKeyLen>;
using Mac = std::array<std::uint8_t, kMacLen>;

class Identity {
 public:
  // A fresh key pair. Throws std::runtime_error if OpenSSL cannot make one.
  Identity();
  ~Identity();
  Identity(const Identity&) = delete;
  Identity& operator=(const Identity&) = delete;

  [[nodiscard]] const IdentityKey& public_key() const { return public_; }

  // The key a connection between us and the holder of `peer_public` is
  // authenticated with: SHA-256 over a context string, the X25519 shared
  // secret and both public keys, the initiator's first. False for a public
  // key no shared secret comes of (OpenSSL refuses low-order points).
  [[nodiscard]] bool connection_key(const IdentityKey& peer_public, bool we_initiate,
                                    IdentityKey* out) const;

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

// HMAC-SHA256 of `bytes` under `key`; false only if OpenSSL fails (then a
// hello is neither sent nor accepted).
[[nodiscard]] bool mac_of(const IdentityKey& key, std::span<const std::uint8_t> bytes, Mac* out);

// Compares two MACs in time independent of where they differ.
[[nodiscard]] bool same_mac(const Mac& a, std::span<const std::uint8_t> b);

}  // namespace kvxfer::internal
