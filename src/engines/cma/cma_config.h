// SPDX-License-Identifier: Apache-2.0
// The same-host lane's copy policy: who copies a write or read, in what
// pieces, and at what priority. One object, two settings (KVXFER_CMA_MAP,
// KVXFER_CMA_SLICE, handed over by engines/settings.h); everything else is
// fixed here, with its reason. compute_copy_policy is a pure function, so
// that every rule can be tested without a lane. docs/architecture.md
// (same-host lane) has the figures.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "engines/settings.h"

namespace kvxfer::internal::cma {

enum class PoolMapping { kOff, kOn, kPopulate };

// The default caller slice. On a 2-core VM a process_vm_writev costs about
// 5.5 us before its first byte (a null syscall about 1 us), so a 16 KiB slice
// copies at 2.5 GB/s and a 64 KiB one at 6 GB/s (1 MiB: 9-10 GB/s). With
// 64 KiB the caller of a spinning poll() copies its share at useful speed
// and the call stays near 10-20 us; 16 KiB kept it near 5 us but left two
// thirds of a core idle.
inline constexpr std::uint64_t kDefaultCallerSlice = std::uint64_t{64} << 10;

struct CopyPolicy {
  // Whether the lane maps the pools of peers that offer them (a
  // kvxfer::SharedPool) and copies with memcpy (KVXFER_CMA_MAP=on, the
  // default: pages fault in on their first copy; populate: every page is
  // mapped at registration, which then takes O(pool bytes)), or always
  // uses process_vm_writev/readv (off).
  PoolMapping map = PoolMapping::kOn;
  // The most bytes one poll() copies on the caller's thread (progress()),
  // from the back of the transfer at the head of the queue, whenever copies
  // are queued; 0: the caller never copies (KVXFER_CMA_SLICE, 0 or 4K..1M).
  std::uint64_t caller_slice = kDefaultCallerSlice;

  // A copier's claim: at most this many bytes of a transfer (runs are split
  // into iovecs of at most this length at post time), so that several
  // copiers, and callers, can share one large write; large enough that one
  // process_vm_writev's fixed cost is under 5% of it.
  static constexpr std::size_t kChunkBytes = std::size_t{1} << 20;
  // The copier threads' nice value. A caller that spins on poll() is then
  // not preempted by a copier on a host with no spare core (with copiers at
  // nice 0 on 2 cores, `write_blocks` p99 went from under 50 us to 1.3-2.3
  // ms): it keeps its core and copies its slices there, the copiers take the
  // other. A host with spare cores gives the copiers their own.
  static constexpr int kCopierNice = 10;
  // A caller's slice skips the peer's cookie read (a process_vm_readv, 2-3
  // us here) when some copy read the cookie back this recently: no chunk
  // then starts later after a check than a copier's 1 MiB chunk ends after
  // its own. The check after a transfer's last chunk is never skipped.
  static constexpr std::chrono::microseconds kCookieFresh{100};
  // How long our remove_region waits for a same-host peer's chunk into the
  // region that the peer marked before the withdrawal (cma_fence.h): a 1 MiB
  // chunk takes about 0.1 ms, and a copier at nice 10 may wait tens of ms
  // for a core on a loaded host. A peer that still holds its mark after 2 s
  // is frozen (stopped, or its pid reused after it died); the removal then
  // fails and says which process holds it.
  static constexpr std::chrono::milliseconds kHolderWait{2000};

  // Copier threads: Options::num_threads, at least 1 and at most the cores
  // (more would only take turns).
  [[nodiscard]] static int copiers(int num_threads);

  friend bool operator==(const CopyPolicy&, const CopyPolicy&) = default;
};

// Throws std::runtime_error, naming the setting and where it came from, for
// a KVXFER_CMA_MAP value other than on, populate or off, and a
// KVXFER_CMA_SLICE size other than 0 or 4K..1M.
[[nodiscard]] CopyPolicy compute_copy_policy(const CmaKeys& keys);

}  // namespace kvxfer::internal::cma
