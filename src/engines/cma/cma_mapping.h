// SPDX-License-Identifier: Apache-2.0
// A same-host peer's pool mapped into our address space, when the peer's
// pool is a kvxfer::SharedPool: the same-host lane then copies with memcpy
// instead of process_vm_writev/readv (which pins every page per call).
//
// Whose word is trusted: the peer's cookie declares the pool's address and
// geometry (cma_cookie.h) and, in version 2, a descriptor number and offset.
// A descriptor number is only a claim: we duplicate it (pidfd_getfd, the
// same ptrace permission as process_vm_writev) and map it only if the
// kernel's own account agrees: it is a memfd on shmem, sealed so that it can
// never shrink (a shrunk file raises SIGBUS in whoever touches the lost
// pages), large enough, and the very file and offset that the peer's
// mapping at the declared pool address shows in /proc/<pid>/maps. So a
// mapped copy lands in exactly the pages process_vm_writev would have.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "engines/cma/cma_cookie.h"

namespace kvxfer::internal::cma {

class PeerPoolMapping {
 public:
  PeerPoolMapping() = default;
  ~PeerPoolMapping() { reset(); }
  PeerPoolMapping(PeerPoolMapping&& other) noexcept;
  PeerPoolMapping& operator=(PeerPoolMapping&& other) noexcept;
  PeerPoolMapping(const PeerPoolMapping&) = delete;
  PeerPoolMapping& operator=(const PeerPoolMapping&) = delete;

  [[nodiscard]] bool mapped() const noexcept { return pool_ != nullptr; }
  // Where the peer's pool byte at its address `remote_addr` is mapped here.
  // The caller keeps remote_addr inside the declared pool (the core checks
  // every block index against the peer's region, which connect() found
  // equal to the declared pool).
  [[nodiscard]] std::uint8_t* at(std::uint64_t remote_addr) const noexcept {
    return pool_ + (remote_addr - remote_base_);
  }

  // Whether the peer's cookie page is mapped too, and the epoch it holds
  // now (0 once the peer's engine retired it). A dead peer's page keeps its
  // last epoch: only a read through the peer's pid tells that it died.
  [[nodiscard]] bool cookie_mapped() const noexcept { return cookie_ != nullptr; }
  [[nodiscard]] std::uint64_t cookie_epoch() const noexcept {
    // The engine clears the epoch with an atomic store (Cookie::retire);
    // the page is little-endian like the wire format, as is every host this
    // runs on.
    static_assert(wire::kCookieEpochAt == 0);
    return __atomic_load_n(reinterpret_cast<const std::uint64_t*>(cookie_), __ATOMIC_ACQUIRE);
  }

  void reset() noexcept;

 private:
  friend Status map_peer_pool(pid_t pid, const Declaration& declared, std::uint64_t cookie_addr,
                              bool populate, PeerPoolMapping* out, std::string* why);

  void* map_ = nullptr;  // what mmap returned, page-aligned
  std::size_t map_len_ = 0;
  std::uint8_t* pool_ = nullptr;  // the pool's first byte inside it
  std::uint64_t remote_base_ = 0;
  const std::uint8_t* cookie_ = nullptr;  // the peer's cookie page, read-only
  std::size_t cookie_len_ = 0;
};

// The descriptor `fd` of process `pid`, duplicated into ours (pidfd_getfd:
// the same ptrace permission as process_vm_writev), close-on-exec; -1 with
// errno.
[[nodiscard]] int duplicate_fd(pid_t pid, int fd);

// Maps the pool `declared` (read from pid's cookie page at `cookie_addr`,
// with a pool fd) describes, and the cookie page itself (read-only) when it
// declares its fd and that checks out the same way (else the pool alone); with `populate`, every
// page of it is mapped now (O(pool bytes)) instead of faulting in on its first copy. kSuccess with
// *out holding the mapping; otherwise *out is left alone and *why says which check failed, for the
// log: kNotAllowed (the descriptor cannot be duplicated), kMismatch (the descriptor is not the
// sealed shmem file behind the declared pool) or kBackend (mmap failed). The caller reads pid's
// cookie again afterwards: the descriptor is the declaring engine's only if the pid was not reused
// meanwhile.
[[nodiscard]] Status map_peer_pool(pid_t pid, const Declaration& declared,
                                   std::uint64_t cookie_addr, bool populate, PeerPoolMapping* out,
                                   std::string* why);

}  // namespace kvxfer::internal::cma
