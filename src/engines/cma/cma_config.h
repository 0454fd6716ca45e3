// SPDX-License-Identifier: Apache-2.0
// The same-host lane's settings, read from the user's engine_config (keys
// KVXFER_CMA_*; the UCX lane leaves them to this lane). A pure function, so
// that every rule can be tested without a lane.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace kvxfer::internal::cma {

// The most bytes one progress() call copies on the caller's thread into an
// unmapped pool, so that poll() (which calls progress()) stays a call in
// microseconds. A caller claims from the back of the transfer at the head
// of the queue (the copiers claim from its front, so the two seldom write
// the same page tables), and may take the tail of one iovec. This is the
// default through process_vm_writev/readv: on this VM 5-12% of 16 KiB calls
// took 50-200 us when claimed next to a copier's chunk, 2-3% from the far
// end. engine_config KVXFER_CMA_SLICE sets it (4K..1M): a caller that spins
// on poll() copies more per call with a larger one (docs/performance.md).
inline constexpr std::size_t kCallerSliceBytes = std::size_t{16} << 10;

enum class PoolMapping { kOff, kOn, kPopulate };

struct CmaSettings {
  // Whether the lane maps the pools of peers that offer them (a
  // kvxfer::SharedPool) and copies with memcpy (KVXFER_CMA_MAP=on, the
  // default: pages fault in on their first copy; populate: every page is
  // mapped at registration, which then takes O(pool bytes)), or always
  // uses process_vm_writev/readv (off).
  PoolMapping map = PoolMapping::kOn;
  // The most bytes a poll() copies on the caller's thread into a same-host
  // peer's unmapped pool (KVXFER_CMA_SLICE, 4K..1M).
  std::uint64_t caller_slice = kCallerSliceBytes;
};

// Whether an engine_config key is this lane's (KVXFER_CMA_*).
[[nodiscard]] inline bool is_cma_key(std::string_view key) {
  return key.starts_with("KVXFER_CMA_");
}

// Throws std::runtime_error, naming the key, for a KVXFER_CMA_MAP value
// other than on, populate or off, a KVXFER_CMA_SLICE size outside 4K..1M,
// or any other KVXFER_CMA_* key. Other keys are other lanes'.
[[nodiscard]] CmaSettings compute_cma_settings(
    const std::map<std::string, std::string>& engine_config);

}  // namespace kvxfer::internal::cma
