// The UCX engine: one-sided WRITEs of KV blocks into a peer's registered pool.
//
// Two lanes, chosen per peer at connect():
//
// - kCma, for a peer on this host (same boot id and pid namespace) whose
//   UCX_TLS and ours both allow shared memory: process_vm_writev straight
//   into its pool, one iovec per run of consecutive blocks, in chunks run by
//   the engine's copier threads (so that posting does not wait for the copy)
//   and by callers of progress() (so that a spinning poller helps them).
//   Why not UCX here (measured with UCX 1.13, see docs/ucx-engine.md): a
//   ucp_put_nbx to user-registered memory over sm is "software emulation"
//   (an active message the target's worker copies out), never CMA; an sm
//   endpoint refuses UCP_ERR_HANDLING_MODE_PEER ("Destination is
//   unreachable"); and in UCP_ERR_HANDLING_MODE_NONE a SIGKILLed peer leaves
//   the flush pending forever while UCP_EP_CLOSE_FLAG_FORCE is refused
//   (INVALID_PARAM), so nothing can be reclaimed before the worker dies.
//   process_vm_writev is as fast for large blocks, needs no progress on the
//   target, and fails with ESRCH once the peer is gone.
//
// - kUcx, for everyone else: a UCP endpoint in UCP_ERR_HANDLING_MODE_PEER
//   whose error handler marks the peer failed, one ucp_put_nbx per run of
//   consecutive blocks, then one ucp_ep_flush_nbx whose completion means the
//   bytes are in the peer's memory. Writes made of many short runs (random
//   4 KiB blocks) go as scatter writes instead (wire/scatter.h): a few active
//   messages that each carry many runs, acked by the peer's handler once the
//   bytes are in place. Over TCP that is one send() per message, not per run.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/host.h"
#include "common/log.h"
#include "common/ucx_tls.h"
#include "engine.h"
#include "wire/ucx_blob.h"
#include "engines/ucx/ucx_compat.h"
#include "wire/scatter.h"

namespace kvxfer::internal {
namespace {

using Clock = std::chrono::steady_clock;

// How long disconnect() and shutdown() drive the worker for UCX to finish a
// forced close or cancel outstanding requests before giving up on them.
constexpr auto kDrainTimeout = std::chrono::seconds(10);
constexpr auto kWorkerFlushTimeout = std::chrono::milliseconds(500);
// The progress thread stays off the worker while a caller of progress()
// (poll) drives it, and until the caller has been away this long: two
// threads progressing one worker fight over its lock, which halved TCP
// throughput on 2 cores (a caller's progress() can itself run for ms).
constexpr std::int64_t kCallerGraceNs = 2'000'000;
// How long one progress() call may drive the worker.
constexpr std::int64_t kCallerProgressBudgetNs = 200'000;
// process_vm_writev takes at most UIO_MAXIOV iovecs per call.
constexpr std::size_t kMaxIov = 1024;
// The unit of CMA copy work a thread claims at a time: at most this many
// bytes (longer runs are split at post time) and kMaxIov iovecs. Several
// copiers, and a caller in progress(), can so share one large write.
constexpr std::size_t kChunkBytes = std::size_t{1} << 20;
// Scatter writes (kUcx lane): a write whose runs average at most this many
// bytes goes as scatter messages of about kScatterChunkBytes each. Both can be
// set per transport through engine_config (KVXFER_SCATTER_MAX_RUN,
// KVXFER_SCATTER_CHUNK; a max run of 0 turns scatter writes off).
constexpr std::uint64_t kScatterMaxRunBytes = 64 * 1024;
constexpr std::uint64_t kScatterChunkBytes = 256 * 1024;

const std::string& engine_name() {
  static const std::string name = "UCX";
  return name;
}

struct PidNamespace {
  std::uint64_t dev = 0;
  std::uint64_t ino = 0;
};

PidNamespace own_pid_namespace() {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return {};
  return {static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

std::uint64_t random_u64() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ static_cast<std::uint64_t>(rd());
}

// Whether this host has any RDMA device (where zero-copy matters).
bool has_rdma_device() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator();
}

// Statuses that say the peer's endpoint is gone: nothing more can land.
bool is_disconnect(ucs_status_t status) {
  return status == UCS_ERR_CONNECTION_RESET || status == UCS_ERR_ENDPOINT_TIMEOUT ||
         status == UCS_ERR_UNREACHABLE || status == UCS_ERR_REJECTED;
}

Status map_post_error(ucs_status_t status) {
  return is_disconnect(status) ? Status::kRemoteDisconnect : Status::kBackend;
}

// "262144", "256K", "1M": bytes. Throws on anything else.
std::uint64_t parse_size(const std::string& key, const std::string& text) {
  std::uint64_t value = 0;
  std::size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    if (value > (std::numeric_limits<std::uint64_t>::max() - 9) / 10) break;
    value = value * 10 + static_cast<std::uint64_t>(text[i] - '0');
  }
  std::uint64_t unit = 1;
  if (i < text.size() && i > 0) {
    const char u = text[i];
    unit = (u == 'k' || u == 'K')   ? 1024
           : (u == 'm' || u == 'M') ? 1024 * 1024
           : (u == 'g' || u == 'G') ? 1024 * 1024 * 1024
                                    : 0;
    ++i;
  }
  if (i == 0 || i != text.size() || unit == 0 ||
      value > std::numeric_limits<std::uint64_t>::max() / unit) {
    throw std::runtime_error(
        fmt::format("kvxfer UCX: engine_config {}={} is not a size (e.g. 65536, 64K, 1M, 1G)", key,
                    text));
  }
  return value * unit;
}

// Calls f(local_first, remote_first, count) once per run of blocks that are
// consecutive on both sides; stops early when f returns false.
template <typename F>
bool for_each_run(std::span<const std::int64_t> local, std::span<const std::int64_t> remote,
                  F&& f) {
  const std::size_t n = local.size();
  std::size_t i = 0;
  while (i < n) {
    std::size_t j = i + 1;
    while (j < n && local[j] == local[j - 1] + 1 && remote[j] == remote[j - 1] + 1) ++j;
    if (!f(local[i], remote[i], static_cast<std::uint64_t>(j - i))) return false;
    i = j;
  }
  return true;
}

// A page holding a random epoch while the engine is up. Peers on this host
// read it back before and after each write: a pid that was reused, or an
// engine that shut down (page unmapped or cleared), no longer matches.
class Cookie {
 public:
  Cookie() {
    void* page =
        ::mmap(nullptr, kPageLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) throw std::runtime_error("kvxfer UCX: mmap of the cookie page failed");
    word_ = static_cast<std::uint64_t*>(page);
    while (epoch_ == 0) epoch_ = random_u64();
    *word_ = epoch_;
  }
  ~Cookie() { retire(); }
  Cookie(const Cookie&) = delete;
  Cookie& operator=(const Cookie&) = delete;

  [[nodiscard]] std::uint64_t addr() const { return reinterpret_cast<std::uintptr_t>(word_); }
  [[nodiscard]] std::uint64_t epoch() const { return epoch_; }

  void retire() {
    if (word_ == nullptr) return;
    *word_ = 0;
    ::munmap(word_, kPageLen);
    word_ = nullptr;
  }

 private:
  static constexpr std::size_t kPageLen = 4096;
  std::uint64_t* word_ = nullptr;
  std::uint64_t epoch_ = 0;
};

// kSuccess when `pid` is the agent that published (addr, epoch); otherwise
// kRemoteDisconnect (gone, or its engine shut down), kNotAllowed (no ptrace
// permission, e.g. Yama) or kBackend.
Status read_cookie(pid_t pid, std::uint64_t addr, std::uint64_t epoch, int* err) {
  std::uint64_t value = 0;
  iovec local{&value, sizeof(value)};
  iovec remote{reinterpret_cast<void*>(addr), sizeof(value)};
  const ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
  *err = n < 0 ? errno : 0;
  if (n == static_cast<ssize_t>(sizeof(value))) {
    return value == epoch ? Status::kSuccess : Status::kRemoteDisconnect;
  }
  if (n < 0 && (errno == ESRCH || errno == EFAULT)) return Status::kRemoteDisconnect;
  if (n < 0 && errno == EPERM) return Status::kNotAllowed;
  return Status::kBackend;
}

class UcxEngine final : public Engine {
 public:
  explicit UcxEngine(const EngineConfig& config);
  ~UcxEngine() override { shutdown(); }
  UcxEngine(const UcxEngine&) = delete;
  UcxEngine& operator=(const UcxEngine&) = delete;

  [[nodiscard]] const std::string& name() const noexcept override { return engine_name(); }
  [[nodiscard]] std::vector<std::uint8_t> local_blob() const override { return blob_; }
  [[nodiscard]] Status connect(std::span<const std::uint8_t> blob, const RemoteRegion& remote,
                               PeerHandle* out) override;
  [[nodiscard]] Status disconnect(PeerHandle peer) override;
  [[nodiscard]] Status post_write(PeerHandle peer, TransferId id,
                                  std::span<const std::int64_t> local,
                                  std::span<const std::int64_t> remote, XferHandle* out) override;
  void progress() override;
  [[nodiscard]] Status check(XferHandle xfer, Status* state) override;
  [[nodiscard]] Status release(XferHandle xfer) override;
  [[nodiscard]] HandleCounts live() const override;
  [[nodiscard]] std::map<std::string, std::uint64_t> counters() const override;
  void shutdown() override;

 private:
  enum class Lane { kCma, kUcx };

  struct Peer {
    UcxEngine* engine = nullptr;
    Lane lane = Lane::kUcx;
    std::string agent_name;
    std::uint64_t remote_base = 0;
    std::uint64_t remote_block_len = 0;
    // kCma
    pid_t pid = 0;
    std::uint64_t cookie_addr = 0;
    std::uint64_t cookie_epoch = 0;
    int copies = 0;             // queued or running copies; under copy_mu_
    bool disconnected = false;  // under copy_mu_
    // kUcx
    ucp_ep_h ep = nullptr;
    ucp_rkey_h rkey = nullptr;
    bool scatter = false;  // its worker takes scatter writes
    // UCS_OK until the endpoint failed or the peer was found gone; then the
    // status that said so. Written from UCX callbacks, read anywhere.
    std::atomic<int> failure{UCS_OK};

    [[nodiscard]] bool failed() const { return failure.load(std::memory_order_acquire) != UCS_OK; }
  };

  // A transfer handle. Owned by the core until release(), and by whoever
  // moves its bytes (UCX until the flush completes, or a copier thread) until
  // they are done; whichever lets go last returns it to the pool.
  struct Xfer {
    UcxEngine* engine = nullptr;
    std::shared_ptr<Peer> peer;
    TransferId id = 0;
    std::atomic<int> result{UCS_INPROGRESS};  // ucs_status_t of the flush or copy
    std::atomic<int> refs{0};
    std::atomic<bool> held{false};  // between post_write() and release()
    // kCma: the copy, built by post_write and run by a copier thread. The
    // vectors keep their capacity when the handle is reused.
    std::vector<iovec> local_iov;
    std::vector<iovec> remote_iov;
    Xfer* next_copy = nullptr;
    // kCma, under copy_mu_: the first iovec no thread has claimed yet, the
    // chunks claimed and still copying, and the first chunk's failure.
    std::size_t next_iov = 0;
    int running = 0;
    int chunk_error = UCS_OK;
    // Scatter writes. slot is fixed at creation; the rest is under am_mu_:
    // am_seq is nonzero while acks are awaited (then the transfer holds a
    // reference for them), am_left counts the messages not yet acked.
    std::uint32_t slot = 0;
    std::uint64_t am_seq = 0;
    int am_left = 0;
    int am_status = UCS_OK;
    // The messages, built whole before the first is sent (UCX keeps pointers
    // into these until each send completes); capacity is kept on reuse.
    struct AmChunk {
      std::size_t header_offset = 0;
      std::size_t runs = 0;
      std::size_t iov_offset = 0;
    };
    std::vector<std::uint8_t> am_headers;
    std::vector<ucp_dt_iov_t> am_iov;
    std::vector<AmChunk> am_chunks;
  };

  // An ack on its way back to an initiator: UCX may hold its header until
  // the send completes, so it lives in a pool, not on the stack.
  struct AckMsg {
    UcxEngine* engine = nullptr;
    std::array<std::uint8_t, ucx::kAckLen> bytes{};
  };

  void init_ucx(const EngineConfig& config);
  void teardown_ucx();
  void flush_worker_before_destroy();
  void start_progress_thread();
  void stop_progress_thread();
  void progress_loop();

  Status connect_cma(Peer& peer);
  Status connect_ucx(Peer& peer, const ucx::Blob& blob);
  Status close_endpoint(Peer& peer);
  void post_cma(const std::shared_ptr<Peer>& peer, std::span<const std::int64_t> local,
                std::span<const std::int64_t> remote, Xfer* xfer);
  void start_copiers();
  void stop_copiers();
  void copier_loop();
  void run_chunk(std::unique_lock<std::mutex>& lock);
  ucs_status_t run_copy(Peer& peer, Xfer& xfer, std::size_t begin, std::size_t end);
  ucs_status_t cma_write(Peer& peer, std::span<iovec> local, std::span<iovec> remote);
  Status post_ucx(const std::shared_ptr<Peer>& peer, std::span<const std::int64_t> local,
                  std::span<const std::int64_t> remote, Xfer* xfer);
  bool flush(Peer& peer, Xfer* xfer, ucs_status_t* immediate);
  Status post_scatter(Peer& peer, std::span<const std::int64_t> local,
                      std::span<const std::int64_t> remote, Xfer* xfer);
  void fail_scatter(Xfer* xfer, ucs_status_t status);
  void end_scatter(Xfer* xfer, ucs_status_t status);
  void fail_peer_scatters(const Peer* peer, ucs_status_t status);
  void send_ack(const ucp_am_recv_param_t* param, const ucx::ScatterAck& ack);
  static ucs_status_t on_scatter_am(void* arg, const void* header, std::size_t header_length,
                                    void* data, std::size_t length,
                                    const ucp_am_recv_param_t* param);
  static ucs_status_t on_ack_am(void* arg, const void* header, std::size_t header_length,
                                void* data, std::size_t length, const ucp_am_recv_param_t* param);
  static void on_am_sent(void* request, ucs_status_t status, void* user_data);
  static void on_ack_sent(void* request, ucs_status_t status, void* user_data);
  void drain_requests(const char* why);

  Xfer* acquire_xfer();
  void unref(Xfer* xfer);
  static void on_flush(void* request, ucs_status_t status, void* user_data);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  std::string agent_name_;
  Region region_;
  std::string boot_id_;
  PidNamespace pidns_;
  bool accepts_cma_ = false;
  bool want_progress_thread_ = true;
  Cookie cookie_;

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_mem_h memh_ = nullptr;
  std::vector<std::uint8_t> blob_;

  // Progress thread: sleeps in epoll on the worker's event fd and wake_fd_.
  std::thread progress_thread_;
  std::atomic<bool> stop_{false};
  // Callers of progress() driving the worker now, and steady_clock ns of the
  // last such call's end.
  std::atomic<int> callers_progressing_{0};
  std::atomic<std::int64_t> caller_progress_ns_{std::numeric_limits<std::int64_t>::min() / 2};
  int epoll_fd_ = -1;
  int wake_fd_ = -1;

  // Peers by handle. Connect runs on the core's registration worker while
  // transfers run on callers' threads, so the map has its own lock. Never
  // taken inside a UCX callback.
  mutable std::mutex peers_mu_;
  std::unordered_map<PeerHandle, std::shared_ptr<Peer>> peers_;

  // Copier threads for kCma transfers, started with the first kCma peer.
  std::mutex copy_mu_;
  std::condition_variable copy_cv_;       // a copy was queued, or stop
  std::condition_variable copy_done_cv_;  // a peer's copies dropped to zero
  Xfer* copy_head_ = nullptr;
  Xfer* copy_tail_ = nullptr;
  std::atomic<bool> copies_queued_{false};  // copy_head_ != nullptr, read without copy_mu_
  bool copiers_stop_ = false;
  std::vector<std::thread> copiers_;
  int num_copiers_ = 1;

  // Transfer handles: a pool that only grows to the peak number in flight.
  std::mutex pool_mu_;
  std::deque<Xfer> xfers_;
  std::vector<Xfer*> free_xfers_;

  // Scatter writes. As initiator: transfers by slot, for the acks (which
  // name a slot and a sequence), under am_mu_ (taken after pool_mu_, never
  // before it). As target: whether the handler may write the region.
  std::uint64_t scatter_max_run_ = kScatterMaxRunBytes;
  std::uint64_t scatter_chunk_bytes_ = kScatterChunkBytes;
  std::size_t scatter_max_runs_ = ucx::kMaxScatterRuns;
  std::mutex am_mu_;
  std::vector<Xfer*> slots_;
  // Starts at random, so that no peer can guess another peer's sequences
  // and ack its writes.
  std::uint64_t next_am_seq_ = random_u64();
  std::atomic<bool> accepting_writes_{false};
  std::mutex ack_mu_;
  std::deque<AckMsg> acks_;
  std::vector<AckMsg*> free_acks_;

  std::atomic<std::uint64_t> live_rkeys_{0};
  std::atomic<std::uint64_t> live_transfers_{0};
  std::atomic<std::uint64_t> live_requests_{0};
  // Running totals for counters().
  std::atomic<std::uint64_t> cma_writes_{0};
  std::atomic<std::uint64_t> put_writes_{0};
  std::atomic<std::uint64_t> scatter_writes_{0};
  std::atomic<std::uint64_t> scatter_messages_{0};
  std::atomic<std::uint64_t> scatter_refused_{0};
  std::atomic<std::uint64_t> scatter_received_{0};
  std::atomic<std::uint64_t> scatter_rejected_{0};
  bool shut_down_ = false;
};

UcxEngine::UcxEngine(const EngineConfig& config)
    : agent_name_(config.agent_name),
      region_(config.region),
      boot_id_(boot_id()),
      pidns_(own_pid_namespace()) {
  if (config.options == nullptr) throw std::runtime_error("kvxfer UCX: no options");
  if (region_.base == nullptr || region_.num_blocks == 0 || region_.block_len == 0 ||
      region_.num_blocks > std::numeric_limits<std::uint64_t>::max() / region_.block_len) {
    throw std::runtime_error("kvxfer UCX: bad local region");
  }
  want_progress_thread_ = config.options->progress_thread;
  // Options::num_threads bounds the copier threads; more than the cores
  // would only make them take turns.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  num_copiers_ = std::clamp(config.options->num_threads, 1, cores);
  try {
    init_ucx(config);
    if (want_progress_thread_) start_progress_thread();
  } catch (...) {
    stop_progress_thread();
    teardown_ucx();
    throw;
  }
}

void UcxEngine::init_ucx(const EngineConfig& config) {
  // engine_config keys go to ucp_config_modify without the UCX_ prefix.
  std::map<std::string, std::string> overrides;
  for (const auto& [raw_key, value] : config.options->engine_config) {
    // kvxfer's own knobs; everything else is UCX's.
    if (raw_key == "KVXFER_SCATTER_MAX_RUN") {
      scatter_max_run_ = parse_size(raw_key, value);
      continue;
    }
    if (raw_key == "KVXFER_SCATTER_CHUNK") {
      scatter_chunk_bytes_ = parse_size(raw_key, value);
      if (scatter_chunk_bytes_ < 4096 || scatter_chunk_bytes_ > (std::uint64_t{64} << 20)) {
        throw std::runtime_error(fmt::format(
            "kvxfer UCX: engine_config KVXFER_SCATTER_CHUNK={} is outside 4K..64M", value));
      }
      continue;
    }
    std::string_view key = raw_key;
    if (key.starts_with("UCX_")) key.remove_prefix(4);
    overrides[std::string(key)] = value;
  }
  const char* env_tls = std::getenv("UCX_TLS");
  std::string tls = env_tls != nullptr ? env_tls : "all";
  if (auto it = overrides.find("TLS"); it != overrides.end()) tls = it->second;

  // UCX 1.13 emulates puts over TCP with active messages of TX_SEG_SIZE
  // bytes (8K by default): 64K moved 2 MiB blocks 2.3x faster here, and does
  // not exceed the default RX_SEG_SIZE (64K) of a peer left at defaults.
  // (1.13 applies transport keys without their TCP_ prefix, and warns when
  // no transport in use takes them, hence only when tcp may be.)
  const bool user_set_seg = std::getenv("UCX_TCP_TX_SEG_SIZE") != nullptr ||
                            overrides.contains("TX_SEG_SIZE") ||
                            overrides.contains("TCP_TX_SEG_SIZE");
  if (!user_set_seg && tls_allows(tls, {"tcp"})) {
    overrides["TX_SEG_SIZE"] = "64K";
  }
  // A larger receive segment lets one recv() take several 64K active
  // messages (the perftest-measured lever of docs/performance.md).
  const bool user_set_rx = std::getenv("UCX_TCP_RX_SEG_SIZE") != nullptr ||
                           overrides.contains("RX_SEG_SIZE") ||
                           overrides.contains("TCP_RX_SEG_SIZE");
  if (!user_set_rx && tls_allows(tls, {"tcp"})) {
    overrides["RX_SEG_SIZE"] = "256K";
  }
  // Zero-copy sends over TCP: UCX 1.13 can leave a freed TCP endpoint in its
  // event set when an endpoint is force-closed while a multi-fragment
  // zero-copy active message is still going out (our scatter writes); the
  // next event on that socket then calls through freed memory (6 crashes in
  // 20 runs of UcxScatterTest.DisconnectEndsEveryScatterWriteStillAwaitingAcks,
  // 0 in 20 with copies). Over TCP the copy costs nothing measurable (bench,
  // both ways within noise), so where TCP is the only network (no RDMA
  // device), sends copy. A user's own ZCOPY_THRESH wins.
  const bool user_set_zcopy =
      std::getenv("UCX_ZCOPY_THRESH") != nullptr || overrides.contains("ZCOPY_THRESH");
  if (!user_set_zcopy && tls_allows(tls, {"tcp"}) && !has_rdma_device()) {
    overrides["ZCOPY_THRESH"] = "inf";
  }
  // TCP keepalive turns a silent idle peer (host gone, link cut) into an
  // endpoint error, hence REMOTE_DISCONNECT: UCX's defaults (idle 10 s, then
  // the system's 9 probes 2 s apart) take about 28 s; these take 10 s (5 s
  // idle + 5 probes 1 s apart). A peer with data in flight is never probed
  // (Linux holds keepalive while data is unacknowledged): stall_timeout bounds
  // that case. See docs/reliability.md. Each key only when the user set none.
  if (tls_allows(tls, {"tcp"})) {
    for (const auto& [key, value] : {std::pair<std::string, std::string>{"KEEPIDLE", "5s"},
                                     {"KEEPINTVL", "1s"},
                                     {"KEEPCNT", "5"}}) {
      const std::string env = "UCX_TCP_" + key;
      if (std::getenv(env.c_str()) == nullptr && !overrides.contains(key) &&
          !overrides.contains("TCP_" + key)) {
        overrides[key] = value;
      }
    }
  }
  // Read only now: the checks above may throw.
  ucp_config_t* ucp_config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &ucp_config);
  if (st != UCS_OK) {
    throw std::runtime_error(
        fmt::format("kvxfer UCX: ucp_config_read failed: {}", ucs_status_string(st)));
  }
  for (const auto& [key, value] : overrides) {
    st = ucp_config_modify(ucp_config, key.c_str(), value.c_str());
    if (st != UCS_OK) {
      ucp_config_release(ucp_config);
      throw std::runtime_error(fmt::format("kvxfer UCX: engine_config {}={} rejected: {}", key,
                                           value, ucs_status_string(st)));
    }
  }
  accepts_cma_ = tls_allows(tls, {"sm", "shm", "cma"});

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = agent_name_.c_str();
  st = ucp_init(&params, ucp_config, &context_);
  ucp_config_release(ucp_config);
  if (st != UCS_OK) {
    context_ = nullptr;
    throw std::runtime_error(fmt::format("kvxfer UCX: ucp_init failed: {}", ucs_status_string(st)));
  }

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_MULTI;
  st = ucp_worker_create(context_, &wparams, &worker_);
  if (st != UCS_OK) {
    worker_ = nullptr;
    throw std::runtime_error(
        fmt::format("kvxfer UCX: ucp_worker_create failed: {}", ucs_status_string(st)));
  }
  ucp_worker_attr_t wattr{};
  wattr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE | UCP_WORKER_ATTR_FIELD_ADDRESS |
                     UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  st = ucp_worker_query(worker_, &wattr);
  if (st != UCS_OK) {
    throw std::runtime_error(
        fmt::format("kvxfer UCX: ucp_worker_query failed: {}", ucs_status_string(st)));
  }
  const std::span<const std::uint8_t> address(reinterpret_cast<const std::uint8_t*>(wattr.address),
                                              wattr.address_length);
  std::vector<std::uint8_t> address_copy(address.begin(), address.end());
  ucp_worker_release_address(worker_, wattr.address);
  // The progress thread and the callers' threads share the worker.
  if (wattr.thread_mode != UCS_THREAD_MODE_MULTI) {
    throw std::runtime_error("kvxfer UCX: this UCX build has no UCS_THREAD_MODE_MULTI workers");
  }
  // A scatter message's header lists its runs, so UCX's header limit bounds
  // the runs per message; a limit too small for a few runs turns them off.
  if (wattr.max_am_header >= ucx::scatter_header_len(8)) {
    scatter_max_runs_ = std::min(ucx::kMaxScatterRuns,
                                 (wattr.max_am_header - ucx::kScatterFixedLen) / ucx::kScatterRunLen);
  } else {
    scatter_max_run_ = 0;
  }
  for (const auto& [id, cb] : {std::pair<unsigned, ucp_am_recv_callback_t>{ucx::kScatterAmId,
                                                                           &UcxEngine::on_scatter_am},
                               {ucx::kScatterAckAmId, &UcxEngine::on_ack_am}}) {
    ucp_am_handler_param_t hparams{};
    hparams.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                         UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hparams.id = id;
    hparams.cb = cb;
    hparams.arg = this;
    st = ucp_worker_set_am_recv_handler(worker_, &hparams);
    if (st != UCS_OK) {
      throw std::runtime_error(fmt::format("kvxfer UCX: setting an active message handler failed: {}",
                                           ucs_status_string(st)));
    }
  }

  ucp_mem_map_params_t mparams{};
  mparams.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mparams.address = region_.base;
  mparams.length = region_.num_blocks * region_.block_len;
  st = ucp_mem_map(context_, &mparams, &memh_);
  if (st != UCS_OK) {
    memh_ = nullptr;
    throw std::runtime_error(
        fmt::format("kvxfer UCX: ucp_mem_map failed: {}", ucs_status_string(st)));
  }
  void* rkey_buffer = nullptr;
  std::size_t rkey_len = 0;
  st = ucx_compat::pack_rkey(context_, memh_, &rkey_buffer, &rkey_len);
  if (st != UCS_OK) {
    throw std::runtime_error(
        fmt::format("kvxfer UCX: packing the pool's rkey failed: {}", ucs_status_string(st)));
  }
  ucx::Blob blob;
  blob.flags = static_cast<std::uint16_t>((accepts_cma_ ? ucx::kBlobAcceptsCma : 0) |
                                          ucx::kBlobAcceptsScatter);
  blob.pidns_dev = pidns_.dev;
  blob.pidns_ino = pidns_.ino;
  blob.cookie_addr = cookie_.addr();
  blob.cookie_epoch = cookie_.epoch();
  blob.worker_address = address_copy;
  blob.rkey = {static_cast<const std::uint8_t*>(rkey_buffer), rkey_len};
  blob_ = ucx::encode_blob(blob);
  ucx_compat::release_packed_rkey(rkey_buffer);
  accepting_writes_.store(true, std::memory_order_release);
}

// UCX 1.13 asserts (and aborts the process) in ucp_worker_destroy when a
// wireup message, e.g. the reply to a peer that just connected, is still
// pending on a TCP endpoint UCX created for that peer ("got REP message" in
// the pending purge; the assertion was dropped upstream in 2022). Flushing the
// worker first sends or fails those messages. Bounded: a dead peer must not
// hold up close().
void UcxEngine::flush_worker_before_destroy() {
  ucp_request_param_t param{};
  void* request = ucp_worker_flush_nbx(worker_, &param);
  if (request == nullptr) return;
  if (UCS_PTR_IS_ERR(request)) {
    log().debug("kvxfer UCX {}: worker flush before destroy: {}", agent_name_,
                ucs_status_string(UCS_PTR_STATUS(request)));
    return;
  }
  const auto deadline = Clock::now() + kWorkerFlushTimeout;
  while (ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < deadline) {
    ucp_worker_progress(worker_);
  }
  if (ucp_request_check_status(request) == UCS_INPROGRESS) {
    log().debug("kvxfer UCX {}: worker flush before destroy did not finish in time", agent_name_);
  }
  ucp_request_free(request);
}

void UcxEngine::teardown_ucx() {
  accepting_writes_.store(false, std::memory_order_release);
  if (memh_ != nullptr) {
    if (const ucs_status_t st = ucp_mem_unmap(context_, memh_); st != UCS_OK) {
      log().error("kvxfer UCX {}: ucp_mem_unmap failed: {}", agent_name_, ucs_status_string(st));
    }
    memh_ = nullptr;
  }
  cookie_.retire();
  // Destroying the worker completes whatever UCX still holds with
  // UCS_ERR_CANCELED, which returns the last transfer handles to the pool.
  if (worker_ != nullptr) {
    flush_worker_before_destroy();
    ucp_worker_destroy(worker_);
    worker_ = nullptr;
  }
  if (context_ != nullptr) {
    ucp_cleanup(context_);
    context_ = nullptr;
  }
}

// ---------------------------------------------------------------------------
// Progress thread
// ---------------------------------------------------------------------------

void UcxEngine::start_progress_thread() {
  int worker_fd = -1;
  ucs_status_t st = ucp_worker_get_efd(worker_, &worker_fd);
  if (st != UCS_OK) {
    throw std::runtime_error(
        fmt::format("kvxfer UCX: ucp_worker_get_efd failed: {}", ucs_status_string(st)));
  }
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    throw std::runtime_error(fmt::format("kvxfer UCX: epoll/eventfd: {}", std::strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = worker_fd;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, worker_fd, &ev) != 0) {
    throw std::runtime_error(fmt::format("kvxfer UCX: epoll_ctl: {}", std::strerror(errno)));
  }
  ev.data.fd = wake_fd_;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) {
    throw std::runtime_error(fmt::format("kvxfer UCX: epoll_ctl: {}", std::strerror(errno)));
  }
  stop_.store(false);
  progress_thread_ = std::thread([this] { progress_loop(); });
}

void UcxEngine::progress_loop() {
  // Sleeps until the worker has something to do: a spinning progress thread
  // costs 2-3x throughput when cores are few.
  std::array<epoll_event, 4> events{};
  while (!stop_.load(std::memory_order_acquire)) {
    const std::int64_t since_caller =
        callers_progressing_.load(std::memory_order_relaxed) > 0
            ? 0
            : now_ns() - caller_progress_ns_.load(std::memory_order_relaxed);
    if (since_caller < kCallerGraceNs) {
      // A caller is driving the worker: wait (for stop, or until the caller
      // has been away a grace period) without touching it.
      pollfd wake{wake_fd_, POLLIN, 0};
      const auto wait_ms = static_cast<int>((kCallerGraceNs - since_caller + 999'999) / 1'000'000);
      if (::poll(&wake, 1, std::max(wait_ms, 1)) > 0) {
        std::uint64_t count = 0;
        [[maybe_unused]] const ssize_t r = ::read(wake_fd_, &count, sizeof(count));
      }
      continue;
    }
    while (ucp_worker_progress(worker_) != 0) {
    }
    const ucs_status_t st = ucp_worker_arm(worker_);
    if (st == UCS_ERR_BUSY) continue;  // events arrived meanwhile
    // An arm failure would make the fd useless; fall back to a slow poll.
    const int timeout_ms = st == UCS_OK ? -1 : 1;
    const int n =
        ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout_ms);
    for (int i = 0; i < n; ++i) {
      if (events[static_cast<std::size_t>(i)].data.fd == wake_fd_) {
        std::uint64_t count = 0;
        [[maybe_unused]] const ssize_t r = ::read(wake_fd_, &count, sizeof(count));
      }
    }
  }
}

void UcxEngine::stop_progress_thread() {
  if (progress_thread_.joinable()) {
    stop_.store(true, std::memory_order_release);
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t w = ::write(wake_fd_, &one, sizeof(one));
    progress_thread_.join();
  }
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  epoll_fd_ = wake_fd_ = -1;
}

void UcxEngine::progress() {
  // A caller that polls while CMA copies wait lends its thread to one chunk
  // of them, instead of spinning on a core the copier threads need.
  if (copies_queued_.load(std::memory_order_relaxed)) {
    std::unique_lock lock(copy_mu_);
    if (copy_head_ != nullptr) run_chunk(lock);
  }
  if (worker_ == nullptr) return;
  if (progress_thread_.joinable()) {
    // Same-host (CMA) peers need no worker progress; UCX peers (one rkey
    // each) do, and the polling caller then takes it over from the thread.
    if (live_rkeys_.load(std::memory_order_relaxed) == 0) return;
    callers_progressing_.fetch_add(1, std::memory_order_relaxed);
    // Bounded: the core holds its lock around this, and a busy worker
    // always has more to do; the next poll() goes on.
    const std::int64_t start = now_ns();
    std::int64_t end = start;
    for (unsigned n = 1; ucp_worker_progress(worker_) != 0; ++n) {
      if (n % 8 == 0 && (end = now_ns()) - start > kCallerProgressBudgetNs) break;
    }
    caller_progress_ns_.store(std::max(end, now_ns()), std::memory_order_relaxed);
    callers_progressing_.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  while (ucp_worker_progress(worker_) != 0) {
  }
}

// ---------------------------------------------------------------------------
// Peers
// ---------------------------------------------------------------------------

Status UcxEngine::connect(std::span<const std::uint8_t> blob, const RemoteRegion& remote,
                          PeerHandle* out) {
  ucx::Blob b;
  if (!ucx::decode_blob(blob, &b)) {
    log().warn("kvxfer UCX {}: peer {} sent a malformed engine blob ({} bytes)", agent_name_,
               remote.agent_name, blob.size());
    return Status::kInvalidParam;
  }
  if (remote.num_blocks == 0 || remote.block_len == 0 ||
      remote.num_blocks > std::numeric_limits<std::uint64_t>::max() / remote.block_len ||
      remote.base_addr >
          std::numeric_limits<std::uint64_t>::max() - remote.num_blocks * remote.block_len) {
    log().warn("kvxfer UCX {}: peer {} has an impossible region", agent_name_, remote.agent_name);
    return Status::kInvalidParam;
  }
  auto peer = std::make_shared<Peer>();
  peer->engine = this;
  peer->agent_name = remote.agent_name;
  peer->remote_base = remote.base_addr;
  peer->remote_block_len = remote.block_len;
  peer->pid = static_cast<pid_t>(remote.pid);
  peer->cookie_addr = b.cookie_addr;
  peer->cookie_epoch = b.cookie_epoch;

  const bool same_host = !boot_id_.empty() && remote.boot_id == boot_id_ && remote.pid != 0 &&
                         pidns_.ino != 0 && b.pidns_dev == pidns_.dev && b.pidns_ino == pidns_.ino;
  bool connected = false;
  if (same_host && accepts_cma_ && (b.flags & ucx::kBlobAcceptsCma) != 0) {
    const Status st = connect_cma(*peer);
    if (st == Status::kSuccess) {
      start_copiers();
      connected = true;
    } else if (st == Status::kRemoteDisconnect) {
      return st;
    }
    // Anything else (no ptrace permission, seccomp): UCX may still reach it.
  }
  if (!connected) {
    if (const Status st = connect_ucx(*peer, b); st != Status::kSuccess) return st;
  }
  const auto handle = reinterpret_cast<PeerHandle>(peer.get());
  {
    std::lock_guard lock(peers_mu_);
    peers_.emplace(handle, std::move(peer));
  }
  *out = handle;
  return Status::kSuccess;
}

Status UcxEngine::connect_cma(Peer& peer) {
  int err = 0;
  const Status st = read_cookie(peer.pid, peer.cookie_addr, peer.cookie_epoch, &err);
  if (st == Status::kSuccess) {
    peer.lane = Lane::kCma;
    log().info("kvxfer UCX {}: peer {} (pid {}) is on this host: writing with process_vm_writev",
               agent_name_, peer.agent_name, peer.pid);
  } else if (st == Status::kRemoteDisconnect) {
    log().warn("kvxfer UCX {}: peer {} (pid {}) is gone: {}", agent_name_, peer.agent_name,
               peer.pid, err != 0 ? std::strerror(err) : "its engine's cookie does not match");
  } else {
    log().info(
        "kvxfer UCX {}: peer {} (pid {}) is on this host but process_vm_readv fails ({}); "
        "using a UCX endpoint",
        agent_name_, peer.agent_name, peer.pid, std::strerror(err));
  }
  return st;
}

Status UcxEngine::connect_ucx(Peer& peer, const ucx::Blob& blob) {
  if (blob.worker_address.empty() || blob.rkey.empty()) {
    log().warn("kvxfer UCX {}: peer {} sent no worker address or rkey", agent_name_,
               peer.agent_name);
    return Status::kInvalidParam;
  }
  peer.lane = Lane::kUcx;
  peer.scatter = (blob.flags & ucx::kBlobAcceptsScatter) != 0 && scatter_max_run_ > 0;
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(blob.worker_address.data());
  // PEER mode: a failed peer completes our requests with an error and calls
  // on_ep_error, instead of leaving them pending forever.
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxEngine::on_ep_error;
  params.err_handler.arg = &peer;
  ucs_status_t st = ucp_ep_create(worker_, &params, &peer.ep);
  if (st != UCS_OK) {
    peer.ep = nullptr;
    log().warn(
        "kvxfer UCX {}: cannot create an endpoint to peer {}: {} (a transport with peer-failure "
        "support, e.g. tcp, must reach it; shared memory serves same-host peers only through "
        "process_vm_writev)",
        agent_name_, peer.agent_name, ucs_status_string(st));
    return st == UCS_ERR_UNREACHABLE ? Status::kNotSupported : Status::kBackend;
  }
  st = ucp_ep_rkey_unpack(peer.ep, blob.rkey.data(), &peer.rkey);
  if (st != UCS_OK) {
    peer.rkey = nullptr;
    log().warn("kvxfer UCX {}: cannot unpack the rkey of peer {}: {}", agent_name_, peer.agent_name,
               ucs_status_string(st));
    [[maybe_unused]] const Status closed = close_endpoint(peer);
    return Status::kInvalidParam;
  }
  live_rkeys_.fetch_add(1, std::memory_order_relaxed);
  return Status::kSuccess;
}

void UcxEngine::on_ep_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  int expected = UCS_OK;
  peer->failure.compare_exchange_strong(expected, status, std::memory_order_acq_rel);
  log().warn("kvxfer UCX: endpoint to peer {} failed: {}", peer->agent_name,
             ucs_status_string(status));
  // Acks will not come through a failed endpoint.
  peer->engine->fail_peer_scatters(peer, status);
}

Status UcxEngine::close_endpoint(Peer& peer) {
  if (peer.ep == nullptr) return Status::kSuccess;
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = UCP_EP_CLOSE_FLAG_FORCE;  // completes its requests with UCS_ERR_CANCELED
  ucs_status_ptr_t request = ucp_ep_close_nbx(peer.ep, &params);
  peer.ep = nullptr;
  ucs_status_t st = UCS_OK;
  if (UCS_PTR_IS_ERR(request)) {
    st = UCS_PTR_STATUS(request);
  } else if (request != nullptr) {
    live_requests_.fetch_add(1, std::memory_order_relaxed);
    const auto deadline = Clock::now() + kDrainTimeout;
    while ((st = ucp_request_check_status(request)) == UCS_INPROGRESS && Clock::now() < deadline) {
      ucp_worker_progress(worker_);
    }
    // Freed even if still in progress: UCX then releases it on completion.
    ucp_request_free(request);
    live_requests_.fetch_sub(1, std::memory_order_relaxed);
  }
  if (st != UCS_OK) {
    log().error("kvxfer UCX {}: closing the endpoint to peer {} failed: {}", agent_name_,
                peer.agent_name, ucs_status_string(st));
    return Status::kBackend;
  }
  return Status::kSuccess;
}

Status UcxEngine::disconnect(PeerHandle handle) {
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard lock(peers_mu_);
    auto it = peers_.find(handle);
    if (it == peers_.end()) return Status::kNotFound;
    peer = std::move(it->second);
    peers_.erase(it);
  }
  if (peer->lane == Lane::kCma) {
    // Queued copies are cancelled when a copier picks them up; a running one
    // finishes. Either way none is left once this returns.
    std::unique_lock lock(copy_mu_);
    peer->disconnected = true;
    copy_done_cv_.wait(lock, [&] { return peer->copies == 0; });
    return Status::kSuccess;
  }
  // The endpoint goes first: the forced close cancels every request still
  // using the rkey, after which the rkey can go. Both are attempted.
  const Status closed = close_endpoint(*peer);
  fail_peer_scatters(peer.get(), UCS_ERR_CANCELED);
  // The forced close completes the peer's requests, but their callbacks may
  // still be finishing on the progress thread. Every in-flight transfer holds
  // the peer, so wait (bounded) until none does: a disconnect then leaves no
  // live request behind.
  const auto deadline = Clock::now() + kWorkerFlushTimeout;
  while (peer.use_count() > 1 && Clock::now() < deadline) {
    ucp_worker_progress(worker_);
    std::this_thread::yield();
  }
  if (peer->rkey != nullptr) {
    ucp_rkey_destroy(peer->rkey);  // cannot fail
    peer->rkey = nullptr;
    live_rkeys_.fetch_sub(1, std::memory_order_relaxed);
  }
  return closed;
}

// ---------------------------------------------------------------------------
// Transfers
// ---------------------------------------------------------------------------

UcxEngine::Xfer* UcxEngine::acquire_xfer() {
  std::lock_guard lock(pool_mu_);
  if (free_xfers_.empty()) {
    Xfer& x = xfers_.emplace_back();
    x.engine = this;
    std::lock_guard am_lock(am_mu_);
    x.slot = static_cast<std::uint32_t>(slots_.size());
    slots_.push_back(&x);
    return &x;
  }
  Xfer* x = free_xfers_.back();
  free_xfers_.pop_back();
  return x;
}

void UcxEngine::unref(Xfer* xfer) {
  if (xfer->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  xfer->peer.reset();
  std::lock_guard lock(pool_mu_);
  free_xfers_.push_back(xfer);
}

void UcxEngine::on_flush(void* request, ucs_status_t status, void* user_data) {
  auto* xfer = static_cast<Xfer*>(user_data);
  UcxEngine* engine = xfer->engine;
  xfer->result.store(status, std::memory_order_release);
  ucp_request_free(request);
  engine->live_requests_.fetch_sub(1, std::memory_order_relaxed);
  engine->unref(xfer);
}

Status UcxEngine::post_write(PeerHandle handle, TransferId id, std::span<const std::int64_t> local,
                             std::span<const std::int64_t> remote, XferHandle* out) {
  if (local.size() != remote.size() || local.empty()) return Status::kInvalidParam;
  std::shared_ptr<Peer> peer;
  {
    // The core only posts to peers it connected and has not disconnected, so
    // this lookup exists to hand transfers a reference, not to validate.
    std::lock_guard lock(peers_mu_);
    auto it = peers_.find(handle);
    if (it == peers_.end()) return Status::kNotFound;
    peer = it->second;
  }
  if (peer->failed()) return Status::kRemoteDisconnect;

  Xfer* xfer = acquire_xfer();
  xfer->id = id;
  xfer->held.store(true, std::memory_order_relaxed);
  if (peer->lane == Lane::kCma) {
    post_cma(peer, local, remote, xfer);
    cma_writes_.fetch_add(1, std::memory_order_relaxed);
  } else {
    const Status st = post_ucx(peer, local, remote, xfer);
    if (st != Status::kSuccess) {
      xfer->held.store(false, std::memory_order_relaxed);  // post_ucx disposed of it
      return st;
    }
  }
  live_transfers_.fetch_add(1, std::memory_order_relaxed);
  *out = reinterpret_cast<XferHandle>(xfer);
  return Status::kSuccess;
}

void UcxEngine::post_cma(const std::shared_ptr<Peer>& peer, std::span<const std::int64_t> local,
                         std::span<const std::int64_t> remote, Xfer* xfer) {
  xfer->peer = peer;
  xfer->result.store(UCS_INPROGRESS, std::memory_order_relaxed);
  xfer->refs.store(2, std::memory_order_relaxed);  // the core's and the copier's
  xfer->local_iov.clear();
  xfer->remote_iov.clear();
  auto* const base = static_cast<std::uint8_t*>(region_.base);
  const std::uint64_t block_len = region_.block_len;
  for_each_run(local, remote, [&](std::int64_t l, std::int64_t r, std::uint64_t count) {
    // A run longer than a chunk becomes several iovecs, so that no claim
    // exceeds kChunkBytes.
    auto* src = base + static_cast<std::uint64_t>(l) * block_len;
    auto dst = peer->remote_base + static_cast<std::uint64_t>(r) * peer->remote_block_len;
    for (std::size_t left = count * block_len; left > 0;) {
      const std::size_t len = std::min(left, kChunkBytes);
      xfer->local_iov.push_back({src, len});
      xfer->remote_iov.push_back({reinterpret_cast<void*>(dst), len});
      src += len;
      dst += len;
      left -= len;
    }
    return true;
  });
  live_requests_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(copy_mu_);
    ++peer->copies;
    xfer->next_iov = 0;
    xfer->running = 0;
    xfer->chunk_error = UCS_OK;
    xfer->next_copy = nullptr;
    (copy_tail_ != nullptr ? copy_tail_->next_copy : copy_head_) = xfer;
    copy_tail_ = xfer;
    copies_queued_.store(true, std::memory_order_relaxed);
  }
  copy_cv_.notify_one();
}

void UcxEngine::start_copiers() {
  std::lock_guard lock(copy_mu_);
  if (!copiers_.empty() || copiers_stop_) return;
  for (int i = 0; i < num_copiers_; ++i) copiers_.emplace_back([this] { copier_loop(); });
}

void UcxEngine::stop_copiers() {
  {
    std::lock_guard lock(copy_mu_);
    copiers_stop_ = true;
  }
  copy_cv_.notify_all();
  for (auto& t : copiers_) t.join();
  copiers_.clear();
}

void UcxEngine::copier_loop() {
  std::unique_lock lock(copy_mu_);
  for (;;) {
    copy_cv_.wait(lock, [this] { return copy_head_ != nullptr || copiers_stop_; });
    if (copy_head_ == nullptr) return;  // stopping, and nothing left to finish
    run_chunk(lock);
  }
}

// Claims the next chunk of the transfer at the head of the queue and copies
// it; whoever finishes a transfer's last chunk completes the transfer.
// Called, and returns, with copy_mu_ held through `lock`; copy_head_ is set.
void UcxEngine::run_chunk(std::unique_lock<std::mutex>& lock) {
  Xfer* xfer = copy_head_;
  Peer& peer = *xfer->peer;
  const std::size_t n = xfer->local_iov.size();
  const std::size_t begin = xfer->next_iov;
  std::size_t end = begin;
  for (std::size_t bytes = 0; end < n && end - begin < kMaxIov; ++end) {
    bytes += xfer->local_iov[end].iov_len;
    if (end > begin && bytes > kChunkBytes) break;
  }
  xfer->next_iov = end;
  if (end == n) {  // fully claimed: the next transfer is up
    copy_head_ = xfer->next_copy;
    if (copy_head_ == nullptr) {
      copy_tail_ = nullptr;
      copies_queued_.store(false, std::memory_order_relaxed);
    }
  }
  ++xfer->running;
  const bool cancelled = peer.disconnected || copiers_stop_ || xfer->chunk_error != UCS_OK;
  if (copy_head_ != nullptr) copy_cv_.notify_one();  // more to claim: another copier may help
  lock.unlock();
  const ucs_status_t result = cancelled ? UCS_ERR_CANCELED : run_copy(peer, *xfer, begin, end);
  lock.lock();
  if (result != UCS_OK && xfer->chunk_error == UCS_OK) xfer->chunk_error = result;
  if (--xfer->running > 0 || xfer->next_iov < n) return;  // its other chunks finish it
  ucs_status_t final_result = static_cast<ucs_status_t>(xfer->chunk_error);
  lock.unlock();
  // Every chunk landed: the cookie must still read back (run_copy of none).
  if (final_result == UCS_OK) final_result = run_copy(peer, *xfer, n, n);
  xfer->result.store(final_result, std::memory_order_release);
  live_requests_.fetch_sub(1, std::memory_order_relaxed);
  lock.lock();
  if (--peer.copies == 0) copy_done_cv_.notify_all();
  lock.unlock();
  unref(xfer);
  lock.lock();
}

// Copies iovecs [begin, end) of a transfer after reading the peer's cookie;
// with begin == end, only reads the cookie. A transfer's cookie is read
// before each chunk, so a reused pid is never written, and once after its
// last chunk, so a peer that died or shut its engine down during the copy
// does not count it as landed.
ucs_status_t UcxEngine::run_copy(Peer& peer, Xfer& xfer, std::size_t begin, std::size_t end) {
  if (peer.failed()) return UCS_ERR_CONNECTION_RESET;
  int err = 0;
  const Status st = read_cookie(peer.pid, peer.cookie_addr, peer.cookie_epoch, &err);
  ucs_status_t result = UCS_OK;
  if (st == Status::kSuccess) {
    for (std::size_t i = begin; i < end && result == UCS_OK; i += kMaxIov) {
      const std::size_t k = std::min(kMaxIov, end - i);
      result = cma_write(peer, {xfer.local_iov.data() + i, k}, {xfer.remote_iov.data() + i, k});
    }
  }
  if (st == Status::kRemoteDisconnect) result = UCS_ERR_CONNECTION_RESET;
  if (st == Status::kNotAllowed || st == Status::kBackend) {
    log().warn("kvxfer UCX {}: process_vm_readv from peer {} (pid {}) failed: {}", agent_name_,
               peer.agent_name, peer.pid, std::strerror(err));
    result = UCS_ERR_IO_ERROR;
  }
  if (is_disconnect(result)) {
    int expected = UCS_OK;
    if (peer.failure.compare_exchange_strong(expected, result)) {
      log().warn("kvxfer UCX {}: peer {} (pid {}) is gone", agent_name_, peer.agent_name, peer.pid);
    }
  }
  return result;
}

ucs_status_t UcxEngine::cma_write(Peer& peer, std::span<iovec> local, std::span<iovec> remote) {
  // Runs have equal lengths on both sides, so a short write advances both
  // lists by the same bytes.
  std::size_t i = 0;
  while (i < local.size()) {
    const ssize_t n = ::process_vm_writev(peer.pid, &local[i], local.size() - i, &remote[i],
                                          remote.size() - i, 0);
    if (n < 0) {
      const int err = errno;
      if (err == ESRCH) return UCS_ERR_CONNECTION_RESET;
      if (err == EFAULT) {
        // Our pool is mapped, so the fault is on the peer's side: gone or
        // shut down unless its cookie still reads back.
        int cookie_err = 0;
        if (read_cookie(peer.pid, peer.cookie_addr, peer.cookie_epoch, &cookie_err) !=
            Status::kSuccess) {
          return UCS_ERR_CONNECTION_RESET;
        }
      }
      log().warn("kvxfer UCX {}: process_vm_writev to peer {} failed: {}", agent_name_,
                 peer.agent_name, std::strerror(err));
      return UCS_ERR_IO_ERROR;
    }
    if (n == 0) return UCS_ERR_IO_ERROR;
    auto left = static_cast<std::size_t>(n);
    while (i < local.size() && left >= local[i].iov_len) {
      left -= local[i].iov_len;
      ++i;
    }
    if (left > 0) {
      local[i].iov_base = static_cast<std::uint8_t*>(local[i].iov_base) + left;
      local[i].iov_len -= left;
      remote[i].iov_base = static_cast<std::uint8_t*>(remote[i].iov_base) + left;
      remote[i].iov_len -= left;
    }
  }
  return UCS_OK;
}

Status UcxEngine::post_ucx(const std::shared_ptr<Peer>& peer, std::span<const std::int64_t> local,
                           std::span<const std::int64_t> remote, Xfer* xfer) {
  Peer& p = *peer;
  xfer->peer = peer;
  xfer->result.store(UCS_INPROGRESS, std::memory_order_relaxed);
  if (p.scatter) {
    std::size_t runs = 0;
    for_each_run(local, remote, [&](std::int64_t, std::int64_t, std::uint64_t) {
      ++runs;
      return true;
    });
    if (runs > 1 && local.size() * region_.block_len <= runs * scatter_max_run_) {
      return post_scatter(p, local, remote, xfer);
    }
  }

  put_writes_.fetch_add(1, std::memory_order_relaxed);
  // Puts carry no callback and their requests are freed at once: only the
  // flush is tracked, and its completion covers every put before it.
  ucp_request_param_t put{};
  put.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FLAG_MULTI_SEND;
  put.memh = memh_;
  auto* const base = static_cast<std::uint8_t*>(region_.base);
  const std::uint64_t block_len = region_.block_len;
  ucs_status_t put_status = UCS_OK;
  bool any_posted = false;
  for_each_run(local, remote, [&](std::int64_t l, std::int64_t r, std::uint64_t count) {
    ucs_status_ptr_t request = ucp_put_nbx(
        p.ep, base + static_cast<std::uint64_t>(l) * block_len, count * block_len,
        p.remote_base + static_cast<std::uint64_t>(r) * p.remote_block_len, p.rkey, &put);
    if (UCS_PTR_IS_ERR(request)) {
      put_status = UCS_PTR_STATUS(request);
      return false;
    }
    if (request != nullptr) ucp_request_free(request);
    any_posted = true;
    return true;
  });

  if (put_status != UCS_OK) {
    log().warn("kvxfer UCX {}: put to peer {} failed: {}", agent_name_, p.agent_name,
               ucs_status_string(put_status));
    if (is_disconnect(put_status)) {
      int expected = UCS_OK;
      p.failure.compare_exchange_strong(expected, put_status);
    }
    // Puts already posted keep going; a flush owned by UCX alone accounts
    // for them (as a request) and returns the handle when they are done.
    xfer->refs.store(1, std::memory_order_relaxed);
    ucs_status_t immediate = UCS_OK;
    if (!any_posted || !flush(p, xfer, &immediate)) unref(xfer);
    return map_post_error(put_status);
  }

  xfer->refs.store(2, std::memory_order_relaxed);  // the core's and the flush's
  ucs_status_t immediate = UCS_OK;
  if (flush(p, xfer, &immediate)) return Status::kSuccess;
  if (immediate == UCS_OK) {
    xfer->result.store(UCS_OK, std::memory_order_relaxed);
    xfer->refs.store(1, std::memory_order_relaxed);
    return Status::kSuccess;
  }
  log().warn("kvxfer UCX {}: flush to peer {} failed: {}", agent_name_, p.agent_name,
             ucs_status_string(immediate));
  if (is_disconnect(immediate)) {
    int expected = UCS_OK;
    p.failure.compare_exchange_strong(expected, immediate);
  }
  xfer->refs.store(1, std::memory_order_relaxed);
  unref(xfer);
  return map_post_error(immediate);
}

// Sends a write as scatter messages (see wire/scatter.h). The transfer holds
// one reference for the acks (until every message is acked, one fails, or
// the peer goes) and one per message UCX still holds.
Status UcxEngine::post_scatter(Peer& p, std::span<const std::int64_t> local,
                               std::span<const std::int64_t> remote, Xfer* xfer) {
  using Chunk = Xfer::AmChunk;
  auto* const base = static_cast<std::uint8_t*>(region_.base);
  const std::uint64_t block_len = region_.block_len;
  xfer->am_headers.clear();
  xfer->am_iov.clear();
  xfer->am_chunks.clear();
  std::uint64_t chunk_bytes = 0;
  const auto open_chunk = [&] {
    xfer->am_chunks.push_back(Chunk{xfer->am_headers.size(), 0, xfer->am_iov.size()});
    xfer->am_headers.resize(xfer->am_headers.size() + ucx::kScatterFixedLen);
    chunk_bytes = 0;
  };
  open_chunk();
  for_each_run(local, remote, [&](std::int64_t l, std::int64_t r, std::uint64_t count) {
    std::uint8_t* src = base + static_cast<std::uint64_t>(l) * block_len;
    std::uint64_t offset = static_cast<std::uint64_t>(r) * p.remote_block_len;
    for (std::uint64_t left = count * block_len; left > 0;) {
      if (xfer->am_chunks.back().runs == scatter_max_runs_ ||
          chunk_bytes == scatter_chunk_bytes_) {
        open_chunk();
      }
      const std::uint64_t len = std::min(left, scatter_chunk_bytes_ - chunk_bytes);
      const std::size_t at = xfer->am_headers.size();
      xfer->am_headers.resize(at + ucx::kScatterRunLen);
      Chunk& chunk = xfer->am_chunks.back();
      ucx::put_scatter_run(xfer->am_headers.data() + chunk.header_offset, chunk.runs, offset, len);
      ++chunk.runs;
      xfer->am_iov.push_back(ucp_dt_iov_t{src, len});
      chunk_bytes += len;
      src += len;
      offset += len;
      left -= len;
    }
    return true;
  });

  const std::size_t n = xfer->am_chunks.size();
  scatter_writes_.fetch_add(1, std::memory_order_relaxed);
  scatter_messages_.fetch_add(n, std::memory_order_relaxed);
  std::uint64_t seq = 0;
  xfer->refs.store(2, std::memory_order_relaxed);  // the core's and the acks'
  {
    std::lock_guard lock(am_mu_);
    seq = next_am_seq_++;
    if (seq == 0) seq = next_am_seq_++;  // 0 means "not awaiting acks"
    xfer->am_seq = seq;
    xfer->am_left = static_cast<int>(n);
    xfer->am_status = UCS_OK;
  }
  live_requests_.fetch_add(1, std::memory_order_relaxed);
  for (const Chunk& chunk : xfer->am_chunks) {
    ucx::put_scatter_fixed(xfer->am_headers.data() + chunk.header_offset,
                           static_cast<std::uint16_t>(chunk.runs), p.cookie_epoch, seq, xfer->slot);
  }

  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = &UcxEngine::on_am_sent;
  param.user_data = xfer;
  param.datatype = ucp_dt_make_iov();
  // Eager only: the target's handler then always gets the bytes in the call.
  param.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  ucs_status_t send_status = UCS_OK;
  std::size_t sent = 0;
  for (; sent < n; ++sent) {
    const Chunk& chunk = xfer->am_chunks[sent];
    const std::size_t iov_end =
        sent + 1 < n ? xfer->am_chunks[sent + 1].iov_offset : xfer->am_iov.size();
    xfer->refs.fetch_add(1, std::memory_order_relaxed);
    live_requests_.fetch_add(1, std::memory_order_relaxed);
    ucs_status_ptr_t request = ucp_am_send_nbx(
        p.ep, ucx::kScatterAmId, xfer->am_headers.data() + chunk.header_offset,
        ucx::scatter_header_len(chunk.runs), xfer->am_iov.data() + chunk.iov_offset,
        iov_end - chunk.iov_offset, &param);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) continue;  // on_am_sent lets go
    live_requests_.fetch_sub(1, std::memory_order_relaxed);
    xfer->refs.fetch_sub(1, std::memory_order_relaxed);  // the core's keeps it above zero
    if (UCS_PTR_IS_ERR(request)) {
      send_status = UCS_PTR_STATUS(request);
      break;
    }
  }
  if (send_status == UCS_OK) return Status::kSuccess;

  log().warn("kvxfer UCX {}: scatter write to peer {} failed: {}", agent_name_, p.agent_name,
             ucs_status_string(send_status));
  if (is_disconnect(send_status)) {
    int expected = UCS_OK;
    p.failure.compare_exchange_strong(expected, send_status);
  }
  // Messages already sent keep going and are still acked; the ones never
  // sent will not be.
  bool settle = false;
  {
    std::lock_guard lock(am_mu_);
    if (xfer->am_seq == seq) {
      xfer->am_left -= static_cast<int>(n - sent);
      xfer->am_status = send_status;
      if (xfer->am_left <= 0) {
        xfer->am_seq = 0;
        settle = true;
      }
    }
  }
  if (settle) end_scatter(xfer, send_status);
  unref(xfer);  // the core's: the write failed
  return map_post_error(send_status);
}

// Ends a transfer's wait for acks with `status`, unless it already ended.
void UcxEngine::fail_scatter(Xfer* xfer, ucs_status_t status) {
  {
    std::lock_guard lock(am_mu_);
    if (xfer->am_seq == 0) return;
    xfer->am_seq = 0;
  }
  end_scatter(xfer, status);
}

// The wait for acks is over (am_seq was cleared under am_mu_): publish the
// result and let go of the acks' reference.
void UcxEngine::end_scatter(Xfer* xfer, ucs_status_t status) {
  xfer->result.store(status, std::memory_order_release);
  live_requests_.fetch_sub(1, std::memory_order_relaxed);
  unref(xfer);
}

// Ends the wait for acks of every transfer to `peer` (its endpoint failed or
// was closed: no more acks come through it).
void UcxEngine::fail_peer_scatters(const Peer* peer, ucs_status_t status) {
  std::vector<Xfer*> failed;
  {
    std::lock_guard lock(am_mu_);
    for (Xfer* x : slots_) {
      if (x->am_seq != 0 && x->peer.get() == peer) {
        x->am_seq = 0;
        failed.push_back(x);
      }
    }
  }
  for (Xfer* x : failed) end_scatter(x, status);
}

void UcxEngine::on_am_sent(void* request, ucs_status_t status, void* user_data) {
  auto* xfer = static_cast<Xfer*>(user_data);
  UcxEngine* engine = xfer->engine;
  // A message that never left will never be acked.
  if (status != UCS_OK) engine->fail_scatter(xfer, status);
  ucp_request_free(request);
  engine->live_requests_.fetch_sub(1, std::memory_order_relaxed);
  engine->unref(xfer);
}

// Initiator: an ack from a target's scatter handler.
ucs_status_t UcxEngine::on_ack_am(void* arg, const void* header, std::size_t header_length,
                                  void* /*data*/, std::size_t /*length*/,
                                  const ucp_am_recv_param_t* /*param*/) {
  auto* engine = static_cast<UcxEngine*>(arg);
  ucx::ScatterAck ack;
  if (!ucx::decode_ack({static_cast<const std::uint8_t*>(header), header_length}, &ack)) {
    log().warn("kvxfer UCX {}: dropped a malformed scatter ack ({} bytes)", engine->agent_name_,
               header_length);
    return UCS_OK;
  }
  // Only the statuses a handler sends; anything else is an I/O error.
  ucs_status_t status = UCS_ERR_IO_ERROR;
  for (const ucs_status_t known :
       {UCS_OK, UCS_ERR_INVALID_PARAM, UCS_ERR_REJECTED, UCS_ERR_UNSUPPORTED}) {
    if (ack.status == static_cast<std::int32_t>(known)) status = known;
  }
  Xfer* done = nullptr;
  ucs_status_t result = UCS_OK;
  {
    std::lock_guard lock(engine->am_mu_);
    if (ack.slot >= engine->slots_.size()) return UCS_OK;
    Xfer* xfer = engine->slots_[ack.slot];
    if (xfer->am_seq == 0 || xfer->am_seq != ack.sequence) return UCS_OK;  // it already ended
    if (status != UCS_OK && xfer->am_status == UCS_OK) xfer->am_status = status;
    if (--xfer->am_left > 0) return UCS_OK;
    xfer->am_seq = 0;
    result = static_cast<ucs_status_t>(xfer->am_status);
    done = xfer;
  }
  if (result != UCS_OK) {
    engine->scatter_refused_.fetch_add(1, std::memory_order_relaxed);
    log().warn("kvxfer UCX {}: peer {} refused a scatter write of transfer {}: {}",
               engine->agent_name_, done->peer->agent_name, done->id, ucs_status_string(result));
  }
  engine->end_scatter(done, result);
  return UCS_OK;
}

// Target: a scatter write. Every run is checked against the region before a
// byte is copied; the ack tells the initiator what happened.
ucs_status_t UcxEngine::on_scatter_am(void* arg, const void* header, std::size_t header_length,
                                      void* data, std::size_t length,
                                      const ucp_am_recv_param_t* param) {
  auto* engine = static_cast<UcxEngine*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  engine->scatter_received_.fetch_add(1, std::memory_order_relaxed);
  ucx::ScatterHeader h;
  if (!ucx::decode_scatter_header({static_cast<const std::uint8_t*>(header), header_length},
                                  &h)) {
    if (rndv) ucp_am_data_release(engine->worker_, data);
    engine->scatter_rejected_.fetch_add(1, std::memory_order_relaxed);
    log().warn("kvxfer UCX {}: dropped a malformed scatter write ({} header bytes)",
               engine->agent_name_, header_length);
    return UCS_OK;
  }
  ucs_status_t status = UCS_OK;
  const std::uint64_t region_len = engine->region_.num_blocks * engine->region_.block_len;
  if (rndv) {
    // Our initiators send eagerly; a rendezvous one is not ours to take.
    ucp_am_data_release(engine->worker_, data);
    status = UCS_ERR_UNSUPPORTED;
  } else if (!engine->accepting_writes_.load(std::memory_order_acquire) ||
             h.token != engine->cookie_.epoch()) {
    status = UCS_ERR_REJECTED;  // meant for another (earlier) engine, or closing
  } else if (!ucx::scatter_runs_fit(h, region_len, length)) {
    status = UCS_ERR_INVALID_PARAM;
  } else {
    auto* const region = static_cast<std::uint8_t*>(engine->region_.base);
    const auto* src = static_cast<const std::uint8_t*>(data);
    for (std::size_t i = 0; i < h.run_count(); ++i) {
      const ucx::ScatterRun r = h.run(i);
      std::memcpy(region + r.offset, src, r.length);
      src += r.length;
    }
  }
  if (status != UCS_OK) {
    engine->scatter_rejected_.fetch_add(1, std::memory_order_relaxed);
    log().warn("kvxfer UCX {}: refused a scatter write: {}", engine->agent_name_,
               ucs_status_string(status));
  }
  engine->send_ack(param, ucx::ScatterAck{h.slot, h.sequence, static_cast<std::int32_t>(status)});
  return UCS_OK;
}

void UcxEngine::send_ack(const ucp_am_recv_param_t* param, const ucx::ScatterAck& ack) {
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 || param->reply_ep == nullptr) {
    log().warn("kvxfer UCX {}: a scatter write came without a reply endpoint; not acked",
               agent_name_);
    return;
  }
  AckMsg* msg = nullptr;
  {
    std::lock_guard lock(ack_mu_);
    if (free_acks_.empty()) {
      msg = &acks_.emplace_back();
      msg->engine = this;
    } else {
      msg = free_acks_.back();
      free_acks_.pop_back();
    }
  }
  ucx::encode_ack(msg->bytes.data(), ack);
  ucp_request_param_t send{};
  send.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  send.cb.send = &UcxEngine::on_ack_sent;
  send.user_data = msg;
  send.flags = UCP_AM_SEND_FLAG_EAGER;
  ucs_status_ptr_t request = ucp_am_send_nbx(param->reply_ep, ucx::kScatterAckAmId,
                                             msg->bytes.data(), msg->bytes.size(), nullptr, 0,
                                             &send);
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) return;  // on_ack_sent returns msg
  if (UCS_PTR_IS_ERR(request)) {
    // The initiator is gone: its transfers fail on its side.
    log().debug("kvxfer UCX {}: scatter ack not sent: {}", agent_name_,
                ucs_status_string(UCS_PTR_STATUS(request)));
  }
  std::lock_guard lock(ack_mu_);
  free_acks_.push_back(msg);
}

void UcxEngine::on_ack_sent(void* request, ucs_status_t /*status*/, void* user_data) {
  auto* msg = static_cast<AckMsg*>(user_data);
  ucp_request_free(request);
  std::lock_guard lock(msg->engine->ack_mu_);
  msg->engine->free_acks_.push_back(msg);
}

// Posts a flush whose completion calls on_flush(xfer). True when it is
// pending (on_flush will run); false when it completed at once, with the
// status in *immediate.
bool UcxEngine::flush(Peer& peer, Xfer* xfer, ucs_status_t* immediate) {
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  params.cb.send = &UcxEngine::on_flush;
  params.user_data = xfer;
  live_requests_.fetch_add(1, std::memory_order_relaxed);
  ucs_status_ptr_t request = ucp_ep_flush_nbx(peer.ep, &params);
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) return true;
  live_requests_.fetch_sub(1, std::memory_order_relaxed);
  *immediate = UCS_PTR_STATUS(request);
  return false;
}

Status UcxEngine::check(XferHandle handle, Status* state) {
  auto* xfer = reinterpret_cast<Xfer*>(handle);
  if (xfer == nullptr || !xfer->held.load(std::memory_order_relaxed)) return Status::kInvalidParam;
  const auto result = static_cast<ucs_status_t>(xfer->result.load(std::memory_order_acquire));
  if (result == UCS_OK) {
    *state = Status::kSuccess;
    return Status::kSuccess;
  }
  // A peer whose endpoint failed, or that is gone, can no longer take the
  // bytes: report that as the check error, which is terminal for the core.
  const bool peer_failed = xfer->peer != nullptr && xfer->peer->failed();
  if (result == UCS_INPROGRESS) {
    if (peer_failed) return Status::kRemoteDisconnect;
    *state = Status::kInProgress;
    return Status::kSuccess;
  }
  if (peer_failed || is_disconnect(result)) return Status::kRemoteDisconnect;
  *state = result == UCS_ERR_CANCELED ? Status::kCanceled : Status::kBackend;
  return Status::kSuccess;
}

Status UcxEngine::release(XferHandle handle) {
  auto* xfer = reinterpret_cast<Xfer*>(handle);
  if (xfer == nullptr || !xfer->held.exchange(false, std::memory_order_relaxed)) {
    return Status::kInvalidParam;
  }
  live_transfers_.fetch_sub(1, std::memory_order_relaxed);
  // A flush still pending keeps its reference: on_flush returns the handle.
  unref(xfer);
  return Status::kSuccess;
}

HandleCounts UcxEngine::live() const {
  HandleCounts counts;
  counts.memory_registrations = memh_ != nullptr ? 1 : 0;
  {
    std::lock_guard lock(peers_mu_);
    counts.peers = peers_.size();
  }
  counts.remote_keys = live_rkeys_.load(std::memory_order_relaxed);
  counts.transfers = live_transfers_.load(std::memory_order_relaxed);
  counts.requests = live_requests_.load(std::memory_order_relaxed);
  return counts;
}

std::map<std::string, std::uint64_t> UcxEngine::counters() const {
  const auto get = [](const std::atomic<std::uint64_t>& c) {
    return c.load(std::memory_order_relaxed);
  };
  return {{"cma_writes", get(cma_writes_)},
          {"put_writes", get(put_writes_)},
          {"scatter_writes", get(scatter_writes_)},
          {"scatter_messages", get(scatter_messages_)},
          {"scatter_refused", get(scatter_refused_)},
          {"scatter_received", get(scatter_received_)},
          {"scatter_rejected", get(scatter_rejected_)}};
}

void UcxEngine::drain_requests(const char* why) {
  const auto deadline = Clock::now() + kDrainTimeout;
  while (live_requests_.load(std::memory_order_relaxed) > 0 && Clock::now() < deadline) {
    ucp_worker_progress(worker_);
  }
  if (const auto left = live_requests_.load(std::memory_order_relaxed); left > 0) {
    log().warn(
        "kvxfer UCX {}: {} request(s) still pending {}; the worker's destruction cancels "
        "them",
        agent_name_, left, why);
  }
}

void UcxEngine::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  accepting_writes_.store(false, std::memory_order_release);
  stop_progress_thread();
  std::vector<PeerHandle> leftover;
  {
    std::lock_guard lock(peers_mu_);
    for (const auto& [handle, peer] : peers_) leftover.push_back(handle);
  }
  if (!leftover.empty()) {
    log().warn("kvxfer UCX {}: shutdown with {} peer(s) still connected", agent_name_,
               leftover.size());
  }
  for (const PeerHandle handle : leftover) {
    [[maybe_unused]] const Status st = disconnect(handle);
  }
  stop_copiers();
  if (worker_ != nullptr) drain_requests("at shutdown");
  teardown_ucx();
}

}  // namespace

std::unique_ptr<Engine> make_ucx_engine(const EngineConfig& config) {
  return std::make_unique<UcxEngine>(config);
}

}  // namespace kvxfer::internal
