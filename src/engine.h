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

#include "common/pretouch.h"
#include "kvxfer/metrics.h"
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

// A region of memory registered with a transport: `len` bytes from `base`
// (an address in its owner's process). `id` is the owner's name for it:
// the slot of its region table (low 32 bits) and that slot's generation
// (high 32 bits), so an id is never reused. The pool is id 0, slot 0.
struct MemRegion {
  std::uint64_t id = 0;
  std::uint64_t base = 0;
  std::uint64_t len = 0;
  friend bool operator==(const MemRegion&, const MemRegion&) = default;
};

[[nodiscard]] constexpr std::uint32_t region_slot(std::uint64_t id) noexcept {
  return static_cast<std::uint32_t>(id);
}

// What the core knows about a peer when it asks the engine to connect.
struct RemoteRegion {
  std::string agent_name;
  std::uint64_t base_addr = 0;  // its pool (num_blocks 0: it has none)
  std::uint64_t num_blocks = 0;
  std::uint64_t block_len = 0;
  std::uint32_t pid = 0;
  std::string boot_id;  // the peer's host identity (Linux boot id)
  // Its regions as its metadata lists them (checked by the core: each
  // non-empty, inside the address space, none overlapping another); the
  // pool, when it has one, first, with id 0. ByteRun::remote_region is an
  // index into this list.
  std::vector<MemRegion> regions;
};

// A run of blocks consecutive on both sides of a transfer: our blocks
// local..local+count-1 and the peer's remote..remote+count-1.
struct BlockRun {
  std::int64_t local = 0;
  std::int64_t remote = 0;
  std::uint64_t count = 0;
  friend bool operator==(const BlockRun&, const BlockRun&) = default;
};

// Writes the runs of the pairs (local[i], remote[i]) to `out` (room for
// local.size() runs) and returns how many there are.
inline std::size_t encode_runs(std::span<const std::int64_t> local,
                               std::span<const std::int64_t> remote, BlockRun* out) {
  BlockRun* at = out;
  const std::size_t n = local.size();
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i + 1;
    while (j < n && local[j] == local[j - 1] + 1 && remote[j] == remote[j - 1] + 1) ++j;
    *at++ = BlockRun{local[i], remote[i], static_cast<std::uint64_t>(j - i)};
    i = j;
  }
  return static_cast<std::size_t>(at - out);
}

// What a lane moves: `len` bytes at offset `local` of our region
// `local_region` and at offset `remote` of the peer's region
// `remote_region` (a slot of our region table, an index into the region
// list of the peer's metadata). The core builds them from validated
// descriptors: in range on both sides, non-empty, no overflow.
struct ByteRun {
  std::uint64_t local = 0;
  std::uint64_t remote = 0;
  std::uint64_t len = 0;
  std::uint32_t local_region = 0;
  std::uint32_t remote_region = 0;
  friend bool operator==(const ByteRun&, const ByteRun&) = default;
};

// The byte runs of block runs in the pools (region 0 on both sides), whose
// blocks are `block_len` bytes: one per block run, into `out` (room for
// runs.size()).
inline void block_runs_to_bytes(std::span<const BlockRun> runs, std::uint64_t block_len,
                                ByteRun* out) {
  for (const BlockRun& run : runs) {
    *out++ = ByteRun{static_cast<std::uint64_t>(run.local) * block_len,
                     static_cast<std::uint64_t>(run.remote) * block_len, run.count * block_len, 0,
                     0};
  }
}

// One transfer as the core hands it to the engine.
struct Post {
  TransferOp op = TransferOp::kWrite;
  TransferId id = 0;
  std::span<const ByteRun> runs;  // empty for a notification alone
  std::uint64_t bytes = 0;        // the runs' lengths added up
  std::span<const std::uint8_t> note;
  // Every run is in the pools (region 0 on both sides): write_blocks and
  // read_blocks. False for descriptor transfers, whatever their runs.
  bool pool_only = true;
};

class Engine {
 public:
  // `block_len`: the pool's, for post_write() and post_read() below.
  explicit Engine(std::uint64_t block_len = 0) : block_len_(block_len) {}
  virtual ~Engine() = default;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

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

  // Posts one transfer: a WRITE of our blocks into the peer's, a READ of
  // the peer's blocks into ours, or a notification alone (post.runs empty).
  // The runs were computed once by the core from indices it validated (in
  // range on both sides, no block written twice). On success *out is a
  // transfer handle the core later checks and releases; on failure nothing
  // is left behind. `post.id` tags the transfer (logs, loopback fault plan).
  //
  // WRITE: check() reports kSuccess once the bytes are in the peer's memory.
  // READ: once every byte is in OUR pool; once check() reports a read ended
  // (done or failed), no byte of it is written into our pool any more.
  // release() of a read still in flight stops every part not yet started
  // (a reply that arrives later is dropped); a copy already under way may
  // finish, as a write's does.
  //
  // With a note (non-empty, at most kMaxNotificationBytes, checked by the
  // core), the engine delivers it to the peer once every byte of the
  // transfer is in place, and check() reports kSuccess only once the peer
  // has taken it into its queue: never before its data, never for a transfer
  // that failed, and not for one released before its data was in place. A
  // notification alone is done once the peer has taken it.
  [[nodiscard]] virtual Status post(PeerHandle peer, const Post& post, XferHandle* out) = 0;

  // The same from index lists (local[i] <-> remote[i]), for callers that
  // hold indices rather than runs (tests, tools): the runs are computed
  // here, on every call. The core posts runs.
  [[nodiscard]] Status post_write(PeerHandle peer, TransferId id,
                                  std::span<const std::int64_t> local,
                                  std::span<const std::int64_t> remote, XferHandle* out,
                                  std::span<const std::uint8_t> notify = {}) {
    return post_blocks(TransferOp::kWrite, peer, id, local, remote, out, notify);
  }
  [[nodiscard]] Status post_read(PeerHandle peer, TransferId id,
                                 std::span<const std::int64_t> local,
                                 std::span<const std::int64_t> remote, XferHandle* out,
                                 std::span<const std::uint8_t> notify = {}) {
    return post_blocks(TransferOp::kRead, peer, id, local, remote, out, notify);
  }
  [[nodiscard]] Status post_notify(PeerHandle peer, TransferId id,
                                   std::span<const std::uint8_t> message, XferHandle* out) {
    return post(peer, Post{TransferOp::kNotify, id, {}, 0, message}, out);
  }

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

  // Registers our region `region` (a slot the core chose, free until now;
  // the pool is never passed here) with every lane: from now on posts may
  // name its slot, and peers whose metadata lists it may move bytes to and
  // from it within its bounds, checked where the lane can check. O(1) in
  // its length (no page is touched). Called with no lock of the core held.
  // On failure, *reason (when given) says why, and no lane keeps it.
  [[nodiscard]] virtual Status add_region(const MemRegion& /*region*/, std::string* reason) {
    if (reason != nullptr) *reason = "this engine takes no regions besides its pool";
    return Status::kNotSupported;
  }
  // Unregisters a region add_region() took. Returns once no byte moved by
  // this engine lands in it or is read from it any more (transfers of ours
  // that name it have ended: the core sees to that), and peers' transfers
  // into it are refused where a lane can refuse them. May wait.
  [[nodiscard]] virtual Status remove_region(std::uint64_t /*id*/) { return Status::kNotFound; }

  // Whether the core pre-touches what it registers here (common/pretouch.h):
  // the lanes engine's kernel copies (process_vm_writev, sockets) pay a
  // first touch on some hosts, the loopback engine's memcpy never does.
  [[nodiscard]] virtual PretouchMode pretouch_mode() const noexcept { return PretouchMode::kOff; }

  // Deregisters the local pool and stops engine threads. Called once, after
  // every peer was disconnected and every transfer released.
  virtual void shutdown() = 0;

 private:
  [[nodiscard]] Status post_blocks(TransferOp op, PeerHandle peer, TransferId id,
                                   std::span<const std::int64_t> local,
                                   std::span<const std::int64_t> remote, XferHandle* out,
                                   std::span<const std::uint8_t> notify) {
    if (local.size() != remote.size() || local.empty()) return Status::kInvalidParam;
    std::vector<BlockRun> runs(local.size());
    runs.resize(encode_runs(local, remote, runs.data()));
    std::vector<ByteRun> bytes(runs.size());
    block_runs_to_bytes(runs, block_len_, bytes.data());
    return post(peer, Post{op, id, bytes, local.size() * block_len_, notify}, out);
  }

  const std::uint64_t block_len_;
};

struct EngineConfig {
  std::string agent_name;
  Region region;
  const Options* options = nullptr;
};

// Engine factories, one per backend name. Throw std::runtime_error when the
// engine cannot start. Backend "UCX" is src/engines/lanes.cc: a list of
// lanes (engines/lane.h), the first that fits serving each peer.
std::unique_ptr<Engine> make_ucx_engine(const EngineConfig& config);
std::unique_ptr<Engine> make_loopback_engine(const EngineConfig& config);

// The fault plan of `engine` when it is the loopback engine, else nullptr:
// a feature of that one backend, not of the engine interface.
[[nodiscard]] loopback::FaultPlan* loopback_fault_plan(Engine& engine) noexcept;

}  // namespace kvxfer::internal
