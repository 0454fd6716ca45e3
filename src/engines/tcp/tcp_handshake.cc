// SPDX-License-Identifier: Apache-2.0
#include "engines/tcp/tcp_handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include <memory>
#include <string_view>

namespace kvxfer::internal::tcp {
namespace {

// Distinct per use and per protocol version, so no value derived for one
// purpose is ever accepted for another.
constexpr std::string_view kTranscriptLabel = "kvxfer tcp handshake v3";
constexpr std::string_view kSalt = "kvxfer tcp v3";
constexpr std::string_view kProofLabel = "kvxfer tcp v3 initiator proof";
constexpr std::string_view kToTargetLabel = "kvxfer tcp v3 frames to target";
constexpr std::string_view kToInitiatorLabel = "kvxfer tcp v3 frames to initiator";
constexpr std::string_view kTlsPskLabel = "kvxfer tcp v3 tls psk";

using Hash = std::array<std::uint8_t, 32>;

struct MdFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* c) const { EVP_PKEY_CTX_free(c); }
};

const std::uint8_t* bytes_of(std::string_view s) {
  return reinterpret_cast<const std::uint8_t*>(s.data());
}

bool hash_update_prefixed(EVP_MD_CTX* md, std::span<const std::uint8_t> bytes) {
  std::array<std::uint8_t, 8> len{};
  for (std::size_t i = 0; i < len.size(); ++i) {
    len[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(bytes.size()) >> (8 * i));
  }
  return EVP_DigestUpdate(md, len.data(), len.size()) == 1 &&
         EVP_DigestUpdate(md, bytes.data(), bytes.size()) == 1;
}

// SHA-256 of everything both ends saw: the label, the target's and the
// initiator's static keys, and each message (length first, so no two
// transcripts hash the same bytes).
bool transcript_hash(const IdentityKey& target, const IdentityKey& initiator,
                     std::span<const std::uint8_t> challenge,
                     std::span<const std::uint8_t> hello_header,
                     std::span<const std::uint8_t> hello_body, Hash* out) {
  std::unique_ptr<EVP_MD_CTX, MdFree> md(EVP_MD_CTX_new());
  unsigned int len = 0;
  return md && EVP_DigestInit_ex(md.get(), EVP_sha256(), nullptr) == 1 &&
         EVP_DigestUpdate(md.get(), kTranscriptLabel.data(), kTranscriptLabel.size()) == 1 &&
         EVP_DigestUpdate(md.get(), target.data(), target.size()) == 1 &&
         EVP_DigestUpdate(md.get(), initiator.data(), initiator.size()) == 1 &&
         hash_update_prefixed(md.get(), challenge) &&
         hash_update_prefixed(md.get(), hello_header) &&
         hash_update_prefixed(md.get(), hello_body) &&
         EVP_DigestFinal_ex(md.get(), out->data(), &len) == 1 && len == out->size();
}

// HKDF-SHA256(salt kSalt, secret, info = label || transcript hash): RFC
// 8446's Derive-Secret, with our labels.
bool derive(const std::array<std::uint8_t, 32>& secret, std::string_view label,
            const Hash& transcript, std::span<std::uint8_t, 32> out) {
  std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree> ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr));
  std::size_t len = out.size();
  return ctx && EVP_PKEY_derive_init(ctx.get()) == 1 &&
         EVP_PKEY_CTX_set_hkdf_md(ctx.get(), EVP_sha256()) == 1 &&
         EVP_PKEY_CTX_set1_hkdf_salt(ctx.get(), bytes_of(kSalt), static_cast<int>(kSalt.size())) ==
             1 &&
         EVP_PKEY_CTX_set1_hkdf_key(ctx.get(), secret.data(), static_cast<int>(secret.size())) ==
             1 &&
         EVP_PKEY_CTX_add1_hkdf_info(ctx.get(), bytes_of(label), static_cast<int>(label.size())) ==
             1 &&
         EVP_PKEY_CTX_add1_hkdf_info(ctx.get(), transcript.data(),
                                     static_cast<int>(transcript.size())) == 1 &&
         EVP_PKEY_derive(ctx.get(), out.data(), &len) == 1 && len == out.size();
}

}  // namespace

bool fresh_nonce(Nonce* out) { return RAND_bytes(out->data(), static_cast<int>(out->size())) == 1; }

HandshakeKeys::~HandshakeKeys() {
  OPENSSL_cleanse(proof.data(), proof.size());
  OPENSSL_cleanse(to_target.data(), to_target.size());
  OPENSSL_cleanse(to_initiator.data(), to_initiator.size());
  OPENSSL_cleanse(tls_psk.data(), tls_psk.size());
}

bool handshake_keys(const Identity& self, const IdentityKey& peer, bool we_initiate,
                    std::span<const std::uint8_t> challenge,
                    std::span<const std::uint8_t> hello_header,
                    std::span<const std::uint8_t> hello_body, HandshakeKeys* out) {
  std::array<std::uint8_t, 32> secret{};
  Hash transcript{};
  const IdentityKey& target = we_initiate ? peer : self.public_key();
  const IdentityKey& initiator = we_initiate ? self.public_key() : peer;
  const bool ok =
      self.shared_secret(peer, &secret) &&
      transcript_hash(target, initiator, challenge, hello_header, hello_body, &transcript) &&
      derive(secret, kProofLabel, transcript, out->proof) &&
      derive(secret, kToTargetLabel, transcript, out->to_target) &&
      derive(secret, kToInitiatorLabel, transcript, out->to_initiator) &&
      derive(secret, kTlsPskLabel, transcript, out->tls_psk);
  OPENSSL_cleanse(secret.data(), secret.size());
  return ok;
}

bool same_proof(const Proof& ours, std::span<const std::uint8_t> theirs) {
  return theirs.size() == ours.size() &&
         CRYPTO_memcmp(ours.data(), theirs.data(), ours.size()) == 0;
}

FrameAuth::FrameAuth() = default;

FrameAuth::~FrameAuth() { EVP_CIPHER_CTX_free(ctx_); }

bool FrameAuth::start(const FrameKey& key, std::uint64_t first) {
  if (ctx_ == nullptr) ctx_ = EVP_CIPHER_CTX_new();
  started_ = ctx_ != nullptr &&
             EVP_EncryptInit_ex(ctx_, EVP_aes_256_gcm(), nullptr, key.data(), nullptr) == 1;
  next_ = first;
  return started_;
}

bool FrameAuth::tag_of(std::span<const std::uint8_t> fields, std::span<const std::uint8_t> body,
                       std::uint8_t* tag) {
  // The frame's number is GCM's 96-bit nonce (4 zero bytes, then the
  // number, big-endian), unique per key: each key serves one direction of
  // one connection. At 2^64 frames the connection cannot go on.
  if (!started_ || next_ == ~std::uint64_t{0}) return false;
  std::array<std::uint8_t, 12> iv{};
  for (std::size_t i = 0; i < 8; ++i) iv[4 + i] = static_cast<std::uint8_t>(next_ >> (56 - 8 * i));
  ++next_;
  int len = 0;
  std::array<std::uint8_t, 16> none{};
  return EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv.data()) == 1 &&
         EVP_EncryptUpdate(ctx_, nullptr, &len, fields.data(), static_cast<int>(fields.size())) ==
             1 &&
         (body.empty() || EVP_EncryptUpdate(ctx_, nullptr, &len, body.data(),
                                            static_cast<int>(body.size())) == 1) &&
         EVP_EncryptFinal_ex(ctx_, none.data(), &len) == 1 &&
         EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_AEAD_GET_TAG, static_cast<int>(kTagLen), tag) == 1;
}

bool FrameAuth::sign(std::span<const std::uint8_t> fields, std::span<const std::uint8_t> body,
                     std::span<std::uint8_t, kTagLen> tag) {
  return tag_of(fields, body, tag.data());
}

bool FrameAuth::verify(std::span<const std::uint8_t> fields, std::span<const std::uint8_t> body,
                       std::span<const std::uint8_t, kTagLen> tag) {
  std::array<std::uint8_t, kTagLen> expected{};
  return tag_of(fields, body, expected.data()) &&
         CRYPTO_memcmp(expected.data(), tag.data(), kTagLen) == 0;
}

}  // namespace kvxfer::internal::tcp
