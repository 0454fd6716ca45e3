// SPDX-License-Identifier: Apache-2.0
#include "core/pairs.h"

#include <algorithm>

namespace kvxfer::internal {
namespace {

// v lies in [0, n) exactly when neither v nor (n - 1 - v) has its top bit
// set (n <= 2^63): OR both into an accumulator and read its top bit once at
// the end, with no branch per index.
constexpr std::uint64_t kTop = std::uint64_t{1} << 63;

template <typename Int>
PairsCopy copy_pairs_of(std::span<const Int> local, std::span<const Int> remote,
                        std::uint64_t local_blocks, std::uint64_t remote_blocks,
                        std::vector<std::int64_t>& local_to, std::vector<std::int64_t>& remote_to,
                        std::vector<BlockRun>& runs) {
  const std::size_t n = local.size();
  local_to.resize(n);
  remote_to.resize(n);
  if (runs.size() < n) runs.resize(n);
  const std::uint64_t local_last = std::min(local_blocks, kTop) - 1;  // all ones for 0
  const std::uint64_t remote_last = std::min(remote_blocks, kTop) - 1;
  const Int* const ls = local.data();
  const Int* const rs = remote.data();
  std::int64_t* const ld = local_to.data();
  std::int64_t* const rd = remote_to.data();
  BlockRun* const out = runs.data();
  std::uint64_t local_acc = 0;
  std::uint64_t remote_acc = 0;
  std::size_t k = 0;
  // Unsigned, so that the step from the previous index never overflows.
  std::uint64_t next_l = 0;
  std::uint64_t next_r = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto l = static_cast<std::int64_t>(ls[i]);
    const auto r = static_cast<std::int64_t>(rs[i]);
    ld[i] = l;
    rd[i] = r;
    const auto ul = static_cast<std::uint64_t>(l);
    const auto ur = static_cast<std::uint64_t>(r);
    local_acc |= ul | (local_last - ul);
    remote_acc |= ur | (remote_last - ur);
    if (k > 0 && ul == next_l && ur == next_r) {
      ++out[k - 1].count;
    } else {
      out[k++] = BlockRun{l, r, 1};
    }
    next_l = ul + 1;
    next_r = ur + 1;
  }
  return PairsCopy{(local_acc & kTop) == 0, (remote_acc & kTop) == 0, k};
}

}  // namespace

PairsCopy copy_pairs(std::span<const std::int64_t> local, std::span<const std::int64_t> remote,
                     std::uint64_t local_blocks, std::uint64_t remote_blocks,
                     std::vector<std::int64_t>& local_to, std::vector<std::int64_t>& remote_to,
                     std::vector<BlockRun>& runs) {
  return copy_pairs_of(local, remote, local_blocks, remote_blocks, local_to, remote_to, runs);
}

PairsCopy copy_pairs(std::span<const std::int32_t> local, std::span<const std::int32_t> remote,
                     std::uint64_t local_blocks, std::uint64_t remote_blocks,
                     std::vector<std::int64_t>& local_to, std::vector<std::int64_t>& remote_to,
                     std::vector<BlockRun>& runs) {
  return copy_pairs_of(local, remote, local_blocks, remote_blocks, local_to, remote_to, runs);
}

bool runs_ascend(std::span<const BlockRun> runs, bool remote) {
  // Indices already range-checked: in [0, 2^63), so the sums cannot wrap.
  std::uint64_t next = 0;
  for (const BlockRun& run : runs) {
    const auto first = static_cast<std::uint64_t>(remote ? run.remote : run.local);
    if (first < next) return false;
    next = first + run.count;
  }
  return true;
}

}  // namespace kvxfer::internal
