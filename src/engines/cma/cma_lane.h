// SPDX-License-Identifier: Apache-2.0
// The same-host lane: writes into a peer on this host (same boot id and pid
// namespace) with process_vm_writev, and reads from it with
// process_vm_readv, one iovec per run of consecutive blocks,
// in chunks run by a copier pool (so that posting does not wait for the copy)
// and by callers of progress() (so that a spinning poller helps them). It may
// use the cookie (cma_cookie.h), the engine interface's types and the logger;
// it knows nothing of UCX. It is one Lane (engines/lane.h).
//
// Why not UCX for these peers (measured with UCX 1.13, see
// docs/ucx-engine.md): a ucp_put_nbx to user-registered memory over sm is
// "software emulation" (an active message the target's worker copies out),
// never CMA; an sm endpoint refuses UCP_ERR_HANDLING_MODE_PEER ("Destination
// is unreachable"); and in UCP_ERR_HANDLING_MODE_NONE a SIGKILLed peer leaves
// the flush pending forever while UCP_EP_CLOSE_FLAG_FORCE is refused
// (INVALID_PARAM), so nothing can be reclaimed before the worker dies.
// process_vm_writev is as fast for large blocks, needs no progress on the
// target, and fails with ESRCH once the peer is gone.
//
// A peer whose pool is a kvxfer::SharedPool offers it to be mapped
// (cma_mapping.h); then the same chunks are copied with memcpy through the
// mapping, with the same cookie reads around them, at memory speed.
//
// Regions besides the pool (cma_regions.cc): ours are declared in the region
// table our cookie points to; a peer's are checked against its table at
// connect (the metadata must list exactly what the target declares) and
// their entries' seq words read with the epoch before every chunk, so a
// region the target withdrew is not written from the next chunk on. Each
// chunk into a region also marks it in the target's fence table
// (cma_fence.h) while it copies, and the target's remove_region waits for
// those marks, so no chunk lands after it returned. The window left is the
// pool's at close: a pool chunk whose check passed just before the target
// closed may still land after (at most kChunkBytes per copier thread of
// each initiator).
//
// Rooms: cma_lane.cc (the lane's calls: peers, posts, checks, notifications),
// cma_copy.cc (who copies what, and how), cma_regions.cc (regions: ours,
// peers', and the checks around chunks), cma_cookie, cma_mapping, cma_config.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine.h"
#include "common/mutex.h"
#include "common/shared_pools.h"
#include "common/thread_annotations.h"
#include "engines/cma/cma_config.h"
#include "engines/cma/cma_cookie.h"
#include "engines/cma/cma_fence.h"
#include "engines/cma/cma_mapping.h"
#include "engines/lane.h"
#include "wire/peer_blob.h"

namespace kvxfer::internal::cma {

class CmaLane final : public Lane {
 public:
  // `num_threads` (Options::num_threads) bounds the copier threads; the
  // rest of how copies are shared is `policy` (cma_config.h). `token`: the
  // engine's, which our cookie holds and our peers' notifications carry
  // (0: a random one).
  CmaLane(std::string agent_name, const Region& region, int num_threads,
          const CopyPolicy& policy = {}, std::uint64_t token = 0);
  ~CmaLane() override;

  [[nodiscard]] PidNamespace pid_namespace() const { return pidns_; }
  [[nodiscard]] std::uint64_t cookie_addr() const { return cookie_.addr(); }
  [[nodiscard]] std::uint64_t cookie_epoch() const { return cookie_.epoch(); }
  // The descriptor number of our notification socket's sending end, which
  // peers on this host duplicate (pidfd_getfd) to notify us; -1 if none.
  [[nodiscard]] int notify_fd() const { return notify_tx_; }

  // Whether connect() maps the pools of peers that offer them, and
  // populates the mappings (CopyPolicy::map, for tests that compare the
  // two ways on one lane). Set before any connect.
  void set_map_peer_pools(bool map, bool populate) {
    map_peer_pools_ = map;
    populate_peer_pools_ = populate;
  }

  [[nodiscard]] const char* name() const noexcept override { return "cma"; }
  // Our pid namespace, cookie, token and notification socket, and that we
  // take same-host writes.
  void publish(wire::PeerBlob& blob) const override;
  // The peer shares our kernel (boot id) and pid namespace, has a pid, and
  // takes same-host writes.
  [[nodiscard]] bool qualifies(const RemoteRegion& remote, const wire::PeerBlob& blob) const override;
  // Reads the peer's cookie and, when its epoch matches and the pool it
  // declares is exactly `remote`'s, adds the peer (and starts the copiers).
  // kRemoteDisconnect: the peer is gone. kMismatch: the metadata does not
  // describe what the target registered (refuse the peer). Anything else:
  // this lane cannot reach it (no ptrace permission, seccomp), and the next
  // lane may try. When the peer's notification socket can be duplicated,
  // the peer takes our notifications.
  [[nodiscard]] Status connect(const wire::PeerBlob& blob, const RemoteRegion& remote,
                               Connected* out) override EXCLUDES(peers_mu_, copy_mu_);
  [[nodiscard]] Status disconnect(LanePeer* peer) override EXCLUDES(peers_mu_, copy_mu_);
  // One WRITE, READ (the peer's blocks into ours) or notification alone (no
  // runs: the copy is the cookie reads alone, then the message).
  [[nodiscard]] Status post(LanePeer* peer, const Post& post, XferHandle* out) override
      EXCLUDES(pool_mu_, copy_mu_);
  // The notifications peers on this host sent us (engine.h's contract).
  void take_notifications(std::vector<Notification>* out) override EXCLUDES(notify_mu_);
  // Regions (cma_regions.cc). add_region declares the region in our
  // cookie's table; remove_region withdraws it there (peers' next chunks
  // into it fail), then returns once no chunk of ours names it: running
  // ones finish, queued ones are dropped (their transfers end kCanceled).
  [[nodiscard]] bool takes_regions() const override { return true; }
  [[nodiscard]] Status add_region(const MemRegion& region, std::string* reason) override
      EXCLUDES(regions_mu_, copy_mu_);
  [[nodiscard]] Status remove_region(std::uint64_t id) override EXCLUDES(regions_mu_, copy_mu_);
  // For tests: `hook(arg)` runs in every chunk between its checks and its
  // copy (nullptr: none), to widen the window a removal must close.
  using ChunkHook = void (*)(void* arg);
  void set_chunk_hook(ChunkHook hook, void* arg) {
    chunk_hook_arg_ = arg;
    chunk_hook_.store(hook, std::memory_order_release);
  }

  // Copies at most one caller slice (CopyPolicy::caller_slice) of queued
  // copies on the calling thread, if any is queued.
  void progress() override EXCLUDES(copy_mu_);
  [[nodiscard]] Status check(XferHandle xfer, Status* state) override;
  [[nodiscard]] Status release(XferHandle xfer) override EXCLUDES(pool_mu_);

  // Adds this lane's peers, transfers and requests (queued or running copies).
  void add_live(HandleCounts& counts) const override EXCLUDES(peers_mu_);
  void add_counters(std::map<std::string, std::uint64_t>& counters) const override;

  // kDisconnect: the peers left; kQuiesce: lets the copiers finish (or
  // cancel) what is queued and joins them; kRelease: peers reading the
  // cookie from now on find this engine gone.
  void stop(StopStage stage) override EXCLUDES(peers_mu_, copy_mu_);

 private:
  // A peer's and a transfer's fields under copy_mu_ name it through their
  // owner (the analysis cannot tell that the owner is the lane at hand; see
  // ours()).
  struct Peer : LanePeer, std::enable_shared_from_this<Peer> {
    explicit Peer(CmaLane* in) : LanePeer(in), owner(in) {}
    CmaLane* const owner;
    std::string agent_name;
    std::uint64_t remote_base = 0;  // its pool's (0: none)
    std::uint64_t remote_block_len = 0;
    // Its regions, as its metadata lists them (RemoteRegion::regions, what
    // ByteRun::remote_region indexes), each checked at connect against
    // what the target declares; `seq_addr` and `seq`: where its table
    // entry's seq word is and what it read then (0, 0 for the pool, which
    // the cookie's epoch covers); `slot`: its slot in the target's table.
    struct Slot {
      std::uint64_t base = 0;
      std::uint64_t len = 0;
      std::uint64_t seq_addr = 0;
      std::uint64_t seq = 0;
      std::uint32_t slot = 0;
    };
    std::vector<Slot> regions;
    // The target's fence table and our row in it, when it has regions
    // (cma_fence.h): chunks into them mark their slots while they copy.
    PeerFence fence;
    pid_t pid = 0;
    std::uint64_t cookie_addr = 0;
    std::uint64_t cookie_epoch = 0;
    int notify_fd = -1;  // our duplicate of its notification socket
    // Its pool, mapped here when it is a SharedPool (copies are then
    // memcpy); unmapped when the last transfer lets go of the peer.
    PeerPoolMapping mapping;
    int copies GUARDED_BY(owner->copy_mu_) = 0;  // queued or running copies
    bool disconnected GUARDED_BY(owner->copy_mu_) = false;
    // Set once a copy found the peer gone; read anywhere.
    std::atomic<bool> gone{false};
    // When a copy last read its cookie back (steady clock, ns), for
    // CopyPolicy::kCookieFresh.
    std::atomic<std::int64_t> cookie_ok_ns{0};
  };

  // A transfer handle. Owned by the core until release(), and by the copier
  // that finishes it; whichever lets go last returns it to the pool.
  struct Xfer : LaneXfer {
    explicit Xfer(CmaLane* in) : LaneXfer(in), owner(in) {}
    CmaLane* const owner;
    std::shared_ptr<Peer> peer;
    TransferId id = 0;
    bool read = false;  // a READ (the peer's blocks into ours), else a WRITE
    // Sent to the peer once every byte is in place (empty: none), built
    // into `datagram` (capacity kept).
    std::vector<std::uint8_t> notify;
    std::vector<std::uint8_t> datagram;
    std::atomic<Status> result{Status::kInProgress};
    std::atomic<int> refs{0};
    std::atomic<bool> held{false};  // between post_write() and release()
    // The copy, built by post_write and run by copier threads. The vectors
    // keep their capacity when the handle is reused.
    std::vector<iovec> local_iov;
    std::vector<iovec> remote_iov;
    // For a transfer that names regions (not Post::pool_only), each
    // iovec's local slot and remote region index; empty otherwise.
    std::vector<std::uint32_t> local_slot;
    std::vector<std::uint32_t> remote_index;
    // Copied through the peer's mapped pool (every remote run in it).
    bool mapped = false;
    Xfer* next_copy GUARDED_BY(owner->copy_mu_) = nullptr;
    // Iovecs [next_iov, end_iov) are not claimed yet (copiers claim from
    // the front, callers from the back, where a claim may shorten the last
    // iovec by its tail); the chunks claimed and still copying, and the
    // first chunk's failure.
    std::size_t next_iov GUARDED_BY(owner->copy_mu_) = 0;
    std::size_t end_iov GUARDED_BY(owner->copy_mu_) = 0;
    int running GUARDED_BY(owner->copy_mu_) = 0;
    Status chunk_error GUARDED_BY(owner->copy_mu_) = Status::kSuccess;
  };
  // A peer or transfer of this lane: holding our copy_mu_ is holding its
  // owner's. Tells the analysis so, which cannot see that the owner is
  // `this` (and keeps believing it until the caller's scope ends, unlock or
  // not: call it in a scope that holds the lock throughout).
  void ours(const Peer& peer) const REQUIRES(copy_mu_) ASSERT_CAPABILITY(peer.owner->copy_mu_) {
    if (peer.owner != this) std::abort();
  }
  void ours(const Xfer& xfer) const REQUIRES(copy_mu_) ASSERT_CAPABILITY(xfer.owner->copy_mu_) {
    if (xfer.owner != this) std::abort();
  }

  // cma_lane.cc: peers, posts, handles, notifications.
  // Maps the peer's pool when it declares one we can map (cma_mapping.h);
  // on any failure the peer is written with process_vm_writev as before.
  void map_pool(Peer& peer, const Declaration& declared);
  // The peer's notification socket (its metadata's descriptor, duplicated
  // with pidfd_getfd), kept only while its cookie still says the pid is its
  // engine's; none otherwise.
  void take_notify_socket(Peer& peer, int notify_fd);
  // Sends a finished transfer's notification; kSuccess, or why not.
  Status send_notification(Peer& peer, Xfer& xfer);
  Xfer* acquire_xfer() EXCLUDES(pool_mu_);
  void unref(Xfer* xfer) EXCLUDES(pool_mu_);
  static Xfer* from_handle(XferHandle handle) {
    return static_cast<Xfer*>(reinterpret_cast<LaneXfer*>(handle));
  }

  // cma_copy.cc: the copiers, the claims and the copies.
  // process_vm_writev takes at most UIO_MAXIOV iovecs per call.
  static constexpr std::size_t kMaxIov = 1024;
  // A copier claims at most this many bytes, and kMaxIov iovecs, at a time.
  static constexpr std::size_t kChunkBytes = CopyPolicy::kChunkBytes;
  void start_copiers() EXCLUDES(copy_mu_);
  // Lets the copiers finish (or cancel) what is queued and joins them.
  void stop_copiers() EXCLUDES(copy_mu_);
  void copier_loop() EXCLUDES(copy_mu_);
  // What one thread claimed of a transfer: iovecs of its lists, or (a
  // caller's claim) the tail of one, held here (so a Claim stays put).
  struct Claim {
    Claim() = default;
    Claim(const Claim&) = delete;
    Claim& operator=(const Claim&) = delete;
    std::span<iovec> local;
    std::span<iovec> remote;
    std::size_t bytes = 0;
    std::size_t first = 0;  // the index of its first iovec in the lists
    bool counted = false;   // its local slots' busy counts were raised
    iovec local_tail{};
    iovec remote_tail{};
  };
  static void claim_front(Xfer& xfer, Claim* claim) REQUIRES(xfer.owner->copy_mu_);
  static void claim_back(Xfer& xfer, std::size_t max_bytes, Claim* claim)
      REQUIRES(xfer.owner->copy_mu_);
  // Claims a chunk of the transfer at the head of the queue (a copier's from
  // its front, a caller's from its back) and copies it, with copy_mu_
  // released meanwhile. Returns the bytes.
  std::size_t run_chunk(bool caller) REQUIRES(copy_mu_);
  // run_chunk's steps under copy_mu_: the claim (the head transfer, and
  // whether its chunk is to be cancelled rather than copied), and a chunk's
  // end (true when it was the transfer's last, with the transfer's result).
  Xfer* claim_chunk(bool caller, Claim* claim, bool* cancelled) REQUIRES(copy_mu_);
  bool end_chunk(Xfer& xfer, Status result, Status* final_result) REQUIRES(copy_mu_);
  // Copies one claim of `xfer` (none: checks after its last chunk).
  // `caller`: a caller's slice, which may skip a fresh cookie read.
  Status run_copy(Xfer& xfer, const Claim* claim, bool caller = false);
  // The check around a chunk of a transfer that names regions: the
  // cookie's epoch and the seq words of the regions `remote_index` names
  // (each iovec's; the pool's need none), in as few reads as
  // kMaxSeqReads allows. kMismatch: a region was withdrawn or changed.
  Status check_peer(Peer& peer, std::span<const std::uint32_t> remote_index, int* err);
  Status copy_claim(Peer& peer, const Xfer& xfer, std::span<iovec> local, std::span<iovec> remote);

  // cma_regions.cc.
  // Checks every region `remote` lists against the target's declaration
  // and table, and fills peer.regions; kMismatch (with *reason) when one
  // is not declared, live, at that address and length.
  Status check_regions(Peer& peer, const Declaration& declared, const RemoteRegion& remote,
                       std::string* reason);
  // Maps the target's fence table and claims our row there when the peer
  // has regions besides the pool; kSuccess, or why not (*reason).
  Status fence_regions(Peer& peer, const Declaration& declared, std::string* reason);
  // The target's slots and seqs of the regions `remote_index` names (no
  // pool; a run of one index once), for PeerFence::mark; returns how many
  // (at most remote_index.size()).
  static std::size_t fenced_slots(const Peer& peer, std::span<const std::uint32_t> remote_index,
                                  std::uint32_t* slots, std::uint64_t* seqs);
  // A post's runs into iovecs; for a post that names regions, resolves them
  // (kInvalidParam for a slot or index that is not there, or a run outside it).
  Status build_iovecs(Peer& peer, const Post& post, Xfer& xfer) EXCLUDES(regions_mu_);
  // Under copy_mu_: whether a claim's local slots are all live, and if so
  // raises their busy counts (claim.counted); drop_slots lowers them.
  bool hold_slots(const Xfer& xfer, Claim& claim) REQUIRES(copy_mu_);
  void drop_slots(const Xfer& xfer, const Claim& claim) REQUIRES(copy_mu_);
  // process_vm_readv (read) or process_vm_writev of matching iovec lists.
  Status cma_copy(Peer& peer, bool read, std::span<iovec> local, std::span<iovec> remote);
  // The same through the peer's mapped pool; returns the bytes copied.
  static std::uint64_t mapped_copy(const Peer& peer, bool read, std::span<const iovec> local,
                                   std::span<const iovec> remote);

  std::string agent_name_;
  Region region_;
  PidNamespace pidns_;
  // Our pool's memfd when the pool is a SharedPool (fd -1 otherwise): the
  // cookie declares it so that same-host peers can map the pool.
  SharedPoolFile pool_file_;
  Cookie cookie_;
  bool map_peer_pools_;
  bool populate_peer_pools_;
  std::uint64_t caller_slice_bytes_;
  int num_copiers_ = 1;

  // The peers connected and not yet disconnected (a post finds its peer
  // through its handle; this is for counts and for stop()).
  // Each of the lane's locks is taken alone: none is held while another is
  // taken.
  mutable Mutex peers_mu_;
  std::unordered_map<LanePeer*, std::shared_ptr<Peer>> peers_ GUARDED_BY(peers_mu_);

  // Copier threads, started with the first peer.
  Mutex copy_mu_;
  std::condition_variable copy_cv_;       // a copy was queued, or stop
  std::condition_variable copy_done_cv_;  // a peer's copies dropped to zero
  Xfer* copy_head_ GUARDED_BY(copy_mu_) = nullptr;
  Xfer* copy_tail_ GUARDED_BY(copy_mu_) = nullptr;
  std::atomic<bool> copies_queued_{false};  // copy_head_ != nullptr, read without copy_mu_
  bool copiers_stop_ GUARDED_BY(copy_mu_) = false;
  std::vector<std::thread> copiers_ GUARDED_BY(copy_mu_);

  // Transfer handles: a pool that only grows to the peak number in flight.
  Mutex pool_mu_;
  std::deque<Xfer> xfers_ GUARDED_BY(pool_mu_);
  std::vector<Xfer*> free_xfers_ GUARDED_BY(pool_mu_);

  // Our regions by slot (slot 0, the pool: never added or removed here):
  // what posts resolve. Declared in cookie_'s table under the same lock.
  Mutex regions_mu_;
  std::vector<MemRegion> local_regions_ GUARDED_BY(regions_mu_);
  // Whether each slot may be copied from or into, and how many iovecs of
  // running chunks name it (remove_region waits for 0).
  struct SlotUse {
    bool live = false;
    int busy = 0;
  };
  std::vector<SlotUse> slot_use_ GUARDED_BY(copy_mu_);

  std::atomic<std::uint64_t> live_transfers_{0};
  std::atomic<std::uint64_t> live_requests_{0};
  std::atomic<std::uint64_t> cma_writes_{0};  // running totals for counters()
  std::atomic<std::uint64_t> cma_reads_{0};
  std::atomic<std::uint64_t> mapped_peers_{0};  // peers whose pool we mapped, ever
  std::atomic<std::uint64_t> notifications_sent_{0};
  std::atomic<std::uint64_t> notifications_received_{0};
  std::atomic<std::uint64_t> notifications_refused_{0};
  // Bytes the copies moved (what process_vm_writev/readv returned, or the
  // memcpys through a mapping): equal to the bytes of the transfers that
  // completed, so a chunk copied twice or lost shows here in any build.
  std::atomic<std::uint64_t> bytes_copied_{0};

  // Our notification socket (AF_UNIX, SOCK_SEQPACKET pair): peers send on
  // their duplicates of notify_tx_, take_notifications() reads notify_rx_.
  // The kernel holds what is not taken yet, up to the sending end's buffer;
  // past that a send fails (the sender's transfer fails: nothing dropped).
  int notify_rx_ = -1;
  int notify_tx_ = -1;
  Mutex notify_mu_;  // take_notifications' reads
  std::vector<std::uint8_t> notify_buffer_ GUARDED_BY(notify_mu_);
  std::atomic<ChunkHook> chunk_hook_{nullptr};
  void* chunk_hook_arg_ = nullptr;
  // Slices progress() copied on callers' threads, and the largest, in bytes.
  std::atomic<std::uint64_t> caller_slices_{0};
  std::atomic<std::uint64_t> caller_slice_max_bytes_{0};
};

}  // namespace kvxfer::internal::cma
