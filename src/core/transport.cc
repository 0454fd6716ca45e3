// The transport state machine: peers and their generations, the in-flight
// table, strikes and faults. Knows nothing of UCX; drives an Engine.
#include "kvxfer/transport.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <fstream>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/host.h"
#include "common/log.h"
#include "core/index_set.h"
#include "core/peer_policy.h"
#include "core/registration_worker.h"
#include "engine.h"
#include "wire/metadata.h"

namespace kvxfer {
namespace internal {
namespace {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

}  // namespace

struct Peer;

// A submitted WRITE not yet drained. Linked into its peer's list so a scoped
// poll walks only that peer's transfers.
struct Inflight {
  TransferId id = 0;
  Peer* peer = nullptr;
  XferHandle handle = 0;
  std::uint64_t bytes = 0;
  std::chrono::steady_clock::time_point posted;
  // Set once the transfer has counted against its peer, so a check that
  // keeps failing charges the peer once, not once per poll.
  bool struck = false;
  Inflight* prev = nullptr;
  Inflight* next = nullptr;
};

struct Peer {
  std::string id;
  PeerHandle handle = 0;
  std::uint64_t num_blocks = 0;
  std::uint64_t block_len = 0;
  Standing standing;  // strikes and fault: judged by PeerPolicy only
  Inflight* head = nullptr;
  Inflight* tail = nullptr;
  std::uint64_t inflight = 0;
  bool succeeded_in_batch = false;
  PeerStats counters;
};

class TransportState {
 public:
  TransportState(std::string agent_name, Region region, Options options);
  ~TransportState();

  void add_peer(const std::string& peer_id, std::span<const std::uint8_t> metadata,
                std::uintptr_t base_addr, std::uint64_t num_blocks, std::uint64_t block_len);
  std::future<void> add_peer_async(const std::string& peer_id,
                                   std::span<const std::uint8_t> metadata,
                                   std::uintptr_t base_addr, std::uint64_t num_blocks,
                                   std::uint64_t block_len);
  void remove_peer(const std::string& peer_id);
  std::vector<std::string> peer_ids() const;

  template <typename Int>
  std::optional<TransferId> write(std::string_view peer_id, std::span<const Int> local,
                                  std::span<const Int> remote);
  PollResult poll(std::optional<std::string_view> peer_id);
  std::vector<TransferId> cancel(std::span<const TransferId> ids, CancelMode mode);
  void close();
  Stats stats() const;
  std::vector<std::uint8_t> metadata() const;

  const std::string agent_name_;
  const Region region_;
  const Options options_;
  const std::string fingerprint_;
  const std::string boot_id_;
  std::unique_ptr<Engine> engine_;

  bool closing() const {
    std::lock_guard lock(mu_);
    return closing_;
  }
  bool closed() const {
    std::lock_guard lock(mu_);
    return closed_;
  }

 private:
  struct Registration {
    RemoteRegion remote;
    std::vector<std::uint8_t> blob;
  };

  Registration validate_peer(const std::string& peer_id, std::span<const std::uint8_t> metadata,
                             std::uintptr_t base_addr, std::uint64_t num_blocks,
                             std::uint64_t block_len) const;
  // Claims the next generation for peer_id and tears down what it had.
  std::uint64_t begin_registration(const std::string& peer_id);
  // Connects outside the lock and publishes unless superseded. Throws
  // SupersededError when superseded, std::runtime_error when unreachable.
  void build_and_publish(const std::string& peer_id, std::uint64_t gen, const Registration& reg);

  void throw_if_closing() const {
    if (closing_) throw std::logic_error("kvxfer: transport " + agent_name_ + " is closed");
  }
  void teardown_peer(std::unique_ptr<Peer> peer);
  void link(Peer* peer, Inflight* e);
  void unlink(Inflight* e);
  void release(Inflight* e);
  void poll_peer(Peer* peer, PollResult& out, std::chrono::steady_clock::time_point now);

  std::optional<TransferId> post(Peer* peer, std::span<const std::int64_t> local,
                                 std::span<const std::int64_t> remote);

  // Strikes, faults and the stall rule: every judgement of a peer goes here.
  const PeerPolicy policy_;

  mutable std::mutex mu_;
  std::condition_variable connects_done_;
  bool closing_ = false;
  bool closed_ = false;
  int active_connects_ = 0;
  TransferId next_id_ = 1;
  std::uint64_t next_gen_ = 0;
  std::unordered_map<std::string, std::uint64_t, StringHash, std::equal_to<>> generations_;
  std::unordered_map<std::string, std::unique_ptr<Peer>, StringHash, std::equal_to<>> peers_;
  std::unordered_map<TransferId, Inflight> inflight_;
  // Reused across calls so the hot path allocates nothing per block.
  std::vector<std::int64_t> scratch_local_;
  std::vector<std::int64_t> scratch_remote_;
  IndexSet scratch_seen_;
  std::vector<std::pair<Peer*, Status>> scratch_failures_;
  std::vector<Inflight*> scratch_finished_;
  RegistrationWorker worker_;
};

TransportState::TransportState(std::string agent_name, Region region, Options options)
    : agent_name_(std::move(agent_name)),
      region_(region),
      options_(std::move(options)),
      fingerprint_(config_fingerprint(options_.config_fields)),
      boot_id_(boot_id()),
      policy_(agent_name_, options_.strike_limit, options_.stall_timeout) {
  if (agent_name_.empty()) throw std::invalid_argument("agent_name must not be empty");
  if (region_.base == nullptr) throw std::invalid_argument("region base must not be null");
  if (region_.num_blocks == 0) throw std::invalid_argument("region num_blocks must be > 0");
  if (region_.block_len == 0) throw std::invalid_argument("region block_len must be > 0");
  if (region_.num_blocks > std::numeric_limits<std::uint64_t>::max() / region_.block_len) {
    throw std::invalid_argument("region num_blocks * block_len overflows");
  }
  if (options_.strike_limit < 1) throw std::invalid_argument("strike_limit must be >= 1");
  if (options_.num_threads < 1) throw std::invalid_argument("num_threads must be >= 1");

  const EngineConfig config{agent_name_, region_, &options_};
  for (const auto& backend : options_.backends) {
    if (backend == "UCX") {
      engine_ = make_ucx_engine(config);
    } else if (backend == "LOOPBACK") {
      engine_ = make_loopback_engine(config);
    } else {
      continue;
    }
    break;
  }
  if (!engine_) {
    throw std::invalid_argument(fmt::format(
        "no supported backend in [{}] (supported: UCX, LOOPBACK)",
        fmt::join(options_.backends, ", ")));
  }
  log().info("kvxfer {}: backend={} registered {} blocks of {} bytes", agent_name_,
             engine_->name(), region_.num_blocks, region_.block_len);
}

TransportState::~TransportState() { close(); }

std::vector<std::uint8_t> TransportState::metadata() const {
  {
    std::lock_guard lock(mu_);
    throw_if_closing();
  }
  wire::AgentMetadata m;
  m.engine = engine_->name();
  m.agent_name = agent_name_;
  m.config_fingerprint = fingerprint_;
  m.boot_id = boot_id_;
  m.base_addr = reinterpret_cast<std::uintptr_t>(region_.base);
  m.num_blocks = region_.num_blocks;
  m.block_len = region_.block_len;
  m.pid = static_cast<std::uint32_t>(::getpid());
  m.engine_blob = engine_->local_blob();
  return wire::encode(m);
}

// ---------------------------------------------------------------------------
// Peer management
// ---------------------------------------------------------------------------

TransportState::Registration TransportState::validate_peer(
    const std::string& peer_id, std::span<const std::uint8_t> metadata, std::uintptr_t base_addr,
    std::uint64_t num_blocks, std::uint64_t block_len) const {
  if (peer_id.empty()) throw std::invalid_argument("peer_id must not be empty");
  if (num_blocks == 0) throw std::invalid_argument("peer num_blocks must be > 0");
  if (block_len == 0) throw std::invalid_argument("peer block_len must be > 0");
  if (block_len != region_.block_len) {
    throw std::invalid_argument(fmt::format(
        "peer {} block_len {} differs from ours ({})", peer_id, block_len, region_.block_len));
  }
  if (num_blocks > std::numeric_limits<std::uint64_t>::max() / block_len) {
    throw std::invalid_argument("peer num_blocks * block_len overflows");
  }
  wire::AgentMetadata m = wire::decode(metadata);
  if (m.engine != engine_->name()) {
    throw std::invalid_argument(fmt::format("peer {} metadata is for backend {}, this transport uses {}",
                                            peer_id, m.engine, engine_->name()));
  }
  if (m.agent_name == agent_name_) {
    throw std::invalid_argument(
        fmt::format("peer {} has our own agent name '{}'", peer_id, agent_name_));
  }
  if (m.base_addr != base_addr || m.num_blocks != num_blocks || m.block_len != block_len) {
    throw std::invalid_argument(fmt::format(
        "peer {} geometry (base {:#x}, {} blocks of {}) disagrees with its metadata "
        "(base {:#x}, {} blocks of {})",
        peer_id, base_addr, num_blocks, block_len, m.base_addr, m.num_blocks, m.block_len));
  }
  if (!m.config_fingerprint.empty() && !fingerprint_.empty() &&
      m.config_fingerprint != fingerprint_) {
    throw std::invalid_argument(fmt::format("peer {} config fingerprint {} differs from ours ({})",
                                            peer_id, m.config_fingerprint, fingerprint_));
  }
  Registration reg;
  reg.remote = RemoteRegion{m.agent_name, m.base_addr, m.num_blocks, m.block_len, m.pid, m.boot_id};
  reg.blob = std::move(m.engine_blob);
  return reg;
}

std::uint64_t TransportState::begin_registration(const std::string& peer_id) {
  // Caller holds mu_.
  const std::uint64_t gen = ++next_gen_;
  generations_[peer_id] = gen;
  // Re-adding tears the old registration down first: no stale endpoint is
  // ever reused, and writes during the new registration see an unknown peer.
  if (auto it = peers_.find(peer_id); it != peers_.end()) {
    auto old = std::move(it->second);
    peers_.erase(it);
    teardown_peer(std::move(old));
  }
  return gen;
}

void TransportState::build_and_publish(const std::string& peer_id, std::uint64_t gen,
                                       const Registration& reg) {
  PeerHandle handle = 0;
  const Status st = engine_->connect(reg.blob, reg.remote, &handle);
  std::unique_lock lock(mu_);
  if (st != Status::kSuccess) {
    throw std::runtime_error(fmt::format("kvxfer {}: cannot register peer {}: {}", agent_name_,
                                         peer_id, status_name(st)));
  }
  auto it = generations_.find(peer_id);
  const bool fresh = !closing_ && it != generations_.end() && it->second == gen;
  if (fresh) {
    auto peer = std::make_unique<Peer>();
    peer->id = peer_id;
    peer->handle = handle;
    peer->num_blocks = reg.remote.num_blocks;
    peer->block_len = reg.remote.block_len;
    peer->counters.peer_id = peer_id;
    peer->counters.num_blocks = reg.remote.num_blocks;
    peers_.emplace(peer_id, std::move(peer));
    log().info("kvxfer {}: registered peer={} ({} blocks)", agent_name_, peer_id,
               reg.remote.num_blocks);
    return;
  }
  // Nothing else ever saw these handles: release them here.
  log().info("kvxfer {}: discarding superseded registration for peer={}", agent_name_, peer_id);
  if (const Status d = engine_->disconnect(handle); d != Status::kSuccess) {
    log().warn("kvxfer {}: releasing superseded registration for peer={} failed: {}", agent_name_,
               peer_id, status_name(d));
  }
  throw SupersededError(fmt::format(
      "registration for peer {} was superseded (peer removed or re-registered while registering)",
      peer_id));
}

void TransportState::add_peer(const std::string& peer_id, std::span<const std::uint8_t> metadata,
                              std::uintptr_t base_addr, std::uint64_t num_blocks,
                              std::uint64_t block_len) {
  Registration reg = validate_peer(peer_id, metadata, base_addr, num_blocks, block_len);
  std::uint64_t gen = 0;
  {
    std::lock_guard lock(mu_);
    throw_if_closing();
    gen = begin_registration(peer_id);
    ++active_connects_;
  }
  struct Done {
    TransportState* self;
    ~Done() {
      std::lock_guard lock(self->mu_);
      if (--self->active_connects_ == 0) self->connects_done_.notify_all();
    }
  } done{this};
  build_and_publish(peer_id, gen, reg);
}

std::future<void> TransportState::add_peer_async(const std::string& peer_id,
                                                 std::span<const std::uint8_t> metadata,
                                                 std::uintptr_t base_addr,
                                                 std::uint64_t num_blocks,
                                                 std::uint64_t block_len) {
  auto reg = std::make_shared<Registration>(
      validate_peer(peer_id, metadata, base_addr, num_blocks, block_len));
  auto promise = std::make_shared<std::promise<void>>();
  std::future<void> future = promise->get_future();
  std::lock_guard lock(mu_);
  throw_if_closing();
  const std::uint64_t gen = begin_registration(peer_id);
  const bool taken = worker_.submit([this, peer_id, gen, reg, promise](bool run) {
    if (!run) {
      promise->set_exception(std::make_exception_ptr(SupersededError(fmt::format(
          "registration for peer {} was superseded (transport closed before it ran)", peer_id))));
      return;
    }
    try {
      build_and_publish(peer_id, gen, *reg);
      promise->set_value();
    } catch (...) {
      promise->set_exception(std::current_exception());
    }
  });
  if (!taken) throw std::logic_error("kvxfer: transport " + agent_name_ + " is closed");
  return future;
}

void TransportState::remove_peer(const std::string& peer_id) {
  std::lock_guard lock(mu_);
  throw_if_closing();
  // Invalidate any registration still being built so its worker releases
  // the handles instead of publishing them.
  generations_.erase(peer_id);
  if (auto it = peers_.find(peer_id); it != peers_.end()) {
    auto peer = std::move(it->second);
    peers_.erase(it);
    teardown_peer(std::move(peer));
  }
}

std::vector<std::string> TransportState::peer_ids() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> ids;
  ids.reserve(peers_.size());
  for (const auto& [id, peer] : peers_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

void TransportState::teardown_peer(std::unique_ptr<Peer> peer) {
  // Caller holds mu_. Its transfers are drained: released, never reported.
  while (peer->head != nullptr) release(peer->head);
  if (const Status st = engine_->disconnect(peer->handle); st != Status::kSuccess) {
    log().warn("kvxfer {}: releasing handles of peer={} failed: {}", agent_name_, peer->id,
               status_name(st));
  }
  log().info("kvxfer {}: removed peer={}", agent_name_, peer->id);
}

// ---------------------------------------------------------------------------
// In-flight table
// ---------------------------------------------------------------------------

void TransportState::link(Peer* peer, Inflight* e) {
  e->peer = peer;
  e->prev = peer->tail;
  e->next = nullptr;
  if (peer->tail != nullptr) {
    peer->tail->next = e;
  } else {
    peer->head = e;
  }
  peer->tail = e;
  ++peer->inflight;
}

void TransportState::unlink(Inflight* e) {
  Peer* peer = e->peer;
  (e->prev != nullptr ? e->prev->next : peer->head) = e->next;
  (e->next != nullptr ? e->next->prev : peer->tail) = e->prev;
  --peer->inflight;
}

// Releases the handle (a failure is logged; the entry goes either way) and
// forgets the transfer.
void TransportState::release(Inflight* e) {
  if (const Status st = engine_->release(e->handle); st != Status::kSuccess) {
    log().warn("kvxfer {}: releasing transfer_id={} failed: {}", agent_name_, e->id,
               status_name(st));
  }
  unlink(e);
  inflight_.erase(e->id);
}

// ---------------------------------------------------------------------------
// Transfers
// ---------------------------------------------------------------------------

template <typename Int>
std::optional<TransferId> TransportState::write(std::string_view peer_id,
                                                std::span<const Int> local,
                                                std::span<const Int> remote) {
  if (local.size() != remote.size()) {
    throw std::invalid_argument(fmt::format("local_idxs has {} entries but remote_idxs has {}",
                                            local.size(), remote.size()));
  }
  if (local.empty()) throw std::invalid_argument("write_blocks needs at least one block");
  check_range(local, region_.num_blocks, "local_idxs");

  std::lock_guard lock(mu_);
  throw_if_closing();
  auto it = peers_.find(peer_id);
  if (it == peers_.end()) {
    std::vector<std::string_view> known;
    for (const auto& [id, p] : peers_) known.push_back(id);
    log().warn("kvxfer {}: write_blocks to unknown peer={} (known peers: [{}])", agent_name_,
               peer_id, fmt::join(known, ", "));
    return std::nullopt;
  }
  Peer* peer = it->second.get();
  check_range(remote, peer->num_blocks, "remote_idxs");

  // Two pairs writing one remote block would race; refuse the write.
  check_no_duplicates(remote, scratch_seen_, "remote_idxs");

  if constexpr (std::is_same_v<Int, std::int64_t>) {
    return post(peer, local, remote);
  } else {
    scratch_local_.assign(local.begin(), local.end());
    scratch_remote_.assign(remote.begin(), remote.end());
    return post(peer, scratch_local_, scratch_remote_);
  }
}

std::optional<TransferId> TransportState::post(Peer* peer, std::span<const std::int64_t> local,
                                               std::span<const std::int64_t> remote) {
  // Caller holds mu_.
  const TransferId id = next_id_;
  XferHandle handle = 0;
  const Status st = engine_->post_write(peer->handle, id, local, remote, &handle);
  if (st != Status::kSuccess) {
    log().warn("kvxfer {}: write_blocks failed for peer={}: post {}", agent_name_, peer->id,
               status_name(st));
    ++peer->counters.post_failures;
    policy_.record_failure(peer->standing, peer->id, st, fmt::format("post {}", status_name(st)));
    return std::nullopt;
  }
  ++next_id_;
  auto [slot, inserted] = inflight_.try_emplace(id);
  Inflight& e = slot->second;
  e.id = id;
  e.handle = handle;
  e.bytes = static_cast<std::uint64_t>(local.size()) * region_.block_len;
  if (policy_.watches_stalls()) e.posted = coarse_now();
  link(peer, &e);
  return id;
}

void TransportState::poll_peer(Peer* peer, PollResult& out,
                               std::chrono::steady_clock::time_point now) {
  // Caller holds mu_. Classify every transfer of this peer first; strikes
  // are applied once the batch is classified, because poll() sees
  // completions, not their order: a success anywhere in the batch is the
  // success "between" the peer's earlier failures.
  for (Inflight* e = peer->head; e != nullptr; e = e->next) {
    Status state = Status::kInProgress;
    const Status check = engine_->check(e->handle, &state);
    if (check != Status::kSuccess) {
      if (e->struck) {
        log().debug("kvxfer {}: state check failed for transfer_id={}: {}", agent_name_, e->id,
                    status_name(check));
      } else {
        log().warn("kvxfer {}: state check failed for transfer_id={}: {}", agent_name_, e->id,
                   status_name(check));
        policy_.record_check_failure(peer->standing, peer->id, check);
        e->struck = true;
      }
      // Kept unless the WRITE can no longer land: the peer is faulted now,
      // so its owner tears it down, which reclaims the transfer.
      if (!is_terminal_check_error(check)) continue;
      state = check;
    }
    if (state == Status::kSuccess) {
      out.done.push_back(e->id);
      peer->succeeded_in_batch = true;
      ++peer->counters.transfers_done;
      peer->counters.bytes_done += e->bytes;
      scratch_finished_.push_back(e);
    } else if (state == Status::kInProgress) {
      // Stays, since it may still land; a stalled one faults its peer.
      policy_.check_stall(peer->standing, peer->id, e->id, e->posted, now);
    } else {
      out.failed.push_back(e->id);
      ++peer->counters.transfers_failed;
      if (!e->struck) scratch_failures_.emplace_back(peer, state);
      scratch_finished_.push_back(e);
    }
  }
}

PollResult TransportState::poll(std::optional<std::string_view> peer_id) {
  PollResult out;
  std::lock_guard lock(mu_);
  throw_if_closing();
  Peer* scoped = nullptr;
  if (peer_id) {
    auto it = peers_.find(*peer_id);
    if (it == peers_.end()) return out;
    scoped = it->second.get();
  }
  if (inflight_.empty() && scoped == nullptr) return out;
  if (!inflight_.empty()) {
    engine_->progress();
    scratch_failures_.clear();
    scratch_finished_.clear();
    const auto now =
        policy_.watches_stalls() ? coarse_now() : std::chrono::steady_clock::time_point{};
    if (scoped != nullptr) {
      poll_peer(scoped, out, now);
    } else {
      for (auto& [id, peer] : peers_) poll_peer(peer.get(), out, now);
    }
    for (Inflight* e : scratch_finished_) {
      if (e->peer->succeeded_in_batch) {
        policy_.record_success(e->peer->standing);
        e->peer->succeeded_in_batch = false;
      }
    }
    for (const auto& [peer, status] : scratch_failures_) {
      policy_.record_failure(peer->standing, peer->id, status,
                             fmt::format("state {}", status_name(status)));
    }
    for (Inflight* e : scratch_finished_) release(e);
    if (scoped == nullptr) {
      std::sort(out.done.begin(), out.done.end());
      std::sort(out.failed.begin(), out.failed.end());
    }
  }
  if (scoped != nullptr) out.peer_fault = scoped->standing.fault;
  return out;
}

std::vector<TransferId> TransportState::cancel(std::span<const TransferId> ids, CancelMode mode) {
  std::vector<TransferId> still;
  std::lock_guard lock(mu_);
  throw_if_closing();
  if (mode == CancelMode::kImmediate) {
    // The engine keeps whatever a WRITE still in flight needs; forgetting it
    // here frees nothing it writes through.
    for (const TransferId id : ids) {
      if (auto it = inflight_.find(id); it != inflight_.end()) release(&it->second);
    }
    return still;
  }
  engine_->progress();
  for (const TransferId id : ids) {
    auto it = inflight_.find(id);
    if (it == inflight_.end()) continue;
    Inflight* e = &it->second;
    Status state = Status::kInProgress;
    const Status check = engine_->check(e->handle, &state);
    if (check != Status::kSuccess) {
      log().debug("kvxfer {}: cancel state check failed for transfer_id={}: {}", agent_name_, id,
                  status_name(check));
      policy_.record_check_failure(e->peer->standing, e->peer->id, check);
      e->struck = true;
      if (!is_terminal_check_error(check)) {
        still.push_back(id);
        continue;
      }
      // Terminal either way: drop it even if its handle cannot be released.
      release(e);
      continue;
    }
    // Releasing a transfer still in progress would not stop the WRITE: the
    // bytes keep landing. So it stays for a later poll to observe.
    if (state == Status::kInProgress) {
      still.push_back(id);
      continue;
    }
    if (const Status st = engine_->release(e->handle); st != Status::kSuccess) {
      log().debug("kvxfer {}: cancel pending for transfer_id={}: {}", agent_name_, id,
                  status_name(st));
      still.push_back(id);
      continue;
    }
    unlink(e);
    inflight_.erase(it);
  }
  return still;
}

void TransportState::close() {
  {
    std::lock_guard lock(mu_);
    if (closing_) return;
    closing_ = true;
  }
  // Stop taking registrations; a running one finishes (and is discarded).
  worker_.stop();
  std::unique_lock lock(mu_);
  connects_done_.wait(lock, [this] { return active_connects_ == 0; });
  for (auto& [id, e] : inflight_) {
    if (const Status st = engine_->release(e.handle); st != Status::kSuccess) {
      log().warn("kvxfer {}: releasing transfer_id={} failed: {}", agent_name_, id,
                 status_name(st));
    }
  }
  inflight_.clear();
  for (auto& [id, peer] : peers_) {
    peer->head = peer->tail = nullptr;
    peer->inflight = 0;
    teardown_peer(std::move(peer));
  }
  peers_.clear();
  generations_.clear();
  engine_->shutdown();
  closed_ = true;
  log().info("kvxfer {}: closed", agent_name_);
}

Stats TransportState::stats() const {
  Stats s;
  std::lock_guard lock(mu_);
  s.live = engine_->live();
  s.inflight = inflight_.size();
  s.registrations_pending = worker_.pending();
  s.engine_counters = engine_->counters();
  for (const auto& [id, peer] : peers_) {
    PeerStats p = peer->counters;
    p.inflight = peer->inflight;
    p.strikes = peer->standing.strikes;
    p.fault = peer->standing.fault;
    s.peers.push_back(std::move(p));
  }
  std::sort(s.peers.begin(), s.peers.end(),
            [](const PeerStats& a, const PeerStats& b) { return a.peer_id < b.peer_id; });
  return s;
}

}  // namespace internal

// ---------------------------------------------------------------------------
// Transport: a thin facade over TransportState.
// ---------------------------------------------------------------------------

Transport::Transport(std::string agent_name, Region region, Options options)
    : state_(std::make_unique<internal::TransportState>(std::move(agent_name), region,
                                                        std::move(options))) {}

Transport::~Transport() = default;

bool Transport::available() const noexcept { return !state_->closing(); }
const std::string& Transport::agent_name() const noexcept { return state_->agent_name_; }
std::uintptr_t Transport::base_addr() const noexcept {
  return reinterpret_cast<std::uintptr_t>(state_->region_.base);
}
std::uint64_t Transport::num_blocks() const noexcept { return state_->region_.num_blocks; }
std::uint64_t Transport::block_len() const noexcept { return state_->region_.block_len; }
const std::string& Transport::config_fingerprint() const noexcept { return state_->fingerprint_; }
const std::string& Transport::backend() const noexcept { return state_->engine_->name(); }

std::vector<std::uint8_t> Transport::agent_metadata() const { return state_->metadata(); }

void Transport::add_remote_peer(const std::string& peer_id, std::span<const std::uint8_t> metadata,
                                std::uintptr_t base_addr, std::uint64_t num_blocks,
                                std::uint64_t block_len) {
  state_->add_peer(peer_id, metadata, base_addr, num_blocks, block_len);
}

std::future<void> Transport::add_remote_peer_async(const std::string& peer_id,
                                                   std::span<const std::uint8_t> metadata,
                                                   std::uintptr_t base_addr,
                                                   std::uint64_t num_blocks,
                                                   std::uint64_t block_len) {
  return state_->add_peer_async(peer_id, metadata, base_addr, num_blocks, block_len);
}

void Transport::remove_remote_peer(const std::string& peer_id) { state_->remove_peer(peer_id); }
std::vector<std::string> Transport::peers() const { return state_->peer_ids(); }

std::optional<TransferId> Transport::write_blocks(std::string_view peer_id,
                                                  std::span<const std::int64_t> local_idxs,
                                                  std::span<const std::int64_t> remote_idxs) {
  return state_->write(peer_id, local_idxs, remote_idxs);
}

std::optional<TransferId> Transport::write_blocks(std::string_view peer_id,
                                                  std::span<const std::int32_t> local_idxs,
                                                  std::span<const std::int32_t> remote_idxs) {
  return state_->write(peer_id, local_idxs, remote_idxs);
}

PollResult Transport::poll(std::optional<std::string_view> peer_id) {
  return state_->poll(peer_id);
}

std::vector<TransferId> Transport::cancel(std::span<const TransferId> ids, CancelMode mode) {
  return state_->cancel(ids, mode);
}

void Transport::close() { state_->close(); }
bool Transport::closed() const noexcept { return state_->closed(); }
Stats Transport::stats() const { return state_->stats(); }
loopback::FaultPlan* Transport::fault_plan() noexcept { return state_->engine_->fault_plan(); }

std::string_view version() noexcept { return "kvxfer " KVXFER_VERSION; }

}  // namespace kvxfer
