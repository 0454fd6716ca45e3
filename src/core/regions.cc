// SPDX-License-Identifier: Apache-2.0
// Regions and descriptors: the memory a transport registers besides its
// pool (register_memory), descriptor lists checked once against our regions
// or a peer's (prepare), and transfers between prepared lists (transfer):
// the path NIXL's agent API takes. Engine calls that may wait run outside
// the lock. May touch the engine interface, src/common/ and src/wire/.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <utility>

#include "common/log.h"
#include "core/transport_state.h"

namespace kvxfer::internal {
namespace {

constexpr std::uint64_t kMaxAddr = std::numeric_limits<std::uint64_t>::max();

// Whether [addr, addr + len) lies inside [base, base + size).
bool inside(std::uint64_t addr, std::uint64_t len, std::uint64_t base, std::uint64_t size) {
  return addr >= base && len <= size && addr - base <= size - len;
}

std::string describe(std::size_t i, const MemDesc& d) {
  return fmt::format("descriptor {} ({:#x}, {} bytes)", i, d.addr, d.len);
}

}  // namespace

// Whether `d` is the next descriptor of `run`: as long, one stride further
// on (the second one sets the stride), and inside the run's region. Then
// the run takes it.
bool TransportState::extends(DescList::Run& run, const MemDesc& d) {
  if (d.len != run.len || d.addr < run.addr) return false;
  const std::uint64_t step = d.addr - run.addr;
  if (run.count > 1) {
    if (run.stride == 0 ? step != 0 : (step % run.stride != 0 || step / run.stride != run.count)) {
      return false;
    }
  }
  // In the region: offset + step + len <= region_len, without overflow.
  if (step > run.region_len - run.offset || run.len > run.region_len - run.offset - step) {
    return false;
  }
  if (run.count == 1) run.stride = step;
  ++run.count;
  return true;
}

std::optional<std::uint32_t> TransportState::local_region_of(std::uint64_t addr,
                                                             std::uint64_t len) const {
  auto it = local_by_addr_.upper_bound(addr);
  if (it == local_by_addr_.begin()) return std::nullopt;
  --it;
  const LocalRegion& r = regions_[it->second];
  if (!r.live || !inside(addr, len, r.base, r.len)) return std::nullopt;
  return it->second;
}

std::optional<std::uint32_t> TransportState::peer_region_of(const Peer& peer, std::uint64_t addr,
                                                            std::uint64_t len) {
  // The pool (if any) first, then the metadata's list, which is sorted by
  // address without overlap: a binary search.
  const auto& regions = peer.regions;
  std::size_t first = 0;
  if (!regions.empty() && regions[0].id == 0) {
    if (inside(addr, len, regions[0].base, regions[0].len)) return 0;
    first = 1;
  }
  const auto begin = regions.begin() + static_cast<std::ptrdiff_t>(first);
  auto it = std::upper_bound(begin, regions.end(), addr,
                             [](std::uint64_t a, const MemRegion& r) { return a < r.base; });
  if (it == begin) return std::nullopt;
  --it;
  if (!inside(addr, len, it->base, it->len)) return std::nullopt;
  return static_cast<std::uint32_t>(it - regions.begin());
}

RegionId TransportState::register_memory(std::uint64_t addr, std::uint64_t len) {
  if (addr == 0) throw std::invalid_argument("register_memory: addr must not be null");
  if (len == 0) throw std::invalid_argument("register_memory: len must be > 0");
  if (addr > kMaxAddr - len) {
    throw std::invalid_argument(
        fmt::format("register_memory: {:#x} + {} bytes passes the end of the address space", addr,
                    len));
  }
  MemRegion region{0, addr, len};
  std::uint32_t slot = 0;
  {
    MutexLock lock(mu_);
    throw_if_closing();
    // The first used range that ends after addr must start at or after its end.
    auto next = local_by_addr_.upper_bound(addr);
    if (next != local_by_addr_.begin()) {
      const LocalRegion& before = regions_[std::prev(next)->second];
      if (before.base + before.len > addr) next = std::prev(next);
    }
    if (next != local_by_addr_.end() && next->first < addr + len) {
      const LocalRegion& other = regions_[next->second];
      throw std::invalid_argument(fmt::format(
          "register_memory: {:#x} ({} bytes) overlaps {} at {:#x} ({} bytes)", addr, len,
          other.id == 0 ? std::string("the pool") : fmt::format("region {:#x}", other.id),
          other.base, other.len));
    }
    if (free_slots_.empty()) {
      if (regions_.size() > wire::kMaxRegions) {
        throw std::invalid_argument(
            fmt::format("register_memory: {} regions are registered already, the most there may be",
                        wire::kMaxRegions));
      }
      free_slots_.push_back(static_cast<std::uint32_t>(regions_.size()));
      regions_.emplace_back();
    }
    slot = free_slots_.back();
    free_slots_.pop_back();
    LocalRegion& r = regions_[slot];
    // A slot's generation goes up with every use, so no id is ever reused.
    r.id = ((r.id >> 32) + 1) << 32 | slot;
    r.base = addr;
    r.len = len;
    r.live = false;
    r.used = true;
    local_by_addr_.emplace(addr, slot);
    region.id = r.id;
    ++active_connects_;
  }
  const EngineCall call(*this, EngineCallKind::kConnect);
  std::string reason;
  const Status st = engine_->add_region(region, &reason);
  MutexLock lock(mu_);
  LocalRegion& r = regions_[slot];
  if (st != Status::kSuccess) {
    local_by_addr_.erase(addr);
    r.used = false;
    free_slots_.push_back(slot);
    throw std::runtime_error(fmt::format("kvxfer {}: cannot register {:#x} ({} bytes): {}: {}",
                                         agent_name_, addr, len, status_name(st),
                                         reason.empty() ? "the engine gave no reason" : reason));
  }
  r.live = true;
  log().debug("kvxfer {}: registered region {:#x} at {:#x} ({} bytes)", agent_name_, region.id,
              addr, len);
  lock.unlock();
  // Its pages' first kernel touch, paid ahead on the pre-touch thread.
  if (pretouch_) pretouch_->add(region.id, reinterpret_cast<const void*>(addr), len);
  return region.id;
}

void TransportState::deregister_memory(RegionId id) {
  const std::uint32_t slot = region_slot(id);
  {
    MutexLock lock(mu_);
    throw_if_closing();
    if (id == 0 || slot >= regions_.size() || regions_[slot].id != id || !regions_[slot].live) {
      throw std::invalid_argument(
          fmt::format("deregister_memory: {:#x} is not a registered region", id));
    }
    const auto busy = std::count_if(inflight_.begin(), inflight_.end(),
                                    [](const auto& entry) { return entry.second.descs; });
    if (busy != 0) {
      throw std::logic_error(fmt::format(
          "deregister_memory: {} transfer(s) between regions are still in flight; poll them to "
          "their end or cancel them first",
          busy));
    }
    // From here no prepare() or transfer() finds it.
    regions_[slot].live = false;
    ++active_disconnects_;
  }
  Status st = Status::kSuccess;
  {
    const EngineCall call(*this, EngineCallKind::kDisconnect);
    mu_.assert_not_held("a region's removal");
    st = engine_->remove_region(id);
    if (pretouch_) pretouch_->remove(id);
  }
  MutexLock lock(mu_);
  LocalRegion& r = regions_[slot];
  local_by_addr_.erase(r.base);
  r.used = false;
  free_slots_.push_back(slot);
  if (st != Status::kSuccess) {
    log().warn("kvxfer {}: the engine's removal of region {:#x} failed: {}", agent_name_, id,
               status_name(st));
  }
}

std::vector<RegionInfo> TransportState::regions() const {
  MutexLock lock(mu_);
  std::vector<RegionInfo> out;
  for (const auto& [base, slot] : local_by_addr_) {
    const LocalRegion& r = regions_[slot];
    if (r.live && r.id != 0) out.push_back(RegionInfo{r.id, r.base, r.len});
  }
  return out;
}

std::vector<RegionInfo> TransportState::peer_regions(std::string_view peer_id) const {
  MutexLock lock(mu_);
  const auto it = peers_.find(peer_id);
  if (it == peers_.end()) {
    throw std::invalid_argument(fmt::format("peer {} is not registered", peer_id));
  }
  std::vector<RegionInfo> out;
  for (const MemRegion& r : it->second->regions) {
    if (r.id != 0) out.push_back(RegionInfo{r.id, r.base, r.len});
  }
  return out;
}

DescList TransportState::prepare(std::span<const MemDesc> descs,
                                 std::optional<std::string_view> peer_id) const {
  DescList list;
  // Copied first: the caller may be changing its list under us.
  std::vector<MemDesc> copy(descs.begin(), descs.end());
  list.size_ = copy.size();
  MutexLock lock(mu_);
  throw_if_closing();
  const Peer* peer = nullptr;
  if (peer_id) {
    const auto it = peers_.find(*peer_id);
    if (it == peers_.end()) {
      throw std::invalid_argument(fmt::format("prepare: peer {} is not registered", *peer_id));
    }
    peer = it->second.get();
    list.peer_ = peer->id;
    list.generation_ = peer->generation;
  }
  for (std::size_t i = 0; i < copy.size(); ++i) {
    const MemDesc& d = copy[i];
    if (d.len == 0) throw std::invalid_argument("prepare: " + describe(i, d) + " is empty");
    if (!list.runs_.empty() && extends(list.runs_.back(), d)) continue;
    const auto found = peer != nullptr ? peer_region_of(*peer, d.addr, d.len)
                                       : local_region_of(d.addr, d.len);
    if (!found) {
      throw std::invalid_argument(fmt::format(
          "prepare: {} lies in no region {} (or straddles two)", describe(i, d),
          peer != nullptr ? fmt::format("that peer {} registered", peer->id)
                          : std::string("of ours")));
    }
    DescList::Run& run = list.runs_.emplace_back();
    run.first = i;
    run.count = 1;
    run.addr = d.addr;
    run.len = d.len;
    if (peer != nullptr) {
      const MemRegion& r = peer->regions[*found];
      run.region = *found;
      run.offset = d.addr - r.base;
      run.region_len = r.len;
    } else {
      const LocalRegion& r = regions_[*found];
      run.region = r.id;
      run.offset = d.addr - r.base;
      run.region_len = r.len;
    }
  }
  return list;
}

std::optional<TransferId> TransportState::transfer_descs(
    Op op, std::string_view peer_id, const DescList& local, std::span<const std::int64_t> local_idx,
    const DescList& remote, std::span<const std::int64_t> remote_idx,
    std::span<const std::uint8_t> notify, Ticks started) {
  const char* const call = op == Op::kWrite ? "a WRITE" : "a READ";
  if (local.remote()) throw std::invalid_argument("transfer: the local list is a remote one");
  if (!remote.remote()) throw std::invalid_argument("transfer: the remote list is a local one");
  if (remote.peer() != peer_id) {
    throw std::invalid_argument(fmt::format(
        "transfer: the remote list was prepared for peer {}, not {}", remote.peer(), peer_id));
  }
  if (local_idx.size() != remote_idx.size()) {
    throw std::invalid_argument(fmt::format("transfer: {} local indices but {} remote ones",
                                            local_idx.size(), remote_idx.size()));
  }
  if (local_idx.empty()) throw std::invalid_argument(fmt::format("{} needs a descriptor", call));

  MutexLock lock(mu_);
  // Read once into our own scratch: the caller may be changing them.
  scratch_local_.assign(local_idx.begin(), local_idx.end());
  scratch_remote_.assign(remote_idx.begin(), remote_idx.end());
  const std::span<const std::uint8_t> message = copy_notification(notify, /*required=*/false);
  throw_if_closing();
  const auto found = peers_.find(peer_id);
  if (found == peers_.end()) {
    warn_unknown_peer(peer_id, "transfer");
    return std::nullopt;
  }
  Peer* const peer = found->second.get();
  if (remote.generation_ != peer->generation) {
    throw std::invalid_argument(fmt::format(
        "transfer: the remote list was prepared for an earlier registration of peer {}; prepare it "
        "again",
        peer_id));
  }
  std::uint64_t bytes = 0;
  const std::size_t runs = pair_runs(local, remote, &bytes);
  return post(op, peer, std::span<const ByteRun>(scratch_bytes_.data(), runs), bytes, message,
              started, /*descs=*/true);
}

std::size_t TransportState::pair_runs(const DescList& local, const DescList& remote,
                                      std::uint64_t* total) {
  const std::size_t n = scratch_local_.size();
  if (scratch_bytes_.size() < n) scratch_bytes_.resize(n);
  std::size_t runs = 0;
  std::uint64_t bytes = 0;
  std::size_t local_hint = 0;
  std::size_t remote_hint = 0;
  // The last local region found live (checked once per run of pairs in it).
  std::uint64_t live_region = ~std::uint64_t{0};
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t li = scratch_local_[i];
    const std::int64_t ri = scratch_remote_[i];
    if (li < 0 || static_cast<std::uint64_t>(li) >= local.size()) {
      throw std::invalid_argument(fmt::format("transfer: local index {} (at {}) is outside the list "
                                              "of {}", li, i, local.size()));
    }
    if (ri < 0 || static_cast<std::uint64_t>(ri) >= remote.size()) {
      throw std::invalid_argument(fmt::format(
          "transfer: remote index {} (at {}) is outside the list of {}", ri, i, remote.size()));
    }
    const auto lu = static_cast<std::uint64_t>(li);
    const auto ru = static_cast<std::uint64_t>(ri);
    const DescList::Run& l = local.run_of(lu, local_hint);
    const DescList::Run& r = remote.run_of(ru, remote_hint);
    if (l.len != r.len) {
      throw std::invalid_argument(fmt::format(
          "transfer: pair {} has {} local bytes and {} remote ones", i, l.len, r.len));
    }
    const std::uint32_t slot = region_slot(l.region);
    if (l.region != live_region &&
        (slot >= regions_.size() || regions_[slot].id != l.region || !regions_[slot].live)) {
      throw std::invalid_argument(fmt::format(
          "transfer: local descriptor {} lies in region {:#x}, deregistered since the list was "
          "prepared",
          li, l.region));
    }
    const std::uint64_t local_offset = l.offset + (lu - l.first) * l.stride;
    const std::uint64_t remote_offset = r.offset + (ru - r.first) * r.stride;
    const auto remote_region = static_cast<std::uint32_t>(r.region);
    ByteRun* const last = runs > 0 ? &scratch_bytes_[runs - 1] : nullptr;
    if (last != nullptr && last->local_region == slot && last->remote_region == remote_region &&
        last->local + last->len == local_offset && last->remote + last->len == remote_offset) {
      last->len += l.len;
    } else {
      scratch_bytes_[runs++] = ByteRun{local_offset, remote_offset, l.len, slot, remote_region};
    }
    live_region = l.region;
    bytes += l.len;
  }
  *total = bytes;
  return runs;
}

}  // namespace kvxfer::internal
