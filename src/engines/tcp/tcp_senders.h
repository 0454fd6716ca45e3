// SPDX-License-Identifier: Apache-2.0
// Who sends to this lane as a target: the peers our owner registered
// (through any lane: lanes.cc vouches for them) by name and key, where a
// connection's name and key stand against them, and the inbox notifications
// wait in per sender. Each has its own lock and touches nothing else.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/identity.h"
#include "engine.h"
#include "engines/inbox.h"

namespace kvxfer::internal::tcp {

// Where a connection's name and key stand against those registrations.
enum class Claim : std::uint8_t {
  kUnregistered,  // no registered peer has this name
  kRegistered,    // a registered peer has this name and this key
  kImpostor,      // registered peers have this name, none this key
};

// The registered peers: by agent name, each registration's identity key.
// Callers write it; the I/O thread and take_notifications() ask it.
class Vouched {
 public:
  // Registration `handle` is peer `name`'s, with tcp identity key `key`.
  void vouch(PeerHandle handle, const std::string& name, const IdentityKey& key);
  // The registration is gone; unknown handles are ignored.
  void unvouch(PeerHandle handle);
  [[nodiscard]] Claim claim_of(const std::string& agent_name, const IdentityKey& key) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::map<PeerHandle, IdentityKey>> by_name_;
  std::unordered_map<PeerHandle, std::string> names_;
};

// A notification's sender, as the target tells senders apart: the agent
// name and identity key its connection presented. A registered peer's share
// of the inbox is its own; the others share kMaxQueuedNotifications.
using Sender = std::pair<std::string, IdentityKey>;
using Notes = Inbox<Sender>;

}  // namespace kvxfer::internal::tcp
