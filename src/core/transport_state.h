// SPDX-License-Identifier: Apache-2.0
// The transport's private state, shared by the core's rooms: transport.cc
// (lifecycle), peers.cc (registrations) and transfers.cc (the in-flight
// table). Knows nothing of UCX; drives an Engine under one mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/pretouch.h"
#include "common/thread_annotations.h"
#include "core/index_set.h"
#include "core/peer_policy.h"
#include "core/registration_worker.h"
#include "engine.h"
#include "kvxfer/metrics.h"
#include "kvxfer/transport.h"
#include "telemetry/clock.h"
#include "telemetry/histogram.h"
#include "telemetry/telemetry_ring.h"
#include "wire/metadata.h"

namespace kvxfer::internal {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

struct Peer;

using Op = TransferOp;

// A submitted WRITE or READ not yet drained. Linked into its peer's list so a scoped
// poll walks only that peer's transfers.
struct Inflight {
  TransferId id = 0;
  Peer* peer = nullptr;
  XferHandle handle = 0;
  std::uint64_t bytes = 0;
  Op op = Op::kWrite;
  // Posted from descriptors (transfer()): deregister_memory waits on it.
  bool descs = false;
  // Set once the transfer has counted against its peer, so a check that
  // keeps failing charges the peer once, not once per poll.
  bool struck = false;
  // Whether its latency is sampled (counted in the latency histogram).
  bool timed = false;
  // Coarse; set only while the stall rule is on.
  std::chrono::steady_clock::time_point posted;
  // When the call that posted it began, on the hot path's clock, if it is
  // timed or telemetry is on; else 0.
  Ticks started = 0;
  Inflight* prev = nullptr;
  Inflight* next = nullptr;
};

// One published registration of a peer.
struct Peer {
  // What every post and poll touches, first (fewest cache lines).
  Inflight* head = nullptr;
  Inflight* tail = nullptr;
  std::uint64_t inflight = 0;
  PeerHandle handle = 0;
  bool succeeded_in_batch = false;
  // Transfers done and failed by op: stats()' transfers_done, bytes_done,
  // reads_done... are sums of these.
  std::array<OpCounters, kNumTransferOps> ops{};
  Standing standing;  // strikes and fault: judged by PeerPolicy only
  std::string id;
  std::uint64_t num_blocks = 0;
  std::uint64_t block_len = 0;
  // Its regions as its metadata listed them, the pool (id 0) first when it
  // has one (ByteRun::remote_region indexes this), and the registration
  // they belong to (DescList::generation_).
  std::vector<MemRegion> regions;
  std::uint64_t generation = 0;
  PeerStats counters;  // peer_id, num_blocks and post_failures
  // Telemetry: the id every record of this peer shares, and its lane.
  std::shared_ptr<const std::string> shared_id;
  const char* lane = "";
};

class TransportState {
 public:
  TransportState(std::string agent_name, Region region, Options options);
  ~TransportState();

  // peers.cc
  void add_peer(const std::string& peer_id, std::span<const std::uint8_t> metadata,
                std::uintptr_t base_addr, std::uint64_t num_blocks, std::uint64_t block_len)
      EXCLUDES(mu_);
  std::future<void> add_peer_async(const std::string& peer_id,
                                   std::span<const std::uint8_t> metadata, std::uintptr_t base_addr,
                                   std::uint64_t num_blocks, std::uint64_t block_len) EXCLUDES(mu_);
  // `geometry` false: the pool's geometry is the metadata's (NIXL's way).
  void add_peer_from_metadata(const std::string& peer_id, std::span<const std::uint8_t> metadata)
      EXCLUDES(mu_);
  void remove_peer(const std::string& peer_id) EXCLUDES(mu_);

  // regions.cc
  RegionId register_memory(std::uint64_t addr, std::uint64_t len) EXCLUDES(mu_);
  void deregister_memory(RegionId id) EXCLUDES(mu_);
  std::vector<RegionInfo> regions() const EXCLUDES(mu_);
  std::vector<RegionInfo> peer_regions(std::string_view peer_id) const EXCLUDES(mu_);
  DescList prepare(std::span<const MemDesc> descs, std::optional<std::string_view> peer_id) const
      EXCLUDES(mu_);
  std::optional<TransferId> transfer_descs(Op op, std::string_view peer_id, const DescList& local,
                                           std::span<const std::int64_t> local_idx,
                                           const DescList& remote,
                                           std::span<const std::int64_t> remote_idx,
                                           std::span<const std::uint8_t> notify, Ticks started)
      EXCLUDES(mu_);
  std::vector<std::string> peer_ids() const EXCLUDES(mu_);

  // transfers.cc (transfer is instantiated there for int64 and int32 indices)
  // `started`: when the public call began if it is sampled (sample_start),
  // else 0: the start of its duration, its transfer's latency, or the time
  // a poll sees its completions at.
  template <typename Int>
  std::optional<TransferId> transfer(Op op, std::string_view peer_id, std::span<const Int> local,
                                     std::span<const Int> remote,
                                     std::span<const std::uint8_t> notify, Ticks started)
      EXCLUDES(mu_);
  std::optional<TransferId> send_notification(std::string_view peer_id,
                                              std::span<const std::uint8_t> message, Ticks started)
      EXCLUDES(mu_);
  std::map<std::string, std::vector<std::vector<std::uint8_t>>> get_notifications() EXCLUDES(mu_);
  PollResult poll(std::optional<std::string_view> peer_id, Ticks started) EXCLUDES(mu_);
  std::vector<TransferId> cancel(std::span<const TransferId> ids, CancelMode mode) EXCLUDES(mu_);

  // transport.cc
  bool record_post_failure(std::string_view peer_id, std::string_view cause) EXCLUDES(mu_);
  void close() EXCLUDES(mu_);
  Stats stats() const EXCLUDES(mu_);
  Metrics metrics() const EXCLUDES(mu_);
  Telemetry take_telemetry() EXCLUDES(mu_);

  // The start of a public call on the hot path's clock if it is one of the
  // latency_sample_every calls sampled, else 0. Outside the lock: `calls`
  // is read and written relaxed, and a count lost to a race only moves
  // which call is sampled.
  Ticks sample_start(std::atomic<std::uint32_t>& calls) const noexcept {
    const std::uint32_t n = calls.load(std::memory_order_relaxed) + 1;
    if (n < sample_every_) {
      calls.store(n, std::memory_order_relaxed);
      return 0;
    }
    calls.store(0, std::memory_order_relaxed);
    return ticks_now();
  }
  std::atomic<std::uint32_t> write_calls_{0};
  std::atomic<std::uint32_t> poll_calls_{0};
  std::atomic<std::uint32_t> other_calls_{0};  // read_blocks, send_notification
  std::vector<std::uint8_t> metadata() const EXCLUDES(mu_);

  const std::string agent_name_;
  const Region region_;
  const Options options_;
  const std::string fingerprint_;
  const std::string boot_id_;
  const std::uint32_t sample_every_;
  std::unique_ptr<Engine> engine_;

  bool closing() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return closing_;
  }
  bool closed() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return closed_;
  }

 private:
  struct Registration {
    RemoteRegion remote;
    std::vector<std::uint8_t> blob;
  };

  // `geometry`: the caller's view of the peer's pool, which must agree
  // with its metadata; nullptr: the metadata's (add_peer_from_metadata).
  struct Geometry {
    std::uintptr_t base_addr = 0;
    std::uint64_t num_blocks = 0;
    std::uint64_t block_len = 0;
  };
  Registration validate_peer(const std::string& peer_id, std::span<const std::uint8_t> metadata,
                             const Geometry* geometry) const;
  void check_geometry(const std::string& peer_id, const wire::AgentMetadata& m,
                      const Geometry& geometry) const;
  void check_identity(const std::string& peer_id, const wire::AgentMetadata& m) const;
  void register_peer(const std::string& peer_id, Registration reg) EXCLUDES(mu_);
  // Claims the next generation for peer_id and takes out what it had (its
  // transfers released, its handle returned for disconnect_peer(), 0 if
  // none). Caller holds mu_.
  std::uint64_t begin_registration(const std::string& peer_id, PeerHandle* old_handle)
      REQUIRES(mu_);
  // Connects outside the lock and publishes unless superseded. Throws
  // SupersededError when superseded, std::runtime_error when unreachable.
  void build_and_publish(const std::string& peer_id, std::uint64_t gen, const Registration& reg)
      EXCLUDES(mu_);

  // Counts a connect or disconnect that runs outside mu_ (the caller
  // incremented its counter under mu_) until it ends, so close() can wait for it.
  enum class EngineCallKind { kConnect, kDisconnect };
  class EngineCall {
   public:
    EngineCall(TransportState& state, EngineCallKind kind) : state_(state), kind_(kind) {}
    ~EngineCall() {
      MutexLock lock(state_.mu_);
      int& counter =
          kind_ == EngineCallKind::kConnect ? state_.active_connects_ : state_.active_disconnects_;
      if (--counter == 0) state_.engine_calls_done_.notify_all();
    }
    EngineCall(const EngineCall&) = delete;
    EngineCall& operator=(const EngineCall&) = delete;

   private:
    TransportState& state_;
    const EngineCallKind kind_;
  };

  void throw_if_closing() const REQUIRES(mu_) {
    if (closing_) throw std::logic_error("kvxfer: transport " + agent_name_ + " is closed");
  }
  // Settles every transfer of a peer already out of peers_ (done if its
  // bytes had landed, failed otherwise: `why` it is dropped, "removed" or
  // "re-registered"), keeps their ids for the next poll that covers the
  // peer id (orphans_), releases them and returns the peer's engine handle.
  PeerHandle detach_peer(Peer& peer, const char* why) REQUIRES(mu_);
  // Moves the settled transfers of registrations removed or replaced under
  // `peer_id` (all of them without one) into `out`.
  void take_orphans(std::optional<std::string_view> peer_id, PollResult& out) REQUIRES(mu_);
  // Forgets a settled transfer of a removed registration; false if `id` is
  // none.
  bool forget_orphan(TransferId id) REQUIRES(mu_);
  // The engine's disconnect, which may wait (a frozen or cut-off peer):
  // called without mu_, so other peers' writes and polls go on meanwhile.
  void disconnect_peer(PeerHandle handle, const std::string& peer_id) EXCLUDES(mu_);
  // Every engine disconnect goes through here: checked to run without mu_
  // (by the analysis, and at run time for paths it cannot follow).
  Status disconnect_in_engine(PeerHandle handle) EXCLUDES(mu_);
  void link(Peer* peer, Inflight* e) REQUIRES(mu_);
  void unlink(Inflight* e) REQUIRES(mu_);
  void release(Inflight* e) REQUIRES(mu_);
  // Tries again every handle in unreleased_; returns how many are left.
  std::size_t retry_unreleased() REQUIRES(mu_);
  // `timed_now`: when the poll began if it is timed, else 0 until a sampled
  // transfer's completion needs it (then read once).
  void poll_peer(Peer* peer, PollResult& out, std::chrono::steady_clock::time_point now,
                 Ticks& timed_now) REQUIRES(mu_);

  // A transfer poll() reports: counted for its peer, the transport and, when
  // done, the latency histogram of its op. Caller holds mu_.
  void count_finished(Inflight& e, bool done, Ticks& timed_now) REQUIRES(mu_);
  // Leaves a telemetry record of a finished transfer when telemetry is on
  // (`now` read once if still 0). Caller holds mu_.
  void record_finished(const Inflight& e, TransferResult result, Ticks& now) REQUIRES(mu_) {
    if (telemetry_) record_into_ring(e, result, now);
  }
  void record_into_ring(const Inflight& e, TransferResult result, Ticks& now) REQUIRES(mu_);

  // Posts checked byte runs (`bytes` in all), or a notification alone (no
  // runs).
  std::optional<TransferId> post(Op op, Peer* peer, std::span<const ByteRun> runs,
                                 std::uint64_t bytes, std::span<const std::uint8_t> notify,
                                 Ticks started, bool descs = false) REQUIRES(mu_);
  // regions.cc: the region of ours (slot) or of `peer`'s (index) that holds
  // [addr, addr + len), if any.
  std::optional<std::uint32_t> local_region_of(std::uint64_t addr, std::uint64_t len) const
      REQUIRES(mu_);
  static std::optional<std::uint32_t> peer_region_of(const Peer& peer, std::uint64_t addr,
                                                     std::uint64_t len);
  // The byte runs of the pairs (scratch_local_[i], scratch_remote_[i]) of
  // descriptors of `local` and `remote` into scratch_bytes_, adjacent ones
  // merged: how many, and their bytes in *total. Throws on a bad pair.
  std::size_t pair_runs(const DescList& local, const DescList& remote, std::uint64_t* total)
      REQUIRES(mu_);
  // Whether `d` extends the strided run `run` (which then takes it).
  static bool extends(DescList::Run& run, const MemDesc& d);
  // Copies a caller's notification into scratch_notify_ and checks the copy
  // (at most kMaxNotificationBytes; `required`: not empty). Caller holds mu_.
  std::span<const std::uint8_t> copy_notification(std::span<const std::uint8_t> message,
                                                  bool required) REQUIRES(mu_);
  // The peer by id, or nullptr after logging `call` to an unknown peer.
  Peer* find_peer_for(std::string_view peer_id, const char* call) REQUIRES(mu_);
  // The warning for a call naming no registered peer; lists the known ones.
  void warn_unknown_peer(std::string_view peer_id, const char* call) REQUIRES(mu_);

  // What the policy decided, counted over every registration.
  PolicyTally tally_ GUARDED_BY(mu_);
  // Strikes, faults and the stall rule: every judgement of a peer goes here.
  const PeerPolicy policy_;

  // Lets the engine make progress outside mu_, so that nothing the engine
  // runs then (the UCX lane's callbacks) runs under the transport's lock.
  // close() waits for these calls to end before it shuts the engine down.
  void drive_engine() EXCLUDES(mu_);
  std::atomic<int> engine_drivers_{0};
  std::atomic<bool> engine_closing_{false};

  // The one lock of the transport's state. A Peer or an Inflight is
  // reached only through peers_ or inflight_, so its fields are guarded
  // too, though the analysis cannot name mu_ from their structs.
  mutable Mutex mu_;
  // Signalled when the last connect or disconnect running outside mu_ is
  // done: close() waits for them before it shuts the engine down.
  std::condition_variable engine_calls_done_;
  bool closing_ GUARDED_BY(mu_) = false;
  bool closed_ GUARDED_BY(mu_) = false;
  // While close() runs the engine's shutdown (outside mu_: it may drain for
  // seconds), stats() and metrics() report the engine's handles and
  // counters as they were when it began, and never call into the engine.
  bool shutting_down_ GUARDED_BY(mu_) = false;
  HandleCounts shutdown_live_ GUARDED_BY(mu_);
  std::map<std::string, std::uint64_t> shutdown_counters_ GUARDED_BY(mu_);
  HandleCounts engine_live() const REQUIRES(mu_);
  std::map<std::string, std::uint64_t> engine_counters() const REQUIRES(mu_);
  int active_connects_ GUARDED_BY(mu_) = 0;
  int active_disconnects_ GUARDED_BY(mu_) = 0;
  TransferId next_id_ GUARDED_BY(mu_) = 1;
  std::uint64_t next_gen_ GUARDED_BY(mu_) = 0;
  std::unordered_map<std::string, std::uint64_t, StringHash, std::equal_to<>> generations_
      GUARDED_BY(mu_);
  std::unordered_map<std::string, std::unique_ptr<Peer>, StringHash, std::equal_to<>> peers_
      GUARDED_BY(mu_);
  std::unordered_map<TransferId, Inflight> inflight_ GUARDED_BY(mu_);
  // Metrics over the transport's life, removed peers' included.
  std::array<OpCounters, kNumTransferOps> ops_ GUARDED_BY(mu_){};
  std::uint64_t post_failures_ GUARDED_BY(mu_) = 0;
  std::uint64_t posts_refused_ GUARDED_BY(mu_) = 0;
  // Post to done, by op, and the durations of whole write_blocks and poll
  // calls (from the facade's entry to the end of the locked part): updated
  // under mu_, read without it.
  std::array<AtomicHistogram, kNumTransferOps> latency_;
  AtomicHistogram write_blocks_duration_;
  AtomicHistogram poll_duration_;
  // Null unless Options::telemetry; set once, at construction.
  std::unique_ptr<TelemetryRing> telemetry_ PT_GUARDED_BY(mu_);
  // Transfers of registrations that were removed or replaced, settled then
  // (done: their bytes had landed; failed: they had not, and fencing keeps
  // them from landing later), by peer id, until a poll that covers that id
  // reports them (the reference reports every id it issued). Ids ascend in
  // each list.
  struct Orphans {
    std::vector<TransferId> done;
    std::vector<TransferId> failed;
  };
  std::map<std::string, Orphans, std::less<>> orphans_ GUARDED_BY(mu_);
  // Transfer handles whose release failed: forgotten by the table but still
  // live in the engine, so retried at close() (and counted until then).
  std::vector<XferHandle> unreleased_ GUARDED_BY(mu_);
  // Reused across calls so the hot path allocates nothing per block.
  // transfer() copies the caller's index lists here once and then reads only
  // these; they stay under mu_ until the engine's post has returned.
  std::vector<std::int64_t> scratch_local_ GUARDED_BY(mu_);
  std::vector<std::int64_t> scratch_remote_ GUARDED_BY(mu_);
  std::vector<BlockRun> scratch_runs_ GUARDED_BY(mu_);
  std::vector<ByteRun> scratch_bytes_ GUARDED_BY(mu_);
  // Our regions by slot (region_slot() of their ids): slot 0 is the pool,
  // live when there is one. A slot is reserved (in local_by_addr_, not yet
  // live) while the engine takes it, and dead while the engine lets it go.
  struct LocalRegion {
    RegionId id = 0;
    std::uint64_t base = 0;
    std::uint64_t len = 0;
    bool live = false;
    bool used = false;  // reserved, live or being let go
  };
  std::vector<LocalRegion> regions_ GUARDED_BY(mu_);
  std::vector<std::uint32_t> free_slots_ GUARDED_BY(mu_);
  // Every used slot's range by start address, to resolve a descriptor and
  // to refuse an overlap.
  std::map<std::uint64_t, std::uint32_t> local_by_addr_ GUARDED_BY(mu_);
  std::vector<std::uint8_t> scratch_notify_ GUARDED_BY(mu_);
  IndexSet scratch_seen_ GUARDED_BY(mu_);
  // Failed transfers of a poll: peer, state, the engine's detail (or nullptr).
  std::vector<std::tuple<Peer*, Status, const char*>> scratch_failures_ GUARDED_BY(mu_);
  std::vector<Inflight*> scratch_finished_ GUARDED_BY(mu_);
  RegistrationWorker worker_;
  // The kernel's first touch of our pool, paid on a thread of its own from
  // construction (backend "UCX", KVXFER_PRETOUCH): set once, stopped first
  // by close(). Null for the LOOPBACK backend, whose copies are memcpy.
  std::unique_ptr<Pretouch> pretouch_;
};

}  // namespace kvxfer::internal
