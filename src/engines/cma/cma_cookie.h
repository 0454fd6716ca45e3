// SPDX-License-Identifier: Apache-2.0
// How a same-host peer proves it still is the agent that published its
// metadata, and which pool it registered: a cookie page it keeps while its
// engine is up, read back with process_vm_readv; and the pid namespace both
// sides must share.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

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
// up. Peers read the declaration at connect and the epoch before and after
// each write: a pid that was reused, or an engine that shut down (page
// unmapped or cleared), no longer matches.
class Cookie {
 public:
  // `pool_fd` and `pool_offset`: where a peer can map the pool (our
  // descriptor of its SharedPool memfd), or wire::kNoFd and 0. `epoch`: the
  // engine's token (0: a random one of the cookie's own).
  explicit Cookie(const Region& pool, std::uint32_t pool_fd = wire::kNoFd,
                  std::uint64_t pool_offset = 0, std::uint64_t epoch = 0);
  ~Cookie() { retire(); }
  Cookie(const Cookie&) = delete;
  Cookie& operator=(const Cookie&) = delete;

  [[nodiscard]] std::uint64_t addr() const { return reinterpret_cast<std::uintptr_t>(page_); }
  [[nodiscard]] std::uint64_t epoch() const { return epoch_; }
  // The page's memfd, which the page declares (-1 once retired).
  [[nodiscard]] int fd() const { return fd_; }

  void retire();

  // The page is page-aligned, so a declaration read from an address that is
  // not cannot be a cookie (and never straddles two pages).
  static constexpr std::uint64_t kAlign = 4096;

 private:
  static constexpr std::size_t kPageLen = 4096;
  std::uint8_t* page_ = nullptr;
  int fd_ = -1;  // the page's memfd, declared for peers to map
  std::uint64_t epoch_ = 0;
};

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
