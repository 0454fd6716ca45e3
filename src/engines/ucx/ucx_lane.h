// SPDX-License-Identifier: Apache-2.0
// The UCX lane: RDMA peers. A WRITE is one ucp_put_nbx per run of
// consecutive blocks and one flush, whose completion means the bytes are in
// the peer's memory; a READ is ucp_get_nbx the same way. A notification is an
// active message sent after the flush that completed its transfer (or
// alone), acked by the target once queued. Every endpoint opens with a fence
// (wire/fence.h), which orders notifications; puts are one-sided, bounded
// by the NIC to the pool or region the peer registered (docs/reliability.md).
// Regions besides the pool (add_region) are registered with UCX each, and
// their rkeys published in the blob; an initiator checks every run against
// the peer's region before it posts, since nothing checks it at the target.
//
// Threads: callers copy a post's runs into a pooled transfer and queue it
// for the driver (ucx_driver.h), which alone calls into UCX; connect and
// disconnect queue their work and wait for it. A transfer's state is one
// atomic the driver sets and check() reads.
//
// This room uses UCX, src/wire/ and src/common/, and knows nothing of the
// other lanes or of src/core/. It is one Lane (engines/lane.h). Rooms:
// ucx_config, ucx_driver, ucx_endpoint, and this one: ucx_lane.cc (the
// lane's calls, endpoints, transfers), ucx_regions.cc (regions: ours
// registered and published, the peer's matched and every run checked) and
// ucx_messages.cc (fences, notifications, acks). The target's fence table and notification inbox
// are the ones the tcp lane keeps too (engines/fence_table.h, inbox.h).
#pragma once

#include <ucp/api/ucp.h>

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "engine.h"
#include "engines/fence_table.h"
#include "engines/inbox.h"
#include "engines/lane.h"
#include "engines/lineages.h"
#include "engines/ucx/ucx_config.h"
#include "engines/ucx/ucx_driver.h"
#include "engines/ucx/ucx_endpoint.h"
#include "wire/fence.h"
#include "wire/notify.h"
#include "wire/peer_blob.h"

namespace kvxfer::internal::ucx {

class UcxLane final : public Lane {
 public:
  // `token` is what peers' messages must carry to be taken (the engine's,
  // published in the blob). `has_rdma`: this host has an RDMA device;
  // `tcp_lane_here`: our engine runs the tcp lane (see qualifies()). Throws
  // std::runtime_error when UCX cannot start.
  UcxLane(std::string agent_name, const Region& region, const Options& options, std::uint64_t token,
          const UcxSettings& settings, bool has_rdma = false, bool tcp_lane_here = false);
  ~UcxLane() override;

  [[nodiscard]] const std::vector<std::uint8_t>& worker_address() const {
    return driver_.address();
  }
  [[nodiscard]] const std::vector<std::uint8_t>& packed_rkey() const { return packed_rkey_; }

  [[nodiscard]] const char* name() const noexcept override { return "ucx"; }
  // Our worker's address, the pool's packed rkey, and the key of every
  // region added and not removed (ucx_regions.cc).
  void publish(wire::PeerBlob& blob) const override EXCLUDES(regions_mu_);
  // The peer runs the lane too, and both sides have an RDMA device, or the
  // tcp lane cannot serve it (ours does not run, or it has none): forcing
  // UCX's tcp transport stays possible for tests.
  [[nodiscard]] bool qualifies(const RemoteRegion& remote, const wire::PeerBlob& blob) const override;
  // connect, disconnect and stop wait for the driver, so never run in its
  // turn (a UCX callback).
  [[nodiscard]] Status connect(const wire::PeerBlob& blob, const RemoteRegion& remote,
                               Connected* out) override EXCLUDES(mu_, driver_.turn());
  [[nodiscard]] Status disconnect(LanePeer* peer) override EXCLUDES(mu_, driver_.turn());
  // Regions (ucx_regions.cc): add_region registers one with UCX and packs
  // its rkey (at most wire::kMaxRegionKeys, their keys
  // wire::kMaxRegionKeyBytes in all); remove_region takes it out of the
  // blob and of posts, waits until no put or get of ours names it, and
  // unregisters it. Both wait for the driver.
  [[nodiscard]] bool takes_regions() const override { return true; }
  [[nodiscard]] Status add_region(const MemRegion& region, std::string* reason) override
      EXCLUDES(regions_mu_, driver_.turn());
  [[nodiscard]] Status remove_region(std::uint64_t id) override
      EXCLUDES(regions_mu_, driver_.turn());
  [[nodiscard]] Status post(LanePeer* peer, const Post& post, XferHandle* out) override
      EXCLUDES(mu_, regions_mu_);
  void take_notifications(std::vector<Notification>* out) override EXCLUDES(mu_);
  // Without a progress thread: the caller's turn at driving UCX.
  void progress() override EXCLUDES(driver_.turn());
  [[nodiscard]] Status check(XferHandle xfer, Status* state) override;
  [[nodiscard]] Status release(XferHandle xfer) override EXCLUDES(mu_);
  [[nodiscard]] const char* detail(XferHandle xfer) const override;
  void add_live(HandleCounts& counts) const override EXCLUDES(mu_);
  void add_counters(std::map<std::string, std::uint64_t>& counters) const override;

  // kRefuse: refuse messages and stop the thread; kDisconnect: the peers
  // left; kQuiesce: drain requests (bounded) and unmap the pool and the
  // regions left; kRelease:
  // destroy the worker and the context.
  void stop(StopStage stage) override EXCLUDES(mu_, driver_.turn());

 private:
  using Op = TransferOp;
  // A transfer handle, pooled. Owned by the core until release() and by the
  // driver until its UCX work ended; whichever lets go last returns it.
  struct Xfer : LaneXfer {
    explicit Xfer(UcxLane* in) : LaneXfer(in), owner(in) {}
    UcxLane* const owner;
    std::uint32_t slot = 0;  // fixed at creation
    // Set by the post before it is queued.
    std::shared_ptr<Endpoint> ep;
    TransferId id = 0;
    Op op = Op::kWrite;
    std::vector<ByteRun> runs;  // capacity kept
    std::size_t run_count = 0;
    // A descriptor post's runs (Post::pool_only false): where each starts
    // in our memory and the registration it lies in (nullptr: the pool's),
    // and the regions of ours (not the pool) it keeps from removal until its
    // puts or gets ended. Capacity kept.
    bool descs = false;
    struct LocalAt {
      std::uint8_t* addr = nullptr;
      ucp_mem_h memh = nullptr;
    };
    std::vector<LocalAt> local_at;
    std::vector<std::uint32_t> held_regions;
    std::vector<std::uint8_t> note;  // the notification (empty: none)
    std::uint64_t sequence = 0;      // the ack must echo it
    std::atomic<int> result{UCS_INPROGRESS};
    std::atomic<int> refs{0};
    std::atomic<bool> held{false};
    // Driver only.
    ucs_status_t error = UCS_OK;  // of the first put or get that failed
    bool ended = false;           // result is set
    bool sending = false;         // UCX holds note_header and note
    std::size_t await_index = kNotAwaiting;
    std::vector<std::uint8_t> note_header;
  };
  static constexpr std::size_t kNotAwaiting = ~std::size_t{0};
  struct ConnectJob;
  // A region of ours besides the pool, by slot (engine.h's MemRegion).
  struct OwnRegion {
    std::uint64_t id = 0;  // 0: the slot is free
    std::uint8_t* base = nullptr;
    std::uint64_t len = 0;
    ucp_mem_h memh = nullptr;
    std::vector<std::uint8_t> packed;  // its rkey, as published
    bool live = false;                 // published, and posts may name it
    std::uint32_t busy = 0;            // transfers of ours whose puts or gets may touch it
  };
  struct RegionJob;
  // The target's fences (engines/fence_table.h): per initiator lineage, its
  // newest registration, the endpoint its fence came on and the sender's
  // name from it. UCX proves no identity (a token holder's fence is taken),
  // so every lineage is one anonymous identity's and none has room of its
  // own. A lineage unused for kFenceLinger (no notification, no ack in
  // flight) may be forgotten.
  struct Fenced {
    ucp_ep_h from = nullptr;
    std::string name;
  };
  using Fences = FenceTable<Anonymous, Fenced>;
  static constexpr std::chrono::seconds kFenceLinger{60};
  // An ack on its way to an initiator (UCX holds its bytes until sent).
  struct AckMsg {
    UcxLane* lane = nullptr;
    Fences::Entry* entry = nullptr;  // its sender's, if fenced
    std::array<std::uint8_t, wire::kAckLen> bytes{};
  };

  // Callers' side (and the driver's, for the last reference).
  void unref(Xfer* xfer) EXCLUDES(mu_);
  // ucx_regions.cc: the peer's regions matched with the keys its blob
  // publishes (the packed rkeys into *packed); a descriptor post's runs
  // checked against the peer's regions and ours, and ours held.
  [[nodiscard]] static Status match_regions(const wire::PeerBlob& blob, const RemoteRegion& remote,
                                            std::vector<PeerRegion>* regions,
                                            std::vector<std::span<const std::uint8_t>>* packed,
                                            std::string* why);
  [[nodiscard]] Status hold_runs(const Endpoint& ep, const Post& post, Xfer* x)
      EXCLUDES(regions_mu_);
  void let_go(Xfer* x) EXCLUDES(regions_mu_);  // the regions x holds, if any
  [[nodiscard]] bool holds_removed(const Xfer* x) const EXCLUDES(regions_mu_);
  [[nodiscard]] std::uint64_t pool_len() const { return region_.num_blocks * region_.block_len; }
  static Xfer* from_handle(XferHandle handle) { return static_cast<Xfer*>(lane_xfer(handle)); }
  // Shutdown's steps (stop()).
  void stop_accepting() EXCLUDES(driver_.turn());
  void disconnect_left() EXCLUDES(mu_, driver_.turn());
  void release_pool() EXCLUDES(driver_.turn());

  // The driver's side: commands, UCX calls and callbacks. The commands
  // (run_*) and callbacks (on_*) are called through pointers, which the
  // analysis cannot follow: each starts with driver_.check_turn(). What
  // they call says REQUIRES(driver_.turn()).
  // ucx_lane.cc: endpoints opened and closed, a transfer's puts or gets and
  // flush, its end.
  static void run_connect(void* job);
  static void run_post(void* xfer);
  static void run_close(void* endpoint);
  static void run_unmap(void* lane);
  static void run_map_region(void* job);
  static void run_unmap_region(void* job);
  void complete(Xfer* xfer, ucs_status_t status) REQUIRES(driver_.turn());
  void fail_awaiting(Endpoint& ep, ucs_status_t status) REQUIRES(driver_.turn());
  void end_close(Endpoint& ep) REQUIRES(driver_.turn());
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void on_flush(void* request, ucs_status_t status, void* xfer);
  static void on_closed(void* request, ucs_status_t status, void* endpoint);
  // ucx_messages.cc: the fences, notifications and acks we send, and the
  // handlers of those peers send us.
  ucs_status_t send_fence(Endpoint& ep) REQUIRES(driver_.turn());
  void send_note(Xfer* xfer) REQUIRES(driver_.turn());
  void send_ack(ucp_ep_h to, Fences::Entry* entry, const wire::NotifyAck& ack)
      REQUIRES(driver_.turn());
  [[nodiscard]] Fences::Entry* admit(std::uint64_t lineage, std::uint64_t epoch, ucp_ep_h from)
      REQUIRES(driver_.turn());
  static void on_note_sent(void* request, ucs_status_t status, void* xfer);
  static void on_sent(void* request, ucs_status_t status, void* lane);
  static void on_ack_sent(void* request, ucs_status_t status, void* ack);
  void received(void* data, const ucp_am_recv_param_t* param) ASSERT_CAPABILITY(driver_.turn());
  static ucs_status_t on_fence(void* arg, const void* header, std::size_t header_length, void* data,
                               std::size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_note(void* arg, const void* header, std::size_t header_length, void* data,
                              std::size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_ack(void* arg, const void* header, std::size_t header_length, void* data,
                             std::size_t length, const ucp_am_recv_param_t* param);

  const std::string agent_name_;
  const Region region_;
  const std::uint64_t token_;
  const bool threaded_;
  const bool has_rdma_;
  const bool tcp_lane_here_;
  std::atomic<bool> accepting_{true};  // false from stop(): messages refused

  // Peers and the transfer pool. Taken by callers and inside a turn (the
  // last unref), never across a UCX call; nothing is taken under it.
  mutable Mutex mu_ ACQUIRED_AFTER(driver_.turn());
  std::unordered_map<LanePeer*, std::shared_ptr<Endpoint>> peers_ GUARDED_BY(mu_);
  std::deque<Xfer> xfers_ GUARDED_BY(mu_);
  std::vector<Xfer*> free_xfers_ GUARDED_BY(mu_);
  // Notifications peers sent, per lineage; none has a share of its own
  // (engines/inbox.h, its own lock).
  Inbox<std::uint64_t> inbox_{kMaxQueuedNotificationsPerSender, kMaxQueuedNotifications};

  // Our regions besides the pool, by slot. Taken by callers and inside a
  // turn, never across a UCX call; nothing is taken under it.
  mutable Mutex regions_mu_ ACQUIRED_AFTER(driver_.turn());
  std::vector<OwnRegion> regions_ GUARDED_BY(regions_mu_);
  std::size_t region_keys_ GUARDED_BY(regions_mu_) = 0;       // live or being added
  std::size_t region_key_bytes_ GUARDED_BY(regions_mu_) = 0;  // their packed rkeys

  Lineages lineages_;  // our registrations of each target (engines/lineages.h)
  // The driver's alone: transfers by slot (for acks), the fences peers sent
  // us, and the acks in flight.
  std::vector<Xfer*> slots_ GUARDED_BY(driver_.turn());
  Fences fences_ GUARDED_BY(driver_.turn()){{wire::kMaxFences, 0, kFenceLinger}};
  std::deque<AckMsg> acks_ GUARDED_BY(driver_.turn());
  std::vector<AckMsg*> free_acks_ GUARDED_BY(driver_.turn());
  std::size_t acks_in_flight_ GUARDED_BY(driver_.turn()) = 0;

  std::atomic<std::uint64_t> live_peers_{0};
  std::atomic<std::uint64_t> live_rkeys_{0};
  std::atomic<std::uint64_t> live_regions_{0};
  std::atomic<std::uint64_t> live_transfers_{0};
  std::atomic<std::uint64_t> live_requests_{0};
  // Running totals for counters() (their names: kNames in add_counters).
  enum Counter {
    kWrites,
    kReads,
    kPuts,
    kGets,
    kNotesSent,
    kNotesReceived,
    kNotesRefused,
    kFencesReceived,
    kFencesRefused,
    kAcksIgnored,
    kRunsRefused,
    kCounters
  };
  std::array<std::atomic<std::uint64_t>, kCounters> counts_{};
  void count(Counter c, std::uint64_t n = 1) { counts_[c].fetch_add(n, std::memory_order_relaxed); }

  // Declared last, destroyed first: the driver (whose destruction completes
  // what UCX still holds through the callbacks above) before the pools and
  // maps it calls into; the pool's registration before the driver.
  UcxDriver driver_;
  ucp_mem_h memh_ = nullptr;  // the pool's registration
  bool unmapped_ = false;     // every registration undone (under the driver's lock)
  std::vector<std::uint8_t> packed_rkey_;
};

}  // namespace kvxfer::internal::ucx
