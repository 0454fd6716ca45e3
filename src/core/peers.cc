// SPDX-License-Identifier: Apache-2.0
// Peers: validating what the control plane hands us, registering (sync and
// on the registration worker), generations so a superseded registration is
// released instead of published, removal and teardown. Connects and
// disconnects run outside the lock. May touch the engine interface,
// src/common/ and src/wire/.
#include <algorithm>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "common/log.h"
#include "common/region.h"
#include "core/transport_state.h"
#include "wire/metadata.h"

namespace kvxfer::internal {

namespace {

// The peer's regions as the engine gets them: its pool first (id 0) when it
// has one, then the metadata's list (decoded: sorted, none overlapping
// another), none of which may overlap the pool.
std::vector<MemRegion> regions_of(const std::string& peer_id, const wire::AgentMetadata& m) {
  std::vector<MemRegion> out;
  out.reserve(m.regions.size() + 1);
  // An impossible pool is the engine's connect to refuse (as it always
  // was); it overlaps nothing here.
  const bool pool = m.num_blocks != 0;
  const std::uint64_t pool_len =
      pool && region_is_valid(m.base_addr, m.num_blocks, m.block_len) ? m.num_blocks * m.block_len
                                                                      : 0;
  if (pool) out.push_back(MemRegion{0, m.base_addr, pool_len});
  for (const auto& r : m.regions) {
    if (pool_len != 0 && r.addr < m.base_addr + pool_len && m.base_addr < r.addr + r.len) {
      throw std::invalid_argument(
          fmt::format("peer {} metadata lists region {:#x} ({:#x}, {} bytes) inside its pool",
                      peer_id, r.id, r.addr, r.len));
    }
    out.push_back(MemRegion{r.id, r.addr, r.len});
  }
  return out;
}

}  // namespace

TransportState::Registration TransportState::validate_peer(const std::string& peer_id,
                                                           std::span<const std::uint8_t> metadata,
                                                           const Geometry* geometry) const {
  if (peer_id.empty()) throw std::invalid_argument("peer_id must not be empty");
  // The metadata first: bytes that are not metadata at all must be reported
  // as such, not as the geometry they happen to disagree with.
  wire::AgentMetadata m = wire::decode(metadata);
  Registration reg;
  if (geometry != nullptr) check_geometry(peer_id, m, *geometry);
  check_identity(peer_id, m);
  reg.remote = RemoteRegion{m.agent_name, m.base_addr, m.num_blocks, m.block_len, m.pid, m.boot_id,
                            regions_of(peer_id, m)};
  reg.blob = std::move(m.engine_blob);
  return reg;
}

void TransportState::check_geometry(const std::string& peer_id, const wire::AgentMetadata& m,
                                    const Geometry& g) const {
  const std::uintptr_t base_addr = g.base_addr;
  const std::uint64_t num_blocks = g.num_blocks;
  const std::uint64_t block_len = g.block_len;
  if (num_blocks == 0) throw std::invalid_argument("peer num_blocks must be > 0");
  if (block_len == 0) throw std::invalid_argument("peer block_len must be > 0");
  if (block_len != region_.block_len) {
    throw std::invalid_argument(fmt::format(
        "peer {} block_len {} differs from ours ({})", peer_id, block_len, region_.block_len));
  }
  // The size only, as it always was: a base whose region would wrap the
  // address space is the engine's to refuse at connect (kInvalidParam, so
  // add_remote_peer throws std::runtime_error), and stays so.
  if (!region_is_valid(0, num_blocks, block_len)) {
    throw std::invalid_argument("peer num_blocks * block_len overflows");
  }
  if (m.base_addr != base_addr || m.num_blocks != num_blocks || m.block_len != block_len) {
    throw std::invalid_argument(fmt::format(
        "peer {} geometry (base {:#x}, {} blocks of {}) disagrees with its metadata "
        "(base {:#x}, {} blocks of {})",
        peer_id, base_addr, num_blocks, block_len, m.base_addr, m.num_blocks, m.block_len));
  }
}

void TransportState::check_identity(const std::string& peer_id,
                                    const wire::AgentMetadata& m) const {
  if (m.engine != engine_->name()) {
    throw std::invalid_argument(fmt::format("peer {} metadata is for backend {}, this transport uses {}",
                                            peer_id, m.engine, engine_->name()));
  }
  if (m.agent_name == agent_name_) {
    throw std::invalid_argument(
        fmt::format("peer {} has our own agent name '{}'", peer_id, agent_name_));
  }
  // A tier must not take blocks from an engine whose configuration it
  // cannot check: one side declaring config fields and the other none is a
  // mismatch too.
  if (m.config_fingerprint != fingerprint_) {
    if (m.config_fingerprint.empty()) {
      throw std::invalid_argument(fmt::format(
          "peer {} declares no config fields while we declare fingerprint {}: its configuration "
          "cannot be checked against ours (declare the same config fields on both sides)",
          peer_id, fingerprint_));
    }
    if (fingerprint_.empty()) {
      throw std::invalid_argument(fmt::format(
          "peer {} declares config fingerprint {} while we declare no config fields: ours cannot "
          "be checked against it (declare the same config fields on both sides)",
          peer_id, m.config_fingerprint));
    }
    throw std::invalid_argument(fmt::format("peer {} config fingerprint {} differs from ours ({})",
                                            peer_id, m.config_fingerprint, fingerprint_));
  }
}

std::uint64_t TransportState::begin_registration(const std::string& peer_id,
                                                 PeerHandle* old_handle) {
  const std::uint64_t gen = ++next_gen_;
  generations_[peer_id] = gen;
  // Re-adding takes the old registration out first: no stale endpoint is
  // ever reused, and writes during the new registration see an unknown peer.
  // The caller disconnects it, outside the lock, before it connects anew.
  *old_handle = 0;
  if (auto it = peers_.find(peer_id); it != peers_.end()) {
    const std::unique_ptr<Peer> old = std::move(it->second);
    peers_.erase(it);
    *old_handle = detach_peer(*old, "re-registered");
  }
  return gen;
}

void TransportState::build_and_publish(const std::string& peer_id, std::uint64_t gen,
                                       const Registration& reg) {
  PeerHandle handle = 0;
  std::string reason;
  mu_.assert_not_held("a peer's connect");
  const Status st = engine_->connect(reg.blob, reg.remote, &handle, &reason);
  if (st != Status::kSuccess) {
    // The engine's reason, not only its status: the caller must learn what
    // to change without reading our log.
    throw std::runtime_error(fmt::format("kvxfer {}: cannot register peer {}: {}: {}",
                                         agent_name_, peer_id, status_name(st),
                                         reason.empty() ? "the engine gave no reason" : reason));
  }
  {
    MutexLock lock(mu_);
    auto it = generations_.find(peer_id);
    const bool fresh = !closing_ && it != generations_.end() && it->second == gen;
    if (fresh) {
      auto peer = std::make_unique<Peer>();
      peer->id = peer_id;
      peer->handle = handle;
      peer->num_blocks = reg.remote.num_blocks;
      peer->block_len = reg.remote.block_len;
      peer->regions = reg.remote.regions;
      peer->generation = gen;
      peer->counters.peer_id = peer_id;
      peer->counters.num_blocks = reg.remote.num_blocks;
      peer->shared_id = std::make_shared<const std::string>(peer_id);
      peer->lane = engine_->lane(handle);
      peers_.emplace(peer_id, std::move(peer));
      log().info("kvxfer {}: registered peer={} ({} blocks)", agent_name_, peer_id,
                 reg.remote.num_blocks);
      return;
    }
  }
  // Nothing else ever saw these handles: release them here, outside the
  // lock, as remove_peer() does. The disconnect may wait (a peer that froze
  // while we connected), and on the ucx lane without a progress thread it
  // takes the UCX driver's turn itself, running UCX's callbacks.
  log().info("kvxfer {}: discarding superseded registration for peer={}", agent_name_, peer_id);
  if (const Status d = disconnect_in_engine(handle); d != Status::kSuccess) {
    log().warn("kvxfer {}: releasing superseded registration for peer={} failed: {}", agent_name_,
               peer_id, status_name(d));
  }
  throw SupersededError(fmt::format(
      "registration for peer {} was superseded (peer removed or re-registered while registering)",
      peer_id));
}

void TransportState::add_peer(const std::string& peer_id, std::span<const std::uint8_t> metadata,
                              std::uintptr_t base_addr, std::uint64_t num_blocks,
                              std::uint64_t block_len) {
  const Geometry geometry{base_addr, num_blocks, block_len};
  register_peer(peer_id, validate_peer(peer_id, metadata, &geometry));
}

void TransportState::add_peer_from_metadata(const std::string& peer_id,
                                            std::span<const std::uint8_t> metadata) {
  register_peer(peer_id, validate_peer(peer_id, metadata, nullptr));
}

void TransportState::register_peer(const std::string& peer_id, Registration reg) {
  std::uint64_t gen = 0;
  PeerHandle old_handle = 0;
  {
    MutexLock lock(mu_);
    throw_if_closing();
    gen = begin_registration(peer_id, &old_handle);
    ++active_connects_;
  }
  const EngineCall call(*this, EngineCallKind::kConnect);
  if (old_handle != 0) disconnect_peer(old_handle, peer_id);
  build_and_publish(peer_id, gen, reg);
}

std::future<void> TransportState::add_peer_async(const std::string& peer_id,
                                                 std::span<const std::uint8_t> metadata,
                                                 std::uintptr_t base_addr,
                                                 std::uint64_t num_blocks,
                                                 std::uint64_t block_len) {
  const Geometry geometry{base_addr, num_blocks, block_len};
  auto reg = std::make_shared<Registration>(validate_peer(peer_id, metadata, &geometry));
  auto promise = std::make_shared<std::promise<void>>();
  std::future<void> future = promise->get_future();
  PeerHandle old_handle = 0;
  bool taken = false;
  {
    MutexLock lock(mu_);
    throw_if_closing();
    const std::uint64_t gen = begin_registration(peer_id, &old_handle);
    // The task owns the old registration's handle and disconnects it on the
    // worker, whether it then connects or was abandoned by close().
    taken = worker_.submit([this, peer_id, gen, reg, promise, old_handle](bool run) {
      if (old_handle != 0) disconnect_peer(old_handle, peer_id);
      if (!run) {
        promise->set_exception(std::make_exception_ptr(SupersededError(fmt::format(
            "registration for peer {} was superseded (transport closed before it ran)", peer_id))));
        return;
      }
      try {
        build_and_publish(peer_id, gen, *reg);
        promise->set_value();
      } catch (...) {
        promise->set_exception(std::current_exception());
      }
    });
    if (!taken && old_handle != 0) ++active_disconnects_;
  }
  if (!taken) {
    if (old_handle != 0) {
      const EngineCall call(*this, EngineCallKind::kDisconnect);
      disconnect_peer(old_handle, peer_id);
    }
    throw std::logic_error("kvxfer: transport " + agent_name_ + " is closed");
  }
  return future;
}

void TransportState::remove_peer(const std::string& peer_id) {
  PeerHandle handle = 0;
  {
    MutexLock lock(mu_);
    throw_if_closing();
    // Invalidate any registration still being built so its worker releases
    // the handles instead of publishing them.
    generations_.erase(peer_id);
    auto it = peers_.find(peer_id);
    if (it == peers_.end()) return;
    const std::unique_ptr<Peer> peer = std::move(it->second);
    peers_.erase(it);
    handle = detach_peer(*peer, "removed");
    ++active_disconnects_;
  }
  // The peer is out of every table: nothing else reaches its handle, and the
  // disconnect (which waits on a frozen or cut-off peer) holds up no one.
  const EngineCall call(*this, EngineCallKind::kDisconnect);
  disconnect_peer(handle, peer_id);
}

std::vector<std::string> TransportState::peer_ids() const {
  MutexLock lock(mu_);
  std::vector<std::string> ids;
  ids.reserve(peers_.size());
  for (const auto& [id, peer] : peers_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

PeerHandle TransportState::detach_peer(Peer& peer, const char* why) {
  // Its transfers are settled now, as a poll would see them, and reported
  // by the next poll of this peer id (or of every peer). One still in
  // flight fails: the peer's disconnect ends it, and nothing of this
  // registration lands after that (fencing, docs/reliability.md).
  if (peer.head == nullptr) return peer.handle;
  Orphans& orphans = orphans_[peer.id];
  std::size_t failed = 0;
  Ticks now = 0;
  while (peer.head != nullptr) {
    Inflight& e = *peer.head;
    Status state = Status::kInProgress;
    const bool landed =
        engine_->check(e.handle, &state) == Status::kSuccess && state == Status::kSuccess;
    (landed ? orphans.done : orphans.failed).push_back(e.id);
    failed += landed ? 0 : 1;
    count_finished(e, landed, now);
    release(&e);
  }
  if (failed > 0) {
    log().info("kvxfer {}: {} transfer(s) to peer={} fail: the peer was {} (reported by its next "
               "poll)",
               agent_name_, failed, peer.id, why);
  }
  return peer.handle;
}

void TransportState::take_orphans(std::optional<std::string_view> peer_id, PollResult& out) {
  const auto move = [&out](Orphans& o) {
    out.done.insert(out.done.end(), o.done.begin(), o.done.end());
    out.failed.insert(out.failed.end(), o.failed.begin(), o.failed.end());
  };
  if (!peer_id) {
    for (auto& [id, o] : orphans_) move(o);
    orphans_.clear();
    return;
  }
  if (auto it = orphans_.find(*peer_id); it != orphans_.end()) {
    move(it->second);
    orphans_.erase(it);
  }
}

bool TransportState::forget_orphan(TransferId id) {
  for (auto it = orphans_.begin(); it != orphans_.end(); ++it) {
    for (auto* list : {&it->second.done, &it->second.failed}) {
      if (auto at = std::find(list->begin(), list->end(), id); at != list->end()) {
        list->erase(at);
        if (it->second.done.empty() && it->second.failed.empty()) orphans_.erase(it);
        return true;
      }
    }
  }
  return false;
}

void TransportState::disconnect_peer(PeerHandle handle, const std::string& peer_id) {
  if (const Status st = disconnect_in_engine(handle); st != Status::kSuccess) {
    log().warn("kvxfer {}: releasing handles of peer={} failed: {}", agent_name_, peer_id,
               status_name(st));
  }
  log().info("kvxfer {}: removed peer={}", agent_name_, peer_id);
}

Status TransportState::disconnect_in_engine(PeerHandle handle) {
  mu_.assert_not_held("a peer's disconnect");
  return engine_->disconnect(handle);
}

}  // namespace kvxfer::internal
