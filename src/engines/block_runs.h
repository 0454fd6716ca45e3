// SPDX-License-Identifier: Apache-2.0
// Runs of blocks consecutive on both sides of a transfer (local and remote
// indices), as the lanes post them: one put or one copy per run, and the
// runs a tcp write frame sends (as wire/runs.h's byte runs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvxfer::internal {

// Calls f(local_first, remote_first, count) once per run of blocks that are
// consecutive on both sides; stops early when f returns false.
template <typename F>
bool for_each_run(std::span<const std::int64_t> local, std::span<const std::int64_t> remote,
                  F&& f) {
  const std::size_t n = local.size();
  std::size_t i = 0;
  while (i < n) {
    std::size_t j = i + 1;
    while (j < n && local[j] == local[j - 1] + 1 && remote[j] == remote[j - 1] + 1) ++j;
    if (!f(local[i], remote[i], static_cast<std::uint64_t>(j - i))) return false;
    i = j;
  }
  return true;
}

// A run of blocks consecutive on both sides: local..local+count-1 to
// remote..remote+count-1.
struct BlockRun {
  std::int64_t local = 0;
  std::int64_t remote = 0;
  std::uint64_t count = 0;
};

// Writes the runs of (local, remote) to `out` (room for local.size() runs)
// and returns how many there are: one pass, one store per run.
inline std::size_t encode_runs(std::span<const std::int64_t> local,
                               std::span<const std::int64_t> remote, BlockRun* out) {
  BlockRun* at = out;
  for_each_run(local, remote, [&at](std::int64_t l, std::int64_t r, std::uint64_t count) {
    *at++ = BlockRun{l, r, count};
    return true;
  });
  return static_cast<std::size_t>(at - out);
}

}  // namespace kvxfer::internal
