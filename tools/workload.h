// SPDX-License-Identifier: Apache-2.0
// The reference workloads of docs/workloads.md: which blocks each
// write moves, and, after a run, which remote blocks hold a known block.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvxfer::tools {

// `random`: local and remote indices of one write are each a random sample
// without repetition. `runs:K`: both come in runs of K consecutive blocks,
// each run starting at a random multiple of K, no run repeated in a write.
struct Pattern {
  std::uint64_t run = 1;  // 1: random

  static Pattern parse(const std::string& text);  // "random" | "runs:K"
  [[nodiscard]] std::string name() const;
};

struct CaseSpec {
  std::string name;
  std::uint64_t block_len = 0;
  std::uint64_t batch = 0;  // 0 for reg
  Pattern pattern;
  int depth = 0;
  std::uint64_t total = 0;  // payload bytes
  [[nodiscard]] bool is_reg() const { return name == "reg"; }
};

// The table of workloads.md, in its order.
const std::vector<CaseSpec>& reference_cases();

// The index pairs of every write, generated before the clock starts. Writes
// past `distinct` repeat the list from the start (only a --total far beyond
// the reference would need that).
class Schedule {
 public:
  Schedule(const Pattern& pattern, std::uint64_t num_blocks, std::uint64_t batch,
           std::uint64_t writes, std::uint64_t seed);

  [[nodiscard]] std::uint64_t writes() const { return writes_; }
  [[nodiscard]] std::uint64_t batch() const { return batch_; }
  [[nodiscard]] std::span<const std::int64_t> local(std::uint64_t w) const {
    return {local_.data() + (w % distinct_) * batch_, batch_};
  }
  [[nodiscard]] std::span<const std::int64_t> remote(std::uint64_t w) const {
    return {remote_.data() + (w % distinct_) * batch_, batch_};
  }

 private:
  std::uint64_t batch_;
  std::uint64_t writes_;
  std::uint64_t distinct_;
  std::vector<std::int64_t> local_;
  std::vector<std::int64_t> remote_;
};

// Which remote blocks hold a known local block after a run. Writes in
// flight together may hit the same remote block, and then either may land
// last; a block counts as known only when its last write was posted after
// every earlier write to it had completed. `posted[w]` and `completed[w]`
// are positions on one event clock (a completion is seen by a poll).
struct Landed {
  std::vector<std::pair<std::int64_t, std::int64_t>> known;  // (remote, local)
  std::uint64_t raced = 0;  // blocks whose content depends on landing order
};
Landed landed_blocks(const Schedule& schedule, std::uint64_t num_blocks,
                     std::span<const std::uint64_t> posted,
                     std::span<const std::uint64_t> completed);

// Up to `max` of `pairs`, picked at random.
std::vector<std::pair<std::int64_t, std::int64_t>> sample(
    std::vector<std::pair<std::int64_t, std::int64_t>> pairs, std::uint64_t max,
    std::uint64_t seed);

}  // namespace kvxfer::tools
