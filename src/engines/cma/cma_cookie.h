// SPDX-License-Identifier: Apache-2.0
// How a same-host peer proves it still is the agent that published its
// metadata, and which pool it registered: a cookie page it keeps while its
// engine is up, read back with process_vm_readv; and the pid namespace both
// sides must share.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "engine.h"
#include "engines/cma/cma_fence.h"
#include "kvxfer/status.h"
#include "kvxfer/transport.h"
#include "wire/cookie.h"

namespace kvxfer::internal::cma {

struct PidNamespace {
  std::uint64_t dev = 0;
  std::uint64_t ino = 0;
};

// This process's pid namespace, or {0, 0} where it cannot be read.
PidNamespace own_pid_namespace();

// What the cookie page holds, as a wire format (wire/cookie.h): the epoch,
// then the pool its engine registered. Metadata names the page; the page,
// written by the target itself, says which pool may be written, so metadata
// can name no other.
using Declaration = wire::CookieDeclaration;

// A page holding a random epoch and the registered pool while the engine is
// up, and the region table it points to (wire/cookie.h). Peers read the
// declaration at connect and the epoch before and after each write: a pid
// that was reused, or an engine that shut down (page unmapped or cleared),
// no longer matches. They read a region's table entry at connect and its
// seq word with the epoch before each chunk into or out of it: a region
// withdrawn since no longer matches.
class Cookie {
 public:
  // `pool`: Region{} for none. `pool_fd` and `pool_offset`: where a peer
  // can map the pool (our descriptor of its SharedPool memfd), or
  // wire::kNoFd and 0. `epoch`: the engine's token (0: a random one of the
  // cookie's own).
  explicit Cookie(const Region& pool, std::uint32_t pool_fd = wire::kNoFd,
                  std::uint64_t pool_offset = 0, std::uint64_t epoch = 0);
  ~Cookie();
  Cookie(const Cookie&) = delete;
  Cookie& operator=(const Cookie&) = delete;

  [[nodiscard]] std::uint64_t addr() const { return reinterpret_cast<std::uintptr_t>(page_); }
  [[nodiscard]] std::uint64_t epoch() const { return epoch_; }
  // The page's memfd, which the page declares (-1 once retired).
  [[nodiscard]] int fd() const { return fd_; }

  // Declares region `region` (slot 1..kCookieMaxSlots-1) in the table, and
  // withdraws it. The caller serializes them (one writer per entry); a
  // withdrawal is visible to every later read of the entry once it returns,
  // and to every later mark of the slot in the fence table (cma_fence.h).
  void declare(const MemRegion& region);
  void withdraw(std::uint64_t id);
  [[nodiscard]] std::uint64_t table_addr() const {
    return reinterpret_cast<std::uintptr_t>(table_);
  }

  void retire();

  // The fence table the page declares (cma_fence.h): remove_region waits
  // there for peers' chunks into a withdrawn region.
  [[nodiscard]] const FenceTable& fence() const { return fence_; }

  // The page is page-aligned, so a declaration read from an address that is
  // not cannot be a cookie (and never straddles two pages).
  static constexpr std::uint64_t kAlign = 4096;

 private:
  static constexpr std::size_t kPageLen = 4096;
  std::uint8_t* page_ = nullptr;
  int fd_ = -1;  // the page's memfd, declared for peers to map
  std::uint64_t epoch_ = 0;
  // The region table: kCookieMaxSlots entries of anonymous memory (2 MiB
  // of address space; pages are backed only once an entry in them is
  // written). Unmapped only with the cookie's destruction, never at
  // retire(): a peer reading it then reads zeros or an error, not a crash.
  std::uint8_t* table_ = nullptr;
  // Each slot's record holds a copy of its entry's seq, written before the
  // entry settles.
  FenceTable fence_;
};

// Where entry `slot` of a table at `table_addr` begins, and its seq word.
[[nodiscard]] constexpr std::uint64_t entry_addr(std::uint64_t table_addr, std::uint32_t slot) {
  return table_addr + std::uint64_t{slot} * wire::kRegionEntryLen;
}

// Reads the entries `slots` of the table at `table_addr` in `pid` into
// `out` (same length), each decoded, and checks that they held still: each
// entry's seq is read again after all were read. kSuccess (out written; an
// entry that was changing reads as empty), kRemoteDisconnect, kNotAllowed,
// kBackend as read_cookie.
Status read_region_entries(pid_t pid, std::uint64_t table_addr,
                           std::span<const std::uint32_t> slots, std::span<wire::RegionEntry> out,
                           int* err);

// Reads the epoch at `cookie_addr` and the seq words at `seq_addrs` (at
// most kMaxSeqReads) in `pid`, in one system call. kSuccess when the epoch
// is `epoch` and every seq is the matching `seqs` entry; kMismatch when the
// epoch matches but some seq does not (a region withdrawn or changed);
// otherwise as read_cookie.
inline constexpr std::size_t kMaxSeqReads = 15;
Status read_cookie_and_seqs(pid_t pid, std::uint64_t cookie_addr, std::uint64_t epoch,
                            std::span<const std::uint64_t> seq_addrs,
                            std::span<const std::uint64_t> seqs, int* err);

// kSuccess when `pid` is the agent that published (addr, epoch); otherwise
// kRemoteDisconnect (gone, or its engine shut down), kNotAllowed (no ptrace
// permission, e.g. Yama) or kBackend. *err: the errno, or 0.
Status read_cookie(pid_t pid, std::uint64_t addr, std::uint64_t epoch, int* err);

// Reads and decodes (wire/cookie.h) the whole declaration at `addr` in
// `pid`. kSuccess (with *out written), kRemoteDisconnect (gone, or the
// engine retired the page: its epoch reads 0 or changed while we read),
// kNotAllowed or kBackend, as above; kMismatch when `addr` is not a cookie
// page: not aligned as one is, not the start of a one-page mapping of the
// memfd Cookie creates (per /proc/<pid>/maps), so that bytes a peer wrote
// into the target's pool to look like a declaration are not taken for one,
// or holding bytes that do not decode as a declaration. *err as above.
Status read_declaration(pid_t pid, std::uint64_t addr, Declaration* out, int* err);

}  // namespace kvxfer::internal::cma
