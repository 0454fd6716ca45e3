// SPDX-License-Identifier: Apache-2.0
// The tcp lane: remote peers on hosts without RDMA, over TCP connections of
// our own. It may use the engine interface's types, the wire formats and the
// logger; it knows nothing of UCX. It is one Lane (engines/lane.h).
//
// Why not UCX's tcp transport: any client that reaches its port can PUT
// anywhere in the process (UCX executes its internal PUT_REQ whatever its
// settings say), one oversized message aborts it, and it copies each byte
// twice on the receiving side. Here nothing is ever written to an address
// taken from the wire: a write frame names runs of the target's regions (by
// the target's own region ids; its pool is id 0), which the target checks
// against its own region table before one payload byte is read, and the
// payload is then received with readv straight into those bytes.
//
// Threads: one I/O thread per lane owns every socket (epoll). Posts build
// their frames on the caller's thread and queue them; the I/O thread sends
// header and payload with sendmsg straight from the pool, receives, acks and
// completes. A target receives with nobody polling.
//
// Connections and fencing: connect() opens one connection per registration
// and sends a hello first: the target's token (from its metadata), then our
// lineage for that target (random, for the life of this lane), the
// registration's generation and a random epoch. The target closes a
// connection whose first frame is not a hello with its token before reading
// anything else, and keeps per lineage the newest generation it accepted:
// an older one is refused, a newer one closes the older connections and
// discards whatever they still hold. Since a connection's frames are applied
// in order and an initiator reports a write done only once its ack came back
// on the registration's own connection, no byte of a removed registration
// can land after a newer registration's write was reported done. What the
// target remembers is bounded by count (kMaxLineages; when full it refuses
// new lineages, never forgets one early) and by time (an entry with no
// connection left is forgotten after kLineageLinger, longer than any
// connection may take to present its hello).
//
// Identities: the lane holds an X25519 key pair for its life and publishes
// the public key in its metadata. The target speaks first, a fresh
// challenge; the hello carries the initiator's public key and a proof over
// that challenge that it holds the private half, and both ends derive the
// keys that tag every later frame in each direction (tcp_handshake.h), so a
// recorded hello or frame is worth nothing on another connection or later
// on its own. The peers our owner registered (through any lane: lanes.cc
// vouches for them) are known by agent name and key (none for a peer that
// runs no tcp lane: its name is still reserved), so a connection that
// presents a registered peer's name with another key is refused, a
// registered peer's notifications are queued in a share nobody else can
// use up, and the target's tables (lineages, connections) keep room for
// registered peers however many other keys fill them.
#pragma once

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/identity.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "engine.h"
#include "engines/inbox.h"
#include "engines/lane.h"
#include "engines/lineages.h"
#include "engines/tcp/tcp_config.h"
#include "wire/peer_blob.h"
#include "wire/tcp_frame.h"

namespace kvxfer::internal::tcp {

struct HandshakeKeys;  // tcp_handshake.h
class TlsContext;      // tcp_tls.h

class TcpLane final : public Lane {
 public:
  // How long an accepted connection may take to present its hello.
  static constexpr std::chrono::milliseconds kHelloTimeout{5000};
  // How long a target waits, after its refusal went out and it shut down
  // its side, for the peer to close before it resets the connection.
  static constexpr std::chrono::milliseconds kClosingGrace{2000};
  // How long connect() waits for a peer to answer (per address) and to
  // welcome our hello.
  static constexpr std::chrono::milliseconds kConnectTimeout{5000};
  // The most initiator lineages a target remembers, and how long it keeps
  // one whose connections are all closed.
  static constexpr std::size_t kMaxLineages = 4096;
  static constexpr std::chrono::seconds kLineageLinger{120};
  // The most connections a target holds (past it, new connections are
  // closed), and of those, the most that have not presented a hello yet
  // (past it, the oldest of them is closed to make room, so silent
  // connections cannot keep a peer that says hello at once out).
  static constexpr std::size_t kMaxConnections = 4096;
  static constexpr std::size_t kMaxPendingHellos = 256;
  // The most notifications a target queues from one sender (the agent name
  // and identity key its connection presented); past that, that sender's
  // are refused. Senders the target's owner did not register share
  // kMaxQueuedNotifications besides; a registered peer's share is its own.
  static constexpr std::size_t kMaxQueuedPerSender = kMaxQueuedNotificationsPerSender;
  // One identity key, registered or not, may hold this many lineages (an
  // honest lane holds one per name its owner registered us under), and a
  // registered peer's key may hold them past a full table; any lineage this
  // many open connections (an honest initiator keeps one per registration).
  static constexpr std::size_t kMaxLineagesPerPeer = 16;
  static constexpr std::size_t kMaxConnectionsPerLineage = 4;
  // The most welcomed connections one identity key may hold, whatever its
  // lineages (ConnLimits::per_key sizes it down for low descriptor limits),
  // so no key, a registered peer's included, can take every slot.
  static constexpr std::size_t kMaxConnectionsPerKey = 64;
  // Of kMaxConnections, the most that connections whose key is no
  // registered peer's may hold once welcomed; the rest stays for registered
  // peers.
  static constexpr std::size_t kMaxUnregisteredConnections = kMaxConnections / 2;
  // What a target's connections may hold, sized once from the process's
  // file descriptor limit (RLIMIT_NOFILE's soft limit) so the lane can
  // never take every descriptor: accepted connections at most half of it
  // (the rest stays its owner's: files, UCX, its own outgoing
  // connections), and of those, welcomed connections of no registered
  // peer at most half (the rest stays for registered peers), connections
  // without a hello yet a quarter, and refused ones waiting to close an
  // eighth (past that a refused connection is reset at once, so refusals
  // cannot crowd out registered peers); and one identity key's welcomed
  // connections an eighth (at least one lineage's worth), so one key
  // cannot take every slot. The k* bounds above cap each.
  struct ConnLimits {
    std::size_t total = kMaxConnections;
    std::size_t unregistered = kMaxUnregisteredConnections;
    std::size_t pending = kMaxPendingHellos;
    std::size_t closing = kMaxConnections / 8;
    std::size_t per_key = kMaxConnectionsPerKey;
  };
  [[nodiscard]] static ConnLimits conn_limits(std::uint64_t nofile);
  // The most bytes of frames and run lists (pooled buffers) one peer's
  // transfers may hold from their post until they are released: a frozen
  // or slow peer cannot make us hold more than this for it, however many
  // runs each transfer has (a 1,000-run write holds about 40 KB, so about
  // 1,600 of those; one-run writes meet kMaxInflightPerPeer first).
  static constexpr std::uint64_t kMaxHeldBytesPerPeer = std::uint64_t{64} << 20;
  // What a transfer of `runs` runs and a `note`-byte notification holds in
  // its buffers from post to release: frames, runs and iovecs, as frame()
  // lays them out, and the handle itself.
  [[nodiscard]] static constexpr std::uint64_t held_by(std::uint64_t runs, std::uint64_t note) {
    const std::uint64_t frames = (runs + wire::kMaxRuns - 1) / wire::kMaxRuns;
    return frames * (wire::kHeaderLen + 2 * sizeof(iovec)) +
           runs * (wire::kRunLen + sizeof(iovec)) +
           (note > 0 ? wire::kHeaderLen + note + sizeof(iovec) : 0) + 256;
  }
  // How long the listener rests after accept() found no descriptor left.
  static constexpr std::chrono::milliseconds kAcceptRest{100};

  // Opens the listener (throws std::runtime_error saying why it cannot) and
  // starts the I/O thread.
  TcpLane(std::string agent_name, const Region& region, const TcpSettings& settings);
  ~TcpLane() override;

  // What the metadata publishes: the token a connection presents first, the
  // port and the addresses.
  [[nodiscard]] std::uint64_t token() const { return token_; }
  [[nodiscard]] std::uint16_t port() const { return port_; }
  [[nodiscard]] const std::vector<wire::TcpAddress>& addresses() const { return addresses_; }
  [[nodiscard]] const IdentityKey& identity_key() const { return identity_.public_key(); }

  [[nodiscard]] const char* name() const noexcept override { return "tcp"; }
  // Our token, identity key, port and addresses.
  void publish(wire::PeerBlob& blob) const override;
  // The peer publishes a tcp lane.
  [[nodiscard]] bool qualifies(const RemoteRegion& remote,
                               const wire::PeerBlob& blob) const override;

  // The peers our owner registered (any lane): `handle` is the
  // registration's, `remote.agent_name` the peer's. A connection presenting
  // that name must present the tcp key its metadata names (none, for a peer
  // that runs no tcp lane: then no connection may present it); its
  // notifications have the peer's own share. unvouch() when the
  // registration goes; unknown handles are ignored.
  void vouch(PeerHandle handle, const RemoteRegion& remote, const wire::PeerBlob& blob) override;
  void unvouch(PeerHandle handle) override;

  // Where a connection's name and key stand against those registrations.
  enum class Claim : std::uint8_t {
    kUnregistered,  // no registered peer has this name
    kRegistered,    // a registered peer has this name and this key
    kImpostor,      // registered peers have this name, none this key
  };
  [[nodiscard]] Claim claim_of(const std::string& agent_name, const IdentityKey& key) const;

  // Connects to the peer's tcp lane (blob's tcp part) and presents a hello;
  // kSuccess once the peer welcomed it. kRemoteDisconnect when no address
  // answered, the peer refused the hello (its welcome's status says why: a
  // newer registration of ours, another key's name or lineage, no room, an
  // unproven proof), closed the connection without a challenge or an answer
  // (our token is not its own), or answered with a welcome its key did not
  // tag; *reason says which.
  [[nodiscard]] Status connect(const wire::PeerBlob& blob, const RemoteRegion& remote,
                               Connected* out) override;
  // Closes the peer's connection at once; its transfers still in flight end
  // kCanceled (a closed connection the peer ended: kRemoteDisconnect).
  [[nodiscard]] Status disconnect(LanePeer* peer) override;
  // Builds a transfer's frames and queues it on the peer's connection.
  // kInvalidParam (nothing posted) when a run names a region of ours that
  // is not live or a region the peer's metadata did not list; kNotPosted
  // (back-pressure: nothing posted, no strike) while the peer's transfers
  // not yet released hold kMaxHeldBytesPerPeer of frames and run lists.
  [[nodiscard]] Status post(LanePeer* peer, const Post& post, XferHandle* out) override;

  // Regions besides the pool (tcp_regions.cc). A region added is at once
  // ours to post from and for peers' frames to name; remove_region()
  // refuses peers' frames that name it from then on, and returns once the
  // I/O thread has ended everything still moving bytes into or out of it
  // (a write arriving into it is dropped and refused, a reply sent from it
  // or a read landing in it is aborted).
  [[nodiscard]] bool takes_regions() const override { return true; }
  [[nodiscard]] Status add_region(const MemRegion& region, std::string* reason) override;
  [[nodiscard]] Status remove_region(std::uint64_t id) override;
  void take_notifications(std::vector<Notification>* out) override;
  [[nodiscard]] Status check(XferHandle xfer, Status* state) override;
  [[nodiscard]] const char* detail(XferHandle xfer) const override;
  [[nodiscard]] Status release(XferHandle xfer) override;

  void add_live(HandleCounts& counts) const override;
  void add_counters(std::map<std::string, std::uint64_t>& counters) const override;

  // kDisconnect: the peers left; kQuiesce: closes every socket and joins
  // the I/O thread (stop()).
  void stop(StopStage stage) override;
  // Closes every socket and joins the I/O thread. Idempotent.
  void stop();

 private:
  struct Conn;
  struct Peer;
  struct Xfer;
  struct Command;
  class Io;

  void submit(Command command);
  void drop_ref(Xfer* xfer);
  // Transfer handles are reused with their frame and iovec buffers, so a
  // post allocates nothing of its own once warm (BM_TcpLanePost_*: 8.4
  // allocations per write before, 4.4 after, the rest the core's).
  [[nodiscard]] Xfer* take_xfer();
  void recycle(Xfer* xfer);
  [[nodiscard]] Status say_hello(int fd, const wire::PeerBlob& blob, const RemoteRegion& remote,
                                 std::shared_ptr<HandshakeKeys>* keys_out, std::string* reason);
  // A region of ours: the pool at slot 0 (live when there is one), the
  // others where region_slot() of their id says.
  struct LocalRegion {
    std::uint64_t id = 0;
    std::uint8_t* base = nullptr;
    std::uint64_t len = 0;
    bool live = false;
  };
  // False (x half built: the caller recycles it) when a run names a region
  // not in `mine` (ours, by slot) or `theirs` (the peer's ids, by index).
  [[nodiscard]] bool frame(Xfer* x, std::span<const ByteRun> runs,
                           std::span<const std::uint8_t> notify, std::span<const LocalRegion> mine,
                           std::span<const std::uint64_t> theirs);
  // The length of live region `id` in `table` (our regions_), 0 when there
  // is none: what a peer's run may name (wire::runs_fit).
  [[nodiscard]] static std::uint64_t live_len(std::span<const LocalRegion> table,
                                              std::uint64_t id) {
    const std::uint32_t slot = region_slot(id);
    if (slot >= table.size()) return 0;
    const LocalRegion& r = table[slot];
    return r.live && r.id == id ? r.len : 0;
  }

  std::string agent_name_;
  const ConnLimits limits_;
  const std::chrono::milliseconds stall_;  // KVXFER_TCP_STALL_MS
  // KVXFER_TCP_ENCRYPT=on: every connection after its welcome is TLS 1.3
  // (tcp_tls.h) from these contexts.
  const bool encrypt_;
  std::unique_ptr<TlsContext> tls_;
  Region region_;
  // The pool as a region (not live when there is none): what pool-only
  // posts (write_blocks, read_blocks) take without a lock.
  LocalRegion pool_;
  std::uint64_t token_ = 0;
  Identity identity_;
  std::uint16_t port_ = 0;
  std::vector<wire::TcpAddress> addresses_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  int epoll_fd_ = -1;

  // Initiator: our registrations of each target (engines/lineages.h).
  Lineages lineages_;

  // Commands for the I/O thread (new connections, transfers, closes).
  // `wake_pending_`: the thread was woken and has not drained the queue yet,
  // so a burst of posts wakes it once.
  Mutex commands_mu_;
  std::vector<Command> commands_ GUARDED_BY(commands_mu_);
  // Ended transfers whose buffers the next posts reuse (at most
  // kPooledXfers, each holding at most kPooledBytes), under commands_mu_;
  // and the one the next post takes without a lock, refilled from the pool
  // when a post is queued. So a post takes one lock of this lane.
  std::vector<Xfer*> xfer_pool_ GUARDED_BY(commands_mu_);
  std::atomic<Xfer*> spare_{nullptr};
  std::atomic<bool> wake_pending_{false};

  // Our regions by slot, the pool's at 0: read by posts (where their runs
  // are in our memory) and by the I/O thread (whether a peer's runs lie in
  // them), changed by add_region and remove_region. A post queues its
  // transfer holding it, so it comes before commands_mu_, never after.
  mutable Mutex regions_mu_ ACQUIRED_BEFORE(commands_mu_);
  std::vector<LocalRegion> regions_ GUARDED_BY(regions_mu_);

  // Connected peers (initiator side); a post finds its peer through its
  // handle, this is for counts and for stop().
  mutable Mutex peers_mu_;
  std::unordered_map<LanePeer*, std::shared_ptr<Peer>> peers_ GUARDED_BY(peers_mu_);

  // Registrations vouched for: by agent name, each registration's key.
  mutable Mutex vouched_mu_;
  // No key: the registration's peer runs no tcp lane, and its name is
  // nobody's here (no connection can prove it).
  std::map<std::string, std::map<PeerHandle, std::optional<IdentityKey>>> vouched_
      GUARDED_BY(vouched_mu_);
  std::unordered_map<PeerHandle, std::string> vouched_names_ GUARDED_BY(vouched_mu_);

  // Notifications taken from peers, per sender (the name and key its
  // connection's hello proved): a registered peer's share is its own, the
  // others share kMaxQueuedNotifications.
  using Sender = std::pair<std::string, IdentityKey>;
  Inbox<Sender> inbox_{kMaxQueuedPerSender, kMaxQueuedNotifications};

  std::atomic<std::uint64_t> live_xfers_{0};
  struct Counters;
  std::unique_ptr<Counters> counters_;

  std::unique_ptr<Io> io_;
  std::thread thread_;
  std::atomic<bool> stopped_{false};
};

}  // namespace kvxfer::internal::tcp
