// SPDX-License-Identifier: Apache-2.0
// The same-host lane's regions besides the pool (cma_lane.h): ours, declared
// in our cookie's region table; a peer's, checked against the table its
// cookie points to at connect and before every chunk; and posts that name
// them.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "engines/cma/cma_lane.h"

namespace kvxfer::internal::cma {

Status CmaLane::add_region(const MemRegion& region, std::string* reason) {
  const std::uint32_t slot = region_slot(region.id);
  if (slot == 0 || slot >= wire::kCookieMaxSlots || region.len == 0) {
    if (reason != nullptr) *reason = fmt::format("region slot {} is out of range", slot);
    return Status::kInvalidParam;
  }
  {
    MutexLock lock(copy_mu_);
    if (slot_use_.size() <= slot) slot_use_.resize(slot + 1);
    slot_use_[slot].live = true;
  }
  MutexLock lock(regions_mu_);
  if (local_regions_.size() <= slot) local_regions_.resize(slot + 1);
  local_regions_[slot] = region;
  // From here peers whose metadata lists it find it declared.
  cookie_.declare(region);
  return Status::kSuccess;
}

Status CmaLane::remove_region(std::uint64_t id) {
  const std::uint32_t slot = region_slot(id);
  {
    MutexLock lock(regions_mu_);
    if (slot == 0 || slot >= local_regions_.size() || local_regions_[slot].id != id ||
        local_regions_[slot].len == 0) {
      return Status::kNotFound;
    }
    // Peers' next checks of it fail: none of their chunks that starts from
    // now on writes into it or reads from it.
    cookie_.withdraw(id);
    local_regions_[slot] = MemRegion{};
  }
  // Our own chunks: queued ones that name it are dropped when claimed,
  // running ones finish before this returns.
  {
    MutexLock lock(copy_mu_);
    SlotUse& use = slot_use_[slot];
    use.live = false;
    while (use.busy != 0) lock.wait(copy_done_cv_);
  }
  // Peers' chunks: one that marked the slot before the withdrawal may still
  // be copying into it; one that marks it after finds it withdrawn and
  // copies nothing (cma_fence.h). Waited for with no lock held.
  pid_t holder = 0;
  if (!cookie_.fence().await_unmarked(slot, CopyPolicy::kHolderWait, &holder)) {
    log().error(
        "kvxfer cma {}: region {:#x} is withdrawn, but process {} on this host still holds a "
        "chunk into it after {} ms: its bytes may land there until that process lets go or exits",
        agent_name_, id, holder, CopyPolicy::kHolderWait.count());
    return Status::kBackend;
  }
  return Status::kSuccess;
}

Status CmaLane::check_regions(Peer& peer, const Declaration& declared, const RemoteRegion& remote,
                              std::string* reason) {
  const std::uint64_t pool_len = declared.num_blocks * declared.block_len;
  std::vector<std::uint32_t> slots;
  std::vector<std::size_t> at;  // which of remote.regions each slot is
  peer.regions.assign(remote.regions.size(), Peer::Slot{});
  for (std::size_t i = 0; i < remote.regions.size(); ++i) {
    const MemRegion& r = remote.regions[i];
    if (r.id == 0) {
      // The pool, declared in the cookie itself (and checked against the
      // metadata's pool by connect()).
      if (pool_len == 0 || r.base != declared.base_addr || r.len != pool_len) {
        *reason = fmt::format(
            "refusing peer {} (pid {}): its metadata lists a pool at {:#x} of {} bytes, but the "
            "target registered {:#x} of {} bytes",
            peer.agent_name, peer.pid, r.base, r.len, declared.base_addr, pool_len);
        return Status::kMismatch;
      }
      peer.regions[i] = Peer::Slot{r.base, r.len, 0, 0};
      continue;
    }
    const std::uint32_t slot = region_slot(r.id);
    if (slot == 0 || slot >= declared.table_slots) {
      *reason = fmt::format(
          "refusing peer {} (pid {}): its metadata lists region {:#x}, whose slot the target's "
          "region table does not have",
          peer.agent_name, peer.pid, r.id);
      return Status::kMismatch;
    }
    slots.push_back(slot);
    at.push_back(i);
  }
  std::vector<wire::RegionEntry> entries(slots.size());
  int err = 0;
  const Status st = read_region_entries(peer.pid, declared.table_addr, slots, entries, &err);
  if (st != Status::kSuccess) {
    *reason = fmt::format("peer {} (pid {}): its region table cannot be read ({})", peer.agent_name,
                          peer.pid, err != 0 ? std::strerror(err) : "short read");
    return st == Status::kRemoteDisconnect ? st : Status::kMismatch;
  }
  for (std::size_t k = 0; k < slots.size(); ++k) {
    const MemRegion& r = remote.regions[at[k]];
    const wire::RegionEntry& e = entries[k];
    if (e.len == 0 || e.id != r.id || e.base != r.base || e.len != r.len) {
      *reason = fmt::format(
          "refusing peer {} (pid {}): its metadata lists region {:#x} at {:#x} ({} bytes), but "
          "the target registered {}",
          peer.agent_name, peer.pid, r.id, r.base, r.len,
          e.len == 0 ? std::string("no region in that slot")
                     : fmt::format("region {:#x} at {:#x} ({} bytes) there", e.id, e.base, e.len));
      return Status::kMismatch;
    }
    peer.regions[at[k]] =
        Peer::Slot{r.base, r.len, entry_addr(declared.table_addr, slots[k]), e.seq, slots[k]};
  }
  return Status::kSuccess;
}

Status CmaLane::fence_regions(Peer& peer, const Declaration& declared, std::string* reason) {
  if (std::none_of(peer.regions.begin(), peer.regions.end(),
                   [](const Peer::Slot& s) { return s.seq_addr != 0; })) {
    return Status::kSuccess;  // the pool alone: the cookie covers it
  }
  std::string why = "it declares no fence table";
  Status st = declared.fence_fd == wire::kNoFd
                  ? Status::kNotSupported
                  : map_peer_fence(peer.pid, declared.fence_fd, &peer.fence, &why);
  // The cookie again: the descriptor was the declaring engine's only if its
  // pid was not reused meanwhile.
  int err = 0;
  if (st == Status::kSuccess &&
      read_cookie(peer.pid, peer.cookie_addr, peer.cookie_epoch, &err) != Status::kSuccess) {
    st = Status::kRemoteDisconnect;
    why = "it went away while its fence table was mapped";
  }
  if (st != Status::kSuccess) {
    peer.fence.reset();
    *reason =
        fmt::format("peer {} (pid {}): the same-host lane cannot write into its regions safely: {}",
                    peer.agent_name, peer.pid, why);
  }
  return st;
}

std::size_t CmaLane::fenced_slots(const Peer& peer, std::span<const std::uint32_t> remote_index,
                                  std::uint32_t* slots, std::uint64_t* seqs) {
  std::size_t n = 0;
  std::uint32_t last = ~std::uint32_t{0};
  for (const std::uint32_t idx : remote_index) {
    if (idx == last || peer.regions[idx].seq_addr == 0) continue;  // repeated, or the pool
    last = idx;
    slots[n] = peer.regions[idx].slot;
    seqs[n] = peer.regions[idx].seq;
    ++n;
  }
  return n;
}

namespace {

// One run as iovecs: a run longer than a copier's chunk becomes several,
// so that copiers can share it.
template <typename OnIovec>
void split_run(std::uint8_t* src, std::uint64_t dst, std::uint64_t len, std::size_t chunk,
               OnIovec on_iovec) {
  for (std::uint64_t left = len; left > 0;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, chunk));
    on_iovec(iovec{src, n}, iovec{reinterpret_cast<void*>(dst), n});
    src += n;
    dst += n;
    left -= n;
  }
}

}  // namespace

Status CmaLane::build_iovecs(Peer& peer, const Post& post, Xfer& xfer) {
  xfer.local_iov.clear();
  xfer.remote_iov.clear();
  xfer.local_slot.clear();
  xfer.remote_index.clear();
  xfer.mapped = peer.mapping.mapped();
  auto* const pool = static_cast<std::uint8_t*>(region_.base);
  const auto plain = [&xfer](const iovec& l, const iovec& r) {
    xfer.local_iov.push_back(l);
    xfer.remote_iov.push_back(r);
  };
  if (post.pool_only) {
    // The pools' runs need no table: the common case (write_blocks) takes
    // no lock and records no slots.
    for (const ByteRun& run : post.runs) {
      split_run(pool + run.local, peer.remote_base + run.remote, run.len, kChunkBytes, plain);
    }
    return Status::kSuccess;
  }
  const MemRegion our_pool{0, reinterpret_cast<std::uintptr_t>(region_.base),
                           region_.num_blocks * region_.block_len};
  MutexLock lock(regions_mu_);
  for (const ByteRun& run : post.runs) {
    // The core validated the runs; checked again here, cheaply, since a
    // wrong one would copy outside a region.
    if (run.remote_region >= peer.regions.size() ||
        (run.local_region != 0 && run.local_region >= local_regions_.size())) {
      return Status::kInvalidParam;
    }
    const Peer::Slot& theirs = peer.regions[run.remote_region];
    const MemRegion& ours = run.local_region == 0 ? our_pool : local_regions_[run.local_region];
    if (ours.len == 0 || run.local > ours.len || run.len > ours.len - run.local ||
        run.remote > theirs.len || run.len > theirs.len - run.remote) {
      return Status::kInvalidParam;
    }
    if (theirs.seq_addr != 0) xfer.mapped = false;  // the mapping is the pool's alone
    split_run(reinterpret_cast<std::uint8_t*>(ours.base) + run.local, theirs.base + run.remote,
              run.len, kChunkBytes, [&](const iovec& l, const iovec& r) {
                plain(l, r);
                xfer.local_slot.push_back(run.local_region);
                xfer.remote_index.push_back(run.remote_region);
              });
  }
  return Status::kSuccess;
}

bool CmaLane::hold_slots(const Xfer& xfer, Claim& claim) {
  if (xfer.local_slot.empty()) return true;
  const std::size_t n = claim.local.size();
  for (std::size_t i = claim.first; i < claim.first + n; ++i) {
    const std::uint32_t slot = xfer.local_slot[i];
    if (slot != 0 && (slot >= slot_use_.size() || !slot_use_[slot].live)) return false;
  }
  for (std::size_t i = claim.first; i < claim.first + n; ++i) {
    const std::uint32_t slot = xfer.local_slot[i];
    if (slot != 0) ++slot_use_[slot].busy;
  }
  claim.counted = true;
  return true;
}

void CmaLane::drop_slots(const Xfer& xfer, const Claim& claim) {
  if (!claim.counted) return;
  bool idle = false;
  for (std::size_t i = claim.first; i < claim.first + claim.local.size(); ++i) {
    const std::uint32_t slot = xfer.local_slot[i];
    if (slot != 0 && --slot_use_[slot].busy == 0) idle = true;
  }
  if (idle) copy_done_cv_.notify_all();
}

Status CmaLane::check_peer(Peer& peer, std::span<const std::uint32_t> remote_index, int* err) {
  std::uint64_t addrs[kMaxSeqReads];
  std::uint64_t seqs[kMaxSeqReads];
  std::size_t n = 0;
  std::uint32_t last = ~std::uint32_t{0};
  Status st = Status::kSuccess;
  bool read_once = false;
  for (std::size_t i = 0; i <= remote_index.size() && st == Status::kSuccess; ++i) {
    const bool end = i == remote_index.size();
    if (!end) {
      const std::uint32_t idx = remote_index[i];
      if (idx == last || peer.regions[idx].seq_addr == 0) continue;  // repeated, or the pool
      last = idx;
      addrs[n] = peer.regions[idx].seq_addr;
      seqs[n] = peer.regions[idx].seq;
      ++n;
    }
    if (n == kMaxSeqReads || (end && (n > 0 || !read_once))) {
      st = read_cookie_and_seqs(peer.pid, peer.cookie_addr, peer.cookie_epoch, std::span(addrs, n),
                                std::span(seqs, n), err);
      read_once = true;
      n = 0;
    }
  }
  return st;
}

}  // namespace kvxfer::internal::cma
