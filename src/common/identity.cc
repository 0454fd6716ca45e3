// SPDX-License-Identifier: Apache-2.0
#include "common/identity.h"

#include <openssl/evp.h>

#include <cstring>
#include <stdexcept>
#include <string_view>

namespace kvxfer::internal {
namespace {

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct CtxFree {
  void operator()(EVP_PKEY_CTX* c) const { EVP_PKEY_CTX_free(c); }
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

}  // namespace kvxfer::internal
