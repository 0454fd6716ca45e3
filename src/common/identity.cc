// SPDX-License-Identifier: Apache-2.0
#include "common/identity.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>
#include <stdexcept>
#include <string_view>

namespace kvxfer::internal {
namespace {

constexpr std::string_view kContext = "kvxfer tcp lane connection key v1";

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct CtxFree {
  void operator()(EVP_PKEY_CTX* c) const { EVP_PKEY_CTX_free(c); }
};
struct MdFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

}  // namespace

struct Identity::Pkey {
  std::unique_ptr<EVP_PKEY, PkeyFree> key;
};

Identity::Identity() : key_(std::make_unique<Pkey>()) {
  std::unique_ptr<EVP_PKEY_CTX, CtxFree> ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, nullptr));
  EVP_PKEY* made = nullptr;
  if (!ctx || EVP_PKEY_keygen_init(ctx.get()) != 1 || EVP_PKEY_keygen(ctx.get(), &made) != 1) {
    throw std::runtime_error("kvxfer: OpenSSL could not make an X25519 key pair");
  }
  key_->key.reset(made);
  std::size_t len = public_.size();
  if (EVP_PKEY_get_raw_public_key(made, public_.data(), &len) != 1 || len != public_.size()) {
    throw std::runtime_error("kvxfer: OpenSSL gave no X25519 public key");
  }
}

Identity::~Identity() = default;

bool Identity::shared_secret(const IdentityKey& peer_public,
                             std::array<std::uint8_t, 32>* out) const {
  std::unique_ptr<EVP_PKEY, PkeyFree> peer(EVP_PKEY_new_raw_public_key(
      EVP_PKEY_X25519, nullptr, peer_public.data(), peer_public.size()));
  if (!peer) return false;
  std::unique_ptr<EVP_PKEY_CTX, CtxFree> ctx(EVP_PKEY_CTX_new(key_->key.get(), nullptr));
  std::size_t len = out->size();
  return ctx && EVP_PKEY_derive_init(ctx.get()) == 1 &&
         EVP_PKEY_derive_set_peer(ctx.get(), peer.get()) == 1 &&
         EVP_PKEY_derive(ctx.get(), out->data(), &len) == 1 && len == out->size();
}

bool Identity::connection_key(const IdentityKey& peer_public, bool we_initiate,
                              IdentityKey* out) const {
  std::array<std::uint8_t, 32> secret{};
  if (!shared_secret(peer_public, &secret)) {
    OPENSSL_cleanse(secret.data(), secret.size());
    return false;
  }
  const IdentityKey& initiator = we_initiate ? public_ : peer_public;
  const IdentityKey& target = we_initiate ? peer_public : public_;
  std::unique_ptr<EVP_MD_CTX, MdFree> md(EVP_MD_CTX_new());
  unsigned int out_len = 0;
  const bool ok = md && EVP_DigestInit_ex(md.get(), EVP_sha256(), nullptr) == 1 &&
                  EVP_DigestUpdate(md.get(), kContext.data(), kContext.size()) == 1 &&
                  EVP_DigestUpdate(md.get(), secret.data(), secret.size()) == 1 &&
                  EVP_DigestUpdate(md.get(), initiator.data(), initiator.size()) == 1 &&
                  EVP_DigestUpdate(md.get(), target.data(), target.size()) == 1 &&
                  EVP_DigestFinal_ex(md.get(), out->data(), &out_len) == 1 &&
                  out_len == out->size();
  OPENSSL_cleanse(secret.data(), secret.size());
  return ok;
}

bool mac_of(const IdentityKey& key, std::span<const std::uint8_t> bytes, Mac* out) {
  unsigned int len = 0;
  return HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), bytes.data(), bytes.size(),
              out->data(), &len) != nullptr &&
         len == out->size();
}

bool same_mac(const Mac& a, std::span<const std::uint8_t> b) {
  return b.size() == a.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace kvxfer::internal
