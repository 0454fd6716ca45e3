// SPDX-License-Identifier: Apache-2.0
// The loopback engine: peers are other LOOPBACK transports of this process, a
// WRITE is a memcpy, and the user's FaultPlan (fault_script.h) scripts every
// failure a real engine can produce. May use engine.h and common/; never core/.
//
// Users test their tier code against it; so do our unit tests.
#include <fmt/format.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "engine.h"
#include "engines/loopback/fault_script.h"
#include "engines/loopback/loopback_pool.h"
#include "kvxfer/loopback.h"
#include "wire/loopback_blob.h"

namespace kvxfer::internal {
namespace {

using loopback_engine::Pool;
using loopback_engine::PoolRegion;
using loopback_engine::PoolRegistry;

std::uint64_t random_cookie() {
  static Mutex mu;
  static std::mt19937_64 rng GUARDED_BY(mu){std::random_device{}()};
  MutexLock lock(mu);
  return rng();
}

class LoopbackEngine final : public Engine {
 public:
  explicit LoopbackEngine(const EngineConfig& config)
      : Engine(config.region.block_len), agent_name_(config.agent_name), region_(config.region) {
    const std::uint64_t blocks = region_.num_blocks;
    const std::uint64_t len = region_.block_len;
    const bool pool = region_.base != nullptr || blocks != 0 || len != 0;
    if (pool && (region_.base == nullptr || blocks == 0 || len == 0 ||
                 blocks > std::numeric_limits<std::uint64_t>::max() / len)) {
      throw std::runtime_error("loopback engine: the local pool is not a valid region");
    }
    local_ = std::make_shared<Pool>();
    local_->agent_name = agent_name_;
    local_->base = static_cast<std::byte*>(region_.base);
    local_->num_blocks = blocks;
    local_->block_len = len;
    local_->regions.push_back(PoolRegion{0, local_->base, blocks * len, pool});
    local_->cookie = random_cookie();
    key_ = PoolRegistry::instance().add(local_);
    plan_.set_lander([this](TransferId id) { land(id); });
    log().debug("loopback {}: registered {} blocks of {} bytes", agent_name_, blocks, len);
  }

  ~LoopbackEngine() override {
    plan_.set_lander(nullptr);
    shutdown();
  }

  LoopbackEngine(const LoopbackEngine&) = delete;
  LoopbackEngine& operator=(const LoopbackEngine&) = delete;

  [[nodiscard]] const std::string& name() const noexcept override {
    static const std::string kName = "LOOPBACK";
    return kName;
  }

  [[nodiscard]] std::vector<std::uint8_t> local_blob() const override {
    return wire::encode_loopback_blob({key_, local_->cookie});
  }

  [[nodiscard]] Status connect(std::span<const std::uint8_t> blob, const RemoteRegion& remote,
                               PeerHandle* out, std::string* reason) override {
    const auto refuse = [&](Status st, std::string why) {
      if (reason != nullptr) *reason = std::move(why);
      return st;
    };
    // The delay stands in for wireup and runs unlocked, like real wireup.
    if (const int delay_ms = plan_.connect_delay_ms(); delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    }
    if (const Status scripted = plan_.on_connect(remote.agent_name); scripted != Status::kSuccess) {
      log().debug("loopback {}: connect to {} fails as scripted", agent_name_, remote.agent_name);
      return refuse(scripted, "the fault plan scripted this connect to fail");
    }
    wire::LoopbackBlob where;
    if (!wire::decode_loopback_blob(blob, &where)) {
      return refuse(Status::kInvalidParam,
                    fmt::format("peer {} sent a malformed loopback blob ({} bytes)",
                                remote.agent_name, blob.size()));
    }
    if (remote.pid != 0 && remote.pid != static_cast<std::uint32_t>(::getpid())) {
      return refuse(Status::kNotFound,
                    fmt::format("peer {} lives in process {}: loopback peers must be in this "
                                "process ({}); use backends=[\"UCX\"] across processes",
                                remote.agent_name, remote.pid, ::getpid()));
    }
    std::shared_ptr<Pool> pool = PoolRegistry::instance().find(where.key, where.cookie);
    if (pool == nullptr) {
      return refuse(Status::kNotFound,
                    fmt::format("no loopback pool of peer {} is open in this process (closed?)",
                                remote.agent_name));
    }
    // We copy into the pool and regions the registry knows, so anything the
    // metadata claims must match them exactly.
    if (pool->agent_name != remote.agent_name ||
        reinterpret_cast<std::uintptr_t>(pool->base) != remote.base_addr ||
        pool->num_blocks != remote.num_blocks || pool->block_len != remote.block_len ||
        !regions_match(*pool, remote.regions)) {
      return refuse(Status::kMismatch,
                    fmt::format("the metadata of peer {} does not match its loopback pool and "
                                "regions",
                                remote.agent_name));
    }
    std::vector<std::uint64_t> ids;
    ids.reserve(remote.regions.size());
    for (const MemRegion& r : remote.regions) ids.push_back(r.id);

    MutexLock lock(mu_);
    if (shut_down_) return refuse(Status::kNotAllowed, "this transport is closing");
    const PeerHandle handle = next_peer_++;
    peers_.emplace(handle, Peer{std::move(pool), remote.agent_name, std::move(ids)});
    *out = handle;
    log().debug("loopback {}: connected to {}", agent_name_, remote.agent_name);
    return Status::kSuccess;
  }

  [[nodiscard]] Status disconnect(PeerHandle peer) override {
    // A paused teardown stands in for one waiting on a frozen peer; it waits
    // unlocked, as a real engine's does.
    plan_.wait_while_disconnects_paused();
    MutexLock lock(mu_);
    const auto it = peers_.find(peer);
    if (it == peers_.end()) return Status::kInvalidParam;
    // Closing the endpoint ends every WRITE still posted through it: none of
    // them can land any more.
    for (Slot& slot : slots_) {
      if (slot.in_use && slot.peer == peer && slot.pending) {
        finish_pending(slot, Status::kCanceled);
        recycle_if_done(slot);
      }
    }
    // Two teardown steps, the key and the endpoint, each attempted whatever
    // the other did.
    const Status key_status = plan_.on_disconnect();
    if (key_status != Status::kSuccess) {
      log().warn("loopback {}: releasing the remote key of {} failed: {}", agent_name_,
                 it->second.agent_name, status_name(key_status));
    }
    log().debug("loopback {}: disconnected from {}", agent_name_, it->second.agent_name);
    peers_.erase(it);
    return key_status;
  }

  [[nodiscard]] Status post(PeerHandle peer, const Post& post, XferHandle* out) override {
    return post_runs(post.op, peer, post.id, post.runs, out, post.note);
  }

  [[nodiscard]] Status add_region(const MemRegion& region, std::string* reason) override {
    MutexLock lock(mu_);
    if (shut_down_) {
      if (reason != nullptr) *reason = "this transport is closing";
      return Status::kNotAllowed;
    }
    const std::uint32_t slot = region_slot(region.id);
    std::unique_lock copy_lock(local_->copy_mu);
    if (local_->regions.size() <= slot) local_->regions.resize(std::size_t{slot} + 1);
    local_->regions[slot] =
        PoolRegion{region.id, reinterpret_cast<std::byte*>(region.base), region.len, true};
    return Status::kSuccess;
  }

  [[nodiscard]] Status remove_region(std::uint64_t id) override {
    // Copies run under copy_mu (shared): once this holds it, none is under
    // way, and none that starts later finds the region (a held transfer
    // that names it never lands).
    MutexLock lock(mu_);
    const std::uint32_t slot = region_slot(id);
    std::unique_lock copy_lock(local_->copy_mu);
    if (slot >= local_->regions.size() || local_->regions[slot].id != id) return Status::kNotFound;
    local_->regions[slot].live = false;
    return Status::kSuccess;
  }

  void take_notifications(std::vector<Notification>* out) override {
    MutexLock lock(local_->notes_mu);
    for (Notification& n : local_->notes) out->push_back(std::move(n));
    local_->notes.clear();
  }

  [[nodiscard]] Status check(XferHandle xfer, Status* state) override {
    MutexLock lock(mu_);
    Slot* slot = live_slot(xfer);
    if (slot == nullptr) return Status::kInvalidParam;
    if (slot->forced != Status::kSuccess) {
      *state = slot->forced;
      return Status::kSuccess;
    }
    if (const auto it = peers_.find(slot->peer); it != peers_.end()) {
      if (const Status error = plan_.check_error(slot->id, it->second.agent_name);
          error != Status::kSuccess) {
        return error;
      }
      // The target agent is gone: nothing of this transfer can be trusted.
      if (!it->second.pool->alive.load()) return Status::kRemoteDisconnect;
    }
    const Status scripted = plan_.final_state(slot->id);
    if (slot->pending) {
      if (scripted == Status::kSuccess) {
        *state = Status::kInProgress;
        return Status::kSuccess;
      }
      finish_pending(*slot, scripted);  // it failed before landing
    }
    *state = scripted;
    return Status::kSuccess;
  }

  [[nodiscard]] Status release(XferHandle xfer) override {
    MutexLock lock(mu_);
    Slot* slot = live_slot(xfer);
    if (slot == nullptr) return Status::kInvalidParam;
    if (const Status scripted = plan_.on_release(); scripted != Status::kSuccess) {
      log().debug("loopback {}: release of transfer {} fails as scripted: {}", agent_name_,
                  slot->id, status_name(scripted));
      return scripted;
    }
    // Releasing does not stop a pending WRITE: the slot stays until it lands
    // or its endpoint is closed, as a real engine keeps its request. A
    // pending READ stops here: its bytes never reach our pool.
    // A pending notification alone stops too; a pending WRITE's bytes still
    // land, but a notification released before they did is never delivered.
    if (slot->pending && slot->op != Op::kWrite) finish_pending(*slot, Status::kCanceled);
    if (slot->pending) slot->notify.clear();
    slot->released = true;
    --live_transfers_;
    recycle_if_done(*slot);
    return Status::kSuccess;
  }

  [[nodiscard]] HandleCounts live() const override {
    MutexLock lock(mu_);
    HandleCounts counts;
    counts.memory_registrations = shut_down_ ? 0 : 1;
    counts.peers = peers_.size();
    counts.remote_keys = peers_.size();
    counts.transfers = live_transfers_;
    counts.requests = pending_;
    return counts;
  }

  void shutdown() override {
    // A paused teardown stands in for a real engine's drain (up to seconds).
    plan_.wait_while_disconnects_paused();
    MutexLock lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    {
      // Waits out any copy another agent is making into our pool; none
      // starts after this.
      std::unique_lock copy_lock(local_->copy_mu);
      local_->alive.store(false);
    }
    PoolRegistry::instance().remove(key_);
    // Nothing reads our pool after this: a WRITE still held never lands.
    for (Slot& slot : slots_) {
      if (slot.in_use && slot.pending) {
        finish_pending(slot, Status::kCanceled);
        recycle_if_done(slot);
      }
    }
    // Peers the core did not disconnect and transfers it did not release stay
    // counted, so live() shows what a real engine would have leaked.
    if (!peers_.empty() || live_transfers_ > 0) {
      log().debug("loopback {}: shut down with {} peer(s) and {} transfer(s) still held",
                  agent_name_, peers_.size(), live_transfers_);
    }
    log().debug("loopback {}: shut down", agent_name_);
  }

  [[nodiscard]] loopback::FaultPlan& fault_plan() noexcept { return plan_.plan(); }

 private:
  using Op = TransferOp;

  struct Peer {
    std::shared_ptr<Pool> pool;
    std::string agent_name;
    std::vector<std::uint64_t> region_ids;  // ByteRun::remote_region -> the target's id
  };

  // Whether every region the metadata lists is live in `pool`, where it says.
  static bool regions_match(Pool& pool, const std::vector<MemRegion>& listed) {
    std::shared_lock copy_lock(pool.copy_mu);
    return std::all_of(listed.begin(), listed.end(), [&](const MemRegion& r) {
      const std::uint32_t slot = region_slot(r.id);
      if (slot >= pool.regions.size()) return false;
      const PoolRegion& have = pool.regions[slot];
      return have.live && have.id == r.id && reinterpret_cast<std::uintptr_t>(have.base) == r.base &&
             have.len == r.len;
    });
  }

  // A transfer record. Slots are reused, and so are their index vectors'
  // buffers, so a steady stream of writes allocates nothing.
  struct Slot {
    std::uint32_t generation = 0;
    bool in_use = false;
    bool released = false;             // the core let go of the handle
    bool pending = false;              // held by the plan: bytes not written yet
    Status forced = Status::kSuccess;  // final state forced by a disconnect
    TransferId id = 0;
    PeerHandle peer = 0;
    Op op = Op::kWrite;
    std::vector<std::uint8_t> notify;  // delivered when the bytes land
    std::vector<ByteRun> runs;         // a held transfer's
  };

  // One WRITE (our blocks into the peer's), READ (the peer's into ours) or
  // notification alone (no runs); the fault plan scripts them alike.
  Status post_runs(Op op, PeerHandle peer, TransferId id, std::span<const ByteRun> runs,
                   XferHandle* out, std::span<const std::uint8_t> notify) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (shut_down_) return Status::kNotAllowed;
    const auto it = peers_.find(peer);
    if (it == peers_.end()) return Status::kInvalidParam;  // not a handle of ours
    Peer& target = it->second;
    // The core validated the runs; checking again (at every copy, against
    // the regions as they are then) is cheap next to the copies and keeps a
    // core bug from becoming a stray write.
    if (!runs_fit(runs, target)) return Status::kInvalidParam;

    const FaultScript::PostDecision decision = plan_.on_post(target.agent_name);
    if (decision.status != Status::kSuccess) {
      log().debug("loopback {}: post of {} {} to {} fails as scripted: {}", agent_name_,
                  op == Op::kRead ? "read" : "write", id, target.agent_name,
                  status_name(decision.status));
      // Failing part-way, a real engine must settle what it already issued
      // before it returns: nothing may touch the caller's blocks once
      // the post has said no. Issued and not held, those blocks landed
      // (we waited for them); held, they were still in flight: cancelled.
      if (decision.started > 0 && !decision.hold) {
        (void)copy_blocks(op, target, runs,
                          static_cast<std::uint64_t>(decision.started) * region_.block_len);
      }
      return decision.status;
    }
    if (!target.pool->alive.load()) return Status::kRemoteDisconnect;

    const std::uint32_t index = acquire_slot();
    Slot& slot = slots_[index];
    slot.id = id;
    slot.peer = peer;
    slot.op = op;
    slot.notify.assign(notify.begin(), notify.end());
    if (decision.hold) {
      slot.pending = true;
      slot.runs.assign(runs.begin(), runs.end());
      ++pending_;
    } else if (!copy_blocks(op, target, runs)) {
      free_slot(index);
      return Status::kRemoteDisconnect;  // the pool went away under us
    } else {
      deliver(slot, *target.pool);
    }
    ++live_transfers_;
    *out = handle_of(index);
    // A test may have asked for the landing before the post returned.
    if (slot.pending && plan_.landing_requested(id)) land_locked(slot);
    return Status::kSuccess;
  }

  // A handle is the slot index + 1 in the low half and the slot's
  // generation in the high half, so a stale handle is recognised.
  static XferHandle handle_of_slot(std::uint32_t index, std::uint32_t generation) {
    return (XferHandle{generation} << 32) | (XferHandle{index} + 1);
  }
  XferHandle handle_of(std::uint32_t index) const REQUIRES(mu_) {
    return handle_of_slot(index, slots_[index].generation);
  }

  Slot* live_slot(XferHandle xfer) REQUIRES(mu_) {
    const std::uint64_t low = xfer & 0xffffffffu;
    if (low == 0 || low > slots_.size()) return nullptr;
    Slot& slot = slots_[low - 1];
    if (!slot.in_use || slot.released ||
        slot.generation != static_cast<std::uint32_t>(xfer >> 32)) {
      return nullptr;
    }
    return &slot;
  }

  std::uint32_t acquire_slot() REQUIRES(mu_) {
    std::uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = static_cast<std::uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    Slot& slot = slots_[index];
    slot.in_use = true;
    slot.released = false;
    slot.pending = false;
    slot.forced = Status::kSuccess;
    slot.runs.clear();
    return index;
  }

  void free_slot(std::uint32_t index) REQUIRES(mu_) {
    Slot& slot = slots_[index];
    slot.in_use = false;
    ++slot.generation;
    free_.push_back(index);
  }

  void recycle_if_done(Slot& slot) REQUIRES(mu_) {
    if (!slot.released || slot.pending) return;
    plan_.forget(slot.id);
    free_slot(static_cast<std::uint32_t>(&slot - slots_.data()));
  }

  void finish_pending(Slot& slot, Status state) REQUIRES(mu_) {
    slot.pending = false;
    slot.forced = state;
    --pending_;
  }

  // The bytes a run names on each side, or nullptr where a side lies
  // outside its (live) region. Our table is ours to read under mu_; the
  // target's under its copy_mu (the caller holds it, shared).
  struct Ends {
    std::byte* ours = nullptr;
    std::byte* theirs = nullptr;
  };
  Ends ends_of(const ByteRun& run, const Peer& target) const REQUIRES(mu_) {
    const auto at = [](const PoolRegion* r, std::uint64_t id, std::uint64_t offset,
                       std::uint64_t len) -> std::byte* {
      if (r == nullptr || !r->live || r->id != id || len == 0 || len > r->len ||
          offset > r->len - len) {
        return nullptr;
      }
      return r->base + offset;
    };
    const auto& mine = local_->regions;
    const PoolRegion* local =
        run.local_region < mine.size() ? &mine[run.local_region] : nullptr;
    Ends ends;
    ends.ours = at(local, local != nullptr ? local->id : 0, run.local, run.len);
    if (run.remote_region < target.region_ids.size()) {
      const std::uint64_t id = target.region_ids[run.remote_region];
      const auto& theirs = target.pool->regions;
      const std::uint32_t slot = region_slot(id);
      ends.theirs = at(slot < theirs.size() ? &theirs[slot] : nullptr, id, run.remote, run.len);
    }
    return ends;
  }

  bool runs_fit(std::span<const ByteRun> runs, const Peer& target) const REQUIRES(mu_) {
    std::shared_lock copy_lock(target.pool->copy_mu);
    for (const ByteRun& run : runs) {  // a loop, not a lambda: the analysis sees mu_ held
      const Ends ends = ends_of(run, target);
      if (ends.ours == nullptr || ends.theirs == nullptr) return false;
    }
    return true;
  }

  // The copy itself: our blocks into the target's (a WRITE) or the target's
  // into ours (a READ), run by run, the first `most` bytes at most. False
  // when the target pool is gone or a region a run names is (a held
  // transfer's, deregistered since); then nothing was touched.
  bool copy_blocks(Op op, const Peer& peer, std::span<const ByteRun> runs,
                   std::uint64_t most = ~std::uint64_t{0}) REQUIRES(mu_) {
    Pool& target = *peer.pool;
    std::shared_lock copy_lock(target.copy_mu);
    if (!target.alive.load()) return false;
    for (const ByteRun& run : runs) {
      const Ends ends = ends_of(run, peer);
      if (ends.ours == nullptr || ends.theirs == nullptr) return false;
    }
    const bool self = &target == local_.get();  // source and target may overlap
    for (const ByteRun& run : runs) {
      if (most == 0) break;
      const std::uint64_t len = std::min(run.len, most);
      most -= len;
      const Ends ends = ends_of(run, peer);
      std::byte* ours = ends.ours;
      std::byte* theirs = ends.theirs;
      std::byte* to = op == Op::kWrite ? theirs : ours;
      const std::byte* from = op == Op::kWrite ? ours : theirs;
      if (self) {
        std::memmove(to, from, len);
      } else {
        std::memcpy(to, from, len);
      }
    }
    return true;
  }

  // After a transfer's bytes landed: its notification, if any, goes to the
  // target's queue, unless the plan already scripted the transfer to fail.
  // A full queue refuses it and fails the transfer (the bytes are there).
  void deliver(Slot& slot, Pool& target) {
    if (slot.notify.empty() || plan_.final_state(slot.id) != Status::kSuccess) return;
    MutexLock lock(target.notes_mu);
    if (!target.alive.load() || target.notes.size() >= kMaxQueuedNotifications) {
      slot.forced = Status::kBackend;
      return;
    }
    target.notes.push_back(Notification{agent_name_, slot.notify});
  }

  // Writes a held transfer's bytes now (if its target is still there).
  void land_locked(Slot& slot) REQUIRES(mu_) {
    const auto it = peers_.find(slot.peer);
    if (it != peers_.end() && copy_blocks(slot.op, it->second, slot.runs)) {
      deliver(slot, *it->second.pool);
    } else if (it != peers_.end() && it->second.pool->alive.load() &&
               slot.forced == Status::kSuccess) {
      // Nothing landed (a region a run names is gone since): no completion
      // may say it did. (A target that is gone is check()'s to report.)
      slot.forced = Status::kCanceled;
    }
    slot.pending = false;
    --pending_;
    recycle_if_done(slot);
  }

  void land(TransferId id) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (shut_down_) return;
    for (Slot& slot : slots_) {
      if (slot.in_use && slot.pending && slot.id == id) {
        land_locked(slot);
        return;
      }
    }
  }

  const std::string agent_name_;
  const Region region_;
  std::shared_ptr<Pool> local_;
  std::uint64_t key_ = 0;
  FaultScript plan_;  // what the user scripted through plan_.plan()

  // Taken before the plan's own lock (plan_'s hooks run under it), never
  // after it: FaultPlan::land calls land() outside the plan's lock.
  mutable Mutex mu_;
  bool shut_down_ GUARDED_BY(mu_) = false;
  PeerHandle next_peer_ GUARDED_BY(mu_) = 1;
  std::unordered_map<PeerHandle, Peer> peers_ GUARDED_BY(mu_);
  std::vector<Slot> slots_ GUARDED_BY(mu_);
  std::vector<std::uint32_t> free_ GUARDED_BY(mu_);
  std::uint64_t live_transfers_ GUARDED_BY(mu_) = 0;
  std::uint64_t pending_ GUARDED_BY(mu_) = 0;
};

}  // namespace

loopback::FaultPlan* loopback_fault_plan(Engine& engine) noexcept {
  auto* loopback = dynamic_cast<LoopbackEngine*>(&engine);
  return loopback != nullptr ? &loopback->fault_plan() : nullptr;
}

std::unique_ptr<Engine> make_loopback_engine(const EngineConfig& config) {
  return std::make_unique<LoopbackEngine>(config);
}

}  // namespace kvxfer::internal
