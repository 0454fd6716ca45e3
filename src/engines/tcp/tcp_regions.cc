// SPDX-License-Identifier: Apache-2.0
// The tcp lane's regions besides its pool: adding one (any thread: from
// then on posts may name it and peers' frames may), and removing one, which
// the I/O thread applies to what still moves bytes into or out of it before
// the caller returns, so no byte lands in a removed region and none is read
// from it.
#include <algorithm>
#include <future>

#include "common/log.h"
#include "engines/tcp/tcp_io.h"

namespace kvxfer::internal::tcp {

Status TcpLane::add_region(const MemRegion& region, std::string* reason) {
  const std::uint32_t slot = region_slot(region.id);
  if (slot == 0 || region.len == 0 || region.base == 0) {
    if (reason != nullptr) *reason = "not a region besides the pool";
    return Status::kInvalidParam;
  }
  if (stopped_.load(std::memory_order_acquire)) {
    if (reason != nullptr) *reason = "the tcp lane is stopping";
    return Status::kNotAllowed;
  }
  MutexLock lock(regions_mu_);
  if (regions_.size() <= slot) regions_.resize(std::size_t{slot} + 1);
  regions_[slot] =
      LocalRegion{region.id, reinterpret_cast<std::uint8_t*>(region.base), region.len, true};
  return Status::kSuccess;
}

Status TcpLane::remove_region(std::uint64_t id) {
  LocalRegion gone;
  {
    // From here no post resolves it and no peer's frame is let into it.
    MutexLock lock(regions_mu_);
    const std::uint32_t slot = region_slot(id);
    if (slot == 0 || slot >= regions_.size() || regions_[slot].id != id || !regions_[slot].live) {
      return Status::kNotFound;
    }
    regions_[slot].live = false;
    gone = regions_[slot];
  }
  // What was let in before: the I/O thread ends it on its next turn. A
  // stopped lane has no thread and moves no bytes. (The core never removes
  // a region while it stops the lane.)
  if (stopped_.load(std::memory_order_acquire)) return Status::kSuccess;
  std::promise<void> applied;
  Command cmd;
  cmd.kind = Command::Kind::kForgetRegion;
  cmd.region = gone;
  cmd.done = &applied;
  submit(std::move(cmd));
  applied.get_future().wait();
  return Status::kSuccess;
}

namespace {

// Whether any of `v` (from `from` on) touches [base, base + len).
bool touches(std::span<const iovec> v, std::size_t from, const std::uint8_t* base,
             std::uint64_t len) {
  const auto begin = reinterpret_cast<std::uintptr_t>(base);
  return std::any_of(v.begin() + static_cast<std::ptrdiff_t>(std::min(from, v.size())), v.end(),
                     [&](const iovec& io) {
                       const auto at = reinterpret_cast<std::uintptr_t>(io.iov_base);
                       return io.iov_len > 0 && at < begin + len && begin < at + io.iov_len;
                     });
}

constexpr const char* kGone = "a region of ours it moves bytes into or out of was deregistered";

}  // namespace

// On the I/O thread, once the region is no longer live (so no new frame
// or post reaches it): a write arriving into it drops the rest of its
// payload and is refused once it is in; a read landing in it drops the rest
// of its replies and ends kCanceled; a connection that still has bytes to
// send from it (a write of ours, a read's reply of ours) is closed, since a
// frame promised bytes it can no longer take from there.
void TcpLane::Io::forget_region(const LocalRegion& region) {
  const std::uint8_t* const base = region.base;
  const std::uint64_t len = region.len;
  std::vector<Conn*> sending_from;
  for (auto& [c, conn] : conns_) {
    if (c->fd < 0) continue;
    if (c->rx == Conn::Rx::kPayload && !c->rx_drain && touches(c->rx_iov, c->rx_at, base, len)) {
      c->rx_drain = true;
      if (c->initiator) {
        finish(c->rx_xfer, Status::kCanceled, kGone);
      } else {
        c->rx_refused = true;
      }
    }
    if (c->initiator) {
      for (const Conn::Await& a : c->awaiting) {
        if (a.part == SIZE_MAX) continue;
        const Xfer::Part& part = a.xfer->parts[a.part];
        const std::span<const iovec> lands =
            std::span<const iovec>(a.xfer->read_iov).subspan(part.first, part.count);
        if (touches(lands, 0, base, len)) finish(a.xfer, Status::kCanceled, kGone);
      }
    }
    for (const Conn::Out& o : c->out) {
      const std::vector<iovec>& v = o.xfer != nullptr ? o.xfer->iov : o.own;
      if (touches(v, o.at, base, len)) {
        sending_from.push_back(c);
        break;
      }
    }
  }
  for (Conn* c : sending_from) close_conn(c, kGone, Status::kCanceled);
  if (!sending_from.empty()) {
    log().warn(
        "kvxfer tcp {}: closed {} connection(s) that still had bytes to send from region "
        "{:#x}, deregistered meanwhile",
        lane_.agent_name_, sending_from.size(), region.id);
  }
}

}  // namespace kvxfer::internal::tcp
