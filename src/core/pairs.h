// SPDX-License-Identifier: Apache-2.0
// A transfer's (local, remote) block pairs as the caller gives them, read
// once: copied, range-checked on both sides and cut into runs (engine.h's
// BlockRun) in one pass over the caller's memory. Pure functions of the
// pairs; touches nothing else.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine.h"

namespace kvxfer::internal {

// What copy_pairs found.
struct PairsCopy {
  bool local_ok = false;   // every local index lies in [0, local_blocks)
  bool remote_ok = false;  // every remote index lies in [0, remote_blocks)
  std::size_t runs = 0;    // how many runs it wrote
};

// Copies local[i] and remote[i] (equal lengths) into `local_to` and
// `remote_to` (resized; they keep their capacity), checks each side's range
// (block counts above 2^63 count as 2^63), and writes the runs consecutive
// on both sides to the front of `runs` (grown to at least local.size()).
// On a range failure check_range() over the copy names the first bad index.
PairsCopy copy_pairs(std::span<const std::int64_t> local, std::span<const std::int64_t> remote,
                     std::uint64_t local_blocks, std::uint64_t remote_blocks,
                     std::vector<std::int64_t>& local_to, std::vector<std::int64_t>& remote_to,
                     std::vector<BlockRun>& runs);
PairsCopy copy_pairs(std::span<const std::int32_t> local, std::span<const std::int32_t> remote,
                     std::uint64_t local_blocks, std::uint64_t remote_blocks,
                     std::vector<std::int64_t>& local_to, std::vector<std::int64_t>& remote_to,
                     std::vector<BlockRun>& runs);

// Whether the runs' blocks on one side (`remote`: the peer's, else ours)
// come in strictly increasing order, each run after the last block of the
// one before: then no block of that side is named twice. O(runs).
bool runs_ascend(std::span<const BlockRun> runs, bool remote);

}  // namespace kvxfer::internal
