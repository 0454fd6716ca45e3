// SPDX-License-Identifier: Apache-2.0
// The transport: the public Transport facade, which only forwards, and the
// state's lifecycle (construction and its checks, metadata, close, stats).
// Peers live in peers.cc, transfers in transfers.cc, judgements of peers in
// peer_policy.cc. May touch the engine interface and src/common/ and
// src/wire/; never a UCX header.
#include "kvxfer/transport.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/host.h"
#include "common/log.h"
#include "common/region.h"
#include "core/transport_state.h"
#include "engine.h"
#include "wire/metadata.h"

namespace kvxfer {
namespace internal {
namespace {

constexpr std::chrono::milliseconds kCloseLogFlushTimeout{1000};

// Every numeric option is checked here, before anything reads it: the policy
// and the engines take them as given.
Options checked(Options options) {
  if (options.num_threads < 1) {
    throw std::invalid_argument(
        fmt::format("Options::num_threads must be >= 1; got {}", options.num_threads));
  }
  if (options.strike_limit < 1) {
    throw std::invalid_argument(
        fmt::format("Options::strike_limit must be >= 1; got {}", options.strike_limit));
  }
  if (options.stall_timeout.count() < 0 || options.stall_timeout > kMaxStallTimeout) {
    throw std::invalid_argument(
        fmt::format("Options::stall_timeout must be between 0 (off) and {} ms (a year); got {} ms",
                    kMaxStallTimeout.count(), options.stall_timeout.count()));
  }
  if (options.latency_sample_every < 1) {
    throw std::invalid_argument(fmt::format("Options::latency_sample_every must be >= 1; got {}",
                                            options.latency_sample_every));
  }
  if (options.telemetry &&
      (options.telemetry_capacity < 1 || options.telemetry_capacity > kMaxTelemetryCapacity)) {
    throw std::invalid_argument(
        fmt::format("Options::telemetry_capacity must be between 1 and {}; got {}",
                    kMaxTelemetryCapacity, options.telemetry_capacity));
  }
  if (!options.config_fields.empty() && !options.config_json.empty()) {
    throw std::invalid_argument(
        "Options::config_fields and Options::config_json are both set; set one of them");
  }
  return options;
}

std::string fingerprint_of(const Options& options) {
  return options.config_json.empty() ? config_fingerprint(options.config_fields)
                                     : config_fingerprint_json(options.config_json);
}

}  // namespace

TransportState::TransportState(std::string agent_name, Region region, Options options)
    : agent_name_(std::move(agent_name)),
      region_(region),
      options_(checked(std::move(options))),
      fingerprint_(fingerprint_of(options_)),
      boot_id_(boot_id()),
      sample_every_(static_cast<std::uint32_t>(options_.latency_sample_every)),
      policy_(agent_name_, options_.strike_limit, options_.stall_timeout, &tally_) {
  if (agent_name_.empty()) throw std::invalid_argument("agent_name must not be empty");
  if (options_.telemetry) telemetry_ = std::make_unique<TelemetryRing>(options_.telemetry_capacity);
  // No pool at all (every field zero) is allowed: a transport of regions
  // (register_memory) alone, as NIXL's agents are.
  const bool pool = region_.base != nullptr || region_.num_blocks != 0 || region_.block_len != 0;
  if (pool) {
    if (region_.base == nullptr) throw std::invalid_argument("region base must not be null");
    if (region_.num_blocks == 0) throw std::invalid_argument("region num_blocks must be > 0");
    if (region_.block_len == 0) throw std::invalid_argument("region block_len must be > 0");
    if (!region_is_valid(reinterpret_cast<std::uintptr_t>(region_.base), region_.num_blocks,
                         region_.block_len)) {
      throw std::invalid_argument("region num_blocks * block_len overflows");
    }
  }
  {
    // Slot 0 is the pool's, live when there is one, and never handed out.
    MutexLock lock(mu_);
    LocalRegion& slot0 = regions_.emplace_back();
    slot0.used = true;
    slot0.live = pool;
    if (pool) {
      slot0.base = reinterpret_cast<std::uintptr_t>(region_.base);
      slot0.len = region_.num_blocks * region_.block_len;
      local_by_addr_.emplace(slot0.base, 0);
    }
  }

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
    throw std::invalid_argument(
        fmt::format("no supported backend in [{}] (supported: UCX, LOOPBACK)",
                    fmt::join(options_.backends, ", ")));
  }
  log().info("kvxfer {}: backend={} registered {} blocks of {} bytes", agent_name_, engine_->name(),
             region_.num_blocks, region_.block_len);
  // Last, once nothing here can throw: the thread reads the pool (and the
  // regions registered later) while the caller goes on, and this costs the
  // caller one thread start, when there is a pool.
  const PretouchMode pretouch = engine_->pretouch_mode();
  if (pretouch != PretouchMode::kOff) {
    pretouch_ = std::make_unique<Pretouch>(region_.base, region_.num_blocks * region_.block_len,
                                           pretouch, agent_name_);
  }
}

TransportState::~TransportState() { close(); }

std::vector<std::uint8_t> TransportState::metadata() const {
  {
    MutexLock lock(mu_);
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
  {
    MutexLock lock(mu_);
    for (const auto& [base, slot] : local_by_addr_) {
      const LocalRegion& r = regions_[slot];
      if (r.live && r.id != 0) m.regions.push_back(wire::AgentMetadata::Region{r.id, r.base, r.len});
    }
  }
  return wire::encode(m);
}

bool TransportState::record_post_failure(std::string_view peer_id, std::string_view cause) {
  MutexLock lock(mu_);
  throw_if_closing();
  auto it = peers_.find(peer_id);
  if (it == peers_.end()) return false;
  Peer& peer = *it->second;
  log().warn("kvxfer {}: write_blocks failed for peer={}: {}", agent_name_, peer.id, cause);
  ++peer.counters.post_failures;
  ++post_failures_;
  // What a failed post of that kind costs: one strike (kInvalidParam is not
  // a peer-scope status).
  policy_.record_failure(peer.standing, peer.id, Status::kInvalidParam, cause);
  return true;
}

void TransportState::close() {
  {
    MutexLock lock(mu_);
    if (closing_) return;
    closing_ = true;
  }
  // The pre-touch stops within one of its calls (milliseconds).
  if (pretouch_) pretouch_->stop();
  // Stop taking registrations; a running one finishes (and is discarded).
  worker_.stop();
  std::vector<std::pair<PeerHandle, std::string>> peers;
  {
    MutexLock lock(mu_);
    // Connects and disconnects still running outside the lock finish first.
    while (active_connects_ != 0 || active_disconnects_ != 0) lock.wait(engine_calls_done_);
    for (auto& [id, e] : inflight_) {
      if (const Status st = engine_->release(e.handle); st != Status::kSuccess) {
        log().warn("kvxfer {}: releasing transfer_id={} failed: {}", agent_name_, id,
                   status_name(st));
        unreleased_.push_back(e.handle);
      }
    }
    inflight_.clear();
    // Every handle whose release failed earlier gets one more try.
    if (const std::size_t left = retry_unreleased(); left > 0) {
      log().error("kvxfer {}: {} transfer handle(s) could not be released; they stay live",
                  agent_name_, left);
    }
    peers.reserve(peers_.size());
    for (auto& [id, peer] : peers_) peers.emplace_back(peer->handle, id);
    peers_.clear();
    generations_.clear();
  }
  // Every other call now throws: the disconnects need not hold the lock.
  for (const auto& [handle, id] : peers) disconnect_peer(handle, id);
  // Nor does the shutdown, which may drain for seconds: nothing else calls
  // into the engine now (stats() and metrics() read what it held before).
  {
    MutexLock lock(mu_);
    shutdown_live_ = engine_->live();
    shutdown_counters_ = engine_->counters();
    shutting_down_ = true;
  }
  // No poll drives the engine from here on (drive_engine()).
  engine_closing_.store(true);
  while (engine_drivers_.load() != 0) std::this_thread::yield();
  mu_.assert_not_held("the engine's shutdown");
  engine_->shutdown();
  {
    MutexLock lock(mu_);
    shutting_down_ = false;
    closed_ = true;
    log().info("kvxfer {}: closed", agent_name_);
  }
  // What the transport logged reaches a user's log sink before close()
  // returns; a sink that stalls holds it up for a second at most.
  static_cast<void>(flush_log(kCloseLogFlushTimeout));
}

HandleCounts TransportState::engine_live() const {
  return shutting_down_ ? shutdown_live_ : engine_->live();
}

std::map<std::string, std::uint64_t> TransportState::engine_counters() const {
  std::map<std::string, std::uint64_t> counters =
      shutting_down_ ? shutdown_counters_ : engine_->counters();
  // The pool's pre-touch, beside the engine's own (unstable: docs/metrics.md).
  if (pretouch_) {
    counters["pretouch_pages"] = pretouch_->pages_touched();
    counters["pretouch_running"] = pretouch_->running() ? 1 : 0;
  }
  return counters;
}

Stats TransportState::stats() const {
  Stats s;
  MutexLock lock(mu_);
  s.live = engine_live();
  s.inflight = inflight_.size();
  s.registrations_pending = worker_.pending();
  s.engine_counters = engine_counters();
  for (const auto& [id, peer] : peers_) {
    PeerStats p = peer->counters;
    for (const OpCounters& op : peer->ops) {
      p.transfers_done += op.transfers_done;
      p.transfers_failed += op.transfers_failed;
      p.bytes_done += op.bytes_done;
    }
    const OpCounters& reads = peer->ops[static_cast<std::size_t>(Op::kRead)];
    p.reads_done = reads.transfers_done;
    p.read_bytes_done = reads.bytes_done;
    p.inflight = peer->inflight;
    p.strikes = peer->standing.strikes;
    p.fault = peer->standing.fault;
    s.peers.push_back(std::move(p));
  }
  std::sort(s.peers.begin(), s.peers.end(),
            [](const PeerStats& a, const PeerStats& b) { return a.peer_id < b.peer_id; });
  return s;
}

Metrics TransportState::metrics() const {
  Metrics m;
  m.agent = agent_name_;
  // Histograms first, without the lock: they never need it.
  for (std::size_t i = 0; i < kNumTransferOps; ++i) m.transfer_latency[i] = latency_[i].snapshot();
  m.write_blocks_duration = write_blocks_duration_.snapshot();
  m.poll_duration = poll_duration_.snapshot();
  MutexLock lock(mu_);
  m.ops = ops_;
  m.post_failures = post_failures_;
  m.posts_refused = posts_refused_;
  m.strikes_total = tally_.strikes_total;
  m.faults = tally_.faults;
  m.inflight = inflight_.size();
  m.peers_registered = peers_.size();
  m.registrations_pending = worker_.pending();
  m.engine_counters = engine_counters();
  m.peers.reserve(peers_.size());
  for (const auto& [id, peer] : peers_) {
    PeerMetrics& p = m.peers.emplace_back();
    p.peer_id = id;
    p.ops = peer->ops;
    p.post_failures = peer->counters.post_failures;
    p.posts_refused = peer->counters.posts_refused;
    p.strikes_total = peer->standing.strikes_total;
    if (peer->standing.fault_cause) {
      ++p.faults[static_cast<std::size_t>(*peer->standing.fault_cause)];
    }
    p.inflight = peer->inflight;
    p.strikes = peer->standing.strikes;
    p.faulted = peer->standing.fault.has_value();
  }
  std::sort(m.peers.begin(), m.peers.end(),
            [](const PeerMetrics& a, const PeerMetrics& b) { return a.peer_id < b.peer_id; });
  return m;
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

void Transport::add_remote_peer(const std::string& peer_id,
                                std::span<const std::uint8_t> metadata) {
  state_->add_peer_from_metadata(peer_id, metadata);
}

void Transport::remove_remote_peer(const std::string& peer_id) { state_->remove_peer(peer_id); }

RegionId Transport::register_memory(const void* addr, std::uint64_t len) {
  return state_->register_memory(reinterpret_cast<std::uintptr_t>(addr), len);
}
void Transport::deregister_memory(RegionId id) { state_->deregister_memory(id); }
std::vector<RegionInfo> Transport::regions() const { return state_->regions(); }
std::vector<RegionInfo> Transport::peer_regions(std::string_view peer_id) const {
  return state_->peer_regions(peer_id);
}

DescList Transport::prepare(std::span<const MemDesc> descs,
                            std::optional<std::string_view> peer_id) const {
  return state_->prepare(descs, peer_id);
}

std::optional<TransferId> Transport::transfer(TransferOp op, std::string_view peer_id,
                                              const DescList& local,
                                              std::span<const std::int64_t> local_idx,
                                              const DescList& remote,
                                              std::span<const std::int64_t> remote_idx,
                                              std::span<const std::uint8_t> notify) {
  if (op == TransferOp::kNotify) {
    throw std::invalid_argument("transfer: the op must be a WRITE or a READ");
  }
  return state_->transfer_descs(op, peer_id, local, local_idx, remote, remote_idx, notify,
                                state_->sample_start(state_->other_calls_));
}

std::optional<TransferId> Transport::transfer(TransferOp op, std::string_view peer_id,
                                              const DescList& local, const DescList& remote,
                                              std::span<const std::uint8_t> notify) {
  if (local.size() != remote.size()) {
    throw std::invalid_argument(fmt::format("transfer: {} local descriptors but {} remote ones",
                                            local.size(), remote.size()));
  }
  std::vector<std::int64_t> idx(local.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::int64_t>(i);
  return transfer(op, peer_id, local, idx, remote, idx, notify);
}

const DescList::Run& DescList::find_run(std::uint64_t i, std::size_t& hint) const {
  // Transfers mostly name descriptors in order: the run after the last one
  // found, before a binary search.
  for (std::size_t k = hint + 1; k < runs_.size() && k < hint + 2; ++k) {
    if (i >= runs_[k].first && i - runs_[k].first < runs_[k].count) {
      hint = k;
      return runs_[k];
    }
  }
  const auto it = std::upper_bound(runs_.begin(), runs_.end(), i,
                                   [](std::uint64_t v, const Run& r) { return v < r.first; });
  hint = static_cast<std::size_t>(std::prev(it) - runs_.begin());
  return *std::prev(it);
}

MemDesc DescList::at(std::size_t i) const {
  if (i >= size_) throw std::out_of_range(fmt::format("descriptor {} of a list of {}", i, size_));
  std::size_t hint = 0;
  const Run& r = run_of(i, hint);
  return MemDesc{r.addr + (i - r.first) * r.stride, r.len};
}
std::vector<std::string> Transport::peers() const { return state_->peer_ids(); }

std::optional<TransferId> Transport::write_blocks(std::string_view peer_id,
                                                  std::span<const std::int64_t> local_idxs,
                                                  std::span<const std::int64_t> remote_idxs,
                                                  std::span<const std::uint8_t> notify) {
  return state_->transfer(internal::Op::kWrite, peer_id, local_idxs, remote_idxs, notify,
                          state_->sample_start(state_->write_calls_));
}

std::optional<TransferId> Transport::write_blocks(std::string_view peer_id,
                                                  std::span<const std::int32_t> local_idxs,
                                                  std::span<const std::int32_t> remote_idxs,
                                                  std::span<const std::uint8_t> notify) {
  return state_->transfer(internal::Op::kWrite, peer_id, local_idxs, remote_idxs, notify,
                          state_->sample_start(state_->write_calls_));
}

std::optional<TransferId> Transport::read_blocks(std::string_view peer_id,
                                                 std::span<const std::int64_t> local_idxs,
                                                 std::span<const std::int64_t> remote_idxs,
                                                 std::span<const std::uint8_t> notify) {
  return state_->transfer(internal::Op::kRead, peer_id, local_idxs, remote_idxs, notify,
                          state_->sample_start(state_->other_calls_));
}

std::optional<TransferId> Transport::read_blocks(std::string_view peer_id,
                                                 std::span<const std::int32_t> local_idxs,
                                                 std::span<const std::int32_t> remote_idxs,
                                                 std::span<const std::uint8_t> notify) {
  return state_->transfer(internal::Op::kRead, peer_id, local_idxs, remote_idxs, notify,
                          state_->sample_start(state_->other_calls_));
}

std::optional<TransferId> Transport::send_notification(std::string_view peer_id,
                                                       std::span<const std::uint8_t> message) {
  return state_->send_notification(peer_id, message, state_->sample_start(state_->other_calls_));
}

std::map<std::string, std::vector<std::vector<std::uint8_t>>> Transport::get_notifications() {
  return state_->get_notifications();
}

PollResult Transport::poll(std::optional<std::string_view> peer_id) {
  return state_->poll(peer_id, state_->sample_start(state_->poll_calls_));
}

bool Transport::record_post_failure(std::string_view peer_id, std::string_view cause) {
  return state_->record_post_failure(peer_id, cause);
}

std::vector<TransferId> Transport::cancel(std::span<const TransferId> ids, CancelMode mode) {
  return state_->cancel(ids, mode);
}

void Transport::close() { state_->close(); }
bool Transport::closed() const noexcept { return state_->closed(); }
Stats Transport::stats() const { return state_->stats(); }
Metrics Transport::metrics() const { return state_->metrics(); }
Telemetry Transport::telemetry() { return state_->take_telemetry(); }
loopback::FaultPlan* Transport::fault_plan() noexcept {
  return loopback_fault_plan(*state_->engine_);
}

std::string_view version() noexcept { return "kvxfer " KVXFER_VERSION; }

std::string library_path() {
  // dladdr on a function of this file names the object that holds this code,
  // whichever copy the loader picked (RPATH, LD_LIBRARY_PATH, ld.so.cache).
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(&version), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  return info.dli_fname;
}

}  // namespace kvxfer
