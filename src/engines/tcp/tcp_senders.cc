// SPDX-License-Identifier: Apache-2.0
// The registered peers' names and keys (tcp_senders.h).
#include "engines/tcp/tcp_senders.h"

namespace kvxfer::internal::tcp {

void Vouched::vouch(PeerHandle handle, const std::string& name, const IdentityKey& key) {
  std::lock_guard lock(mu_);
  by_name_[name][handle] = key;
  names_[handle] = name;
}

void Vouched::unvouch(PeerHandle handle) {
  std::lock_guard lock(mu_);
  auto it = names_.find(handle);
  if (it == names_.end()) return;
  auto name = by_name_.find(it->second);
  if (name != by_name_.end()) {
    name->second.erase(handle);
    if (name->second.empty()) by_name_.erase(name);
  }
  names_.erase(it);
}

Claim Vouched::claim_of(const std::string& agent_name, const IdentityKey& key) const {
  std::lock_guard lock(mu_);
  auto it = by_name_.find(agent_name);
  if (it == by_name_.end()) return Claim::kUnregistered;
  for (const auto& [handle, k] : it->second) {
    if (k == key) return Claim::kRegistered;
  }
  return Claim::kImpostor;
}

}  // namespace kvxfer::internal::tcp
