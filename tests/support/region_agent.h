// SPDX-License-Identifier: Apache-2.0
// What the region tests of every lane share: a transport with registered
// buffers besides (or instead of) a pool, and polling a transfer to its end.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvxfer/transport.h"

namespace kvxfer::test {

// What a RegionAgent is made of.
struct RegionAgentSpec {
  int regions = 1;            // registered buffers
  std::size_t region_len = 0;  // bytes in each
  std::uint8_t seed = 0;      // their pattern (0: zeros)
  Options options;
  Region pool{};              // the transport's pool, someone else's (none by default)
  std::uint64_t own_pool_blocks = 0;  // or a pool of its own, zeros, of blocks of
  std::uint64_t own_block_len = 4096;  // this length (0 blocks: none)
};

// A transport with `regions` registered buffers of `region_len` bytes, byte
// i of buffer k being 1 + (seed * 31 + i * 7 + k * 13) % 251 (zeros for seed
// 0), and the pool the spec says.
struct RegionAgent {
  RegionAgent(std::string name, const RegionAgentSpec& spec)
      : buffers(static_cast<std::size_t>(spec.regions), std::vector<std::uint8_t>(spec.region_len, 0)),
        pool(spec.own_pool_blocks * spec.own_block_len, 0),
        transport(std::move(name),
                  spec.own_pool_blocks == 0
                      ? spec.pool
                      : Region{pool.data(), spec.own_pool_blocks, spec.own_block_len},
                  spec.options) {
    for (std::size_t k = 0; k < buffers.size(); ++k) {
      auto& b = buffers[k];
      for (std::size_t i = 0; i < b.size() && spec.seed != 0; ++i) {
        b[i] = static_cast<std::uint8_t>(1 + (spec.seed * 31 + i * 7 + k * 13) % 251);
      }
      ids.push_back(transport.register_memory(b.data(), b.size()));
    }
  }
  std::vector<std::vector<std::uint8_t>> buffers;
  std::vector<std::uint8_t> pool;  // the pool of its own, when it has one
  std::vector<RegionId> ids;
  Transport transport;
};

// Polls `peer` until `id` is reported: true when done, false when failed,
// nothing when `limit` passed first.
inline std::optional<bool> outcome(Transport& t, const std::string& peer, TransferId id,
                                   std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    const PollResult r = t.poll(peer);
    if (std::find(r.done.begin(), r.done.end(), id) != r.done.end()) return true;
    if (std::find(r.failed.begin(), r.failed.end(), id) != r.failed.end()) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return std::nullopt;
}

// Whether `id` was reported done (false: failed, or nothing within 30 s).
inline bool finish(Transport& t, const std::string& peer, TransferId id) {
  return outcome(t, peer, id) == std::optional<bool>(true);
}

}  // namespace kvxfer::test
