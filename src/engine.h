// SPDX-License-Identifier: Apache-2.0
// The one narrow interface the core drives. An engine moves bytes and reports
// what happened as Status codes; it never decides what a status means for a
// peer (that policy lives in src/core/).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvxfer/status.h"
#include "kvxfer/transport.h"

namespace kvxfer::internal {

// Opaque engine handles. 0 is never a valid handle.
using PeerHandle = std::uintptr_t;
using XferHandle = std::uintptr_t;

// A notification as its target receives it: the sender's agent name and the
// message (1..kMaxNotificationBytes bytes).
struct Notification {
  std::string agent;
  std::vector<std::uint8_t> bytes;
};

// What the core knows about a peer when it asks the engine to connect.
struct RemoteRegion {
  std::string agent_name;
  std::uint64_t base_addr = 0;
  std::uint64_t num_blocks = 0;
  std::uint64_t block_len = 0;
  std::uint32_t pid = 0;
  std::string boot_id;  // the peer's host identity (Linux boot id)
};

class Engine {
 public:
  virtual ~Engine() = default;

  // "UCX" or "LOOPBACK".
  [[nodiscard]] virtual const std::string& name() const noexcept = 0;

  // The engine's part of this agent's metadata (addresses, keys).
  [[nodiscard]] virtual std::vector<std::uint8_t> local_blob() const = 0;

  // Connects to a peer and prepares to write into its region. May block
  // (address exchange, wireup); never called with the core's lock held.
  // O(1) in remote.num_blocks. On failure, *reason (when given) says why in
  // words the caller can act on (what is missing, what to set); the core
  // puts it in the exception add_remote_peer throws.
  [[nodiscard]] virtual Status connect(std::span<const std::uint8_t> blob,
                                       const RemoteRegion& remote, PeerHandle* out,
                                       std::string* reason = nullptr) = 0;

  // Releases a peer: its remote key and its endpoint, each attempted even if
  // the other fails (each failure logged). Returns the first failure. Any
  // transfer still posted to the peer is forced to finish. May wait (a frozen
  // or cut-off peer); never called with the core's lock held, so it runs
  // alongside posts, checks and progress for other peers.
  [[nodiscard]] virtual Status disconnect(PeerHandle peer) = 0;

  // Posts one WRITE of local block local[i] to remote block remote[i] for
  // every i (indices already validated by the core). On success *out is a
  // transfer handle the core later checks and releases; on failure nothing
  // is left behind. `id` tags the transfer (logs, loopback fault plan).
  //
  // With a `notify` message (non-empty, at most kMaxNotificationBytes, checked
  // by the core), the engine delivers it to the peer once every byte of the
  // transfer is in place, and check() reports kSuccess only once the peer
  // has taken it into its queue: never before its data, never for a transfer
  // that failed, and not for one released before its data was in place.
  [[nodiscard]] virtual Status post_write(PeerHandle peer, TransferId id,
                                          std::span<const std::int64_t> local,
                                          std::span<const std::int64_t> remote, XferHandle* out,
                                          std::span<const std::uint8_t> notify = {}) = 0;

  // Posts one READ of remote block remote[i] of the peer's pool into local
  // block local[i] for every i (indices already validated by the core: no
  // local block twice). The same handle life as a write: check() reports
  // kSuccess once every byte is in OUR pool. Once check() reports a read
  // ended (done or failed), no byte of it is written into our pool any more.
  // release() of a read still in flight stops every part not yet started
  // (a reply that arrives later is dropped); a copy already under way may
  // finish, as a write's does.
  [[nodiscard]] virtual Status post_read(PeerHandle peer, TransferId id,
                                         std::span<const std::int64_t> local,
                                         std::span<const std::int64_t> remote, XferHandle* out,
                                         std::span<const std::uint8_t> notify = {}) = 0;

  // A transfer of no data that delivers `message` to the peer (done once the
  // peer has taken it into its queue).
  [[nodiscard]] virtual Status post_notify(PeerHandle peer, TransferId id,
                                           std::span<const std::uint8_t> message,
                                           XferHandle* out) = 0;

  // Moves the notifications peers delivered to us since the last call into
  // *out (appended), oldest first; each is handed out once.
  virtual void take_notifications(std::vector<Notification>* out) = 0;

  // Lets the engine make progress once before a batch of checks (a no-op
  // when a progress thread does it). Never called with the core's lock held,
  // and possibly from several threads at once, beside any other call except
  // shutdown().
  virtual void progress() {}

  // The state of a transfer. Returns kSuccess and writes *state (kSuccess:
  // the bytes are in the peer's memory; kInProgress; or the failure status of
  // the transfer), or returns the error of a check that itself failed.
  [[nodiscard]] virtual Status check(XferHandle xfer, Status* state) = 0;

  // Why a transfer that check() reported failed (or whose check failed)
  // failed, in the engine's own words: a short static string (e.g. the UCX
  // status name), or nullptr when the engine has nothing to add. Valid
  // until release().
  [[nodiscard]] virtual const char* detail(XferHandle /*xfer*/) const { return nullptr; }

  // Forgets a transfer. Does not stop a WRITE still in flight: the engine
  // keeps what the WRITE needs until it finishes. On failure the handle is
  // still live.
  [[nodiscard]] virtual Status release(XferHandle xfer) = 0;

  [[nodiscard]] virtual HandleCounts live() const = 0;

  // Running totals the engine keeps for stats() (name -> count).
  [[nodiscard]] virtual std::map<std::string, std::uint64_t> counters() const { return {}; }

  // The name of the lane a connected peer's transfers take ("ucx", "cma"),
  // "" for an engine without lanes. A static string.
  [[nodiscard]] virtual const char* lane(PeerHandle /*peer*/) const { return ""; }

  // Deregisters the local pool and stops engine threads. Called once, after
  // every peer was disconnected and every transfer released.
  virtual void shutdown() = 0;
};

struct EngineConfig {
  std::string agent_name;
  Region region;
  const Options* options = nullptr;
};

// Engine factories, one per backend name. Throw std::runtime_error when the
// engine cannot start. Backend "UCX" is src/engines/lanes.cc, which gives each
// peer the same-host lane (engines/cma/) or the UCX lane (engines/ucx/).
std::unique_ptr<Engine> make_ucx_engine(const EngineConfig& config);
std::unique_ptr<Engine> make_loopback_engine(const EngineConfig& config);

// The fault plan of `engine` when it is the loopback engine, else nullptr:
// a feature of that one backend, not of the engine interface.
[[nodiscard]] loopback::FaultPlan* loopback_fault_plan(Engine& engine) noexcept;

}  // namespace kvxfer::internal
