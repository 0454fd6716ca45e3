// SPDX-License-Identifier: Apache-2.0
// The fence table (wire/cookie.h, version 4): how a target's remove_region
// knows that no chunk a same-host peer checked before the withdrawal is
// still to land in the region.
//
// A peer's chunk into a region checks the region's seq before it copies,
// but the copy comes after the check: without more, a chunk whose check
// passed just before the target withdrew the region could land after
// remove_region returned, into memory its owner reuses. So each chunk marks
// the slots it copies into, in a table the target shares with its peers (a
// memfd of the target's, mapped by both), and the two sides follow
// Dekker's pattern, every step sequentially consistent:
//   peer:   marks[slot][row] += 1; then reads seq[slot]; copies only if
//           seq is what it checked at connect; marks[slot][row] -= 1.
//   target: seq[slot] = the withdrawn entry's seq; then waits until every
//           row's marks[slot] is 0.
// Either the peer's read comes after the target's store (it sees the
// withdrawal and does not copy) or the target's reads come after the
// peer's mark (it waits for the copy to end). A mark costs two atomic adds
// and a load per chunk on a shared page, and no system call.
//
// Rows: one per initiating lane and target (kFenceRows), claimed with the
// lane's pid at connect and freed when its peer is released. A peer that
// died holding a mark (SIGKILL mid-chunk) never takes it back: the target
// sees the row's process gone (its pidfd readable, or no such pid) and
// drops the mark. A live process that holds a mark past
// CopyPolicy::kHolderWait (frozen, stopped, or hostile: a same-host peer
// has ptrace rights over the target and could write anywhere anyway,
// docs/threat-model.md) makes remove_region give up and say so: the
// region's bytes may still change until that process lets go or exits.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "kvxfer/status.h"
#include "wire/cookie.h"

namespace kvxfer::internal::cma {

// The table's words where a mapping of it lies (nullptr: none).
class FenceWords {
 public:
  explicit FenceWords(std::uint8_t* base = nullptr) : base_(base) {}
  [[nodiscard]] bool mapped() const { return base_ != nullptr; }
  [[nodiscard]] std::atomic_ref<std::uint32_t> pid(std::uint32_t row) const {
    return std::atomic_ref<std::uint32_t>(word32(row * wire::kFenceRowLen));
  }
  [[nodiscard]] std::atomic_ref<std::uint32_t> held(std::uint32_t row) const {
    return std::atomic_ref<std::uint32_t>(word32(row * wire::kFenceRowLen + 4));
  }
  [[nodiscard]] std::atomic_ref<std::uint64_t> seq(std::uint32_t slot) const {
    return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(base_ + record(slot)));
  }
  [[nodiscard]] std::atomic_ref<std::uint32_t> marks(std::uint32_t slot, std::uint32_t row) const {
    return std::atomic_ref<std::uint32_t>(word32(record(slot) + 8 + std::size_t{row} * 4));
  }

 private:
  static std::size_t record(std::uint32_t slot) {
    return wire::kFenceSlotsAt + std::size_t{slot} * wire::kFenceSlotLen;
  }
  std::uint32_t& word32(std::size_t at) const {
    return *reinterpret_cast<std::uint32_t*>(base_ + at);
  }
  std::uint8_t* base_;
};

// Whether process `pid` (of our pid namespace) still runs: false once it
// exited, zombie or reaped (its pidfd is readable, or no such pid).
[[nodiscard]] bool process_runs(pid_t pid);

// The target's side: a memfd of kFenceLen bytes (pages backed only where
// touched), sealed at that size, mapped here.
class FenceTable {
 public:
  FenceTable();
  ~FenceTable();
  FenceTable(const FenceTable&) = delete;
  FenceTable& operator=(const FenceTable&) = delete;

  [[nodiscard]] int fd() const { return fd_; }
  [[nodiscard]] FenceWords words() const { return FenceWords(base_); }

  // Waits until no row marks `slot`, dropping the marks of rows whose
  // process is gone, for at most `limit`. True when none is left; false
  // (with *holder, a process that still marks it) otherwise.
  [[nodiscard]] bool await_unmarked(std::uint32_t slot, std::chrono::milliseconds limit,
                                    pid_t* holder) const;

 private:
  int fd_ = -1;
  std::uint8_t* base_ = nullptr;
};

// A peer's side: the target's table mapped here and the row this lane
// claimed in it (map_peer_fence, cma_mapping.h).
class PeerFence {
 public:
  PeerFence() = default;
  ~PeerFence() { reset(); }
  PeerFence(PeerFence&& other) noexcept;
  PeerFence& operator=(PeerFence&& other) noexcept;
  PeerFence(const PeerFence&) = delete;
  PeerFence& operator=(const PeerFence&) = delete;

  [[nodiscard]] bool ready() const { return row_ >= 0; }
  // Takes `map` (a mapping of a target's table, kFenceLen bytes) and claims
  // a row for `self`: a free one, or one whose process is gone and holds no
  // marks. False when every row is taken (`map` is unmapped then).
  [[nodiscard]] bool adopt(std::uint8_t* map, pid_t self);
  // Marks `slots` (the target's; repeats allowed, each marked as often as
  // named), then reads their seqs: true when each is its `seqs` entry, and
  // the marks stay until unmark(slots); false when one is not (the region
  // was withdrawn or changed), with the marks already taken back.
  [[nodiscard]] bool mark(std::span<const std::uint32_t> slots,
                          std::span<const std::uint64_t> seqs) const;
  void unmark(std::span<const std::uint32_t> slots) const;

  // Frees the row (no mark of ours is left: called once our copies ended)
  // and unmaps the table.
  void reset() noexcept;

 private:
  std::uint8_t* map_ = nullptr;
  int row_ = -1;
};

// Maps the fence table of `pid` (its descriptor `fence_fd`, from its
// cookie) and claims a row in it. The descriptor is taken only if the
// kernel says it is what FenceTable creates: a memfd of that name, on
// shmem, sealed at exactly kFenceLen bytes. kSuccess; kNotAllowed (it
// cannot be duplicated), kMismatch (not a fence table), kBackend (mmap
// failed, or no row is free), with *why. The caller reads pid's cookie
// again afterwards, as for any descriptor of a peer's.
[[nodiscard]] Status map_peer_fence(pid_t pid, std::uint32_t fence_fd, PeerFence* out,
                                    std::string* why);

}  // namespace kvxfer::internal::cma
