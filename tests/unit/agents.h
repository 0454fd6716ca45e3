// SPDX-License-Identifier: Apache-2.0
// What the unit tests stand on: agents (a LOOPBACK transport over a pool the
// test owns) and a fixture with one initiator and two targets. The tests touch
// the public API, the "kvxfer" logger, and src/wire/ only to forge metadata.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <future>
#include <initializer_list>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kvxfer/loopback.h"
#include "kvxfer/transport.h"

namespace kvxfer::unit {

inline constexpr std::uint64_t kBlockLen = 64;
inline constexpr std::uint64_t kNumBlocks = 32;

// A pool owned by the test. A source carries a pattern that differs from
// block to block; a target starts zeroed, so any byte written shows.
class Pool {
 public:
  Pool(std::uint64_t num_blocks, std::uint64_t block_len)
      : num_blocks_(num_blocks), block_len_(block_len), bytes_(num_blocks * block_len, 0) {}

  [[nodiscard]] Region region() { return Region{bytes_.data(), num_blocks_, block_len_}; }

  void fill_pattern(std::uint8_t seed) {
    for (std::uint64_t i = 0; i < num_blocks_; ++i) {
      for (std::uint64_t j = 0; j < block_len_; ++j) {
        // 1..251: never zero, so a copied block never looks untouched.
        bytes_[i * block_len_ + j] =
            static_cast<std::uint8_t>(1 + (seed * 37 + i * 101 + j * 7) % 251);
      }
    }
  }
  void fill(std::uint8_t value) { std::fill(bytes_.begin(), bytes_.end(), value); }

  [[nodiscard]] std::span<const std::uint8_t> block(std::int64_t index) const {
    return std::span<const std::uint8_t>(bytes_).subspan(
        static_cast<std::uint64_t>(index) * block_len_, block_len_);
  }
  [[nodiscard]] bool all(std::uint8_t value) const {
    return std::all_of(bytes_.begin(), bytes_.end(),
                       [value](std::uint8_t b) { return b == value; });
  }
  [[nodiscard]] bool block_all(std::int64_t index, std::uint8_t value) const {
    const auto b = block(index);
    return std::all_of(b.begin(), b.end(), [value](std::uint8_t x) { return x == value; });
  }

 private:
  std::uint64_t num_blocks_;
  std::uint64_t block_len_;
  std::vector<std::uint8_t> bytes_;
};

[[nodiscard]] inline Options loopback_options(int strike_limit = 3) {
  Options options;
  options.backends = {"LOOPBACK"};
  options.strike_limit = strike_limit;
  return options;
}

// One LOOPBACK transport and the pool it registered. The pool outlives the
// transport (members are destroyed in reverse order).
struct Agent {
  explicit Agent(std::string name, Options options = loopback_options(),
                 std::uint64_t num_blocks = kNumBlocks, std::uint64_t block_len = kBlockLen)
      : pool(num_blocks, block_len),
        transport(std::move(name), pool.region(), std::move(options)) {}

  [[nodiscard]] loopback::FaultPlan& plan() {
    loopback::FaultPlan* p = transport.fault_plan();
    if (p == nullptr) throw std::logic_error("a LOOPBACK transport must have a fault plan");
    return *p;
  }

  Pool pool;
  Transport transport;
};

inline void add_peer(Transport& from, const std::string& peer_id, Transport& to) {
  from.add_remote_peer(peer_id, to.agent_metadata(), to.base_addr(), to.num_blocks(),
                       to.block_len());
}

[[nodiscard]] inline std::future<void> add_peer_async(Transport& from, const std::string& peer_id,
                                                      Transport& to) {
  return from.add_remote_peer_async(peer_id, to.agent_metadata(), to.base_addr(), to.num_blocks(),
                                    to.block_len());
}

[[nodiscard]] inline std::optional<TransferId> write(Transport& from, std::string_view peer_id,
                                                     const std::vector<std::int64_t>& local,
                                                     const std::vector<std::int64_t>& remote) {
  return from.write_blocks(peer_id, std::span<const std::int64_t>(local),
                           std::span<const std::int64_t>(remote));
}

// The stats of one peer; a default PeerStats (and a test failure) if absent.
[[nodiscard]] inline PeerStats peer_stats(const Transport& transport, std::string_view peer_id) {
  for (const PeerStats& p : transport.stats().peers) {
    if (p.peer_id == peer_id) return p;
  }
  ADD_FAILURE() << "no stats for peer " << peer_id;
  return {};
}

[[nodiscard]] inline bool has_peer(const Transport& transport, std::string_view peer_id) {
  const auto peers = transport.peers();
  return std::find(peers.begin(), peers.end(), peer_id) != peers.end();
}

[[nodiscard]] inline std::vector<TransferId> ids(std::initializer_list<TransferId> list) {
  return list;
}

// Initiator "agent-a" (its pool patterned) with targets "agent-b" and
// "agent-c" (zeroed) registered as peers "b" and "c".
class LoopbackTest : public ::testing::Test {
 protected:
  LoopbackTest() {
    a.pool.fill_pattern(1);
    add_peer(a.transport, "b", b.transport);
    add_peer(a.transport, "c", c.transport);
  }

  [[nodiscard]] loopback::FaultPlan& plan() { return a.plan(); }

  [[nodiscard]] std::optional<TransferId> write(std::string_view peer_id,
                                                const std::vector<std::int64_t>& local,
                                                const std::vector<std::int64_t>& remote) {
    return unit::write(a.transport, peer_id, local, remote);
  }
  // A write the test needs posted; anything else fails the test.
  [[nodiscard]] TransferId posted(std::string_view peer_id, const std::vector<std::int64_t>& local,
                                  const std::vector<std::int64_t>& remote) {
    const auto id = write(peer_id, local, remote);
    if (!id) throw std::runtime_error("write_blocks returned nullopt where a post was expected");
    return *id;
  }
  [[nodiscard]] PollResult poll(std::optional<std::string_view> peer_id = std::nullopt) {
    return a.transport.poll(peer_id);
  }
  [[nodiscard]] std::vector<TransferId> cancel(const std::vector<TransferId>& transfer_ids,
                                               CancelMode mode) {
    return a.transport.cancel(transfer_ids, mode);
  }
  [[nodiscard]] HandleCounts live() const { return a.transport.stats().live; }
  [[nodiscard]] PeerStats peer(std::string_view peer_id) const {
    return peer_stats(a.transport, peer_id);
  }

  // True when block `remote` of `target` holds block `local` of the initiator.
  [[nodiscard]] bool landed(const Agent& target, std::int64_t remote, std::int64_t local) const {
    const auto want = a.pool.block(local);
    const auto got = target.pool.block(remote);
    return std::equal(want.begin(), want.end(), got.begin(), got.end());
  }
  [[nodiscard]] static bool untouched(const Agent& target) { return target.pool.all(0); }

  // Targets first: the initiator is destroyed (closed) before them.
  Agent b{"agent-b"};
  Agent c{"agent-c"};
  Agent a{"agent-a"};
};

}  // namespace kvxfer::unit
