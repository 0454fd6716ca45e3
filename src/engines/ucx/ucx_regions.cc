// SPDX-License-Identifier: Apache-2.0
// The UCX lane's regions besides the pool (ucx_lane.h). Ours: each
// registered with UCX (ucp_mem_map) and its rkey packed and published in the
// blob; removed by taking it out of the blob and of posts, waiting until no
// put or get of ours names it, and unregistering it. The peer's: matched at
// connect with the keys its blob publishes, and every run of a descriptor
// post checked against the region it names before it is posted. That check
// is the only one: a put or get is one-sided, so the target's lane sees
// nothing of it (over RDMA its NIC bounds it to the region the rkey names).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "common/log.h"
#include "engines/ucx/ucx_compat.h"
#include "engines/ucx/ucx_lane.h"

namespace kvxfer::internal::ucx {
namespace {

using Clock = std::chrono::steady_clock;

// How long remove_region waits for the puts and gets of ours that name the
// region (their flushes) before it gives up on unregistering it.
constexpr auto kRemoveTimeout = std::chrono::seconds(10);

// Whether [offset, offset + len) lies inside a region of `size` bytes.
bool fits(std::uint64_t offset, std::uint64_t len, std::uint64_t size) {
  return len <= size && offset <= size - len;
}

}  // namespace

// A region's registration, made or undone in the driver's turn (the
// context's registration cache is the worker's too).
struct UcxLane::RegionJob {
  RegionJob(UcxLane* in, const MemRegion& r, ucp_mem_h registered = nullptr)
      : lane(in), region(r), memh(registered) {}
  UcxLane* lane = nullptr;
  MemRegion region;
  ucp_mem_h memh = nullptr;
  std::vector<std::uint8_t> packed;
  ucs_status_t status = UCS_OK;
  bool done = false;  // under the driver's lock
};

void UcxLane::run_map_region(void* arg) {
  auto& job = *static_cast<RegionJob*>(arg);
  UcxLane& lane = *job.lane;
  lane.driver_.check_turn();
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = reinterpret_cast<void*>(job.region.base);
  params.length = job.region.len;
  ucs_status_t st = ucp_mem_map(lane.driver_.context(), &params, &job.memh);
  void* rkey = nullptr;
  std::size_t rkey_len = 0;
  if (st == UCS_OK &&
      (st = ucx_compat::pack_rkey(lane.driver_.context(), job.memh, &rkey, &rkey_len)) == UCS_OK) {
    job.packed.assign(static_cast<std::uint8_t*>(rkey),
                      static_cast<std::uint8_t*>(rkey) + rkey_len);
    ucx_compat::release_packed_rkey(rkey);
  } else if (job.memh != nullptr) {
    static_cast<void>(ucp_mem_unmap(lane.driver_.context(), job.memh));
    job.memh = nullptr;
  }
  lane.driver_.finish([&] {
    job.status = st;
    job.done = true;
  });
}

void UcxLane::run_unmap_region(void* arg) {
  auto& job = *static_cast<RegionJob*>(arg);
  UcxLane& lane = *job.lane;
  lane.driver_.check_turn();
  const ucs_status_t st = ucp_mem_unmap(lane.driver_.context(), job.memh);
  if (st != UCS_OK) {
    log().error("kvxfer ucx {}: ucp_mem_unmap of region {:#x} failed: {}", lane.agent_name_,
                job.region.id, ucs_status_string(st));
  }
  lane.driver_.finish([&] {
    job.status = st;
    job.done = true;
  });
}

Status UcxLane::add_region(const MemRegion& region, std::string* reason) {
  const auto refuse = [&](Status st, std::string why) {
    if (reason != nullptr) *reason = std::move(why);
    return st;
  };
  const std::uint32_t slot = region_slot(region.id);
  if (slot == 0 || region.len == 0 || region.base == 0) {
    return refuse(Status::kInvalidParam, "not a region besides the pool");
  }
  if (!accepting_.load(std::memory_order_acquire) || !driver_.has_worker()) {
    return refuse(Status::kNotAllowed, "the ucx lane is stopping");
  }
  {
    MutexLock lock(regions_mu_);
    if (region_keys_ >= wire::kMaxRegionKeys) {
      return refuse(
          Status::kNotAllowed,
          fmt::format("the ucx lane publishes keys for {} regions at most", wire::kMaxRegionKeys));
    }
    if (regions_.size() <= slot) regions_.resize(std::size_t{slot} + 1);
    if (regions_[slot].id != 0) return refuse(Status::kInvalidParam, "its slot is taken");
    regions_[slot].id = region.id;  // reserved; not live until registered
    ++region_keys_;
  }
  RegionJob job{this, region};
  driver_.submit({&UcxLane::run_map_region, &job});
  static_cast<void>(driver_.wait([&] { return job.done; }, Clock::time_point::max()));
  std::string why;
  {
    MutexLock lock(regions_mu_);
    OwnRegion& r = regions_[slot];
    if (job.status != UCS_OK) {
      why = fmt::format("registering it with UCX failed: {}", ucs_status_string(job.status));
    } else if (job.packed.empty() || job.packed.size() > wire::kMaxRegionRkey ||
               region_key_bytes_ + job.packed.size() > wire::kMaxRegionKeyBytes) {
      why = fmt::format("its rkey ({} bytes) does not fit the blob ({} bytes of keys published)",
                        job.packed.size(), region_key_bytes_);
    }
    if (why.empty()) {
      r.base = reinterpret_cast<std::uint8_t*>(region.base);
      r.len = region.len;
      r.memh = job.memh;
      r.packed = std::move(job.packed);
      r.live = true;
      region_key_bytes_ += r.packed.size();
      live_regions_.fetch_add(1, std::memory_order_relaxed);
      return Status::kSuccess;
    }
    r = OwnRegion{};
    --region_keys_;
  }
  if (job.memh != nullptr) {
    RegionJob undo{this, region, job.memh};
    driver_.submit({&UcxLane::run_unmap_region, &undo});
    static_cast<void>(driver_.wait([&] { return undo.done; }, Clock::time_point::max()));
  }
  return refuse(job.status != UCS_OK ? Status::kBackend : Status::kNotAllowed, std::move(why));
}

Status UcxLane::remove_region(std::uint64_t id) {
  const std::uint32_t slot = region_slot(id);
  {
    // From here it leaves the blob, and no post names it.
    MutexLock lock(regions_mu_);
    if (slot == 0 || slot >= regions_.size() || regions_[slot].id != id || !regions_[slot].live) {
      return Status::kNotFound;
    }
    regions_[slot].live = false;
  }
  // Posted ones end with their flushes (or their endpoint's failure);
  // queued ones are cancelled when the driver reaches them (run_post).
  const bool idle = driver_.wait(
      [&] {
        MutexLock lock(regions_mu_);
        return regions_[slot].busy == 0;
      },
      Clock::now() + kRemoveTimeout);
  RegionJob job{this, MemRegion{id, 0, 0}};
  {
    MutexLock lock(regions_mu_);
    OwnRegion& r = regions_[slot];
    if (!idle) {
      // Unregistering it now could let a late get land after we return (UCX's
      // tcp transport copies replies in software): it stays registered, out
      // of the blob and of posts, until the lane stops.
      log().error(
          "kvxfer ucx {}: {} transfer(s) of ours into or out of region {:#x} did not end in {} s; "
          "it stays registered with UCX until the transport closes",
          agent_name_, r.busy, id, std::chrono::seconds(kRemoveTimeout).count());
      return Status::kBackend;
    }
    job.memh = std::exchange(r.memh, nullptr);
    region_key_bytes_ -= r.packed.size();
    --region_keys_;
    r = OwnRegion{};
  }
  live_regions_.fetch_sub(1, std::memory_order_relaxed);
  if (!driver_.has_worker()) return Status::kSuccess;  // destroyed with the context
  driver_.submit({&UcxLane::run_unmap_region, &job});
  static_cast<void>(driver_.wait([&] { return job.done; }, Clock::time_point::max()));
  return job.status == UCS_OK ? Status::kSuccess : Status::kBackend;
}

void UcxLane::publish(wire::PeerBlob& blob) const {
  blob.worker_address = driver_.address();
  blob.rkey = packed_rkey_;
  blob.region_keys.clear();
  MutexLock lock(regions_mu_);
  for (const OwnRegion& r : regions_) {
    if (!r.live) continue;
    blob.region_keys.push_back(
        wire::RegionKey{r.id, reinterpret_cast<std::uintptr_t>(r.base), r.len, r.packed});
  }
  std::sort(blob.region_keys.begin(), blob.region_keys.end(),
            [](const wire::RegionKey& a, const wire::RegionKey& b) { return a.id < b.id; });
}

Status UcxLane::match_regions(const wire::PeerBlob& blob, const RemoteRegion& remote,
                              std::vector<PeerRegion>* regions,
                              std::vector<std::span<const std::uint8_t>>* packed,
                              std::string* why) {
  regions->reserve(remote.regions.size());
  packed->reserve(remote.regions.size());
  for (const MemRegion& r : remote.regions) {
    if (r.id == 0) {
      if (blob.rkey.empty()) {
        *why = fmt::format("peer {} lists a pool but its UCX lane publishes no key for it",
                           remote.agent_name);
        return Status::kMismatch;
      }
      regions->push_back(PeerRegion{0, r.base, r.len});
      packed->push_back(blob.rkey);
      continue;
    }
    // The keys are in increasing id order (wire/peer_blob.h checked it).
    const auto& keys = blob.region_keys;
    const auto key =
        std::lower_bound(keys.begin(), keys.end(), r.id,
                         [](const wire::RegionKey& k, std::uint64_t id) { return k.id < id; });
    if (key == keys.end() || key->id != r.id) {
      *why = fmt::format(
          "peer {}'s metadata lists region {:#x}, for which its UCX lane publishes no key "
          "(registered while the metadata was taken, or forged: take its metadata again)",
          remote.agent_name, r.id);
      return Status::kMismatch;
    }
    if (key->base != r.base || key->len != r.len) {
      *why = fmt::format(
          "peer {}'s metadata puts region {:#x} at {:#x} ({} bytes), its UCX lane's key at {:#x} "
          "({} bytes)",
          remote.agent_name, r.id, r.base, r.len, key->base, key->len);
      return Status::kMismatch;
    }
    regions->push_back(PeerRegion{r.id, r.base, r.len});
    packed->push_back(key->rkey);
  }
  return Status::kSuccess;
}

// Checks every run of a descriptor post against the peer's region it names
// and ours, finds where each starts in our memory, and holds our regions it
// names (not the pool) until its puts or gets ended. Nothing is held when
// it refuses.
Status UcxLane::hold_runs(const Endpoint& ep, const Post& post, Xfer* x) {
  x->local_at.clear();
  x->held_regions.clear();
  const auto refuse = [&](std::size_t i, const char* what) {
    count(kRunsRefused);
    const ByteRun& run = post.runs[i];
    log().warn(
        "kvxfer ucx {}: refused transfer {} to peer {}: run {} ({} bytes at {} of its region {}, "
        "from {} of our slot {}) {}",
        agent_name_, post.id, ep.agent_name, i, run.len, run.remote, run.remote_region, run.local,
        run.local_region, what);
    return Status::kInvalidParam;
  };
  for (std::size_t i = 0; i < post.runs.size(); ++i) {
    const ByteRun& run = post.runs[i];
    if (run.remote_region >= ep.regions.size() ||
        !fits(run.remote, run.len, ep.regions[run.remote_region].len)) {
      return refuse(i, "lies outside the peer's regions");
    }
  }
  MutexLock lock(regions_mu_);
  auto* const pool = static_cast<std::uint8_t*>(region_.base);
  for (std::size_t i = 0; i < post.runs.size(); ++i) {
    const ByteRun& run = post.runs[i];
    const std::uint32_t slot = run.local_region;
    if (slot == 0) {
      if (region_.num_blocks == 0 || !fits(run.local, run.len, pool_len())) break;
      x->local_at.push_back(Xfer::LocalAt{pool + run.local, nullptr});
      continue;
    }
    if (slot >= regions_.size() || !regions_[slot].live ||
        !fits(run.local, run.len, regions_[slot].len)) {
      break;
    }
    OwnRegion& r = regions_[slot];
    if (std::find(x->held_regions.begin(), x->held_regions.end(), slot) == x->held_regions.end()) {
      x->held_regions.push_back(slot);
      ++r.busy;
    }
    x->local_at.push_back(Xfer::LocalAt{r.base + run.local, r.memh});
  }
  if (x->local_at.size() == post.runs.size()) return Status::kSuccess;
  for (const std::uint32_t slot : x->held_regions) --regions_[slot].busy;
  x->held_regions.clear();
  return refuse(x->local_at.size(), "lies outside our regions");
}

void UcxLane::let_go(Xfer* x) {
  if (x->held_regions.empty()) return;
  bool removing = false;
  {
    MutexLock lock(regions_mu_);
    for (const std::uint32_t slot : x->held_regions) {
      OwnRegion& r = regions_[slot];
      if (--r.busy == 0 && !r.live) removing = true;
    }
  }
  x->held_regions.clear();
  if (removing) driver_.finish([] {});  // remove_region waits for it
}

bool UcxLane::holds_removed(const Xfer* x) const {
  if (x->held_regions.empty()) return false;
  MutexLock lock(regions_mu_);
  for (const std::uint32_t slot : x->held_regions) {
    if (!regions_[slot].live) return true;
  }
  return false;
}

}  // namespace kvxfer::internal::ucx
