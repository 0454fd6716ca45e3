// SPDX-License-Identifier: Apache-2.0
// kvxfer::Transport: one-sided WRITEs of fixed-size KV blocks into peers'
// registered pools, and READs of them back.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kvxfer/metrics.h"
#include "kvxfer/status.h"
#include "kvxfer/telemetry.h"

namespace kvxfer {

using TransferId = std::uint64_t;

namespace internal {
class TransportState;
}

// The local pool as a 2-D view: num_blocks blocks of block_len bytes each,
// contiguous from base. The caller owns the memory and keeps it alive until
// the Transport is closed.
struct Region {
  void* base = nullptr;
  std::uint64_t num_blocks = 0;
  std::uint64_t block_len = 0;
};

struct Options {
  // Fields that must agree between peers (model, dtype, layout...). Only
  // their fingerprint travels; see Transport::config_fingerprint().
  std::map<std::string, std::string> config_fields;
  // The same for fields whose values are not all strings (numbers, bools,
  // null, nested lists and objects): the fields as canonical JSON text, i.e.
  // exactly what Python's json.dumps(fields, sort_keys=True,
  // separators=(",", ":")) writes (ASCII only, no spaces). The fingerprint is
  // the SHA-256 of these bytes as given, so text that is not in that form
  // gets a fingerprint no Python peer computes. "" or "{}": no fields. Set
  // at most one of config_fields and config_json.
  std::string config_json;
  // Engines to use, first one wins: "UCX" (default) or "LOOPBACK".
  std::vector<std::string> backends{"UCX"};
  // Engine worker threads (UCX: copier threads for same-host peers, capped at
  // the core count). At least 1.
  int num_threads = 4;
  // UCX: a thread that sleeps on the worker's event fd and progresses it, so
  // TCP puts land at a target that never calls poll().
  bool progress_thread = true;
  // Consecutive transfer failures that fault a peer. At least 1.
  int strike_limit = 3;
  // A transfer still in progress this long after its post faults its peer
  // ("stalled"); the transfer itself stays in flight, since its WRITE may
  // still land, until the peer is removed. Zero disables the check; at
  // most kMaxStallTimeout.
  std::chrono::milliseconds stall_timeout{30000};
  // The latency histograms (Transport::metrics()) time one write_blocks
  // call, one poll call and one transfer in this many: reading a clock
  // costs more than the rest of the metrics together. 1 times every one.
  // At least 1. Counters are exact either way.
  int latency_sample_every = 16;
  // Per-transfer records (Transport::telemetry()): off by default, and then
  // free. When on, every transfer that finishes (done, failed, cancelled)
  // leaves a record in a ring of telemetry_capacity records (1 to
  // kMaxTelemetryCapacity) that drops its oldest when full.
  bool telemetry = false;
  std::size_t telemetry_capacity = 4096;
  // Engine configuration overrides, e.g. {"TLS", "sm,self"} for UCX
  // (applied with ucp_config_modify; the environment still applies).
  std::map<std::string, std::string> engine_config;
};

// The most bytes one notification carries (write_blocks/read_blocks'
// `notify`, send_notification).
inline constexpr std::size_t kMaxNotificationBytes = 4096;
// The most notifications a transport keeps for get_notifications(); past
// that, peers' notifications are refused and their transfers fail at the
// sender (nothing is dropped silently).
inline constexpr std::size_t kMaxQueuedNotifications = 16384;
// Of those, the most one sender (the agent name and identity key its
// connection presented) may hold on the tcp lane: past that its
// notifications are refused, and every other sender's are still taken. On
// the tcp lane kMaxQueuedNotifications bounds the senders this transport
// did not register, together; each registered peer has its own
// kMaxQueuedNotificationsPerSender, which nobody else can use up.
inline constexpr std::size_t kMaxQueuedNotificationsPerSender = 4096;

// The most transfers one peer may have in flight. Past it, write_blocks,
// read_blocks and send_notification return nothing for that peer without a
// strike (back-pressure, counted in PeerStats::posts_refused), so a frozen
// or slow peer cannot make us hold an unbounded number of transfers; a
// faulted peer takes no new transfers at all until it is removed.
inline constexpr std::uint64_t kMaxInflightPerPeer = 65536;

// The largest Options::telemetry_capacity.
inline constexpr std::size_t kMaxTelemetryCapacity = std::size_t{1} << 24;

// The largest Options::stall_timeout (a year): anything longer is no
// timeout at all (use 0), and durations this long still add to clock times
// without overflow.
inline constexpr std::chrono::milliseconds kMaxStallTimeout{365LL * 24 * 3600 * 1000};

struct PollResult {
  std::vector<TransferId> done;
  std::vector<TransferId> failed;
  // Set on a scoped poll once the peer is faulted; the first cause sticks.
  std::optional<std::string> peer_fault;

  [[nodiscard]] bool empty() const noexcept {
    return done.empty() && failed.empty() && !peer_fault;
  }
  friend bool operator==(const PollResult&, const PollResult&) = default;
};

enum class CancelMode {
  // Forget the transfers now. Their WRITEs may still land.
  kImmediate,
  // Release only transfers that can no longer land; return the rest.
  kWait,
};

struct PeerStats {
  std::string peer_id;
  std::uint64_t num_blocks = 0;
  std::uint64_t bytes_done = 0;
  std::uint64_t transfers_done = 0;
  std::uint64_t transfers_failed = 0;
  // The READs among transfers_done, and their bytes (also in bytes_done).
  std::uint64_t reads_done = 0;
  std::uint64_t read_bytes_done = 0;
  std::uint64_t post_failures = 0;
  // Posts refused without a strike: the peer had kMaxInflightPerPeer
  // transfers in flight, its lane held as many bytes of transfers for it
  // as it may (tcp), or it was faulted.
  std::uint64_t posts_refused = 0;
  std::uint64_t inflight = 0;
  int strikes = 0;
  std::optional<std::string> fault;
};

// Live handles, as counted by the engine. All zero after close().
struct HandleCounts {
  std::uint64_t memory_registrations = 0;  // local pool mappings
  std::uint64_t peers = 0;                 // endpoints / remote agents
  std::uint64_t remote_keys = 0;           // unpacked rkeys
  std::uint64_t transfers = 0;             // transfer handles not yet released
  std::uint64_t requests = 0;              // engine requests still outstanding
  friend bool operator==(const HandleCounts&, const HandleCounts&) = default;
};

struct Stats {
  HandleCounts live;
  std::uint64_t inflight = 0;
  std::uint64_t registrations_pending = 0;
  std::vector<PeerStats> peers;  // sorted by peer_id
  // The engine's own running totals since construction, named by lane
  // (UCX engine: cma_writes, tcp_writes, ucx_writes, ucx_puts; as a target:
  // ucx_fences_received, ucx_notifications_received...; every name:
  // docs/metrics.md).
  std::map<std::string, std::uint64_t> engine_counters;
};

// A registered region of memory besides the pool (register_memory), as
// NIXL's agent API registers them: its id, start address and length.
using RegionId = std::uint64_t;
struct RegionInfo {
  RegionId id = 0;
  std::uint64_t addr = 0;
  std::uint64_t len = 0;
  friend bool operator==(const RegionInfo&, const RegionInfo&) = default;
};

// One descriptor: `len` bytes from address `addr`, in this process (a
// local list) or in a peer's (a remote list, as its metadata lists its
// regions).
struct MemDesc {
  std::uint64_t addr = 0;
  std::uint64_t len = 0;
  friend bool operator==(const MemDesc&, const MemDesc&) = default;
};

// A descriptor list checked once against the regions it lies in
// (Transport::prepare): each descriptor inside one region, of ours or of a
// peer's registration. Transfers then name descriptors by index. Stored as
// strided runs (descriptors of one length, evenly spaced, in one region:
// a region's blocks), so a list of regions x blocks costs O(regions) to
// keep, whatever its length. Cheap to move; holds no lock and no handle.
class DescList {
 public:
  DescList() = default;
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool remote() const noexcept { return !peer_.empty(); }
  [[nodiscard]] const std::string& peer() const noexcept { return peer_; }
  // How many strided runs hold it.
  [[nodiscard]] std::size_t runs() const noexcept { return runs_.size(); }
  // The descriptor at `i` as it was given (std::out_of_range past the end).
  [[nodiscard]] MemDesc at(std::size_t i) const;

 private:
  friend class internal::TransportState;
  // Descriptors first..first+count-1: the k-th is `len` bytes at
  // addr + k * stride, offset + k * stride into its region.
  struct Run {
    std::uint64_t first = 0;
    std::uint64_t count = 0;
    std::uint64_t addr = 0;
    std::uint64_t stride = 0;
    std::uint64_t len = 0;
    std::uint64_t offset = 0;
    std::uint64_t region = 0;  // local: the region id; remote: index in the peer's list
    std::uint64_t region_len = 0;
  };
  // The run that holds descriptor i (< size()), starting the search at
  // `hint` (the last one found): inline where the hint is right.
  [[nodiscard]] const Run& run_of(std::uint64_t i, std::size_t& hint) const {
    const Run& r = runs_[hint];
    if (i >= r.first && i - r.first < r.count) return r;
    return find_run(i, hint);
  }
  [[nodiscard]] const Run& find_run(std::uint64_t i, std::size_t& hint) const;
  std::vector<Run> runs_;
  std::uint64_t size_ = 0;
  std::string peer_;              // "" for a local list
  std::uint64_t generation_ = 0;  // the peer's registration it was checked against
};

// The future of an async registration fails with this when the peer was
// removed or registered again before the registration finished.
class SupersededError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace loopback {
class FaultPlan;
}

// Thread-safe: any number of threads may call any method at once.
//
// Caller mistakes (bad indices, bad metadata, calls after close) throw
// std::invalid_argument / std::logic_error before anything is posted and
// never count against a peer. Peer and engine failures are reported through
// poll() and the strike/fault policy.
class Transport {
 public:
  Transport(std::string agent_name, Region region, Options options = {});
  ~Transport();  // close()s
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  [[nodiscard]] bool available() const noexcept;
  [[nodiscard]] const std::string& agent_name() const noexcept;
  [[nodiscard]] std::uintptr_t base_addr() const noexcept;
  [[nodiscard]] std::uint64_t num_blocks() const noexcept;
  [[nodiscard]] std::uint64_t block_len() const noexcept;
  // First 16 hex chars of sha256 of the config fields as compact JSON with
  // sorted keys; "" when there are none.
  [[nodiscard]] const std::string& config_fingerprint() const noexcept;
  [[nodiscard]] const std::string& backend() const noexcept;

  // Opaque bytes a peer passes to add_remote_peer().
  [[nodiscard]] std::vector<std::uint8_t> agent_metadata() const;

  // Registers (or re-registers: the old registration is torn down first) a
  // peer. O(1) in num_blocks. Throws std::invalid_argument on bad metadata or
  // geometry, std::runtime_error when the engine cannot reach the peer.
  void add_remote_peer(const std::string& peer_id, std::span<const std::uint8_t> metadata,
                       std::uintptr_t base_addr, std::uint64_t num_blocks, std::uint64_t block_len);
  // The same on the registration worker. Metadata is checked before this
  // returns (and throws); the future fails with SupersededError if the peer
  // is removed or re-registered meanwhile.
  [[nodiscard]] std::future<void> add_remote_peer_async(const std::string& peer_id,
                                                        std::span<const std::uint8_t> metadata,
                                                        std::uintptr_t base_addr,
                                                        std::uint64_t num_blocks,
                                                        std::uint64_t block_len);
  // Registers a peer from its metadata alone, NIXL's way: its pool (if it
  // has one) and its regions are what the metadata lists. Re-registers as
  // add_remote_peer does. Throws as add_remote_peer does.
  void add_remote_peer(const std::string& peer_id, std::span<const std::uint8_t> metadata);
  void remove_remote_peer(const std::string& peer_id);
  [[nodiscard]] std::vector<std::string> peers() const;

  // Posts one WRITE of local block local_idxs[i] to remote block
  // remote_idxs[i] for every i. Returns the transfer id, or nullopt when the
  // peer is unknown or the post failed (recorded against the peer). Each list
  // is read exactly once (copied, then the copy checked and posted), so
  // another thread changing it during the call cannot get an unchecked index
  // posted.
  //
  // With `notify` (1..kMaxNotificationBytes bytes; empty means none), the
  // peer receives that message in get_notifications() once every byte of
  // this transfer is in its memory, never before; the transfer is reported
  // done only once the peer took the message, and a transfer that fails, or
  // is cancelled before its bytes landed, delivers nothing. The message is
  // copied before the call returns. Longer messages throw
  // std::invalid_argument.
  [[nodiscard]] std::optional<TransferId> write_blocks(std::string_view peer_id,
                                                       std::span<const std::int64_t> local_idxs,
                                                       std::span<const std::int64_t> remote_idxs,
                                                       std::span<const std::uint8_t> notify = {});
  [[nodiscard]] std::optional<TransferId> write_blocks(std::string_view peer_id,
                                                       std::span<const std::int32_t> local_idxs,
                                                       std::span<const std::int32_t> remote_idxs,
                                                       std::span<const std::uint8_t> notify = {});

  // Posts one READ of remote block remote_idxs[i] of the peer's pool into
  // local block local_idxs[i] for every i: the mirror of write_blocks, with
  // the same ids, validation (a local block may not be read into twice),
  // poll, cancel, strikes, faults and stall rule. Done means the bytes are in
  // OUR pool. An immediate cancel stops what has not started yet; a copy
  // already under way may still land (cancel kWait says when none can).
  // `notify` as for write_blocks: the peer (whose blocks were read) gets
  // the message once the bytes are in our pool.
  [[nodiscard]] std::optional<TransferId> read_blocks(std::string_view peer_id,
                                                      std::span<const std::int64_t> local_idxs,
                                                      std::span<const std::int64_t> remote_idxs,
                                                      std::span<const std::uint8_t> notify = {});
  [[nodiscard]] std::optional<TransferId> read_blocks(std::string_view peer_id,
                                                      std::span<const std::int32_t> local_idxs,
                                                      std::span<const std::int32_t> remote_idxs,
                                                      std::span<const std::uint8_t> notify = {});

  // A transfer of no blocks that delivers `message` (1..kMaxNotificationBytes
  // bytes, else std::invalid_argument) to the peer: its id is reported done
  // by poll() once the peer took it, or failed. nullopt as for write_blocks.
  [[nodiscard]] std::optional<TransferId> send_notification(std::string_view peer_id,
                                                            std::span<const std::uint8_t> message);

  // The notifications peers delivered to this transport since the last
  // call, by sender agent name, each list in the order its sender's
  // transfers completed; each message is handed out once. Throws
  // std::logic_error after close().
  [[nodiscard]] std::map<std::string, std::vector<std::vector<std::uint8_t>>> get_notifications();

  // Counts a post the caller could not make (for instance, indices a
  // reference-compatible wrapper refuses without throwing) against the peer
  // exactly as a failed post: logged, post_failures + 1, one strike. Returns
  // false, and records nothing, when the peer is unknown. Throws
  // std::logic_error after close().
  [[nodiscard]] bool record_post_failure(std::string_view peer_id, std::string_view cause);

  // ---- Regions and descriptors (the path NIXL's agent API takes) ----
  //
  // Registers `len` bytes from `addr` (non-empty, inside the address space,
  // overlapping neither the pool nor another region) with every lane: from
  // now on local descriptors may lie in it, and peers that register
  // metadata taken after this call may move bytes to and from it, within its
  // bounds. O(1) in len. Throws std::invalid_argument on a bad range,
  // std::runtime_error when a lane cannot take it (nothing is registered
  // then), std::logic_error after close().
  [[nodiscard]] RegionId register_memory(const void* addr, std::uint64_t len);
  // Unregisters a region. Throws std::invalid_argument for an id that is
  // not registered, std::logic_error while transfers of ours that name
  // registered regions are in flight (poll or cancel them first). When it
  // returns, no transfer of ours touches the region any more, and peers'
  // transfers into it are refused wherever a lane can refuse them.
  void deregister_memory(RegionId id);
  // Ours, in address order (the pool not among them).
  [[nodiscard]] std::vector<RegionInfo> regions() const;
  // A peer's, as the metadata it was registered from listed them (its pool
  // not among them); throws std::invalid_argument for an unknown peer.
  [[nodiscard]] std::vector<RegionInfo> peer_regions(std::string_view peer_id) const;

  // Checks a descriptor list once: each descriptor must be non-empty and
  // lie inside one region (with peer_id: one of that peer's registered
  // regions or its pool; without: one of ours or our pool). Throws
  // std::invalid_argument naming the first that does not. The list is
  // copied before it is checked.
  [[nodiscard]] DescList prepare(std::span<const MemDesc> descs,
                                 std::optional<std::string_view> peer_id = std::nullopt) const;

  // Posts one WRITE (local -> remote) or READ (remote -> local) of the
  // descriptors local[local_idx[i]] and remote[remote_idx[i]] for every i
  // (equal lengths in each pair; `local` a local list, `remote` one
  // prepared for this peer's current registration). Descriptors next to
  // each other on both sides travel as one run. Returns the id, reported by
  // poll() like write_blocks'; nullopt as for write_blocks. Throws
  // std::invalid_argument (naming the index) on a mismatch, an index out of
  // range, a region deregistered since the list was prepared, or a remote
  // list prepared for another peer or registration; nothing is posted then.
  [[nodiscard]] std::optional<TransferId> transfer(TransferOp op, std::string_view peer_id,
                                                   const DescList& local,
                                                   std::span<const std::int64_t> local_idx,
                                                   const DescList& remote,
                                                   std::span<const std::int64_t> remote_idx,
                                                   std::span<const std::uint8_t> notify = {});
  // The same over whole lists (descriptor i with descriptor i).
  [[nodiscard]] std::optional<TransferId> transfer(TransferOp op, std::string_view peer_id,
                                                   const DescList& local, const DescList& remote,
                                                   std::span<const std::uint8_t> notify = {});

  // Scoped to peer_id when given (costs O(that peer's in-flight)); nullopt
  // checks every peer (shutdown drain).
  [[nodiscard]] PollResult poll(std::optional<std::string_view> peer_id = std::nullopt);

  // Returns the ids still in flight (always empty for kImmediate).
  [[nodiscard]] std::vector<TransferId> cancel(std::span<const TransferId> ids,
                                               CancelMode mode = CancelMode::kImmediate);

  // Idempotent. Stops the registration worker, releases every transfer and
  // peer, deregisters the pool.
  void close();
  [[nodiscard]] bool closed() const noexcept;

  [[nodiscard]] Stats stats() const;
  // Running totals, gauges and latency histograms (kvxfer/metrics.h); the
  // histograms are read without the transport's lock.
  [[nodiscard]] Metrics metrics() const;
  // The records of transfers that finished since the last call, oldest
  // first, and how many the full ring dropped meanwhile. Empty with
  // Options::telemetry off. Throws std::logic_error after close().
  [[nodiscard]] Telemetry telemetry();

  // The loopback engine's fault plan; nullptr for other engines.
  [[nodiscard]] loopback::FaultPlan* fault_plan() noexcept;

 private:
  std::unique_ptr<internal::TransportState> state_;
};

// The fingerprint function on its own (what config_fingerprint() returns).
[[nodiscard]] std::string config_fingerprint(const std::map<std::string, std::string>& fields);
// The same from canonical JSON text (see Options::config_json): the first
// 16 hex chars of the SHA-256 of those bytes; "" for "" and "{}". Throws
// std::invalid_argument for text that cannot be canonical JSON of an object
// (not {...}, or a byte outside printable ASCII).
[[nodiscard]] std::string config_fingerprint_json(std::string_view canonical_json);

// "kvxfer X.Y.Z".
[[nodiscard]] std::string_view version() noexcept;

// The file this library's code was loaded from (libkvxfer.so.N, or the
// program or extension it is linked into), as the dynamic loader reports it;
// "" if the loader cannot say. For `kvxfer info` and `python3 -m kvxfer
// info`: which of several installed copies a process really runs.
[[nodiscard]] std::string library_path();

}  // namespace kvxfer
