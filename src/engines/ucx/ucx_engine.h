// SPDX-License-Identifier: Apache-2.0
// The UCX lane: WRITEs into a peer's pool through a UCP endpoint in
// UCP_ERR_HANDLING_MODE_PEER, whose error handler marks the peer failed.
//
// Where no RDMA device is in use (the default on a host without one, see
// ucx_config.h), the context has no RMA feature and every write goes as
// scatter writes (ucx_scatter.cc, wire/scatter.h): active messages that each
// carry runs of blocks (and about a chunk of bytes), checked against the pool
// by the peer's handler and acked once the bytes are in place. The first
// message on every endpoint is a fence (wire/fence.h), so that bytes of an
// earlier registration of the same peer still in flight are refused rather
// than applied over a newer registration's writes.
//
// With RMA (a host with an RDMA device), a write of long runs is one
// ucp_put_nbx per run, then one ucp_ep_flush_nbx whose completion means the
// bytes are in the peer's memory (ucx_put.cc); short runs still go as
// scatter writes. See docs/ucx-engine.md and docs/reliability.md.
//
// A READ is the mirror of a scatter write (ucx_gather.cc, wire/gather.h):
// requests that carry runs of the peer's pool, fenced like writes, answered
// by the peer's handler with the runs' bytes, which we copy into our pool.
//
// This room may use UCX, src/wire/ and src/common/; it knows nothing of the
// same-host lane (lanes.cc decides which peers come here) or of src/core/.
// Files: ucx_config (what we ask of UCX), ucx_worker (context, worker,
// progress), ucx_endpoint (connect, errors, close), ucx_put, ucx_scatter,
// ucx_gather, and this one: transfer pool, check, release, live counts,
// counters, shutdown.
#pragma once

#include <ucp/api/ucp.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine.h"
#include "engines/block_runs.h"
#include "engines/lanes.h"
#include "engines/ucx/ucx_config.h"
#include "engines/ucx/ucx_endpoint.h"
#include "engines/ucx/ucx_handles.h"
#include "engines/ucx/ucx_worker.h"
#include "wire/fence.h"
#include "wire/gather.h"
#include "wire/notify.h"
#include "wire/scatter.h"
#include "wire/ucx_blob.h"

namespace kvxfer::internal::ucx {

// Statuses that say the peer's endpoint is gone: nothing more can land.
inline bool is_disconnect(ucs_status_t status) {
  return status == UCS_ERR_CONNECTION_RESET || status == UCS_ERR_ENDPOINT_TIMEOUT ||
         status == UCS_ERR_UNREACHABLE || status == UCS_ERR_REJECTED;
}

inline Status map_post_error(ucs_status_t status) {
  return is_disconnect(status) ? Status::kRemoteDisconnect : Status::kBackend;
}

// The status a peer's ack or gather reply carries, as one of the statuses
// its handler sends; anything else is an I/O error.
inline ucs_status_t peer_status(std::int32_t sent) {
  for (const ucs_status_t known : {UCS_OK, UCS_ERR_INVALID_PARAM, UCS_ERR_REJECTED,
                                   UCS_ERR_UNSUPPORTED, UCS_ERR_CANCELED, UCS_ERR_NO_RESOURCE}) {
    if (sent == static_cast<std::int32_t>(known)) return known;
  }
  return UCS_ERR_IO_ERROR;
}

// A fresh unguessable nonzero 64-bit number (getrandom, drawn 32 at a time
// per thread; no allocation).
std::uint64_t fresh_random();

class UcxLane {
 public:
  // `token` is what peers' scatter writes must carry to be taken (our
  // cookie epoch, published in the blob). Throws std::runtime_error when UCX
  // cannot start or engine_config holds a bad value.
  UcxLane(std::string agent_name, const Region& region, const Options& options,
          std::uint64_t token);
  ~UcxLane();
  UcxLane(const UcxLane&) = delete;
  UcxLane& operator=(const UcxLane&) = delete;

  // UCX_TLS as our context sees it.
  [[nodiscard]] const std::string& tls() const { return settings_.tls; }
  [[nodiscard]] const std::vector<std::uint8_t>& worker_address() const {
    return worker_.address();
  }
  [[nodiscard]] const std::vector<std::uint8_t>& packed_rkey() const { return packed_rkey_; }

  // On failure *reason (when given) says why, as the log does.
  [[nodiscard]] Status connect(const Blob& blob, const RemoteRegion& remote, PeerHandle* out,
                               std::string* reason = nullptr);
  [[nodiscard]] Status disconnect(PeerHandle peer);
  [[nodiscard]] Status post_write(PeerHandle peer, TransferId id,
                                  std::span<const std::int64_t> local,
                                  std::span<const std::int64_t> remote, XferHandle* out,
                                  std::span<const std::uint8_t> notify = {});
  // A READ of the peer's remote[i] into our local[i] (engine.h's contract).
  [[nodiscard]] Status post_read(PeerHandle peer, TransferId id,
                                 std::span<const std::int64_t> local,
                                 std::span<const std::int64_t> remote, XferHandle* out,
                                 std::span<const std::uint8_t> notify = {});
  // ucx_notify.cc: a notification alone, and the ones peers delivered to us.
  [[nodiscard]] Status post_notify(PeerHandle peer, TransferId id,
                                   std::span<const std::uint8_t> message, XferHandle* out);
  void take_notifications(std::vector<Notification>* out);
  void progress();
  [[nodiscard]] Status check(XferHandle xfer, Status* state);
  [[nodiscard]] Status release(XferHandle xfer);
  // Why a transfer failed, as UCX named it (a static string), or nullptr.
  [[nodiscard]] const char* detail(XferHandle xfer) const;
  // Whether this lane's context has the RMA feature (and so may put).
  [[nodiscard]] bool rma() const { return settings_.rma; }

  // Adds the pool registration, peers, rkeys, transfers and requests.
  void add_live(HandleCounts& counts) const;
  void add_counters(std::map<std::string, std::uint64_t>& counters) const;

  // Shutdown, in three steps (lanes.cc interleaves the other lane's):
  // refuse scatter writes and stop the progress thread; then, once every
  // peer is disconnected, drain requests (bounded) and unmap the pool; then
  // destroy the worker and the context. Each is idempotent.
  void stop();
  void release_pool();
  void destroy_worker();

 private:
  // A transfer handle. Owned by the core until release(), and by UCX until
  // the flush completes or the acks are in; whichever lets go last returns
  // it to the pool.
  struct Xfer : LaneXfer {
    enum class Op : std::uint8_t { kWrite, kRead, kNotify };
    Xfer() : LaneXfer(Lane::kUcx) {}
    UcxLane* lane = nullptr;
    std::shared_ptr<UcxPeer> peer;
    TransferId id = 0;
    Op op = Op::kWrite;                       // set before the post, read under am_mu_ by handlers
    std::atomic<int> result{UCS_INPROGRESS};  // ucs_status_t of the flush, acks or replies
    std::atomic<int> refs{0};
    std::atomic<bool> held{false};  // between the post and release()
    // Scatter messages UCX still holds (it may read the local blocks until
    // each send completes).
    std::atomic<int> sends_pending{0};
    // Scatter writes and gather reads. slot is fixed at creation; the rest
    // is under am_mu_: am_seq is nonzero while acks (replies) are awaited
    // (then the transfer holds a reference for them), am_left counts the
    // messages not yet answered.
    std::uint32_t slot = 0;
    // The sequence this post drew (am_seq is cleared when the wait ends;
    // this stays for the sender of a handed-off post).
    std::uint64_t post_seq = 0;
    // Next in the lane's submission queue (under submit_mu_).
    Xfer* next_submit = nullptr;
    std::uint64_t am_seq = 0;
    int am_left = 0;
    // A read's replies being copied into our pool right now, outside
    // am_mu_: whoever ends the wait waits for none to be left
    // (end_wait_locked), so no byte lands after the end is reported.
    int copying = 0;
    int am_status = UCS_OK;
    // The messages, built whole before the first is sent (UCX keeps pointers
    // into these until each send completes). am_headers and am_iov keep
    // their high-water size on reuse: am_chunks alone says what a transfer
    // uses of them. am_iov holds our pool's side of every run (a chunk's are
    // iov_offset .. iov_offset + runs): what a write's message carries, or
    // where a read's reply goes.
    struct AmChunk {
      std::size_t header_offset = 0;
      std::size_t runs = 0;
      std::size_t iov_offset = 0;
      std::uint64_t bytes = 0;  // the runs' total
      bool answered = false;    // a read's reply came (under am_mu_)
    };
    std::vector<std::uint8_t> am_headers;
    std::vector<ucp_dt_iov_t> am_iov;
    // The notification sent once the data is in place (empty: none), its
    // header, and (under am_mu_) whether the wait is now for its ack.
    std::vector<std::uint8_t> notify_msg;
    std::vector<std::uint8_t> notify_header;
    bool notify_stage = false;
    // Queued for the progress thread to send the notification (handed-off
    // mode): set and read on that thread (or by stop() once it is joined).
    bool notify_queued = false;
    std::vector<AmChunk> am_chunks;
    // The post's run_blocks pairs as runs (run_count of them), from which
    // its messages are built: by the caller, or, handed off, by the progress
    // thread while build_pending (set before the transfer is queued, cleared
    // by the thread). A handed-off post may keep its pairs instead
    // (pairs_kept: run_blocks local indices, then as many remote ones),
    // which the thread turns into runs. Capacities kept.
    std::vector<BlockRun> runs;
    std::vector<std::int64_t> pairs;
    std::size_t run_count = 0;
    std::uint64_t run_blocks = 0;
    bool pairs_kept = false;
    bool build_pending = false;
  };

  // An ack on its way back to an initiator: UCX may hold its header until
  // the send completes, so it lives in a pool, not on the stack.
  struct AckMsg {
    UcxLane* lane = nullptr;
    std::array<std::uint8_t, kAckLen> bytes{};
  };

  // A gather reply on its way back: UCX holds its header and its iovecs
  // (into our pool) until the send completes. Pooled, capacity kept.
  struct ReplyMsg {
    UcxLane* lane = nullptr;
    std::array<std::uint8_t, kGatherReplyLen> header{};
    std::vector<ucp_dt_iov_t> iov;
  };

  // ucx_endpoint.cc
  Status close_endpoint(UcxPeer& peer);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  // ucx_put.cc
  Status post_puts(UcxPeer& peer, std::span<const std::int64_t> local,
                   std::span<const std::int64_t> remote, Xfer* xfer);
  bool flush(UcxPeer& peer, Xfer* xfer, ucs_status_t* immediate);
  static void on_flush(void* request, ucs_status_t status, void* user_data);

  // ucx_scatter.cc
  void register_scatter_handlers();
  Status post_scatter(UcxPeer& peer, std::span<const std::int64_t> local,
                      std::span<const std::int64_t> remote, Xfer* xfer);
  static void take_runs(std::span<const std::int64_t> local, std::span<const std::int64_t> remote,
                        Xfer* xfer);
  void build_chunks(const UcxPeer& peer, Xfer* xfer, std::size_t fixed_len);
  // The pairs a handed-off post samples to choose what it keeps.
  static constexpr std::size_t kPairsSample = 16;
  void keep_for_build(std::span<const std::int64_t> local, std::span<const std::int64_t> remote,
                      Xfer* xfer);
  Status defer_build(UcxPeer& peer, std::span<const std::int64_t> local,
                     std::span<const std::int64_t> remote, Xfer* xfer);
  bool build_handed_off(const UcxPeer& peer, Xfer* xfer);
  void put_fixed_parts(const UcxPeer& peer, Xfer* xfer);
  std::uint64_t arm_wait(Xfer* xfer);
  Status launch(UcxPeer& peer, Xfer* xfer);
  ucs_status_t send_scatter(UcxPeer& peer, Xfer* xfer, std::size_t* sent);
  void settle_unsent(Xfer* xfer, std::size_t sent, ucs_status_t status);
  void submit(Xfer* xfer);
  UcxWorker::Rest drain_submissions(bool before_sleep);
  void send_submitted(Xfer* xfer);
  void fail_scatter(Xfer* xfer, ucs_status_t status);
  // Under am_mu_ (`lock`): ends a transfer's wait (clears am_seq), then
  // waits until none of its read replies is being copied.
  void end_wait_locked(Xfer* xfer, std::unique_lock<std::mutex>& lock);
  void end_scatter(Xfer* xfer, ucs_status_t status);
  void fail_peer_scatters(const UcxPeer* peer, ucs_status_t status);
  void send_ack(const ucp_am_recv_param_t* param, const ScatterAck& ack);
  Status send_fence(UcxPeer& peer);
  void wait_sends(UcxPeer& peer, Xfer* xfer);
  // Target: whether a write of (lineage, epoch) may be applied now.
  bool fence_allows(std::uint64_t lineage, std::uint64_t epoch);
  static ucs_status_t on_fence_am(void* arg, const void* header, std::size_t header_length,
                                  void* data, std::size_t length, const ucp_am_recv_param_t* param);
  static void on_fence_sent(void* request, ucs_status_t status, void* user_data);
  static ucs_status_t on_scatter_am(void* arg, const void* header, std::size_t header_length,
                                    void* data, std::size_t length,
                                    const ucp_am_recv_param_t* param);
  static ucs_status_t on_ack_am(void* arg, const void* header, std::size_t header_length,
                                void* data, std::size_t length, const ucp_am_recv_param_t* param);
  static void on_am_sent(void* request, ucs_status_t status, void* user_data);
  static void on_ack_sent(void* request, ucs_status_t status, void* user_data);

  // ucx_gather.cc
  void register_gather_handlers();
  Status post_gather(UcxPeer& peer, std::span<const std::int64_t> local,
                     std::span<const std::int64_t> remote, Xfer* xfer);
  void send_gather_reply(const ucp_am_recv_param_t* param, const GatherReply& reply,
                         const GatherRequest* served);
  static ucs_status_t on_gather_am(void* arg, const void* header, std::size_t header_length,
                                   void* data, std::size_t length,
                                   const ucp_am_recv_param_t* param);
  static ucs_status_t on_gather_reply_am(void* arg, const void* header, std::size_t header_length,
                                         void* data, std::size_t length,
                                         const ucp_am_recv_param_t* param);
  static void on_gather_reply_sent(void* request, ucs_status_t status, void* user_data);

  // ucx_notify.cc
  void register_notify_handler();
  // Under am_mu_, when a transfer's data wait ended well: whether its wait
  // goes on for a notification's ack (then it holds a reference more, for
  // send_notify() to drop).
  static bool begin_notify_locked(Xfer* xfer);
  // Sends the notification of a transfer begin_notify_locked() accepted
  // (from a handler, without am_mu_); a send that fails fails the transfer.
  void send_notify(Xfer* xfer);
  // The progress thread's send of a notification send_notify() queued.
  void send_queued_notify(Xfer* xfer);
  // Both sends': under send_mu_, sends unless the peer is closing or
  // failed; a notification not sent fails its transfer.
  void send_notify_checked(Xfer* xfer);
  // The send itself; caller holds send_mu_ and has checked the peer.
  ucs_status_t send_notify_message(UcxPeer& peer, Xfer* xfer);
  static ucs_status_t on_notify_am(void* arg, const void* header, std::size_t header_length,
                                   void* data, std::size_t length,
                                   const ucp_am_recv_param_t* param);

  // ucx_engine.cc
  void publish_rkey();
  std::shared_ptr<UcxPeer> find_peer(PeerHandle handle) const;
  Xfer* start_xfer(std::shared_ptr<UcxPeer> peer, TransferId id, Xfer::Op op,
                   std::span<const std::uint8_t> notify = {});
  Status hand_out(Xfer* xfer, Status posted, XferHandle* out);
  Xfer* acquire_xfer();
  void unref(Xfer* xfer);
  void drain_requests(const char* why);
  static Xfer* from_handle(XferHandle handle) {
    return static_cast<Xfer*>(reinterpret_cast<LaneXfer*>(handle));
  }

  std::string agent_name_;
  Region region_;
  std::uint64_t token_ = 0;
  UcxSettings settings_;
  bool want_progress_thread_ = true;
  std::size_t scatter_max_runs_ = kMaxScatterRuns;
  // UCX's header limit leaves room for scatter messages (always, over TCP).
  bool scatter_ok_ = true;

  // Peers by handle. Connect runs on the core's registration worker while
  // transfers run on callers' threads, so the map has its own lock. Never
  // taken inside a UCX callback.
  mutable std::mutex peers_mu_;
  std::unordered_map<PeerHandle, std::shared_ptr<UcxPeer>> peers_;

  // Initiator: our lineage and registration count per target (its agent
  // name and token), for the life of the lane (wire/fence.h).
  struct Lineage {
    std::uint64_t id = 0;
    std::uint64_t gen = 0;
  };
  std::mutex lineage_mu_;
  std::map<std::pair<std::string, std::uint64_t>, Lineage> lineages_;

  // Target: the newest fence per initiator lineage. Bounded: when full, the
  // least recently fenced lineage goes (its writes are then refused, never
  // misapplied). Taken by the fence handler and around the scatter handler's
  // check and copy.
  struct FenceEntry {
    std::uint64_t gen = 0;
    std::uint64_t epoch = 0;
    std::uint64_t stamp = 0;
  };
  std::mutex fence_mu_;
  std::unordered_map<std::uint64_t, FenceEntry> fences_;
  std::uint64_t fence_stamp_ = 0;

  // Transfer handles: a pool that only grows to the peak number in flight.
  std::mutex pool_mu_;
  std::deque<Xfer> xfers_;
  std::vector<Xfer*> free_xfers_;

  // Scatter writes and gather reads. As initiator: transfers by slot, for
  // the acks and replies (which name a slot and a sequence), under am_mu_
  // (taken after pool_mu_, never before it; a read's reply is copied into
  // our pool under it). As target: whether the handlers may write (or read)
  // the region.
  std::mutex am_mu_;
  // Signalled (under am_mu_) when a read's reply copy ends.
  std::condition_variable copies_cv_;
  std::vector<Xfer*> slots_;
  std::atomic<bool> accepting_writes_{false};
  // Handed-off posts (settings_.post_handoff with the progress thread on):
  // post_write queues the transfer and the progress thread sends it, so the
  // caller never waits on UCX (whose eager TCP sends copy inside the call,
  // and whose worker lock the progress thread may hold for milliseconds).
  // submit_mu_ guards the queue and thread_idle_ (the thread is, or is about
  // to be, asleep: the next submission wakes it). send_mu_ is held around
  // each queued transfer's sends and by disconnect() while it marks the peer
  // closing, so that no send starts on an endpoint being closed.
  bool handoff_ = false;
  std::atomic<bool> sending_{true};  // false from stop(): queued posts fail
  std::mutex submit_mu_;
  Xfer* submit_head_ = nullptr;
  Xfer* submit_tail_ = nullptr;
  bool thread_idle_ = false;
  // The linger (on the progress thread only; lingers()): after the lane's
  // last work, the thread naps instead of sleeping for settings_.linger, so
  // a post then needs no wake.
  struct Linger {
    // The last post sent, or the last rest with requests in flight.
    std::chrono::steady_clock::time_point last_busy{};
    bool was_live = false;     // requests were in flight at the last rest
    bool decided = false;      // this idle period's first rest is past
    bool this_period = false;  // this idle period lingers (and has not run out)
    int misses = 0;            // lingers in a row that caught no post
    int skips = 0;             // idle periods left that sleep at once
    void busy(std::chrono::steady_clock::time_point now) {
      last_busy = now;
      decided = false;
      this_period = false;
    }
  };
  static constexpr int kMaxLingerMisses = 5;
  bool lingers(bool live);
  Linger linger_;
  std::mutex send_mu_;
  std::mutex ack_mu_;
  std::deque<AckMsg> acks_;
  std::vector<AckMsg*> free_acks_;
  std::mutex reply_mu_;
  std::deque<ReplyMsg> replies_;
  std::vector<ReplyMsg*> free_replies_;

  // Target: notifications peers delivered, until take_notifications().
  std::mutex notes_mu_;
  std::deque<Notification> notes_;

  std::atomic<std::uint64_t> live_rkeys_{0};
  std::atomic<std::uint64_t> live_peers_{0};  // connected through this lane
  std::atomic<std::uint64_t> live_transfers_{0};
  std::atomic<std::uint64_t> live_requests_{0};
  // Running totals for counters().
  std::atomic<std::uint64_t> put_writes_{0};
  std::atomic<std::uint64_t> scatter_writes_{0};
  std::atomic<std::uint64_t> scatter_messages_{0};
  std::atomic<std::uint64_t> scatter_handed_off_{0};  // writes the progress thread sent
  // Handed-off writes and reads whose pairs were kept as they are (scattered
  // blocks); the others kept their runs.
  std::atomic<std::uint64_t> handed_off_as_pairs_{0};
  std::atomic<std::uint64_t> wakes_{0};               // submissions that woke the progress thread
  std::atomic<std::uint64_t> lingers_{0};             // idle periods the thread lingered in
  std::atomic<std::uint64_t> linger_hits_{0};         // posts a linger caught (no wake)
  std::atomic<std::uint64_t> scatter_refused_{0};
  std::atomic<std::uint64_t> scatter_received_{0};
  std::atomic<std::uint64_t> scatter_rejected_{0};
  std::atomic<std::uint64_t> scatter_fenced_{0};
  std::atomic<std::uint64_t> fences_received_{0};
  std::atomic<std::uint64_t> fences_ignored_{0};
  std::atomic<std::uint64_t> acks_ignored_{0};
  std::atomic<std::uint64_t> notifications_sent_{0};
  std::atomic<std::uint64_t> notifications_received_{0};
  std::atomic<std::uint64_t> notifications_refused_{0};
  std::atomic<std::uint64_t> gather_reads_{0};
  std::atomic<std::uint64_t> gather_messages_{0};
  std::atomic<std::uint64_t> gather_handed_off_{0};  // reads the progress thread sent
  std::atomic<std::uint64_t> gather_received_{0};
  std::atomic<std::uint64_t> gather_rejected_{0};
  std::atomic<std::uint64_t> gather_fenced_{0};
  std::atomic<std::uint64_t> gather_replies_ignored_{0};

  // Declared last, destroyed first: the pool registration goes before the
  // worker, and the worker (whose destruction completes what UCX still holds
  // through the callbacks above) before the pools and maps it calls into.
  UcxWorker worker_;
  MemHandle memh_;
  std::vector<std::uint8_t> packed_rkey_;
};

}  // namespace kvxfer::internal::ucx
