// SPDX-License-Identifier: Apache-2.0
#include "workload.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <numeric>
#include <random>
#include <stdexcept>

namespace kvxfer::tools {
namespace {

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;
constexpr std::uint64_t kGiB = 1024 * kMiB;

// Most index pairs kept in memory (16 bytes each): 256 MiB.
constexpr std::uint64_t kMaxPairs = 16u << 20;

// Partial Fisher-Yates over a persistent permutation: the first k entries
// become a uniform sample without repetition, in O(k) per write.
void draw(std::vector<std::int64_t>& perm, std::uint64_t k, std::mt19937_64& rng) {
  const std::uint64_t n = perm.size();
  for (std::uint64_t i = 0; i < k; ++i) {
    const std::uint64_t j = i + rng() % (n - i);
    std::swap(perm[i], perm[j]);
  }
}

}  // namespace

Pattern Pattern::parse(const std::string& text) {
  if (text == "random") return Pattern{1};
  if (text.rfind("runs:", 0) == 0) {
    Pattern p;
    const char* begin = text.data() + 5;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(begin, end, p.run);
    if (ec == std::errc{} && ptr == end && p.run >= 1) return p;
  }
  throw std::invalid_argument("--pattern must be 'random' or 'runs:K' with K >= 1, not '" + text +
                              "'");
}

std::string Pattern::name() const { return run == 1 ? "random" : fmt::format("runs:{}", run); }

const std::vector<CaseSpec>& reference_cases() {
  static const std::vector<CaseSpec> cases = {
      {"big", 2 * kMiB, 16, Pattern{1}, 4, 8 * kGiB},
      {"layer", 64 * kKiB, 256, Pattern{1}, 4, 8 * kGiB},
      {"small", 4 * kKiB, 1024, Pattern{1}, 8, 2 * kGiB},
      {"runs", 16 * kKiB, 4096, Pattern{64}, 4, 4 * kGiB},
      {"reg", 4 * kKiB, 0, Pattern{1}, 0, 0},
  };
  return cases;
}

Schedule::Schedule(const Pattern& pattern, std::uint64_t num_blocks, std::uint64_t batch,
                   std::uint64_t writes, std::uint64_t seed)
    : batch_(batch), writes_(writes) {
  if (batch == 0 || writes == 0)
    throw std::invalid_argument("a schedule needs writes of >= 1 block");
  const std::uint64_t k = pattern.run;
  if (batch % k != 0) {
    throw std::invalid_argument(
        fmt::format("--batch {} is not a whole number of runs of {}", batch, k));
  }
  const std::uint64_t slots = num_blocks / k;  // runs that fit the region
  if (batch / k > slots) {
    throw std::invalid_argument(
        fmt::format("a write of {} blocks ({}) needs {} distinct {} but the region has {} blocks",
                    batch, pattern.name(), batch / k, k == 1 ? "blocks" : "runs", num_blocks));
  }
  distinct_ = std::min<std::uint64_t>(writes, std::max<std::uint64_t>(1, kMaxPairs / batch));
  local_.resize(distinct_ * batch);
  remote_.resize(distinct_ * batch);

  std::mt19937_64 rng(seed);
  std::vector<std::int64_t> local_perm(slots);
  std::vector<std::int64_t> remote_perm(slots);
  std::iota(local_perm.begin(), local_perm.end(), 0);
  std::iota(remote_perm.begin(), remote_perm.end(), 0);
  const std::uint64_t runs = batch / k;
  for (std::uint64_t w = 0; w < distinct_; ++w) {
    draw(local_perm, runs, rng);
    draw(remote_perm, runs, rng);
    std::int64_t* l = local_.data() + w * batch;
    std::int64_t* r = remote_.data() + w * batch;
    for (std::uint64_t i = 0; i < runs; ++i) {
      for (std::uint64_t j = 0; j < k; ++j) {
        *l++ = local_perm[i] * static_cast<std::int64_t>(k) + static_cast<std::int64_t>(j);
        *r++ = remote_perm[i] * static_cast<std::int64_t>(k) + static_cast<std::int64_t>(j);
      }
    }
  }
}

Landed landed_blocks(const Schedule& schedule, std::uint64_t num_blocks,
                     std::span<const std::uint64_t> posted,
                     std::span<const std::uint64_t> completed) {
  constexpr std::int64_t kNever = -1;
  std::vector<std::int64_t> last_local(num_blocks, kNever);
  std::vector<std::uint64_t> latest_done(num_blocks, 0);  // of earlier writes to the block
  std::vector<bool> known(num_blocks, false);
  for (std::uint64_t w = 0; w < schedule.writes() && w < posted.size(); ++w) {
    const auto local = schedule.local(w);
    const auto remote = schedule.remote(w);
    for (std::size_t i = 0; i < remote.size(); ++i) {
      const auto r = static_cast<std::uint64_t>(remote[i]);
      known[r] = last_local[r] == kNever || latest_done[r] < posted[w];
      last_local[r] = local[i];
      latest_done[r] = std::max(latest_done[r], completed[w]);
    }
  }
  Landed out;
  for (std::uint64_t r = 0; r < num_blocks; ++r) {
    if (last_local[r] == kNever) continue;
    if (known[r]) {
      out.known.emplace_back(static_cast<std::int64_t>(r), last_local[r]);
    } else {
      ++out.raced;
    }
  }
  return out;
}

std::vector<std::pair<std::int64_t, std::int64_t>> sample(
    std::vector<std::pair<std::int64_t, std::int64_t>> pairs, std::uint64_t max,
    std::uint64_t seed) {
  if (pairs.size() <= max) return pairs;
  std::mt19937_64 rng(seed);
  for (std::uint64_t i = 0; i < max; ++i) {
    const std::uint64_t j = i + rng() % (pairs.size() - i);
    std::swap(pairs[i], pairs[j]);
  }
  pairs.resize(max);
  return pairs;
}

}  // namespace kvxfer::tools
