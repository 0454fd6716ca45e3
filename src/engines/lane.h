// SPDX-License-Identifier: Apache-2.0
// The one interface every lane behind backend "UCX" implements: the
// same-host lane (cma/), our own tcp lane (tcp/) and the RDMA lane (ucx/).
// The engine (lanes.cc) is a list of lanes in KVXFER_LANES order: it asks
// each to publish its part of the blob, gives a peer the first lane that
// qualifies, and hands every other call to the lane named by the handle.
// May use the engine interface's types and the wire formats; includes no
// lane and nothing of src/core/.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/log.h"
#include "engine.h"
#include "wire/peer_blob.h"

namespace kvxfer::internal {

class Lane;

// The first part of every peer a lane connects and of every transfer it
// posts: PeerHandle and XferHandle point at it, so one load tells which lane
// owns the handle, with no map and no lock.
struct LanePeer {
  explicit LanePeer(Lane* owner) : lane(owner) {}
  Lane* const lane;
};
struct LaneXfer {
  explicit LaneXfer(Lane* owner) : lane(owner) {}
  Lane* const lane;
};

inline LanePeer* lane_peer(PeerHandle handle) { return reinterpret_cast<LanePeer*>(handle); }
inline PeerHandle handle_of(LanePeer* peer) { return reinterpret_cast<PeerHandle>(peer); }
inline LaneXfer* lane_xfer(XferHandle handle) { return reinterpret_cast<LaneXfer*>(handle); }
inline XferHandle handle_of(LaneXfer* xfer) { return reinterpret_cast<XferHandle>(xfer); }

// When stop() is called, in this order; each stage runs on every lane
// before the next starts. Each is called once.
enum class StopStage : std::uint8_t {
  kRefuse,      // refuse what peers send from now on; stop progress threads
  kDisconnect,  // disconnect the peers the core left connected
  kQuiesce,     // let queued work end and join the lane's threads
  kRelease,     // unmap the pool, retire what peers read, destroy contexts
};

class Lane {
 public:
  virtual ~Lane() = default;
  Lane() = default;
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  // "cma", "tcp" or "ucx": the lane's KVXFER_LANES name (a static string).
  [[nodiscard]] virtual const char* name() const noexcept = 0;

  // Writes the lane's part of the blob peers see. Called for every
  // metadata taken, from any thread.
  virtual void publish(wire::PeerBlob& blob) const = 0;

  // Whether this lane may serve a peer of this metadata: both sides run
  // it, and the peer is reachable this lane's way.
  [[nodiscard]] virtual bool qualifies(const RemoteRegion& remote, const wire::PeerBlob& blob) const = 0;

  // What connect() hands back besides its status.
  struct Connected {
    LanePeer* peer = nullptr;  // on success
    std::string reason;        // on failure: why, in words the caller can act on
    // On failure: this lane cannot reach the peer after all (no permission
    // to copy into its process), so the next lane that qualifies may try.
    // Otherwise the failure refuses the peer.
    bool next_may_try = false;
  };
  // Connects to a peer that qualified. O(1) in its number of blocks.
  [[nodiscard]] virtual Status connect(const wire::PeerBlob& blob, const RemoteRegion& remote,
                                       Connected* out) = 0;
  // Releases a peer this lane connected (the handle is not used again).
  // Transfers still in flight to it are forced to end. May wait.
  [[nodiscard]] virtual Status disconnect(LanePeer* peer) = 0;

  // A peer our owner registered, whatever lane serves it, and its end.
  // The tcp lane tells its connections from anyone else's by them.
  virtual void vouch(PeerHandle /*peer*/, const RemoteRegion& /*remote*/,
                     const wire::PeerBlob& /*blob*/) {}
  virtual void unvouch(PeerHandle /*peer*/) {}

  // Regions besides the pool (engine.h's add_region/remove_region). A lane
  // that does not take them (takes_regions() false) is never asked to; it
  // refuses runs in any other region (kNotSupported) and does not qualify
  // for a peer whose metadata lists regions besides its pool.
  [[nodiscard]] virtual bool takes_regions() const { return false; }
  [[nodiscard]] virtual Status add_region(const MemRegion& /*region*/, std::string* /*reason*/) {
    return Status::kNotSupported;
  }
  [[nodiscard]] virtual Status remove_region(std::uint64_t /*id*/) { return Status::kNotFound; }

  // Posts one transfer (engine.h's post()) to a peer this lane connected.
  [[nodiscard]] virtual Status post(LanePeer* peer, const Post& post, XferHandle* out) = 0;

  virtual void take_notifications(std::vector<Notification>* out) = 0;
  virtual void progress() {}
  [[nodiscard]] virtual Status check(XferHandle xfer, Status* state) = 0;
  [[nodiscard]] virtual const char* detail(XferHandle /*xfer*/) const { return nullptr; }
  [[nodiscard]] virtual Status release(XferHandle xfer) = 0;

  virtual void add_live(HandleCounts& counts) const = 0;
  virtual void add_counters(std::map<std::string, std::uint64_t>& counters) const = 0;

  virtual void stop(StopStage stage) = 0;

 protected:
  // StopStage::kDisconnect's work, the same in every lane: disconnects
  // `left` (the peers the core left connected, taken under the lane's own
  // lock), saying how many there were.
  void disconnect_all(const std::vector<LanePeer*>& left, std::string_view agent_name) {
    if (!left.empty()) {
      log().warn("kvxfer {} {}: stopping with {} peer(s) still connected", name(), agent_name,
                 left.size());
    }
    for (LanePeer* peer : left) static_cast<void>(disconnect(peer));
  }
};

}  // namespace kvxfer::internal
